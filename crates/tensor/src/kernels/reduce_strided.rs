//! The strided reduction along any axis, reading the input in place through its strides.
//!
//! A block of up to 512 threads takes `bx` neighbouring outputs (at least 16 where there are
//! as many), each reduced by `by` threads (up to 32) that take
//! every `by`-th element of the axis through its stride and are combined in shared memory, so
//! that the threads of a warp read neighbouring elements wherever the axes after the reduced
//! one are packed. `by` is as large as filling the device needs (about 2048 threads per
//! multiprocessor), and each thread issues [`unroll`] loads before it folds them.
//!
//! When the axis is packed (stride 1), the threads of an output are the lanes of a warp
//! instead, reading 128-byte lines of the axis.
//!
//! When even 32 threads per output leave the device half idle (few outputs over a long axis),
//! the axis is split over `grid.y` blocks: each writes its partial result (value and index) to
//! a scratch buffer, and a second small kernel combines the splits of each output in order.
//! Nothing is atomic: the same input gives the same bits.

use cuflow_runtime::{DeviceBuffer, Kernel, KernelArgs, LaunchConfig, Stream};

use super::reduce_axis::Red;
use super::{alloc, TensorResult};
use crate::dtype::{cuda_prelude, DType};
use crate::op::cached_kernel;
use crate::tensor::Tensor;
use crate::view::{Strided, MAX_DIMS};

/// Resident threads per multiprocessor the launch aims for.
const THREADS_PER_SM: usize = 2048;

/// Threads per block of the strided kernel (at most; fewer when there are few outputs).
const BLOCK: usize = 512;

/// Loads each thread issues before folding them: 32 bytes' worth, at least 4.
fn unroll<T: DType>() -> usize {
    (32 / std::mem::size_of::<T>()).clamp(4, 8)
}

/// The kernel name of `red` in `form` (`0`: whole axis, `1`: one split, `2`: combine).
fn kernel_name(red: Red, form: usize) -> &'static str {
    const NAMES: [[&str; 3]; 6] = [
        ["sum_strided", "sum_strided_part", "sum_strided_combine"],
        ["mean_strided", "mean_strided_part", "mean_strided_combine"],
        ["max_strided", "max_strided_part", "max_strided_combine"],
        ["min_strided", "min_strided_part", "min_strided_combine"],
        [
            "argmax_strided",
            "argmax_strided_part",
            "argmax_strided_combine",
        ],
        [
            "argmin_strided",
            "argmin_strided_part",
            "argmin_strided_combine",
        ],
    ];
    let r = match red {
        Red::Sum => 0,
        Red::Mean => 1,
        Red::Max => 2,
        Red::Min => 3,
        Red::ArgMax => 4,
        Red::ArgMin => 5,
    };
    NAMES[r][form]
}

fn out_type(red: Red) -> &'static str {
    if red.is_arg() {
        "unsigned"
    } else {
        "T"
    }
}

/// A partial result as the host backend keeps it in the scratch buffer: floating-point values
/// (and sums) as `f64` bits, integers as their value.
fn encode<T: DType>(v: T, float_sum: Option<f64>) -> i64 {
    match float_sum {
        Some(s) => s.to_bits() as i64,
        None if T::IS_FLOAT => v.to_f64().to_bits() as i64,
        None => v.to_i128().unwrap_or(0) as i64,
    }
}

fn decode<T: DType>(bits: i64) -> T {
    if T::IS_FLOAT {
        T::from_f64(f64::from_bits(bits as u64))
    } else {
        T::from_i128(i128::from(bits))
    }
}

/// The strided kernel of `red` for `T`: the whole axis per output (`split` false, writing
/// values of `T` or `u32` indices), or one split of it (`split`, writing `A` values and
/// indices to the scratch buffers).
fn strided_kernel<T: DType>(red: Red, split: bool) -> Kernel {
    let name = kernel_name(red, usize::from(split));
    cached_kernel(name, T::NAME, || {
        let fname = format!("{name}_{}", T::NAME);
        let dims: Vec<String> = (0..MAX_DIMS).map(|d| format!("u64 d{d}")).collect();
        let strides: Vec<String> = (0..MAX_DIMS).map(|d| format!("u64 s{d}")).collect();
        let dv: Vec<String> = (0..MAX_DIMS).map(|d| format!("d{d}")).collect();
        let sv: Vec<String> = (0..MAX_DIMS).map(|d| format!("s{d}")).collect();
        let (outs, write) = if split {
            (
                "A* __restrict__ pv, unsigned* __restrict__ pi".to_string(),
                "pv[(u64)blockIdx.y * n + i] = acc; pi[(u64)blockIdx.y * n + i] = bi;".to_string(),
            )
        } else {
            (
                format!("{}* __restrict__ out", out_type(red)),
                format!("out[i] = {};", red.finish()),
            )
        };
        let source = format!(
            r#"{prelude}
typedef unsigned long long u64;
#define STEP {{ {step} }}
#define UNROLL {unroll}
// Block (bx, by): bx consecutive outputs, each reduced by by threads that take every by-th
// element of the block's part [k0, k1) of the axis (the whole axis unless split over
// gridDim.y), then combined through shared memory by the first.
extern "C" __global__ void __launch_bounds__({block}, 2) {fname}({outs}, const T* __restrict__ x,
    u64 n, u64 K, u64 sk, u64 chunk, int rank, {dims}, {strides}, int axis_lanes) {{
  __shared__ A shv[{block}];
  __shared__ unsigned shi[{block}];
  const u64 dims[{MAX_DIMS}] = {{{dv}}};
  const u64 xs[{MAX_DIMS}] = {{{sv}}};
  // (tx, ty) = (threadIdx.x, threadIdx.y), or swapped when the axis is packed (stride 1), so
  // that the lanes of a warp then read neighbouring elements of the axis.
  const unsigned bx = axis_lanes ? blockDim.y : blockDim.x, by = axis_lanes ? blockDim.x : blockDim.y;
  const unsigned tx = axis_lanes ? threadIdx.y : threadIdx.x, ty = axis_lanes ? threadIdx.x : threadIdx.y;
  const u64 k0 = (u64)blockIdx.y * chunk;
  const u64 k1 = K - k0 < chunk ? K : k0 + chunk;
  for (u64 base = (u64)blockIdx.x * bx; base < n; base += (u64)gridDim.x * bx) {{
    u64 i = base + tx;
    A acc = (A)0;
    unsigned bi = 0xffffffffu;
    u64 k = k0 + ty;
    if (i < n && k < k1) {{
      u64 r = i, o = 0;
#pragma unroll
      for (int d = {last}; d >= 0; --d) {{
        if (d < rank) {{ u64 c = r % dims[d]; r /= dims[d]; o += c * xs[d]; }}
      }}
      const T* p = x + o;
      acc = ld(p[k * sk]);
      bi = (unsigned)k;
      // UNROLL loads in flight, then folded in index order.
      const u64 step = (u64)by * sk;
      const T* q = p + (k + by) * sk;
      for (k += by; k + (u64)(UNROLL - 1) * by < k1; k += (u64)UNROLL * by, q += UNROLL * step) {{
        A vals[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) vals[u] = ld(q[u * step]);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {{
          A v = vals[u];
          unsigned vi = (unsigned)(k + (u64)u * by);
          (void)vi;
          STEP
        }}
      }}
      for (; k < k1; k += by) {{
        A v = ld(p[k * sk]);
        unsigned vi = (unsigned)k;
        (void)vi;
        STEP
      }}
    }}
    shv[ty * bx + tx] = acc;
    shi[ty * bx + tx] = bi;
    __syncthreads();
    if (ty == 0 && i < n) {{
      for (unsigned j = 1; j < by; ++j) {{
        A v = shv[j * bx + tx];
        unsigned vi = shi[j * bx + tx];
        if (vi != 0xffffffffu) STEP
      }}
      {write}
    }}
    __syncthreads();
  }}
}}
"#,
            prelude = cuda_prelude::<T>(),
            dims = dims.join(", "),
            strides = strides.join(", "),
            dv = dv.join(", "),
            sv = sv.join(", "),
            last = MAX_DIMS - 1,
            step = red.step(T::IS_FLOAT),
            unroll = unroll::<T>(),
            block = BLOCK,
        );
        crate::op::builtin_kernel(fname, source).with_host(move |args| {
            let b = usize::from(split); // a split has two outputs
            let x = args.input::<T>(1 + b)?;
            let n = args.scalar::<u64>(2 + b)? as usize;
            let k = args.scalar::<u64>(3 + b)? as usize;
            let sk = args.scalar::<u64>(4 + b)? as usize;
            let chunk = (args.scalar::<u64>(5 + b)? as usize).max(1);
            let rank = args.scalar::<i32>(6 + b)? as usize;
            let read = |i: usize| args.scalar::<u64>(i).map(|v| v as usize);
            let shape = (0..rank)
                .map(|d| read(7 + b + d))
                .collect::<Result<Vec<_>, _>>()?;
            let strides = (0..rank)
                .map(|d| read(7 + b + MAX_DIMS + d))
                .collect::<Result<Vec<_>, _>>()?;
            let offsets: Vec<usize> = Strided::new(&shape, &strides, 0).offsets().collect();
            if !split {
                let values = offsets
                    .iter()
                    .map(|&base| red.host((0..k).map(|j| x[base + j * sk])));
                if red.is_arg() {
                    for (o, (_, i)) in args.output::<u32>(0)?.iter_mut().zip(values) {
                        *o = i;
                    }
                } else {
                    for (o, (v, _)) in args.output::<T>(0)?.iter_mut().zip(values) {
                        *o = v;
                    }
                }
                return Ok(());
            }
            let pv = args.output::<i64>(0)?;
            let pi = args.output::<u32>(1)?;
            for (s, k0) in (0..k).step_by(chunk).enumerate() {
                let k1 = (k0 + chunk).min(k);
                for (i, &base) in offsets.iter().enumerate().take(n) {
                    let lane = (k0..k1).map(|j| x[base + j * sk]);
                    let float_sum = (T::IS_FLOAT && matches!(red, Red::Sum | Red::Mean))
                        .then(|| lane.clone().map(DType::to_f64).sum::<f64>());
                    let (v, at) = red.host(lane);
                    pv[s * n + i] = encode(v, float_sum);
                    // Exact for the arg-reductions (axes below 2^32); the other reductions
                    // ignore the index, whose axis may be longer: it wraps as on CUDA.
                    pi[s * n + i] = (k0 as u32).wrapping_add(at);
                }
            }
            Ok(())
        })
    })
}

/// The kernel combining the `S` splits of each of `n` outputs, in split order.
fn combine_kernel<T: DType>(red: Red) -> Kernel {
    let name = kernel_name(red, 2);
    cached_kernel(name, T::NAME, || {
        let fname = format!("{name}_{}", T::NAME);
        let source = format!(
            r#"{prelude}
typedef unsigned long long u64;
#define STEP {{ {step} }}
extern "C" __global__ void {fname}({out_t}* __restrict__ out, const A* __restrict__ pv,
    const unsigned* __restrict__ pi, u64 n, u64 S, u64 K) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (u64)gridDim.x * blockDim.x) {{
    A acc = pv[i];
    unsigned bi = pi[i];
    for (u64 s = 1; s < S; ++s) {{
      A v = pv[s * n + i];
      unsigned vi = pi[s * n + i];
      (void)vi;
      STEP
    }}
    out[i] = {finish};
  }}
}}
"#,
            prelude = cuda_prelude::<T>(),
            out_t = out_type(red),
            step = red.step(T::IS_FLOAT),
            finish = red.finish(),
        );
        crate::op::builtin_kernel(fname, source).with_host(move |args| {
            let pv = args.input::<i64>(1)?;
            let pi = args.input::<u32>(2)?;
            let n = args.scalar::<u64>(3)? as usize;
            let splits = args.scalar::<u64>(4)? as usize;
            let k = args.scalar::<u64>(5)? as usize;
            let parts = |i: usize| (0..splits).map(move |s| s * n + i);
            if red.is_arg() {
                let out = args.output::<u32>(0)?;
                for (i, o) in out.iter_mut().enumerate().take(n) {
                    // Each split's best, in split order: ties keep the first (lowest) index.
                    let (_, s) = red.host(parts(i).map(|j| decode::<T>(pv[j])));
                    *o = pi[s as usize * n + i];
                }
                return Ok(());
            }
            let out = args.output::<T>(0)?;
            for (i, o) in out.iter_mut().enumerate().take(n) {
                *o = match red {
                    Red::Sum | Red::Mean if T::IS_FLOAT => {
                        let s: f64 = parts(i).map(|j| f64::from_bits(pv[j] as u64)).sum();
                        let d = if red == Red::Mean { k as f64 } else { 1.0 };
                        T::from_f64(s / d)
                    }
                    _ => red.host(parts(i).map(|j| decode::<T>(pv[j]))).0,
                };
            }
            Ok(())
        })
    })
}

/// The launch shape for `n_out` outputs over an axis of `k` on `sms` multiprocessors:
/// `(bx, by, splits, chunk)`. `axis_lanes`: the axis is packed (stride 1) and runs along the
/// lanes of a warp.
pub(super) fn strided_shape(
    n_out: usize,
    k: usize,
    sms: usize,
    axis_lanes: bool,
) -> (usize, usize, usize, usize) {
    let target = sms * THREADS_PER_SM;
    // Threads per output: enough to fill the device (a warp, for a packed axis), at most 32
    // (so that a block still spans 16 neighbouring outputs) and no more than the axis has
    // elements.
    let fill = if axis_lanes {
        32
    } else {
        target.div_ceil(n_out).next_power_of_two()
    };
    // (`k` capped before it is rounded up: an expanded axis may be longer than 2^63.)
    let by = fill.clamp(1, 32).min(k.min(32).next_power_of_two());
    // Blocks of 512 threads (several resident per multiprocessor), of at least 16 neighbouring
    // outputs: a warp reads whole 32-byte sectors of 4-byte elements, 64 bytes of each row.
    let bx = (BLOCK / by).max(16).min(n_out.next_power_of_two());
    let threads = n_out.div_ceil(bx) * bx * by;
    // Split the axis when the outputs fill under half the device, keeping 16 elements per
    // thread and split at least.
    let splits = if 2 * threads <= target {
        (target / threads).min(k.div_ceil(by * 16)).clamp(1, 65_535)
    } else {
        1
    };
    let chunk = k.div_ceil(splits);
    (bx, by, k.div_ceil(chunk), chunk)
}

/// Launches the strided reduction `red` of `x` over its axis of length `k` and stride `sk`,
/// the outputs laid over `x` by `dims` / `strides` (collapsed, at most [`MAX_DIMS`]), into a
/// new tensor of `out_shape`.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_strided<T: DType, O: DType>(
    stream: &Stream,
    red: Red,
    x: &Tensor<T>,
    k: usize,
    sk: usize,
    dims: &[usize],
    strides: &[usize],
    out_shape: &[usize],
) -> TensorResult<O> {
    let n_out: usize = out_shape.iter().product();
    let out = alloc::<O>(red.name(), stream, out_shape)?;
    let span = crate::view::span(x.shape(), x.strides());
    let view = x.buffer().slice(x.offset()..x.offset() + span)?;
    let sms = crate::kernels::multiprocessors(stream);
    let axis_lanes = sk == 1 && k > 1;
    let (bx, by, splits, chunk) = strided_shape(n_out, k, sms, axis_lanes);
    let grid = n_out.div_ceil(bx).clamp(1, sms * 32) as u32;
    let block = if axis_lanes { (by, bx) } else { (bx, by) };
    let config = LaunchConfig::new(
        (grid, splits as u32, 1),
        (block.0 as u32, block.1 as u32, 1),
    );
    let tail = |args: &mut KernelArgs<'_>| {
        args.scalar(n_out as u64)
            .scalar(k as u64)
            .scalar(sk as u64)
            .scalar(chunk as u64)
            .scalar(dims.len() as i32);
        for d in 0..MAX_DIMS {
            args.scalar(dims.get(d).copied().unwrap_or(1) as u64);
        }
        for d in 0..MAX_DIMS {
            args.scalar(strides.get(d).copied().unwrap_or(0) as u64);
        }
        args.scalar(i32::from(axis_lanes));
    };
    if splits == 1 {
        {
            let mut args = KernelArgs::new();
            args.output(out.view(red.name())?).input(view);
            tail(&mut args);
            strided_kernel::<T>(red, false).launch(stream, config, &args)?;
        }
        return Ok(out);
    }
    // Partial values in 8-byte slots (as wide as any accumulator type) and their indices.
    let pv = DeviceBuffer::<i64>::alloc(stream, splits * n_out)?;
    let pi = DeviceBuffer::<u32>::alloc(stream, splits * n_out)?;
    {
        let mut args = KernelArgs::new();
        args.output(pv.view()).output(pi.view()).input(view);
        tail(&mut args);
        strided_kernel::<T>(red, true).launch(stream, config, &args)?;
    }
    {
        let mut args = KernelArgs::new();
        args.output(out.view(red.name())?)
            .input(pv.view())
            .input(pi.view())
            .scalar(n_out as u64)
            .scalar(splits as u64)
            .scalar(k as u64);
        let block = n_out.next_power_of_two().clamp(32, 256);
        let grid = n_out.div_ceil(block).clamp(1, sms * 32) as u32;
        let config = LaunchConfig::linear(grid, block as u32);
        combine_kernel::<T>(red).launch(stream, config, &args)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::strided_shape;

    /// An axis longer than 2^63 (an expanded view: `sum_axis(x.expand(&[(1 << 63) + 1]), 0)`)
    /// takes 32 threads per output like any long axis: its length is not rounded up to a
    /// power of two, which would overflow.
    #[test]
    fn axes_longer_than_2_pow_63_take_a_warp() {
        let k = (1usize << 63) + 1;
        for lanes in [false, true] {
            let (bx, by, splits, chunk) = strided_shape(1, k, 132, lanes);
            assert_eq!((bx, by), (1, 32), "lanes {lanes}");
            assert!(splits <= 65_535 && splits * chunk >= k, "lanes {lanes}");
        }
    }

    /// On 132 multiprocessors: 8192 columns of 8192 take 32 threads each in blocks of
    /// 16 × 32 (512 blocks, 262144 threads, no split); 37 columns of 8191 split the axis.
    #[test]
    fn launch_shapes_fill_the_device() {
        assert_eq!(strided_shape(8192, 8192, 132, false), (16, 32, 1, 8192));
        let (bx, by, splits, chunk) = strided_shape(37, 8191, 132, false);
        assert_eq!((bx, by), (16, 32));
        assert_eq!(splits, 16);
        assert!(splits * chunk >= 8191 && (splits - 1) * chunk < 8191);
        // Many outputs over a short axis: fewer threads per output, never more than the axis.
        assert_eq!(strided_shape(1 << 20, 3, 132, false), (512, 1, 1, 3));
        assert_eq!(strided_shape(5, 1, 132, false), (8, 1, 1, 1));
        // A packed axis: a warp per output, however many outputs.
        assert_eq!(strided_shape(1 << 20, 8192, 132, true), (16, 32, 1, 8192));
        let (bx, by, splits, _) = strided_shape(8, 100_000, 132, true);
        assert_eq!((bx, by, splits), (8, 32, 196));
    }
}

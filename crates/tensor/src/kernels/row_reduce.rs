//! The row reductions over the last axis: `sum`, `max`, `min`, `mean`, `argmax`, `argmin`
//! (the last-axis forms and the fast path of the axis reductions).
//!
//! On CUDA one block reduces one row, 256 threads (up to 1024 when there are too few rows to
//! fill the device): each thread reads 16-byte vectors from the row's first 16-byte boundary
//! on (the elements before it and after the last whole vector one at a time), issuing
//! [`UNROLL`] vector loads before it folds them, in increasing index order, so that ties of
//! the arg-reductions keep the first index. The block then combines with warp shuffles and
//! one shared-memory step. The result is deterministic: the same input gives the same bits.

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::{DeviceError, Kernel, LaunchConfig};

use super::reduce_axis::gives_way;
use super::rows::{launch_rows_by, reduced_shape, rows_of, ROW_COMMON};
use super::{alloc, TensorResult};
use crate::dtype::{cuda_prelude, DType};
use crate::op::{cached_kernel, kernel_op, TensorOp};
use crate::tensor::TensorInput;

/// Vector loads each thread issues before folding them.
const UNROLL: usize = 4;

/// Device code of the row reductions: `ROW_VISIT(BODY)` runs `BODY` for each of the thread's
/// elements of the row `xr` (index `i`, value `e`), in increasing index order.
const ROW_VISIT: &str = r#"
#define VW (16 / (int)sizeof(T))
#define UNROLL 4
union RedVec { uint4 u; T v[16 / sizeof(T)]; };
#define ROW_VISIT(BODY) { \
  u64 head_ = ((16u - ((u64)xr & 15u)) & 15u) / sizeof(T); \
  if (head_ > cols) head_ = cols; \
  const u64 nv_ = (cols - head_) / VW; \
  const uint4* xv_ = (const uint4*)(xr + head_); \
  if (threadIdx.x < head_) { u64 i = threadIdx.x; (void)i; A e = ld(xr[i]); BODY } \
  for (u64 q_ = threadIdx.x; q_ < nv_; q_ += (u64)UNROLL * blockDim.x) { \
    RedVec r_[UNROLL]; \
    _Pragma("unroll") \
    for (int u_ = 0; u_ < UNROLL; ++u_) { \
      u64 w_ = q_ + (u64)u_ * blockDim.x; \
      if (w_ < nv_) r_[u_].u = xv_[w_]; \
    } \
    _Pragma("unroll") \
    for (int u_ = 0; u_ < UNROLL; ++u_) { \
      u64 w_ = q_ + (u64)u_ * blockDim.x; \
      if (w_ < nv_) { \
        _Pragma("unroll") \
        for (int k_ = 0; k_ < VW; ++k_) { \
          u64 i = head_ + w_ * VW + k_; (void)i; A e = ld(r_[u_].v[k_]); BODY \
        } \
      } \
    } \
  } \
  for (u64 i = head_ + nv_ * VW + threadIdx.x; i < cols; i += blockDim.x) { A e = ld(xr[i]); BODY } }
"#;

/// The launch of the row reductions for `rows` rows of `cols` elements of `elem` bytes on a
/// device of `sms` multiprocessors: one block per row, of 256 threads (fewer for short rows,
/// up to 1024 when there are too few rows to fill the device otherwise).
fn reduce_launch(
    rows: usize,
    cols: usize,
    elem: usize,
    sms: usize,
) -> Result<LaunchConfig, DeviceError> {
    // One unrolled step of a thread: UNROLL vectors of 16 bytes.
    let step = UNROLL * (16 / elem).max(1);
    // Up to 1024 threads a row where 256 would leave the device short of 2048 a multiprocessor.
    let most = (sms * 2048)
        .div_ceil(rows.max(1))
        .next_power_of_two()
        .clamp(256, 1024);
    let block = cols.div_ceil(step).next_power_of_two().clamp(32, most) as u32;
    let grid = u32::try_from(rows).map_err(|_| DeviceError::InvalidShape {
        op: "row reduction",
        reason: format!("{rows} rows are more blocks than a launch can have"),
    })?;
    Ok(LaunchConfig::linear(grid, block))
}

/// Launches the row reduction `kernel()` of `x`'s rows into a new tensor of `out_shape`.
pub(super) fn launch_reduce_rows<O: DType, T: DType>(
    stream: &cuflow_runtime::Stream,
    kernel: impl FnOnce() -> Kernel,
    out_shape: &[usize],
    x: &crate::tensor::Tensor<T>,
) -> TensorResult<O> {
    let sms = crate::kernels::multiprocessors(stream);
    let launch = |rows, cols| reduce_launch(rows, cols, std::mem::size_of::<T>(), sms);
    launch_rows_by(stream, kernel, out_shape, x, &[], None, launch)
}

// ---------------------------------------------------------------------------------------------
// sum, max
// ---------------------------------------------------------------------------------------------

/// The row reduction `name` by `op` (`op_sum`, `op_max`, `op_min`); `mean` divides the sum by
/// the row length.
pub(super) fn reduce_kernel<T: DType>(name: &'static str, op: &'static str) -> Kernel {
    cached_kernel(name, T::NAME, || {
        let fname = format!("{name}_{}", T::NAME);
        let source = format!(
            r#"{prelude}{common}{visit}
extern "C" __global__ void __launch_bounds__(1024) {fname}(T* out, const T* x, u64 cols) {{
  __shared__ A sh[32];
  const T* xr = x + (u64)blockIdx.x * cols;
  // The identity of the sum, or the row's first element (a value of the row either way).
  A acc = {identity};
  ROW_VISIT(acc = {op}<A>(acc, e);)
  BLOCK_REDUCE(A, acc, {op}<A>, sh, {block_id})
  if (threadIdx.x == 0) out[blockIdx.x] = st({finish});
}}
"#,
            prelude = cuda_prelude::<T>(),
            common = ROW_COMMON,
            visit = ROW_VISIT,
            identity = if op == "op_sum" { "(A)0" } else { "ld(xr[0])" },
            block_id = if op == "op_sum" { "(A)0" } else { "sh[0]" },
            finish = if name == "mean" {
                "acc / (A)cols"
            } else {
                "acc"
            },
        );
        let is_sum = op == "op_sum";
        let is_min = op == "op_min";
        let is_mean = name == "mean";
        crate::op::builtin_kernel(fname, source).with_host(move |args| {
            let x = args.input::<T>(1)?;
            let cols = args.scalar::<u64>(2)? as usize;
            for (o, row) in args.output::<T>(0)?.iter_mut().zip(x.chunks(cols.max(1))) {
                *o =
                    if is_mean {
                        T::from_f64(row.iter().map(|v| v.to_f64()).sum::<f64>() / row.len() as f64)
                    } else if is_sum {
                        if T::IS_FLOAT {
                            T::from_f64(row.iter().map(|v| v.to_f64()).sum())
                        } else {
                            row.iter().fold(T::default(), |a, v| a.add(*v))
                        }
                    } else if is_min {
                        row.iter().copied().fold(row[0], |a, v| {
                            if v < a || gives_way(a, v) {
                                v
                            } else {
                                a
                            }
                        })
                    } else {
                        row.iter().copied().fold(row[0], |a, v| {
                            if v > a || gives_way(a, v) {
                                v
                            } else {
                                a
                            }
                        })
                    };
            }
            Ok(())
        })
    })
}

fn reduce<T: DType, X: TensorInput<T>>(
    name: &'static str,
    op: &'static str,
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    kernel_op(name, x, move |stream, x| {
        let (_, cols) = rows_of(name, x)?;
        if cols == 0 {
            if name == "sum" {
                // The sum of nothing is 0, as `sum_axis` gives.
                let out = alloc::<T>(name, stream, &reduced_shape(x.shape()))?;
                out.view(name)?.fill_bytes(stream, 0)?;
                return Ok(out);
            }
            return Err(DeviceError::InvalidShape {
                op: name,
                reason: format!(
                    "cannot take the {name} of an empty last axis of {:?}: it is undefined",
                    x.shape()
                ),
            });
        }
        let kernel = || reduce_kernel::<T>(name, op);
        launch_reduce_rows(stream, kernel, &reduced_shape(x.shape()), x)
    })
}

/// The sum over the last axis: `[.., n] → [..]` (`[n] → [1]`), 0 over an empty one. Floats
/// accumulate in `float` (`double` for `f64`); integers wrap.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] for a scalar.
pub fn sum<T: DType, X: TensorInput<T>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    reduce("sum", "op_sum", x)
}

/// The maximum over the last axis: `[.., n] → [..]` (`[n] → [1]`). NaN is skipped: the
/// maximum of a row is NaN only when the whole row is.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] for a scalar or an empty last axis.
pub fn max<T: DType, X: TensorInput<T>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    reduce("max", "op_max", x)
}

// ---------------------------------------------------------------------------------------------
// argmax
// ---------------------------------------------------------------------------------------------

/// The row arg-reduction `name`: `argmax` (`cmp` is `>`) or `argmin` (`<`).
pub(super) fn arg_kernel<T: DType>(name: &'static str) -> Kernel {
    let cmp = if name == "argmin" { "<" } else { ">" };
    cached_kernel(name, T::NAME, || {
        let fname = format!("{name}_{}", T::NAME);
        let source = format!(
            r#"{prelude}{common}{visit}
// Whether (v, vi) goes before (b, bi): a valid index before none, any value before NaN, then
// the larger value (`>`, or the smaller for `<`), then the lower index. A total order, so every
// lane of the shuffles below combines to the same result.
#define ARG_BETTER(v, vi, b, bi) ((vi) != 0xffffffffu && ((bi) == 0xffffffffu || \
  ((b) != (b) ? ((v) == (v) || (vi) < (bi)) : ((v) {cmp} (b) || ((v) == (b) && (vi) < (bi))))))
extern "C" __global__ void __launch_bounds__(1024) {fname}(unsigned* out, const T* x, u64 cols) {{
  __shared__ A shv[32];
  __shared__ unsigned shi[32];
  const T* xr = x + (u64)blockIdx.x * cols;
  A best = ld(xr[0]);
  unsigned bi = 0xffffffffu;
  // NaN is taken only before any other value (indices increase along a thread's visit).
  ROW_VISIT(if (bi == 0xffffffffu || e {cmp} best || (best != best && e == e)) {{ best = e; bi = (unsigned)i; }})
  for (int o = 16; o > 0; o >>= 1) {{
    A ov = shfl_x<A>(best, o);
    unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ARG_BETTER(ov, oi, best, bi)) {{ best = ov; bi = oi; }}
  }}
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) {{ shv[warp] = best; shi[warp] = bi; }}
  __syncthreads();
  if (warp == 0) {{
    best = lane < nw ? shv[lane] : shv[0];
    bi = lane < nw ? shi[lane] : 0xffffffffu;
    for (int o = 16; o > 0; o >>= 1) {{
      A ov = shfl_x<A>(best, o);
      unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ARG_BETTER(ov, oi, best, bi)) {{ best = ov; bi = oi; }}
    }}
    if (lane == 0) out[blockIdx.x] = bi;
  }}
}}
"#,
            prelude = cuda_prelude::<T>(),
            common = ROW_COMMON,
            visit = ROW_VISIT,
        );
        let min = name == "argmin";
        crate::op::builtin_kernel(fname, source).with_host(move |args| {
            let x = args.input::<T>(1)?;
            let cols = args.scalar::<u64>(2)? as usize;
            for (o, row) in args.output::<u32>(0)?.iter_mut().zip(x.chunks(cols.max(1))) {
                let mut best = 0usize;
                for (i, v) in row.iter().enumerate() {
                    let b = row[best];
                    if (min && *v < b) || (!min && *v > b) || gives_way(b, *v) {
                        best = i;
                    }
                }
                *o = best as u32;
            }
            Ok(())
        })
    })
}

/// The index of the maximum over the last axis, as `u32`: `[.., n] → [..]` (`[n] → [1]`).
/// Ties go to the first index. NaN values are never chosen unless a row is all NaN (then the
/// index is 0).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] for a scalar, an empty last axis, or one longer than `u32`.
pub fn argmax<T: DType, X: TensorInput<T>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<u32> + Send> {
    kernel_op("argmax", x, move |stream, x| {
        let (_, cols) = rows_of("argmax", x)?;
        if cols == 0 || cols > u32::MAX as usize {
            return Err(DeviceError::InvalidShape {
                op: "argmax",
                reason: format!(
                    "the last axis of {:?} must hold 1 to 2^32 - 1 elements",
                    x.shape()
                ),
            });
        }
        launch_reduce_rows(
            stream,
            || arg_kernel::<T>("argmax"),
            &reduced_shape(x.shape()),
            x,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::reduce_launch;

    /// On 132 multiprocessors: 8192 rows of 8192 `f32` take blocks of 256 threads, each
    /// thread 8 vectors of 16 bytes in two steps of 4; two rows take 1024 threads each; short
    /// rows a warp.
    #[test]
    fn row_launches() {
        let c = reduce_launch(8192, 8192, 4, 132).unwrap();
        assert_eq!((c.grid, c.block), ((8192, 1, 1), (256, 1, 1)));
        let c = reduce_launch(2, 70_001, 4, 132).unwrap();
        assert_eq!(c.block, (1024, 1, 1));
        let c = reduce_launch(8191, 37, 4, 132).unwrap();
        assert_eq!(c.block, (32, 1, 1));
    }
}

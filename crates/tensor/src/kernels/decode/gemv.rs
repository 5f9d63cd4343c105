//! `out = W · x` for a `bf16` weight `[rows, cols]` and an `f32` vector: the memory-bound
//! matrix-vector product of batch-1 decoding, with the vector operations around it fused in.
//!
//! Fusions, chosen per launch ([`GemvInput`], [`GemvEpilogue`]):
//! - the RMS norm of `x` ([`GemvInput::RmsNorm`]): every block sums the squares of `x` (read
//!   from L2, a few kilobytes) and stages `x · weight` once in shared memory; the scale
//!   `rsqrt(mean + eps)` multiplies the finished sums, so the normalized vector is never
//!   written to global memory;
//! - the residual add ([`GemvEpilogue::Accumulate`]): `out += W · x`, each element read and
//!   written by the one thread that owns its row;
//! - SwiGLU ([`GemvEpilogue::SwiGlu`]): a fused gate/up weight `[2 · inter, cols]` gives
//!   `out[i] = silu(y[i]) · y[inter + i]`, the warp that computes gate rows `i, i + 1`
//!   computing up rows `inter + i, inter + i + 1` too.
//!
//! On CUDA a warp computes four rows at once (four accumulators, one read of `x` for all), a
//! lane keeping eight 16-byte weight loads in flight; the first of them are issued before the
//! norm's reduction, so the weights stream while the block waits on its barrier. When there
//! are few rows for the device, `ksplit` warps of a block share a unit of four rows, each
//! summing an interleaved part of the columns, and the block adds their partial sums through
//! shared memory (a barrier before the sums are read and another before the slots are written
//! again). Blocks loop over units, so the norm's sum of squares is computed once per block.
//! Reading the weights once is the whole cost.

use cuflow_device_op::{from_fn, ExecutionContext};
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};
use half::bf16;

use super::{bf16_defs, check_len, u32_of};
use crate::kernels::check_device;
use crate::op::{cached_kernel, TensorOp};
use crate::tensor::Tensor;

/// Threads per block (eight warps).
const THREADS: u32 = 256;
/// Resident blocks per multiprocessor the grid is sized for (and the kernel's launch bound).
/// Two, not four: over the GEMVs of a 1B-shaped decode step on an H100 (16 layers and the LM
/// head, `docs/perf/gemv-sweep.txt`), the looser register bound and the smaller grid took the
/// step from 1194 to 1155 µs; 16-byte loads per row in flight (`UNROLL`) of 4 or 8 were slower.
const BLOCKS_PER_SM: usize = 2;
/// Rows a warp computes at once.
const ROWS_PER_WARP: usize = 4;
/// 16-byte weight vectors per row a lane loads before it uses them.
const UNROLL: usize = 2;
/// Longest input whose normalized copy is staged in shared memory (32 KiB, within the
/// 48 KiB a block gets without opting in, beside the kernel's static arrays).
const STAGE_MAX_COLS: usize = 8 * 1024;

/// How a fused GEMV reads its input vector `x`.
#[derive(Clone, Copy, Debug)]
pub enum GemvInput<'a> {
    /// `x` as it is.
    Plain,
    /// The RMS norm of `x`, `x / sqrt(mean(x²) + eps) · weight` (`weight` `bf16`, one value
    /// per column), computed as `x` is loaded.
    RmsNorm {
        /// The norm's weight.
        weight: &'a Tensor<bf16>,
        /// Added to the mean square.
        eps: f32,
    },
}

/// What a fused GEMV does with the products `y = W · x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvEpilogue {
    /// `out = y` (`out` has one element per row of `W`).
    Store,
    /// `out += y`: the residual add (`out` has one element per row of `W`).
    Accumulate,
    /// SwiGLU of a fused gate/up weight `[2 · inter, k]`: `out[i] = silu(y[i]) · y[inter + i]`
    /// (`out` has `inter` elements).
    SwiGlu,
}

impl GemvEpilogue {
    fn code(self) -> u32 {
        match self {
            GemvEpilogue::Store => 0,
            GemvEpilogue::Accumulate => 1,
            GemvEpilogue::SwiGlu => 2,
        }
    }
}

fn kernel_name(norm: bool, epilogue: GemvEpilogue) -> &'static str {
    match (norm, epilogue) {
        (false, GemvEpilogue::Store) => "decode_gemv",
        (false, GemvEpilogue::Accumulate) => "decode_gemv_add",
        (false, GemvEpilogue::SwiGlu) => "decode_gemv_swiglu",
        (true, GemvEpilogue::Store) => "decode_rms_norm_gemv",
        (true, GemvEpilogue::Accumulate) => "decode_rms_norm_gemv_add",
        (true, GemvEpilogue::SwiGlu) => "decode_rms_norm_gemv_swiglu",
    }
}

/// Every variant, for [`compile_all`](super::compile_all).
pub(super) fn kernels() -> Vec<Kernel> {
    let epilogues = [
        GemvEpilogue::Store,
        GemvEpilogue::Accumulate,
        GemvEpilogue::SwiGlu,
    ];
    [false, true]
        .into_iter()
        .flat_map(|norm| epilogues.map(|e| kernel(norm, e)))
        .collect()
}

fn source(name: &str, norm: bool, epilogue: GemvEpilogue) -> String {
    format!(
        r#"{defs}
#define IN_NORM {norm}
#define EPILOGUE {epilogue}
#define ROWS {rows}
#define UNROLL {unroll}
#define STAGE_MAX {stage_max}
__device__ __forceinline__ float bf_lo(unsigned v) {{ return __uint_as_float(v << 16); }}
__device__ __forceinline__ float bf_hi(unsigned v) {{ return __uint_as_float(v & 0xffff0000u); }}
__device__ __forceinline__ float dot8(uint4 p, const float* v, float acc) {{
  acc = fmaf(bf_lo(p.x), v[0], acc);
  acc = fmaf(bf_hi(p.x), v[1], acc);
  acc = fmaf(bf_lo(p.y), v[2], acc);
  acc = fmaf(bf_hi(p.y), v[3], acc);
  acc = fmaf(bf_lo(p.z), v[4], acc);
  acc = fmaf(bf_hi(p.z), v[5], acc);
  acc = fmaf(bf_lo(p.w), v[6], acc);
  acc = fmaf(bf_hi(p.w), v[7], acc);
  return acc;
}}
/* Row j of the ROWS rows of unit u, clamped to a row that exists (its product is not
   written): rows 4u .. 4u + 3, or for SwiGLU the gate rows 2u, 2u + 1 and the up rows
   inter + 2u, inter + 2u + 1. */
__device__ __forceinline__ unsigned row_of(unsigned u, unsigned j, unsigned rows) {{
#if EPILOGUE == 2
  const unsigned inter = rows >> 1;
  unsigned g = 2 * u + (j & 1);
  if (g >= inter) g = 2 * u;
  return j < 2 ? g : inter + g;
#else
  const unsigned r = ROWS * u + j;
  return r < rows ? r : rows - 1;
#endif
}}
/* The weight vectors i0 + k · stride (k < UNROLL) of every row of the unit. */
__device__ __forceinline__ void load_chunk(uint4 (&p)[ROWS][UNROLL], const uint4* const (&wr)[ROWS],
                                           unsigned i0, unsigned stride, unsigned nv) {{
#pragma unroll
  for (int k = 0; k < UNROLL; ++k) {{
    const unsigned i = i0 + k * stride;
#pragma unroll
    for (int j = 0; j < ROWS; ++j) p[j][k] = i < nv ? __ldg(wr[j] + i) : make_uint4(0u, 0u, 0u, 0u);
  }}
}}
/* Unit u's rows; false when the warp has no unit. */
__device__ __forceinline__ bool set_rows(const uint4* (&wr)[ROWS], const T_bf16* w, unsigned u,
                                         unsigned units, unsigned rows, unsigned cols) {{
#pragma unroll
  for (int j = 0; j < ROWS; ++j)
    wr[j] = (const uint4*)(w + (unsigned long long)row_of(u < units ? u : 0, j, rows) * cols);
  return u < units;
}}
/* A warp computes the ROWS rows of a unit, each lane keeping ROWS · UNROLL 16-byte weight
   loads in flight; `ksplit` warps of a block share a unit, each summing an interleaved part
   of the columns. The first loads are issued before the norm's reduction. With the norm,
   x · weight is staged once per block in shared memory (xs[i] = elements 8i .. 8i + 3,
   xs[nv + i] = elements 8i + 4 .. 8i + 7, so a warp's reads are contiguous) when it fits,
   and the scale rsqrt(mean(x²) + eps) multiplies the finished sums. */
extern "C" __global__ void __launch_bounds__(256, {min_blocks})
{name}(float* out, const T_bf16* w, const float* x, const T_bf16* nw, float eps,
       unsigned rows, unsigned cols, unsigned ksplit) {{
  extern __shared__ float4 xs[];
  __shared__ float partial[ROWS * 8];
  __shared__ float squares[8];
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const unsigned nv = cols >> 3;
  const float4* x4 = (const float4*)x;
  const uint4* nw4 = (const uint4*)nw;
#if EPILOGUE == 2
  const unsigned units = ((rows >> 1) + 1) >> 1;
#else
  const unsigned units = (rows + ROWS - 1) / ROWS;
#endif
  const unsigned per_block = warps / ksplit;
  const unsigned slot = warp / ksplit, part = warp % ksplit, stride = 32 * ksplit;
  const unsigned start = part * 32 + lane;
  const unsigned first = blockIdx.x * per_block, step = gridDim.x * per_block;
  const uint4* wr[ROWS];
  uint4 p[ROWS][UNROLL];
  if (set_rows(wr, w, first + slot, units, rows, cols)) load_chunk(p, wr, start, stride, nv);
  float scale = 1.0f;
#if IN_NORM
  const bool staged = cols <= STAGE_MAX;
  {{
    float ss = 0.0f;
    for (unsigned i = threadIdx.x; i < nv; i += blockDim.x) {{
      const float4 a = __ldg(x4 + 2 * i), b = __ldg(x4 + 2 * i + 1);
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
      ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
      if (staged) {{
        const uint4 g = __ldg(nw4 + i);
        xs[i] = make_float4(a.x * bf_lo(g.x), a.y * bf_hi(g.x), a.z * bf_lo(g.y), a.w * bf_hi(g.y));
        xs[nv + i] = make_float4(b.x * bf_lo(g.z), b.y * bf_hi(g.z), b.z * bf_lo(g.w), b.w * bf_hi(g.w));
      }}
    }}
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) squares[warp] = ss;
    __syncthreads();
    float s = 0.0f;
    for (unsigned i = 0; i < warps; ++i) s += squares[i];
    scale = 1.0f / sqrtf(s / (float)cols + eps);
  }}
#endif
  for (unsigned base = first; base < units; base += step) {{
    const unsigned u = base + slot;
    float acc[ROWS];
#pragma unroll
    for (int j = 0; j < ROWS; ++j) acc[j] = 0.0f;
    if (u < units) {{
      if (base != first) {{
        set_rows(wr, w, u, units, rows, cols);
        load_chunk(p, wr, start, stride, nv);
      }}
      for (unsigned i0 = start; i0 < nv; i0 += UNROLL * stride) {{
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {{
          const unsigned i = i0 + k * stride;
          if (i < nv) {{
            float4 a, b;
#if IN_NORM
            if (staged) {{
              a = xs[i];
              b = xs[nv + i];
            }} else {{
              const uint4 g = __ldg(nw4 + i);
              a = __ldg(x4 + 2 * i);
              b = __ldg(x4 + 2 * i + 1);
              a.x *= bf_lo(g.x); a.y *= bf_hi(g.x); a.z *= bf_lo(g.y); a.w *= bf_hi(g.y);
              b.x *= bf_lo(g.z); b.y *= bf_hi(g.z); b.z *= bf_lo(g.w); b.w *= bf_hi(g.w);
            }}
#else
            a = __ldg(x4 + 2 * i);
            b = __ldg(x4 + 2 * i + 1);
#endif
            const float v[8] = {{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
#pragma unroll
            for (int j = 0; j < ROWS; ++j) acc[j] = dot8(p[j][k], v, acc[j]);
          }}
        }}
        if (i0 + UNROLL * stride < nv) load_chunk(p, wr, i0 + UNROLL * stride, stride, nv);
      }}
#pragma unroll
      for (int j = 0; j < ROWS; ++j)
        for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    }}
    if (ksplit > 1) {{
      if (lane == 0) {{
#pragma unroll
        for (int j = 0; j < ROWS; ++j) partial[ROWS * warp + j] = acc[j];
      }}
      __syncthreads();
      if (part == 0) {{
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {{
          acc[j] = 0.0f;
          for (unsigned q = 0; q < ksplit; ++q) acc[j] += partial[ROWS * (warp + q) + j];
        }}
      }}
      __syncthreads();
    }}
    if (lane == 0 && part == 0 && u < units) {{
#pragma unroll
      for (int j = 0; j < ROWS; ++j) acc[j] *= scale;
#if EPILOGUE == 2
      const unsigned inter = rows >> 1;
#pragma unroll
      for (int j = 0; j < 2; ++j) {{
        const unsigned g = 2 * u + j;
        if (g < inter) out[g] = acc[j] / (1.0f + expf(-acc[j])) * acc[j + 2];
      }}
#else
#pragma unroll
      for (int j = 0; j < ROWS; ++j) {{
        const unsigned r = ROWS * u + j;
#if EPILOGUE == 0
        if (r < rows) out[r] = acc[j];
#else
        if (r < rows) out[r] += acc[j];
#endif
      }}
#endif
    }}
  }}
}}
"#,
        defs = bf16_defs(),
        norm = u32::from(norm),
        epilogue = epilogue.code(),
        rows = ROWS_PER_WARP,
        unroll = UNROLL,
        stage_max = STAGE_MAX_COLS,
        min_blocks = BLOCKS_PER_SM,
    )
}

fn kernel(norm: bool, epilogue: GemvEpilogue) -> Kernel {
    let name = kernel_name(norm, epilogue);
    cached_kernel(name, "bf16", || {
        crate::op::builtin_kernel(name, source(name, norm, epilogue)).with_host(move |args| {
            let w = args.input::<bf16>(1)?;
            let x = args.input::<f32>(2)?;
            let nw = args.input::<bf16>(3)?;
            let eps = f64::from(args.scalar::<f32>(4)?);
            let cols = (args.scalar::<u32>(6)? as usize).max(1);
            let out = args.output::<f32>(0)?;
            host_gemv(out, w, x, norm.then_some((nw, eps)), epilogue, cols);
            Ok(())
        })
    })
}

/// The host implementation: the input (normalized in `f64` when `norm` is given), products
/// accumulated in `f64`, the epilogue in `f64`, one rounding to `f32` per output.
fn host_gemv(
    out: &mut [f32],
    w: &[bf16],
    x: &[f32],
    norm: Option<(&[bf16], f64)>,
    epilogue: GemvEpilogue,
    cols: usize,
) {
    let x = &x[..cols.min(x.len())];
    let input: Vec<f64> = match norm {
        Some((nw, eps)) => {
            let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let r = 1.0 / (ss / cols as f64 + eps).sqrt();
            x.iter()
                .zip(nw)
                .map(|(&v, g)| f64::from(v) * r * f64::from(g.to_f32()))
                .collect()
        }
        None => x.iter().map(|&v| f64::from(v)).collect(),
    };
    let dot = |row: &[bf16]| -> f64 {
        row.iter()
            .zip(&input)
            .map(|(w, v)| f64::from(w.to_f32()) * v)
            .sum()
    };
    let products = w.chunks(cols).map(dot);
    match epilogue {
        GemvEpilogue::Store => {
            for (o, y) in out.iter_mut().zip(products) {
                *o = y as f32;
            }
        }
        GemvEpilogue::Accumulate => {
            for (o, y) in out.iter_mut().zip(products) {
                *o = (f64::from(*o) + y) as f32;
            }
        }
        GemvEpilogue::SwiGlu => {
            let y: Vec<f64> = products.collect();
            let (gate, up) = y.split_at(y.len() / 2);
            for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
                *o = (g / (1.0 + (-g).exp()) * u) as f32;
            }
        }
    }
}

/// Warps that share one unit of rows: doubled while the grid has fewer than sixteen warps
/// per multiprocessor and each lane keeps at least two 16-byte loads per row.
fn ksplit(units: usize, vectors: usize, sms: usize) -> usize {
    let warps = (THREADS / 32) as usize;
    let mut k = 1;
    while k < warps && units * k < 16 * sms && vectors / (32 * 2 * k) >= 2 {
        k *= 2;
    }
    k
}

/// Checks the shapes and launches the variant `(input, epilogue)` on row `x_row` of `x`.
fn launch(
    op: &'static str,
    stream: &Stream,
    out: &mut Tensor<f32>,
    w: &Tensor<bf16>,
    (x, x_row): (&Tensor<f32>, usize),
    input: GemvInput<'_>,
    epilogue: GemvEpilogue,
) -> Result<(), DeviceError> {
    for t in [&*out, x] {
        check_device(op, stream, t)?;
    }
    check_device(op, stream, w)?;
    let [n, k] = *w.shape() else {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!("`w` must be [n, k], got {:?}", w.shape()),
        });
    };
    if k % 8 != 0 {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "`w` is {:?}: its columns must be a multiple of 8 (16-byte loads)",
                w.shape()
            ),
        });
    }
    if epilogue == GemvEpilogue::SwiGlu {
        if n % 2 != 0 {
            return Err(DeviceError::InvalidShape {
                op,
                reason: format!(
                    "`w` is {:?}: a fused gate/up weight needs an even number of rows",
                    w.shape()
                ),
            });
        }
        check_len(op, "out", out, n / 2)?;
    } else {
        check_len(op, "out", out, n)?;
    }
    // The end of row `x_row`, checked: a row index past the address space has no row.
    let Some(row_end) = x_row
        .checked_add(1)
        .and_then(|r| r.checked_mul(k))
        .filter(|&end| end <= x.len())
    else {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "`x` {:?} has no row {x_row} of {k} elements, the columns of `w`",
                x.shape()
            ),
        });
    };
    let (norm_weight, eps) = match input {
        GemvInput::Plain => (w, 0.0),
        GemvInput::RmsNorm { weight, eps } => {
            check_device(op, stream, weight)?;
            check_len(op, "weight", weight, k)?;
            (weight, eps)
        }
    };
    if n == 0 {
        return Ok(());
    }
    if k == 0 {
        // Every product is an empty sum: zeros stored (SwiGLU's `silu(0) · 0` too), nothing
        // added.
        if epilogue != GemvEpilogue::Accumulate {
            out.view("decode::gemv")?.fill_bytes(stream, 0)?;
        }
        return Ok(());
    }
    let units = if epilogue == GemvEpilogue::SwiGlu {
        (n / 2).div_ceil(ROWS_PER_WARP / 2)
    } else {
        n.div_ceil(ROWS_PER_WARP)
    };
    let sms = crate::kernels::multiprocessors(stream);
    let split = ksplit(units, k / 8, sms);
    let blocks = units.div_ceil((THREADS / 32) as usize / split);
    // Blocks loop over units: as few rounds as the resident blocks allow, evenly spread.
    let rounds = blocks.div_ceil(sms * BLOCKS_PER_SM);
    let grid = blocks.div_ceil(rounds);
    let norm = matches!(input, GemvInput::RmsNorm { .. });
    // The normalized input, staged in shared memory when it fits.
    let staged = if norm && k <= STAGE_MAX_COLS {
        4 * k
    } else {
        0
    };
    kernel(norm, epilogue).launch(
        stream,
        LaunchConfig::linear(u32_of(op, "blocks", grid)?, THREADS).with_shared_mem(u32_of(
            op,
            "shared memory",
            staged,
        )?),
        KernelArgs::new()
            .output(out.view("decode::gemv")?)
            .input(w.view("decode::gemv")?)
            .input(x.view("decode::gemv")?.slice(row_end - k..row_end)?)
            .input(norm_weight.view("decode::gemv")?)
            .scalar(eps)
            .scalar(u32_of(op, "rows", n)?)
            .scalar(u32_of(op, "cols", k)?)
            .scalar(u32_of(op, "ksplit", split)?),
    )
}

/// `out = w · x[row]`: the product of a `bf16` weight `[n, k]` (`k` a multiple of 8) with
/// row `x_row` of `x` (`f32`, `k` elements per row), into `out` (`f32`, `n` elements).
/// Accumulates in `f32` (in `f64` on the host backend).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `gemv` when `w` is not 2-D with `k` a multiple of 8,
/// `out` does not hold `n` elements, or `x` has no row `x_row` of `k` elements.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, bf16, kernels::decode};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let w = api::from_vec(vec![bf16::from_f32(0.5); 2 * 8], &[2, 8]).sync_on(&stream)?;
/// let x = api::arange::<f32>(0.0, 8.0, 1.0).sync_on(&stream)?;
/// let mut out = api::zeros::<f32>(&[2]).sync_on(&stream)?;
/// decode::gemv(&mut out, &w, &x, 0).sync_on(&stream)?;
/// assert_eq!(out.to_host_vec()?, vec![14.0, 14.0]);
/// # Ok(()) }
/// ```
pub fn gemv<'a>(
    out: &'a mut Tensor<f32>,
    w: &'a Tensor<bf16>,
    x: &'a Tensor<f32>,
    x_row: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        launch(
            "gemv",
            stream,
            out,
            w,
            (x, x_row),
            GemvInput::Plain,
            GemvEpilogue::Store,
        )
    })
}

/// `W · x` with the vector work around it fused in: `x` (`f32`, `k` elements) read as it is
/// or through an RMS norm ([`GemvInput`]), the products `y = W · x` of the `bf16` weight `w`
/// `[n, k]` (`k` a multiple of 8) stored into `out`, added to it, or combined by SwiGLU
/// ([`GemvEpilogue`]). Accumulates in `f32` (in `f64` on the host backend).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `gemv_fused` when `w` is not 2-D with `k` a multiple
/// of 8, `x` does not hold `k` elements, the norm weight does not hold `k` elements, `out`
/// does not hold `n` elements (`n / 2` for SwiGLU), or SwiGLU is asked of an odd `n`.
///
/// # Examples
///
/// The residual stream after a projection, `x += W · a`, and the next norm fused into the
/// projection that reads it:
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, bf16, kernels::decode};
/// use decode::{GemvEpilogue, GemvInput};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let w = api::from_vec(vec![bf16::from_f32(0.5); 8 * 8], &[8, 8]).sync_on(&stream)?;
/// let a = api::full::<f32>(&[8], 1.0).sync_on(&stream)?;
/// let mut x = api::full::<f32>(&[8], 1.0).sync_on(&stream)?;
/// decode::gemv_fused(&mut x, &w, &a, GemvInput::Plain, GemvEpilogue::Accumulate)
///     .sync_on(&stream)?;
/// assert_eq!(x.to_host_vec()?, vec![5.0; 8]);
/// let norm = api::full(&[8], bf16::from_f32(2.0)).sync_on(&stream)?;
/// let mut y = api::zeros::<f32>(&[8]).sync_on(&stream)?;
/// let input = GemvInput::RmsNorm { weight: &norm, eps: 0.0 };
/// decode::gemv_fused(&mut y, &w, &x, input, GemvEpilogue::Store).sync_on(&stream)?;
/// assert_eq!(y.to_host_vec()?, vec![8.0; 8]); // rows of 0.5 · (1 · 2) over 8 columns
/// # Ok(()) }
/// ```
pub fn gemv_fused<'a>(
    out: &'a mut Tensor<f32>,
    w: &'a Tensor<bf16>,
    x: &'a Tensor<f32>,
    input: GemvInput<'a>,
    epilogue: GemvEpilogue,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        if let [_, k] = *w.shape() {
            check_len("gemv_fused", "x", x, k)?;
        }
        launch("gemv_fused", stream, out, w, (x, 0), input, epilogue)
    })
}

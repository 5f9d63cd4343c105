//! Row kernels of the decode step: the embedding lookup, RMS norms with a `bf16` weight (one
//! fused with the residual add), and SiLU·mul of the fused gate/up projection.
//!
//! On CUDA the norms run one block per row: a pass adds the residual (writing the sum back)
//! and sums squares, a block reduction, and a pass writes the normalized row. The sum written
//! back is read again only by the thread that wrote it.

use cuflow_device_op::{from_fn, ExecutionContext};
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig};
use half::bf16;

use super::{bf16_defs, check_len, first_index, u32_of};
use crate::kernels::check_device;
use crate::op::{cached_kernel, TensorOp};
use crate::tensor::Tensor;

const NORM_THREADS: u32 = 256;

/// The block reduction of the norm kernels: every thread gets the block's sum of `v`.
const BLOCK_SUM: &str = r#"
__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (unsigned i = 0; i < warps; ++i) s += red[i];
  return s;
}
"#;

fn norm_source(name: &str, params: &str, first_pass: &str) -> String {
    format!(
        r#"{defs}{sum}
extern "C" __global__ void {name}({params}, const T_bf16* w, float eps, unsigned cols) {{
  __shared__ float red[32];
  const unsigned long long base = (unsigned long long)blockIdx.x * cols;
  float ss = 0.0f;
  for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) {{
    {first_pass}
    ss += v * v;
  }}
  ss = block_sum(ss, red);
  const float r = 1.0f / sqrtf(ss / (float)cols + eps);
  for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) h[base + c] = x[base + c] * r * ld_bf16(w[c]);
}}
"#,
        defs = bf16_defs(),
        sum = BLOCK_SUM,
    )
}

/// One row of an RMS norm on the host: `h = x / sqrt(mean(x²) + eps) · w`.
fn host_norm_row(h: &mut [f32], x: &[f32], w: &[bf16], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let r = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((h, x), w) in h.iter_mut().zip(x).zip(w) {
        *h = x * r * w.to_f32();
    }
}

pub(super) fn residual_kernel() -> Kernel {
    cached_kernel("decode_residual_rms_norm", "f32", || {
        let source = norm_source(
            "decode_residual_rms_norm",
            "float* x, float* h, const float* delta",
            "const float v = x[base + c] + delta[base + c]; x[base + c] = v;",
        );
        crate::op::builtin_kernel("decode_residual_rms_norm", source).with_host(|args| {
            let delta = args.input::<f32>(2)?;
            let w = args.input::<bf16>(3)?;
            let eps = args.scalar::<f32>(4)?;
            let cols = (args.scalar::<u32>(5)? as usize).max(1);
            let x = args.output::<f32>(0)?;
            let h = args.output::<f32>(1)?;
            for ((x, h), d) in x
                .chunks_mut(cols)
                .zip(h.chunks_mut(cols))
                .zip(delta.chunks(cols))
            {
                for (x, d) in x.iter_mut().zip(d) {
                    *x += d;
                }
                host_norm_row(h, x, w, eps);
            }
            Ok(())
        })
    })
}

pub(super) fn plain_kernel() -> Kernel {
    cached_kernel("decode_rms_norm", "f32", || {
        let source = norm_source(
            "decode_rms_norm",
            "float* h, const float* x",
            "const float v = x[base + c];",
        );
        crate::op::builtin_kernel("decode_rms_norm", source).with_host(|args| {
            let x = args.input::<f32>(1)?;
            let w = args.input::<bf16>(2)?;
            let eps = args.scalar::<f32>(3)?;
            let cols = (args.scalar::<u32>(4)? as usize).max(1);
            let h = args.output::<f32>(0)?;
            for (h, x) in h.chunks_mut(cols).zip(x.chunks(cols)) {
                host_norm_row(h, x, w, eps);
            }
            Ok(())
        })
    })
}

/// `(rows, cols)` of a norm's `x`, with `h` and `weight` checked against it.
fn norm_dims(
    op: &'static str,
    x: &Tensor<f32>,
    h: &Tensor<f32>,
    weight: &Tensor<bf16>,
) -> Result<(usize, usize), DeviceError> {
    let cols = weight.len();
    if cols == 0 || !x.len().is_multiple_of(cols) || x.shape().last() != Some(&cols) {
        return Err(DeviceError::shape_mismatch(
            op,
            "the last axis of `x` must be the length of `weight`",
            x.shape(),
            weight.shape(),
        ));
    }
    check_len(op, "h", h, x.len())?;
    Ok((x.len() / cols, cols))
}

/// The residual add fused with the RMS norm that follows it: `x += delta`, then
/// `h = x / sqrt(mean(x²) + eps) · weight` per row. `x`, `delta` and `h` are `f32`
/// `[rows, cols]`, `weight` is `bf16` `[cols]`.
///
/// # Errors
///
/// [`DeviceError::ShapeMismatch`] or [`DeviceError::InvalidShape`] naming
/// `residual_rms_norm` when the shapes disagree.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, bf16, kernels::decode};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let mut x = api::full::<f32>(&[1, 4], 1.0).sync_on(&stream)?;
/// let delta = api::full::<f32>(&[1, 4], 1.0).sync_on(&stream)?;
/// let w = api::full(&[4], bf16::from_f32(3.0)).sync_on(&stream)?;
/// let mut h = api::zeros::<f32>(&[1, 4]).sync_on(&stream)?;
/// decode::residual_rms_norm(&mut x, &mut h, &delta, &w, 0.0).sync_on(&stream)?;
/// assert_eq!(x.to_host_vec()?, vec![2.0; 4]);
/// assert_eq!(h.to_host_vec()?, vec![3.0; 4]);
/// # Ok(()) }
/// ```
pub fn residual_rms_norm<'a>(
    x: &'a mut Tensor<f32>,
    h: &'a mut Tensor<f32>,
    delta: &'a Tensor<f32>,
    weight: &'a Tensor<bf16>,
    eps: f32,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        for t in [&*x, &*h, delta] {
            check_device("residual_rms_norm", stream, t)?;
        }
        check_device("residual_rms_norm", stream, weight)?;
        let (rows, cols) = norm_dims("residual_rms_norm", x, h, weight)?;
        check_len("residual_rms_norm", "delta", delta, x.len())?;
        if rows == 0 {
            return Ok(());
        }
        residual_kernel().launch(
            stream,
            LaunchConfig::linear(u32_of("residual_rms_norm", "rows", rows)?, NORM_THREADS),
            KernelArgs::new()
                .output(x.view("decode::residual_rms_norm")?)
                .output(h.view("decode::residual_rms_norm")?)
                .input(delta.view("decode::residual_rms_norm")?)
                .input(weight.view("decode::residual_rms_norm")?)
                .scalar(eps)
                .scalar(u32_of("residual_rms_norm", "cols", cols)?),
        )
    })
}

/// RMS norm per row without a residual: `h = x / sqrt(mean(x²) + eps) · weight`, `x` and
/// `h` `f32` `[rows, cols]`, `weight` `bf16` `[cols]`.
///
/// # Errors
///
/// As [`residual_rms_norm`], naming `rms_norm_rows`.
pub fn rms_norm_rows<'a>(
    h: &'a mut Tensor<f32>,
    x: &'a Tensor<f32>,
    weight: &'a Tensor<bf16>,
    eps: f32,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        for t in [&*h, x] {
            check_device("rms_norm_rows", stream, t)?;
        }
        check_device("rms_norm_rows", stream, weight)?;
        let (rows, cols) = norm_dims("rms_norm_rows", x, h, weight)?;
        if rows == 0 {
            return Ok(());
        }
        plain_kernel().launch(
            stream,
            LaunchConfig::linear(u32_of("rms_norm_rows", "rows", rows)?, NORM_THREADS),
            KernelArgs::new()
                .output(h.view("decode::rms_norm_rows")?)
                .input(x.view("decode::rms_norm_rows")?)
                .input(weight.view("decode::rms_norm_rows")?)
                .scalar(eps)
                .scalar(u32_of("rms_norm_rows", "cols", cols)?),
        )
    })
}

pub(super) fn embed_kernel() -> Kernel {
    cached_kernel("decode_embed", "bf16", || {
        let source = format!(
            r#"{defs}
extern "C" __global__ void decode_embed(float* out, const T_bf16* table, const unsigned* ids,
                                        unsigned vocab, unsigned cols) {{
  const unsigned id = ids[blockIdx.x];
  float* o = out + (unsigned long long)blockIdx.x * cols;
  // Row 0 stands in for an id past the vocabulary (never read): no pointer leaves the table.
  const T_bf16* src = table + (unsigned long long)(id < vocab ? id : 0u) * cols;
  for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) o[c] = id < vocab ? ld_bf16(src[c]) : 0.0f;
}}
"#,
            defs = bf16_defs()
        );
        crate::op::builtin_kernel("decode_embed", source).with_host(|args| {
            let table = args.input::<bf16>(1)?;
            let ids = args.input::<u32>(2)?;
            let vocab = args.scalar::<u32>(3)? as usize;
            let cols = (args.scalar::<u32>(4)? as usize).max(1);
            let out = args.output::<f32>(0)?;
            for (row, o) in out.chunks_mut(cols).enumerate() {
                let id = first_index(&ids[row.min(ids.len())..]);
                for (c, o) in o.iter_mut().enumerate() {
                    *o = if id < vocab {
                        table[id * cols + c].to_f32()
                    } else {
                        0.0
                    };
                }
            }
            Ok(())
        })
    })
}

/// `out[r] = table[ids[r]]` as `f32`: the embedding rows of `ids` (`u32`, `[rows]`) from a
/// `bf16` table `[vocab, cols]` into `out` (`[rows, cols]`). An id past the vocabulary gives
/// a row of zeros.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `embed_rows` when the shapes disagree.
pub fn embed_rows<'a>(
    out: &'a mut Tensor<f32>,
    table: &'a Tensor<bf16>,
    ids: &'a Tensor<u32>,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        check_device("embed_rows", stream, out)?;
        check_device("embed_rows", stream, table)?;
        check_device("embed_rows", stream, ids)?;
        let [vocab, cols] = *table.shape() else {
            return Err(DeviceError::InvalidShape {
                op: "embed_rows",
                reason: format!("`table` must be [vocab, cols], got {:?}", table.shape()),
            });
        };
        let len = ids
            .len()
            .checked_mul(cols)
            .ok_or_else(|| DeviceError::InvalidShape {
                op: "embed_rows",
                reason: format!(
                    "{} rows of the {cols} columns of `table` {:?} overflow usize",
                    ids.len(),
                    table.shape()
                ),
            })?;
        check_len("embed_rows", "out", out, len)?;
        if ids.is_empty() {
            return Ok(());
        }
        embed_kernel().launch(
            stream,
            LaunchConfig::linear(u32_of("embed_rows", "rows", ids.len())?, NORM_THREADS),
            KernelArgs::new()
                .output(out.view("decode::embed_rows")?)
                .input(table.view("decode::embed_rows")?)
                .input(ids.view("decode::embed_rows")?)
                .scalar(u32_of("embed_rows", "vocab", vocab)?)
                .scalar(u32_of("embed_rows", "cols", cols)?),
        )
    })
}

pub(super) fn silu_mul_kernel() -> Kernel {
    cached_kernel("decode_silu_mul", "f32", || {
        let source = r#"
extern "C" __global__ void decode_silu_mul(float* out, const float* gate_up, unsigned rows,
                                           unsigned inter) {
  const unsigned long long n = (unsigned long long)rows * inter;
  for (unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
       k += (unsigned long long)blockDim.x * gridDim.x) {
    const unsigned long long r = k / inter, i = k % inter;
    const float g = gate_up[r * 2 * inter + i], u = gate_up[r * 2 * inter + inter + i];
    out[k] = g / (1.0f + expf(-g)) * u;
  }
}
"#;
        crate::op::builtin_kernel("decode_silu_mul", source).with_host(|args| {
            let gu = args.input::<f32>(1)?;
            let inter = (args.scalar::<u32>(3)? as usize).max(1);
            let out = args.output::<f32>(0)?;
            for (o, gu) in out.chunks_mut(inter).zip(gu.chunks(2 * inter)) {
                let (g, u) = gu.split_at(inter);
                for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                    *o = g / (1.0 + (-g).exp()) * u;
                }
            }
            Ok(())
        })
    })
}

/// SwiGLU's activation: `out[r, i] = silu(gate_up[r, i]) · gate_up[r, inter + i]`, for the
/// fused gate/up projection `gate_up` `[rows, 2 · inter]` into `out` `[rows, inter]`.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `silu_mul` when the shapes disagree.
pub fn silu_mul<'a>(
    out: &'a mut Tensor<f32>,
    gate_up: &'a Tensor<f32>,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        check_device("silu_mul", stream, out)?;
        check_device("silu_mul", stream, gate_up)?;
        let inter = out.shape().last().copied().unwrap_or(0);
        if inter == 0 || out.rank() < 2 {
            return Err(DeviceError::InvalidShape {
                op: "silu_mul",
                reason: format!("`out` must be [rows, inter], got {:?}", out.shape()),
            });
        }
        let rows = out.len() / inter;
        let len = out
            .len()
            .checked_mul(2)
            .ok_or_else(|| DeviceError::InvalidShape {
                op: "silu_mul",
                reason: format!(
                    "`out` {:?} needs a `gate_up` of twice its {} elements, which overflows \
                     usize",
                    out.shape(),
                    out.len()
                ),
            })?;
        check_len("silu_mul", "gate_up", gate_up, len)?;
        let sms = crate::kernels::multiprocessors(stream);
        let grid = out.len().div_ceil(256).clamp(1, sms * 16);
        silu_mul_kernel().launch(
            stream,
            LaunchConfig::linear(u32_of("silu_mul", "blocks", grid)?, 256),
            KernelArgs::new()
                .output(out.view("decode::silu_mul")?)
                .input(gate_up.view("decode::silu_mul")?)
                .scalar(u32_of("silu_mul", "rows", rows)?)
                .scalar(u32_of("silu_mul", "inter", inter)?),
        )
    })
}

//! `out = W · x` for a `bf16` weight `[rows, cols]` and an `f32` vector: the memory-bound
//! matrix-vector product of batch-1 decoding.
//!
//! On CUDA one warp computes one row and a block of 256 threads eight rows: each lane reads
//! the row in 16-byte vectors (eight `bf16`), four in flight, multiplies them with the
//! matching `f32` elements of `x` (read as `float4`, cached in L1 across the block's rows),
//! accumulates in `f32` and the warp reduces with shuffles. Reading the weights once is the
//! whole cost, so the kernel runs at the device's memory bandwidth when there are enough rows
//! to fill it.

use cuflow_device_op::{from_fn, ExecutionContext};
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig};
use half::bf16;

use super::{bf16_defs, check_len, u32_of};
use crate::kernels::check_device;
use crate::op::{cached_kernel, TensorOp};
use crate::tensor::Tensor;

/// Rows per block (one per warp).
const ROWS_PER_BLOCK: u32 = 8;

pub(super) fn kernel() -> Kernel {
    cached_kernel("decode_gemv", "bf16", || {
        let source = format!(
            r#"{defs}
__device__ __forceinline__ float bf_lo(unsigned v) {{ return __uint_as_float(v << 16); }}
__device__ __forceinline__ float bf_hi(unsigned v) {{ return __uint_as_float(v & 0xffff0000u); }}
extern "C" __global__ void decode_gemv(float* out, const T_bf16* w, const float* x,
                                       unsigned rows, unsigned cols) {{
  const unsigned lane = threadIdx.x & 31;
  const unsigned row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const uint4* wr = (const uint4*)(w + (unsigned long long)row * cols);
  const float4* x4 = (const float4*)x;
  const unsigned nv = cols >> 3;
  float acc = 0.0f;
#pragma unroll 4
  for (unsigned i = lane; i < nv; i += 32) {{
    const uint4 p = __ldg(wr + i);
    const float4 a = __ldg(x4 + 2 * i);
    const float4 b = __ldg(x4 + 2 * i + 1);
    acc = fmaf(bf_lo(p.x), a.x, acc);
    acc = fmaf(bf_hi(p.x), a.y, acc);
    acc = fmaf(bf_lo(p.y), a.z, acc);
    acc = fmaf(bf_hi(p.y), a.w, acc);
    acc = fmaf(bf_lo(p.z), b.x, acc);
    acc = fmaf(bf_hi(p.z), b.y, acc);
    acc = fmaf(bf_lo(p.w), b.z, acc);
    acc = fmaf(bf_hi(p.w), b.w, acc);
  }}
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[row] = acc;
}}
"#,
            defs = bf16_defs()
        );
        crate::op::builtin_kernel("decode_gemv", source).with_host(|args| {
            let w = args.input::<bf16>(1)?;
            let x = args.input::<f32>(2)?;
            let cols = args.scalar::<u32>(4)? as usize;
            let out = args.output::<f32>(0)?;
            for (o, row) in out.iter_mut().zip(w.chunks(cols.max(1))) {
                *o = row
                    .iter()
                    .zip(x)
                    .map(|(w, x)| f64::from(w.to_f32()) * f64::from(*x))
                    .sum::<f64>() as f32;
            }
            Ok(())
        })
    })
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
        for t in [&*out, x] {
            check_device("gemv", stream, t)?;
        }
        check_device("gemv", stream, w)?;
        let [n, k] = *w.shape() else {
            return Err(DeviceError::InvalidShape {
                op: "gemv",
                reason: format!("`w` must be [n, k], got {:?}", w.shape()),
            });
        };
        if k % 8 != 0 {
            return Err(DeviceError::InvalidShape {
                op: "gemv",
                reason: format!(
                    "`w` is {:?}: its columns must be a multiple of 8 (16-byte loads)",
                    w.shape()
                ),
            });
        }
        check_len("gemv", "out", out, n)?;
        if (x_row + 1) * k > x.len() {
            return Err(DeviceError::InvalidShape {
                op: "gemv",
                reason: format!(
                    "`x` {:?} has no row {x_row} of {k} elements, the columns of `w`",
                    x.shape()
                ),
            });
        }
        if n == 0 || k == 0 {
            return Ok(());
        }
        let grid = u32_of("gemv", "blocks", n.div_ceil(ROWS_PER_BLOCK as usize))?;
        kernel().launch(
            stream,
            LaunchConfig::linear(grid, ROWS_PER_BLOCK * 32),
            KernelArgs::new()
                .output(&**out.buffer())
                .input(&**w.buffer())
                .input(x.buffer().slice(x_row * k..(x_row + 1) * k)?)
                .scalar(u32_of("gemv", "rows", n)?)
                .scalar(u32_of("gemv", "cols", k)?),
        )
    })
}

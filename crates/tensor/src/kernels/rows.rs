//! Kernels over the last axis: `softmax`, `rms_norm`, `layer_norm`, and the launch and block
//! reductions they share with the row reductions of [`super::row_reduce`].
//!
//! On CUDA one block handles one row: each thread keeps up to 16 of the row's elements in
//! registers (rows of up to 16 × 1024 elements are read from memory once), and the block
//! reduces with warp shuffles and one shared-memory step. Longer rows are read again for each
//! pass. Floating-point types compute in `float` (`double` for `f64`); integer sums wrap.
//!
//! So on CUDA, as in PyTorch, rms_norm's and layer_norm's sums of squares leave `float`'s range
//! for rows of magnitude beyond about 1.8e19 (or below 1e-19 with `eps` 0), where the host
//! backend, summing in `f64`, is right. Summing them in `double` fixes that, and was measured
//! at 10% of rms_norm's throughput at 4096×4096 on the H100; a second pass in `double` taken
//! only when the `float` sum leaves its range would keep both.

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};

use super::{alloc, TensorResult};
use crate::dtype::{cuda_prelude, DType, FloatDType};
use crate::op::{cached_kernel, kernel_op, kernel_op2, kernel_op3, TensorOp};
use crate::tensor::{Tensor, TensorInput};

/// Device code shared by the row kernels: block reductions and the row loop macros.
pub(super) const ROW_COMMON: &str = r#"
typedef unsigned long long u64;
#define SLOTS 16
template <typename V> __device__ __forceinline__ V shfl_x(V v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
template <> __device__ __forceinline__ unsigned char shfl_x<unsigned char>(unsigned char v, int o) {
  return (unsigned char)__shfl_xor_sync(0xffffffffu, (int)v, o);
}
template <typename V> __device__ __forceinline__ V op_sum(V a, V b) { return a + b; }
// Signed integers wrap through unsigned arithmetic (C leaves signed overflow undefined).
template <> __device__ __forceinline__ int op_sum<int>(int a, int b) {
  return (int)((unsigned)a + (unsigned)b);
}
template <> __device__ __forceinline__ long long op_sum<long long>(long long a, long long b) {
  return (long long)((unsigned long long)a + (unsigned long long)b);
}
// NaN loses to any other value (the result is NaN only when both are).
template <typename V> __device__ __forceinline__ V op_max(V a, V b) { return (a > b || b != b) ? a : b; }
template <typename V> __device__ __forceinline__ V op_min(V a, V b) { return (a < b || b != b) ? a : b; }
#define BLOCK_REDUCE(V, v, OP, sh, ID) { \
  for (int o_ = 16; o_ > 0; o_ >>= 1) v = OP(v, shfl_x<V>(v, o_)); \
  int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5, nw_ = (blockDim.x + 31) >> 5; \
  __syncthreads(); \
  if (lane_ == 0) sh[warp_] = v; \
  __syncthreads(); \
  if (warp_ == 0) { \
    V w_ = lane_ < nw_ ? sh[lane_] : (ID); \
    for (int o_ = 16; o_ > 0; o_ >>= 1) w_ = OP(w_, shfl_x<V>(w_, o_)); \
    __syncwarp(); /* every lane has read sh[0] (the identity of max) before it is written */ \
    if (lane_ == 0) sh[0] = w_; \
  } \
  __syncthreads(); \
  v = sh[0]; }
"#;

/// The launch for `rows` rows of `cols`: one block per row.
fn row_launch(rows: usize, cols: usize) -> Result<LaunchConfig, DeviceError> {
    // Short rows: 16 elements per thread (fewer threads and barriers per row); long rows:
    // about 8, so that 4096 columns keep 512 threads.
    let per_thread = if cols <= 2048 { 16 } else { 8 };
    let block = cols
        .div_ceil(per_thread)
        .next_power_of_two()
        .clamp(32, 1024) as u32;
    let grid = u32::try_from(rows).map_err(|_| DeviceError::InvalidShape {
        op: "row kernel",
        reason: format!("{rows} rows are more blocks than a launch can have"),
    })?;
    Ok(LaunchConfig::linear(grid, block))
}

pub(super) fn rows_of<T: DType>(
    op: &'static str,
    x: &Tensor<T>,
) -> Result<(usize, usize), DeviceError> {
    if x.rank() == 0 {
        return Err(DeviceError::InvalidShape {
            op,
            reason: "expects a tensor with at least one axis, got a scalar".into(),
        });
    }
    Ok(x.rows_cols())
}

/// The shape without the last axis (`[1]` for a 1-D input).
pub(super) fn reduced_shape(shape: &[usize]) -> Vec<usize> {
    if shape.len() <= 1 {
        vec![1]
    } else {
        shape[..shape.len() - 1].to_vec()
    }
}

/// Allocates the output of `out_shape` and, unless `x` has no elements, launches `kernel()` with
/// one block per row: its arguments are the output, `x`, the `params` tensors, `eps` when given,
/// then `cols`.
pub(super) fn launch_rows<O: DType, T: DType>(
    stream: &Stream,
    kernel: impl FnOnce() -> Kernel,
    out_shape: &[usize],
    x: &Tensor<T>,
    params: &[&Tensor<T>],
    eps: Option<f32>,
) -> TensorResult<O> {
    launch_rows_by(stream, kernel, out_shape, x, params, eps, row_launch)
}

/// [`launch_rows`] with the launch of `rows` rows of `cols` chosen by `launch`.
pub(super) fn launch_rows_by<O: DType, T: DType>(
    stream: &Stream,
    kernel: impl FnOnce() -> Kernel,
    out_shape: &[usize],
    x: &Tensor<T>,
    params: &[&Tensor<T>],
    eps: Option<f32>,
    launch: impl FnOnce(usize, usize) -> Result<LaunchConfig, DeviceError>,
) -> TensorResult<O> {
    let (rows, cols) = x.rows_cols();
    let out = alloc::<O>("row kernel", stream, out_shape)?;
    if rows > 0 && cols > 0 {
        let mut args = KernelArgs::new();
        args.output(out.view("row kernel")?)
            .input(x.view("row kernel")?);
        for p in params {
            args.input(p.view("row kernel")?);
        }
        if let Some(eps) = eps {
            args.scalar(eps);
        }
        kernel().launch(stream, launch(rows, cols)?, args.scalar(cols as u64))?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// softmax, rms_norm, layer_norm: rows cached in registers
// ---------------------------------------------------------------------------------------------

/// The row loop macros of the normalizing kernels: `LOAD` fills `v[]` (when the row fits in
/// registers), `EACH(i, e)` visits every element with its value `e` from registers or memory.
const CACHED_ROW: &str = r#"
#define VW (16 / (int)sizeof(T))
union RowVec { uint4 u; T v[16 / sizeof(T)]; };
// Element index of register slot j_: vectors of VW elements, vector q_ of a thread at
// threadIdx.x + q_ * blockDim.x (when rows are VW-aligned); else element threadIdx.x + j_ * blockDim.x.
#define SLOT_INDEX(j_) (vec ? ((u64)threadIdx.x + (u64)((j_) / VW) * blockDim.x) * VW + (j_) % VW \
                           : (u64)threadIdx.x + (u64)(j_) * blockDim.x)
#define ROW_SETUP \
  const T* xr = x + (u64)blockIdx.x * cols; \
  T* orow = out + (u64)blockIdx.x * cols; \
  bool cached = cols <= (u64)blockDim.x * SLOTS; \
  bool vec = cols % VW == 0; \
  A v[SLOTS]; \
  if (cached && vec) { \
    _Pragma("unroll") \
    for (int q_ = 0; q_ < SLOTS / VW; ++q_) { \
      u64 wv_ = (u64)threadIdx.x + (u64)q_ * blockDim.x; \
      RowVec rv_; \
      if (wv_ * VW < cols) rv_.u = ((const uint4*)xr)[wv_]; \
      _Pragma("unroll") \
      for (int k_ = 0; k_ < VW; ++k_) v[q_ * VW + k_] = wv_ * VW < cols ? ld(rv_.v[k_]) : (A)0; \
    } \
  } else if (cached) { \
    _Pragma("unroll") \
    for (int j_ = 0; j_ < SLOTS; ++j_) { \
      u64 i = threadIdx.x + (u64)j_ * blockDim.x; \
      v[j_] = i < cols ? ld(xr[i]) : (A)0; \
    } \
  }
// Visits every element: `i` its index, `e` its value (a reference to the register slot when
// cached, so BODY may update it for a later pass).
#define EACH(BODY) \
  if (cached) { \
    _Pragma("unroll") \
    for (int j_ = 0; j_ < SLOTS; ++j_) { \
      u64 i = SLOT_INDEX(j_); \
      if (i < cols) { A& e = v[j_]; BODY } \
    } \
  } else { \
    for (u64 i = threadIdx.x; i < cols; i += blockDim.x) { A e = ld(xr[i]); BODY } \
  }
// Writes st(EXPR) for every element, EXPR in `e` and `i`; 16-byte stores when cached and aligned.
#define WRITE(EXPR) \
  if (cached && vec) { \
    _Pragma("unroll") \
    for (int q_ = 0; q_ < SLOTS / VW; ++q_) { \
      u64 wv_ = (u64)threadIdx.x + (u64)q_ * blockDim.x; \
      if (wv_ * VW < cols) { \
        RowVec rv_; \
        _Pragma("unroll") \
        for (int k_ = 0; k_ < VW; ++k_) { u64 i = wv_ * VW + k_; A e = v[q_ * VW + k_]; rv_.v[k_] = st(EXPR); } \
        ((uint4*)orow)[wv_] = rv_.u; \
      } \
    } \
  } else { \
    EACH(orow[i] = st(EXPR);) \
  }
"#;

pub(super) fn norm_kernel<T: FloatDType>(
    name: &'static str,
    params: &'static str,
    body: &'static str,
) -> Kernel {
    cached_kernel(name, T::NAME, || {
        let fname = format!("{name}_{}", T::NAME);
        let source = format!(
            r#"{prelude}{common}{cached}
extern "C" __global__ void {fname}(T* out, const T* x{params}, u64 cols) {{
  __shared__ A sh[32];
  ROW_SETUP
  {body}
}}
"#,
            prelude = cuda_prelude::<T>(),
            common = ROW_COMMON,
            cached = CACHED_ROW,
        );
        let host = match name {
            "softmax" => host_softmax::<T> as HostRowFn<T>,
            "log_softmax" => host_log_softmax::<T>,
            "rms_norm" => host_rms_norm::<T>,
            _ => host_layer_norm::<T>,
        };
        crate::op::builtin_kernel(fname, source).with_host(move |args| {
            let n_in = match name {
                "softmax" | "log_softmax" => 1,
                "rms_norm" => 2,
                _ => 3,
            };
            let x = args.input::<T>(1)?;
            let w = if n_in >= 2 { args.input::<T>(2)? } else { &[] };
            let b = if n_in >= 3 { args.input::<T>(3)? } else { &[] };
            let eps = if n_in >= 2 {
                args.scalar::<f32>(n_in + 1)? as f64
            } else {
                0.0
            };
            let cols = args.scalar::<u64>(args.len() - 1)? as usize;
            let out = args.output::<T>(0)?;
            for (o, row) in out.chunks_mut(cols.max(1)).zip(x.chunks(cols.max(1))) {
                host(o, row, w, b, eps);
            }
            Ok(())
        })
    })
}

type HostRowFn<T> = fn(&mut [T], &[T], &[T], &[T], f64);

fn host_softmax<T: DType>(o: &mut [T], row: &[T], _: &[T], _: &[T], _: f64) {
    let m = row
        .iter()
        .map(|v| v.to_f64())
        .fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = row.iter().map(|v| (v.to_f64() - m).exp()).sum();
    for (o, v) in o.iter_mut().zip(row) {
        *o = T::from_f64((v.to_f64() - m).exp() / s);
    }
}

fn host_log_softmax<T: DType>(o: &mut [T], row: &[T], _: &[T], _: &[T], _: f64) {
    let m = row
        .iter()
        .map(|v| v.to_f64())
        .fold(f64::NEG_INFINITY, f64::max);
    let ls = row.iter().map(|v| (v.to_f64() - m).exp()).sum::<f64>().ln();
    for (o, v) in o.iter_mut().zip(row) {
        *o = T::from_f64(v.to_f64() - m - ls);
    }
}

fn host_rms_norm<T: DType>(o: &mut [T], row: &[T], w: &[T], _: &[T], eps: f64) {
    let ms = row.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / row.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    for ((o, v), w) in o.iter_mut().zip(row).zip(w) {
        *o = T::from_f64(v.to_f64() * r * w.to_f64());
    }
}

fn host_layer_norm<T: DType>(o: &mut [T], row: &[T], w: &[T], b: &[T], eps: f64) {
    let n = row.len() as f64;
    let mean = row.iter().map(|v| v.to_f64()).sum::<f64>() / n;
    let var = row.iter().map(|v| (v.to_f64() - mean).powi(2)).sum::<f64>() / n;
    let r = 1.0 / (var + eps).sqrt();
    for (((o, v), w), b) in o.iter_mut().zip(row).zip(w).zip(b) {
        *o = T::from_f64((v.to_f64() - mean) * r * w.to_f64() + b.to_f64());
    }
}

pub(super) const LOG_SOFTMAX_BODY: &str = r#"
  A m = (A)(-__int_as_float(0x7f800000));
  EACH(m = m > e ? m : e;)
  BLOCK_REDUCE(A, m, op_max<A>, sh, sh[0])
  A s = (A)0;
  EACH(s += exp2((e - m) * (A)1.4426950408889634);)
  BLOCK_REDUCE(A, s, op_sum<A>, sh, (A)0)
  A ls = log(s);
  WRITE(e - m - ls)
"#;

pub(super) const SOFTMAX_BODY: &str = r#"
  A m = (A)(-__int_as_float(0x7f800000));
  EACH(m = m > e ? m : e;)
  BLOCK_REDUCE(A, m, op_max<A>, sh, sh[0])
  A s = (A)0;
  if (cached) {
    EACH(e = exp2((e - m) * (A)1.4426950408889634); s += e;)
  } else {
    EACH(s += exp2((e - m) * (A)1.4426950408889634);)
  }
  BLOCK_REDUCE(A, s, op_sum<A>, sh, (A)0)
  A inv = (A)1 / s;
  if (cached) {
    WRITE(e * inv)
  } else {
    EACH(orow[i] = st(exp2((e - m) * (A)1.4426950408889634) * inv);)
  }
"#;

const RMS_BODY: &str = r#"
  A s = (A)0;
  EACH(s += e * e;)
  BLOCK_REDUCE(A, s, op_sum<A>, sh, (A)0)
  A r = (A)1 / sqrt(s / (A)cols + (A)eps);
  WRITE(e * r * ld(w[i]))
"#;

const LAYER_BODY: &str = r#"
  A s = (A)0;
  EACH(s += e;)
  BLOCK_REDUCE(A, s, op_sum<A>, sh, (A)0)
  A mean = s / (A)cols;
  A q = (A)0;
  EACH(q += (e - mean) * (e - mean);)
  BLOCK_REDUCE(A, q, op_sum<A>, sh, (A)0)
  A r = (A)1 / sqrt(q / (A)cols + (A)eps);
  WRITE((e - mean) * r * ld(w[i]) + ld(b[i]))
"#;

/// Checks that the parameter `name` (`weight`, `bias`) of a row normalization is `[cols]`.
fn check_row_param<T: DType>(
    op: &'static str,
    name: &str,
    x: &Tensor<T>,
    p: &Tensor<T>,
    cols: usize,
) -> Result<(), DeviceError> {
    if p.shape() != [cols] {
        return Err(DeviceError::shape_mismatch(
            op,
            format!(
                "`{name}` must be [{cols}], the last dimension of `x`, but is {:?}",
                p.shape()
            ),
            x.shape(),
            p.shape(),
        ));
    }
    Ok(())
}

/// The softmax over the last axis, numerically stable (the row maximum is subtracted first).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] for a scalar.
pub fn softmax<T: FloatDType, X: TensorInput<T>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    kernel_op("softmax", x, move |stream, x| {
        rows_of("softmax", x)?;
        let kernel = || norm_kernel::<T>("softmax", "", SOFTMAX_BODY);
        launch_rows(stream, kernel, x.shape(), x, &[], None)
    })
}

/// RMS normalization over the last axis: `y = x / sqrt(mean(x²) + eps) · weight`, with
/// `weight` of shape `[cols]`.
///
/// # Errors
///
/// [`DeviceError::ShapeMismatch`] naming `rms_norm` and `weight` when it is not `[cols]`,
/// [`DeviceError::InvalidShape`] for a scalar.
pub fn rms_norm<T: FloatDType, X: TensorInput<T>, W: TensorInput<T>>(
    x: X,
    weight: W,
    eps: f32,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    kernel_op2("rms_norm", (x, weight), move |stream, x, w| {
        let (_, cols) = rows_of("rms_norm", x)?;
        check_row_param("rms_norm", "weight", x, w, cols)?;
        let kernel = || norm_kernel::<T>("rms_norm", ", const T* w, float eps", RMS_BODY);
        launch_rows(stream, kernel, x.shape(), x, &[w], Some(eps))
    })
}

/// Layer normalization over the last axis: `y = (x - mean) / sqrt(var + eps) · weight + bias`
/// with the biased variance (as PyTorch), `weight` and `bias` of shape `[cols]`.
///
/// # Errors
///
/// [`DeviceError::ShapeMismatch`] naming `layer_norm` and which of `weight` or `bias` is not
/// `[cols]`,
/// [`DeviceError::InvalidShape`] for a scalar.
pub fn layer_norm<T: FloatDType, X: TensorInput<T>, W: TensorInput<T>, B: TensorInput<T>>(
    x: X,
    weight: W,
    bias: B,
    eps: f32,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    kernel_op3("layer_norm", (x, weight, bias), move |stream, [x, w, b]| {
        let (_, cols) = rows_of("layer_norm", x)?;
        check_row_param("layer_norm", "weight", x, w, cols)?;
        check_row_param("layer_norm", "bias", x, b, cols)?;
        let params = ", const T* w, const T* b, float eps";
        let kernel = || norm_kernel::<T>("layer_norm", params, LAYER_BODY);
        launch_rows(stream, kernel, x.shape(), x, &[w, b], Some(eps))
    })
}

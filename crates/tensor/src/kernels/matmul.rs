//! Matrix products through the runtime's GEMM (cuBLAS on CUDA, a blocked GEMM on host).

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::{gemm, DeviceError, GemmConfig, GemmElem, GemmOutput};

use super::{alloc, TensorResult};
use crate::dtype::DType;
use crate::op::{kernel_op2, TensorOp};
use crate::tensor::{Tensor, TensorInput};

/// `(batch, rows, cols)` of a 2-D matrix or a 3-D batch of matrices.
fn matrix_dims(
    op: &'static str,
    t: &Tensor<impl DType>,
) -> Result<(usize, usize, usize), DeviceError> {
    match *t.shape() {
        [r, c] => Ok((1, r, c)),
        [b, r, c] => Ok((b, r, c)),
        _ => Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "expects a matrix [rows, cols] or a batch [batch, rows, cols], got {:?}",
                t.shape()
            ),
        }),
    }
}

fn product<T, O, A, B>(
    op: &'static str,
    a: A,
    b: B,
    trans_b: bool,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<O> + Send>
where
    T: DType + GemmElem,
    O: DType + GemmOutput<T>,
    A: TensorInput<T>,
    B: TensorInput<T>,
{
    kernel_op2(op, (a, b), move |stream, a, b| {
        let mismatch = |what: String| DeviceError::shape_mismatch(op, what, a.shape(), b.shape());
        let (batch, m, k) = matrix_dims(op, a)?;
        let (b_batch, b_rows, b_cols) = matrix_dims(op, b)?;
        // The arguments as the docs name them: `matmul(a, b)`, `linear(x, w)`.
        let (a_name, b_name, kb, n, b_axis) = if trans_b {
            ("x", "w", b_cols, b_rows, "columns")
        } else {
            ("a", "b", b_rows, b_cols, "rows")
        };
        if kb != k {
            return Err(mismatch(format!(
                "inner dimensions differ: `{a_name}` has {k} columns but `{b_name}` has \
                 {kb} {b_axis}"
            )));
        }
        if b.rank() == 3 && a.rank() != 3 {
            return Err(mismatch(format!(
                "a batch `{b_name}` of {b_batch} matrices needs a batch `{a_name}` of as many"
            )));
        }
        if b.rank() == 3 && b_batch != batch {
            return Err(mismatch(format!(
                "batch sizes differ: `{a_name}` holds {batch} matrices but `{b_name}` holds \
                 {b_batch}"
            )));
        }
        let shape: Vec<usize> = if a.rank() == 3 {
            vec![batch, m, n]
        } else {
            vec![m, n]
        };
        let out = alloc::<O>(op, stream, &shape)?;
        if out.is_empty() {
            // No product to compute: an empty batch would still have the GEMM check a shared
            // 2-D `b` as a batch of none.
            return Ok(out);
        }
        let size = |x: usize, y: usize| {
            x.checked_mul(y).ok_or_else(|| DeviceError::InvalidShape {
                op,
                reason: format!(
                    "{:?} · {:?}: a matrix of {x} × {y} elements overflows usize",
                    a.shape(),
                    b.shape()
                ),
            })
        };
        let b_stride = if b.rank() == 3 { size(k, n)? } else { 0 };
        let cfg = GemmConfig::new(m, n, k)
            .transpose(false, trans_b)
            .batched(batch)
            .strides(size(m, k)?, b_stride, size(m, n)?);
        gemm(
            stream,
            cfg,
            a.view("matmul")?,
            b.view("matmul")?,
            out.view("matmul")?,
        )?;
        Ok(out)
    })
}

/// The matrix product `a · b`: `[m, k] · [k, n] → [m, n]`, or batched
/// `[batch, m, k] · [batch, k, n] → [batch, m, n]` (a 2-D `b` is shared by the whole batch).
/// `f32`, `f64`, `f16` and `bf16`; half types accumulate in `f32`. cuBLAS on CUDA (full `f32`
/// precision, no TF32), a blocked GEMM on host.
///
/// # Errors
///
/// [`DeviceError::ShapeMismatch`] naming `matmul`, both shapes and both inner dimensions
/// (`a`'s columns, `b`'s rows) when they differ, or both batch sizes when a 3-D `b` does not
/// match `a`'s batch; [`DeviceError::InvalidShape`] for tensors that are not 2-D or 3-D.
pub fn matmul<T: DType + GemmElem, A: TensorInput<T>, B: TensorInput<T>>(
    a: A,
    b: B,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    product("matmul", a, b, false)
}

/// `x · wᵀ` for a weight stored `[out_features, in_features]` (as in a linear layer):
/// `[m, k] · [n, k]ᵀ → [m, n]`, batched like [`matmul`].
///
/// # Errors
///
/// As [`matmul`], naming `linear`.
pub fn linear<T: DType + GemmElem, X: TensorInput<T>, W: TensorInput<T>>(
    x: X,
    w: W,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    product("linear", x, w, true)
}

/// [`matmul`] with an `f32` output: for `f16` and `bf16` inputs, mixed precision (the products
/// accumulate in `f32` and are stored without rounding to half; cuBLAS `GemmEx` with
/// `CUBLAS_COMPUTE_32F` on CUDA); for `f32` inputs, the same as [`matmul`].
///
/// # Errors
///
/// As [`matmul`], naming `matmul_f32`.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::{api, bf16, kernels};
/// let a = api::full::<bf16>(&[2, 257], bf16::from_f32(1.0)).sync()?;
/// let b = api::full::<bf16>(&[257, 2], bf16::from_f32(1.0)).sync()?;
/// // 257 has no bf16: a bf16 output rounds it to 256, an f32 one keeps it.
/// assert_eq!(kernels::matmul(&a, &b).sync()?.to_host_vec()?[0], bf16::from_f32(256.0));
/// assert_eq!(kernels::matmul_f32(&a, &b).sync()?.to_host_vec()?, vec![257.0f32; 4]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn matmul_f32<T, A, B>(
    a: A,
    b: B,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<f32> + Send>
where
    T: DType + GemmElem,
    f32: GemmOutput<T>,
    A: TensorInput<T>,
    B: TensorInput<T>,
{
    product("matmul_f32", a, b, false)
}

/// [`linear`] with an `f32` output, in mixed precision for `f16` and `bf16` inputs as
/// [`matmul_f32`].
///
/// # Errors
///
/// As [`matmul`], naming `linear_f32`.
pub fn linear_f32<T, X, W>(
    x: X,
    w: W,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<f32> + Send>
where
    T: DType + GemmElem,
    f32: GemmOutput<T>,
    X: TensorInput<T>,
    W: TensorInput<T>,
{
    product("linear_f32", x, w, true)
}

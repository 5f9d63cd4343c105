//! Kernels to chain: each returns an op, takes its inputs as `Tensor<T>`, `Arc<Tensor<T>>`,
//! `&Tensor<T>` or an op producing one, and has a CUDA C implementation (compiled by NVRTC
//! for the device, once per process) and a host implementation computing the same function.
//!
//! Two output conventions:
//! - functional kernels (`add`, `relu`, `softmax`, `matmul`, ...) allocate their output on the
//!   executing stream and yield it as a new `Tensor<T>`;
//! - kernels with an explicit output (`saxpy`) write into a [`Partition`] of an owned tensor or
//!   of a `&mut Tensor` (in place) and yield the partition and their input back, in the mode
//!   they were given. The partition's tile shape sets the launch decomposition (one block per
//!   tile) and must divide the tensor.
//!
//! Every kernel accepts views (see [`Tensor`]): the elementwise, broadcast,
//! comparison and axis-reduction kernels read strided inputs in place; the others copy a
//! non-contiguous input to a dense tensor first, on the executing stream. Outputs written in
//! place (partitions) must be contiguous.
//!
//! A wrong shape, dtype, device or partition is a [`DeviceError`] naming the kernel and the
//! shapes (and the axis, for broadcasting and reductions), returned when the op runs.
//!
//! [`DeviceError`]: cuflow_runtime::DeviceError

mod compare;
pub mod decode;
mod elementwise;
mod gather;
mod layout;
mod matmul;
mod reduce_axis;
mod reduce_strided;
mod row_reduce;
mod rows;
mod strided;
mod strided_source;

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::{DeviceError, Stream};

pub use compare::{clamp, eq, ge, gt, le, lt, ne, where_};
pub(crate) use elementwise::{alloc, check_device, fill, Ew};
pub use gather::{concat, gather, index_select, stack, IndexDType};
pub use layout::{embedding, transpose};
pub use matmul::{linear, linear_f32, matmul, matmul_f32};
pub use reduce_axis::{
    argmax_axis, argmin_axis, log_softmax_axis, max_axis, mean_axis, min_axis, softmax_axis,
    sum_axis,
};
pub use row_reduce::{argmax, max, sum};
pub use rows::{layer_norm, rms_norm, softmax};
pub use strided::contiguous;
pub(crate) use strided::{dense, gather as gather_copy};

use crate::dtype::{DType, FloatDType};
use crate::op::TensorOp;
use crate::tensor::{Partition, Tensor, TensorInput, TensorMut};

/// The op type of kernels that yield a new tensor.
pub type TensorResult<T> = Result<Tensor<T>, DeviceError>;

// Integer sums, differences and products are computed in `unsigned long long` (`u64` in every
// kernel source) and converted back: C leaves signed overflow undefined, while unsigned
// arithmetic wraps, and its low bits are those of the two's-complement result the host's
// `wrapping_*` gives.

/// The CUDA C integer quotient `a / b` as [`DType::div`] computes it: 0 for a zero divisor,
/// and `-a` in unsigned arithmetic (wrapping `MIN / -1` to `MIN`, which C leaves undefined)
/// for a signed divisor of -1.
const INT_DIV_B: &str = "(b == (A)0 ? (A)0 : ((A)-1 < (A)0 && b == (A)-1) \
                         ? (A)(0ull - (unsigned long long)a) : a / b)";
/// [`INT_DIV_B`] with the scalar divisor `s`.
const INT_DIV_S: &str = "(s == (A)0 ? (A)0 : ((A)-1 < (A)0 && s == (A)-1) \
                         ? (A)(0ull - (unsigned long long)a) : a / s)";

macro_rules! binary_kernel {
    ($(#[$doc:meta])* $fn:ident, $name:literal, $expr:literal, $int_expr:expr, $host:path) => {
        $(#[$doc])*
        pub fn $fn<T: DType, X: TensorInput<T>, Y: TensorInput<T>>(
            x: X,
            y: Y,
        ) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
            elementwise::binary(
                Ew {
                    name: $name,
                    expr: if T::IS_FLOAT { $expr } else { $int_expr },
                    inputs: 2,
                    reads_out: false,
                    helpers: "",
                    host: |_, a, b, _| $host(a, b),
                },
                x,
                y,
            )
        }
    };
}

binary_kernel!(
    /// `x + y` elementwise, `x` and `y` broadcast to one shape under NumPy's rules
    /// (aligned at the last axis; along each axis the lengths are equal or one is 1):
    /// `[2, 3] + [2, 1]`, `[3] + [2, 3]` and `[1] + [0, 3]` are all valid. Dense operands of
    /// one shape, or a dense row of the last axis, take a vectorized kernel; views and other
    /// broadcasts are read in place by the strided kernel, without copies.
    ///
    /// # Errors
    ///
    /// [`DeviceError::ShapeMismatch`] naming the axis where the shapes do not broadcast.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::DeviceOpExt;
    /// use cuflow_runtime::Device;
    /// use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let stream = Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).sync_on(&stream)?;
    /// let col = api::from_vec(vec![10.0f32, 20.0], &[2, 1]).sync_on(&stream)?;
    /// let y = kernels::add(&x, &col).sync_on(&stream)?;
    /// assert_eq!(y.to_host_vec()?, vec![11.0, 12.0, 13.0, 24.0, 25.0, 26.0]);
    /// # Ok(()) }
    /// ```
    add, "add", "a + b", "(A)((u64)a + (u64)b)", DType::add
);
binary_kernel!(
    /// `x - y` elementwise, with `y` broadcast as in [`add`].
    sub, "sub", "a - b", "(A)((u64)a - (u64)b)", DType::sub
);
binary_kernel!(
    /// `x * y` elementwise, with `y` broadcast as in [`add`].
    mul, "mul", "a * b", "(A)((u64)a * (u64)b)", DType::mul
);
binary_kernel!(
    /// `x / y` elementwise, with `y` broadcast as in [`add`]. Integer division truncates
    /// toward zero; division by zero gives 0 and the overflowing `MIN / -1` wraps to `MIN`.
    div, "div", "a / b", INT_DIV_B, DType::div
);

macro_rules! scalar_kernel {
    ($(#[$doc:meta])* $fn:ident, $name:literal, $expr:literal, $int_expr:expr, $host:path) => {
        $(#[$doc])*
        pub fn $fn<T: DType, X: TensorInput<T>>(
            x: X,
            s: T,
        ) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
            elementwise::unary(
                Ew {
                    name: $name,
                    expr: if T::IS_FLOAT { $expr } else { $int_expr },
                    inputs: 1,
                    reads_out: false,
                    helpers: "",
                    host: |_, a, _, s| $host(a, s),
                },
                x,
                s,
            )
        }
    };
}

scalar_kernel!(
    /// `x + s` elementwise.
    add_scalar, "add_scalar", "a + s", "(A)((u64)a + (u64)s)", DType::add
);
scalar_kernel!(
    /// `x - s` elementwise.
    sub_scalar, "sub_scalar", "a - s", "(A)((u64)a - (u64)s)", DType::sub
);
scalar_kernel!(
    /// `x * s` elementwise.
    mul_scalar, "mul_scalar", "a * s", "(A)((u64)a * (u64)s)", DType::mul
);
scalar_kernel!(
    /// `x / s` elementwise. Integer division as in [`div`]: by zero gives 0, `MIN / -1` wraps
    /// to `MIN`.
    div_scalar, "div_scalar", "a / s", INT_DIV_S, DType::div
);

/// `x * s` elementwise (the same as [`mul_scalar`]).
pub fn scale<T: DType, X: TensorInput<T>>(
    x: X,
    s: T,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    mul_scalar(x, s)
}

macro_rules! float_unary_kernel {
    ($(#[$doc:meta])* $fn:ident, $name:literal, $expr:literal, |$v:ident| $host:expr) => {
        float_unary_kernel!($(#[$doc])* $fn, $name, "", $expr, |$v| $host);
    };
    (
        $(#[$doc:meta])* $fn:ident, $name:literal, $helpers:expr, $expr:literal,
        |$v:ident| $host:expr
    ) => {
        $(#[$doc])*
        pub fn $fn<T: FloatDType, X: TensorInput<T>>(
            x: X,
        ) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
            elementwise::unary(
                Ew {
                    name: $name,
                    expr: $expr,
                    inputs: 1,
                    reads_out: false,
                    helpers: $helpers,
                    host: |_, a: T, _, _| {
                        let $v = a.to_f64();
                        T::from_f64($host)
                    },
                },
                x,
                T::default(),
            )
        }
    };
}

float_unary_kernel!(
    /// `max(x, 0)` elementwise; NaN stays NaN (as in PyTorch).
    relu, "relu", "((a > (A)0 || a != a) ? a : (A)0)",
    |v| if v > 0.0 || v.is_nan() { v } else { 0.0 }
);
float_unary_kernel!(
    /// GELU with the exact error function: `x · Φ(x) = 0.5 · x · erfc(-x / √2)`, which is
    /// `0.5 · x · (1 + erf(x / √2))` without its cancellation for negative `x`: `gelu(-10)` is
    /// -7.62e-23, where `1 + erf` rounds to 0.
    gelu, "gelu", "(A)0.5 * a * erfc(-a * (A)0.70710678118654752440)",
    |v| 0.5 * v * libm::erfc(-v * std::f64::consts::FRAC_1_SQRT_2)
);

/// SiLU of `a`: `a / (1 + e^(-a))` for `a >= 0`; for negative `a`, `a · e^a / (1 + e^a)` with
/// `e^a` as the square of `h = e^(a/2)`, multiplied in as `(a · h) · h`, so that neither does
/// `e^(-a)` overflow (which gave -0 for `silu(-90)` in `float`, -7.37e-38) nor does `e^a` round
/// to a subnormal before the product while `a · e^a` is still normal.
const SILU_HELPER: &str = "__device__ __forceinline__ A silu_(A a) {
  if (a >= (A)0) return a / ((A)1 + exp(-a));
  A h = exp(a * (A)0.5);
  return a * h * h / ((A)1 + h * h);
}";

/// [`SILU_HELPER`] on the host, in `f64`.
fn silu_f64(v: f64) -> f64 {
    if v >= 0.0 {
        v / (1.0 + (-v).exp())
    } else {
        let h = (v * 0.5).exp();
        v * h * h / (1.0 + h * h)
    }
}

float_unary_kernel!(
    /// SiLU (swish): `x · sigmoid(x)`, in a form that keeps tiny results of very negative `x`
    /// (`silu(-90)` in `f32` is -7.37e-38).
    silu, "silu", SILU_HELPER, "silu_(a)", |v| silu_f64(v)
);
float_unary_kernel!(
    /// `eˣ` elementwise.
    exp, "exp", "exp(a)", |v| v.exp()
);
float_unary_kernel!(
    /// `tanh(x)` elementwise.
    tanh, "tanh", "tanh(a)", |v| v.tanh()
);

/// `out = a · x + out` (BLAS saxpy) over a partitioned output, written in place. Yields the
/// partition and `x` back.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, kernels, PartitionExt};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let mut z = api::zeros::<f32>(&[16, 16]).sync_on(&stream)?;
/// let x = api::ones::<f32>(&[16, 16]).sync_on(&stream)?;
/// let _ = kernels::saxpy((&mut z).partition([4, 4]), 2.0, &x).sync_on(&stream)?;
/// assert_eq!(z.to_host_vec()?, vec![2.0f32; 256]);
/// # Ok(()) }
/// ```
#[allow(clippy::type_complexity)]
pub fn saxpy<T: DType, P: TensorMut<T>, X: TensorInput<T>>(
    out: Partition<P>,
    a: T,
    x: X,
) -> TensorOp<
    impl FnOnce(&mut ExecutionContext) -> Result<(Partition<P>, X::Value), DeviceError> + Send,
> {
    elementwise::into_partition(
        Ew {
            name: "saxpy",
            expr: if T::IS_FLOAT {
                "s * a + o"
            } else {
                "(A)((u64)s * (u64)a + (u64)o)"
            },
            inputs: 1,
            reads_out: true,
            helpers: "",
            // Fused as CUDA contracts `s * a + o`: floats round once to the compute type.
            host: |o: T, x: T, _, s: T| s.mul_add(x, o),
        },
        out,
        x,
        a,
    )
}

/// The multiprocessors of `stream`'s device (at least 1): what grids are sized by.
pub(crate) fn multiprocessors(stream: &Stream) -> usize {
    stream.device().limits().multiprocessor_count.max(1) as usize
}

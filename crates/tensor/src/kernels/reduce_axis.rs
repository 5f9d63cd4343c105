//! Reductions along any axis, with `keepdim`: `sum_axis`, `mean_axis`, `max_axis`,
//! `min_axis`, `argmax_axis`, `argmin_axis`, and `softmax_axis` / `log_softmax_axis`.
//!
//! A reduction over the last axis of a contiguous tensor is the row kernel of
//! [`super::row_reduce`] (one block per row). Any other axis, or a view, runs the strided
//! reduction kernel of [`super::reduce_strided`], which reads the input in place through its
//! strides (nothing is copied), splitting a long axis over several blocks when there are too
//! few outputs to fill the device. Softmax along an axis other than the last of a contiguous
//! tensor runs the row kernel over a copy with that axis last and copies the result back to
//! the input's axis order.

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::{DeviceError, Stream};
use smallvec::SmallVec;

use super::reduce_strided::launch_strided;
use super::row_reduce::{arg_kernel, launch_reduce_rows, reduce_kernel};
use super::rows::{launch_rows, norm_kernel, LOG_SOFTMAX_BODY};
use super::strided::gather;
use super::{alloc, TensorResult};
use crate::dtype::{DType, FloatDType};
use crate::op::{strided_op, TensorOp};
use crate::tensor::{contiguous_strides, Shape, Tensor, TensorInput};
use crate::view::{check_axis, collapse, MAX_DIMS};

/// One reduction: its name (`sum`, `mean`, `max`, `min`, `argmax`, `argmin`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Red {
    Sum,
    Mean,
    Max,
    Min,
    ArgMax,
    ArgMin,
}

impl Red {
    pub(super) fn name(self) -> &'static str {
        match self {
            Red::Sum => "sum",
            Red::Mean => "mean",
            Red::Max => "max",
            Red::Min => "min",
            Red::ArgMax => "argmax",
            Red::ArgMin => "argmin",
        }
    }

    /// Whether it yields indices.
    pub(super) fn is_arg(self) -> bool {
        matches!(self, Red::ArgMax | Red::ArgMin)
    }

    /// Folds `v` (at index `vi`) into `acc` (at index `bi`) of a `float` type or not. Ties keep
    /// the lower index; NaN gives way to any other value (and to a NaN of a lower index).
    /// Integer sums wrap through `unsigned long long` (`u64`), as C leaves signed overflow
    /// undefined.
    pub(super) fn step(self, float: bool) -> &'static str {
        match self {
            Red::Sum | Red::Mean if float => "acc += v;",
            Red::Sum | Red::Mean => "acc = (A)((u64)acc + (u64)v);",
            Red::Max => "if (v > acc || acc != acc) acc = v;",
            Red::Min => "if (v < acc || acc != acc) acc = v;",
            Red::ArgMax => {
                "if (acc != acc ? (v == v || vi < bi) : (v > acc || (v == acc && vi < bi))) \
                 { acc = v; bi = vi; }"
            }
            Red::ArgMin => {
                "if (acc != acc ? (v == v || vi < bi) : (v < acc || (v == acc && vi < bi))) \
                 { acc = v; bi = vi; }"
            }
        }
    }

    /// The value an output gets, in CUDA C (`acc`, its index `bi`, the axis length `K`).
    pub(super) fn finish(self) -> &'static str {
        match self {
            Red::Sum | Red::Max | Red::Min => "st(acc)",
            Red::Mean => "st(acc / (A)K)",
            Red::ArgMax | Red::ArgMin => "bi",
        }
    }

    /// The host reduction of the values `v` (at least one): the value and its index.
    pub(super) fn host<T: DType>(self, v: impl Iterator<Item = T>) -> (T, u32) {
        let mut it = v.enumerate();
        let Some((_, first)) = it.next() else {
            return (T::default(), 0);
        };
        let (mut acc, mut bi, mut n) = (first, 0u32, 1usize);
        let mut sum = first.to_f64();
        for (k, v) in it {
            n += 1;
            match self {
                Red::Sum if !T::IS_FLOAT => acc = acc.add(v),
                Red::Sum | Red::Mean => sum += v.to_f64(),
                Red::Max | Red::ArgMax if v > acc || gives_way(acc, v) => (acc, bi) = (v, k as u32),
                Red::Min | Red::ArgMin if v < acc || gives_way(acc, v) => (acc, bi) = (v, k as u32),
                _ => {}
            }
        }
        match self {
            Red::Sum if T::IS_FLOAT => (T::from_f64(sum), 0),
            Red::Mean => (T::from_f64(sum / n as f64), 0),
            _ => (acc, bi),
        }
    }
}

/// Whether `acc`, the maximum or minimum so far, gives way to the later value `v`: NaN does to
/// any other value.
pub(super) fn gives_way<T: DType>(acc: T, v: T) -> bool {
    T::IS_FLOAT && acc.to_f64().is_nan() && !v.to_f64().is_nan()
}

/// The shape of a reduction of `shape` over `axis`: without it, or with length 1 there when
/// `keepdim`.
fn reduced(shape: &[usize], axis: usize, keepdim: bool) -> Shape {
    let mut out: Shape = shape.into();
    if keepdim {
        out[axis] = 1;
    } else {
        out.remove(axis);
    }
    out
}

/// `x` with `axis` moved last, as a dense copy (or `x` itself when it is last already and `x`
/// is contiguous).
fn axis_last<T: DType>(
    op: &'static str,
    stream: &Stream,
    x: &Tensor<T>,
    axis: usize,
) -> TensorResult<T> {
    let mut order: SmallVec<[usize; 8]> = (0..x.rank()).filter(|&a| a != axis).collect();
    order.push(axis);
    let p = x.permute(&order)?;
    if p.is_kernel_ready() {
        Ok(p)
    } else {
        gather(op, stream, &p)
    }
}

/// Launches the reduction `red` of `x` over `axis` into `out` (of the reduced shape).
fn reduce_into<T: DType, O: DType>(
    stream: &Stream,
    red: Red,
    x: &Tensor<T>,
    axis: usize,
    out_shape: &[usize],
) -> TensorResult<O> {
    let k = x.shape()[axis];
    if axis + 1 == x.rank() && x.is_kernel_ready() {
        let kernel = || match red {
            Red::ArgMax | Red::ArgMin => arg_kernel::<T>(red.name()),
            Red::Sum | Red::Mean => reduce_kernel::<T>(red.name(), "op_sum"),
            Red::Max => reduce_kernel::<T>("max", "op_max"),
            Red::Min => reduce_kernel::<T>("min", "op_min"),
        };
        return launch_reduce_rows(stream, kernel, out_shape, x);
    }
    // The outputs' layout over `x`: every axis but `axis`.
    let mut shape: Shape = x.shape().into();
    let mut strides: Shape = x.strides().into();
    let sk = strides.remove(axis);
    shape.remove(axis);
    let dense = contiguous_strides(red.name(), &shape)?;
    let (dims, [_, st]) = collapse(&shape, [&dense, &strides]);
    if dims.len() > MAX_DIMS {
        return reduce_into(
            stream,
            red,
            &gather(red.name(), stream, x)?,
            axis,
            out_shape,
        );
    }
    launch_strided(stream, red, x, k, sk, &dims, &st, out_shape)
}

fn reduce<T: DType, O: DType, X: TensorInput<T>>(
    red: Red,
    x: X,
    axis: usize,
    keepdim: bool,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<O> + Send> {
    strided_op(red.name(), x, move |stream, x| {
        check_axis(red.name(), axis, x.shape())?;
        let out_shape = reduced(x.shape(), axis, keepdim);
        let k = x.shape()[axis];
        if k == 0 && red != Red::Sum {
            return Err(DeviceError::InvalidShape {
                op: red.name(),
                reason: format!(
                    "axis {axis} of {:?} is empty: {} of no elements is undefined",
                    x.shape(),
                    red.name()
                ),
            });
        }
        if (red == Red::ArgMax || red == Red::ArgMin) && k > u32::MAX as usize {
            return Err(DeviceError::InvalidShape {
                op: red.name(),
                reason: format!(
                    "axis {axis} of {:?} is longer than u32 indices reach",
                    x.shape()
                ),
            });
        }
        if k == 0 || out_shape.contains(&0) {
            // The sum over an empty axis is 0; no outputs need no launch.
            let out = alloc::<O>(red.name(), stream, &out_shape)?;
            out.view(red.name())?.fill_bytes(stream, 0)?;
            return Ok(out);
        }
        reduce_into::<T, O>(stream, red, x, axis, &out_shape)
    })
}

macro_rules! axis_reduction {
    ($(#[$doc:meta])* $fn:ident, $red:expr, $bound:ident, $out:ty) => {
        $(#[$doc])*
        ///
        /// The output drops `axis`, or keeps it with length 1 when `keepdim` (as PyTorch's
        /// `keepdim`). Views are read in place.
        pub fn $fn<T: $bound, X: TensorInput<T>>(
            x: X,
            axis: usize,
            keepdim: bool,
        ) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<$out> + Send> {
            reduce::<T, $out, X>($red, x, axis, keepdim)
        }
    };
}

axis_reduction!(
    /// The sum along `axis` (0 over an empty axis). Floats accumulate in `float` (`double`
    /// for `f64`); integers wrap. [`sum`](super::sum) is its last-axis form.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::DeviceOpExt;
    /// use cuflow_runtime::Device;
    /// use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let stream = Device::host().new_stream()?;
    /// let x = api::arange::<f32>(0.0, 6.0, 1.0).sync_on(&stream)?.reshape(&[2, 3])?;
    /// let cols = kernels::sum_axis(&x, 0, false).sync_on(&stream)?;
    /// assert_eq!(cols.to_host_vec()?, vec![3.0, 5.0, 7.0]);
    /// let rows = kernels::sum_axis(&x, 1, true).sync_on(&stream)?;
    /// assert_eq!(rows.shape(), &[2, 1]);
    /// # Ok(()) }
    /// ```
    sum_axis, Red::Sum, DType, T
);
axis_reduction!(
    /// The mean along `axis`, accumulated as [`sum_axis`].
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range or empty.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<f32>(0.0, 6.0, 1.0).sync_on(&stream)?.reshape(&[2, 3])?;
    /// assert_eq!(kernels::mean_axis(&x, 1, false).sync_on(&stream)?.to_host_vec()?, vec![1.0, 4.0]);
    /// # Ok(()) }
    /// ```
    mean_axis, Red::Mean, FloatDType, T
);
axis_reduction!(
    /// The maximum along `axis`. [`max`](super::max) is its last-axis form. NaN is skipped:
    /// the maximum is NaN only where every value is (as for [`min_axis`]; [`argmax_axis`] and
    /// [`argmin_axis`] point at the same values), on every backend.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range or empty.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1i32, 5, 3, 4], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(kernels::max_axis(&x, 0, false).sync_on(&stream)?.to_host_vec()?, vec![3, 5]);
    /// # Ok(()) }
    /// ```
    max_axis, Red::Max, DType, T
);
axis_reduction!(
    /// The minimum along `axis`. NaN is skipped: the minimum is NaN only where every value is.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range or empty.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1i32, 5, 3, 4], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(kernels::min_axis(&x, 1, true).sync_on(&stream)?.to_host_vec()?, vec![1, 3]);
    /// # Ok(()) }
    /// ```
    min_axis, Red::Min, DType, T
);
axis_reduction!(
    /// The index of the maximum along `axis`, as `u32`; ties go to the first index. NaN
    /// values are never chosen unless every value is NaN (then the index is 0).
    /// [`argmax`](super::argmax) is its last-axis form.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range, empty, or
    /// longer than `u32` indices reach.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(kernels::argmax_axis(&x, 0, false).sync_on(&stream)?.to_host_vec()?, vec![1, 0]);
    /// # Ok(()) }
    /// ```
    argmax_axis, Red::ArgMax, DType, u32
);
axis_reduction!(
    /// The index of the minimum along `axis`, as `u32`; ties go to the first index. NaN
    /// values are never chosen unless every value is NaN (then the index is 0).
    ///
    /// # Errors
    ///
    /// As [`argmax_axis`].
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(kernels::argmin_axis(&x, 1, false).sync_on(&stream)?.to_host_vec()?, vec![0, 0]);
    /// # Ok(()) }
    /// ```
    argmin_axis, Red::ArgMin, DType, u32
);

/// Softmax or log-softmax (`body`) of `x` along `axis`.
fn normalize<T: FloatDType, X: TensorInput<T>>(
    name: &'static str,
    body: &'static str,
    x: X,
    axis: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    strided_op(name, x, move |stream, x| {
        check_axis(name, axis, x.shape())?;
        let rows = axis_last(name, stream, x, axis)?;
        let kernel = || norm_kernel::<T>(name, "", body);
        let out = launch_rows(stream, kernel, rows.shape(), &rows, &[], None)?;
        if axis + 1 == x.rank() {
            return Ok(out);
        }
        // Back to the input's axis order, dense.
        let mut order: SmallVec<[usize; 8]> = (0..x.rank() - 1).collect();
        order.insert(axis, x.rank() - 1);
        gather(name, stream, &out.permute(&order)?)
    })
}

/// The softmax along `axis`, numerically stable. [`softmax`](super::softmax) is its
/// last-axis form, and the fast path here for the last axis of a contiguous tensor.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming the axis when it is out of range.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, kernels};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let x = api::zeros::<f32>(&[4, 2]).sync_on(&stream)?;
/// let p = kernels::softmax_axis(&x, 0).sync_on(&stream)?;
/// assert_eq!(p.to_host_vec()?, vec![0.25; 8]);
/// # Ok(()) }
/// ```
pub fn softmax_axis<T: FloatDType, X: TensorInput<T>>(
    x: X,
    axis: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    normalize("softmax", super::rows::SOFTMAX_BODY, x, axis)
}

/// The log-softmax along `axis`: `x - max - ln Σ exp(x - max)`, numerically stable.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming the axis when it is out of range.
///
/// ```
/// # use cuflow_device_op::DeviceOpExt;
/// # use cuflow_tensor::{api, kernels};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// # let stream = cuflow_runtime::Device::host().new_stream()?;
/// let x = api::zeros::<f64>(&[2, 4]).sync_on(&stream)?;
/// let l = kernels::log_softmax_axis(&x, 1).sync_on(&stream)?.to_host_vec()?;
/// assert!(l.iter().all(|v| (v + 4f64.ln()).abs() < 1e-12));
/// # Ok(()) }
/// ```
pub fn log_softmax_axis<T: FloatDType, X: TensorInput<T>>(
    x: X,
    axis: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    normalize("log_softmax", LOG_SOFTMAX_BODY, x, axis)
}

//! Method syntax for views, broadcasting comparisons, `clamp` and axis reductions: inherent
//! methods on [`Tensor`] (each returns an op holding a handle to the tensor, so it is
//! `'static`), and [`TensorMethodsExt`] on lazy ops yielding a tensor. Every method is the
//! function of [`kernels`](crate::kernels) (or the view of [`Tensor`]) of the same name.

use std::ops::RangeBounds;

use cuflow_device_op::{from_fn, BoxedOp, DeviceOp, DeviceOpExt, ExecutionContext};
use cuflow_runtime::DeviceError;

use crate::dtype::{DType, FloatDType};
use crate::kernels::{self, TensorResult};
use crate::lazy::IntoShape;
use crate::op::TensorOp;
use crate::tensor::{Tensor, TensorInput};

macro_rules! tensor_methods {
    ($($(#[$doc:meta])* fn $name:ident$(<$g:ident: $b:path>)?(&self $(, $arg:ident: $ty:ty)*) -> $out:ty $(where $w:ident: $wb:path)?;)*) => {
        impl<T: DType> Tensor<T> {
            $(
                $(#[$doc])*
                pub fn $name$(<$g: $b>)?(
                    &self
                    $(, $arg: $ty)*
                ) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<$out> + Send>
                $(where $w: $wb)?
                {
                    kernels::$name(self.clone() $(, $arg)*)
                }
            )*
        }

        /// Method syntax on lazy ops yielding a [`Tensor`]: each method is the function of
        /// [`kernels`](crate::kernels) of the same name over the op's tensor, or the view of
        /// [`Tensor`] of the same name. Shapes and orders are any [`IntoShape`](crate::IntoShape)
        /// and copied, so the ops stay `'static` when the input op is.
        ///
        /// ```
        /// use cuflow_device_op::DeviceOpExt;
        /// use cuflow_runtime::Device;
        /// use cuflow_tensor::{api, TensorMethodsExt};
        /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
        /// let stream = Device::host().new_stream()?;
        /// let op = api::from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3])
        ///     .transpose(0, 1)
        ///     .sum_axis(1, false);
        /// // The op owns everything it needs: it can be boxed or sent to another thread.
        /// let op: Box<dyn Send + 'static> = Box::new(op);
        /// # drop(op);
        /// let sums = api::from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3])
        ///     .permute([1, 0])
        ///     .sum_axis(1, false)
        ///     .sync_on(&stream)?;
        /// assert_eq!(sums.to_host_vec()?, vec![3.0, 5.0, 7.0]);
        /// # Ok(()) }
        /// ```
        pub trait TensorMethodsExt<T: DType>:
            DeviceOp<Output = Tensor<T>> + Sized + Send + 'static
        {
            $(
                $(#[$doc])*
                fn $name$(<$g: $b>)?(
                    self
                    $(, $arg: $ty)*
                ) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<$out> + Send>
                $(where $w: $wb)?
                {
                    kernels::$name(from_fn(move |ctx| self.execute(ctx)) $(, $arg)*)
                }
            )*

            /// [`Tensor::narrow`] of the op's tensor.
            ///
            /// ```
            /// # use cuflow_device_op::DeviceOpExt;
            /// # use cuflow_tensor::{api, TensorMethodsExt};
            /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
            /// # let stream = cuflow_runtime::Device::host().new_stream()?;
            /// let x = api::arange::<f32>(0.0, 6.0, 1.0).narrow(0, 2, 3).sync_on(&stream)?;
            /// assert_eq!(x.to_host_vec()?, vec![2.0, 3.0, 4.0]);
            /// # Ok(()) }
            /// ```
            fn narrow(self, axis: usize, start: usize, len: usize) -> ViewOp<T> {
                view_op(self, move |t| t.narrow(axis, start, len))
            }

            /// [`Tensor::slice_axis`] of the op's tensor.
            ///
            /// ```
            /// # use cuflow_device_op::DeviceOpExt;
            /// # use cuflow_tensor::{api, TensorMethodsExt};
            /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
            /// # let stream = cuflow_runtime::Device::host().new_stream()?;
            /// let x = api::arange::<f32>(0.0, 6.0, 1.0).slice_axis(0, 4..).sync_on(&stream)?;
            /// assert_eq!(x.to_host_vec()?, vec![4.0, 5.0]);
            /// # Ok(()) }
            /// ```
            fn slice_axis(
                self,
                axis: usize,
                range: impl RangeBounds<usize> + Send + 'static,
            ) -> ViewOp<T> {
                view_op(self, move |t| t.slice_axis(axis, range))
            }

            /// [`Tensor::select`] of the op's tensor.
            ///
            /// ```
            /// # use cuflow_device_op::DeviceOpExt;
            /// # use cuflow_tensor::{api, TensorMethodsExt};
            /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
            /// # let stream = cuflow_runtime::Device::host().new_stream()?;
            /// let x = api::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], &[2, 2]).select(1, 0).sync_on(&stream)?;
            /// assert_eq!(x.to_host_vec()?, vec![0.0, 2.0]);
            /// # Ok(()) }
            /// ```
            fn select(self, axis: usize, index: usize) -> ViewOp<T> {
                view_op(self, move |t| t.select(axis, index))
            }

            /// [`Tensor::permute`] of the op's tensor.
            ///
            /// ```
            /// # use cuflow_device_op::DeviceOpExt;
            /// # use cuflow_tensor::{api, TensorMethodsExt};
            /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
            /// # let stream = cuflow_runtime::Device::host().new_stream()?;
            /// let x = api::zeros::<f32>(&[2, 3, 4]).permute([2, 0, 1]).sync_on(&stream)?;
            /// assert_eq!(x.shape(), &[4, 2, 3]);
            /// # Ok(()) }
            /// ```
            fn permute(self, order: impl IntoShape) -> ViewOp<T> {
                let order = order.into_shape();
                view_op(self, move |t| t.permute(&order))
            }

            /// [`Tensor::transpose`] of the op's tensor.
            ///
            /// ```
            /// # use cuflow_device_op::DeviceOpExt;
            /// # use cuflow_tensor::{api, TensorMethodsExt};
            /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
            /// # let stream = cuflow_runtime::Device::host().new_stream()?;
            /// let x = api::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], &[2, 2]).transpose(0, 1).sync_on(&stream)?;
            /// assert_eq!(x.to_host_vec()?, vec![0.0, 2.0, 1.0, 3.0]);
            /// # Ok(()) }
            /// ```
            fn transpose(self, a: usize, b: usize) -> ViewOp<T> {
                view_op(self, move |t| t.transpose(a, b))
            }

            /// [`Tensor::expand`] of the op's tensor.
            ///
            /// ```
            /// # use cuflow_device_op::DeviceOpExt;
            /// # use cuflow_tensor::{api, TensorMethodsExt};
            /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
            /// # let stream = cuflow_runtime::Device::host().new_stream()?;
            /// let x = api::ones::<f32>(&[3]).expand([2, 3]).sync_on(&stream)?;
            /// assert_eq!(x.strides(), &[0, 1]);
            /// # Ok(()) }
            /// ```
            fn expand(self, shape: impl IntoShape) -> ViewOp<T> {
                let shape = shape.into_shape();
                view_op(self, move |t| t.expand(&shape))
            }

            /// [`Tensor::broadcast_to`] of the op's tensor.
            ///
            /// ```
            /// # use cuflow_device_op::DeviceOpExt;
            /// # use cuflow_tensor::{api, TensorMethodsExt};
            /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
            /// # let stream = cuflow_runtime::Device::host().new_stream()?;
            /// let x = api::ones::<f32>(&[2, 1]).broadcast_to([4, 2, 5]).sync_on(&stream)?;
            /// assert_eq!(x.shape(), &[4, 2, 5]);
            /// # Ok(()) }
            /// ```
            fn broadcast_to(self, shape: impl IntoShape) -> ViewOp<T> {
                let shape = shape.into_shape();
                view_op(self, move |t| t.broadcast_to(&shape))
            }

            /// [`Tensor::squeeze`] of the op's tensor.
            ///
            /// ```
            /// # use cuflow_device_op::DeviceOpExt;
            /// # use cuflow_tensor::{api, TensorMethodsExt};
            /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
            /// # let stream = cuflow_runtime::Device::host().new_stream()?;
            /// let x = api::zeros::<f32>(&[3, 1]).squeeze(1).sync_on(&stream)?;
            /// assert_eq!(x.shape(), &[3]);
            /// # Ok(()) }
            /// ```
            fn squeeze(self, axis: usize) -> ViewOp<T> {
                view_op(self, move |t| t.squeeze(axis))
            }

            /// [`Tensor::unsqueeze`] of the op's tensor.
            ///
            /// ```
            /// # use cuflow_device_op::DeviceOpExt;
            /// # use cuflow_tensor::{api, TensorMethodsExt};
            /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
            /// # let stream = cuflow_runtime::Device::host().new_stream()?;
            /// let x = api::zeros::<f32>(&[3]).unsqueeze(0).sync_on(&stream)?;
            /// assert_eq!(x.shape(), &[1, 3]);
            /// # Ok(()) }
            /// ```
            fn unsqueeze(self, axis: usize) -> ViewOp<T> {
                view_op(self, move |t| t.unsqueeze(axis))
            }
        }
    };
}

/// The op a view method of [`TensorMethodsExt`] returns: boxed, so that it names no closure
/// type; `'static` when the input op is.
pub type ViewOp<T> =
    TensorOp<Box<dyn FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send>>;

/// The op yielding `view` of `op`'s tensor. `op` is held as a [`BoxedOp`]: a loop can chain
/// views (`v = v.transpose(0, 1)`) to any depth, and a boxed op executes and drops at any depth
/// without exhausting the thread's stack.
fn view_op<T: DType, O: DeviceOp<Output = Tensor<T>> + Send + 'static>(
    op: O,
    view: impl FnOnce(&Tensor<T>) -> Result<Tensor<T>, DeviceError> + Send + 'static,
) -> ViewOp<T> {
    let op: BoxedOp<'static, Tensor<T>> = op.boxed();
    from_fn(Box::new(move |ctx: &mut ExecutionContext| {
        view(&op.execute(ctx)?)
    }))
}

tensor_methods! {
    /// [`kernels::contiguous`] of this tensor: itself when contiguous, else a dense copy.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::zeros::<f32>(&[2, 3]).sync_on(&stream)?;
    /// let t = x.transpose(0, 1)?.contiguous().sync_on(&stream)?;
    /// assert!(t.is_contiguous());
    /// # Ok(()) }
    /// ```
    fn contiguous(&self) -> T;
    /// [`kernels::sum_axis`] of this tensor.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::ones::<f32>(&[2, 3]).sync_on(&stream)?;
    /// assert_eq!(x.sum_axis(0, false).sync_on(&stream)?.to_host_vec()?, vec![2.0; 3]);
    /// # Ok(()) }
    /// ```
    fn sum_axis(&self, axis: usize, keepdim: bool) -> T;
    /// [`kernels::mean_axis`] of this tensor.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::ones::<f32>(&[2, 3]).sync_on(&stream)?;
    /// assert_eq!(x.mean_axis(1, false).sync_on(&stream)?.to_host_vec()?, vec![1.0; 2]);
    /// # Ok(()) }
    /// ```
    fn mean_axis(&self, axis: usize, keepdim: bool) -> T where T: FloatDType;
    /// [`kernels::max_axis`] of this tensor.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(x.max_axis(0, false).sync_on(&stream)?.to_host_vec()?, vec![3.0, 5.0]);
    /// # Ok(()) }
    /// ```
    fn max_axis(&self, axis: usize, keepdim: bool) -> T;
    /// [`kernels::min_axis`] of this tensor.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(x.min_axis(1, true).sync_on(&stream)?.to_host_vec()?, vec![1.0, 3.0]);
    /// # Ok(()) }
    /// ```
    fn min_axis(&self, axis: usize, keepdim: bool) -> T;
    /// [`kernels::argmax_axis`] of this tensor.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(x.argmax_axis(1, false).sync_on(&stream)?.to_host_vec()?, vec![1, 1]);
    /// # Ok(()) }
    /// ```
    fn argmax_axis(&self, axis: usize, keepdim: bool) -> u32;
    /// [`kernels::argmin_axis`] of this tensor.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(x.argmin_axis(0, false).sync_on(&stream)?.to_host_vec()?, vec![0, 1]);
    /// # Ok(()) }
    /// ```
    fn argmin_axis(&self, axis: usize, keepdim: bool) -> u32;
    /// [`kernels::softmax_axis`] of this tensor.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::zeros::<f32>(&[2, 2]).sync_on(&stream)?;
    /// assert_eq!(x.softmax_axis(0).sync_on(&stream)?.to_host_vec()?, vec![0.5; 4]);
    /// # Ok(()) }
    /// ```
    fn softmax_axis(&self, axis: usize) -> T where T: FloatDType;
    /// [`kernels::log_softmax_axis`] of this tensor.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::zeros::<f64>(&[1, 2]).sync_on(&stream)?;
    /// let l = x.log_softmax_axis(1).sync_on(&stream)?.to_host_vec()?;
    /// assert!(l.iter().all(|v| (v + 2f64.ln()).abs() < 1e-12));
    /// # Ok(()) }
    /// ```
    fn log_softmax_axis(&self, axis: usize) -> T where T: FloatDType;
    /// [`kernels::clamp`] of this tensor.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![-2.0f32, 0.5, 3.0], &[3]).sync_on(&stream)?;
    /// assert_eq!(x.clamp(-1.0, 1.0).sync_on(&stream)?.to_host_vec()?, vec![-1.0, 0.5, 1.0]);
    /// # Ok(()) }
    /// ```
    fn clamp(&self, min: T, max: T) -> T;
    /// [`kernels::eq`] of this tensor and `y`.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<i32>(0.0, 4.0, 1.0).sync_on(&stream)?;
    /// let two = api::full(&[1], 2i32).sync_on(&stream)?;
    /// assert_eq!(x.eq(&two).sync_on(&stream)?.to_host_vec()?, vec![0, 0, 1, 0]);
    /// # Ok(()) }
    /// ```
    fn eq<Y: TensorInput<T>>(&self, y: Y) -> u8;
    /// [`kernels::ne`] of this tensor and `y`.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<i32>(0.0, 4.0, 1.0).sync_on(&stream)?;
    /// let two = api::full(&[1], 2i32).sync_on(&stream)?;
    /// assert_eq!(x.ne(&two).sync_on(&stream)?.to_host_vec()?, vec![1, 1, 0, 1]);
    /// # Ok(()) }
    /// ```
    fn ne<Y: TensorInput<T>>(&self, y: Y) -> u8;
    /// [`kernels::lt`] of this tensor and `y`.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<i32>(0.0, 4.0, 1.0).sync_on(&stream)?;
    /// let two = api::full(&[1], 2i32).sync_on(&stream)?;
    /// assert_eq!(x.lt(&two).sync_on(&stream)?.to_host_vec()?, vec![1, 1, 0, 0]);
    /// # Ok(()) }
    /// ```
    fn lt<Y: TensorInput<T>>(&self, y: Y) -> u8;
    /// [`kernels::le`] of this tensor and `y`.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<i32>(0.0, 4.0, 1.0).sync_on(&stream)?;
    /// let two = api::full(&[1], 2i32).sync_on(&stream)?;
    /// assert_eq!(x.le(&two).sync_on(&stream)?.to_host_vec()?, vec![1, 1, 1, 0]);
    /// # Ok(()) }
    /// ```
    fn le<Y: TensorInput<T>>(&self, y: Y) -> u8;
    /// [`kernels::gt`] of this tensor and `y`.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<i32>(0.0, 4.0, 1.0).sync_on(&stream)?;
    /// let two = api::full(&[1], 2i32).sync_on(&stream)?;
    /// assert_eq!(x.gt(&two).sync_on(&stream)?.to_host_vec()?, vec![0, 0, 0, 1]);
    /// # Ok(()) }
    /// ```
    fn gt<Y: TensorInput<T>>(&self, y: Y) -> u8;
    /// [`kernels::ge`] of this tensor and `y`.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<i32>(0.0, 4.0, 1.0).sync_on(&stream)?;
    /// let two = api::full(&[1], 2i32).sync_on(&stream)?;
    /// assert_eq!(x.ge(&two).sync_on(&stream)?.to_host_vec()?, vec![0, 0, 1, 1]);
    /// # Ok(()) }
    /// ```
    fn ge<Y: TensorInput<T>>(&self, y: Y) -> u8;
}

impl<T: DType, O: DeviceOp<Output = Tensor<T>> + Send + 'static> TensorMethodsExt<T> for O {}

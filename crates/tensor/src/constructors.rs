//! Constructors shaped after another tensor (`zeros_like`, `ones_like`, `full_like`), `fill`,
//! and [`Tensor::reinterpret`], the same bytes read as another dtype. The functions are
//! re-exported from [`api`](crate::api).

use std::sync::Arc;

use cuflow_device_op::{from_fn, DeviceOp, ExecutionContext};
use cuflow_runtime::DeviceError;
use smallvec::SmallVec;

use crate::dtype::DType;
use crate::kernels::fill as fill_kernel;
use crate::op::TensorOp;
use crate::tensor::{Tensor, TensorInput, TensorRef};

type TensorResult<T> = Result<Tensor<T>, DeviceError>;

/// A tensor of `shape` with every element `value` (the same as
/// [`api::full`](crate::api::full)).
///
/// ```
/// use cuflow_tensor::{api, TensorOpExt};
/// assert_eq!(api::fill(&[2, 2], 7u8).to_host_vec()?, vec![7; 4]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn fill<T: DType>(
    shape: &[usize],
    value: T,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    fill_kernel("fill", shape, value)
}

/// A tensor of `x`'s shape (and dtype) with every element `value`, on the executing
/// stream's device. Only `x`'s shape is read: its data is not waited for.
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::{api, TensorOpExt};
/// let x = api::zeros::<f32>(&[2, 3]).sync()?;
/// let y = api::full_like(&x, 2.5).sync()?;
/// assert_eq!((y.shape(), y.to_host_vec()?), (&[2, 3][..], vec![2.5; 6]));
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn full_like<T: DType, X: TensorInput<T>>(
    x: X,
    value: T,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    let x = x.into_op();
    from_fn(move |ctx: &mut ExecutionContext| {
        let x = x.execute(ctx)?;
        fill_kernel("full_like", x.tensor().shape(), value).execute(ctx)
    })
}

/// A tensor of zeros shaped like `x` (see [`full_like`]).
pub fn zeros_like<T: DType, X: TensorInput<T>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    full_like(x, T::from_f64(0.0))
}

/// A tensor of ones shaped like `x` (see [`full_like`]).
pub fn ones_like<T: DType, X: TensorInput<T>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    full_like(x, T::from_f64(1.0))
}

impl<T: DType> Tensor<T> {
    /// The same bytes read as elements of `U` (a bit-cast, sharing memory, like PyTorch's
    /// `view(dtype)`): the last axis scales by `size_of::<T>() / size_of::<U>()`, so a
    /// `[2, 4]` `f32` tensor is a `[2, 8]` `bf16` or a `[2, 16]` `u8` one, and a `[3, 4]` `u8`
    /// tensor a `[3, 1]` `u32` one. Writes through either tensor are seen by the other, and
    /// work on both is ordered as on clones of one tensor.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming `reinterpret` when the tensor is not contiguous (or
    /// does not cover its whole buffer), is a scalar while the sizes differ, or its last axis
    /// does not hold a whole number of `U` elements.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::DeviceOpExt;
    /// use cuflow_tensor::api;
    /// let x = api::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).sync()?;
    /// let bits = x.reinterpret::<u32>()?;
    /// assert_eq!(bits.to_host_vec()?[1], 2.0f32.to_bits());
    /// let bytes = x.reinterpret::<u8>()?;
    /// assert_eq!(bytes.shape(), &[2, 8]);
    /// assert!(bytes.reinterpret::<u8>()?.reshape(&[3, 5]).is_err());
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn reinterpret<U: DType>(&self) -> Result<Tensor<U>, DeviceError> {
        let invalid = |reason: String| DeviceError::InvalidShape {
            op: "reinterpret",
            reason,
        };
        let (from, to) = (std::mem::size_of::<T>(), std::mem::size_of::<U>());
        if !self.is_contiguous() || self.numel() != self.buffer().len() {
            return Err(invalid(format!(
                "a {:?} tensor with strides {:?} is not a contiguous tensor over its whole \
                 buffer; make it contiguous (a copy) before reinterpreting it",
                self.shape(),
                self.strides()
            )));
        }
        let mut shape: SmallVec<[usize; 4]> = SmallVec::from_slice(self.shape());
        match shape.last_mut() {
            None if from != to => {
                return Err(invalid(format!(
                    "a scalar {} ({from} bytes) cannot be read as {} ({to} bytes); reshape it \
                     to [1] first",
                    T::NAME,
                    U::NAME
                )))
            }
            None => {}
            Some(last) => {
                // Counted in u128: an empty tensor's last axis may hold more bytes than fit
                // in usize.
                let bytes = *last as u128 * from as u128;
                if !bytes.is_multiple_of(to as u128) {
                    return Err(invalid(format!(
                        "the last axis (axis {}) of {:?} holds {bytes} bytes of {}, not a \
                         whole number of {to}-byte {} elements",
                        self.shape().len() - 1,
                        self.shape(),
                        T::NAME,
                        U::NAME
                    )));
                }
                *last = usize::try_from(bytes / to as u128).map_err(|_| {
                    invalid(format!(
                        "the last axis (axis {}) of {:?} would hold {} elements of {}, which \
                         overflows usize",
                        self.shape().len() - 1,
                        self.shape(),
                        bytes / to as u128,
                        U::NAME
                    ))
                })?;
            }
        }
        let buffer = Arc::new(self.buffer().reinterpret::<U>()?);
        Tensor::from_buffer(buffer, &shape)
    }
}

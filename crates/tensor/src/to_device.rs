//! `.to_device(&device)`: a copy of a tensor on another device, as an op.
//!
//! The copy is allocated and enqueued on a stream of the destination device (the executing
//! stream when it is of that device, else the stream the destination's default policy gives),
//! which is joined with the executing stream by events, so the op stays in order with the rest
//! of its DAG. How the bytes travel (peer copy, staged through pinned host memory, through the
//! host backend's storage) is the runtime's choice; see
//! `cuflow_runtime::BufferView::copy_from_device`.

use std::marker::PhantomData;

use cuflow_device_op::{DeviceOp, ExecutionContext};
use cuflow_runtime::{Device, DeviceError};

use crate::dtype::DType;
use crate::kernels::alloc;
use crate::tensor::{Tensor, TensorInput, TensorRef};

/// `.to_device(&device)` on tensors (`Tensor<T>`, `Arc<Tensor<T>>`, `&Tensor<T>`) and on ops
/// yielding them.
pub trait ToDeviceExt<T: DType>: TensorInput<T> + Sized {
    /// A copy of the tensor in new memory of `device`, which may be the tensor's own device
    /// (then it is a plain copy, as [`api::dup`](crate::api::dup)).
    ///
    /// The copy runs on a stream of `device`, after the work producing the tensor, and the
    /// executing stream waits for it; the rest of the op continues on the executing stream, so
    /// kernels reading the copy must run where it lives (e.g. in a later op placed on
    /// `device`). Copies between two devices cannot be recorded into a graph.
    ///
    /// # Errors
    ///
    /// The error of the input op, or of the copy (see
    /// `cuflow_runtime::BufferView::copy_from_device`): out of memory on `device`,
    /// [`DeviceError::Capture`] for a copy between two devices while capturing, a driver error.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::DeviceOpExt;
    /// use cuflow_runtime::Device;
    /// use cuflow_tensor::{api, ToDeviceExt};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let (home, other) = (Device::host(), Device::host_numbered(1));
    /// let x = api::arange::<f32>(0.0, 4.0, 1.0).sync_on(&home.new_stream()?)?;
    /// let y = x.to_device(&other).sync_on(&home.new_stream()?)?;
    /// assert_eq!(y.device(), &other);
    /// assert_eq!(y.to_host_vec()?, vec![0.0, 1.0, 2.0, 3.0]);
    /// # Ok(()) }
    /// ```
    fn to_device(self, device: &Device) -> ToDevice<T, Self::Op> {
        ToDevice::new(self.into_op(), device.clone())
    }
}

impl<T: DType, X: TensorInput<T>> ToDeviceExt<T> for X {}

/// The op returned by [`ToDeviceExt::to_device`]: yields a copy of its input's tensor on
/// another device.
#[must_use = "device ops do nothing until synced or awaited"]
pub struct ToDevice<T, O> {
    input: O,
    device: Device,
    _dtype: PhantomData<fn() -> T>,
}

impl<T, O> ToDevice<T, O> {
    pub(crate) fn new(input: O, device: Device) -> Self {
        ToDevice {
            input,
            device,
            _dtype: PhantomData,
        }
    }
}

impl<T: DType, O> DeviceOp for ToDevice<T, O>
where
    O: DeviceOp,
    O::Output: TensorRef<T>,
{
    type Output = Tensor<T>;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<Tensor<T>, DeviceError> {
        let value = self.input.execute(ctx)?;
        // A strided view is packed on its own device first (on the executing stream when it
        // is of that device, else on a stream of the view's device joined with it, as the
        // copy below is), so that the copy moves one range.
        let src = if value.tensor().is_contiguous() {
            std::borrow::Cow::Borrowed(value.tensor())
        } else {
            let x = value.tensor();
            std::borrow::Cow::Owned(ctx.on_device(x.device(), |stream| {
                Ok(crate::kernels::dense("to_device", stream, x)?.into_owned())
            })?)
        };
        ctx.on_device(&self.device, |stream| {
            let out = alloc::<T>("to_device", stream, src.shape())?;
            out.view("to_device")?
                .copy_from_device(stream, src.range("to_device")?)?;
            Ok(out)
        })
    }
}

cuflow_device_op::impl_op_boilerplate!([T, O] ToDevice<T, O>);

impl<T: DType, O> TensorInput<T> for ToDevice<T, O>
where
    O: DeviceOp,
    O::Output: TensorRef<T>,
{
    type Value = Tensor<T>;
    type Op = Self;
    fn into_op(self) -> Self {
        self
    }
}

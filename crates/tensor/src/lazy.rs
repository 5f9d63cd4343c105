//! Methods on lazy ops that yield a tensor: `.reshape(..)` and `.partition(..)`, each a named
//! op type that owns its shape, so the ops they return are `'static` when the op they wrap
//! is (boxable, spawnable, awaitable).

use cuflow_device_op::{impl_op_boilerplate, DeviceOp, ExecutionContext};
use cuflow_runtime::DeviceError;
use smallvec::SmallVec;

use crate::dtype::DType;
use crate::tensor::{Partition, PartitionExt, Shape, Tensor, TensorInput};

/// A shape given by value or by reference: `[usize; N]`, `&[usize; N]`, `&[usize]`,
/// `Vec<usize>`, `&Vec<usize>` or a [`Shape`]. Ops that take one copy it, so the op never
/// borrows it.
pub trait IntoShape {
    /// The shape as an owned [`Shape`].
    fn into_shape(self) -> Shape;
}

impl<const N: usize> IntoShape for [usize; N] {
    fn into_shape(self) -> Shape {
        SmallVec::from_slice(&self)
    }
}

impl<const N: usize> IntoShape for &[usize; N] {
    fn into_shape(self) -> Shape {
        SmallVec::from_slice(self)
    }
}

impl IntoShape for &[usize] {
    fn into_shape(self) -> Shape {
        SmallVec::from_slice(self)
    }
}

impl IntoShape for Vec<usize> {
    fn into_shape(self) -> Shape {
        SmallVec::from_vec(self)
    }
}

impl IntoShape for &Vec<usize> {
    fn into_shape(self) -> Shape {
        SmallVec::from_slice(self)
    }
}

impl IntoShape for Shape {
    fn into_shape(self) -> Shape {
        self
    }
}

/// The op returned by [`ReshapeOpExt::reshape`].
#[must_use = "device ops do nothing until synced or awaited"]
pub struct Reshape<O> {
    op: O,
    shape: Shape,
}

impl<T: DType, O: DeviceOp<Output = Tensor<T>>> DeviceOp for Reshape<O> {
    type Output = Tensor<T>;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<Tensor<T>, DeviceError> {
        self.op.execute(ctx)?.reshape(&self.shape)
    }
}

impl_op_boilerplate!([O] Reshape<O>);

impl<T: DType, O: DeviceOp<Output = Tensor<T>>> TensorInput<T> for Reshape<O> {
    type Value = Tensor<T>;
    type Op = Self;
    fn into_op(self) -> Self {
        self
    }
}

/// `.reshape(..)` on ops that yield an owned tensor.
pub trait ReshapeOpExt<T: DType>: DeviceOp<Output = Tensor<T>> + Sized {
    /// The op's tensor under another shape with the same element count. The shape is taken by
    /// value (or copied from a reference), so the reshaped op is `'static` when `self` is.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] (when run) when the element counts differ.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::{BoxedOp, DeviceOpExt};
    /// use cuflow_tensor::{api, ReshapeOpExt, Tensor};
    /// let dims = vec![3, 2];
    /// let op: BoxedOp<'static, Tensor<f32>> = api::ones::<f32>(&[6]).reshape(dims).boxed();
    /// let t = std::thread::spawn(move || op.sync()).join().unwrap()?;
    /// assert_eq!(t.shape(), &[3, 2]);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn reshape(self, shape: impl IntoShape) -> Reshape<Self> {
        Reshape {
            op: self,
            shape: shape.into_shape(),
        }
    }
}

impl<T: DType, O: DeviceOp<Output = Tensor<T>>> ReshapeOpExt<T> for O {}

/// The op returned by [`PartitionOpExt::partition`].
#[must_use = "device ops do nothing until synced or awaited"]
pub struct Partitioned<O, const N: usize> {
    op: O,
    tile: [usize; N],
}

impl<T: DType, O: DeviceOp<Output = Tensor<T>>, const N: usize> DeviceOp for Partitioned<O, N> {
    type Output = Partition<Tensor<T>>;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<Partition<Tensor<T>>, DeviceError> {
        Ok(self.op.execute(ctx)?.partition(self.tile))
    }
}

impl_op_boilerplate!([O, const N: usize] Partitioned<O, N>);

/// `.partition([..])` on ops that yield an owned tensor: the lazy counterpart of
/// [`PartitionExt::partition`].
pub trait PartitionOpExt<T: DType>: DeviceOp<Output = Tensor<T>> + Sized {
    /// The op's tensor split into tiles of shape `tile` (checked when a kernel runs on the
    /// partition), to hand to a kernel with an explicit output.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::DeviceOpExt;
    /// use cuflow_tensor::{api, kernels, PartitionOpExt};
    /// let x = api::ones::<f32>(&[8, 8]).sync()?;
    /// let (z, _) = api::zeros::<f32>(&[8, 8])
    ///     .partition([4, 4])
    ///     .then(|z| kernels::saxpy(z, 2.0, &x))
    ///     .sync()?;
    /// assert_eq!(z.tile(), &[4, 4]);
    /// assert_eq!(z.unpartition().to_host_vec()?, vec![2.0; 64]);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn partition<const N: usize>(self, tile: [usize; N]) -> Partitioned<Self, N> {
        Partitioned { op: self, tile }
    }
}

impl<T: DType, O: DeviceOp<Output = Tensor<T>>> PartitionOpExt<T> for O {}

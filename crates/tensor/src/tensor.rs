//! `Tensor<T>` and the argument modes kernels accept (partitions are in `partition.rs`).

use std::fmt;
use std::sync::Arc;

use cuflow_device_op::op::{BoxedOp, Shared, Then, Value};
use cuflow_device_op::{value, DeviceOp, DeviceOpExt};
use cuflow_runtime::{BufferView, Device, DeviceBuffer, DeviceError, Stream};
use smallvec::SmallVec;

use crate::dtype::DType;
use crate::op::TensorOp;
pub(crate) use crate::partition::{tiling, Tiling};
pub use crate::partition::{Partition, PartitionExt};

/// The byte alignment kernels need of a tensor's first element (their vector width).
const KERNEL_ALIGN: usize = 16;

/// A shape: the length of every axis, outermost first.
pub type Shape = SmallVec<[usize; 4]>;

/// An array of `T` on a device: a device buffer shared through `Arc`, with a shape, strides
/// and the offset of its first element in the buffer.
///
/// Tensors made by constructors and kernels are dense and row-major. The view methods
/// ([`narrow`](Tensor::narrow), [`permute`](Tensor::permute), [`expand`](Tensor::expand),
/// ...) give tensors over the same buffer with other strides and offsets, without copying;
/// [`contiguous`](crate::kernels::contiguous) makes a dense copy where one is needed. Every
/// kernel accepts views: an input that is not contiguous is copied (once, on the executing
/// stream) before a kernel that needs dense rows reads it, and the elementwise, broadcast and
/// reduction kernels read strided inputs directly. Outputs a kernel writes in place must be
/// contiguous and start at a 16-byte boundary of the buffer (a [`narrow`](Tensor::narrow) of
/// the first axis over rows whose byte length is a multiple of 16 is fine), since kernels
/// write 16-byte vectors; an input that is contiguous but starts elsewhere is copied like a
/// strided one.
///
/// Cloning a tensor is cheap and shares its memory, like cloning an `Arc`: a kernel that
/// writes one clone (an output `Partition`) changes what the others read. This is what lets a
/// captured graph keep a handle to its input while the program feeds it with
/// [`api::memcpy`](crate::api::memcpy). Copy the data with [`api::dup`](crate::api::dup).
/// Work on clones is ordered like any other work: within one op by its streams and events,
/// and across ops by their completion.
///
/// Reading it back ([`Tensor::to_host_vec`]) waits for every piece of queued work that used
/// its memory.
pub struct Tensor<T> {
    pub(crate) buf: Arc<DeviceBuffer<T>>,
    pub(crate) shape: Shape,
    pub(crate) strides: Shape,
    pub(crate) offset: usize,
}

/// The row-major strides of `shape`, checked: a shape whose strides leave `usize` (possible
/// with no elements at all, e.g. `[0, 2^40, 2^40]`) is an invalid shape of `op`.
pub(crate) fn contiguous_strides(op: &'static str, shape: &[usize]) -> Result<Shape, DeviceError> {
    let mut strides: Shape = SmallVec::from_elem(1, shape.len());
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] =
            strides[i + 1]
                .checked_mul(shape[i + 1])
                .ok_or_else(|| DeviceError::InvalidShape {
                    op,
                    reason: format!(
                        "the strides of {shape:?} overflow the address space (axis {i} would step \
                     over more than usize::MAX elements)"
                    ),
                })?;
    }
    Ok(strides)
}

/// The element count of `shape`, checked. A shape passes only if the product of its nonzero
/// dimensions fits in `usize`, so that every product of some of its dimensions (strides, rows,
/// tiles) fits as well, even where a zero dimension leaves it without elements: kernels then
/// need no checks of their own.
pub(crate) fn numel(op: &'static str, shape: &[usize]) -> Result<usize, DeviceError> {
    let nonzero = shape
        .iter()
        .filter(|d| **d != 0)
        .try_fold(1usize, |n, d| n.checked_mul(*d));
    if nonzero.is_none() {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "the dimensions of {shape:?} multiply past usize::MAX (zero-size axes aside), \
                 so its strides cannot be addressed"
            ),
        });
    }
    shape
        .iter()
        .try_fold(1usize, |n, d| n.checked_mul(*d))
        .ok_or_else(|| DeviceError::InvalidShape {
            op,
            reason: format!("{shape:?} has more elements than fit in usize"),
        })
}

/// Checks that `shape` holds `len` elements; otherwise [`DeviceError::InvalidShape`] for `op`,
/// its reason made by `mismatch` from the shape's element count.
pub(crate) fn check_numel(
    op: &'static str,
    shape: &[usize],
    len: usize,
    mismatch: impl FnOnce(usize) -> String,
) -> Result<(), DeviceError> {
    let n = numel(op, shape)?;
    if n != len {
        return Err(DeviceError::InvalidShape {
            op,
            reason: mismatch(n),
        });
    }
    Ok(())
}

impl<T: DType> Tensor<T> {
    /// A tensor over `buf` with `shape`, whose element count must equal the buffer's length.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] when the counts differ.
    pub fn from_buffer(buf: Arc<DeviceBuffer<T>>, shape: &[usize]) -> Result<Self, DeviceError> {
        check_numel("Tensor::from_buffer", shape, buf.len(), |n| {
            format!(
                "shape {shape:?} has {n} elements but the buffer holds {}",
                buf.len()
            )
        })?;
        Ok(Tensor {
            buf,
            shape: SmallVec::from_slice(shape),
            strides: contiguous_strides("Tensor::from_buffer", shape)?,
            offset: 0,
        })
    }

    /// The length of every axis.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Elements between neighbours along each axis: row-major (the last is 1) for a dense
    /// tensor; other values for a view, 0 along an axis it was
    /// [expanded](Tensor::expand) over.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The index in [`buffer`](Tensor::buffer) of the tensor's first element (0 unless the
    /// tensor is a view with elements: one without any starts at 0).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        // Every shape a tensor holds passed `numel`, so the product fits.
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device holding the tensor.
    pub fn device(&self) -> &Device {
        self.buf.device()
    }

    /// The whole buffer behind the tensor. A view uses part of it: its element at index
    /// `i` is at `offset + Σ iₖ · strides[k]`.
    pub fn buffer(&self) -> &Arc<DeviceBuffer<T>> {
        &self.buf
    }

    /// Whether kernels read the tensor where it lies: contiguous, with its first element at a
    /// 16-byte boundary of the buffer (kernels read and write 16-byte vectors; buffers start
    /// at such a boundary, so every tensor made by a constructor or a kernel is ready).
    pub(crate) fn is_kernel_ready(&self) -> bool {
        self.is_contiguous()
            && (self.is_empty()
                || (self.offset * std::mem::size_of::<T>()).is_multiple_of(KERNEL_ALIGN))
    }

    /// The tensor's elements as one range of its buffer, for a kernel that reads or writes
    /// them packed in row-major order, possibly in 16-byte vectors;
    /// [`DeviceError::InvalidShape`] naming `op` for a tensor that is not contiguous or does
    /// not start at a 16-byte boundary, so that no kernel misreads a view.
    pub(crate) fn view(&self, op: &'static str) -> Result<BufferView<'_, T>, DeviceError> {
        let range = self.range(op)?;
        if !self.is_kernel_ready() {
            return Err(DeviceError::InvalidShape {
                op,
                reason: format!(
                    "needs its first element at a 16-byte boundary (kernels read 16-byte \
                     vectors), got a view of shape {:?} starting at element {}; make a \
                     dense copy first with `contiguous`",
                    self.shape, self.offset
                ),
            });
        }
        Ok(range)
    }

    /// The tensor's elements as one range of its buffer, for a copy; an error naming `op` for
    /// a tensor that is not contiguous.
    pub(crate) fn range(&self, op: &'static str) -> Result<BufferView<'_, T>, DeviceError> {
        if !self.is_contiguous() {
            return Err(DeviceError::InvalidShape {
                op,
                reason: format!(
                    "needs a contiguous tensor, got a view of shape {:?} with strides {:?}; \
                     make a dense copy first with `contiguous`",
                    self.shape, self.strides
                ),
            });
        }
        if self.is_empty() {
            return self.buf.slice(0..0);
        }
        self.buf.slice(self.offset..self.offset + self.len())
    }

    /// The length of the last axis (1 for a scalar), and the number of rows before it.
    pub(crate) fn rows_cols(&self) -> (usize, usize) {
        let cols = self.shape.last().copied().unwrap_or(1);
        let rows = self.len().checked_div(cols).unwrap_or(0);
        (rows, cols)
    }

    /// Copies the tensor to a host vector after all queued work that used it.
    ///
    /// # Errors
    ///
    /// Any error the queued work hit.
    pub fn to_host_vec(&self) -> Result<Vec<T>, DeviceError> {
        let stream = match self.buf.last_stream() {
            Some(s) => s,
            None => self.device().new_stream()?,
        };
        self.to_host_vec_on(&stream)
    }

    /// Copies the tensor to a host vector on `stream`, after all queued work that used it.
    ///
    /// # Errors
    ///
    /// Any error the queued work hit.
    pub fn to_host_vec_on(&self, stream: &Stream) -> Result<Vec<T>, DeviceError> {
        if self.is_contiguous() {
            return self.range("to_host_vec")?.to_host_vec(stream);
        }
        if self.is_empty() {
            return Ok(Vec::new());
        }
        // A strided view: read the span it covers and gather its elements in row-major order.
        // An expanded view may have far more elements than its buffer: its host vector is
        // reserved fallibly, so that one too large for host memory is an error, not an abort.
        let data = self.span_host_vec(stream)?;
        let mut out = Vec::new();
        if out.try_reserve_exact(self.len()).is_err() {
            return Err(DeviceError::OutOfMemory {
                bytes: self.size_bytes(),
                device: format!(
                    "the host (reading back a {:?} view with strides {:?})",
                    self.shape, self.strides
                ),
            });
        }
        let layout = crate::view::Strided::new(&self.shape, &self.strides, 0);
        out.extend(layout.offsets().map(|i| data[i]));
        Ok(out)
    }

    /// The part of the buffer the tensor covers, from its first element to its last, read
    /// back on `stream` after all queued work that used it: element `i` of the tensor is at
    /// `Σ iₖ · strides[k]` of it. Empty for a tensor without elements.
    pub(crate) fn span_host_vec(&self, stream: &Stream) -> Result<Vec<T>, DeviceError> {
        let span = crate::view::span(&self.shape, &self.strides);
        if span == 0 {
            return Ok(Vec::new());
        }
        self.buf
            .slice(self.offset..self.offset + span)?
            .to_host_vec(stream)
    }

    /// The same elements under another shape with the same element count (sharing memory).
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] when the element counts differ, or when the tensor is a
    /// view that is not contiguous (make it so with
    /// [`contiguous`](crate::kernels::contiguous) first).
    pub fn reshape(self, shape: &[usize]) -> Result<Tensor<T>, DeviceError> {
        check_numel("reshape", shape, self.len(), |n| {
            format!(
                "cannot view {:?} ({} elements) as {shape:?} ({n} elements)",
                self.shape,
                self.len()
            )
        })?;
        if !self.is_contiguous() {
            return Err(DeviceError::InvalidShape {
                op: "reshape",
                reason: format!(
                    "cannot reshape a view of shape {:?} with strides {:?} without copying; \
                     make a dense copy first with `contiguous`",
                    self.shape, self.strides
                ),
            });
        }
        Ok(Tensor {
            buf: self.buf,
            shape: SmallVec::from_slice(shape),
            strides: contiguous_strides("reshape", shape)?,
            offset: self.offset,
        })
    }
}

impl<T> Clone for Tensor<T> {
    fn clone(&self) -> Self {
        Tensor {
            buf: self.buf.clone(),
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            offset: self.offset,
        }
    }
}

impl<T> fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &std::any::type_name::<T>())
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .field("buffer", &self.buf)
            .finish()
    }
}

/// A tensor held in one of the modes kernels accept as input: `Tensor<T>`,
/// `Arc<Tensor<T>>` or `&Tensor<T>`. A kernel gives the same value back.
pub trait TensorRef<T: DType>: Send {
    /// The tensor.
    fn tensor(&self) -> &Tensor<T>;
}

impl<T: DType> TensorRef<T> for Tensor<T> {
    fn tensor(&self) -> &Tensor<T> {
        self
    }
}

impl<T: DType> TensorRef<T> for Arc<Tensor<T>> {
    fn tensor(&self) -> &Tensor<T> {
        self
    }
}

impl<T: DType> TensorRef<T> for &Tensor<T> {
    fn tensor(&self) -> &Tensor<T> {
        self
    }
}

/// What a kernel accepts as an input: a tensor in one of the [`TensorRef`] modes, or an op
/// that produces one (the kernel then runs its lazy inputs as a `zip!`).
pub trait TensorInput<T: DType>: Send {
    /// The tensor value the input resolves to.
    type Value: TensorRef<T>;
    /// The op producing it.
    type Op: DeviceOp<Output = Self::Value>;
    /// The input as an op.
    fn into_op(self) -> Self::Op;
}

macro_rules! value_input {
    ([$($g:tt)*] $ty:ty) => {
        impl<$($g)*> TensorInput<T> for $ty {
            type Value = $ty;
            type Op = Value<$ty>;
            fn into_op(self) -> Self::Op {
                value(self)
            }
        }
    };
}

value_input!([T: DType] Tensor<T>);
value_input!([T: DType] Arc<Tensor<T>>);
value_input!(['a, T: DType] &'a Tensor<T>);

impl<T: DType, V: TensorRef<T>> TensorInput<T> for Value<V> {
    type Value = V;
    type Op = Self;
    fn into_op(self) -> Self {
        self
    }
}

impl<T: DType, F, V> TensorInput<T> for TensorOp<F>
where
    F: FnOnce(&mut cuflow_device_op::ExecutionContext) -> Result<V, DeviceError> + Send,
    V: TensorRef<T>,
{
    type Value = V;
    type Op = Self;
    fn into_op(self) -> Self {
        self
    }
}

impl<T: DType, A, F> TensorInput<T> for Then<A, F>
where
    Then<A, F>: DeviceOp,
    <Then<A, F> as DeviceOp>::Output: TensorRef<T>,
{
    type Value = <Then<A, F> as DeviceOp>::Output;
    type Op = Self;
    fn into_op(self) -> Self {
        self
    }
}

impl<T: DType, O> TensorInput<T> for Shared<O>
where
    O: DeviceOp<Output = Tensor<T>>,
    Shared<O>: DeviceOp<Output = Arc<Tensor<T>>>,
{
    type Value = Arc<Tensor<T>>;
    type Op = Self;
    fn into_op(self) -> Self {
        self
    }
}

impl<'a, T: DType, V: TensorRef<T> + 'a> TensorInput<T> for BoxedOp<'a, V> {
    type Value = V;
    type Op = Self;
    fn into_op(self) -> Self {
        self
    }
}

/// A tensor a kernel may write: an owned `Tensor<T>` or a `&mut Tensor<T>` (in place).
pub trait TensorMut<T: DType>: Send {
    /// The tensor, for reading its shape.
    fn tensor(&self) -> &Tensor<T>;
}

impl<T: DType> TensorMut<T> for Tensor<T> {
    fn tensor(&self) -> &Tensor<T> {
        self
    }
}

impl<T: DType> TensorMut<T> for &mut Tensor<T> {
    fn tensor(&self) -> &Tensor<T> {
        self
    }
}

/// `.to_host_vec()` on ops that yield tensors.
pub trait TensorOpExt<T: DType>: DeviceOp + Sized
where
    Self::Output: TensorRef<T>,
{
    /// Runs the op on the default device's default policy and reads its tensor back.
    ///
    /// # Errors
    ///
    /// Any error of the op or of the copy.
    fn to_host_vec(self) -> Result<Vec<T>, DeviceError> {
        let out = self.sync()?;
        out.tensor().to_host_vec()
    }
}

impl<T: DType, O: DeviceOp> TensorOpExt<T> for O where O::Output: TensorRef<T> {}

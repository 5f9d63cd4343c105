//! [`DeviceBuffer`]: a typed allocation on a device, owning its [`Memory`].

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Arc;

use super::{byte_size, BufferView, DeviceCopy, Memory};
use crate::device::Device;
use crate::error::Result;
use crate::stream::Stream;

/// A typed allocation on a device. Not `Clone`: share it through `Arc`.
///
/// Copies and kernels are enqueued on a [`Stream`]; reading back to the host waits for them.
///
/// # Examples
///
/// ```
/// use cuflow_runtime::{Device, DeviceBuffer};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let buf = DeviceBuffer::from_host(&stream, &[1.0f32, 2.0, 3.0])?;
/// assert_eq!(buf.to_host_vec(&stream)?, vec![1.0, 2.0, 3.0]);
/// # Ok(()) }
/// ```
pub struct DeviceBuffer<T> {
    pub(crate) mem: Arc<Memory>,
    len: usize,
    _marker: PhantomData<fn() -> T>,
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Allocates `len` elements, stream-ordered on `stream`. The contents are unspecified
    /// (zero on the host backend, whatever the memory held on CUDA).
    ///
    /// # Errors
    ///
    /// [`DeviceError::OutOfMemory`](crate::DeviceError::OutOfMemory) when the device cannot hold it.
    ///
    /// While `stream` is capturing, the allocation is made at once (not recorded) and the graph
    /// being captured keeps it: replays of that graph find it at the same address.
    pub fn alloc(stream: &Stream, len: usize) -> Result<Self> {
        let bytes = byte_size::<T>(len, "DeviceBuffer::alloc")?;
        Ok(DeviceBuffer {
            mem: Memory::alloc(stream, bytes)?,
            len,
            _marker: PhantomData,
        })
    }

    /// Allocates `len` zeroed elements.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::alloc`].
    pub fn zeroed(stream: &Stream, len: usize) -> Result<Self> {
        let buf = Self::alloc(stream, len)?;
        buf.view().fill_bytes(stream, 0)?;
        Ok(buf)
    }

    /// Allocates a buffer holding a copy of `data`.
    ///
    /// # Errors
    ///
    /// As [`DeviceBuffer::alloc`].
    pub fn from_host(stream: &Stream, data: &[T]) -> Result<Self> {
        let buf = Self::alloc(stream, data.len())?;
        buf.view().copy_from_host(stream, data)?;
        Ok(buf)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device holding the buffer.
    pub fn device(&self) -> &Device {
        &self.mem.device
    }

    /// The same memory as a buffer of `U`: its bytes, unchanged, read as `U` elements. Both
    /// buffers share the allocation and its access ordering (work through either is ordered
    /// against work through the other), and the memory is freed after both are dropped.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`](crate::DeviceError::InvalidShape) when the buffer's bytes
    /// are not a whole number of `U` elements, or `U` needs an alignment above 8 bytes (more
    /// than every backend guarantees for an allocation).
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{Device, DeviceBuffer};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let stream = Device::host().new_stream()?;
    /// let words = DeviceBuffer::from_host(&stream, &[1.0f32, -2.0])?;
    /// let bits = words.reinterpret::<u32>()?;
    /// assert_eq!(bits.to_host_vec(&stream)?, vec![1.0f32.to_bits(), (-2.0f32).to_bits()]);
    /// assert_eq!(words.reinterpret::<u8>()?.len(), 8);
    /// # Ok(()) }
    /// ```
    pub fn reinterpret<U: DeviceCopy>(&self) -> Result<DeviceBuffer<U>> {
        let bytes = self.mem.bytes;
        let (size, align) = (std::mem::size_of::<U>(), std::mem::align_of::<U>());
        let invalid = |reason: String| crate::DeviceError::InvalidShape {
            op: "DeviceBuffer::reinterpret",
            reason,
        };
        if align > 8 {
            return Err(invalid(format!(
                "{} needs {align}-byte alignment; allocations are aligned to 8 bytes",
                std::any::type_name::<U>()
            )));
        }
        if size == 0 || !bytes.is_multiple_of(size) {
            return Err(invalid(format!(
                "the buffer holds {bytes} bytes, not a whole number of {size}-byte {}",
                std::any::type_name::<U>()
            )));
        }
        Ok(DeviceBuffer {
            mem: self.mem.clone(),
            len: bytes / size,
            _marker: PhantomData,
        })
    }

    /// Whether `other` is this buffer's memory: a clone of it, or a
    /// [`reinterpret`](Self::reinterpret)ation of it (of any element type). Both start at the
    /// allocation's first byte, so element `i` of each is at `i` times its element size.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{Device, DeviceBuffer};
    ///
    /// let stream = Device::host().new_stream()?;
    /// let x = DeviceBuffer::from_host(&stream, &[1.0f32, 2.0])?;
    /// assert!(x.same_memory(&x.reinterpret::<u32>()?));
    /// assert!(!x.same_memory(&DeviceBuffer::from_host(&stream, &[1.0f32, 2.0])?));
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn same_memory<U>(&self, other: &DeviceBuffer<U>) -> bool {
        Arc::ptr_eq(&self.mem, &other.mem)
    }

    /// A view of the whole buffer.
    pub fn view(&self) -> BufferView<'_, T> {
        BufferView {
            mem: &self.mem,
            offset: 0,
            len: self.len,
            _marker: PhantomData,
        }
    }

    /// A view of `range` (in elements).
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`](crate::DeviceError::InvalidShape) when the range does not lie inside the buffer.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferView<'_, T>> {
        self.view().slice(range)
    }

    /// Copies the whole buffer to a new host vector, after all work that used it.
    ///
    /// # Errors
    ///
    /// Any error the pending work hit.
    pub fn to_host_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        self.view().to_host_vec(stream)
    }

    /// The stream of the most recent work enqueued on this buffer by a stream of its own
    /// device (the allocating stream when nothing used it since; copies to and from other
    /// devices may also have used it from theirs), leaving out streams being captured and
    /// streams made for captures ([`Device::new_stream_for_captures`](crate::Device::new_stream_for_captures)),
    /// among the streams the buffer remembers (it forgets idle ones: see [`Stream`]). Reading
    /// back on it orders the read after that work without adding a wait; a read on any stream
    /// is ordered after every use anyway.
    pub fn last_stream(&self) -> Option<Stream> {
        self.mem
            .state
            .lock()
            .uses
            .iter()
            .rev()
            .find(|s| *s.device() == self.mem.device && !s.is_for_captures() && !s.is_capturing())
            .cloned()
    }

    /// Overwrites the buffer with `data` (same length).
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`](crate::DeviceError::LengthMismatch) when lengths differ.
    pub fn copy_from_host(&self, stream: &Stream, data: &[T]) -> Result<()> {
        self.view().copy_from_host(stream, data)
    }

    /// Copies `src` (same length) into this buffer on `stream`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`](crate::DeviceError::LengthMismatch) when lengths differ.
    pub fn copy_from(&self, stream: &Stream, src: &DeviceBuffer<T>) -> Result<()> {
        self.view().copy_from(stream, src.view())
    }

    /// Copies `src` (same length), which may live on another device, into this buffer on
    /// `stream`, a stream of this buffer's device. See [`BufferView::copy_from_device`].
    ///
    /// # Errors
    ///
    /// As [`BufferView::copy_from_device`].
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{Device, DeviceBuffer};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let (a, b) = (Device::host(), Device::host_numbered(1));
    /// let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    /// let src = DeviceBuffer::from_host(&sa, &[1.0f32, 2.0, 3.0])?;
    /// let dst = DeviceBuffer::<f32>::alloc(&sb, 3)?;
    /// dst.copy_from_device(&sb, &src)?;
    /// assert_eq!(dst.to_host_vec(&sb)?, vec![1.0, 2.0, 3.0]);
    /// # Ok(()) }
    /// ```
    pub fn copy_from_device(&self, stream: &Stream, src: &DeviceBuffer<T>) -> Result<()> {
        self.view().copy_from_device(stream, src.view())
    }

    /// Like [`DeviceBuffer::copy_from_device`], but between two CUDA devices always staged
    /// through pinned host memory, even where a peer copy is possible. See
    /// [`BufferView::copy_from_device_staged`].
    ///
    /// # Errors
    ///
    /// As [`BufferView::copy_from_device`].
    pub fn copy_from_device_staged(&self, stream: &Stream, src: &DeviceBuffer<T>) -> Result<()> {
        self.view().copy_from_device_staged(stream, src.view())
    }
}

impl<T> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("device", &self.mem.device)
            .finish()
    }
}

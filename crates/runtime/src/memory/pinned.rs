//! Pinned (page-locked) host memory and asynchronous transfers through it.

use std::fmt;
use std::marker::PhantomData;

use smallvec::smallvec;

use super::{byte_size, check_len, BufferView, DeviceCopy};
use crate::access::{ordered_copy, Access};
use crate::backend::{PinnedBackend, PinnedBytes, PinnedBytesMut};
use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::stream::Stream;

/// Page-locked host memory: copies between it and the device run asynchronously, overlapping
/// with host work.
///
/// A pinned buffer is handed to a copy by value and comes back from
/// [`PinnedTransfer::wait`], so the host cannot touch it while the device uses it.
pub struct PinnedBuffer<T> {
    backend: PinnedBackend,
    len: usize,
    device: Device,
    _marker: PhantomData<fn() -> T>,
}

impl<T: DeviceCopy> PinnedBuffer<T> {
    /// Allocates `len` zeroed elements of page-locked memory usable with `device`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::OutOfMemory`] or a driver error.
    pub fn new(device: &Device, len: usize) -> Result<Self> {
        let bytes = byte_size::<T>(len, "PinnedBuffer::new")?;
        let backend = device.backend().alloc_pinned(bytes)?;
        Ok(PinnedBuffer {
            backend,
            len,
            device: device.clone(),
            _marker: PhantomData,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The contents.
    pub fn as_slice(&self) -> PinnedRef<'_, T> {
        PinnedRef {
            bytes: self.backend.bytes(),
            len: self.len,
            _marker: PhantomData,
        }
    }

    /// The contents, mutably.
    pub fn as_mut_slice(&mut self) -> PinnedMut<'_, T> {
        PinnedMut {
            bytes: self.backend.bytes_mut(),
            len: self.len,
            _marker: PhantomData,
        }
    }

    /// Enqueues an asynchronous copy of `src` (same length) into this buffer, after all work
    /// that used `src`; the buffer comes back when the copy has finished.
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when lengths differ, [`DeviceError::DeviceMismatch`]
    /// when the view is of another device than the stream, or the pinned buffer of another
    /// backend.
    pub fn copy_from_device(
        self,
        stream: &Stream,
        src: BufferView<'_, T>,
    ) -> Result<PinnedTransfer<T>> {
        let op = "PinnedBuffer::copy_from_device";
        src.mem.check_device(stream, op, "the source")?;
        stream.forbid_in_capture(op)?;
        check_len(op, self.len, src.len)?;
        let mut this = self;
        this.check_backend(op, stream)?;
        ordered_copy(
            stream,
            op,
            src.region().len,
            smallvec![(src.mem, Access::Read)],
            || {
                stream
                    .backend()
                    .copy_to_pinned(src.region(), &mut this.backend)
            },
        )?;
        let event = stream.record_event()?;
        Ok(PinnedTransfer {
            buffer: Some(this),
            event,
        })
    }

    /// Enqueues an asynchronous copy of this buffer into `dst` (same length); the buffer comes
    /// back when the copy has finished.
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when lengths differ, [`DeviceError::DeviceMismatch`]
    /// when the view is of another device than the stream, or the pinned buffer of another
    /// backend.
    pub fn copy_to_device(
        self,
        stream: &Stream,
        dst: BufferView<'_, T>,
    ) -> Result<PinnedTransfer<T>> {
        let op = "PinnedBuffer::copy_to_device";
        dst.mem.check_device(stream, op, "the destination")?;
        stream.forbid_in_capture(op)?;
        check_len(op, dst.len, self.len)?;
        self.check_backend(op, stream)?;
        ordered_copy(
            stream,
            op,
            dst.region().len,
            smallvec![(dst.mem, Access::Write)],
            || {
                stream
                    .backend()
                    .copy_from_pinned(&self.backend, dst.region())
            },
        )?;
        let event = stream.record_event()?;
        Ok(PinnedTransfer {
            buffer: Some(self),
            event,
        })
    }
}

impl<T> PinnedBuffer<T> {
    /// Refuses a stream of the other backend: pinned memory of one backend serves every device
    /// of that backend, and no other. (Views are checked against the stream before, so this is
    /// the only way backends can differ.)
    fn check_backend(&self, op: &'static str, stream: &Stream) -> Result<()> {
        if self.device.kind() != stream.device().kind() {
            return Err(DeviceError::device_mismatch(
                op,
                "the pinned buffer",
                stream.device(),
                &self.device,
            ));
        }
        Ok(())
    }
}

/// A borrow of a [`PinnedBuffer`]'s contents; dereferences to `[T]`.
pub struct PinnedRef<'a, T> {
    bytes: PinnedBytes<'a>,
    len: usize,
    _marker: PhantomData<fn() -> T>,
}

impl<T: DeviceCopy> std::ops::Deref for PinnedRef<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        bytemuck::cast_slice(&self.bytes[..self.len * std::mem::size_of::<T>()])
    }
}

impl<T: DeviceCopy + fmt::Debug> fmt::Debug for PinnedRef<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// A mutable borrow of a [`PinnedBuffer`]'s contents; dereferences to `[T]`.
pub struct PinnedMut<'a, T> {
    bytes: PinnedBytesMut<'a>,
    len: usize,
    _marker: PhantomData<fn() -> T>,
}

impl<T: DeviceCopy> std::ops::Deref for PinnedMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        bytemuck::cast_slice(&self.bytes[..self.len * std::mem::size_of::<T>()])
    }
}

impl<T: DeviceCopy> std::ops::DerefMut for PinnedMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let bytes = self.len * std::mem::size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.bytes[..bytes])
    }
}

impl<T: DeviceCopy + fmt::Debug> fmt::Debug for PinnedMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}

/// An asynchronous copy to or from a [`PinnedBuffer`] in flight. Dropping it waits for the
/// copy, so the pinned memory is never freed or reused while the device touches it.
#[must_use = "a transfer holds its pinned buffer until waited on"]
pub struct PinnedTransfer<T> {
    buffer: Option<PinnedBuffer<T>>,
    event: crate::event::Event,
}

impl<T> PinnedTransfer<T> {
    /// Whether the copy has finished.
    ///
    /// # Errors
    ///
    /// The error the copy hit.
    pub fn is_complete(&self) -> Result<bool> {
        self.event.is_complete()
    }

    /// Waits for the copy and gives the buffer back.
    ///
    /// # Errors
    ///
    /// The error the copy hit (the buffer is then dropped after the wait).
    pub fn wait(mut self) -> Result<PinnedBuffer<T>> {
        self.event.synchronize()?;
        self.buffer
            .take()
            .ok_or_else(|| DeviceError::usage("PinnedTransfer already waited on"))
    }
}

impl<T> Drop for PinnedTransfer<T> {
    fn drop(&mut self) {
        if self.buffer.is_some() {
            if let Err(e) = self.event.synchronize() {
                tracing::warn!("pinned transfer failed while dropped: {e}");
            }
        }
    }
}

impl<T> fmt::Debug for PinnedTransfer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedTransfer")
            .field("event", &self.event)
            .finish()
    }
}

//! Pinned (page-locked) host memory and asynchronous transfers through it.
//!
//! The host reads a pinned buffer in place, as a `[T]` over the backend's bytes. Every backend
//! aligns non-empty pinned storage to at least 8 bytes (host: a word vector; CUDA: page-aligned
//! `cuMemHostAlloc`, or from 4 MiB on Linux a mapping of 2 MiB pages registered with
//! `cuMemHostRegister`, several times faster to make), and the storage never moves while the
//! buffer lives, so
//! [`PinnedBuffer::new`] refuses element types aligned to more than 8 bytes and checks the
//! storage's alignment once; an empty buffer (on CUDA, one with no allocation at all) reads as
//! an empty slice without touching its bytes.
//!
//! A copy's buffer is owned by its [`PinnedTransfer`] until an event recorded after the copy
//! has completed. That event is recorded in the same enqueue as the copy, under the stream's
//! capture gate, so no capture can begin in between; if it cannot be recorded, the buffer is
//! freed only once the stream was waited for or its device faulted, and leaked otherwise.

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
///
/// On CUDA, dropping one frees page-locked memory, which the driver does only after the
/// device's work in flight, blocking other threads' driver calls meanwhile. So while a host
/// function waits for another thread, no thread may drop a pinned buffer of that device (the
/// drop would wait for the host function, which waits for a thread that cannot go on): keep
/// such buffers and reuse them.
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
    /// [`DeviceError::InvalidShape`] when `T` needs an alignment above 8 bytes (more than
    /// every backend guarantees for pinned memory, which the host reads in place; use a type
    /// of the same bytes aligned to 8, e.g. `[u64; 2]` for `u128`), when `T` is zero-sized and
    /// `len` is not 0, or when `len` elements overflow the address space;
    /// [`DeviceError::OutOfMemory`] or a driver error.
    pub fn new(device: &Device, len: usize) -> Result<Self> {
        let op = "PinnedBuffer::new";
        let align = std::mem::align_of::<T>();
        if align > PINNED_ALIGN {
            return Err(DeviceError::InvalidShape {
                op,
                reason: format!(
                    "{} needs {align}-byte alignment; pinned buffers are aligned to \
                     {PINNED_ALIGN} bytes: use an element type of the same bytes aligned to \
                     at most {PINNED_ALIGN} (e.g. [u64; 2] for u128)",
                    std::any::type_name::<T>()
                ),
            });
        }
        if std::mem::size_of::<T>() == 0 && len > 0 {
            // The host reads the buffer in place, as a slice over its bytes: elements of no
            // bytes would read as an empty slice.
            return Err(DeviceError::InvalidShape {
                op,
                reason: format!(
                    "{len} elements of the zero-sized {} hold no bytes to copy; pinned buffers \
                     need an element type of at least one byte",
                    std::any::type_name::<T>()
                ),
            });
        }
        let bytes = byte_size::<T>(len, op)?;
        let backend = device.backend().alloc_pinned(bytes)?;
        let buffer = PinnedBuffer {
            backend,
            len,
            device: device.clone(),
            _marker: PhantomData,
        };
        // The storage never moves, so one check here makes every later view valid.
        if let Err(e) = try_typed::<T>(&buffer.backend.bytes(), len) {
            return Err(DeviceError::internal(format!(
                "{op}: the {bytes} bytes of pinned memory from {device:?} cannot be viewed as \
                 {len} {}: {e}",
                std::any::type_name::<T>()
            )));
        }
        Ok(buffer)
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
        let recorded = ordered_copy(
            stream,
            op,
            src.region().len,
            smallvec![(src.mem, Access::Read)],
            || {
                stream
                    .backend()
                    .copy_to_pinned(src.region(), &mut this.backend)?;
                Ok(stream.record_event())
            },
        )?;
        this.into_transfer(stream, recorded)
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
        let fits = check_len(op, dst.len, self.len);
        self.copy_into(stream, dst, op, fits)
    }

    /// Enqueues the copy of this buffer's first `dst.len()` elements into `dst`, for `op`;
    /// `fits` says whether that many fit (checked after the devices and the capture, as the
    /// checks have always been ordered).
    fn copy_into(
        self,
        stream: &Stream,
        dst: BufferView<'_, T>,
        op: &'static str,
        fits: Result<()>,
    ) -> Result<PinnedTransfer<T>> {
        dst.mem.check_device(stream, op, "the destination")?;
        stream.forbid_in_capture(op)?;
        fits?;
        self.check_backend(op, stream)?;
        let recorded = ordered_copy(
            stream,
            op,
            dst.region().len,
            smallvec![(dst.mem, Access::Write)],
            || {
                stream
                    .backend()
                    .copy_from_pinned(&self.backend, dst.region())?;
                Ok(stream.record_event())
            },
        )?;
        self.into_transfer(stream, recorded)
    }

    /// Enqueues an asynchronous copy of this buffer's first `dst.len()` elements into `dst`
    /// (which may be shorter than the buffer, not longer); the buffer comes back when the copy
    /// has finished. A staging buffer of fixed size then serves data of any length up to it.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{Device, DeviceBuffer, PinnedBuffer};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let device = Device::auto()?;
    /// let stream = device.new_stream()?;
    /// let mut staging = PinnedBuffer::<f32>::new(&device, 4)?;
    /// staging.as_mut_slice().copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
    /// let dst = DeviceBuffer::<f32>::zeroed(&stream, 3)?;
    /// let staging = staging.copy_prefix_to_device(&stream, dst.view())?.wait()?;
    /// assert_eq!(dst.to_host_vec(&stream)?, [1.0, 2.0, 3.0]);
    /// assert_eq!(staging.len(), 4);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when `dst` is longer than the buffer (`expected` is the
    /// buffer's length), [`DeviceError::DeviceMismatch`] when the view is of another device
    /// than the stream, or the pinned buffer of another backend.
    pub fn copy_prefix_to_device(
        self,
        stream: &Stream,
        dst: BufferView<'_, T>,
    ) -> Result<PinnedTransfer<T>> {
        let op = "PinnedBuffer::copy_prefix_to_device";
        let fits = if dst.len > self.len {
            Err(DeviceError::LengthMismatch {
                op,
                expected: self.len,
                found: dst.len,
            })
        } else {
            Ok(())
        };
        self.copy_into(stream, dst, op, fits)
    }
}

/// The alignment every backend gives non-empty pinned storage (see the module docs).
const PINNED_ALIGN: usize = 8;

/// The first `len` elements of `T` in `bytes`: an empty slice when they take no bytes (an
/// empty buffer's bytes may sit at any address), else the bytes cast in place.
fn try_typed<T: DeviceCopy>(
    bytes: &[u8],
    len: usize,
) -> std::result::Result<&[T], bytemuck::PodCastError> {
    let n = len.saturating_mul(std::mem::size_of::<T>());
    if n == 0 {
        return Ok(&[]);
    }
    let bytes = bytes.get(..n).ok_or(bytemuck::PodCastError::SizeMismatch)?;
    bytemuck::try_cast_slice(bytes)
}

/// [`try_typed`], mutably.
fn try_typed_mut<T: DeviceCopy>(
    bytes: &mut [u8],
    len: usize,
) -> std::result::Result<&mut [T], bytemuck::PodCastError> {
    let n = len.saturating_mul(std::mem::size_of::<T>());
    if n == 0 {
        return Ok(&mut []);
    }
    let bytes = bytes
        .get_mut(..n)
        .ok_or(bytemuck::PodCastError::SizeMismatch)?;
    bytemuck::try_cast_slice_mut(bytes)
}

impl<T> PinnedBuffer<T> {
    /// The transfer of a copy just enqueued, given the result of recording its event (in the
    /// same enqueue, under the stream's capture gate). When the record failed, the copy may
    /// still be running, and the buffer must not be freed under it: it is dropped once the
    /// stream has been waited for, or once the device faulted (which ends its work, as when a
    /// transfer is dropped after a failed wait); otherwise (the wait failed too, e.g. for the
    /// same lack of resources, or another thread began capturing the stream) it is leaked.
    fn into_transfer(
        self,
        stream: &Stream,
        recorded: Result<crate::event::Event>,
    ) -> Result<PinnedTransfer<T>> {
        let error = match recorded {
            Ok(event) => {
                return Ok(PinnedTransfer {
                    buffer: Some(self),
                    event,
                })
            }
            Err(e) => e,
        };
        if let Err(wait) = stream.synchronize() {
            if !stream.device().is_faulted() {
                tracing::warn!(
                    "a pinned buffer is leaked: recording the event of its copy failed \
                     ({error}), and waiting for the copy failed too ({wait})"
                );
                std::mem::forget(self);
            }
        }
        Err(error)
    }

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
        // `PinnedBuffer::new` checked that the storage views as `len` elements, and it never
        // moves: the empty fallback is unreachable, and there so that a read never panics.
        try_typed(&self.bytes, self.len).unwrap_or_default()
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
        // As in `PinnedRef`: checked at `new`, the fallback is unreachable.
        try_typed(&self.bytes, self.len).unwrap_or_default()
    }
}

impl<T: DeviceCopy> std::ops::DerefMut for PinnedMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // As in `PinnedRef`: checked at `new`, the fallback is unreachable.
        try_typed_mut(&mut self.bytes, self.len).unwrap_or_default()
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

//! [`BufferView`]: a borrowed range of a buffer, and the copies and fills that stay on one
//! device. Each orders itself after the conflicting accesses of other streams
//! ([`crate::access`]).

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use smallvec::smallvec;

use super::{check_len, DeviceBuffer, DeviceCopy, Memory, Region};
use crate::access::{ordered_copy, ordered_traced, Access, Accesses};
use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::stream::Stream;
use crate::trace::Work;

/// A borrowed range of a [`DeviceBuffer`].
pub struct BufferView<'a, T> {
    pub(crate) mem: &'a Arc<Memory>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) _marker: PhantomData<fn() -> T>,
}

impl<T> Clone for BufferView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for BufferView<'_, T> {}

impl<'a, T: DeviceCopy> From<&'a DeviceBuffer<T>> for BufferView<'a, T> {
    fn from(b: &'a DeviceBuffer<T>) -> Self {
        b.view()
    }
}

impl<'a, T: DeviceCopy> BufferView<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the view's first element in its buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The device holding the view.
    pub fn device(&self) -> &Device {
        &self.mem.device
    }

    /// A sub-view of `range` (in elements, relative to this view).
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] when the range does not lie inside the view.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferView<'a, T>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        if start > end || end > self.len {
            return Err(DeviceError::InvalidShape {
                op: "BufferView::slice",
                reason: format!(
                    "range {start}..{end} is outside a view of {} elements",
                    self.len
                ),
            });
        }
        Ok(BufferView {
            mem: self.mem,
            offset: self.offset + start,
            len: end - start,
            _marker: PhantomData,
        })
    }

    pub(crate) fn byte_offset(&self) -> usize {
        self.offset * std::mem::size_of::<T>()
    }

    pub(crate) fn byte_len(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The bytes of the view in its allocation.
    pub(crate) fn region(&self) -> Region<'a> {
        Region {
            mem: self.mem,
            offset: self.byte_offset(),
            len: self.byte_len(),
        }
    }

    /// Enqueues a copy of `data` into this view. `data` may be dropped as soon as this returns.
    ///
    /// On CUDA a copy of up to 128 MiB is first copied into page-locked memory that the
    /// device keeps for staging (up to 256 MiB of it, in buffers of up to 16 MiB, allocated
    /// as copies need them and freed with the device; from 1 MiB on, by several threads), and
    /// the copy never waits for the stream's earlier work. A larger copy, or one made while
    /// that memory is in flight, goes through the driver's own staging, which may wait for
    /// the stream's earlier work before it returns (copies of 64 MiB did), while the buffer's
    /// ordering is held: other threads' work on this buffer waits too. So a host function
    /// enqueued before such a copy must not wait for another thread's work on the same
    /// buffer. A copy from a [`PinnedBuffer`](crate::PinnedBuffer) (`copy_to_device`) never
    /// waits.
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when lengths differ; [`DeviceError::Capture`] during a
    /// capture (pageable host memory cannot be recorded).
    pub fn copy_from_host(&self, stream: &Stream, data: &[T]) -> Result<()> {
        self.mem
            .check_device(stream, "copy_from_host", "the destination")?;
        stream.forbid_in_capture("copy_from_host")?;
        check_len("copy_from_host", self.len, data.len())?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        // Staged before the buffer's ordering is taken: staging may allocate page-locked
        // memory, and enqueuing the staged copy then never waits for the stream.
        let staged = stream.backend().stage_from_host(bytes)?;
        let accesses: Accesses<'_> = smallvec![(self.mem, Access::Write)];
        ordered_copy(stream, "copy_from_host", bytes.len(), accesses, || {
            stream.backend().upload(self.region(), staged)
        })
    }

    /// Copies this view into `out` (same length), after all work that used the buffer, and
    /// waits for the copy.
    ///
    /// While it waits, other threads may enqueue work on the buffer and on `stream` (ordered
    /// after the copy where they write the buffer): a host function before the copy may wait
    /// for such a thread. On CUDA this holds for copies staged through the device's
    /// page-locked memory (as for [`copy_from_host`](Self::copy_from_host), up to 128 MiB); a
    /// larger copy, or one made while that memory is in flight, keeps the buffer's writers
    /// waiting until it has landed.
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when lengths differ; any error the pending work hit.
    pub fn copy_to_host(&self, stream: &Stream, out: &mut [T]) -> Result<()> {
        self.mem
            .check_device(stream, "copy_to_host", "the source")?;
        stream.forbid_in_capture("copy_to_host")?;
        check_len("copy_to_host", self.len, out.len())?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        // A read: ordered after the last write on any stream, and seen by later writers, which
        // wait for it. The copy is enqueued in stream order (later writers wait for it as for
        // any read) and waited for once the state is unlocked: the work it waits for may need
        // the state (a host function waiting for another thread that writes this buffer; on
        // the host backend, one writing it itself). On CUDA a copy that is not staged, into
        // pageable memory, is waited for with the state still locked.
        let len = bytes.len();
        let copy = ordered_copy(
            stream,
            "copy_to_host",
            len,
            smallvec![(self.mem, Access::Read)],
            || {
                stream
                    .backend()
                    .begin_copy_to_host(self.region(), &mut *bytes)
            },
        )?;
        copy.finish(bytes)
    }

    /// Copies this view to a new host vector, after all work that used the buffer.
    ///
    /// # Errors
    ///
    /// Any error the pending work hit.
    pub fn to_host_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.copy_to_host(stream, &mut out)?;
        Ok(out)
    }

    /// Enqueues a device-to-device copy of `src` (same length) into this view. This never
    /// allocates, so it may be captured into a graph.
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when lengths differ, [`DeviceError::DeviceMismatch`]
    /// when the views live on different devices, [`DeviceError::InvalidShape`] when they are
    /// different but overlapping ranges of one allocation (the result would depend on the
    /// order the bytes are copied in; a view onto itself is fine, and copies nothing).
    pub fn copy_from(&self, stream: &Stream, src: BufferView<'_, T>) -> Result<()> {
        self.mem
            .check_device(stream, "copy_from", "the destination")?;
        src.mem.check_device(stream, "copy_from", "the source")?;
        check_len("copy_from", self.len, src.len)?;
        if Arc::ptr_eq(self.mem, src.mem) {
            let (d, s, n) = (self.byte_offset(), src.byte_offset(), self.byte_len());
            if d == s {
                return Ok(());
            }
            if d < s + n && s < d + n {
                return Err(DeviceError::InvalidShape {
                    op: "copy_from",
                    reason: format!(
                        "the destination (bytes {d}..{}) and the source (bytes {s}..{}) overlap \
                         in one allocation; copy the source to other memory first",
                        d + n,
                        s + n
                    ),
                });
            }
        }
        let accesses: Accesses<'_> = smallvec![(self.mem, Access::Write), (src.mem, Access::Read)];
        ordered_copy(stream, "copy_from", self.region().len, accesses, || {
            stream.backend().copy_device(src.region(), self.region())
        })
    }

    /// Enqueues setting every byte of the view to `value`. Graph-safe.
    ///
    /// # Errors
    ///
    /// A driver error.
    pub fn fill_bytes(&self, stream: &Stream, value: u8) -> Result<()> {
        self.mem.check_device(stream, "fill_bytes", "the buffer")?;
        let bytes = self.region().len;
        ordered_traced(
            stream,
            "fill_bytes",
            || Work::Fill { bytes },
            smallvec![(self.mem, Access::Write)],
            || stream.backend().fill_bytes(self.region(), value),
        )
    }
}

impl<T> fmt::Debug for BufferView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferView")
            .field("type", &std::any::type_name::<T>())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

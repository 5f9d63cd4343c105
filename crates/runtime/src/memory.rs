//! Device memory: typed buffers, views, and pinned host buffers.
//!
//! Invariants:
//! - A buffer's memory records every stream that used it (`Memory::uses`). Its free is
//!   stream-ordered after the last use on every one of those streams: the freeing stream waits
//!   on an event of each other stream before `cuMemFreeAsync`. Dropping a buffer whose kernels
//!   are still running is therefore safe and does not block.
//! - Every copy and memset (and, in their modules, every kernel launch, GEMM and graph replay)
//!   orders itself after the conflicting accesses of other streams to its buffers
//!   ([`crate::access`]): a write after earlier reads and writes, a read after the last write.
//! - A host read (`to_host_vec`, `copy_to_host`) is such a read, and then waits: the host never
//!   sees memory that queued work still writes.
//! - Device memory is written only through kernels and copies enqueued on streams; Rust
//!   references never point into it (the host backend guards its storage with a lock).

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use smallvec::{smallvec, SmallVec};

use crate::access::{ordered, Access, AccessState, Accesses};
use crate::backend::{cuda, host};
use crate::device::{Device, DeviceBackend};
use crate::error::{DeviceError, Result};
use crate::stream::{Stream, StreamBackend};
use crate::sync::{Arc, MappedMutexGuard, Mutex, MutexGuard, Ordering};

/// Element types that can live in device memory: plain data with no padding, no pointers and
/// every bit pattern valid (`bytemuck::Pod`), shareable across threads.
pub trait DeviceCopy: bytemuck::Pod + Send + Sync + 'static {}

impl<T: bytemuck::Pod + Send + Sync + 'static> DeviceCopy for T {}

pub(crate) enum MemoryBackend {
    Host(host::HostMemory),
    Cuda(cuda::CudaMemory),
}

/// One allocation; shared by the buffer that owns it, and by graphs and in-flight host work
/// that use it.
pub(crate) struct Memory {
    pub(crate) device: Device,
    pub(crate) bytes: usize,
    pub(crate) backend: MemoryBackend,
    pub(crate) state: Mutex<UseState>,
}

/// Which streams used a buffer (for its free) and the accesses later work must order itself
/// after (see [`crate::access`]). One lock guards both.
#[derive(Default)]
pub(crate) struct UseState {
    /// Every stream that enqueued work on the buffer, most recent last.
    uses: SmallVec<[Stream; 2]>,
    pub(crate) access: AccessState,
}

impl UseState {
    /// Records that work touching the buffer was enqueued on `stream`.
    pub(crate) fn note_use(&mut self, stream: &Stream) {
        if self.uses.last().is_none_or(|s| !s.same(stream)) {
            if let Some(pos) = self.uses.iter().position(|s| s.same(stream)) {
                let s = self.uses.remove(pos);
                self.uses.push(s);
            } else {
                self.uses.push(stream.clone());
            }
        }
    }
}

impl Memory {
    pub(crate) fn alloc(stream: &Stream, bytes: usize) -> Result<Arc<Memory>> {
        // No capture begins on `stream` between the check and the allocation.
        let _gate = stream.enqueue_gate();
        let session = stream.capture_session();
        // Another thread's allocation on a capturing stream is made outside the capture too,
        // but is not the graph's to keep.
        let owned_by_capture = session
            .as_ref()
            .is_some_and(|s| s.check_owner("DeviceBuffer::alloc", stream.id()).is_ok());
        let backend = match stream.backend() {
            StreamBackend::Host(_) => {
                MemoryBackend::Host(host::HostMemory::alloc(bytes, stream.device().name())?)
            }
            // During a capture the allocation is made now, outside the graph, and the graph
            // keeps it (below): every replay finds it at the same address.
            StreamBackend::Cuda(s) if session.is_some() => {
                MemoryBackend::Cuda(s.alloc_outside_capture(bytes)?)
            }
            StreamBackend::Cuda(s) => MemoryBackend::Cuda(s.alloc(bytes)?),
        };
        stream
            .device()
            .inner
            .bytes_in_use
            .fetch_add(bytes, Ordering::AcqRel);
        let mut state = UseState::default();
        state.note_use(stream);
        let mem = Arc::new(Memory {
            device: stream.device().clone(),
            bytes,
            backend,
            state: Mutex::new(state),
        });
        if let Some(session) = session.filter(|_| owned_by_capture) {
            // Nothing wrote it yet: a replay only keeps it alive.
            session.keep_alive(&mem, Access::Read);
        }
        Ok(mem)
    }

    /// Blocks until the work of every stream that used this memory has finished.
    pub(crate) fn wait_for_uses(&self) -> Result<()> {
        let uses: SmallVec<[Stream; 2]> = self.state.lock().uses.clone();
        for stream in &uses {
            if let Some(event) = stream.ordering_event()? {
                event.synchronize()?;
            }
        }
        Ok(())
    }

    pub(crate) fn check_device(&self, stream: &Stream, op: &'static str) -> Result<()> {
        if self.device != *stream.device() {
            return Err(DeviceError::DeviceMismatch {
                op,
                expected: stream.device().to_string(),
                found: self.device.to_string(),
            });
        }
        Ok(())
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        self.device
            .inner
            .bytes_in_use
            .fetch_sub(self.bytes, Ordering::AcqRel);
        if let MemoryBackend::Cuda(mem) = &mut self.backend {
            let uses = std::mem::take(&mut self.state.lock().uses);
            // Ordering a free after a capturing stream would record it into the graph; free it
            // when the capture ends instead.
            if let Some(session) = uses.iter().find_map(|s| s.capture_session()) {
                session.defer_free(mem.take(), uses);
                return;
            }
            free_cuda_after_uses(mem, &uses);
        }
    }
}

/// Frees `mem` on the most recent of `uses` that belongs to its device, after making it wait
/// for every other one (those of other devices included: copies between devices record a use
/// on both buffers).
pub(crate) fn free_cuda_after_uses(mem: &mut cuda::CudaMemory, uses: &[Stream]) {
    let own_device = |s: &Stream| match s.backend() {
        StreamBackend::Cuda(c) => c.shared.ordinal == mem.shared().ordinal,
        StreamBackend::Host(_) => false,
    };
    let Some(pos) = uses.iter().rposition(own_device) else {
        mem.leak_warning("no stream of its device recorded");
        return;
    };
    let last = &uses[pos];
    let mut ordered = Ok(());
    for (i, other) in uses.iter().enumerate() {
        if i != pos {
            if let Err(e) = last.join(other) {
                ordered = Err(e);
            }
        }
    }
    match (ordered, last.backend()) {
        (Ok(()), StreamBackend::Cuda(s)) => mem.free_on(s),
        (Err(e), _) => mem.leak_warning(&e.to_string()),
        (Ok(()), StreamBackend::Host(_)) => mem.leak_warning("host stream"),
    }
}

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

fn byte_size<T>(len: usize, op: &'static str) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| DeviceError::InvalidShape {
            op,
            reason: format!("{len} elements overflow the address space"),
        })
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Allocates `len` elements, stream-ordered on `stream`. The contents are unspecified
    /// (zero on the host backend, whatever the memory held on CUDA).
    ///
    /// # Errors
    ///
    /// [`DeviceError::OutOfMemory`] when the device cannot hold it.
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
    /// [`DeviceError::InvalidShape`] when the range does not lie inside the buffer.
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
    /// devices may also have used it from theirs), leaving out streams being captured. Reading back on it orders the read after
    /// that work without adding a wait; a read on any stream is ordered after every use anyway.
    pub fn last_stream(&self) -> Option<Stream> {
        self.mem
            .state
            .lock()
            .uses
            .iter()
            .rev()
            .find(|s| *s.device() == self.mem.device && !s.is_capturing())
            .cloned()
    }

    /// Overwrites the buffer with `data` (same length).
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when lengths differ.
    pub fn copy_from_host(&self, stream: &Stream, data: &[T]) -> Result<()> {
        self.view().copy_from_host(stream, data)
    }

    /// Copies `src` (same length) into this buffer on `stream`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when lengths differ.
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

/// A borrowed range of a [`DeviceBuffer`].
pub struct BufferView<'a, T> {
    pub(crate) mem: &'a Arc<Memory>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    _marker: PhantomData<fn() -> T>,
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

    /// Enqueues a copy of `data` into this view. `data` may be dropped as soon as this returns.
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when lengths differ; [`DeviceError::Capture`] during a
    /// capture (pageable host memory cannot be recorded).
    pub fn copy_from_host(&self, stream: &Stream, data: &[T]) -> Result<()> {
        self.mem.check_device(stream, "copy_from_host")?;
        stream.forbid_in_capture("copy_from_host")?;
        if data.len() != self.len {
            return Err(DeviceError::LengthMismatch {
                op: "copy_from_host",
                expected: self.len,
                found: data.len(),
            });
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let accesses: Accesses<'_> = smallvec![(self.mem, Access::Write)];
        ordered(stream, "copy_from_host", accesses, || {
            match (&self.mem.backend, stream.backend()) {
                (MemoryBackend::Host(_), StreamBackend::Host(s)) => {
                    s.copy_from_host(self.mem.clone(), self.byte_offset(), bytes.to_vec())
                }
                (MemoryBackend::Cuda(m), StreamBackend::Cuda(s)) => {
                    s.copy_from_host(m, self.byte_offset(), bytes)
                }
                _ => Err(backend_mismatch("copy_from_host")),
            }
        })
    }

    /// Copies this view into `out` (same length), after all work that used the buffer, and
    /// waits for the copy.
    ///
    /// # Errors
    ///
    /// [`DeviceError::LengthMismatch`] when lengths differ; any error the pending work hit.
    pub fn copy_to_host(&self, stream: &Stream, out: &mut [T]) -> Result<()> {
        self.mem.check_device(stream, "copy_to_host")?;
        stream.forbid_in_capture("copy_to_host")?;
        if out.len() != self.len {
            return Err(DeviceError::LengthMismatch {
                op: "copy_to_host",
                expected: self.len,
                found: out.len(),
            });
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        // A read: ordered after the last write on any stream, and seen by later writers, which
        // wait for it. The buffer's state stays locked until the copy has finished, so no write
        // can slip in between.
        ordered(
            stream,
            "copy_to_host",
            smallvec![(self.mem, Access::Read)],
            || match (&self.mem.backend, stream.backend()) {
                (MemoryBackend::Host(_), StreamBackend::Host(s)) => {
                    s.copy_to_host(self.mem.clone(), self.byte_offset(), bytes)
                }
                (MemoryBackend::Cuda(m), StreamBackend::Cuda(s)) => {
                    s.copy_to_host(m, self.byte_offset(), bytes)
                }
                _ => Err(backend_mismatch("copy_to_host")),
            },
        )
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
    /// when the views live on different devices.
    pub fn copy_from(&self, stream: &Stream, src: BufferView<'_, T>) -> Result<()> {
        self.mem.check_device(stream, "copy_from")?;
        src.mem.check_device(stream, "copy_from")?;
        if src.len != self.len {
            return Err(DeviceError::LengthMismatch {
                op: "copy_from",
                expected: self.len,
                found: src.len,
            });
        }
        let accesses: Accesses<'_> = smallvec![(self.mem, Access::Write), (src.mem, Access::Read)];
        ordered(stream, "copy_from", accesses, || {
            match (&self.mem.backend, &src.mem.backend, stream.backend()) {
                (MemoryBackend::Host(_), MemoryBackend::Host(_), StreamBackend::Host(s)) => s
                    .copy_device(
                        src.mem.clone(),
                        src.byte_offset(),
                        self.mem.clone(),
                        self.byte_offset(),
                        self.byte_len(),
                    ),
                (MemoryBackend::Cuda(d), MemoryBackend::Cuda(sr), StreamBackend::Cuda(s)) => s
                    .copy_device(
                        sr,
                        src.byte_offset(),
                        d,
                        self.byte_offset(),
                        self.byte_len(),
                    ),
                _ => Err(backend_mismatch("copy_from")),
            }
        })
    }

    /// Copies `src` (same length), which may live on another device, into this view on
    /// `stream`, a stream of this view's device.
    ///
    /// The copy is ordered after all work enqueued so far that used `src` or this view's
    /// buffer, on any stream of either device, and both buffers record it, so that later
    /// reads wait for it and neither is freed before it has finished. How it runs depends on
    /// the two devices:
    ///
    /// - **the same device**: a device copy on `stream`, as [`BufferView::copy_from`];
    /// - **two CUDA devices that can access each other** ([`Device::can_access_peer`]): a peer
    ///   copy (`cuMemcpyPeerAsync`) on `stream`, over NVLink or PCIe; peer access is enabled
    ///   at the first such copy between the two devices (where the driver then refuses it, for
    ///   too many peers, the copy is staged);
    /// - **two CUDA devices without peer access**: staged through pinned host memory, chunk by
    ///   chunk: device to host on a stream of `src`'s device, then host to device on `stream`,
    ///   joined by events (as [`BufferView::copy_from_device_staged`]);
    /// - **two host devices**: a copy on `stream`'s worker;
    /// - **a host device and a CUDA device**: through the host backend's storage. This one
    ///   waits: for `src`'s pending work and, from a CUDA buffer, for the copy out of it.
    ///
    /// Except between host and CUDA devices, it does not wait: the calling thread returns as
    /// soon as the copy is enqueued.
    ///
    /// # Errors
    ///
    /// [`DeviceError::DeviceMismatch`] when `stream` is not of this view's device,
    /// [`DeviceError::LengthMismatch`] when lengths differ, [`DeviceError::Capture`] for a copy
    /// between two devices on a stream being captured (it cannot be recorded into a graph:
    /// copy before or after the capture), or a driver error.
    pub fn copy_from_device(&self, stream: &Stream, src: BufferView<'_, T>) -> Result<()> {
        self.copy_between_devices(stream, src, false, "copy_from_device")
    }

    /// Like [`BufferView::copy_from_device`], but a copy between two CUDA devices is always
    /// staged through pinned host memory, even where a peer copy is possible: to compare the
    /// two paths, or where peer copies misbehave. Other pairs of devices copy as with
    /// [`BufferView::copy_from_device`].
    ///
    /// The staging buffers (two of a few MiB, page-locked) belong to the destination device
    /// and are allocated at its first staged copy; staged copies into one device take turns
    /// using them.
    ///
    /// # Errors
    ///
    /// As [`BufferView::copy_from_device`].
    pub fn copy_from_device_staged(&self, stream: &Stream, src: BufferView<'_, T>) -> Result<()> {
        self.copy_between_devices(stream, src, true, "copy_from_device_staged")
    }

    fn copy_between_devices(
        &self,
        stream: &Stream,
        src: BufferView<'_, T>,
        force_staged: bool,
        op: &'static str,
    ) -> Result<()> {
        self.mem.check_device(stream, op)?;
        if src.len != self.len {
            return Err(DeviceError::LengthMismatch {
                op,
                expected: self.len,
                found: src.len,
            });
        }
        if src.mem.device == self.mem.device {
            return self.copy_from(stream, src);
        }
        stream.forbid_in_capture(op)?;
        match (&self.mem.backend, &src.mem.backend, stream.backend()) {
            (MemoryBackend::Host(_), MemoryBackend::Host(_), StreamBackend::Host(s)) => {
                let accesses: Accesses<'_> =
                    smallvec![(self.mem, Access::Write), (src.mem, Access::Read)];
                ordered(stream, op, accesses, || {
                    s.copy_device(
                        src.mem.clone(),
                        src.byte_offset(),
                        self.mem.clone(),
                        self.byte_offset(),
                        self.byte_len(),
                    )
                })
            }
            (MemoryBackend::Cuda(d), MemoryBackend::Cuda(sr), StreamBackend::Cuda(s)) => {
                if !force_staged && s.peer_access(sr)? {
                    let accesses: Accesses<'_> =
                        smallvec![(self.mem, Access::Write), (src.mem, Access::Read)];
                    return ordered(stream, op, accesses, || {
                        s.copy_peer(
                            sr,
                            src.byte_offset(),
                            d,
                            self.byte_offset(),
                            self.byte_len(),
                        )
                    });
                }
                let staging = src.mem.device.staging_stream()?;
                let StreamBackend::Cuda(ss) = staging.backend() else {
                    return Err(backend_mismatch(op));
                };
                // The source is read on the staging stream, the destination written on
                // `stream`; `copy_staged` joins the two with events, and the staging stream's
                // reads are recorded before the copy's chunks are enqueued on it.
                ordered(&staging, op, smallvec![(src.mem, Access::Read)], || Ok(()))?;
                stream.order_after(&staging, u64::MAX)?;
                ordered(stream, op, smallvec![(self.mem, Access::Write)], || {
                    cuda::copy_staged(
                        ss,
                        sr,
                        src.byte_offset(),
                        s,
                        d,
                        self.byte_offset(),
                        self.byte_len(),
                    )
                })
            }
            (MemoryBackend::Cuda(d), MemoryBackend::Host(h), StreamBackend::Cuda(s)) => {
                // The GPU cannot wait for the host backend's work: wait for it here, then copy
                // from its storage (the driver has taken the bytes when the call returns).
                src.mem.wait_for_uses()?;
                ordered(stream, op, smallvec![(self.mem, Access::Write)], || {
                    let words = h.read();
                    let bytes: &[u8] = bytemuck::cast_slice(&words[..]);
                    let range = src.byte_offset()..src.byte_offset() + src.byte_len();
                    s.copy_from_host(d, self.byte_offset(), &bytes[range])
                })
            }
            (MemoryBackend::Host(_), MemoryBackend::Cuda(_), StreamBackend::Host(s)) => {
                let reader = src.mem.device.staging_stream()?;
                let mut data = vec![T::zeroed(); src.len];
                src.copy_to_host(&reader, &mut data)?;
                ordered(stream, op, smallvec![(self.mem, Access::Write)], || {
                    s.copy_from_host(
                        self.mem.clone(),
                        self.byte_offset(),
                        bytemuck::cast_slice(&data).to_vec(),
                    )
                })
            }
            _ => Err(backend_mismatch(op)),
        }
    }

    /// Enqueues setting every byte of the view to `value`. Graph-safe.
    ///
    /// # Errors
    ///
    /// A driver error.
    pub fn fill_bytes(&self, stream: &Stream, value: u8) -> Result<()> {
        self.mem.check_device(stream, "fill_bytes")?;
        ordered(
            stream,
            "fill_bytes",
            smallvec![(self.mem, Access::Write)],
            || match (&self.mem.backend, stream.backend()) {
                (MemoryBackend::Host(_), StreamBackend::Host(s)) => {
                    s.fill_bytes(self.mem.clone(), self.byte_offset(), self.byte_len(), value)
                }
                (MemoryBackend::Cuda(m), StreamBackend::Cuda(s)) => {
                    s.fill_bytes(m, self.byte_offset(), self.byte_len(), value)
                }
                _ => Err(backend_mismatch("fill_bytes")),
            },
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

fn backend_mismatch(op: &'static str) -> DeviceError {
    DeviceError::usage(format!(
        "{op}: buffer and stream belong to different backends"
    ))
}

pub(crate) enum PinnedBackend {
    Host(host::HostPinned),
    Cuda(cuda::CudaPinned),
}

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
        let backend = match device.backend() {
            DeviceBackend::Host(_) => PinnedBackend::Host(host::HostPinned::new(bytes)?),
            DeviceBackend::Cuda(c) => PinnedBackend::Cuda(c.alloc_pinned(bytes)?),
        };
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
        let len = self.len;
        PinnedRef(match &self.backend {
            PinnedBackend::Host(h) => PinnedRefInner::Host(MutexGuard::map(h.lock(), move |w| {
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut w[..]);
                bytemuck::cast_slice_mut(&mut bytes[..len * std::mem::size_of::<T>()])
            })),
            PinnedBackend::Cuda(c) => PinnedRefInner::Cuda(bytemuck::cast_slice(
                &c.raw_bytes()[..len * std::mem::size_of::<T>()],
            )),
        })
    }

    /// The contents, mutably.
    pub fn as_mut_slice(&mut self) -> PinnedMut<'_, T> {
        let len = self.len;
        PinnedMut(match &mut self.backend {
            PinnedBackend::Host(h) => PinnedMutInner::Host(MutexGuard::map(h.lock(), move |w| {
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut w[..]);
                bytemuck::cast_slice_mut(&mut bytes[..len * std::mem::size_of::<T>()])
            })),
            PinnedBackend::Cuda(c) => PinnedMutInner::Cuda(bytemuck::cast_slice_mut(
                &mut c.raw_bytes_mut()[..len * std::mem::size_of::<T>()],
            )),
        })
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
        src.mem
            .check_device(stream, "PinnedBuffer::copy_from_device")?;
        stream.forbid_in_capture("PinnedBuffer::copy_from_device")?;
        if src.len != self.len {
            return Err(DeviceError::LengthMismatch {
                op: "PinnedBuffer::copy_from_device",
                expected: self.len,
                found: src.len,
            });
        }
        let mut this = self;
        let byte_len = src.byte_len();
        let op = "PinnedBuffer::copy_from_device";
        ordered(stream, op, smallvec![(src.mem, Access::Read)], || {
            match (&mut this.backend, &src.mem.backend, stream.backend()) {
                (PinnedBackend::Host(p), MemoryBackend::Host(_), StreamBackend::Host(s)) => {
                    s.copy_to_pinned(src.mem.clone(), src.byte_offset(), p, byte_len)
                }
                (PinnedBackend::Cuda(p), MemoryBackend::Cuda(m), StreamBackend::Cuda(s)) => {
                    s.copy_to_pinned(m, src.byte_offset(), p, byte_len)
                }
                _ => Err(pinned_mismatch(&this.device, op, stream)),
            }
        })?;
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
        dst.mem
            .check_device(stream, "PinnedBuffer::copy_to_device")?;
        stream.forbid_in_capture("PinnedBuffer::copy_to_device")?;
        if dst.len != self.len {
            return Err(DeviceError::LengthMismatch {
                op: "PinnedBuffer::copy_to_device",
                expected: dst.len,
                found: self.len,
            });
        }
        let byte_len = dst.byte_len();
        let op = "PinnedBuffer::copy_to_device";
        ordered(stream, op, smallvec![(dst.mem, Access::Write)], || {
            match (&self.backend, &dst.mem.backend, stream.backend()) {
                (PinnedBackend::Host(p), MemoryBackend::Host(_), StreamBackend::Host(s)) => {
                    s.copy_from_pinned(p, dst.mem.clone(), dst.byte_offset(), byte_len)
                }
                (PinnedBackend::Cuda(p), MemoryBackend::Cuda(m), StreamBackend::Cuda(s)) => {
                    s.copy_from_pinned(p, m, dst.byte_offset(), byte_len)
                }
                _ => Err(pinned_mismatch(&self.device, op, stream)),
            }
        })?;
        let event = stream.record_event()?;
        Ok(PinnedTransfer {
            buffer: Some(self),
            event,
        })
    }
}

/// The error for a pinned buffer of one backend used with a stream of the other. (Views are
/// checked against the stream before, so this is the only way backends can differ.)
fn pinned_mismatch(device: &Device, op: &'static str, stream: &Stream) -> DeviceError {
    DeviceError::DeviceMismatch {
        op,
        expected: stream.device().to_string(),
        found: format!("{device} (pinned buffer)"),
    }
}

enum PinnedRefInner<'a, T> {
    Host(MappedMutexGuard<'a, [T]>),
    Cuda(&'a [T]),
}

/// A borrow of a [`PinnedBuffer`]'s contents; dereferences to `[T]`.
pub struct PinnedRef<'a, T>(PinnedRefInner<'a, T>);

impl<T> std::ops::Deref for PinnedRef<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.0 {
            PinnedRefInner::Host(g) => g,
            PinnedRefInner::Cuda(s) => s,
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for PinnedRef<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

enum PinnedMutInner<'a, T> {
    Host(MappedMutexGuard<'a, [T]>),
    Cuda(&'a mut [T]),
}

/// A mutable borrow of a [`PinnedBuffer`]'s contents; dereferences to `[T]`.
pub struct PinnedMut<'a, T>(PinnedMutInner<'a, T>);

impl<T> std::ops::Deref for PinnedMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.0 {
            PinnedMutInner::Host(g) => g,
            PinnedMutInner::Cuda(s) => s,
        }
    }
}

impl<T> std::ops::DerefMut for PinnedMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.0 {
            PinnedMutInner::Host(g) => g,
            PinnedMutInner::Cuda(s) => s,
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for PinnedMut<'_, T> {
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
    event: crate::stream::Event,
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
                eprintln!("cuflow: pinned transfer failed while dropped: {e}");
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

//! Device memory: typed buffers, views, and pinned host buffers.
//!
//! Invariants:
//! - A buffer's memory records every stream that used it (`UseState::uses`). Its free is
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
//!
//! The module is one file per concept: [`Memory`] and its use state here, [`DeviceBuffer`] in
//! `buffer.rs`, [`BufferView`] and its same-device copies in `view.rs`, copies between devices
//! in `copy.rs`, and pinned host memory in `pinned.rs`.

mod buffer;
mod copy;
mod pinned;
mod view;

pub use buffer::DeviceBuffer;
pub use pinned::{PinnedBuffer, PinnedMut, PinnedRef, PinnedTransfer};
pub use view::BufferView;

use smallvec::SmallVec;

use crate::access::{Access, AccessState};
use crate::backend::{cuda, host};
use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::stream::{Stream, StreamBackend};
use crate::sync::{Arc, Mutex, Ordering};

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

pub(crate) fn byte_size<T>(len: usize, op: &'static str) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| DeviceError::InvalidShape {
            op,
            reason: format!("{len} elements overflow the address space"),
        })
}

pub(crate) fn backend_mismatch(op: &'static str) -> DeviceError {
    DeviceError::usage(format!(
        "{op}: buffer and stream belong to different backends"
    ))
}

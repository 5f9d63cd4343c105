//! Device memory: typed buffers, views, and pinned host buffers.
//!
//! Invariants:
//! - A buffer's memory records every stream that used it (`UseState::uses`), less those it
//!   found idle (all their work finished) once it remembered a few. Its free is
//!   stream-ordered after the last use on every one of those streams: the freeing stream waits
//!   on an event of each other stream before `cuMemFreeAsync`. Dropping a buffer whose kernels
//!   are still running is therefore safe and does not block.
//! - Every copy and memset (and, in their modules, every kernel launch, GEMM and graph replay)
//!   orders itself after the conflicting accesses of other streams to its buffers
//!   ([`crate::access`]): a write after earlier reads and writes, a read after the last write.
//! - A host read (`to_host_vec`, `copy_to_host`) is such a read, and then waits: the host never
//!   sees memory that queued work still writes.
//! - One lock guards a buffer's use state (`Memory::state`): the access tracker's lock, from the
//!   [`crate::sync`] shim like the rest of the tracker's core.
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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::access::{forget_idle_when_due, Access, AccessState};
use crate::backend::MemoryBackend;
use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::stream::Stream;
use crate::sync::Mutex;

/// Element types that can live in device memory: plain data with no padding, no pointers and
/// every bit pattern valid (`bytemuck::Pod`), shareable across threads.
pub trait DeviceCopy: bytemuck::Pod + Send + Sync + 'static {}

impl<T: bytemuck::Pod + Send + Sync + 'static> DeviceCopy for T {}

/// A byte range of one allocation: what the backends copy, fill, and hand to kernels and
/// GEMMs.
#[derive(Clone, Copy)]
pub(crate) struct Region<'a> {
    pub(crate) mem: &'a Arc<Memory>,
    /// Bytes from the start of the allocation.
    pub(crate) offset: usize,
    /// Bytes in the range.
    pub(crate) len: usize,
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
    /// Every stream that enqueued work on the buffer, most recent last, less those forgotten
    /// once all their work had finished.
    uses: SmallVec<[Stream; 2]>,
    /// The number of streams at which the next new one makes [`UseState::note_use`] forget the
    /// idle ones (at least [`USES_BEFORE_FORGETTING`](crate::access::USES_BEFORE_FORGETTING)).
    forget_at: usize,
    pub(crate) access: AccessState,
}

impl UseState {
    /// Records that work touching the buffer was enqueued on `stream`.
    ///
    /// A buffer used from ever new streams (a stream per request, over long-lived weights)
    /// would keep every one of them alive: so once it remembers [`USES_BEFORE_FORGETTING`](crate::access::USES_BEFORE_FORGETTING)
    /// streams, and again each time their number doubles, it forgets those whose work has
    /// all finished (their uses of it are over: its free need not wait for them), all but
    /// the most recent. The caller holds the buffer's lock, so no use of it on such a stream
    /// is enqueued meanwhile.
    pub(crate) fn note_use(&mut self, stream: &Stream) {
        if self.uses.last().is_none_or(|s| !s.same(stream)) {
            if let Some(pos) = self.uses.iter().position(|s| s.same(stream)) {
                let s = self.uses.remove(pos);
                self.uses.push(s);
            } else {
                forget_idle_when_due(&mut self.uses, &mut self.forget_at, Stream::is_idle);
                self.uses.push(stream.clone());
            }
        }
    }
}

impl Memory {
    pub(crate) fn alloc(stream: &Stream, bytes: usize) -> Result<Arc<Memory>> {
        // No capture begins on `stream` between the check and the allocation.
        let _gate = stream.enqueue_gate()?;
        let session = stream.capture_session();
        // Another thread's allocation on a capturing stream is made outside the capture too,
        // but is not the graph's to keep.
        let owned_by_capture = session
            .as_ref()
            .is_some_and(|s| s.check_owner("DeviceBuffer::alloc", stream.id()).is_ok());
        // During a capture the allocation is made now, outside the graph, and the graph keeps
        // it (below): every replay finds it at the same address.
        let backend = stream
            .backend()
            .alloc(bytes, stream.device().name(), session.is_some())?;
        let inner = &stream.device().inner;
        let in_use = inner.bytes_in_use.fetch_add(bytes, Ordering::AcqRel) + bytes;
        inner.pool.note_in_use(in_use);
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

    /// Checks that this memory is on `stream`'s device; `what` names it in the error.
    pub(crate) fn check_device(&self, stream: &Stream, op: &'static str, what: &str) -> Result<()> {
        if self.device != *stream.device() {
            return Err(DeviceError::device_mismatch(
                op,
                what,
                stream.device(),
                &self.device,
            ));
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
        let uses = std::mem::take(&mut self.state.lock().uses);
        self.backend.release(uses);
    }
}

/// [`DeviceError::LengthMismatch`] for `op` when `found` elements are given where `expected`
/// are needed.
pub(crate) fn check_len(op: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected != found {
        return Err(DeviceError::LengthMismatch {
            op,
            expected,
            found,
        });
    }
    Ok(())
}

pub(crate) fn byte_size<T>(len: usize, op: &'static str) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| DeviceError::InvalidShape {
            op,
            reason: format!("{len} elements overflow the address space"),
        })
}

//! The backend halves of memory: device allocations (and their stream-ordered frees) and pinned
//! host buffers.

use parking_lot::{MappedMutexGuard, MutexGuard};
use smallvec::SmallVec;

use super::{cuda, foreign, host};
use crate::error::{BackendKind, Result};
use crate::stream::Stream;

/// An allocation's backend half.
pub(crate) enum MemoryBackend {
    Host(host::HostMemory),
    Cuda(cuda::CudaMemory),
}

impl MemoryBackend {
    /// The CUDA allocation, for a stream of the CUDA backend.
    pub(crate) fn cuda(&self) -> Result<&cuda::CudaMemory> {
        match self {
            MemoryBackend::Cuda(m) => Ok(m),
            MemoryBackend::Host(_) => Err(foreign("a buffer", BackendKind::Cuda)),
        }
    }

    /// The host backend's storage, which is host memory; `None` for a CUDA allocation.
    pub(crate) fn host(&self) -> Option<&host::HostMemory> {
        match self {
            MemoryBackend::Host(h) => Some(h),
            MemoryBackend::Cuda(_) => None,
        }
    }

    /// Frees the allocation, whose last owner is gone, in stream order after its `uses`: on
    /// CUDA after the last use on every stream (or, when one of them is capturing, once the
    /// capture has ended: a free ordered after a capturing stream would be recorded into the
    /// graph; or, inside a host function, where the driver refuses it, at the next
    /// synchronization with the device). Host storage is freed with its last reference; queued
    /// host work holds one.
    pub(crate) fn release(&mut self, uses: SmallVec<[Stream; 2]>) {
        let MemoryBackend::Cuda(mem) = self else {
            return;
        };
        let free = DeferredFree {
            mem: mem.take(),
            uses,
        };
        free.release();
    }
}

/// A CUDA free, held back while a capture records or until a host function has returned (see
/// [`MemoryBackend::release`]).
pub(crate) struct DeferredFree {
    mem: cuda::CudaMemory,
    uses: SmallVec<[Stream; 2]>,
}

impl DeferredFree {
    /// Frees the memory after its uses now, or holds the free back: until the capture ends
    /// while one of the streams is capturing, until the next synchronization with the device
    /// inside a host function.
    ///
    /// The capture gate of every use stream is held from the check through the free's enqueue,
    /// so that no capture begins on one of them in between (it would record the free into its
    /// graph).
    pub(crate) fn release(self) {
        if cuda::in_host_function() {
            let shared = self.mem.shared().clone();
            shared.defer_host_fn_drop(cuda::HostFnDrop::Memory(self));
            return;
        }
        let mut free = self;
        loop {
            let session = {
                let _gates: SmallVec<[_; 2]> = free.uses.iter().map(Stream::hold_gate).collect();
                match free.uses.iter().find_map(|s| s.capture_session()) {
                    Some(session) => session,
                    None => {
                        free.mem.free_after_uses(&free.uses);
                        return;
                    }
                }
            };
            // A capture that ended since the check has run its held frees already: it hands
            // this one back, and the streams are checked again.
            match session.defer_free(free) {
                Some(back) => free = back,
                None => return,
            }
        }
    }
}

/// Pinned host memory's backend half.
pub(crate) enum PinnedBackend {
    Host(host::HostPinned),
    Cuda(cuda::CudaPinned),
}

impl PinnedBackend {
    /// The bytes (on the host backend, locked against the stream worker while borrowed).
    pub(crate) fn bytes(&self) -> PinnedBytes<'_> {
        match self {
            PinnedBackend::Host(h) => PinnedBytes::Host(MutexGuard::map(h.lock(), |w| {
                bytemuck::cast_slice_mut(&mut w[..])
            })),
            PinnedBackend::Cuda(c) => PinnedBytes::Cuda(c.raw_bytes()),
        }
    }

    /// The bytes, mutably.
    pub(crate) fn bytes_mut(&mut self) -> PinnedBytesMut<'_> {
        match self {
            PinnedBackend::Host(h) => PinnedBytesMut::Host(MutexGuard::map(h.lock(), |w| {
                bytemuck::cast_slice_mut(&mut w[..])
            })),
            PinnedBackend::Cuda(c) => PinnedBytesMut::Cuda(c.raw_bytes_mut()),
        }
    }
}

/// A borrow of a pinned buffer's bytes.
pub(crate) enum PinnedBytes<'a> {
    Host(MappedMutexGuard<'a, [u8]>),
    Cuda(&'a [u8]),
}

impl std::ops::Deref for PinnedBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            PinnedBytes::Host(g) => g,
            PinnedBytes::Cuda(s) => s,
        }
    }
}

/// A mutable borrow of a pinned buffer's bytes.
pub(crate) enum PinnedBytesMut<'a> {
    Host(MappedMutexGuard<'a, [u8]>),
    Cuda(&'a mut [u8]),
}

impl std::ops::Deref for PinnedBytesMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            PinnedBytesMut::Host(g) => g,
            PinnedBytesMut::Cuda(s) => s,
        }
    }
}

impl std::ops::DerefMut for PinnedBytesMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            PinnedBytesMut::Host(g) => g,
            PinnedBytesMut::Cuda(s) => s,
        }
    }
}

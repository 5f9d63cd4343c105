//! A stream's backend half: every operation enqueued on a stream is dispatched here, with the
//! buffers, pinned buffers, events, graphs and kernels it uses resolved against the stream's
//! backend.

use std::sync::Arc;

use super::{
    cuda, foreign, host, CaptureBackend, EventBackend, GraphBackend, KernelCode, MemoryBackend,
    PinnedBackend,
};
use crate::blas::{GemmConfig, GemmDtype};
use crate::capture::CaptureSession;
use crate::error::{BackendKind, Result};
use crate::event::Event;
use crate::kernel::{KernelArgs, LaunchConfig};
use crate::memory::{Memory, Region};

/// A stream's backend half: every operation enqueued on a stream is dispatched here.
pub(crate) enum StreamBackend {
    Host(host::HostStream),
    Cuda(cuda::CudaStreamHandle),
}

/// A synchronization begun by [`StreamBackend::begin_synchronize`].
pub(crate) enum SyncWait {
    Host(host::HostSyncWait),
    Cuda(cuda::CudaSyncWait),
}

impl SyncWait {
    /// Blocks until the work before the synchronization began has finished; the first error
    /// the stream's work hit, if any.
    pub(crate) fn wait(self) -> Result<()> {
        match self {
            SyncWait::Host(h) => h.wait(),
            SyncWait::Cuda(c) => c.wait(),
        }
    }

    /// Whether the work before the synchronization has finished, without waiting (`false`
    /// where that cannot be known now: [`SyncWait::wait`] then tells).
    pub(crate) fn is_done(&self) -> bool {
        match self {
            SyncWait::Host(h) => h.is_done(),
            SyncWait::Cuda(c) => c.is_done(),
        }
    }

    /// The first error of the stream's work, of a synchronization that [`SyncWait::is_done`]
    /// found finished: nothing is waited for and no memory released, so that it may be called
    /// with locks of the runtime held.
    pub(crate) fn done_result(self) -> Result<()> {
        match self {
            SyncWait::Host(h) => h.done_result(),
            SyncWait::Cuda(c) => c.done_result(),
        }
    }
}

/// What is left of a stream whose last handle was dropped (see [`StreamBackend::retire`]): its
/// unfinished work, or the failure of its finished work that nothing reported.
pub(crate) enum Retired {
    Pending(SyncWait),
    Failed(crate::error::DeviceError),
}

/// Host bytes made ready for a copy into a device by [`StreamBackend::stage_from_host`].
pub(crate) enum Upload<'a> {
    /// Copied from where they are when the copy is enqueued (the host backend copies them
    /// then; the CUDA driver stages them itself).
    Direct(&'a [u8]),
    /// Copied into page-locked memory of a CUDA device's.
    Staged(cuda::StagedUpload),
}

/// A copy to the host begun by [`StreamBackend::begin_copy_to_host`].
pub(crate) enum CopyToHost {
    /// The copy is enqueued on a host stream.
    Host(host::HostCopyToHost),
    /// The copy is enqueued on a CUDA stream.
    Cuda(cuda::CudaCopyToHost),
}

impl CopyToHost {
    /// Waits for the copy and puts what it read in `out` (the destination it was begun with);
    /// the first error the stream's work hit, if any (`out` is then left as it was).
    pub(crate) fn finish(self, out: &mut [u8]) -> Result<()> {
        match self {
            CopyToHost::Host(h) => h.finish(out),
            CopyToHost::Cuda(c) => c.finish(out),
        }
    }
}

impl StreamBackend {
    pub(super) fn kind(&self) -> BackendKind {
        match self {
            StreamBackend::Host(_) => BackendKind::Host,
            StreamBackend::Cuda(_) => BackendKind::Cuda,
        }
    }

    /// The CUDA stream, for the CUDA backend's own use (frees, staged copies); `None` on the
    /// host.
    pub(crate) fn cuda(&self) -> Option<&cuda::CudaStreamHandle> {
        match self {
            StreamBackend::Host(_) => None,
            StreamBackend::Cuda(c) => Some(c),
        }
    }

    pub(crate) fn record_event(&self, timed: bool) -> Result<EventBackend> {
        match self {
            StreamBackend::Host(h) => Ok(EventBackend::Host(h.record_event(timed)?)),
            StreamBackend::Cuda(c) => Ok(EventBackend::Cuda(c.record_event(timed)?)),
        }
    }

    /// Makes later work on this stream wait for `event`, which may be of the other backend: a
    /// host stream then waits for a CUDA event on its worker thread, without blocking the
    /// caller; a CUDA stream cannot wait for the host backend's work by itself, so the caller
    /// waits until the host event has completed.
    pub(crate) fn wait_event(&self, event: &Event) -> Result<()> {
        match (self, &event.inner.backend) {
            (StreamBackend::Host(s), EventBackend::Host(e)) => s.wait_event(e),
            (StreamBackend::Cuda(s), EventBackend::Cuda(e)) => s.wait_event(e),
            (StreamBackend::Host(s), EventBackend::Cuda(_)) => {
                let event = event.clone();
                s.enqueue(
                    Arc::new(move || event.synchronize()),
                    host::HostNodeKind::EventWait,
                    || "wait for a CUDA event".into(),
                )
            }
            (StreamBackend::Cuda(_), EventBackend::Host(_)) => event.synchronize(),
        }
    }

    /// Starts a synchronization: marks the end of the work enqueued so far, which
    /// [`SyncWait::wait`] then waits for. The caller checks, under the stream's capture gate,
    /// that the stream is not capturing, and may let the gate go before waiting.
    pub(crate) fn begin_synchronize(&self) -> Result<SyncWait> {
        match self {
            StreamBackend::Host(h) => Ok(SyncWait::Host(h.begin_synchronize()?)),
            StreamBackend::Cuda(c) => Ok(SyncWait::Cuda(c.begin_synchronize()?)),
        }
    }

    /// What `Device::synchronize` still has to wait for or report of this stream, whose last
    /// handle is being dropped: a synchronization of its unfinished work, or the failure its
    /// finished work left in the stream's own error slot; `None` when there is neither, or
    /// where nothing can be enqueued now (inside a CUDA host function). Never blocks. The
    /// caller saw the stream not capturing.
    pub(crate) fn retire(&self) -> Option<Retired> {
        match self {
            StreamBackend::Host(h) => h.retire(),
            StreamBackend::Cuda(c) => c.retire(),
        }
    }

    /// Whether all the work enqueued on the stream so far has finished, without waiting. The
    /// caller holds the stream's capture gate and saw it not capturing.
    pub(crate) fn is_idle(&self) -> Result<bool> {
        match self {
            StreamBackend::Host(h) => Ok(h.is_idle()),
            StreamBackend::Cuda(c) => c.is_idle(),
        }
    }

    /// Enqueues a host closure, in order with the stream's device work.
    pub(crate) fn enqueue_host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        match self {
            StreamBackend::Host(h) => h.enqueue_once(f),
            StreamBackend::Cuda(c) => c.launch_host_fn(f),
        }
    }

    pub(crate) fn begin_capture(&self) -> Result<CaptureBackend> {
        match self {
            StreamBackend::Host(h) => h.begin_capture(),
            StreamBackend::Cuda(c) => c.begin_capture(),
        }
    }

    /// Makes this stream record into `session`'s capture from now on. A CUDA stream joins
    /// by itself when it waits on an event of the capture, so only host streams act here.
    pub(crate) fn join_capture(&self, session: &CaptureSession) -> Result<()> {
        match self {
            StreamBackend::Host(h) => h.join_capture(session),
            StreamBackend::Cuda(c) => {
                if let CaptureBackend::Cuda(events) = &session.backend {
                    c.join_capture(events);
                }
                Ok(())
            }
        }
    }

    /// Ends the capture this stream began.
    pub(crate) fn end_capture(&self, session: &CaptureSession) -> Result<GraphBackend> {
        match self {
            StreamBackend::Host(h) => h.end_capture(session),
            StreamBackend::Cuda(c) => match &session.backend {
                CaptureBackend::Cuda(events) => c.end_capture(events),
                CaptureBackend::Host(_) => Err(crate::error::DeviceError::usage(
                    "Stream::end_capture: a CUDA stream cannot end a capture of the host backend",
                )),
            },
        }
    }

    /// Makes a stream that took part in a capture run its work again (the CUDA driver does
    /// this by itself when the capture ends).
    pub(crate) fn leave_capture(&self) {
        match self {
            StreamBackend::Host(h) => h.leave_capture(),
            StreamBackend::Cuda(c) => c.leave_capture(),
        }
    }

    /// Allocates `bytes` for work on this stream; during a capture (`capturing`) the
    /// allocation is made at once, outside the graph.
    pub(crate) fn alloc(
        &self,
        bytes: usize,
        device_name: &str,
        capturing: bool,
    ) -> Result<MemoryBackend> {
        match self {
            StreamBackend::Host(_) => Ok(MemoryBackend::Host(host::HostMemory::alloc(
                bytes,
                device_name,
            )?)),
            // During a capture the allocation is made now, outside the graph, which keeps it:
            // every replay finds it at the same address.
            StreamBackend::Cuda(s) if capturing => {
                Ok(MemoryBackend::Cuda(s.alloc_outside_capture(bytes)?))
            }
            StreamBackend::Cuda(s) => Ok(MemoryBackend::Cuda(s.alloc(bytes)?)),
        }
    }

    /// Enqueues a copy of `data` into `dst`; `data` may be dropped as soon as this returns.
    pub(crate) fn copy_from_host(&self, dst: Region<'_>, data: &[u8]) -> Result<()> {
        let staged = self.stage_from_host(data)?;
        self.upload(dst, staged)
    }

    /// Makes `data` ready for a copy into this stream's device by [`StreamBackend::upload`]:
    /// on CUDA, the bytes are copied into page-locked memory of the device's here (where its
    /// staging pool has room), so that enqueuing the copy later never waits for the stream's
    /// earlier work (the driver may wait before it returns from a copy out of pageable
    /// memory). Called before the destination's access state is locked.
    pub(crate) fn stage_from_host<'a>(&self, data: &'a [u8]) -> Result<Upload<'a>> {
        match self {
            StreamBackend::Cuda(s) => Ok(match s.stage_from_host(data)? {
                Some(staged) => Upload::Staged(staged),
                None => Upload::Direct(data),
            }),
            StreamBackend::Host(_) => Ok(Upload::Direct(data)),
        }
    }

    /// Enqueues the copy of `up` (made by [`StreamBackend::stage_from_host`] of this stream)
    /// into `dst`.
    pub(crate) fn upload(&self, dst: Region<'_>, up: Upload<'_>) -> Result<()> {
        match (self, up) {
            (StreamBackend::Host(s), Upload::Direct(data)) => {
                s.copy_from_host(dst.mem.clone(), dst.offset, data.to_vec())
            }
            (StreamBackend::Cuda(s), Upload::Direct(data)) => {
                s.copy_from_host(dst.mem.backend.cuda()?, dst.offset, data)
            }
            (StreamBackend::Cuda(s), Upload::Staged(staged)) => {
                s.copy_staged_from_host(dst.mem.backend.cuda()?, dst.offset, staged)
            }
            (StreamBackend::Host(_), Upload::Staged(_)) => Err(crate::DeviceError::internal(
                "bytes staged for a CUDA device were copied on a host stream",
            )),
        }
    }

    /// Begins a copy of `src` into `out` after the work enqueued so far; the copy has landed in
    /// `out` once [`CopyToHost::finish`] returned `Ok`. The copy is only enqueued here, and
    /// waited for by `finish`: the caller lets the buffer's access state and the stream's
    /// capture gate go in between, so that the stream's work before the copy (a host function
    /// waiting for another thread that writes the buffer; on the host backend, one enqueuing
    /// work on the buffer itself) can take them. On CUDA a copy that the device's staging
    /// pool has no room for is made, and waited for, here (see
    /// `CudaStreamHandle::begin_copy_to_host`).
    pub(crate) fn begin_copy_to_host(&self, src: Region<'_>, out: &mut [u8]) -> Result<CopyToHost> {
        match self {
            StreamBackend::Host(s) => Ok(CopyToHost::Host(s.begin_copy_to_host(
                src.mem.clone(),
                src.offset,
                out.len(),
            )?)),
            StreamBackend::Cuda(s) => Ok(CopyToHost::Cuda(s.begin_copy_to_host(
                src.mem.backend.cuda()?,
                src.offset,
                out,
            )?)),
        }
    }

    /// Enqueues a copy of `src` into `dst` (same length, of this stream's device); `src` is of
    /// this device, or of another device of this backend that this stream reads directly
    /// (see [`StreamBackend::copies_directly_from`]).
    pub(crate) fn copy_device(&self, src: Region<'_>, dst: Region<'_>) -> Result<()> {
        match self {
            StreamBackend::Host(s) => s.copy_device(
                src.mem.clone(),
                src.offset,
                dst.mem.clone(),
                dst.offset,
                dst.len,
            ),
            StreamBackend::Cuda(s) => s.copy_device(
                src.mem.backend.cuda()?,
                src.offset,
                dst.mem.backend.cuda()?,
                dst.offset,
                dst.len,
            ),
        }
    }

    /// Enqueues setting every byte of `dst` to `value`.
    pub(crate) fn fill_bytes(&self, dst: Region<'_>, value: u8) -> Result<()> {
        match self {
            StreamBackend::Host(s) => s.fill_bytes(dst.mem.clone(), dst.offset, dst.len, value),
            StreamBackend::Cuda(s) => {
                s.fill_bytes(dst.mem.backend.cuda()?, dst.offset, dst.len, value)
            }
        }
    }

    /// Whether this stream copies from `src`, a buffer of another device of its backend,
    /// directly: always between host devices (one address space); between CUDA devices when
    /// this stream's device reads `src`'s directly (enabling the access at the first call) and
    /// `force_staged` is not set. Otherwise the copy is staged ([`StreamBackend::copy_staged`]).
    pub(crate) fn copies_directly_from(&self, src: &Memory, force_staged: bool) -> Result<bool> {
        match self {
            StreamBackend::Host(_) => Ok(true),
            StreamBackend::Cuda(s) => Ok(!force_staged && s.peer_access(src.backend.cuda()?)?),
        }
    }

    /// Enqueues a copy of `src` into `dst` (of this stream's device) staged through pinned
    /// host memory: read on `staging`, a stream of `src`'s device, written on this stream.
    /// Only CUDA devices stage their copies.
    pub(crate) fn copy_staged(
        &self,
        staging: &StreamBackend,
        src: Region<'_>,
        dst: Region<'_>,
    ) -> Result<()> {
        let (StreamBackend::Cuda(s), Some(ss)) = (self, staging.cuda()) else {
            return Err(foreign("a staged copy", self.kind()));
        };
        cuda::copy_staged(
            ss,
            src.mem.backend.cuda()?,
            src.offset,
            s,
            dst.mem.backend.cuda()?,
            dst.offset,
            dst.len,
        )
    }

    /// Enqueues a copy of `src` into the first `src.len` bytes of `pinned`.
    pub(crate) fn copy_to_pinned(&self, src: Region<'_>, pinned: &mut PinnedBackend) -> Result<()> {
        match (self, pinned) {
            (StreamBackend::Host(s), PinnedBackend::Host(p)) => {
                s.copy_to_pinned(src.mem.clone(), src.offset, p, src.len)
            }
            (StreamBackend::Cuda(s), PinnedBackend::Cuda(p)) => {
                s.copy_to_pinned(src.mem.backend.cuda()?, src.offset, p, src.len)
            }
            _ => Err(foreign("a pinned buffer", self.kind())),
        }
    }

    /// Enqueues a copy of the first `dst.len` bytes of `pinned` into `dst`.
    pub(crate) fn copy_from_pinned(&self, pinned: &PinnedBackend, dst: Region<'_>) -> Result<()> {
        match (self, pinned) {
            (StreamBackend::Host(s), PinnedBackend::Host(p)) => {
                s.copy_from_pinned(p, dst.mem.clone(), dst.offset, dst.len)
            }
            (StreamBackend::Cuda(s), PinnedBackend::Cuda(p)) => {
                s.copy_from_pinned(p, dst.mem.backend.cuda()?, dst.offset, dst.len)
            }
            _ => Err(foreign("a pinned buffer", self.kind())),
        }
    }

    /// Enqueues a launch of `code` (what runs kernel `name` on this stream's device).
    pub(crate) fn launch_kernel(
        &self,
        code: &KernelCode<'_>,
        name: &Arc<str>,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        match (self, code) {
            (StreamBackend::Host(s), KernelCode::Host(f)) => {
                host::launch_host_kernel(s, name, Arc::clone(f), config, args)
            }
            (StreamBackend::Cuda(s), KernelCode::Cuda(k)) => s.launch(k, config, args),
            _ => Err(foreign("a kernel", self.kind())),
        }
    }

    /// Enqueues `C = alpha · op(A) · op(B) + beta · C` (shapes already validated). During a
    /// capture, `captured_workspace` is `Some` with the cuBLAS workspace the capture gave this
    /// stream, if any (see `crate::blas::capture_workspace`).
    pub(crate) fn gemm(
        &self,
        dtype: (GemmDtype, GemmDtype),
        cfg: &GemmConfig,
        [a, b, c]: [Region<'_>; 3],
        captured_workspace: Option<Option<&Arc<Memory>>>,
    ) -> Result<()> {
        match self {
            StreamBackend::Host(s) => {
                let operand =
                    |r: Region<'_>| host::GemmOperand::new(r.mem.clone(), r.offset, r.len);
                host::gemm(s, dtype, *cfg, operand(a), operand(b), operand(c))
            }
            StreamBackend::Cuda(s) => {
                let ptr = |r: Region<'_>| -> Result<u64> {
                    Ok(r.mem.backend.cuda()?.ptr() + r.offset as u64)
                };
                let (pa, pb, pc) = (ptr(a)?, ptr(b)?, ptr(c)?);
                let workspace = match captured_workspace {
                    // Captured: the capture's own workspace for this stream, which the graph
                    // keeps, or none when cuBLAS was first used in this capture.
                    Some(Some(mem)) => cuda::BlasWorkspace::Borrowed {
                        ptr: mem.backend.cuda()?.ptr(),
                        bytes: mem.bytes,
                    },
                    Some(None) => cuda::BlasWorkspace::None,
                    None => cuda::BlasWorkspace::Stream,
                };
                s.gemm(dtype, cfg, pa, pb, pc, workspace)
            }
        }
    }

    /// The size of the cuBLAS workspace a capture gives this stream; `None` on the host and
    /// where no GEMM ran yet.
    pub(crate) fn blas_capture_workspace_bytes(&self) -> Option<usize> {
        self.cuda()?.blas_capture_workspace_bytes()
    }
}

//! CUDA streams and events, and the work enqueued on streams: copies, memsets, kernel
//! launches, host functions and capture.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaStream, DriverError};
use parking_lot::Mutex;
use smallvec::SmallVec;

use super::capture::{CapturedEvents, CudaGraphHandle};
use super::host_copy::copy_host_bytes;
use super::kernel::CompiledKernel;
use super::memory::{CudaMemory, CudaPinned, HostStaging};
use super::{driver_err, CudaDeviceShared, RawEvent, HOST_STAGED_COPY_MAX, HOST_STAGING_PIECE};
use crate::backend::stream::{Retired, SyncWait};
use crate::backend::{CaptureBackend, GraphBackend};
use crate::error::{DeviceError, Result};
use crate::kernel::{KernelArg, KernelArgs, LaunchConfig};
use crate::scope::ErrorSink;

/// A CUDA stream (non-blocking with respect to the legacy default stream).
pub(crate) struct CudaStreamHandle {
    /// Dropped in `Drop`, unless the context was reset (then the driver destroyed it).
    pub(crate) stream: ManuallyDrop<Arc<CudaStream>>,
    pub(crate) shared: Arc<CudaDeviceShared>,
    /// The cuBLAS workspace of this stream's GEMMs outside captures, allocated on the stream at
    /// its first GEMM and freed on it when the stream is dropped (see `blas`).
    pub(crate) blas_workspace: Mutex<Option<CudaMemory>>,
    /// The panic of a host function that ran on this stream outside any error scope, reported
    /// by the next synchronization (as the host backend does): never swallowed, never unwound
    /// into the driver's thread. Inside a scope, the panic goes to the scope (see
    /// [`crate::scope`]).
    host_fn_panic: Arc<Mutex<Option<DeviceError>>>,
    /// While the stream takes part in a capture: where the events recorded on it go when
    /// dropped (see [`CapturedEvents`]). `in_capture` says whether it is set, so that eager
    /// records do not take the lock.
    capture_events: Mutex<Option<Arc<CapturedEvents>>>,
    in_capture: AtomicBool,
}

impl CudaStreamHandle {
    pub(crate) fn new(
        shared: &Arc<CudaDeviceShared>,
        priority: Option<i32>,
    ) -> Result<(CudaStreamHandle, i32)> {
        let _bound = shared.bind()?;
        let (stream, prio) = match priority {
            None => (
                shared
                    .ctx
                    .new_stream()
                    .map_err(|e| driver_err("cuStreamCreate", e))?,
                0,
            ),
            Some(p) => {
                let (least, greatest) = result::stream::get_priority_range()
                    .map_err(|e| driver_err("cuCtxGetStreamPriorityRange", e))?;
                let p = p.clamp(greatest.min(least), greatest.max(least));
                (
                    shared
                        .ctx
                        .new_stream_with_priority(p)
                        .map_err(|e| driver_err("cuStreamCreateWithPriority", e))?,
                    p,
                )
            }
        };
        Ok((
            CudaStreamHandle {
                stream: ManuallyDrop::new(stream),
                shared: shared.clone(),
                blas_workspace: Mutex::new(None),
                host_fn_panic: Arc::new(Mutex::new(None)),
                capture_events: Mutex::new(None),
                in_capture: AtomicBool::new(false),
            },
            prio,
        ))
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    pub(crate) fn record_event(&self, timed: bool) -> Result<CudaEventHandle> {
        let ev = if timed {
            let _bound = self.shared.bind()?;
            RawEvent(
                result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                    .map_err(|e| driver_err("cuEventCreate", e))?,
            )
        } else {
            self.shared.take_event()?
        };
        let captured = if self.in_capture.load(Ordering::Acquire) {
            self.capture_events.lock().clone()
        } else {
            None
        };
        let handle = CudaEventHandle {
            ev: Some(ev),
            timed,
            shared: self.shared.clone(),
            captured,
        };
        let _bound = self.shared.bind()?;
        // SAFETY: the event and the stream are alive and belong to this context (Context).
        unsafe { result::event::record(handle.raw(), self.raw()) }
            .map_err(|e| driver_err("cuEventRecord", e))?;
        Ok(handle)
    }

    pub(crate) fn wait_event(&self, event: &CudaEventHandle) -> Result<()> {
        let _bound = self.shared.bind()?;
        // SAFETY: stream and event are alive (each handle keeps its context and owns its raw
        // handle); waiting on an event of another device's context is allowed by the driver.
        unsafe {
            result::stream::wait_event(
                self.raw(),
                event.raw(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| driver_err("cuStreamWaitEvent", e))
    }

    /// Whether all the work enqueued on the stream has finished (`cuStreamQuery`). The caller
    /// holds the stream's capture gate and saw it not capturing: the driver refuses the query
    /// of a capturing stream and invalidates its capture.
    pub(crate) fn is_idle(&self) -> Result<bool> {
        let _bound = self.shared.bind()?;
        // SAFETY: the stream is alive (owned by `self.stream`) and not capturing (above).
        match unsafe { sys::cuStreamQuery(self.raw()) }.result() {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(driver_err("cuStreamQuery", e)),
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        let _bound = self.shared.bind()?;
        // SAFETY: the stream is alive (owned by `self.stream`).
        unsafe { result::stream::synchronize(self.raw()) }
            .map_err(|e| driver_err("cuStreamSynchronize", e))?;
        self.error_sink().sync_result()
    }

    /// Where a failure of the work enqueued now on this stream, found after it was enqueued,
    /// is reported: the calling thread's error scope, or the stream's own slot.
    pub(crate) fn error_sink(&self) -> ErrorSink {
        ErrorSink::here(&self.host_fn_panic)
    }

    /// Records the event a synchronization waits for (`cuStreamSynchronize` would wait in the
    /// call, with no point at which the caller may let go of the capture gate).
    pub(crate) fn begin_synchronize(&self) -> Result<CudaSyncWait> {
        Ok(CudaSyncWait {
            event: self.record_event(false)?,
            sink: self.error_sink(),
        })
    }

    /// See [`StreamBackend::retire`](crate::backend::StreamBackend::retire): nothing inside a
    /// host function, where the driver refuses every call; else an event after the stream's
    /// work, whose wait reports the stream's own slot whatever scope the dropping thread is in.
    pub(crate) fn retire(&self) -> Option<Retired> {
        if super::in_host_function() {
            return None;
        }
        // A query the driver refuses (a faulted context) leaves nothing to wait for: later
        // calls report the fault.
        if self.is_idle().ok()? {
            return self.host_fn_panic.lock().take().map(Retired::Failed);
        }
        let event = self.record_event(false).ok()?;
        Some(Retired::Pending(SyncWait::Cuda(CudaSyncWait {
            event,
            sink: ErrorSink::of_stream(&self.host_fn_panic),
        })))
    }

    pub(crate) fn begin_capture(&self) -> Result<CaptureBackend> {
        let _bound = self.shared.bind()?;
        // SAFETY: the stream is alive and not capturing (the runtime checked its capture slot).
        // Relaxed mode: the runtime itself refuses the operations that cannot be captured
        // (host waits), makes allocations outside the capture on a stream that never captures
        // (which relaxed mode allows), and other work of the process (including loading a
        // kernel compiled for the first time during the capture) must not be refused meanwhile.
        unsafe {
            result::stream::begin_capture(
                self.raw(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .map_err(|e| capture_err("Stream::begin_capture", e))?;
        let events = CapturedEvents::new(self.shared.clone());
        self.join_capture(&events);
        Ok(CaptureBackend::Cuda(events))
    }

    /// Makes the events recorded on this stream from now on those of the capture that owns
    /// `events` (this stream began it, or joined it).
    pub(crate) fn join_capture(&self, events: &Arc<CapturedEvents>) {
        *self.capture_events.lock() = Some(events.clone());
        self.in_capture.store(true, Ordering::Release);
    }

    /// The events of the capture this stream takes part in, if any (see
    /// [`CudaStreamHandle::join_capture`]).
    pub(crate) fn capture_events(&self) -> Option<Arc<CapturedEvents>> {
        if !self.in_capture.load(Ordering::Acquire) {
            return None;
        }
        self.capture_events.lock().clone()
    }

    /// Ends [`CudaStreamHandle::join_capture`]: events recorded from now on are eager ones.
    pub(crate) fn leave_capture(&self) {
        self.in_capture.store(false, Ordering::Release);
        *self.capture_events.lock() = None;
    }

    /// Ends the capture this stream began; `events` are those of its capture.
    pub(crate) fn end_capture(&self, events: &Arc<CapturedEvents>) -> Result<GraphBackend> {
        let _bound = self.shared.bind()?;
        // SAFETY: the stream is alive and began a capture (the runtime checked it is the
        // origin of an open capture session).
        let graph = unsafe { result::stream::end_capture(self.raw()) }
            .map_err(|e| capture_err("Stream::end_capture", e))?;
        if graph.is_null() {
            return Err(DeviceError::Capture {
                op: "Stream::end_capture".into(),
                reason: "the driver returned no graph".into(),
            });
        }
        Ok(GraphBackend::Cuda(CudaGraphHandle::new(
            graph,
            self.shared.clone(),
            events.clone(),
        )))
    }

    pub(crate) fn launch_host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        let sink = self.error_sink();
        let f: Box<dyn FnOnce() + Send> = Box::new(move || {
            // The user's code, and the drops of what it owns, run in the scope: a call into
            // the device there is refused with a clear error, before it reaches the driver.
            let scope = super::HostFnScope::enter();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            drop(scope);
            if let Err(p) = outcome {
                sink.record(DeviceError::from_panic("a host function", &*p));
            }
        });
        unsafe extern "C" fn trampoline(data: *mut c_void) {
            // SAFETY: `data` came from `Box::into_raw` below and the driver calls the host
            // function exactly once, so ownership is taken back exactly once.
            let f = unsafe { Box::from_raw(data as *mut Box<dyn FnOnce() + Send>) };
            // A panic must not unwind into the driver's thread.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        }
        let data = Box::into_raw(Box::new(f)) as *mut c_void;
        let _bound = self.shared.bind()?;
        // SAFETY: the stream is alive; `trampoline` matches the driver's callback signature and
        // frees `data` when it runs.
        let r = unsafe { result::stream::launch_host_function(self.raw(), trampoline, data) };
        if let Err(e) = r {
            // SAFETY: the launch failed, so the driver never took `data`; reclaim it once.
            drop(unsafe { Box::from_raw(data as *mut Box<dyn FnOnce() + Send>) });
            return Err(driver_err("cuLaunchHostFunc", e));
        }
        Ok(())
    }

    /// Enqueues a copy or memset of `len` bytes on this stream: nothing when `len` is 0, else
    /// `call` (given the raw stream) with this device's context bound, its error reported as
    /// the driver call `name`.
    pub(super) fn enqueue_bytes(
        &self,
        name: &'static str,
        len: usize,
        call: impl FnOnce(sys::CUstream) -> std::result::Result<(), DriverError>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let _bound = self.shared.bind()?;
        call(self.raw()).map_err(|e| driver_err(name, e))
    }

    pub(crate) fn alloc(&self, bytes: usize) -> Result<CudaMemory> {
        CudaMemory::alloc(self, bytes)
    }

    pub(crate) fn alloc_outside_capture(&self, bytes: usize) -> Result<CudaMemory> {
        CudaMemory::alloc_outside_capture(self, bytes)
    }

    /// Enqueues a copy of `data` into `dst` from `offset`, from where `data` is (pageable
    /// memory, which the driver stages itself: it may wait for the stream's earlier work
    /// before it returns).
    pub(crate) fn copy_from_host(
        &self,
        dst: &CudaMemory,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        self.enqueue_bytes("cuMemcpyHtoDAsync", data.len(), |stream| {
            // SAFETY: `dst` holds at least `offset + data.len()` bytes (the view was
            // bounds-checked) and is alive; for pageable `data` the driver stages it before
            // returning, so `data` may be dropped afterwards.
            unsafe { result::memcpy_htod_async(dst.ptr() + offset as u64, data, stream) }
        })
    }

    /// Copies `data` into page-locked memory of the device's, for a copy into the device
    /// made by [`CudaStreamHandle::copy_staged_from_host`]: `None` when `data` is empty,
    /// longer than the largest copy staged ([`HOST_STAGED_COPY_MAX`]), or when its staging
    /// buffers cannot be had (all in use, or an allocation failed; the driver stages it then,
    /// see `copy_from_host`). Called before the destination's access state is locked, so that
    /// taking or allocating staging buffers waits for no one while the buffer's ordering is
    /// held.
    pub(crate) fn stage_from_host(&self, data: &[u8]) -> Result<Option<StagedUpload>> {
        if data.is_empty() || data.len() > HOST_STAGED_COPY_MAX {
            return Ok(None);
        }
        super::refuse_in_host_function()?;
        let Some(mut pieces) = self.shared.take_host_staging_pieces(data.len()) else {
            return Ok(None);
        };
        let copied = copy_host_bytes(
            pieces
                .iter_mut()
                .zip(data.chunks(HOST_STAGING_PIECE))
                .map(|(piece, bytes)| (piece.head_mut(bytes.len()), bytes))
                .collect(),
        );
        if let Err(e) = copied {
            self.shared.give_back_host_staging(pieces);
            return Err(e);
        }
        Ok(Some(StagedUpload {
            pieces,
            len: data.len(),
            shared: self.shared.clone(),
        }))
    }

    /// Enqueues the copies of `staged` into `dst` from `offset`: from page-locked memory, so
    /// the driver never waits for the stream's earlier work here. The staging buffers go back
    /// to the device once an event recorded after the copies has completed.
    pub(crate) fn copy_staged_from_host(
        &self,
        dst: &CudaMemory,
        offset: usize,
        mut staged: StagedUpload,
    ) -> Result<()> {
        let len = staged.len;
        let mut pieces = std::mem::take(&mut staged.pieces);
        if !pieces_fit(&pieces, len) {
            self.shared.give_back_host_staging(pieces);
            return Err(short_staging());
        }
        let (enqueued, any) = each_piece(&mut pieces, len, |piece, at, n| {
            self.enqueue_bytes("cuMemcpyHtoDAsync", n, |stream| {
                // SAFETY: `dst` holds at least `offset + len` bytes (the view was
                // bounds-checked) and is alive, and `at + n <= len`; the staging buffer holds
                // `n` page-locked bytes, which nothing writes, reuses nor frees before the
                // event recorded after these copies completed (`park_upload`) or the stream
                // was waited for.
                unsafe {
                    result::memcpy_htod_async(
                        dst.ptr() + (offset + at) as u64,
                        piece.head(n),
                        stream,
                    )
                }
            })
        });
        if !any {
            // Nothing was enqueued: the buffers are free for the next copy.
            self.shared.give_back_host_staging(pieces);
            return enqueued;
        }
        match self.record_raw_event() {
            Ok(done) => {
                self.shared.park_upload(done, pieces);
                enqueued
            }
            Err(e) => {
                self.settle_staging(pieces);
                enqueued.and(Err(e))
            }
        }
    }

    /// Takes back staging buffers that copies enqueued on this stream may still be using,
    /// with no event after them: once the stream was waited for; freed where the device
    /// faulted or was reset (its work runs no more); leaked otherwise.
    fn settle_staging(&self, pieces: Vec<HostStaging>) {
        if self.synchronize().is_ok() {
            self.shared.give_back_host_staging(pieces);
        } else if self.shared.life.check().is_err() {
            for piece in pieces {
                piece.free(&self.shared);
            }
        } else {
            let bytes: usize = pieces.iter().map(HostStaging::bytes).sum();
            tracing::warn!(
                "staging buffers of {bytes} bytes are leaked: whether their copies were made \
                 is unknown"
            );
        }
    }

    /// An event of the device's pool recorded on this stream, outside any capture, owned by
    /// the caller (who gives it back with `return_event`).
    fn record_raw_event(&self) -> Result<RawEvent> {
        let ev = self.shared.take_event()?;
        let recorded = self.shared.bind().and_then(|_bound| {
            // SAFETY: the event and the stream are alive and belong to this context.
            unsafe { result::event::record(ev.0, self.raw()) }
                .map_err(|e| driver_err("cuEventRecord", e))
        });
        match recorded {
            Ok(()) => Ok(ev),
            Err(e) => {
                self.shared.return_event(ev);
                Err(e)
            }
        }
    }

    /// Begins a copy of `out.len()` bytes of `src` from `offset` into `out`, after the work
    /// enqueued on this stream so far; it has landed in `out` once
    /// [`CudaCopyToHost::finish`] returned `Ok`. The copy is enqueued into page-locked staging
    /// buffers of the device's (one per [`HOST_STAGING_PIECE`] bytes), followed by an event,
    /// and waited for by `finish`: the caller lets go of the buffer's access state and the
    /// stream's capture gate in between, so that the work before the copy (a host function
    /// waiting for another thread, which takes them) can end. A copy for which no staging
    /// buffers can be had (longer than the pool, or see `take_host_staging`) goes straight
    /// into `out`, pageable memory, which the driver returns from only once the copy has
    /// landed: it is made, and waited for, here.
    pub(crate) fn begin_copy_to_host(
        &self,
        src: &CudaMemory,
        offset: usize,
        out: &mut [u8],
    ) -> Result<CudaCopyToHost> {
        let len = out.len();
        let copy = |pieces, wait| CudaCopyToHost {
            pieces,
            wait,
            len,
            shared: self.shared.clone(),
        };
        if len == 0 {
            return Ok(copy(Vec::new(), Some(self.begin_synchronize()?)));
        }
        let Some(mut pieces) = self.shared.take_host_staging_pieces(len) else {
            self.copy_to_host(src, offset, out)?;
            return Ok(copy(Vec::new(), None));
        };
        if !pieces_fit(&pieces, len) {
            self.shared.give_back_host_staging(pieces);
            return Err(short_staging());
        }
        let (enqueued, any) = each_piece(&mut pieces, len, |piece, at, n| {
            self.enqueue_bytes("cuMemcpyDtoHAsync", n, |stream| {
                // SAFETY: the staging buffer holds at least `n` page-locked bytes, owned by
                // the `CudaCopyToHost` made below, which neither reads, reuses nor frees them
                // before the event recorded after these copies has completed (or the stream
                // was waited for); `src` holds at least `offset + len` bytes (the view was
                // bounds-checked), `at + n <= len`, and it is alive, its free ordered after
                // this copy by the access tracker.
                unsafe {
                    result::memcpy_dtoh_async(
                        piece.head_mut(n),
                        src.ptr() + (offset + at) as u64,
                        stream,
                    )
                }
            })
        });
        if let Err(e) = enqueued {
            if any {
                self.settle_staging(pieces);
            } else {
                // Nothing was enqueued: the buffers are free for the next copy.
                self.shared.give_back_host_staging(pieces);
            }
            return Err(e);
        }
        // The copies may be in flight from here on: the buffers go back once they landed.
        match self.begin_synchronize() {
            Ok(wait) => Ok(copy(pieces, Some(wait))),
            Err(e) => {
                self.settle_staging(pieces);
                Err(e)
            }
        }
    }

    /// Copies `out.len()` bytes of `src` from `offset` into `out` after the work enqueued on
    /// this stream, and waits for the copy.
    fn copy_to_host(&self, src: &CudaMemory, offset: usize, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return self.synchronize();
        }
        let _bound = self.shared.bind()?;
        // SAFETY: `src` holds at least `offset + out.len()` bytes and is alive; `out` stays
        // borrowed until the synchronize below has waited for the copy.
        unsafe { result::memcpy_dtoh_async(out, src.ptr() + offset as u64, self.raw()) }
            .map_err(|e| driver_err("cuMemcpyDtoHAsync", e))?;
        self.synchronize()
    }

    /// Copies `len` bytes from `src` into `dst` (of this stream's device) after the work
    /// enqueued on this stream: `cuMemcpyDtoDAsync` within the device, `cuMemcpyPeerAsync`
    /// from another device, which [`CudaStreamHandle::peer_access`] said this stream's device
    /// reads directly.
    pub(crate) fn copy_device(
        &self,
        src: &CudaMemory,
        src_offset: usize,
        dst: &CudaMemory,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        let (src_ptr, dst_ptr) = (src.ptr() + src_offset as u64, dst.ptr() + dst_offset as u64);
        if src.shared().ordinal == dst.shared().ordinal {
            return self.enqueue_bytes("cuMemcpyDtoDAsync", len, |stream| {
                // SAFETY: both ranges were bounds-checked against their allocations, which are
                // alive and stay alive until after this stream's work (stream-ordered free).
                unsafe { result::memcpy_dtod_async(dst_ptr, src_ptr, len, stream) }
            });
        }
        // The source's device state is held until the copy is noted there (see `foreign`):
        // a reset of that device, which frees the source, waits for the copy to finish.
        let source = src.shared();
        let _source_state = source.life.gate.read_recursive();
        source.life.check()?;
        let (src_ctx, dst_ctx) = (source.ctx.cu_ctx(), dst.shared().ctx.cu_ctx());
        self.enqueue_bytes("cuMemcpyPeerAsync", len, |stream| {
            // SAFETY: both ranges were bounds-checked against their allocations, which are
            // alive and whose frees are ordered after this stream's work (the runtime records
            // this stream as a use of both); each context is the one its allocation was made in;
            // the source's device is not reset before the copy finished (it is noted below,
            // under that device's gate, and a reset waits for what is noted).
            unsafe { result::memcpy_peer_async(dst_ctx, dst_ptr, src_ctx, src_ptr, len, stream) }
        })?;
        if len == 0 {
            return Ok(());
        }
        match self.record_event(false) {
            Ok(done) => {
                source.note_foreign_use(done);
                Ok(())
            }
            Err(e) => {
                // Nothing says when the copy ends: wait for it here instead.
                if let Err(wait) = self.synchronize() {
                    if !matches!(wait, DeviceError::DeviceFaulted { .. }) {
                        tracing::warn!(
                            "a copy between devices could not be followed by an event ({e}) \
                             nor waited for ({wait}); a reset of cuda:{} will not wait for it",
                            source.ordinal
                        );
                    }
                }
                Err(e)
            }
        }
    }

    pub(crate) fn fill_bytes(
        &self,
        dst: &CudaMemory,
        offset: usize,
        len: usize,
        value: u8,
    ) -> Result<()> {
        self.enqueue_bytes("cuMemsetD8Async", len, |stream| {
            // SAFETY: the range was bounds-checked and the allocation is alive.
            unsafe { result::memset_d8_async(dst.ptr() + offset as u64, value, len, stream) }
        })
    }

    pub(crate) fn copy_to_pinned(
        &self,
        src: &CudaMemory,
        offset: usize,
        pinned: &mut CudaPinned,
        len: usize,
    ) -> Result<()> {
        self.enqueue_bytes("cuMemcpyDtoHAsync", len, |stream| {
            let dst = &mut pinned.raw_bytes_mut()[..len];
            // SAFETY: `dst` is page-locked memory of `len` bytes owned by the pinned buffer,
            // which the caller moves into a transfer that waits for this copy before giving it
            // back or freeing it; `src` was bounds-checked and is alive.
            unsafe { result::memcpy_dtoh_async(dst, src.ptr() + offset as u64, stream) }
        })
    }

    pub(crate) fn copy_from_pinned(
        &self,
        pinned: &CudaPinned,
        dst: &CudaMemory,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        self.enqueue_bytes("cuMemcpyHtoDAsync", len, |stream| {
            let src = &pinned.raw_bytes()[..len];
            // SAFETY: as in `copy_to_pinned`: the pinned buffer is held by a transfer until the
            // copy has finished; `dst` was bounds-checked and is alive.
            unsafe { result::memcpy_htod_async(dst.ptr() + offset as u64, src, stream) }
        })
    }

    pub(crate) fn launch(
        &self,
        kernel: &CompiledKernel,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        // Argument values live here until the launch call returns; the driver copies them.
        let mut pointers: SmallVec<[u64; 16]> = SmallVec::with_capacity(args.args.len());
        for a in &args.args {
            if let KernelArg::Buffer {
                mem, byte_offset, ..
            } = a
            {
                pointers.push(mem.backend.cuda()?.ptr() + *byte_offset as u64);
            }
        }
        let mut params: SmallVec<[*mut c_void; 16]> = SmallVec::with_capacity(args.args.len());
        let mut next_pointer = 0;
        for a in &args.args {
            match a {
                KernelArg::Buffer { .. } => {
                    params.push(&pointers[next_pointer] as *const u64 as *mut c_void);
                    next_pointer += 1;
                }
                KernelArg::Scalar { bytes, .. } => {
                    params.push(bytes.as_ptr() as *mut c_void);
                }
            }
        }
        let _bound = self.shared.bind()?;
        kernel.check_state(&self.shared)?;
        kernel.check_args(&args.args)?;
        kernel.prepare_shared_mem(config.shared_mem_bytes)?;
        // SAFETY: the function comes from a module loaded in this context and kept alive by
        // `kernel`; `params` holds one pointer per kernel parameter, each pointing at a value
        // (device pointer or scalar bytes) that lives until this call returns; the buffers the
        // pointers address are alive and their frees are ordered after this launch (Ordering);
        // the configuration was validated against the device's limits.
        unsafe {
            result::launch_kernel(
                kernel.function(),
                config.grid,
                config.block,
                config.shared_mem_bytes,
                self.raw(),
                &mut params,
            )
        }
        .map_err(|e| match e.0 {
            sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE
            | sys::cudaError_enum::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => {
                DeviceError::InvalidLaunch {
                    kernel: kernel.name().to_string(),
                    reason: format!(
                        "the driver refused grid {:?}, block {:?}, {} bytes shared ({})",
                        config.grid,
                        config.block,
                        config.shared_mem_bytes,
                        driver_err("cuLaunchKernel", e)
                    ),
                }
            }
            _ => driver_err("cuLaunchKernel", e),
        })
    }
}

impl Drop for CudaStreamHandle {
    fn drop(&mut self) {
        if super::in_host_function() {
            // The driver refuses the frees and the destroy here: the stream, and its GEMM
            // workspace, are released at the next synchronization, by a handle made of them.
            // SAFETY: `self.stream` is taken once, here, and this drop returns without using
            // or dropping it again.
            let stream = unsafe { ManuallyDrop::take(&mut self.stream) };
            let moved = CudaStreamHandle {
                stream: ManuallyDrop::new(stream),
                shared: self.shared.clone(),
                blas_workspace: Mutex::new(self.blas_workspace.get_mut().take()),
                host_fn_panic: self.host_fn_panic.clone(),
                capture_events: Mutex::new(None),
                in_capture: AtomicBool::new(false),
            };
            self.shared.defer_host_fn_handle(moved);
            return;
        }
        // Only this stream's GEMMs used the workspace, so freeing it on the stream orders the
        // free after them; the stream itself is destroyed afterwards, with its fields.
        if let Some(mut workspace) = self.blas_workspace.get_mut().take() {
            workspace.free_on(self);
        }
        let stream = &mut self.stream;
        self.shared.life.release(|| {
            // SAFETY: dropped once, here; `self.stream` is not used after `drop`. Skipped
            // (leaked) when the context was reset, which destroyed the stream already.
            unsafe { ManuallyDrop::drop(stream) }
        });
    }
}

fn capture_err(op: &str, e: cudarc::driver::DriverError) -> DeviceError {
    DeviceError::Capture {
        op: op.to_string(),
        reason: driver_err("cuStreamCapture", e).to_string(),
    }
}

/// A synchronization of a CUDA stream: an event recorded after its work.
pub(crate) struct CudaSyncWait {
    event: CudaEventHandle,
    /// Where the stream's host functions report their failures: the scope of the thread that
    /// began the synchronization, or the stream's own slot.
    sink: ErrorSink,
}

impl CudaSyncWait {
    /// Blocks until the event has completed; the error of the stream's host functions, if any.
    /// The device memory that host functions dropped is freed afterwards: the caller
    /// ([`Stream::synchronize`](crate::Stream::synchronize)) holds no lock of the runtime here.
    pub(crate) fn wait(self) -> Result<()> {
        self.event.synchronize()?;
        self.event.shared.release_host_fn_drops();
        self.sink.sync_result()
    }

    /// Whether the event has completed (`false` where the driver cannot say now).
    pub(crate) fn is_done(&self) -> bool {
        self.event.is_complete().unwrap_or(false)
    }

    /// [`CudaSyncWait::wait`] of a completed event, leaving the memory host functions dropped
    /// to the next synchronization.
    pub(crate) fn done_result(self) -> Result<()> {
        self.sink.sync_result()
    }
}

/// Enqueues the copy of each staging buffer's part of a copy of `len` bytes, in order:
/// `copy(piece, at, n)` for the `n` bytes from `at` that `piece` holds. Stops at the first
/// error; gives it (or `Ok`) and whether any copy was enqueued before it, which decides what
/// becomes of the buffers.
fn each_piece(
    pieces: &mut [HostStaging],
    len: usize,
    mut copy: impl FnMut(&mut HostStaging, usize, usize) -> Result<()>,
) -> (Result<()>, bool) {
    let mut any = false;
    for (i, piece) in pieces.iter_mut().enumerate() {
        let at = i * HOST_STAGING_PIECE;
        let n = (len - at).min(HOST_STAGING_PIECE);
        if let Err(e) = copy(piece, at, n) {
            return (Err(e), any);
        }
        any = true;
    }
    (Ok(()), any)
}

/// Whether `pieces` are one staging buffer per [`HOST_STAGING_PIECE`] bytes of a copy of
/// `len` bytes, each holding its part.
fn pieces_fit(pieces: &[HostStaging], len: usize) -> bool {
    pieces.len() == len.div_ceil(HOST_STAGING_PIECE)
        && pieces
            .iter()
            .enumerate()
            .all(|(i, p)| p.bytes() >= (len - i * HOST_STAGING_PIECE).min(HOST_STAGING_PIECE))
}

/// The error of staging buffers that do not match the copy they were taken for (a bug of
/// this backend, reported rather than copying part of the bytes).
#[cold]
fn short_staging() -> DeviceError {
    DeviceError::internal("staging buffers do not match the copy they were taken for")
}

/// Host bytes copied into staging buffers by [`CudaStreamHandle::stage_from_host`], for one
/// copy into the device. Dropped before its copy was enqueued, it gives the buffers back.
pub(crate) struct StagedUpload {
    /// One buffer per [`HOST_STAGING_PIECE`] bytes, in order; empty once enqueued.
    pieces: Vec<HostStaging>,
    len: usize,
    shared: Arc<CudaDeviceShared>,
}

impl Drop for StagedUpload {
    fn drop(&mut self) {
        self.shared
            .give_back_host_staging(std::mem::take(&mut self.pieces));
    }
}

/// A read-back begun by [`CudaStreamHandle::begin_copy_to_host`].
pub(crate) struct CudaCopyToHost {
    /// The staging buffers the copy lands in first, one per [`HOST_STAGING_PIECE`] bytes in
    /// order; empty once given back, or when the copy went straight into its destination.
    pieces: Vec<HostStaging>,
    /// The synchronization after the copy; `None` when there is nothing to wait for (the copy
    /// landed already).
    wait: Option<CudaSyncWait>,
    len: usize,
    shared: Arc<CudaDeviceShared>,
}

impl CudaCopyToHost {
    /// Waits for the copy and puts what it read in `out` (the destination it was begun with);
    /// the error of the stream's work, if any.
    pub(crate) fn finish(mut self, out: &mut [u8]) -> Result<()> {
        let Some(wait) = self.wait.take() else {
            return Ok(());
        };
        // On an error the copy may not have landed: dropping `self` decides what becomes of
        // the staging buffers.
        wait.event.synchronize()?;
        let pieces = std::mem::take(&mut self.pieces);
        if !pieces.is_empty() {
            let mut copied = if out.len() == self.len {
                Ok(())
            } else {
                Err(DeviceError::internal(format!(
                    "a read-back of {} bytes was finished into {} bytes",
                    self.len,
                    out.len()
                )))
            };
            if copied.is_ok() {
                copied = copy_host_bytes(
                    out.chunks_mut(HOST_STAGING_PIECE)
                        .zip(&pieces)
                        .map(|(to, piece)| {
                            let n = to.len();
                            (to, piece.head(n))
                        })
                        .collect(),
                );
            }
            self.shared.give_back_host_staging(pieces);
            copied?;
        }
        wait.event.shared.release_host_fn_drops();
        wait.sink.sync_result()
    }
}

impl Drop for CudaCopyToHost {
    /// Staging buffers that a copy may still be writing are neither reused nor freed: they go
    /// back once the copy's event has completed, are freed when the device faulted or was
    /// reset (its work runs no more), and are leaked otherwise.
    fn drop(&mut self) {
        let pieces = std::mem::take(&mut self.pieces);
        if pieces.is_empty() {
            return;
        }
        if let Some(wait) = self.wait.take() {
            if wait.event.synchronize().is_ok() {
                self.shared.give_back_host_staging(pieces);
                return;
            }
        }
        if self.shared.life.check().is_err() {
            for piece in pieces {
                piece.free(&self.shared);
            }
        } else {
            let bytes: usize = pieces.iter().map(HostStaging::bytes).sum();
            tracing::warn!(
                "read-back staging buffers of {bytes} bytes are leaked: whether their copy \
                 landed is unknown"
            );
        }
    }
}

/// A CUDA event recorded on a stream.
pub(crate) struct CudaEventHandle {
    ev: Option<RawEvent>,
    timed: bool,
    shared: Arc<CudaDeviceShared>,
    /// Set for an event recorded during a capture: where it goes when dropped, instead of the
    /// pool or a destroy (see [`CapturedEvents`]).
    captured: Option<Arc<CapturedEvents>>,
}

impl CudaEventHandle {
    fn raw(&self) -> sys::CUevent {
        self.ev
            .as_ref()
            .map(|e| e.0)
            .unwrap_or(std::ptr::null_mut())
    }

    /// The ordinal of the device the event belongs to.
    pub(crate) fn ordinal(&self) -> usize {
        self.shared.ordinal
    }

    pub(crate) fn is_complete(&self) -> Result<bool> {
        let _bound = self.shared.bind()?;
        // SAFETY: the event is alive (owned by `self`).
        match unsafe { result::event::query(self.raw()) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(driver_err("cuEventQuery", e)),
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        let _bound = self.shared.bind()?;
        // SAFETY: the event is alive (owned by `self`).
        unsafe { result::event::synchronize(self.raw()) }
            .map_err(|e| driver_err("cuEventSynchronize", e))
    }

    /// [`CudaEventHandle::synchronize`], then the release of what host functions dropped (as
    /// [`CudaSyncWait::wait`] does), so that a program waiting on events rather than on its
    /// streams gets that memory back too. For [`Event::synchronize`](crate::Event::synchronize),
    /// whose caller holds no lock of the runtime.
    pub(crate) fn synchronize_and_release(&self) -> Result<()> {
        self.synchronize()?;
        self.shared.release_host_fn_drops();
        Ok(())
    }

    pub(crate) fn elapsed_ms(&self, end: &CudaEventHandle) -> Result<f32> {
        let _bound = self.shared.bind()?;
        // SAFETY: both events are alive and were created with timing enabled.
        unsafe { result::event::elapsed(self.raw(), end.raw()) }
            .map_err(|e| driver_err("cuEventElapsedTime", e))
    }
}

impl Drop for CudaEventHandle {
    fn drop(&mut self) {
        if let Some(captured) = self.captured.take() {
            if let Some(ev) = self.ev.take() {
                captured.keep(self.shared.clone(), ev);
            }
            return;
        }
        if self.timed && self.ev.is_some() && super::in_host_function() {
            // The driver refuses the destroy here: it is made at the next synchronization.
            let moved = CudaEventHandle {
                ev: self.ev.take(),
                timed: true,
                shared: self.shared.clone(),
                captured: None,
            };
            self.shared.defer_host_fn_handle(moved);
            return;
        }
        if let Some(ev) = self.ev.take() {
            if self.timed {
                super::destroy_event(&self.shared, ev);
            } else {
                // Re-recording a pooled event later does not affect waits already enqueued.
                self.shared.return_event(ev);
            }
        }
    }
}

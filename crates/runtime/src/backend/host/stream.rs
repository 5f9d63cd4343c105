//! Host streams and events: one worker thread per stream, draining an in-order queue.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::capture::{CaptureCursor, HostCapture, HostGraph, HostNodeKind};
use super::memory::HostPinned;
use crate::backend::stream::{Retired, SyncWait};
use crate::backend::{CaptureBackend, GraphBackend};
use crate::capture::CaptureSession;
use crate::error::{DeviceError, Result};
use crate::memory::Memory;
use crate::scope::{ErrorSink, StreamFailures};
use crate::stream::StreamId;

/// A unit of work on a host stream. `Fn` (not `FnOnce`) so that captured work can be replayed.
pub(crate) type HostTask = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// A message to a stream's worker; each piece of work carries where its failure goes.
enum Msg {
    Run(HostTask, ErrorSink),
    Once(Box<dyn FnOnce() + Send>, ErrorSink),
    /// An event recorded with the sink: it completes with the failures of the work before it
    /// (see [`StreamFailures`]).
    Record(Arc<HostEventShared>, ErrorSink),
}

thread_local! {
    static ON_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is a host stream's worker.
pub(crate) fn on_worker_thread() -> bool {
    ON_WORKER.with(|w| w.get())
}

pub(crate) struct HostStreamCore {
    id: StreamId,
    tx: Mutex<mpsc::Sender<Msg>>,
    /// Messages sent to the worker and not yet done with (counted up before each is sent,
    /// down once the worker has handled it and dropped what it held).
    pending: Arc<AtomicUsize>,
    error: Arc<Mutex<Option<DeviceError>>>,
    capture: Mutex<Option<CaptureCursor>>,
}

/// A synchronization of a host stream whose marker is enqueued: [`HostSyncWait::wait`] blocks
/// until the stream's worker reached it.
pub(crate) struct HostSyncWait {
    done: Arc<(Mutex<bool>, Condvar)>,
    sink: ErrorSink,
}

impl HostSyncWait {
    /// Blocks until the work before the marker has run; the first error it hit, if any.
    pub(crate) fn wait(self) -> Result<()> {
        let mut flag = self.done.0.lock();
        while !*flag {
            self.done.1.wait(&mut flag);
        }
        drop(flag);
        self.sink.sync_result()
    }

    /// Whether the worker has reached the marker.
    pub(crate) fn is_done(&self) -> bool {
        *self.done.0.lock()
    }

    /// [`HostSyncWait::wait`] of a marker already reached.
    pub(crate) fn done_result(self) -> Result<()> {
        self.sink.sync_result()
    }
}

/// A copy to the host enqueued by [`HostStream::begin_copy_to_host`].
pub(crate) struct HostCopyToHost {
    wait: HostSyncWait,
    landed: Arc<Mutex<Vec<u8>>>,
}

impl HostCopyToHost {
    /// Waits for the copy and puts its bytes in `out`; the first error the work before it hit,
    /// if any (`out` is then left as it was).
    pub(crate) fn finish(self, out: &mut [u8]) -> Result<()> {
        self.wait.wait()?;
        let landed = std::mem::take(&mut *self.landed.lock());
        if landed.len() != out.len() {
            return Err(DeviceError::internal(format!(
                "a copy to the host of {} bytes landed {} bytes",
                out.len(),
                landed.len()
            )));
        }
        out.copy_from_slice(&landed);
        Ok(())
    }
}

/// A host stream handle (shared by the clones of its `Stream`).
pub(crate) struct HostStream {
    core: Arc<HostStreamCore>,
}

pub(crate) fn run_task(task: &HostTask) -> Result<()> {
    match catch_unwind(AssertUnwindSafe(|| task())) {
        Ok(r) => r,
        Err(p) => Err(DeviceError::from_panic_payload("a host kernel", p)),
    }
}

impl HostStream {
    pub(crate) fn spawn(id: StreamId) -> Result<HostStream> {
        let (tx, rx) = mpsc::channel::<Msg>();
        let error: Arc<Mutex<Option<DeviceError>>> = Arc::new(Mutex::new(None));
        let pending = Arc::new(AtomicUsize::new(0));
        let worker_pending = pending.clone();
        std::thread::Builder::new()
            .name(format!("cuflow-host-stream-{}", id.0))
            .spawn(move || {
                ON_WORKER.with(|w| w.set(true));
                let mut failures = StreamFailures::default();
                // Nothing unwinds out of this loop: a worker that stopped would leave the work
                // queued after it never run, and its events and synchronizations waiting for
                // ever. So user code runs, and is dropped, under `catch_unwind`.
                for msg in rx {
                    match msg {
                        Msg::Run(task, sink) => {
                            let result = run_task(&task);
                            // The task may hold the last reference to user code (a host
                            // kernel's implementation, in a launch or a graph's nodes), whose
                            // captures may panic when dropped.
                            let dropped = catch_unwind(AssertUnwindSafe(move || drop(task)));
                            if let Err(e) = result {
                                failures.record(&sink, e);
                            }
                            if let Err(p) = dropped {
                                let e = DeviceError::from_panic_payload(
                                    "dropping finished host work",
                                    p,
                                );
                                failures.record(&sink, e);
                            }
                        }
                        Msg::Once(f, sink) => {
                            if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
                                let e = DeviceError::from_panic_payload("a host function", p);
                                failures.record(&sink, e);
                            }
                        }
                        Msg::Record(event, sink) => event.complete(failures.seen_by(&sink)),
                    }
                    worker_pending.fetch_sub(1, Ordering::Release);
                }
            })
            .map_err(|e| DeviceError::StreamClosed {
                stream: id.0,
                reason: format!("could not start the worker thread: {e}"),
            })?;
        Ok(HostStream {
            core: Arc::new(HostStreamCore {
                id,
                tx: Mutex::new(tx),
                pending,
                error,
                capture: Mutex::new(None),
            }),
        })
    }

    /// Where the failure of work enqueued now goes (see [`crate::scope`]).
    fn sink(&self) -> ErrorSink {
        ErrorSink::here(&self.core.error)
    }

    fn send(&self, msg: Msg) -> Result<()> {
        self.core.pending.fetch_add(1, Ordering::Relaxed);
        self.core.tx.lock().send(msg).map_err(|_| {
            self.core.pending.fetch_sub(1, Ordering::Relaxed);
            DeviceError::StreamClosed {
                stream: self.core.id.0,
                reason: "its worker thread has stopped".into(),
            }
        })
    }

    /// Whether the worker has handled everything sent to it so far.
    pub(crate) fn is_idle(&self) -> bool {
        self.core.pending.load(Ordering::Acquire) == 0
    }

    /// Enqueues a task, or records it when the stream is capturing as a node of `kind`; `label`
    /// says what it does (called only when recorded, for the graph's dump).
    pub(crate) fn enqueue(
        &self,
        task: HostTask,
        kind: HostNodeKind,
        label: impl FnOnce() -> String,
    ) -> Result<()> {
        {
            let mut cap = self.core.capture.lock();
            if let Some(cursor) = cap.as_mut() {
                cursor.record(task, kind, label());
                return Ok(());
            }
        }
        self.send(Msg::Run(task, self.sink()))
    }

    pub(crate) fn enqueue_once(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        self.send(Msg::Once(Box::new(f), self.sink()))
    }

    /// Enqueues the marker a synchronization waits for. A stream being captured is refused,
    /// and its capture invalidated, as `cuStreamSynchronize` does on CUDA.
    pub(crate) fn begin_synchronize(&self) -> Result<HostSyncWait> {
        self.begin_synchronize_after(None)
    }

    /// [`HostStream::begin_synchronize`], enqueueing `work` (when given) right before the
    /// marker, under the same checks.
    fn begin_synchronize_after(&self, work: Option<HostTask>) -> Result<HostSyncWait> {
        if on_worker_thread() {
            return Err(DeviceError::Reentrant {
                what: "Stream::synchronize inside a host kernel or host function",
            });
        }
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = done.clone();
        let sink = self.sink();
        // Held while the marker is sent: a capture cannot begin in between.
        let cap = self.core.capture.lock();
        if let Some(cursor) = cap.as_ref() {
            let err = DeviceError::Capture {
                op: "Stream::synchronize".into(),
                reason: format!(
                    "stream {} was synchronized while being captured, which invalidates the \
                     capture",
                    self.core.id
                ),
            };
            cursor.capture().invalidate(err.clone());
            return Err(err);
        }
        if let Some(work) = work {
            self.send(Msg::Run(work, sink.clone()))?;
        }
        self.send(Msg::Once(
            Box::new(move || {
                *signal.0.lock() = true;
                signal.1.notify_all();
            }),
            sink.clone(),
        ))?;
        drop(cap);
        Ok(HostSyncWait { done, sink })
    }

    /// See [`StreamBackend::retire`](crate::backend::StreamBackend::retire): a marker whose
    /// wait reports the stream's own error slot, whatever scope the dropping thread is in.
    pub(crate) fn retire(&self) -> Option<Retired> {
        if self.is_idle() {
            return self.core.error.lock().take().map(Retired::Failed);
        }
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = done.clone();
        let sink = ErrorSink::of_stream(&self.core.error);
        // A send fails only when the worker has stopped, leaving nothing to wait for.
        self.send(Msg::Once(
            Box::new(move || {
                *signal.0.lock() = true;
                signal.1.notify_all();
            }),
            sink.clone(),
        ))
        .ok()?;
        Some(Retired::Pending(SyncWait::Host(HostSyncWait {
            done,
            sink,
        })))
    }

    pub(crate) fn record_event(&self, timed: bool) -> Result<HostEvent> {
        {
            let cap = self.core.capture.lock();
            if let Some(cursor) = cap.as_ref() {
                return Ok(HostEvent::captured(cursor.frontier().to_vec(), timed));
            }
        }
        let event = HostEvent::pending(timed);
        self.send(Msg::Record(event.state.clone(), self.sink()))?;
        Ok(event)
    }

    pub(crate) fn wait_event(&self, event: &HostEvent) -> Result<()> {
        {
            let mut cap = self.core.capture.lock();
            if let Some(cursor) = cap.as_mut() {
                match &event.frontier {
                    Some(f) => cursor.add_dependencies(f),
                    None => {
                        let state = event.state.clone();
                        cursor.record(
                            Arc::new(move || state.wait()),
                            HostNodeKind::EventWait,
                            "event wait".into(),
                        );
                    }
                }
                return Ok(());
            }
        }
        if event.frontier.is_some() {
            return Err(DeviceError::Capture {
                op: "Stream::wait_event".into(),
                reason: "the event was recorded during a capture that has ended".into(),
            });
        }
        let state = event.state.clone();
        self.enqueue(
            Arc::new(move || state.wait()),
            HostNodeKind::EventWait,
            || "event wait".into(),
        )
    }

    pub(crate) fn begin_capture(&self) -> Result<CaptureBackend> {
        let capture = HostCapture::new();
        *self.core.capture.lock() = Some(CaptureCursor::new(capture.clone()));
        Ok(CaptureBackend::Host(capture))
    }

    pub(crate) fn join_capture(&self, session: &CaptureSession) -> Result<()> {
        match &session.backend {
            CaptureBackend::Host(c) => {
                *self.core.capture.lock() = Some(CaptureCursor::new(c.clone()));
                Ok(())
            }
            CaptureBackend::Cuda(_) => Err(DeviceError::usage(
                "a host stream cannot join a CUDA capture",
            )),
        }
    }

    pub(crate) fn end_capture(&self, session: &CaptureSession) -> Result<GraphBackend> {
        let cursor = self.core.capture.lock().take();
        let (CaptureBackend::Host(capture), Some(cursor)) = (&session.backend, cursor) else {
            return Err(DeviceError::usage(
                "end_capture on a stream that is not capturing",
            ));
        };
        Ok(GraphBackend::Host(HostGraph::finish(
            capture,
            cursor.frontier(),
        )?))
    }

    pub(crate) fn leave_capture(&self) {
        *self.core.capture.lock() = None;
    }

    pub(crate) fn copy_from_host(
        &self,
        mem: Arc<Memory>,
        offset: usize,
        data: Vec<u8>,
    ) -> Result<()> {
        let data = Arc::new(data);
        let len = data.len();
        self.enqueue(
            Arc::new(move || {
                let h = super::memory::host_mem(&mem)?;
                let mut w = h.write();
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut w[..]);
                bytes[offset..offset + data.len()].copy_from_slice(&data);
                Ok(())
            }),
            HostNodeKind::CopyHostToDevice,
            || format!("copy host to device, {len} bytes"),
        )
    }

    /// Enqueues a copy of `len` bytes of `mem` at `offset` into host memory of the copy's own,
    /// and the marker of a synchronization after it: [`HostCopyToHost::finish`] waits for both.
    /// Nothing is enqueued on a worker thread (the wait would wait for itself), nor while the
    /// stream is being captured.
    pub(crate) fn begin_copy_to_host(
        &self,
        mem: Arc<Memory>,
        offset: usize,
        len: usize,
    ) -> Result<HostCopyToHost> {
        let landed: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new(Vec::new()));
        let target = landed.clone();
        let copy: HostTask = Arc::new(move || {
            let h = super::memory::host_mem(&mem)?;
            let r = h.read();
            let bytes: &[u8] = bytemuck::cast_slice(&r[..]);
            let from = bytes.get(offset..offset + len).ok_or_else(|| {
                DeviceError::internal(format!(
                    "a copy to the host of bytes {offset}..{} of an allocation of {}",
                    offset + len,
                    bytes.len()
                ))
            })?;
            *target.lock() = from.to_vec();
            Ok(())
        });
        Ok(HostCopyToHost {
            wait: self.begin_synchronize_after(Some(copy))?,
            landed,
        })
    }

    pub(crate) fn copy_device(
        &self,
        src: Arc<Memory>,
        src_offset: usize,
        dst: Arc<Memory>,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.enqueue(
            Arc::new(move || {
                let s = super::memory::host_mem(&src)?;
                if Arc::ptr_eq(&src, &dst) {
                    let mut w = s.write();
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut w[..]);
                    bytes.copy_within(src_offset..src_offset + len, dst_offset);
                    return Ok(());
                }
                let d = super::memory::host_mem(&dst)?;
                // Lock in address order so that opposite copies on two streams cannot deadlock.
                let src_first = (s as *const _ as usize) < (d as *const _ as usize);
                let (r, mut w) = if src_first {
                    let r = s.read();
                    (r, d.write())
                } else {
                    let w = d.write();
                    (s.read(), w)
                };
                let from: &[u8] = bytemuck::cast_slice(&r[..]);
                let to: &mut [u8] = bytemuck::cast_slice_mut(&mut w[..]);
                to[dst_offset..dst_offset + len]
                    .copy_from_slice(&from[src_offset..src_offset + len]);
                Ok(())
            }),
            HostNodeKind::CopyDeviceToDevice,
            || format!("copy device to device, {len} bytes"),
        )
    }

    pub(crate) fn fill_bytes(
        &self,
        mem: Arc<Memory>,
        offset: usize,
        len: usize,
        value: u8,
    ) -> Result<()> {
        self.enqueue(
            Arc::new(move || {
                let h = super::memory::host_mem(&mem)?;
                let mut w = h.write();
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut w[..]);
                bytes[offset..offset + len].fill(value);
                Ok(())
            }),
            HostNodeKind::Memset,
            || format!("memset {len} bytes to {value}"),
        )
    }

    pub(crate) fn copy_to_pinned(
        &self,
        mem: Arc<Memory>,
        offset: usize,
        pinned: &HostPinned,
        len: usize,
    ) -> Result<()> {
        let target = pinned.shared();
        self.enqueue(
            Arc::new(move || {
                let h = super::memory::host_mem(&mem)?;
                let r = h.read();
                let from: &[u8] = bytemuck::cast_slice(&r[..]);
                let mut p = target.lock();
                let to: &mut [u8] = bytemuck::cast_slice_mut(&mut p[..]);
                to[..len].copy_from_slice(&from[offset..offset + len]);
                Ok(())
            }),
            HostNodeKind::CopyDeviceToPinned,
            || format!("copy device to pinned, {len} bytes"),
        )
    }

    pub(crate) fn copy_from_pinned(
        &self,
        pinned: &HostPinned,
        mem: Arc<Memory>,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let source = pinned.shared();
        self.enqueue(
            Arc::new(move || {
                let h = super::memory::host_mem(&mem)?;
                let p = source.lock();
                let from: &[u8] = bytemuck::cast_slice(&p[..]);
                let mut w = h.write();
                let to: &mut [u8] = bytemuck::cast_slice_mut(&mut w[..]);
                to[offset..offset + len].copy_from_slice(&from[..len]);
                Ok(())
            }),
            HostNodeKind::CopyPinnedToDevice,
            || format!("copy pinned to device, {len} bytes"),
        )
    }

    pub(crate) fn launch_graph(&self, graph: &HostGraph) -> Result<()> {
        let nodes = graph.nodes();
        self.enqueue(
            Arc::new(move || {
                for node in nodes.iter() {
                    run_task(&node.task)?;
                }
                Ok(())
            }),
            HostNodeKind::Graph,
            || "graph replay".into(),
        )
    }
}

struct EventState {
    done: bool,
    error: Option<DeviceError>,
    at: Option<Instant>,
}

/// Completion state of a host event, shared with the task that completes it.
pub(crate) struct HostEventShared {
    state: Mutex<EventState>,
    cv: Condvar,
    timed: bool,
}

impl HostEventShared {
    fn complete(&self, error: Option<DeviceError>) {
        let mut s = self.state.lock();
        s.done = true;
        s.error = error;
        if self.timed {
            s.at = Some(Instant::now());
        }
        self.cv.notify_all();
    }

    fn wait(&self) -> Result<()> {
        let mut s = self.state.lock();
        while !s.done {
            self.cv.wait(&mut s);
        }
        match &s.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

/// A host event; `frontier` is set for events recorded during a capture (the captured nodes
/// the event stands for).
pub(crate) struct HostEvent {
    state: Arc<HostEventShared>,
    frontier: Option<Vec<usize>>,
}

impl HostEvent {
    fn pending(timed: bool) -> HostEvent {
        HostEvent {
            state: Arc::new(HostEventShared {
                state: Mutex::new(EventState {
                    done: false,
                    error: None,
                    at: None,
                }),
                cv: Condvar::new(),
                timed,
            }),
            frontier: None,
        }
    }

    fn captured(frontier: Vec<usize>, timed: bool) -> HostEvent {
        let mut e = HostEvent::pending(timed);
        e.frontier = Some(frontier);
        e
    }

    pub(crate) fn is_complete(&self) -> Result<bool> {
        let s = self.state.state.lock();
        match (&s.error, s.done) {
            (Some(e), true) => Err(e.clone()),
            (_, done) => Ok(done),
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        if on_worker_thread() {
            return Err(DeviceError::Reentrant {
                what: "Event::synchronize inside a host kernel or host function",
            });
        }
        self.state.wait()
    }

    pub(crate) fn elapsed_ms(&self, end: &HostEvent) -> Result<f32> {
        let a = self.state.state.lock().at;
        let b = end.state.state.lock().at;
        match (a, b) {
            (Some(a), Some(b)) => Ok(if b >= a {
                (b - a).as_secs_f32() * 1e3
            } else {
                -((a - b).as_secs_f32() * 1e3)
            }),
            _ => Err(DeviceError::usage(
                "Event::elapsed_ms: both events must have completed",
            )),
        }
    }
}

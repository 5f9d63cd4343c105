//! Streams.
//!
//! A [`Stream`] is an in-order queue of device work: everything enqueued on one stream runs in
//! the order it was enqueued. Work on different streams is ordered where it touches the same
//! buffers (a write after the reads and writes before it, a read after the last write: see
//! [`crate::access`]), and otherwise only where an [`Event`] joins the streams
//! (`b.wait_event(&a.record_event()?)` makes everything enqueued on `b` afterwards wait for
//! everything enqueued on `a` before the record).
//!
//! Each stream also keeps its side of the access tracker, an [`AccessClock`]: the count of the
//! tracked accesses enqueued on it (an event carries the count read before it was recorded) and
//! how far it has waited for every other stream; the rules are in [`crate::access`].
//!
//! Streams also carry the capture state used by graph capture: while a stream is capturing, the
//! work enqueued on it is recorded rather than run, and a stream that waits on an event recorded
//! by a capturing stream joins that capture (as on CUDA). Buffers used by captured work are kept
//! alive by the resulting [`Graph`].

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::access::{Access, AccessClock};
use crate::backend::StreamBackend;
use crate::capture::{CaptureSession, Graph};
use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::event::{Event, EventInner};
use crate::memory::Memory;
use crate::trace::{self, Work};

/// A process-unique identifier of a [`Stream`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub(crate) u64);

impl StreamId {
    /// The raw number.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

pub(crate) struct StreamInner {
    pub(crate) id: StreamId,
    pub(crate) device: Device,
    pub(crate) priority: i32,
    pub(crate) backend: StreamBackend,
    /// Made with [`Device::new_stream_for_captures`]: never picked as a buffer's
    /// [`last_stream`](crate::DeviceBuffer::last_stream).
    pub(crate) for_captures: bool,
    pub(crate) capturing: AtomicBool,
    pub(crate) capture: Mutex<Option<Arc<CaptureSession>>>,
    /// Tracked accesses enqueued on this stream so far, and how far it has waited for each
    /// other stream (see [`crate::access`]).
    pub(crate) clock: AccessClock,
    /// An event recorded just before this stream began or joined its current capture: eager
    /// work that must follow this stream's earlier eager work waits on it, never on the
    /// capturing stream itself.
    fence: Mutex<Option<Event>>,
    /// Held shared by every enqueue from its capture check to its enqueue, and exclusively by
    /// a capture beginning or joining: no thread checks "not capturing" and then enqueues into
    /// a capture that began in between.
    gate: RwLock<()>,
}

impl Drop for StreamInner {
    /// The last handle is gone, but not the work: what is unfinished, or the failure nothing
    /// reported, is left to the device's next [`Device::synchronize`]. A capturing stream is
    /// held by its capture, so it is never dropped here while capturing.
    fn drop(&mut self) {
        if self.capturing.load(Ordering::Acquire) {
            return;
        }
        if let Some(left) = self.backend.retire() {
            self.device.retire(left);
        }
    }
}

/// An in-order queue of work on one device. Cheap to clone (clones share the queue),
/// `Send + Sync`.
///
/// A stream lives while a handle to it does, and while a buffer it used may still have to
/// order later work or its free after it. A buffer forgets the streams whose work has all
/// finished once it remembers a few of them, so a program that makes a stream per request
/// over long-lived buffers (model weights) does not keep every such stream alive.
#[derive(Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// Whether this thread is running a host function ([`Stream::enqueue_host_fn`]) of a CUDA
/// stream, where every call into the device is refused with
/// [`DeviceError::Reentrant`], or is a host stream's worker
/// (running a host function or a host kernel), where every wait is.
///
/// Crates built on the runtime check it before they take a lock that their own device calls
/// may hold, or before they wait for work: another thread's driver call can wait for the
/// device's work in flight, the host function included, so blocking on such a lock there could
/// deadlock, and work enqueued behind the host function never runs while it waits.
///
/// # Examples
///
/// ```
/// assert!(!cuflow_runtime::in_host_function());
/// ```
pub fn in_host_function() -> bool {
    crate::backend::cuda::in_host_function() || crate::backend::host::on_worker_thread()
}

/// [`DeviceError::Reentrant`] for a capture begun or ended inside a host function or a host
/// kernel, on every backend: a capture belongs to the thread that began it, and the thread that
/// runs a stream's work (the host backend's worker) is one no program code can end it from.
/// `what` names the call.
fn refuse_capture_in_host_function(what: &'static str) -> Result<()> {
    crate::backend::refuse_in_host_function()?;
    if crate::backend::host::on_worker_thread() {
        return Err(DeviceError::Reentrant { what });
    }
    Ok(())
}

impl Stream {
    pub(crate) fn new(
        device: &Device,
        priority: Option<i32>,
        for_captures: bool,
    ) -> Result<Stream> {
        crate::trace::start_from_env();
        let id = StreamId(NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed));
        let (backend, priority) = device.backend().new_stream(id, priority)?;
        let stream = Stream {
            inner: Arc::new(StreamInner {
                id,
                device: device.clone(),
                priority,
                backend,
                for_captures,
                capturing: AtomicBool::new(false),
                capture: Mutex::new(None),
                clock: AccessClock::new(id),
                fence: Mutex::new(None),
                gate: RwLock::new(()),
            }),
        };
        let mut list = device.inner.streams.lock();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&stream.inner));
        Ok(stream)
    }

    /// The stream's process-unique id.
    pub fn id(&self) -> StreamId {
        self.inner.id
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Whether the stream was made with [`Device::new_stream_for_captures`].
    pub fn is_for_captures(&self) -> bool {
        self.inner.for_captures
    }

    /// The stream's priority (lower is more urgent).
    pub fn priority(&self) -> i32 {
        self.inner.priority
    }

    /// Records an event that completes when all work enqueued so far on this stream has
    /// finished. Timing is disabled on these events; see [`Stream::record_timed_event`].
    ///
    /// # Errors
    ///
    /// A driver error if the event cannot be created or recorded.
    pub fn record_event(&self) -> Result<Event> {
        self.record(false)
    }

    /// Like [`Stream::record_event`], but the event carries a timestamp usable with
    /// [`Event::elapsed_ms`].
    ///
    /// # Errors
    ///
    /// A driver error if the event cannot be created or recorded.
    pub fn record_timed_event(&self) -> Result<Event> {
        self.record(true)
    }

    fn record(&self, timed: bool) -> Result<Event> {
        let _gate = self.enqueue_gate()?;
        self.record_ungated(timed)
    }

    /// Whether all the work enqueued on this stream so far has finished, told without waiting:
    /// `false` whenever that cannot be told at once (the stream is capturing or a capture is
    /// beginning on it, or the query failed). A buffer asks it of the streams that used it, to
    /// forget those whose uses of it are over (see `UseState::note_use`).
    pub(crate) fn is_idle(&self) -> bool {
        // Never waits for the gate: the caller holds buffer locks, which a thread holding the
        // gate may be waiting for. The gate held, no capture begins during the query.
        let Some(_gate) = self.inner.gate.try_read() else {
            return false;
        };
        if self.is_capturing() {
            return false;
        }
        self.inner.backend.is_idle().unwrap_or(false)
    }

    /// Records an event; the caller holds the gate (shared or exclusive).
    fn record_ungated(&self, timed: bool) -> Result<Event> {
        let capture = self.capture_session();
        if let Some(session) = &capture {
            session.check_owner("Stream::record_event", self.inner.id)?;
        }
        // Stamped before the record: the event covers at least the accesses counted so far.
        // A traced event is timed: the trace reads when it completed.
        let traced = trace::is_enabled() && capture.is_none();
        let timed = timed || traced;
        let (backend, seq) = self
            .inner
            .clock
            .stamp(|| self.inner.backend.record_event(timed))?;
        let event = Event {
            inner: Arc::new(EventInner {
                device: self.inner.device.clone(),
                stream: self.inner.id,
                seq,
                timed,
                capture,
                backend,
                trace_id: if traced { trace::event_number() } else { 0 },
            }),
        };
        if traced {
            trace::note_event_record(self, &event);
        }
        Ok(event)
    }

    /// Makes all work enqueued on this stream from now on wait until `event` has completed.
    /// Waiting on an event recorded during a capture makes this stream join that capture.
    /// While this stream is being captured, waiting on an event of eager work (recorded
    /// outside any capture, its work possibly still running) orders the captured work after
    /// that work by making every launch of the resulting graph wait for the event first: a
    /// graph cannot hold a dependency on work outside it.
    ///
    /// The event may belong to another device: on CUDA the GPU waits for an event of another
    /// GPU (`cuStreamWaitEvent` accepts events of every context), and host devices wait for
    /// each other's events. Across backends, a host stream waits for a CUDA event on its worker
    /// thread, without blocking the caller; a CUDA stream cannot wait for the host backend's
    /// work by itself, so the calling thread waits until a host event has completed (after
    /// which the CUDA stream's later work is ordered after it).
    ///
    /// # Errors
    ///
    /// [`DeviceError::Capture`] when the event was recorded during a capture that has ended,
    /// or when a wait across backends is asked of a stream being captured or for an event
    /// recorded during a capture; the error the host work before a host event hit, when a
    /// CUDA stream waits for it; or a driver error.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        crate::backend::refuse_in_host_function()?;
        let same_backend = self.inner.device.kind() == event.inner.device.kind();
        if !same_backend && (event.inner.capture.is_some() || self.is_capturing()) {
            return Err(DeviceError::Capture {
                op: "Stream::wait_event".into(),
                reason: format!(
                    "a stream of {} cannot wait for an event of {} during a capture: a \
                     capture records the work of one backend",
                    self.inner.device, event.inner.device
                ),
            });
        }
        if let Some(session) = self.capture_session() {
            session.check_owner("Stream::wait_event", self.inner.id)?;
        }
        if let Some(session) = &event.inner.capture {
            if !session.is_open() {
                // The event stands for captured nodes, which never run by themselves: once the
                // capture has ended it orders nothing. Refused here, before either backend
                // sees it, so that both answer alike.
                return Err(DeviceError::Capture {
                    op: "Stream::wait_event".into(),
                    reason: "the event was recorded during a capture that has ended".into(),
                });
            }
            self.join_capture(session)?;
        }
        let _gate = self.enqueue_gate()?;
        if let Some(session) = self.capture_session() {
            session.check_owner("Stream::wait_event", self.inner.id)?;
            if event.inner.capture.is_none() {
                // Eager work: each launch of the graph waits for it (see
                // `CaptureSession::add_prerequisite`).
                session.add_prerequisite(event);
                return Ok(());
            }
        }
        self.inner.backend.wait_event(event)?;
        if trace::is_enabled() && !self.is_capturing() {
            trace::note_event_wait(self, event);
        }
        if event.inner.capture.is_none() && !self.is_capturing() {
            self.inner
                .clock
                .note_waited(event.inner.stream, event.inner.seq);
        }
        Ok(())
    }

    /// The shared side of the capture gate: held from checking whether the stream captures
    /// until the work is enqueued. Recursive, so that an enqueue may record on or wait for this
    /// stream again while holding it.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Reentrant`] inside a host function, before the gate is taken (see
    /// [`crate::backend::refuse_in_host_function`]).
    pub(crate) fn enqueue_gate(&self) -> Result<RwLockReadGuard<'_, ()>> {
        crate::backend::refuse_in_host_function()?;
        Ok(self.inner.gate.read_recursive())
    }

    /// The shared side of the capture gate without the host-function check, for the runtime's
    /// own frees (which a host function defers before coming here).
    pub(crate) fn hold_gate(&self) -> RwLockReadGuard<'_, ()> {
        self.inner.gate.read_recursive()
    }

    /// Makes work enqueued on this stream from now on wait for `other`'s work up to sequence
    /// number `seq` (`u64::MAX`: all of it), without ever pulling this stream into a capture it
    /// is not part of (see [`crate::access`]):
    ///
    /// - from an eager stream, a capturing `other` is waited for at its fence (its eager work
    ///   before the capture); its captured work never runs by itself;
    /// - from a capturing stream, only streams of the same capture are joined; eager work is
    ///   ordered before a replay when the graph is launched.
    pub(crate) fn order_after(&self, other: &Stream, seq: u64) -> Result<()> {
        if self.same(other) {
            return Ok(());
        }
        match self.capture_session() {
            Some(own) => match other.capture_session() {
                Some(theirs) if Arc::ptr_eq(&own, &theirs) => self.join(other),
                _ => Ok(()),
            },
            None => self.inner.clock.order_after(
                other.inner.id,
                seq,
                || other.ordering_event(),
                |event| self.wait_event(event),
            ),
        }
    }

    /// An eager event after this stream's eager work so far: a new one, or while the stream is
    /// being captured, its fence (`None` when it had no fence).
    pub(crate) fn ordering_event(&self) -> Result<Option<Event>> {
        if self.is_capturing() {
            return Ok(self.inner.fence.lock().clone());
        }
        match self.record_event() {
            Ok(e) => Ok(Some(e)),
            // It began a capture in between: its fence stands for its eager work.
            Err(_) if self.is_capturing() => Ok(self.inner.fence.lock().clone()),
            Err(e) => Err(e),
        }
    }

    /// The id of the capture work enqueued now on this stream is recorded into, if any.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Capture`] when another thread is capturing this stream: work from other
    /// threads never enters a graph.
    #[inline]
    pub(crate) fn capture_id_for_enqueue(&self, op: &'static str) -> Result<Option<u64>> {
        if !self.is_capturing() {
            return Ok(None);
        }
        self.capture_id_while_capturing(op)
    }

    /// [`Stream::capture_id_for_enqueue`] once the stream was seen capturing.
    #[cold]
    #[inline(never)]
    fn capture_id_while_capturing(&self, op: &'static str) -> Result<Option<u64>> {
        match self.capture_session() {
            Some(session) => {
                session.check_owner(op, self.inner.id)?;
                Ok(Some(session.id))
            }
            None => Ok(None),
        }
    }

    /// Makes all work enqueued on this stream from now on wait for all work enqueued so far on
    /// `other`. Joining a stream with itself does nothing.
    ///
    /// # Errors
    ///
    /// As [`Stream::record_event`] and [`Stream::wait_event`].
    pub fn join(&self, other: &Stream) -> Result<()> {
        if self.same(other) {
            return Ok(());
        }
        let event = other.record_event()?;
        self.wait_event(&event)
    }

    /// Blocks until all work enqueued on this stream has finished.
    ///
    /// # Errors
    ///
    /// The first error the stream's work hit (a failed host kernel, a device fault), or
    /// [`DeviceError::Capture`] while the stream is capturing (a host wait cannot be recorded).
    pub fn synchronize(&self) -> Result<()> {
        self.synchronize_eager(false)
    }

    /// [`Stream::synchronize`], except that a stream being captured (by any thread) is not
    /// waited for: `Ok` at once.
    pub(crate) fn synchronize_unless_capturing(&self) -> Result<()> {
        self.synchronize_eager(true)
    }

    fn synchronize_eager(&self, skip_capturing: bool) -> Result<()> {
        // The capture check and the mark the wait waits for are made under the gate, so that
        // no capture begins in between (the wait would then wait on a capturing stream, which
        // invalidates the capture on CUDA). The gate is let go before the wait: held, it would
        // keep another thread's capture of this stream waiting for the stream's work, and a
        // host function on the stream that waits for that thread would never return.
        let wait = {
            let _gate = self.enqueue_gate()?;
            if skip_capturing && self.is_capturing() {
                return Ok(());
            }
            self.forbid_in_capture("Stream::synchronize")?;
            self.inner.backend.begin_synchronize()?
        };
        let _traced = trace::HostWait::begin("Stream::synchronize");
        wait.wait()
    }

    /// Whether the stream is recording into a graph.
    pub fn is_capturing(&self) -> bool {
        self.inner.capturing.load(Ordering::Acquire)
    }

    /// Starts recording the work enqueued on this stream (and on the streams that join it by
    /// waiting on its events) into a graph, instead of running it.
    ///
    /// The capture belongs to the calling thread: only its work enters the graph (work other
    /// threads aim at the capturing streams is refused with [`DeviceError::Capture`]), and only
    /// it ends the capture with [`Stream::end_capture`].
    ///
    /// End every capture begun here, on every path (the graph-capture crate's APIs do): the
    /// capture holds its streams, so dropping every handle of a capturing stream does not end
    /// it. Such a capture stays open until the process ends: its streams and the buffers its
    /// work touched stay allocated, and this thread's eager reads of buffers it wrote stay
    /// refused.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Capture`] if the stream is already capturing, or a driver error.
    pub fn begin_capture(&self) -> Result<()> {
        refuse_capture_in_host_function(
            "Stream::begin_capture inside a host kernel or host function",
        )?;
        if self.inner.capture.lock().is_some() {
            return Err(DeviceError::Capture {
                op: "Stream::begin_capture".into(),
                reason: format!("stream {} is already capturing", self.inner.id),
            });
        }
        // Reserved before the capture begins, so that the capture records no allocation.
        let blas_workspace = crate::blas::capture_workspace(self);
        // From here until the capture state is set, no other enqueue runs on this stream.
        let _gate = self.inner.gate.write();
        let mut slot = self.inner.capture.lock();
        if slot.is_some() {
            return Err(DeviceError::Capture {
                op: "Stream::begin_capture".into(),
                reason: format!("stream {} is already capturing", self.inner.id),
            });
        }
        *self.inner.fence.lock() = Some(self.record_ungated(false)?);
        let session = CaptureSession::new(self.inner.id, self.inner.backend.begin_capture()?);
        if let Some(workspace) = blas_workspace {
            session.add_blas_workspace(self.inner.id, workspace);
        }
        session.members.lock().push(self.clone());
        *slot = Some(Arc::new(session));
        self.inner.capturing.store(true, Ordering::Release);
        Ok(())
    }

    /// Ends the capture this stream began and returns the recorded graph. Every stream that
    /// joined the capture leaves it. The stream is usable afterwards whatever the outcome.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Capture`] if the stream did not begin a capture, if another thread began
    /// it (the capture stays open: only the thread that began it ends it, as only its work
    /// enters the graph), if the capture was invalidated by an operation that cannot be
    /// captured, or if a joined stream's work was not joined back into this stream.
    pub fn end_capture(&self) -> Result<Graph> {
        refuse_capture_in_host_function(
            "Stream::end_capture inside a host kernel or host function",
        )?;
        let session = {
            let slot = self.inner.capture.lock();
            match &*slot {
                Some(s) if s.origin == self.inner.id => {
                    s.check_ended_by_owner()?;
                    s.clone()
                }
                Some(_) => {
                    return Err(DeviceError::Capture {
                        op: "Stream::end_capture".into(),
                        reason: format!(
                            "stream {} joined another stream's capture; end it on the stream \
                             that began it",
                            self.inner.id
                        ),
                    })
                }
                None => {
                    return Err(DeviceError::Capture {
                        op: "Stream::end_capture".into(),
                        reason: format!("stream {} is not capturing", self.inner.id),
                    })
                }
            }
        };
        let members: Vec<Stream> = std::mem::take(&mut *session.members.lock());
        let result = self.inner.backend.end_capture(&session);
        session.close();
        for m in &members {
            // Under the gate, as the capture was joined: no other thread records an event on
            // the stream meanwhile, which would see it eager here and be recorded into the
            // capture by a backend that has not left it yet (and never complete).
            let _gate = m.inner.gate.write();
            m.inner.backend.leave_capture();
            *m.inner.capture.lock() = None;
            m.inner.capturing.store(false, Ordering::Release);
        }
        session.run_deferred_frees();
        session.release_blas_workspaces();
        let graph_backend = result?;
        if let Some(err) = session.error.lock().take() {
            return Err(err);
        }
        Ok(Graph::new(
            self.inner.device.clone(),
            graph_backend,
            session.take_keep_alive(),
            session.take_prerequisites(),
        ))
    }

    /// Enqueues a host closure that runs on this stream, in order with its device work.
    ///
    /// On CUDA it becomes a host function node (`cuLaunchHostFunc`), run on a thread of the
    /// driver's where the driver refuses its calls. Inside it, a launch, copy, event, wait or
    /// allocation fails at once with [`DeviceError::Reentrant`], before reaching the driver
    /// (and before taking any lock that another thread's driver call could hold); what it drops
    /// last (device or pinned memory, a stream, a graph) is released at the next
    /// [`Stream::synchronize`], [`Device::synchronize`](crate::Device::synchronize) or
    /// [`Event::synchronize`](crate::Event::synchronize) on its device made outside a host
    /// function (a program that only awaits ops keeps it until one of those). On the host
    /// backend a wait inside it is
    /// [`DeviceError::Reentrant`] too (it would wait for itself), and work it enqueues runs
    /// after it. So keep it to host work.
    ///
    /// Keep it short. It must not wait for something the program does only later:
    /// while it blocks, its stream stalls, and so do the driver calls that wait for the
    /// device's work in flight (loading a kernel's module at its first launch, freeing
    /// page-locked memory), on any thread.
    ///
    /// # Errors
    ///
    /// A driver error, or [`DeviceError::Capture`] during capture.
    pub fn enqueue_host_fn(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let _gate = self.enqueue_gate()?;
        self.forbid_in_capture("Stream::enqueue_host_fn")?;
        if trace::is_enabled() {
            return trace::traced_enqueue(
                self,
                || Work::HostFn,
                || self.inner.backend.enqueue_host_fn(Box::new(f)),
            );
        }
        self.inner.backend.enqueue_host_fn(Box::new(f))
    }

    /// Whether two handles name the same stream.
    pub fn same(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn backend(&self) -> &StreamBackend {
        &self.inner.backend
    }

    pub(crate) fn capture_session(&self) -> Option<Arc<CaptureSession>> {
        if !self.is_capturing() {
            return None;
        }
        self.inner.capture.lock().clone()
    }

    /// Keeps `mem` alive for as long as the graph being captured on this stream, if any.
    pub(crate) fn note_capture_use(&self, mem: &Arc<Memory>, access: Access) {
        if let Some(session) = self.capture_session() {
            session.keep_alive(mem, access);
        }
    }

    pub(crate) fn forbid_in_capture(&self, op: &'static str) -> Result<()> {
        self.refuse_in_capture(
            op,
            "this operation waits for the host (or reads pageable host memory), and cannot be \
             recorded into a graph; do it before or after the capture",
        )
    }

    /// While this stream is being captured, fails the capture with a [`DeviceError::Capture`]
    /// of `op` saying `reason`, and returns it; otherwise does nothing.
    pub(crate) fn refuse_in_capture(&self, op: &'static str, reason: &str) -> Result<()> {
        if let Some(session) = self.capture_session() {
            // Another thread's call is refused without spoiling the capture.
            session.check_owner(op, self.inner.id)?;
            let err = DeviceError::Capture {
                op: op.to_string(),
                reason: reason.to_string(),
            };
            session.record_error(err.clone());
            return Err(err);
        }
        Ok(())
    }

    fn join_capture(&self, session: &Arc<CaptureSession>) -> Result<()> {
        match &*self.inner.capture.lock() {
            Some(s) if Arc::ptr_eq(s, session) => return Ok(()),
            Some(_) => {
                return Err(DeviceError::Capture {
                    op: "Stream::wait_event".into(),
                    reason: "the stream is part of another capture".into(),
                })
            }
            None => {}
        }
        session.check_owner("Stream::wait_event", self.inner.id)?;
        // This stream is not capturing yet, so the allocation is not captured.
        let workspace = crate::blas::capture_workspace(self);
        // From here until the capture state is set, no other enqueue runs on this stream.
        let _gate = self.inner.gate.write();
        let mut slot = self.inner.capture.lock();
        match &*slot {
            Some(s) if Arc::ptr_eq(s, session) => Ok(()),
            Some(_) => Err(DeviceError::Capture {
                op: "Stream::wait_event".into(),
                reason: "the stream is part of another capture".into(),
            }),
            None => {
                // Recorded before the backend joins, as in `begin_capture`: the fence stands
                // for this stream's work before the capture, so it must be an eager event. A
                // host stream records into the capture once joined, and an event recorded there
                // never completes by itself.
                let fence = self.record_ungated(false)?;
                self.inner.backend.join_capture(session)?;
                if let Some(workspace) = workspace {
                    session.add_blas_workspace(self.inner.id, workspace);
                }
                *self.inner.fence.lock() = Some(fence);
                session.members.lock().push(self.clone());
                *slot = Some(session.clone());
                self.inner.capturing.store(true, Ordering::Release);
                Ok(())
            }
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.inner.id.0)
            .field("device", &self.inner.device)
            .field("priority", &self.inner.priority)
            .finish()
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.same(other)
    }
}

impl Eq for Stream {}

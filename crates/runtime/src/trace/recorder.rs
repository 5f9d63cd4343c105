//! The process-wide recorder: entries are pushed while tracing is on and their timestamps
//! resolved by [`stop`], after the traced work has completed.
//!
//! Invariants: the recorder is only touched when [`super::is_enabled`] said so (or by
//! [`start`] / [`stop`]); it holds the timed events of the work it recorded and, per device,
//! one stream to take a reference timestamp on. Op spans nest through a per-thread stack of
//! span numbers; a span that outlives the trace it began in is dropped silently. An [`OpSpan`]
//! is not `Send`: it must end on the thread whose stack it was pushed on.
//!
//! Concurrency: entries are numbered from one counter and a trace lists them by number. Work
//! traced on a stream ([`traced_enqueue`], [`note_event_wait`]) takes its number and records
//! its timed events and its work while holding that stream's lane lock (the recorder keeps
//! one per stream it has seen, reentrant so that an enqueue may record on its own stream
//! again), so two threads enqueuing on one stream cannot interleave inside one span: the spans
//! of an in-order stream follow one another, and their numbers follow the stream's order. Lane
//! locks are taken only while tracing, before the recorder's lock and never inside it.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Instant;

use parking_lot::{Mutex, ReentrantMutex};

use super::entry::{EntryKind, Lane, Trace, TraceEntry};
use super::{Work, ENABLED};
use crate::backend::EventBackend;
use crate::device::{Device, DeviceId};
use crate::error::{DeviceError, Result};
use crate::event::Event;
use crate::stream::{Stream, StreamId};

static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The op spans this thread is inside, innermost last.
    static OP_STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A number for an event recorded while tracing (0 when off: the event is not traced).
pub(crate) fn event_number() -> u64 {
    if super::is_enabled() {
        next_id()
    } else {
        0
    }
}

enum Stamp {
    Backend(EventBackend),
    Event(Event),
}

impl Stamp {
    fn backend(&self) -> &EventBackend {
        match self {
            Stamp::Backend(b) => b,
            Stamp::Event(e) => &e.inner.backend,
        }
    }
}

enum Timing {
    /// Device timestamps: `begin` and `end` (a point when `end` is `None`).
    Device {
        device: DeviceId,
        begin: Stamp,
        end: Option<Stamp>,
    },
    /// Host clock.
    Host { start: Instant, end: Instant },
}

enum PendingLane {
    Stream { device: String, stream: StreamId },
    Thread(u64),
}

struct Pending {
    id: u64,
    kind: EntryKind,
    name: Cow<'static, str>,
    lane: PendingLane,
    timing: Timing,
    args: Vec<(&'static str, String)>,
    parent: Option<u64>,
    event: Option<u64>,
}

struct Recorder {
    origin: Instant,
    entries: Vec<Pending>,
    /// Per device, a stream to take the reference timestamp on.
    references: HashMap<DeviceId, Stream>,
    threads: HashMap<ThreadId, (u64, String)>,
    /// Per stream, the lock its traced work is recorded under (see the module docs).
    lanes: HashMap<StreamId, Arc<ReentrantMutex<()>>>,
    /// Where `CUFLOW_TRACE` asked the trace to be written.
    path: Option<PathBuf>,
}

impl Recorder {
    fn thread_number(&mut self) -> u64 {
        let next = self.threads.len() as u64 + 1;
        let t = std::thread::current();
        self.threads
            .entry(t.id())
            .or_insert_with(|| (next, t.name().unwrap_or("unnamed").to_string()))
            .0
    }

    fn stream_lane(&mut self, stream: &Stream) -> PendingLane {
        let device = stream.device();
        self.references
            .entry(device.id())
            .or_insert_with(|| stream.clone());
        PendingLane::Stream {
            device: device_name(device),
            stream: stream.id(),
        }
    }
}

fn device_name(device: &Device) -> String {
    match device.ordinal() {
        Some(n) => format!("cuda:{n}"),
        None => device.to_string(),
    }
}

fn with_recorder(f: impl FnOnce(&mut Recorder)) {
    if let Some(r) = RECORDER.lock().as_mut() {
        f(r);
    }
}

/// The lane lock of `stream` (see the module docs), or `None` once the trace has stopped.
fn lane_lock(stream: &Stream) -> Option<Arc<ReentrantMutex<()>>> {
    RECORDER
        .lock()
        .as_mut()
        .map(|r| Arc::clone(r.lanes.entry(stream.id()).or_default()))
}

fn current_op() -> Option<u64> {
    OP_STACK.with(|s| s.borrow().last().copied())
}

/// Starts recording a trace, process-wide, until [`stop`].
///
/// # Errors
///
/// [`DeviceError::Usage`] when a trace is already being recorded.
///
/// # Examples
///
/// See [the module docs](crate::trace).
pub fn start() -> Result<()> {
    start_with(None)
}

fn start_with(path: Option<PathBuf>) -> Result<()> {
    let mut slot = RECORDER.lock();
    if slot.is_some() {
        return Err(DeviceError::usage(
            "trace::start: a trace is already being recorded; call trace::stop first",
        ));
    }
    *slot = Some(Recorder {
        origin: Instant::now(),
        entries: Vec::new(),
        references: HashMap::new(),
        threads: HashMap::new(),
        lanes: HashMap::new(),
        path,
    });
    ENABLED.store(true, Ordering::Relaxed);
    Ok(())
}

pub(super) fn start_from_env() {
    let Some(path) = std::env::var_os("CUFLOW_TRACE") else {
        return;
    };
    if path.is_empty() {
        return;
    }
    match start_with(Some(PathBuf::from(&path))) {
        Ok(()) => {
            tracing::info!("tracing to {} (CUFLOW_TRACE)", path.to_string_lossy());
            crate::backend::at_exit(write_at_exit);
        }
        Err(e) => tracing::warn!("CUFLOW_TRACE: {e}"),
    }
}

/// Writes the `CUFLOW_TRACE` trace at process exit. The exiting thread's thread-locals may
/// be gone by now, so the work runs on a thread of its own; nothing unwinds out of here.
extern "C" fn write_at_exit() {
    let written = std::panic::catch_unwind(|| {
        if RECORDER.lock().is_none() {
            return;
        }
        let writer = std::thread::Builder::new()
            .name("cuflow-trace-exit".into())
            .spawn(|| {
                if let Err(e) = stop() {
                    tracing::warn!("CUFLOW_TRACE: the trace could not be written at exit: {e}");
                }
            });
        match writer {
            Ok(writer) => {
                let _ = writer.join();
            }
            Err(e) => tracing::warn!("CUFLOW_TRACE: could not write the trace at exit: {e}"),
        }
    });
    if written.is_err() {
        tracing::warn!("CUFLOW_TRACE: writing the trace at exit panicked");
    }
}

/// Stops the trace, waits for the traced work to complete, and returns it. When the trace was
/// started by `CUFLOW_TRACE`, it is also written to that file.
///
/// # Errors
///
/// [`DeviceError::Usage`] when no trace is being recorded; an I/O failure writing the
/// `CUFLOW_TRACE` file is [`DeviceError::Usage`] too (the trace is lost);
/// [`DeviceError::Reentrant`] inside a host function or a host kernel, which cannot wait for
/// the traced work (the trace goes on).
///
/// # Examples
///
/// See [the module docs](crate::trace).
pub fn stop() -> Result<Trace> {
    // Before the recorder is taken: stopping waits for the traced work, which a host function
    // or host kernel cannot (it would wait for itself), and the trace would come back untimed.
    if crate::in_host_function() {
        return Err(DeviceError::Reentrant {
            what: "trace::stop inside a host kernel or host function",
        });
    }
    let recorder = {
        let mut slot = RECORDER.lock();
        ENABLED.store(false, Ordering::Relaxed);
        slot.take()
    };
    let Some(recorder) = recorder else {
        return Err(DeviceError::usage(
            "trace::stop: no trace is being recorded; call trace::start first",
        ));
    };
    let path = recorder.path.clone();
    let trace = resolve(recorder);
    if let Some(path) = path {
        std::fs::write(&path, trace.to_chrome_json()).map_err(|e| {
            DeviceError::usage(format!(
                "CUFLOW_TRACE: could not write {}: {e}",
                path.display()
            ))
        })?;
        tracing::info!("trace written to {}", path.display());
    }
    Ok(trace)
}

/// Turns the recorder's entries into a [`Trace`]: per device, a reference event taken now
/// (after the device's traced work) anchors the device timestamps to the host clock.
fn resolve(recorder: Recorder) -> Trace {
    let micros = |t: Instant| t.saturating_duration_since(recorder.origin).as_secs_f64() * 1e6;
    let mut references: HashMap<DeviceId, (EventBackend, f64)> = HashMap::new();
    for (id, stream) in &recorder.references {
        // The reference is recorded on the traced stream, after its work, unless that stream
        // is being captured by now: an event recorded there would be the capture's and never
        // complete by itself (and synchronizing it would spoil the capture), so a stream of its
        // own takes the reference then. The gate keeps a capture from beginning between the
        // look and the record.
        let fresh;
        let event = {
            let Ok(_gate) = stream.enqueue_gate() else {
                continue;
            };
            let target = if stream.is_capturing() {
                let Ok(s) = stream.device().new_stream() else {
                    continue;
                };
                fresh = s;
                &fresh
            } else {
                stream
            };
            target.backend().record_event(true)
        };
        let Ok(event) = event else {
            continue;
        };
        if event.synchronize().is_ok() {
            let now = micros(Instant::now());
            references.insert(*id, (event, now));
        }
    }
    let device_time = |device: &DeviceId, stamp: &Stamp| -> Option<f64> {
        let (reference, at) = references.get(device)?;
        stamp.backend().synchronize().ok()?;
        let ms = stamp.backend().elapsed_ms(reference).ok()?;
        Some(at - f64::from(ms) * 1e3)
    };
    let threads: HashMap<u64, String> = recorder.threads.values().cloned().collect();
    let mut entries: Vec<TraceEntry> = recorder
        .entries
        .into_iter()
        .map(|p| {
            let (start_us, dur_us) = match &p.timing {
                Timing::Host { start, end } => {
                    (Some(micros(*start)), Some(micros(*end) - micros(*start)))
                }
                Timing::Device { device, begin, end } => {
                    let b = device_time(device, begin);
                    let e = match end {
                        Some(end) => device_time(device, end),
                        None => b,
                    };
                    match (b, e) {
                        (Some(b), Some(e)) => (Some(b), Some((e - b).max(0.0))),
                        _ => (None, None),
                    }
                }
            };
            let lane = match p.lane {
                PendingLane::Stream { device, stream } => Lane::Stream { device, stream },
                PendingLane::Thread(id) => Lane::Thread {
                    id,
                    name: threads.get(&id).cloned().unwrap_or_default(),
                },
            };
            TraceEntry {
                kind: p.kind,
                name: p.name.into_owned(),
                lane,
                start_us,
                dur_us,
                args: p.args,
                id: p.id,
                parent: p.parent,
                event: p.event,
            }
        })
        .collect();
    entries.sort_by_key(|e| e.id);
    Trace { entries }
}

/// Runs `enqueue`, which enqueues `work` on `stream` (not capturing), between two timed
/// events, and records it. Called only while tracing is on. The entry's number, both events
/// and the work are taken under the stream's lane lock, so that another thread's work on the
/// stream falls before or after the span, never inside it.
pub(crate) fn traced_enqueue<R>(
    stream: &Stream,
    work: impl FnOnce() -> Work,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let lane_lock = lane_lock(stream);
    let _lane = lane_lock.as_deref().map(ReentrantMutex::lock);
    let id = next_id();
    let begin = stream.backend().record_event(true);
    let result = enqueue()?;
    let end = stream.backend().record_event(true);
    if let (Ok(begin), Ok(end)) = (begin, end) {
        let work = work();
        let parent = current_op();
        with_recorder(|r| {
            let lane = r.stream_lane(stream);
            r.entries.push(Pending {
                id,
                kind: work.kind(),
                name: work.name(),
                lane,
                timing: Timing::Device {
                    device: stream.device().id(),
                    begin: Stamp::Backend(begin),
                    end: Some(Stamp::Backend(end)),
                },
                args: work.args(),
                parent,
                event: None,
            });
        });
    }
    Ok(result)
}

/// Records that `event` (timed, traced) was recorded on `stream`.
pub(crate) fn note_event_record(stream: &Stream, event: &Event) {
    let parent = current_op();
    with_recorder(|r| {
        let lane = r.stream_lane(stream);
        r.entries.push(Pending {
            id: next_id(),
            kind: EntryKind::EventRecord,
            name: Cow::Owned(format!("e{}", event.inner.trace_id)),
            lane,
            timing: Timing::Device {
                device: stream.device().id(),
                begin: Stamp::Event(event.clone()),
                end: None,
            },
            args: vec![("event", event.inner.trace_id.to_string())],
            parent,
            event: Some(event.inner.trace_id),
        });
    });
}

/// Records that `stream` (not capturing) waits for `event` from now on: a timed event
/// recorded after the wait tells when the stream went on.
pub(crate) fn note_event_wait(stream: &Stream, event: &Event) {
    let lane_lock = lane_lock(stream);
    let _lane = lane_lock.as_deref().map(ReentrantMutex::lock);
    let id = next_id();
    let Ok(after) = stream.backend().record_event(true) else {
        return;
    };
    let parent = current_op();
    let number = event.inner.trace_id;
    with_recorder(|r| {
        let lane = r.stream_lane(stream);
        let name = match number {
            0 => Cow::Borrowed("wait (untraced event)"),
            n => Cow::Owned(format!("wait e{n}")),
        };
        r.entries.push(Pending {
            id,
            kind: EntryKind::EventWait,
            name,
            lane,
            timing: Timing::Device {
                device: stream.device().id(),
                begin: Stamp::Backend(after),
                end: None,
            },
            args: vec![
                ("event", number.to_string()),
                ("from_stream", event.inner.stream.to_string()),
            ],
            parent,
            event: (number != 0).then_some(number),
        });
    });
}

fn push_host_span(
    kind: EntryKind,
    name: Cow<'static, str>,
    id: u64,
    parent: Option<u64>,
    start: Instant,
) {
    let end = Instant::now();
    with_recorder(|r| {
        if start < r.origin {
            return;
        }
        let thread = r.thread_number();
        r.entries.push(Pending {
            id,
            kind,
            name,
            lane: PendingLane::Thread(thread),
            timing: Timing::Host { start, end },
            args: Vec::new(),
            parent,
            event: None,
        });
    });
}

/// A host wait being traced: recorded when dropped.
pub(crate) struct HostWait {
    what: &'static str,
    id: u64,
    parent: Option<u64>,
    start: Instant,
}

impl HostWait {
    /// Begins tracing a host wait, when tracing is on.
    #[inline]
    pub(crate) fn begin(what: &'static str) -> Option<HostWait> {
        if !super::is_enabled() {
            return None;
        }
        Some(HostWait {
            what,
            id: next_id(),
            parent: current_op(),
            start: Instant::now(),
        })
    }
}

impl Drop for HostWait {
    fn drop(&mut self) {
        push_host_span(
            EntryKind::HostWait,
            Cow::Borrowed(self.what),
            self.id,
            self.parent,
            self.start,
        );
    }
}

/// An op span being traced (see [`op_span`]); the span ends when this is dropped.
///
/// The span is pushed on the opening thread's stack of spans and must end there, so the guard
/// is not `Send`: it cannot be moved to, or dropped on, another thread (nor held across an
/// `.await` in a future that must be `Send`).
///
/// ```compile_fail,E0277
/// fn assert_send<T: Send>(_: T) {}
/// assert_send(cuflow_runtime::trace::op_span("moved"));
/// ```
///
/// ```compile_fail,E0277
/// let span = cuflow_runtime::trace::op_span("moved");
/// std::thread::spawn(move || drop(span));
/// ```
#[must_use = "the span ends when this guard is dropped"]
#[derive(Debug)]
pub struct OpSpan {
    active: Option<ActiveSpan>,
    /// Not `Send`: the span must end on the thread it was opened on.
    _not_send: PhantomData<*const ()>,
}

#[derive(Debug)]
struct ActiveSpan {
    name: Cow<'static, str>,
    id: u64,
    parent: Option<u64>,
    start: Instant,
    nvtx: Option<u64>,
}

/// Opens an op span named `name` on the calling thread, until the returned guard is dropped:
/// stream work, event records and waits enqueued meanwhile belong to it, and spans opened
/// meanwhile nest in it. The executor opens one per execution, `zip!` branch, `shared`
/// producer and named op; programs may open their own. While tracing is off this does
/// nothing (one atomic load); on a CUDA device with NVTX available, the span is also an NVTX
/// range.
///
/// ```
/// use cuflow_runtime::trace;
/// # let _lock = trace::tests_serial();
/// trace::start()?;
/// {
///     let _outer = trace::op_span("outer");
///     let _inner = trace::op_span("inner");
/// }
/// let t = trace::stop()?;
/// let inner = t.op_spans().find(|s| s.name == "inner").unwrap();
/// assert_eq!(t.op_path(inner), ["outer"]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn op_span(name: impl Into<Cow<'static, str>>) -> OpSpan {
    if !super::is_enabled() {
        return OpSpan {
            active: None,
            _not_send: PhantomData,
        };
    }
    let name = name.into();
    let id = next_id();
    let parent = OP_STACK.with(|s| {
        let mut s = s.borrow_mut();
        let parent = s.last().copied();
        s.push(id);
        parent
    });
    let nvtx = crate::backend::nvtx_start(&name);
    OpSpan {
        active: Some(ActiveSpan {
            name,
            id,
            parent,
            start: Instant::now(),
            nvtx,
        }),
        _not_send: PhantomData,
    }
}

impl Drop for OpSpan {
    fn drop(&mut self) {
        let Some(span) = self.active.take() else {
            return;
        };
        OP_STACK.with(|s| {
            let mut s = s.borrow_mut();
            if let Some(pos) = s.iter().rposition(|&id| id == span.id) {
                s.truncate(pos);
            }
        });
        if let Some(range) = span.nvtx {
            crate::backend::nvtx_end(range);
        }
        push_host_span(EntryKind::Op, span.name, span.id, span.parent, span.start);
    }
}

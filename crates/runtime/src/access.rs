//! Automatic ordering of buffer accesses across streams.
//!
//! Every launch, copy, memset, GEMM and graph replay declares the buffers it reads and writes
//! ([`Access`]) and is enqueued through [`ordered`]. Before the work is enqueued on a stream `S`,
//! `S` waits for the conflicting accesses made on other streams:
//!
//! - a **write** waits for the last write and for every read since it;
//! - a **read** waits for the last write only, so reads on several streams stay concurrent;
//! - work on the stream of the conflicting access adds nothing (a stream is in order), and
//!   neither does a conflict that `S` is already known to wait for: each stream remembers, per
//!   other stream, the latest point of that stream it has waited on (its *sequence number*: a
//!   stream counts the tracked accesses enqueued on it), so the fork and join events of a DAG
//!   are not doubled by the tracker.
//!
//! Invariants:
//! - The stream's capture gate is held shared from the capture check until the work is
//!   enqueued: a capture cannot begin in between and record this work.
//! - The state of every buffer an access names is locked, in address order (no lock-order
//!   cycle), from before the waits until after the work is enqueued and the state updated, so
//!   another thread's conflicting access either sees this one or is seen by it: an event that
//!   another stream records on `S` to order itself after this access is recorded after the
//!   work was enqueued. Work enqueued on two streams at once (a copy staged between devices)
//!   is one access on each, under the locks of both its buffers until the work of both
//!   streams is enqueued ([`order_enqueue_record_across`]).
//! - A stream's sequence number grows only after the work it stands for was enqueued, and an
//!   event carries the number read *before* it was recorded: an event never claims to cover
//!   work enqueued after it.
//! - Captured work never runs by itself, so accesses made on a stream being captured are kept
//!   apart from the eager ones, in a state scoped to that capture (ordering its streams with
//!   captured events). A replay of the graph is then one eager access of every buffer the graph
//!   touches (a write where the captured work wrote). Eager work never records an event on a
//!   capturing stream (that would pull it into another thread's graph): to order itself after
//!   the eager work such a stream did before its capture, it waits on the event the stream
//!   recorded just before it began capturing (its *fence*).
//! - Eager work of the thread that is capturing never touches a buffer its open capture wrote:
//!   in that thread's program the captured write came first, but it has not run, so the work
//!   would see the data from before it. Such work is refused with
//!   [`DeviceError::Capture`](crate::DeviceError::Capture). Other threads are not ordered
//!   with the capture and see the buffer as it was before it.
//!
//! The tracker is a concurrency core (see [`crate::sync`]): [`order_enqueue_record`] and the
//! state it keeps ([`AccessState`] per buffer, [`AccessClock`] per stream) know streams and
//! buffers only through [`TrackedStream`] and [`TrackedBuffer`], and take their locks and
//! atomics from [`crate::sync`]. [`ordered`] runs it on [`Stream`]s and buffer memory; the
//! loom models in `loom_tests/access.rs` run the same code on model streams, whose queues and
//! events stand in for a backend's, and check every interleaving of conflicting accesses made
//! from two threads.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::error::Result;
use crate::memory::{Memory, UseState};
use crate::stream::{Stream, StreamId};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};
use crate::trace::{self, Work};

/// How a piece of work uses a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The work only reads the buffer.
    Read,
    /// The work writes (and may read) the buffer.
    Write,
}

/// A stream as the tracker sees it.
pub(crate) trait TrackedStream: Clone {
    /// Whether two handles name the same stream.
    fn same(&self, other: &Self) -> bool;

    /// The stream's sequence number and what it has waited for.
    fn clock(&self) -> &AccessClock;

    /// Makes work enqueued on this stream from now on wait for `other`'s work up to its
    /// sequence number `seq`.
    fn order_after(&self, other: &Self, seq: u64) -> Result<()>;

    /// Whether all the work enqueued on this stream so far has finished, told without waiting
    /// (`false` when that cannot be told at once): its accesses are over, and nothing needs to
    /// wait for them.
    fn is_idle(&self) -> bool;
}

/// How many streams a buffer remembers as readers (and, in its use state, as users) before it
/// first looks for idle ones to forget: a buffer read from ever new streams (a stream per
/// request, over long-lived weights) would otherwise keep every one of them alive. Looking
/// costs a query of each stream remembered, so the bound is above the stream pools programs
/// use: a buffer used round-robin from a pool of up to this many streams never looks.
pub(crate) const USES_BEFORE_FORGETTING: usize = 64;

/// Called before a new stream joins `streams` (a buffer's users or readers): once they number
/// at least [`USES_BEFORE_FORGETTING`] and `forget_at`, forgets those that `is_idle` says are
/// idle, but for the last (the most recent), kept; the next look comes when the streams left
/// double. The caller holds the buffer's lock: no use of it is enqueued meanwhile.
#[inline]
pub(crate) fn forget_idle_when_due<A: smallvec::Array>(
    streams: &mut SmallVec<A>,
    forget_at: &mut usize,
    is_idle: impl Fn(&A::Item) -> bool,
) {
    if streams.len() >= (*forget_at).max(USES_BEFORE_FORGETTING) {
        forget_idle(streams, forget_at, is_idle);
    }
}

/// [`forget_idle_when_due`] once due: out of line, as it queries every stream.
#[cold]
#[inline(never)]
fn forget_idle<A: smallvec::Array>(
    streams: &mut SmallVec<A>,
    forget_at: &mut usize,
    is_idle: impl Fn(&A::Item) -> bool,
) {
    let last = streams.len().saturating_sub(1);
    *streams = std::mem::take(streams)
        .into_iter()
        .enumerate()
        .filter(|(i, s)| *i == last || !is_idle(s))
        .map(|(_, s)| s)
        .collect();
    *forget_at = 2 * streams.len();
}

/// A buffer as the tracker sees it.
pub(crate) trait TrackedBuffer {
    /// The streams its work is enqueued on.
    type Stream: TrackedStream;
    /// What its lock guards: its [`AccessState`], and what else the buffer keeps with it.
    type State;

    /// The lock over the buffer's state. Its address identifies the buffer and orders the
    /// locking of several buffers.
    fn state(&self) -> &Mutex<Self::State>;

    /// The hazards within the state.
    fn access_state(state: &mut Self::State) -> &mut AccessState<Self::Stream>;

    /// Notes, under the lock, that work using the buffer as `access` was enqueued on `stream`
    /// (within the capture `capture`, if any).
    fn note_enqueued(
        &self,
        state: &mut Self::State,
        stream: &Self::Stream,
        access: Access,
        capture: Option<u64>,
    );

    /// Whether the capture `id` is still open: the hazards of closed captures are forgotten.
    fn capture_open(id: u64) -> bool;

    /// Whether the capture `id` is open and the calling thread is the one capturing: its eager
    /// work must not touch what that capture wrote (see [`AccessState::check_eager`]).
    fn capture_open_here(id: u64) -> bool;
}

/// A stream's side of the tracker: its sequence number (the tracked accesses enqueued on it so
/// far), and per other stream, the highest sequence number of it this stream has waited for
/// with an eager event.
pub(crate) struct AccessClock {
    /// The stream this clock belongs to: waits for itself are not noted.
    stream: StreamId,
    seq: AtomicU64,
    /// At most [`WAITS_REMEMBERED`] streams, the oldest forgotten first.
    waited: Mutex<SmallVec<[(StreamId, u64); 4]>>,
}

/// How many other streams a stream remembers having waited for. What it remembers only saves
/// waits (a forgotten stream is waited for again, which orders nothing wrongly), so a stream
/// that lives long beside ever new streams keeps a bounded list, and a short search; the
/// bound is that of the streams a buffer remembers, above the pools programs use.
const WAITS_REMEMBERED: usize = USES_BEFORE_FORGETTING;

impl AccessClock {
    pub(crate) fn new(stream: StreamId) -> Self {
        AccessClock {
            stream,
            seq: AtomicU64::new(0),
            waited: Mutex::new(SmallVec::new()),
        }
    }

    /// Counts one tracked access whose work has been enqueued; returns its sequence number.
    pub(crate) fn advance(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Records an event of the stream with `record`, and returns it with the sequence number
    /// read *before* the record: the event covers at least the accesses that number counts.
    pub(crate) fn stamp<E>(&self, record: impl FnOnce() -> Result<E>) -> Result<(E, u64)> {
        let seq = self.seq.load(Ordering::Acquire);
        Ok((record()?, seq))
    }

    /// Notes that the stream has waited on an eager event of `other` stamped `seq`.
    pub(crate) fn note_waited(&self, other: StreamId, seq: u64) {
        if other == self.stream {
            return;
        }
        let mut waited = self.waited.lock();
        match waited.iter_mut().find(|(id, _)| *id == other) {
            Some((_, s)) => *s = (*s).max(seq),
            None => {
                if waited.len() >= WAITS_REMEMBERED {
                    waited.remove(0);
                }
                waited.push((other, seq))
            }
        }
    }

    /// Whether the stream already waits, with an eager event, for `other`'s work up to
    /// sequence number `seq`.
    fn has_waited_for(&self, other: StreamId, seq: u64) -> bool {
        self.waited
            .lock()
            .iter()
            .any(|(id, s)| *id == other && *s >= seq)
    }

    /// Orders the stream after `other`'s eager work up to `seq` (`u64::MAX`: all of it): nothing
    /// when it already waits for that far; otherwise `event` gives an eager event after
    /// `other`'s work so far (`None`: none is needed) and `wait` makes the stream wait on it,
    /// noting the wait ([`AccessClock::note_waited`]).
    pub(crate) fn order_after<E>(
        &self,
        other: StreamId,
        seq: u64,
        event: impl FnOnce() -> Result<Option<E>>,
        wait: impl FnOnce(&E) -> Result<()>,
    ) -> Result<()> {
        if seq != u64::MAX && self.has_waited_for(other, seq) {
            return Ok(());
        }
        match event()? {
            Some(event) => wait(&event),
            None => Ok(()),
        }
    }
}

/// A point in a stream's work: the stream, and its sequence number after the access.
#[derive(Clone)]
pub(crate) struct Point<S> {
    stream: S,
    seq: u64,
}

/// The accesses to one buffer that later accesses must order themselves after.
pub(crate) struct Hazards<S> {
    last_write: Option<Point<S>>,
    reads: SmallVec<[Point<S>; 2]>,
    /// The number of reads at which the next read on a new stream forgets those of idle
    /// streams (at least [`USES_BEFORE_FORGETTING`]).
    forget_reads_at: usize,
}

impl<S> Default for Hazards<S> {
    fn default() -> Self {
        Hazards {
            last_write: None,
            reads: SmallVec::new(),
            forget_reads_at: 0,
        }
    }
}

impl<S: TrackedStream> Hazards<S> {
    /// The points of streams other than `on` that an access of kind `access` on `on` must
    /// wait for (a stream is in order with itself).
    fn conflicts(&self, access: Access, on: &S, out: &mut SmallVec<[Point<S>; 4]>) {
        // Pushed one by one: `extend` over a filtered iterator costs more than the few
        // points a buffer holds.
        if let Some(p) = &self.last_write {
            if !p.stream.same(on) {
                out.push(p.clone());
            }
        }
        if access == Access::Write {
            for p in &self.reads {
                if !p.stream.same(on) {
                    out.push(p.clone());
                }
            }
        }
    }

    /// Records an access of kind `access` at `seq` of `stream`. A point already held for
    /// `stream` is moved forward in place.
    fn record(&mut self, access: Access, stream: &S, seq: u64) {
        match access {
            Access::Write => {
                match &mut self.last_write {
                    Some(p) if p.stream.same(stream) => p.seq = seq,
                    last => {
                        *last = Some(Point {
                            stream: stream.clone(),
                            seq,
                        })
                    }
                }
                self.reads.clear();
            }
            Access::Read => match self.reads.iter_mut().find(|p| p.stream.same(stream)) {
                Some(p) => p.seq = seq,
                None => {
                    // A later write need not wait for the reads of idle streams.
                    forget_idle_when_due(&mut self.reads, &mut self.forget_reads_at, |p| {
                        p.stream.is_idle()
                    });
                    self.reads.push(Point {
                        stream: stream.clone(),
                        seq,
                    })
                }
            },
        }
    }
}

/// The eager hazards of a buffer, and those of each open capture recording it.
pub(crate) struct AccessState<S = Stream> {
    eager: Hazards<S>,
    /// Hazards of captured work, one entry per capture, tagged with its id: two captures open
    /// at once (on two threads, or one thread's two streams) each keep their own, so that one
    /// capture's accesses never erase the order another capture's later work must keep.
    captured: SmallVec<[(u64, Hazards<S>); 1]>,
}

impl<S> Default for AccessState<S> {
    fn default() -> Self {
        AccessState {
            eager: Hazards::default(),
            captured: SmallVec::new(),
        }
    }
}

impl<S> AccessState<S> {
    /// Refuses eager work (`capture` is `None`) of the capturing thread on a buffer that its
    /// open capture wrote: that write is recorded, not run, so the eager work would see the
    /// data from before a write it follows in the program (a read-back, a copy or a kernel
    /// would return `Ok` over data nothing wrote). `here` says which captures are open on
    /// the calling thread. Other threads' eager work is not ordered with the capture, and
    /// sees the buffer as it was before it, as it would had it run first.
    fn check_eager(
        &self,
        op: &'static str,
        capture: Option<u64>,
        here: impl Fn(u64) -> bool,
    ) -> Result<()> {
        if capture.is_some() || self.captured.is_empty() {
            return Ok(());
        }
        match self
            .captured
            .iter()
            .find(|(id, h)| h.last_write.is_some() && here(*id))
        {
            Some(_) => Err(written_by_open_capture(op)),
            None => Ok(()),
        }
    }

    fn scope(&mut self, capture: Option<u64>) -> Option<&mut Hazards<S>> {
        match capture {
            None => Some(&mut self.eager),
            Some(id) => self
                .captured
                .iter_mut()
                .find(|(cid, _)| *cid == id)
                .map(|(_, h)| h),
        }
    }

    /// The hazards of the scope `capture`, made when the capture first touches the buffer;
    /// then the entries of captures that have closed (`open` says which are open) are dropped.
    fn scope_or_new(
        &mut self,
        capture: Option<u64>,
        open: impl Fn(u64) -> bool,
    ) -> &mut Hazards<S> {
        let Some(id) = capture else {
            return &mut self.eager;
        };
        let at = match self.captured.iter().position(|(cid, _)| *cid == id) {
            Some(at) => at,
            None => {
                self.captured.retain(|(cid, _)| open(*cid));
                self.captured.push((id, Hazards::default()));
                self.captured.len() - 1
            }
        };
        &mut self.captured[at].1
    }
}

/// The error of eager work that would use a buffer the calling thread's open capture wrote.
#[cold]
#[inline(never)]
fn written_by_open_capture(op: &'static str) -> crate::DeviceError {
    crate::DeviceError::Capture {
        op: op.to_string(),
        reason: "a buffer it uses was written by work this thread is capturing into a graph: \
                 captured work is recorded, not run, so this eager work would see the data \
                 from before that write; do it inside the capture (on a capturing stream), or \
                 after the capture ended and the graph was replayed"
            .into(),
    }
}

/// The buffers one piece of work touches and how.
pub(crate) type Accesses<'a> = SmallVec<[(&'a Arc<Memory>, Access); 4]>;

/// Enqueues work on `stream` with `enqueue`, after ordering `stream` behind the conflicting
/// accesses of other streams to the buffers in `accesses` (see the module docs), and records
/// the accesses.
///
/// # Errors
///
/// [`DeviceError::Capture`](crate::DeviceError::Capture) when `stream` is being captured by
/// another thread; the error of waiting; the error of `enqueue`.
pub(crate) fn ordered<R>(
    stream: &Stream,
    op: &'static str,
    accesses: Accesses<'_>,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    ordered_traced(stream, op, || Work::Other(op), accesses, enqueue)
}

/// [`ordered`], with what the work is for the trace (`work` is called only while tracing is
/// on; off, the trace costs one relaxed load here).
pub(crate) fn ordered_traced<R>(
    stream: &Stream,
    op: &'static str,
    work: impl FnOnce() -> Work,
    accesses: Accesses<'_>,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let _gate = stream.enqueue_gate()?;
    let capture = stream.capture_id_for_enqueue(op)?;
    if trace::is_enabled() && capture.is_none() {
        return ordered_cold(stream, op, work, capture, accesses, enqueue);
    }
    if accesses.is_empty() {
        // Nothing to order or record: the gate alone keeps a capture from beginning between
        // the check above and the enqueue.
        return enqueue();
    }
    order_enqueue_record(stream, op, capture, accesses, enqueue)
}

/// [`ordered`] for a copy of `bytes` bytes.
pub(crate) fn ordered_copy<R>(
    stream: &Stream,
    op: &'static str,
    bytes: usize,
    accesses: Accesses<'_>,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    ordered_traced(
        stream,
        op,
        || Work::Copy { what: op, bytes },
        accesses,
        enqueue,
    )
}

/// [`ordered_copy`] for a copy of `bytes` bytes between two devices whose work is enqueued on
/// two streams: it reads `src` on `src_stream` and writes `dst` on `dst_stream`, the
/// destination's stream (a copy staged through host memory). `enqueue` enqueues the work of
/// both streams while both buffers' states are locked ([`order_enqueue_record_across`]).
///
/// # Errors
///
/// [`DeviceError::Capture`](crate::DeviceError::Capture) when either stream is being captured
/// (work across devices cannot be recorded into a graph); the error of waiting; the error of
/// `enqueue`.
pub(crate) fn ordered_copy_across<R>(
    (src_stream, src): (&Stream, &Arc<Memory>),
    (dst_stream, dst): (&Stream, &Arc<Memory>),
    op: &'static str,
    bytes: usize,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let _src_gate = src_stream.enqueue_gate()?;
    let _dst_gate = dst_stream.enqueue_gate()?;
    src_stream.forbid_in_capture(op)?;
    dst_stream.forbid_in_capture(op)?;
    let work = || Work::Copy { what: op, bytes };
    order_enqueue_record_across((src_stream, src), (dst_stream, dst), op, || {
        if trace::is_enabled() {
            trace::traced_enqueue(dst_stream, work, enqueue)
        } else {
            enqueue()
        }
    })
}

/// The traced path of [`ordered_traced`]: the work is enqueued between the trace's events.
#[cold]
#[inline(never)]
fn ordered_cold<R>(
    stream: &Stream,
    op: &'static str,
    work: impl FnOnce() -> Work,
    capture: Option<u64>,
    accesses: Accesses<'_>,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let traced = || trace::traced_enqueue(stream, work, enqueue);
    if accesses.is_empty() {
        return traced();
    }
    order_enqueue_record(stream, op, capture, accesses, traced)
}

/// The tracker (see the module docs): locks the state of every buffer in `accesses` in address
/// order, makes `stream` wait for the conflicting accesses of other streams in the scope
/// `capture` (eager work, or one capture's), enqueues the work with `enqueue`, counts it on
/// `stream`'s clock and records it in each buffer's state, and only then unlocks. The caller
/// holds `stream`'s capture gate from the capture check on.
///
/// # Errors
///
/// The error of waiting (nothing was enqueued nor recorded); the error of `enqueue` (the
/// accesses are recorded all the same).
pub(crate) fn order_enqueue_record<B: TrackedBuffer, R>(
    stream: &B::Stream,
    op: &'static str,
    capture: Option<u64>,
    mut accesses: SmallVec<[(&B, Access); 4]>,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    if let [(buffer, access)] = accesses[..] {
        // One buffer (most launches): the same steps, without the sort and the lists.
        let mut state = buffer.state().lock();
        B::access_state(&mut state).check_eager(op, capture, B::capture_open_here)?;
        let mut waits: SmallVec<[Point<B::Stream>; 4]> = SmallVec::new();
        if let Some(h) = B::access_state(&mut state).scope(capture) {
            h.conflicts(access, stream, &mut waits);
        }
        wait_for_points(stream, &waits)?;
        let result = enqueue();
        let seq = stream.clock().advance();
        record_enqueued(buffer, &mut state, access, stream, seq, capture);
        return result;
    }
    accesses.sort_by_key(|(b, _)| std::ptr::from_ref(b.state()) as usize);
    accesses.dedup_by(|later, earlier| {
        if std::ptr::eq(later.0.state(), earlier.0.state()) {
            if later.1 == Access::Write {
                earlier.1 = Access::Write;
            }
            true
        } else {
            false
        }
    });
    let mut states: SmallVec<[MutexGuard<'_, B::State>; 4]> = SmallVec::new();
    for (b, _) in &accesses {
        states.push(b.state().lock());
    }
    for state in &mut states {
        B::access_state(state).check_eager(op, capture, B::capture_open_here)?;
    }
    let mut waits: SmallVec<[Point<B::Stream>; 4]> = SmallVec::new();
    for (state, (_, access)) in states.iter_mut().zip(&accesses) {
        if let Some(h) = B::access_state(state).scope(capture) {
            h.conflicts(*access, stream, &mut waits);
        }
    }
    wait_for_points(stream, &waits)?;
    let result = enqueue();
    let seq = stream.clock().advance();
    for (state, (buffer, access)) in states.iter_mut().zip(&accesses) {
        record_enqueued(*buffer, state, *access, stream, seq, capture);
    }
    result
}

/// [`order_enqueue_record`] for eager work enqueued on two streams at once, that reads `src` on
/// `src_stream` and writes `dst` (another buffer) on `dst_stream`: both states are locked, in
/// address order, from before either stream waits until `enqueue` has enqueued the work of
/// both, both clocks have counted it and both buffers recorded it. Recording the read on
/// `src_stream` before its work is enqueued there would let a writer of `src` order itself
/// after an event that precedes that work.
///
/// # Errors
///
/// As [`order_enqueue_record`].
pub(crate) fn order_enqueue_record_across<B: TrackedBuffer, R>(
    (src_stream, src): (&B::Stream, &B),
    (dst_stream, dst): (&B::Stream, &B),
    op: &'static str,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    debug_assert!(!std::ptr::eq(src.state(), dst.state()));
    let (mut src_state, mut dst_state);
    if std::ptr::from_ref(src.state()) < std::ptr::from_ref(dst.state()) {
        src_state = src.state().lock();
        dst_state = dst.state().lock();
    } else {
        dst_state = dst.state().lock();
        src_state = src.state().lock();
    }
    B::access_state(&mut src_state).check_eager(op, None, B::capture_open_here)?;
    B::access_state(&mut dst_state).check_eager(op, None, B::capture_open_here)?;
    let mut waits: SmallVec<[Point<B::Stream>; 4]> = SmallVec::new();
    if let Some(h) = B::access_state(&mut src_state).scope(None) {
        h.conflicts(Access::Read, src_stream, &mut waits);
    }
    wait_for_points(src_stream, &waits)?;
    waits.clear();
    if let Some(h) = B::access_state(&mut dst_state).scope(None) {
        h.conflicts(Access::Write, dst_stream, &mut waits);
    }
    wait_for_points(dst_stream, &waits)?;
    let result = enqueue();
    let seq = src_stream.clock().advance();
    record_enqueued(src, &mut src_state, Access::Read, src_stream, seq, None);
    let seq = dst_stream.clock().advance();
    record_enqueued(dst, &mut dst_state, Access::Write, dst_stream, seq, None);
    result
}

/// Makes `stream` wait for each of the points `waits`, but for one covered by an earlier
/// point of the same stream.
fn wait_for_points<S: TrackedStream>(stream: &S, waits: &[Point<S>]) -> Result<()> {
    for (i, p) in waits.iter().enumerate() {
        let repeated = waits[..i]
            .iter()
            .any(|q| q.stream.same(&p.stream) && q.seq >= p.seq);
        if !repeated {
            stream.order_after(&p.stream, p.seq)?;
        }
    }
    Ok(())
}

/// Records, under `buffer`'s lock (`state`), an access of kind `access` enqueued on `stream` at
/// its sequence number `seq`, in the scope `capture`.
fn record_enqueued<B: TrackedBuffer>(
    buffer: &B,
    state: &mut B::State,
    access: Access,
    stream: &B::Stream,
    seq: u64,
    capture: Option<u64>,
) {
    B::access_state(state)
        .scope_or_new(capture, B::capture_open)
        .record(access, stream, seq);
    buffer.note_enqueued(state, stream, access, capture);
}

impl TrackedStream for Stream {
    fn same(&self, other: &Self) -> bool {
        Stream::same(self, other)
    }

    fn clock(&self) -> &AccessClock {
        &self.inner.clock
    }

    fn order_after(&self, other: &Self, seq: u64) -> Result<()> {
        Stream::order_after(self, other, seq)
    }

    fn is_idle(&self) -> bool {
        Stream::is_idle(self)
    }
}

impl TrackedBuffer for Arc<Memory> {
    type Stream = Stream;
    type State = UseState;

    fn state(&self) -> &Mutex<UseState> {
        &self.state
    }

    fn access_state(state: &mut UseState) -> &mut AccessState {
        &mut state.access
    }

    fn note_enqueued(
        &self,
        state: &mut UseState,
        stream: &Stream,
        access: Access,
        capture: Option<u64>,
    ) {
        state.note_use(stream);
        if capture.is_some() {
            stream.note_capture_use(self, access);
        }
    }

    fn capture_open(id: u64) -> bool {
        crate::capture::capture_is_open(id)
    }

    fn capture_open_here(id: u64) -> bool {
        crate::capture::capture_is_open_here(id)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A stream that waits for ever new streams remembers a bounded number of them, the most
    /// recent, and still knows how far it waited for those.
    #[test]
    fn a_clock_remembers_the_latest_streams_it_waited_for() {
        let clock = AccessClock::new(StreamId(1));
        for other in 2..1002 {
            clock.note_waited(StreamId(other), other);
        }
        assert_eq!(clock.waited.lock().len(), WAITS_REMEMBERED);
        assert!(clock.has_waited_for(StreamId(1001), 1001));
        assert!(!clock.has_waited_for(StreamId(1001), 1002));
        assert!(!clock.has_waited_for(StreamId(2), 1));
    }
}

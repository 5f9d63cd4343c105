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
//!   work was enqueued.
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

use smallvec::SmallVec;

use crate::error::Result;
use crate::memory::{Memory, UseState};
use crate::stream::Stream;
use crate::sync::{Arc, MutexGuard};

/// How a piece of work uses a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The work only reads the buffer.
    Read,
    /// The work writes (and may read) the buffer.
    Write,
}

/// A point in a stream's work: the stream, and its sequence number after the access.
#[derive(Clone)]
pub(crate) struct Point {
    stream: Stream,
    seq: u64,
}

/// The accesses to one buffer that later accesses must order themselves after.
#[derive(Default)]
pub(crate) struct Hazards {
    last_write: Option<Point>,
    reads: SmallVec<[Point; 2]>,
}

impl Hazards {
    /// The points an access of kind `access` must wait for.
    fn conflicts(&self, access: Access, out: &mut SmallVec<[Point; 4]>) {
        if let Some(w) = &self.last_write {
            out.push(w.clone());
        }
        if access == Access::Write {
            out.extend(self.reads.iter().cloned());
        }
    }

    fn record(&mut self, access: Access, point: &Point) {
        match access {
            Access::Write => {
                self.last_write = Some(point.clone());
                self.reads.clear();
            }
            Access::Read => match self.reads.iter_mut().find(|p| p.stream.same(&point.stream)) {
                Some(p) => p.seq = point.seq,
                None => self.reads.push(point.clone()),
            },
        }
    }
}

/// The eager hazards of a buffer, and those of the capture currently recording it.
#[derive(Default)]
pub(crate) struct AccessState {
    eager: Hazards,
    /// Hazards of captured work, tagged with the id of the capture they belong to.
    captured: Option<(u64, Hazards)>,
}

impl AccessState {
    fn scope(&mut self, capture: Option<u64>) -> Option<&mut Hazards> {
        match capture {
            None => Some(&mut self.eager),
            Some(id) => match &mut self.captured {
                Some((cid, h)) if *cid == id => Some(h),
                _ => None,
            },
        }
    }

    fn scope_or_new(&mut self, capture: Option<u64>) -> &mut Hazards {
        match capture {
            None => &mut self.eager,
            Some(id) => {
                if !matches!(&self.captured, Some((cid, _)) if *cid == id) {
                    self.captured = Some((id, Hazards::default()));
                }
                match &mut self.captured {
                    Some((_, h)) => h,
                    None => &mut self.eager,
                }
            }
        }
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
    mut accesses: Accesses<'_>,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let _gate = stream.enqueue_gate();
    let capture = stream.capture_id_for_enqueue(op)?;
    if accesses.is_empty() {
        // Nothing to order or record: the gate alone keeps a capture from beginning between
        // the check above and the enqueue.
        return enqueue();
    }
    accesses.sort_by_key(|(m, _)| Arc::as_ptr(m) as usize);
    accesses.dedup_by(|later, earlier| {
        if Arc::ptr_eq(later.0, earlier.0) {
            if later.1 == Access::Write {
                earlier.1 = Access::Write;
            }
            true
        } else {
            false
        }
    });
    let mut states: SmallVec<[MutexGuard<'_, UseState>; 4]> =
        accesses.iter().map(|(m, _)| m.state.lock()).collect();
    let mut waits: SmallVec<[Point; 4]> = SmallVec::new();
    for (state, (_, access)) in states.iter_mut().zip(&accesses) {
        if let Some(h) = state.access.scope(capture) {
            h.conflicts(*access, &mut waits);
        }
    }
    for (i, p) in waits.iter().enumerate() {
        let repeated = waits[..i]
            .iter()
            .any(|q| q.stream.same(&p.stream) && q.seq >= p.seq);
        if !repeated && !p.stream.same(stream) {
            stream.order_after(&p.stream, p.seq)?;
        }
    }
    let result = enqueue();
    let point = Point {
        stream: stream.clone(),
        seq: stream.advance(),
    };
    for (state, (mem, access)) in states.iter_mut().zip(&accesses) {
        state.access.scope_or_new(capture).record(*access, &point);
        state.note_use(stream);
        if capture.is_some() {
            stream.note_capture_use(mem, *access);
        }
    }
    result
}

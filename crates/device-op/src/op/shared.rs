//! `shared`: a cloneable op that runs at most once.
//!
//! An explicit state machine, [`RunOnce`], moved by compare-and-swap: `IDLE → RUNNING →
//! COMPLETE`, or `RUNNING → POISONED` when the op fails or panics (a guard poisons on unwind).
//! The first consumer to win the CAS runs the op on its own context and, if the op enqueued
//! device work (the context's earlier work is not the op's), records an event; consumers on
//! other streams wait on that event, so they never read the output before it is written. A
//! consumer that finds the op running on another thread blocks until it finishes; one that
//! finds it running on its own thread, or whose wait would close a cycle of waits across
//! threads (two shared ops consuming each other), gets [`DeviceError::Reentrant`].
//!
//! Every consumer, on any stream (the producer's own included), orders its work after the
//! producer's completion event and counts as device work, so its execution completes only
//! after the producer's. The production runs in an error scope nested in the scope of the
//! context it runs in (its execution's, or its `zip!` branch's), and every consumer's scope
//! depends on it: a failure of the production's work that shows only once it ran (a host
//! function's panic) fails every consumer, on every backend, and not only the execution that
//! produced. On the host backend the production's completion event also carries the failures of
//! the work the production follows in its own context; not those of other branches of the
//! execution that share its stream. A value produced inside a capture is written only by
//! replays of the graph: consuming it outside that capture is a [`DeviceError::Capture`].
//!
//! Invariants of the state machine:
//! - Only the CAS winner leaves `IDLE`, so the op runs at most once. The outcome is stored,
//!   under its lock, before the state leaves `RUNNING`; a consumer that saw `RUNNING` waits on
//!   that lock's condition variable for the outcome and takes it, never looping on the state.
//! - An edge of the wait graph names an op still `RUNNING`: it is added, under the graph's
//!   lock, only while the op's state is `RUNNING`, and the producer drops its op's edges,
//!   under the same lock, after the state has left it. A consumer whose look at an op crossed
//!   the op's end therefore never leaves an edge that closes a cycle that is not there.
//! - The guard of the producer publishes an outcome however the producer ends: its own, or
//!   [`DeviceError::Poisoned`] when it unwinds. No consumer waits for ever on a producer that
//!   panicked.
//!
//! [`RunOnce`] and the [`WaitGraph`] are a concurrency core (see `cuflow_runtime::sync`): they
//! know no device, take their atomics, locks and thread ids from the `sync` shim, and the loom
//! models in `loom_tests/shared.rs` run them in every interleaving of two consumers.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cuflow_runtime::sync::thread::{self, ThreadId};
use cuflow_runtime::sync::{AtomicU8, Condvar, Mutex, Ordering};
use cuflow_runtime::{trace, DeviceError, ErrorScope, Event, StreamId};

use super::{DeviceOp, Value};
use crate::context::ExecutionContext;
use crate::describe::{DagBuilder, Described};

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const COMPLETE: u8 = 2;
const POISONED: u8 = 3;

/// The state machine of a value produced once and handed to every consumer.
pub(crate) struct RunOnce<T> {
    state: AtomicU8,
    /// The thread that won the CAS, once it has said so.
    runner: Mutex<Option<ThreadId>>,
    /// Set, under this lock, before the state leaves `RUNNING`.
    outcome: Mutex<Option<Result<T, DeviceError>>>,
    finished: Condvar,
}

/// A consumer's turn, from [`RunOnce::turn`].
pub(crate) enum Turn<'a, T> {
    /// This consumer won the race: it produces the value and hands it to the guard.
    Produce(Producing<'a, T>),
    /// The value, produced by another consumer.
    Ready(T),
}

impl<T> RunOnce<T> {
    pub(crate) fn new() -> Self {
        RunOnce {
            state: AtomicU8::new(IDLE),
            runner: Mutex::new(None),
            outcome: Mutex::new(None),
            finished: Condvar::new(),
        }
    }

    /// A state machine whose value is already produced: every consumer takes a clone of
    /// `value`, and none produces.
    pub(crate) fn complete(value: T) -> Self {
        RunOnce {
            state: AtomicU8::new(COMPLETE),
            runner: Mutex::new(None),
            outcome: Mutex::new(Some(Ok(value))),
            finished: Condvar::new(),
        }
    }

    /// Whether the value was produced, or its production failed.
    pub(crate) fn is_finished(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), COMPLETE | POISONED)
    }

    /// Identifies this state machine in the wait graph.
    fn key(&self) -> usize {
        self as *const Self as usize
    }
}

impl<T: Clone> RunOnce<T> {
    /// Takes a consumer's turn: produce the value (the first consumer), or wait until it is
    /// produced and take a clone of it. `graph` holds the waits of blocked consumers.
    ///
    /// # Errors
    ///
    /// The producer's error (or [`DeviceError::Poisoned`] when it panicked);
    /// [`DeviceError::Reentrant`] when the value is being produced on this thread, or when
    /// waiting would close a cycle of waits across threads.
    pub(crate) fn turn<'a>(&'a self, graph: &'a WaitGraph) -> Result<Turn<'a, T>, DeviceError> {
        loop {
            match self.state.load(Ordering::Acquire) {
                IDLE => {
                    if self
                        .state
                        .compare_exchange(IDLE, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                    *self.runner.lock() = Some(thread::current().id());
                    return Ok(Turn::Produce(Producing {
                        once: self,
                        graph,
                        armed: true,
                    }));
                }
                RUNNING => {
                    let me = thread::current().id();
                    let Some(runner) = *self.runner.lock() else {
                        // The winner of the race has not said who it is yet.
                        thread::yield_now();
                        continue;
                    };
                    if runner == me {
                        return Err(DeviceError::Reentrant {
                            what: "a shared op consumed while it is being produced",
                        });
                    }
                    let _edge = graph.add(me, runner, self)?;
                    let mut outcome = self.outcome.lock();
                    while outcome.is_none() {
                        self.finished.wait(&mut outcome);
                    }
                    return Self::published(&outcome);
                }
                _ => return Self::published(&self.outcome.lock()),
            }
        }
    }

    /// A consumer's copy of the published outcome.
    fn published<'a>(outcome: &Option<Result<T, DeviceError>>) -> Result<Turn<'a, T>, DeviceError> {
        match outcome {
            Some(Ok(value)) => Ok(Turn::Ready(value.clone())),
            Some(Err(e)) => Err(e.clone()),
            None => Err(DeviceError::internal("shared op has no outcome")),
        }
    }
}

/// The producer's side of a [`RunOnce`]: [`Producing::finish`] hands the outcome to the
/// consumers; dropped unfinished (the producer panicked), it poisons.
pub(crate) struct Producing<'a, T> {
    once: &'a RunOnce<T>,
    graph: &'a WaitGraph,
    armed: bool,
}

impl<T> Producing<'_, T> {
    /// Publishes the outcome and wakes the waiting consumers.
    pub(crate) fn finish(mut self, outcome: Result<T, DeviceError>) {
        self.armed = false;
        self.publish(outcome);
    }

    /// Publishes the outcome, then leaves `RUNNING`, then drops the edges of the consumers
    /// waiting for it (no edge is added once the state has left `RUNNING`), then wakes them.
    fn publish(&self, outcome: Result<T, DeviceError>) {
        let state = if outcome.is_ok() { COMPLETE } else { POISONED };
        let once = self.once;
        *once.outcome.lock() = Some(outcome);
        once.state.store(state, Ordering::Release);
        self.graph.forget_waits_for(once.key());
        once.finished.notify_all();
    }
}

impl<T> Drop for Producing<'_, T> {
    fn drop(&mut self) {
        if self.armed {
            self.publish(Err(DeviceError::Poisoned {
                reason: "the op panicked while it ran".into(),
            }));
        }
    }
}

/// The wait graph of blocked consumers: thread → (the thread running the shared op it waits
/// for, that op's key). A consumer that would wait, through a chain of such waits, for itself
/// (two shared ops consuming each other from two threads) is refused with
/// [`DeviceError::Reentrant`] instead of blocking forever; the op it was producing then fails,
/// and so, in turn, do the others of the cycle.
#[derive(Default)]
pub(crate) struct WaitGraph {
    edges: Mutex<HashMap<ThreadId, (ThreadId, usize)>>,
}

/// A blocked consumer's edge in a [`WaitGraph`], removed when dropped (if the producer has not
/// dropped it first).
struct WaitEdge<'a> {
    graph: &'a WaitGraph,
    thread: ThreadId,
}

impl WaitGraph {
    /// Adds the edge of `me`, about to wait for the op `once` that `runner` produces; none
    /// when `once` has left `RUNNING` (its outcome is then there to take, and its producer may
    /// already have dropped its edges: see [`Producing::publish`]).
    fn add<'a, T>(
        &'a self,
        me: ThreadId,
        runner: ThreadId,
        once: &RunOnce<T>,
    ) -> Result<Option<WaitEdge<'a>>, DeviceError> {
        let mut edges = self.edges.lock();
        if once.state.load(Ordering::Acquire) != RUNNING {
            return Ok(None);
        }
        let mut next = runner;
        for _ in 0..=edges.len() {
            if next == me {
                return Err(DeviceError::Reentrant {
                    what: "shared ops that consume each other from several threads (a cycle)",
                });
            }
            match edges.get(&next) {
                Some((runner, _)) => next = *runner,
                None => break,
            }
        }
        edges.insert(me, (runner, once.key()));
        Ok(Some(WaitEdge {
            graph: self,
            thread: me,
        }))
    }

    /// Drops the edges of the consumers waiting for the op `key`, which has finished: they
    /// are no longer part of any cycle.
    fn forget_waits_for(&self, key: usize) {
        self.edges.lock().retain(|_, (_, k)| *k != key);
    }
}

impl Drop for WaitEdge<'_> {
    fn drop(&mut self) {
        self.graph.edges.lock().remove(&self.thread);
    }
}

/// The process-wide wait graph of the consumers of every shared op.
fn wait_graph() -> &'static WaitGraph {
    static GRAPH: OnceLock<WaitGraph> = OnceLock::new();
    GRAPH.get_or_init(WaitGraph::default)
}

/// What a shared op's producer hands its consumers.
struct Produced<T> {
    output: Arc<T>,
    /// The producer's completion event and stream, if it did device work.
    event: Option<(Event, StreamId)>,
    /// The scope the production's failures went to, nested in the scope of the context the
    /// producer ran in (none when the producer ran outside an execution's scope).
    scope: Option<ErrorScope>,
}

impl<T> Clone for Produced<T> {
    fn clone(&self) -> Self {
        Produced {
            output: self.output.clone(),
            event: self.event.clone(),
            scope: self.scope.clone(),
        }
    }
}

struct Inner<O: DeviceOp> {
    once: RunOnce<Produced<O::Output>>,
    op: parking_lot::Mutex<Option<O>>,
}

/// The op returned by [`DeviceOpExt::shared`](super::DeviceOpExt::shared): `Clone`, runs at
/// most once, yields `Arc<Output>`.
#[must_use = "device ops do nothing until synced or awaited"]
pub struct Shared<O: DeviceOp> {
    inner: Arc<Inner<O>>,
}

impl<O: DeviceOp> Clone for Shared<O> {
    fn clone(&self) -> Self {
        Shared {
            inner: self.inner.clone(),
        }
    }
}

impl<O: DeviceOp> Shared<O> {
    pub(crate) fn new(op: O) -> Self {
        Shared {
            inner: Arc::new(Inner {
                once: RunOnce::new(),
                op: parking_lot::Mutex::new(Some(op)),
            }),
        }
    }

    /// Whether the op has run to completion (successfully or not).
    pub fn is_finished(&self) -> bool {
        self.inner.once.is_finished()
    }
}

impl<T: Send> Shared<Value<T>> {
    /// A shared op that is already complete, yielding `output` itself (not a copy) to every
    /// consumer: an existing `Arc` made into an op that kernels and combinators accepting a
    /// `Shared` take. It does no device work and waits on nothing; the program is responsible
    /// for `output` being ready (an `Arc` from a finished op always is).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cuflow_device_op::{value, zip, DeviceOpExt, Shared};
    /// let weights = Arc::new(vec![1.0f32, 2.0]);
    /// let s = Shared::ready(weights.clone());
    /// assert!(s.is_finished());
    /// let (a, b) = zip!(s.clone(), s.map(|w| w.len())).sync()?;
    /// assert!(Arc::ptr_eq(&a, &weights));
    /// assert_eq!(b, 2);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn ready(output: Arc<T>) -> Self {
        Shared {
            inner: Arc::new(Inner {
                once: RunOnce::complete(Produced {
                    output,
                    event: None,
                    scope: None,
                }),
                op: parking_lot::Mutex::new(None),
            }),
        }
    }
}

impl<O> DeviceOp for Shared<O>
where
    O: DeviceOp,
    O::Output: Sync,
{
    type Output = Arc<O::Output>;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        let inner = &*self.inner;
        let produced = match inner.once.turn(wait_graph())? {
            Turn::Produce(producing) => {
                let _span = trace::op_span("shared producer");
                let op = inner.op.lock().take();
                // The failures of the production's own work, which every consumer reports.
                let scope = ErrorScope::nested();
                let result = match op {
                    Some(op) => {
                        // The event covers the branches the op dropped unjoined too, and
                        // only those: branches that other ops of the execution dropped before
                        // are theirs, joined at the execution's end. It is recorded only when
                        // the op itself enqueued device work: work the consumer's context did
                        // before is not the shared op's.
                        let (output, did_work) = {
                            let _entered = scope.as_ref().map(ErrorScope::enter);
                            let mark = ctx.dropped_branches();
                            ctx.tracking_work(|ctx| {
                                let output = op.execute(ctx)?;
                                ctx.join_dropped_branches_since(mark)?;
                                Ok(output)
                            })
                        };
                        output.and_then(|output| {
                            let event = if did_work {
                                // Recorded in the production's scope: it reports the failures
                                // of the production's work, of what that work waited for, and of
                                // the work before it in the context it ran in (see
                                // `cuflow_runtime::ErrorScope`), not of other branches' work
                                // that shares its stream.
                                let _entered = scope.as_ref().map(ErrorScope::enter);
                                Some((ctx.record_event()?, ctx.stream_id()))
                            } else {
                                None
                            };
                            Ok((output, event))
                        })
                    }
                    None => Err(DeviceError::internal("shared op ran twice")),
                };
                return match result {
                    Ok((output, event)) => {
                        let output = Arc::new(output);
                        producing.finish(Ok(Produced {
                            output: output.clone(),
                            event,
                            scope,
                        }));
                        Ok(output)
                    }
                    Err(e) => {
                        producing.finish(Err(e.clone()));
                        Err(e)
                    }
                };
            }
            Turn::Ready(produced) => produced,
        };
        let Produced {
            output,
            event,
            scope,
        } = produced;
        if let Some((event, stream)) = event {
            if event.is_captured() && !event.is_captured_with(ctx.stream()?) {
                return Err(DeviceError::Capture {
                    op: "shared".into(),
                    reason: format!(
                        "the shared op was produced inside a capture (on stream {stream}): its \
                         output is written only when that graph is replayed; consume it inside \
                         the same captured op, or take it from the graph's output (where that \
                         capture failed, no graph holds it: make the shared op anew)"
                    ),
                });
            }
            // On any stream, the producer's own included: the consumer's work follows the
            // producer's, and the consumer counts as device work, so that its execution
            // completes only after the producer's.
            ctx.wait_for(&event)?;
            // The failures of the production reach the consumer whatever events carry (on
            // CUDA, only device faults). Work recorded in a capture fails only when replayed,
            // where the graph's launch reports it.
            if let Some(scope) = scope.filter(|_| !event.is_captured()) {
                scope.depended_on_here();
            }
        }
        Ok(output)
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        self.describe_producer_with(dag, |op, dag| op.describe_into(dag))
    }
}

impl<O: DeviceOp> Shared<O> {
    /// The shared node of this op, with its producer described by `describe` the first time.
    /// Every clone is one op: described once, keyed by the state they share.
    pub(crate) fn describe_producer_with(
        &self,
        dag: &mut DagBuilder,
        describe: impl FnOnce(&O, &mut DagBuilder) -> Described,
    ) -> Described {
        let key = Arc::as_ptr(&self.inner) as *const () as usize;
        let op = self.inner.op.lock();
        // Without its op and not finished (looked at once the op was taken): a consumer took
        // the op and is producing it.
        let running = op.is_none() && !self.inner.once.is_finished();
        dag.shared_running(key, running, |dag| op.as_ref().map(|op| describe(op, dag)))
    }
}

crate::impl_op_boilerplate!([O: DeviceOp] Shared<O>);

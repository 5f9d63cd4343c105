//! `shared`: a cloneable op that runs at most once.
//!
//! An explicit state machine, moved by compare-and-swap: `IDLE → RUNNING → COMPLETE`, or
//! `RUNNING → POISONED` when the op fails or panics (a guard poisons on unwind). The first
//! consumer to win the CAS runs the op on its own context and, if it did device work, records
//! an event; consumers on other streams wait on that event, so they never read the output
//! before it is written. A consumer that finds the op running on another thread blocks until it
//! finishes; one that finds it running on its own thread, or whose wait would close a cycle of
//! waits across threads (two shared ops consuming each other), gets [`DeviceError::Reentrant`].
//!
//! Every consumer, on any stream (the producer's own included), orders its work after the
//! producer's completion event and counts as device work, so its execution completes only
//! after the producer's. A value produced inside a capture is written only by replays of the
//! graph: consuming it outside that capture is a [`DeviceError::Capture`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::ThreadId;

use cuflow_runtime::{DeviceError, Event, StreamId};
use parking_lot::{Condvar, Mutex};

use super::DeviceOp;
use crate::context::ExecutionContext;

const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const COMPLETE: u8 = 2;
const POISONED: u8 = 3;

enum Outcome<T> {
    Ready {
        output: Arc<T>,
        event: Option<Event>,
        stream: StreamId,
    },
    Failed(DeviceError),
}

struct Inner<O: DeviceOp> {
    state: AtomicU8,
    op: Mutex<Option<O>>,
    runner: Mutex<Option<ThreadId>>,
    outcome: Mutex<Option<Outcome<O::Output>>>,
    finished: Condvar,
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
                state: AtomicU8::new(IDLE),
                op: Mutex::new(Some(op)),
                runner: Mutex::new(None),
                outcome: Mutex::new(None),
                finished: Condvar::new(),
            }),
        }
    }

    /// Whether the op has run to completion (successfully or not).
    pub fn is_finished(&self) -> bool {
        matches!(
            self.inner.state.load(Ordering::Acquire),
            COMPLETE | POISONED
        )
    }
}

/// Poisons the shared op if the producer unwinds before finishing.
struct PoisonGuard<'a, O: DeviceOp> {
    inner: &'a Inner<O>,
    armed: bool,
}

impl<O: DeviceOp> PoisonGuard<'_, O> {
    fn finish(mut self, outcome: Outcome<O::Output>) {
        self.armed = false;
        let state = match outcome {
            Outcome::Ready { .. } => COMPLETE,
            Outcome::Failed(_) => POISONED,
        };
        WaitEdge::forget_waits_for(self.inner.key());
        *self.inner.outcome.lock() = Some(outcome);
        self.inner.state.store(state, Ordering::Release);
        self.inner.finished.notify_all();
    }
}

impl<O: DeviceOp> Inner<O> {
    /// Identifies this shared op in the wait graph.
    fn key(&self) -> usize {
        self as *const Self as usize
    }
}

/// The process-wide wait graph of blocked consumers: thread → (the thread running the shared
/// op it waits for, that op's key). A consumer that would wait, through a chain of such waits,
/// for itself (two shared ops consuming each other from two threads) is refused with
/// [`DeviceError::Reentrant`] instead of blocking forever; the op it was producing then fails,
/// and so, in turn, do the others of the cycle.
fn wait_graph() -> &'static Mutex<HashMap<ThreadId, (ThreadId, usize)>> {
    static GRAPH: OnceLock<Mutex<HashMap<ThreadId, (ThreadId, usize)>>> = OnceLock::new();
    GRAPH.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A blocked consumer's edge in the wait graph, removed when dropped.
struct WaitEdge(ThreadId);

impl WaitEdge {
    fn add(me: ThreadId, runner: ThreadId, key: usize) -> Result<WaitEdge, DeviceError> {
        let mut graph = wait_graph().lock();
        let mut next = runner;
        for _ in 0..=graph.len() {
            if next == me {
                return Err(DeviceError::Reentrant {
                    what: "shared ops that consume each other from several threads (a cycle)",
                });
            }
            match graph.get(&next) {
                Some((runner, _)) => next = *runner,
                None => break,
            }
        }
        graph.insert(me, (runner, key));
        Ok(WaitEdge(me))
    }

    /// Drops the edges of the consumers waiting for the shared op `key`, which has finished:
    /// they are no longer part of any cycle.
    fn forget_waits_for(key: usize) {
        wait_graph().lock().retain(|_, (_, k)| *k != key);
    }
}

impl Drop for WaitEdge {
    fn drop(&mut self) {
        wait_graph().lock().remove(&self.0);
    }
}

impl<O: DeviceOp> Drop for PoisonGuard<'_, O> {
    fn drop(&mut self) {
        if self.armed {
            WaitEdge::forget_waits_for(self.inner.key());
            *self.inner.outcome.lock() = Some(Outcome::Failed(DeviceError::Poisoned {
                reason: "the op panicked while it ran".into(),
            }));
            self.inner.state.store(POISONED, Ordering::Release);
            self.inner.finished.notify_all();
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
        loop {
            match inner.state.load(Ordering::Acquire) {
                IDLE => {
                    if inner
                        .state
                        .compare_exchange(IDLE, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                    *inner.runner.lock() = Some(std::thread::current().id());
                    let guard = PoisonGuard { inner, armed: true };
                    let op = inner.op.lock().take();
                    let result = match op {
                        Some(op) => op.execute(ctx).and_then(|output| {
                            let event = if ctx.has_device_work() {
                                Some(ctx.record_event()?)
                            } else {
                                None
                            };
                            Ok((output, event))
                        }),
                        None => Err(DeviceError::internal("shared op ran twice")),
                    };
                    return match result {
                        Ok((output, event)) => {
                            let output = Arc::new(output);
                            guard.finish(Outcome::Ready {
                                output: output.clone(),
                                event,
                                stream: ctx.stream_id(),
                            });
                            Ok(output)
                        }
                        Err(e) => {
                            guard.finish(Outcome::Failed(e.clone()));
                            Err(e)
                        }
                    };
                }
                RUNNING => {
                    let me = std::thread::current().id();
                    let Some(runner) = *inner.runner.lock() else {
                        // The winner of the race has not said who it is yet.
                        std::thread::yield_now();
                        continue;
                    };
                    if runner == me {
                        return Err(DeviceError::Reentrant {
                            what: "a shared op consumed while it is being produced",
                        });
                    }
                    let _edge = WaitEdge::add(me, runner, inner.key())?;
                    let mut outcome = inner.outcome.lock();
                    while outcome.is_none() {
                        inner.finished.wait(&mut outcome);
                    }
                }
                _ => {
                    let (output, event, stream) = match &*inner.outcome.lock() {
                        Some(Outcome::Ready {
                            output,
                            event,
                            stream,
                        }) => (output.clone(), event.clone(), *stream),
                        Some(Outcome::Failed(e)) => return Err(e.clone()),
                        None => return Err(DeviceError::internal("shared op has no outcome")),
                    };
                    if let Some(event) = event {
                        if event.is_captured() && !ctx.stream()?.is_capturing() {
                            return Err(DeviceError::Capture {
                                op: "shared".into(),
                                reason: format!(
                                    "the shared op was produced inside a capture (on stream \
                                     {stream}): its output is written only when that graph is \
                                     replayed; consume it inside the captured op, or take it \
                                     from the graph's output"
                                ),
                            });
                        }
                        // On any stream, the producer's own included: the consumer's work
                        // follows the producer's, and the consumer counts as device work, so
                        // that its execution completes only after the producer's.
                        ctx.wait_for(&event)?;
                    }
                    return Ok(output);
                }
            }
        }
    }
}

crate::impl_op_boilerplate!([O: DeviceOp] Shared<O>);

//! `shared`: a cloneable op that runs at most once.
//!
//! An explicit state machine, moved by compare-and-swap: `IDLE → RUNNING → COMPLETE`, or
//! `RUNNING → POISONED` when the op fails or panics (a guard poisons on unwind). The first
//! consumer to win the CAS runs the op on its own context and, if it did device work, records
//! an event; consumers on other streams wait on that event, so they never read the output
//! before it is written. A consumer that finds the op running on another thread blocks until it
//! finishes; one that finds it running on its own thread (a cycle) gets
//! [`DeviceError::Reentrant`].

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
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
        *self.inner.outcome.lock() = Some(outcome);
        self.inner.state.store(state, Ordering::Release);
        self.inner.finished.notify_all();
    }
}

impl<O: DeviceOp> Drop for PoisonGuard<'_, O> {
    fn drop(&mut self) {
        if self.armed {
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
                        None => Err(DeviceError::usage("internal: shared op ran twice")),
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
                    if *inner.runner.lock() == Some(std::thread::current().id()) {
                        return Err(DeviceError::Reentrant {
                            what: "a shared op consumed while it is being produced",
                        });
                    }
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
                        None => {
                            return Err(DeviceError::usage("internal: shared op has no outcome"))
                        }
                    };
                    if let Some(event) = event {
                        if stream != ctx.stream_id() {
                            ctx.wait_for(&event)?;
                        }
                    }
                    return Ok(output);
                }
            }
        }
    }
}

crate::impl_op_boilerplate!([O: DeviceOp] Shared<O>);

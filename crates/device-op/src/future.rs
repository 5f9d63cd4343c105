//! [`DeviceFuture`]: the future of an op's completion, for any async runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use cuflow_runtime::{DeviceError, ErrorScope, Event};

use crate::completion::CompletionSlot;
use crate::op::{BoxedOp, DeviceOp, DeviceOpExt};

enum State<T> {
    Lazy(BoxedOp<'static, T>),
    InFlight {
        output: Option<T>,
        completion: Option<Arc<CompletionSlot>>,
        /// The errors of the op's work that failed after it was enqueued.
        scope: ErrorScope,
    },
    Done,
}

/// The future of an op: resolves to its output once its device work has completed.
///
/// From `.await` on an op (the op is enqueued on the default device at the first poll) or from
/// [`DeviceOpExt::schedule`](crate::DeviceOpExt::schedule) (enqueued at once). `Send`, and
/// independent of the async runtime: completion is observed by cuflow's own reactor thread,
/// which calls the task's waker there. A waker must return promptly, as every runtime's do
/// (one that blocks holds up the completion of every other future in the process meanwhile;
/// one that panics is caught).
/// Dropping it while the work runs is safe: the work still completes, and its buffers are
/// freed after it, in stream order. The op's error is the future's: dropped unawaited, a
/// failure of the op's work is dropped with it, as an unread `Result` is: the buffers the
/// failed work was to write hold what they held before, and later work that uses them is not
/// necessarily told.
#[must_use = "futures do nothing unless polled"]
pub struct DeviceFuture<T> {
    state: State<T>,
}

// The future never pins its output: it moves it out by value when ready.
impl<T> Unpin for DeviceFuture<T> {}

impl<T: Send> DeviceFuture<T> {
    /// A future that enqueues `op` on the default device when first polled.
    pub fn lazy(op: impl DeviceOp<Output = T> + 'static) -> Self {
        DeviceFuture {
            state: State::Lazy(op.boxed()),
        }
    }

    pub(crate) fn in_flight(output: T, event: Option<Event>, scope: ErrorScope) -> Self {
        DeviceFuture {
            state: State::InFlight {
                output: Some(output),
                completion: event.map(CompletionSlot::new),
                scope,
            },
        }
    }
}

impl<T: Send> Future for DeviceFuture<T> {
    type Output = Result<T, DeviceError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if matches!(this.state, State::Lazy(_)) {
            let State::Lazy(op) = std::mem::replace(&mut this.state, State::Done) else {
                return Poll::Ready(Err(DeviceError::internal(
                    "a lazy DeviceFuture left its lazy state",
                )));
            };
            match crate::exec::enqueue_default(op) {
                Ok((out, event, scope)) => {
                    this.state = State::InFlight {
                        output: Some(out),
                        completion: event.map(CompletionSlot::new),
                        scope,
                    }
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        match &mut this.state {
            State::InFlight {
                output,
                completion,
                scope,
            } => {
                // Inside a host function the op's work may sit behind it on its stream, and a
                // wait there would never end (on CUDA, the driver runs every host function on
                // one thread): refused, as every wait inside one is.
                if cuflow_runtime::in_host_function() {
                    this.end();
                    return Poll::Ready(Err(DeviceError::Reentrant {
                        what: "waiting for a DeviceFuture inside a host function",
                    }));
                }
                if let Some(slot) = completion {
                    match slot.poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => {
                            this.end();
                            return Poll::Ready(Err(e));
                        }
                        Poll::Ready(Ok(())) => {}
                    }
                }
                // All of the op's work has completed, and with it the work it depends on.
                scope.settle();
                if let Err(e) = scope.check() {
                    this.state = State::Done;
                    return Poll::Ready(Err(e));
                }
                let out = output.take();
                this.state = State::Done;
                Poll::Ready(
                    out.ok_or_else(|| {
                        DeviceError::internal("a completed DeviceFuture had no output")
                    }),
                )
            }
            State::Done => Poll::Ready(Err(DeviceError::usage(
                "a DeviceFuture was polled after it completed",
            ))),
            State::Lazy(_) => Poll::Ready(Err(DeviceError::internal(
                "a lazy DeviceFuture left its lazy state",
            ))),
        }
    }
}

impl<T> DeviceFuture<T> {
    /// Moves the future to `Done`. An in-flight future's error scope is settled once its work
    /// has completed (at once when it has): a scope dropped unsettled would free the scopes of
    /// the `shared` productions nested in it one recursion per level.
    fn end(&mut self) {
        if let State::InFlight {
            completion, scope, ..
        } = std::mem::replace(&mut self.state, State::Done)
        {
            match completion {
                Some(slot) => slot.settle_when_complete(scope),
                None => scope.settle(),
            }
        }
    }
}

impl<T> Drop for DeviceFuture<T> {
    /// Dropped in flight, the work still completes; its error scope is settled then.
    fn drop(&mut self) {
        self.end();
    }
}

impl<T> std::fmt::Debug for DeviceFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Lazy(_) => "lazy",
            State::InFlight { .. } => "in flight",
            State::Done => "done",
        };
        f.debug_struct("DeviceFuture")
            .field("state", &state)
            .finish()
    }
}

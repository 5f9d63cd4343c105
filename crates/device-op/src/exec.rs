//! Executing ops: the default device, re-entrancy checks, panic capture, and the
//! `sync` / `sync_on` / `schedule` entry points.
//!
//! Execution is not re-entrant on a thread: an op's closure that executes another op would
//! nest one execution's streams and events inside another's and can deadlock the host
//! backend's workers, so it is refused with [`DeviceError::Reentrant`]. A panic inside an op
//! is caught, reported as [`DeviceError::Panicked`], and leaves the thread usable.
//!
//! An execution that fails part-way (an error or a panic in a later part) may already have
//! enqueued work on several streams. Before the error is returned, that work is waited for, so
//! that the program can reuse the op's buffers as soon as it sees the error: no leftover kernel
//! of the failed execution overwrites them later.
//!
//! Each execution enters its own [`ErrorScope`]: work of the op that fails after it was
//! enqueued (a host kernel's error, a host function's panic) is that execution's error, given
//! to its `sync*` call or future and to no other op that shares its streams.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use parking_lot::RwLock;

use cuflow_runtime::{trace, Device, DeviceError, ErrorScope, Event, Stream};
use cuflow_scheduler::{default_policy, Placement, SchedulingPolicy};

use crate::context::{ExecutionContext, ExecutionStats};
use crate::future::DeviceFuture;
use crate::op::DeviceOp;

thread_local! {
    static EXECUTING: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Marks the current thread as executing an op until dropped.
/// Marks the thread as executing; while a trace is recorded, also the execution's op span.
pub(crate) struct ExecutionGuard {
    _span: trace::OpSpan,
}

impl ExecutionGuard {
    pub(crate) fn enter(what: &'static str) -> Result<Self, DeviceError> {
        // Inside a host function every call into the device is refused; refused here, before
        // the execution takes the locks of policies and pools.
        if cuflow_runtime::in_host_function() {
            return Err(DeviceError::Reentrant { what });
        }
        EXECUTING.with(|e| match e.get() {
            Some(_) => Err(DeviceError::Reentrant { what }),
            None => {
                e.set(Some(what));
                Ok(ExecutionGuard {
                    _span: trace::op_span(span_name(what)),
                })
            }
        })
    }
}

/// The op span of an execution entered as `what` (`DeviceOpExt::sync` → `sync`).
fn span_name(what: &'static str) -> &'static str {
    match what.rsplit_once("::") {
        Some((_, method)) => method,
        None => what,
    }
}

impl Drop for ExecutionGuard {
    fn drop(&mut self) {
        EXECUTING.with(|e| e.set(None));
    }
}

/// The device `sync()` and `.await` run on: [`Device::auto`], resolved at first use and again
/// while the device is faulted, so that once it was recovered ([`Device::recover`]) ops run
/// on the recovered device.
///
/// # Errors
///
/// The error of [`Device::auto`] (e.g. `CUFLOW_DEVICE=cuda` without a usable GPU).
pub fn default_device() -> Result<Device, DeviceError> {
    static DEVICE: RwLock<Option<Device>> = RwLock::new(None);
    if let Some(d) = DEVICE.read().as_ref() {
        if !d.is_faulted() {
            return Ok(d.clone());
        }
    }
    let d = Device::auto()?;
    *DEVICE.write() = Some(d.clone());
    Ok(d)
}

/// Asks `policy` for the stream of an op's root, under the same panic guard as an op's
/// closures: a policy that panics gives [`DeviceError::Panicked`], and the thread stays usable.
/// (The placements of branches are asked while the op executes, under that guard already.)
///
/// # Errors
///
/// The policy's error; [`DeviceError::Panicked`]; [`DeviceError::Capture`] when the policy
/// picks a stream that is being captured into a graph, or one made for captures
/// ([`Device::new_stream_for_captures`](cuflow_runtime::Device::new_stream_for_captures)).
///
/// # Examples
///
/// ```
/// use cuflow_device_op::place_root;
/// use cuflow_runtime::Device;
/// use cuflow_scheduler::StreamPoolRoundRobin;
/// let policy = StreamPoolRoundRobin::new(&Device::host(), 2)?;
/// let stream = place_root(&policy)?;
/// assert!(policy.streams().contains(&stream));
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn place_root(policy: &dyn SchedulingPolicy) -> Result<Stream, DeviceError> {
    let stream = match catch_unwind(AssertUnwindSafe(|| {
        policy.place(&Placement::root(policy.device()))
    })) {
        Ok(placed) => placed?,
        Err(p) => return Err(DeviceError::from_panic_payload("the scheduling policy", p)),
    };
    check_placed("the root of an op", &stream)?;
    Ok(stream)
}

/// Why eager work may not go on a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotForEagerWork {
    /// A stream made for captures (`Device::new_stream_for_captures`, or a capture's private
    /// stream, which a policy sees as a placement's parent during that capture): another
    /// thread's capture may take it at any moment and refuse the work part-way.
    ForCaptures,
    /// A stream being captured into a graph: the work would be recorded into it instead of
    /// running, and the events that should tell of its completion would never complete.
    Capturing,
}

impl NotForEagerWork {
    /// Why eager work may not go on `stream`, if it may not. A stream made for captures is
    /// named so whether or not a capture holds it at this moment: that is up to other threads,
    /// and the answer must not depend on it.
    pub(crate) fn of(stream: &Stream) -> Option<Self> {
        if stream.is_for_captures() {
            Some(Self::ForCaptures)
        } else if stream.is_capturing() {
            Some(Self::Capturing)
        } else {
            None
        }
    }
}

/// Checks `stream`, on which a policy placed eager work (`what`).
///
/// # Errors
///
/// [`DeviceError::Capture`] when eager work may not go there ([`NotForEagerWork`]).
pub(crate) fn check_placed(
    what: impl std::fmt::Display,
    stream: &Stream,
) -> Result<(), DeviceError> {
    let reason = match NotForEagerWork::of(stream) {
        None => return Ok(()),
        Some(NotForEagerWork::ForCaptures) => format!(
            "the scheduling policy placed {what} on stream {}, a stream of graph captures (a \
             capture hands its private streams to the policy as placements' parents): eager \
             work there would be refused once another capture takes the stream; a policy must \
             not keep the streams a capture hands it",
            stream.id()
        ),
        Some(NotForEagerWork::Capturing) => format!(
            "the scheduling policy placed {what} on stream {}, which is being captured into a \
             graph: the work would be recorded instead of run; a policy must not hand out a \
             capturing stream",
            stream.id()
        ),
    };
    Err(DeviceError::Capture {
        op: "SchedulingPolicy::place".into(),
        reason,
    })
}

/// Executes `op` with the root context `ctx`, then joins the branches the op dropped unjoined
/// into the root (see `ExecutionContext::join_branch`).
fn execute_root<O: DeviceOp>(op: O, ctx: &mut ExecutionContext) -> Result<O::Output, DeviceError> {
    let executed = catch_unwind(AssertUnwindSafe(|| {
        let out = op.execute(ctx)?;
        ctx.join_dropped_branches()?;
        ctx.join_stray_work()?;
        Ok(out)
    }));
    let result = match executed {
        Ok(r) => r,
        Err(p) => Err(DeviceError::from_panic_payload("op execution", p)),
    };
    if result.is_err() {
        wait_for_enqueued_work(ctx);
    }
    result
}

/// Waits for the work a failed execution enqueued before it failed. Streams being captured
/// are skipped (their work is recorded, not run; the eager work that another thread's capture
/// found there still runs, ordered before later users of its buffers by the access tracker).
/// The errors of that work are not reported: the execution's own error is. Waiting on an
/// event leaves each stream's error to be reported by its next synchronization.
fn wait_for_enqueued_work(ctx: &ExecutionContext) {
    for stream in ctx.used_streams() {
        if stream.is_capturing() {
            continue;
        }
        if let Ok(done) = stream.record_event() {
            let _ = done.synchronize();
        }
    }
}

fn run_and_wait<O: DeviceOp>(
    op: O,
    policy: Arc<dyn SchedulingPolicy>,
    root: Option<&Stream>,
) -> Result<(O::Output, ExecutionStats), DeviceError> {
    let (stream, prior_work) = match root {
        Some(s) => (s.clone(), true),
        None => (place_root(&*policy)?, false),
    };
    let scope = ErrorScope::new();
    let _entered = scope.enter();
    let mut ctx = ExecutionContext::root(policy, stream.clone(), prior_work);
    let finished = execute_root(op, &mut ctx).and_then(|out| {
        if ctx.has_device_work() {
            // The root's stream, unless the op replaced its context: the final context's
            // stream waited for every other one (`join_stray_work`).
            if let Err(e) = ctx.current_stream().synchronize() {
                // Refused (another thread began capturing the stream) or failed: what the
                // other streams hold is still waited for before the error is returned.
                wait_for_enqueued_work(&ctx);
                return Err(e);
            }
        }
        Ok(out)
    });
    // All of the op's work has completed (or, on an error, been waited for), and with it the
    // work it depends on. Settled on every outcome: an unsettled scope holds the scopes of
    // the `shared` productions nested in it, one inside the other, and a chain of them as deep
    // as the op's would be freed one recursion per level.
    scope.settle();
    let out = finished?;
    scope.check()?;
    Ok((out, ctx.stats()))
}

pub(crate) fn sync<O: DeviceOp>(op: O) -> Result<O::Output, DeviceError> {
    let _guard = ExecutionGuard::enter("DeviceOpExt::sync")?;
    let device = default_device()?;
    run_and_wait(op, default_policy(&device)?, None).map(|(out, _)| out)
}

pub(crate) fn sync_with_policy<O: DeviceOp>(
    op: O,
    policy: Arc<dyn SchedulingPolicy>,
) -> Result<(O::Output, ExecutionStats), DeviceError> {
    let _guard = ExecutionGuard::enter("DeviceOpExt::sync_with_policy")?;
    run_and_wait(op, policy, None)
}

pub(crate) fn sync_on<O: DeviceOp>(
    op: O,
    stream: &Stream,
) -> Result<(O::Output, ExecutionStats), DeviceError> {
    let _guard = ExecutionGuard::enter("DeviceOpExt::sync_on")?;
    if let Some(why) = NotForEagerWork::of(stream) {
        let reason = match why {
            // Another thread's capture may take the stream at any moment and refuse the work
            // part-way, as `place_root` says for policies.
            NotForEagerWork::ForCaptures => format!(
                "stream {} is a stream of graph captures (Device::new_stream_for_captures, or one a \
                 capture handed to a policy): a capture may take it at any moment and refuse \
                 the op's work part-way; sync the op on a stream of Device::new_stream",
                stream.id()
            ),
            // The work would be recorded into the graph instead of run, and the wait for it
            // (which a capture cannot record) would break the capture.
            NotForEagerWork::Capturing => format!(
                "stream {} is being captured into a graph: the op's work would be recorded, \
                 not run, and sync_on cannot wait for it; capture the op with its graph API \
                 (graph_on), or sync it on a stream that is not being captured",
                stream.id()
            ),
        };
        return Err(DeviceError::Capture {
            op: "DeviceOpExt::sync_on".into(),
            reason,
        });
    }
    run_and_wait(op, default_policy(stream.device())?, Some(stream))
}

/// Enqueues `op` under `policy` without waiting; returns its output, an event that completes
/// with its device work (when it enqueued some), and the scope its work's errors go to. `what`
/// is the entry point, as errors and traces name it.
pub(crate) fn enqueue<O: DeviceOp>(
    op: O,
    policy: Arc<dyn SchedulingPolicy>,
    what: &'static str,
) -> Result<Enqueued<O::Output>, DeviceError> {
    let _guard = ExecutionGuard::enter(what)?;
    let stream = place_root(&*policy)?;
    let scope = ErrorScope::new();
    let _entered = scope.enter();
    let mut ctx = ExecutionContext::root(policy, stream, false);
    let enqueued = execute_root(op, &mut ctx).and_then(|out| {
        let event = if ctx.has_device_work() {
            match ctx.record_event() {
                Ok(event) => Some(event),
                Err(e) => {
                    wait_for_enqueued_work(&ctx);
                    return Err(e);
                }
            }
        } else {
            None
        };
        Ok((out, event))
    });
    match enqueued {
        Ok((out, event)) => Ok((out, event, scope.clone())),
        Err(e) => {
            // The work enqueued before the error has finished: settled as `run_and_wait`
            // settles its scope.
            scope.settle();
            Err(e)
        }
    }
}

/// An enqueued op: its output, the event its work completes with, and its error scope.
pub(crate) type Enqueued<T> = (T, Option<Event>, ErrorScope);

pub(crate) fn enqueue_default<O: DeviceOp>(op: O) -> Result<Enqueued<O::Output>, DeviceError> {
    let device = default_device()?;
    enqueue(op, default_policy(&device)?, ".await")
}

pub(crate) fn schedule<O: DeviceOp>(
    op: O,
    policy: Arc<dyn SchedulingPolicy>,
) -> Result<DeviceFuture<O::Output>, DeviceError> {
    let (out, event, scope) = enqueue(op, policy, "DeviceOpExt::schedule")?;
    Ok(DeviceFuture::in_flight(out, event, scope))
}

/// Enqueues `op` with `stream` as its root and does not wait for it.
///
/// `stream` is treated as holding work the op depends on, so every branch placed on another
/// stream forks from it with an event, and every branch with device work joins back into it.
/// When `stream` is capturing, this is what makes the whole op, branches included, part of the
/// capture. The output may still be being computed when this returns: reading it back through
/// the runtime (e.g. `DeviceBuffer::to_host_vec`) waits for the work that writes it.
///
/// # Errors
///
/// Errors hit while enqueueing, [`DeviceError::Reentrant`] inside another execution, and
/// [`DeviceError::Panicked`] when a closure panicked. On an error, the work enqueued before it
/// has finished (except on streams being captured, whose work is only recorded).
pub fn enqueue_on<O: DeviceOp>(
    op: O,
    stream: &Stream,
    policy: Arc<dyn SchedulingPolicy>,
) -> Result<(O::Output, ExecutionStats), DeviceError> {
    let _guard = ExecutionGuard::enter("enqueue_on")?;
    let mut ctx = ExecutionContext::root(policy, stream.clone(), true);
    let out = execute_root(op, &mut ctx)?;
    if ctx.current_stream() != stream && ctx.has_device_work() {
        // The op replaced its context: its work joins `stream` back (a capture ends only
        // with every stream that joined it joined back).
        let done = ctx.record_event()?;
        stream.wait_event(&done)?;
    }
    Ok((out, ctx.stats()))
}

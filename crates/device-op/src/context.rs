//! The execution context: the device, stream and policy an op runs with.
//!
//! Only the framework constructs contexts. A context may carry a *pending fork*: a branch
//! placed on a stream other than its parent's must first wait for the parent's earlier work.
//! That wait is made only when the branch first asks for its stream ([`ExecutionContext::stream`]),
//! so a branch that does no device work adds no events and no waits.
//!
//! Every branch with device work is joined back into its execution: by
//! [`ExecutionContext::join_branch`], or, for a branch an op forked itself and dropped unjoined,
//! by the execution's end (the root waits for it before the op counts as complete) or by the
//! `shared` producer it ran in (before the producer's event is recorded). So no entry point
//! returns, and no future resolves, before a branch's work has finished, and a branch's failure
//! is its execution's.
//!
//! A context's device is the device of its stream. A policy may place a branch on a stream of
//! another device of the same backend (spreading work over GPUs); the fork and join events then
//! order the work across devices, as they do across streams.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError, EnteredScope, ErrorScope, Event, Stream, StreamId};
use cuflow_scheduler::{Placement, PriorityLevel, SchedulingPolicy};
use parking_lot::Mutex;

use crate::exec::NotForEagerWork;

/// What one execution did: events recorded, waits enqueued, streams used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutionStats {
    /// Events recorded by the executor (forks, joins, shared producers).
    pub events_recorded: usize,
    /// Cross-stream waits enqueued by the executor.
    pub event_waits: usize,
    /// Streams that received device work, in first-use order.
    pub streams: Vec<StreamId>,
}

struct ForkPoint {
    parent: Stream,
    event: Mutex<Option<Event>>,
}

/// The device, stream and scheduling policy an op executes with.
pub struct ExecutionContext {
    /// Tells this context from every other one, whatever an op does with the `&mut` it is
    /// given (replace it, swap it): see [`ExecutionContext::tracking_work`].
    id: u64,
    device: Device,
    policy: Arc<dyn SchedulingPolicy>,
    stream: Stream,
    /// Forks this context must wait on before its first device work.
    pending_forks: Vec<Arc<ForkPoint>>,
    /// The fork point shared by branches forked since this context last enqueued work.
    fork_cache: Option<Arc<ForkPoint>>,
    touched: bool,
    /// Whether device work was enqueued through this context since [`Self::tracking_work`]
    /// last began (unlike `touched`, not set by the root's prior work).
    enqueued: bool,
    /// Whether `stream` is already counted among the execution's streams.
    counted: bool,
    priority: PriorityLevel,
    /// How many `zip!` levels enclose this context (0 for the root).
    depth: usize,
    /// Whether branches forked from here must stay on this context's device.
    same_device: bool,
    stats: Arc<Mutex<ExecutionStats>>,
    /// The streams that received device work, and the branches dropped unjoined, shared by the
    /// whole execution.
    streams: Arc<Mutex<ExecutionStreams>>,
    /// Whether this is a branch not joined back yet (see [`ExecutionContext::join_branch`]).
    unjoined: bool,
    /// Whether the execution is being captured into a graph: its root's stream was capturing
    /// when it began. Branches inherit it, because a branch's own stream joins the capture
    /// only at its first work (when it waits on its fork), so until then the stream cannot
    /// tell (see [`ExecutionContext::in_capture`]).
    captured: bool,
    /// A branch's error scope, nested in the scope entered where it was forked (the root's is
    /// the execution's, entered by the executor): the combinators enter it while the branch's
    /// op runs, so that the failures of its work are its own on the streams it shares with
    /// other branches (see `cuflow_runtime::ErrorScope`), and its execution's too.
    scope: Option<ErrorScope>,
}

/// The streams of one execution.
#[derive(Default)]
struct ExecutionStreams {
    /// The streams that received device work, in first-use order.
    used: Vec<Stream>,
    /// Branches with device work that were dropped without being joined: each one's stream,
    /// and an event after its work (or the error of recording it).
    unjoined: Vec<(Stream, Result<Event, DeviceError>)>,
    /// Streams created for this execution alone, one per device (see
    /// [`ExecutionContext::on_stream`] and [`ExecutionContext::on_device`] during a capture).
    private: Vec<Stream>,
    /// Contexts of the execution that enqueued device work and have not been settled yet:
    /// joined into another ([`ExecutionContext::join_branch`]) or handed over when dropped
    /// unjoined. At the end only the execution's final context may be left; any other was lost
    /// by the op (replaced, swapped or forgotten: see [`ExecutionContext::join_stray_work`]).
    open: usize,
}

/// The id of a new context.
fn next_context_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl ExecutionContext {
    /// A root context. `prior_work` says whether `stream` may hold work the op depends on
    /// (an explicit `sync_on` stream): then branches on other streams fork from it; a stream
    /// chosen by the policy holds nothing the op depends on.
    pub(crate) fn root(
        policy: Arc<dyn SchedulingPolicy>,
        stream: Stream,
        prior_work: bool,
    ) -> Self {
        let stream_capturing = stream.is_capturing();
        ExecutionContext {
            id: next_context_id(),
            device: stream.device().clone(),
            policy,
            stream,
            pending_forks: Vec::new(),
            fork_cache: None,
            touched: prior_work,
            enqueued: false,
            counted: false,
            priority: PriorityLevel::Normal,
            depth: 0,
            same_device: false,
            stats: Arc::new(Mutex::new(ExecutionStats::default())),
            streams: Arc::new(Mutex::new(ExecutionStreams::default())),
            unjoined: false,
            captured: stream_capturing,
            scope: None,
        }
    }

    /// The device this context's work runs on: the device of its stream. Branches may run on
    /// other devices, where the policy spreads them (see `MultiDevice` in `cuflow-scheduler`).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The scheduling policy in force.
    pub fn policy(&self) -> &Arc<dyn SchedulingPolicy> {
        &self.policy
    }

    /// The stream this context's work goes to, without claiming it: no pending fork is
    /// resolved. Use [`ExecutionContext::stream`] to enqueue work.
    pub fn stream_id(&self) -> StreamId {
        self.stream.id()
    }

    /// The stream to enqueue device work on. The first call on a branch context makes the
    /// branch's stream wait for its parent's earlier work.
    ///
    /// # Errors
    ///
    /// The error of recording or waiting on the fork event.
    #[inline]
    pub fn stream(&mut self) -> Result<&Stream, DeviceError> {
        if self.counted && self.pending_forks.is_empty() && self.fork_cache.is_none() {
            // Every op after the first of a context: no fork to wait on, no fork point to
            // retire, the stream counted already.
            self.touched = true;
            self.enqueued = true;
            return Ok(&self.stream);
        }
        self.claim_stream()
    }

    /// The first claim of this context's stream, or one after a fork: waits on the pending
    /// forks, retires the fork point, counts the stream.
    #[inline(never)]
    fn claim_stream(&mut self) -> Result<&Stream, DeviceError> {
        for fork in std::mem::take(&mut self.pending_forks) {
            let event = {
                let mut slot = fork.event.lock();
                match &*slot {
                    Some(e) => e.clone(),
                    None => {
                        let e = fork.parent.record_event()?;
                        self.stats.lock().events_recorded += 1;
                        *slot = Some(e.clone());
                        e
                    }
                }
            };
            self.stream.wait_event(&event)?;
            self.stats.lock().event_waits += 1;
        }
        self.fork_cache = None;
        self.touched = true;
        self.enqueued = true;
        if !self.counted {
            self.counted = true;
            self.note_used(&self.stream);
            self.streams.lock().open += 1;
        }
        Ok(&self.stream)
    }

    /// Counts `stream` among the streams of this execution.
    fn note_used(&self, stream: &Stream) {
        let mut stats = self.stats.lock();
        if !stats.streams.contains(&stream.id()) {
            stats.streams.push(stream.id());
            self.streams.lock().used.push(stream.clone());
        }
    }

    /// Runs `f` on `stream`, a stream of any device, in order with this context's work:
    /// `stream` first waits for everything enqueued through this context so far, `f` enqueues
    /// its work on `stream`, and this context's stream then waits for that work (also when `f`
    /// fails: what it enqueued before its error is this context's work). Ops use it to
    /// place part of their work on a device other than the context's (see
    /// [`ExecutionContext::on_device`]).
    ///
    /// While this context's stream is being captured, `f` is given a stream of `stream`'s
    /// device private to this execution instead (unless `stream` is part of a capture
    /// already): the work is recorded into the graph all the same, and `stream` itself never
    /// joins the capture, so it stays usable by every other thread while the capture runs.
    ///
    /// # Errors
    ///
    /// The error of `f`, or of recording or waiting on the events (see
    /// `cuflow_runtime::Stream::wait_event` for waits across devices and backends);
    /// [`DeviceError::Capture`] when this context is not being captured and `stream` is a
    /// stream made for captures (another thread's capture may take it at any moment and refuse
    /// the work part-way), or one being captured into a graph (the work would be recorded
    /// instead of run, and this context's stream, waiting for it, would join the capture).
    pub fn on_stream<R>(
        &mut self,
        stream: &Stream,
        f: impl FnOnce(&Stream) -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        let refused = if self.in_capture() {
            None
        } else {
            NotForEagerWork::of(stream)
        };
        if let Some(why) = refused {
            let reason = match why {
                NotForEagerWork::ForCaptures => format!(
                    "stream {} is a stream of graph captures (Device::new_stream_for_captures, \
                     or one a capture handed to a policy) and the op running on stream {} is \
                     not being captured: a capture may take the stream at any moment and refuse \
                     the work part-way; name a stream of Device::new_stream",
                    stream.id(),
                    self.stream.id()
                ),
                NotForEagerWork::Capturing => format!(
                    "stream {} is being captured into a graph but the op running on stream {} \
                     is not: the work would be recorded instead of run, and the op's stream \
                     would join the capture; run the op on the captured stream, or use a \
                     stream that is not captured",
                    stream.id(),
                    self.stream.id()
                ),
            };
            return Err(DeviceError::Capture {
                op: "ExecutionContext::on_stream".into(),
                reason,
            });
        }
        let private;
        let stream = if self.in_capture() && !stream.is_capturing() {
            // Waiting on captured work would pull `stream` into the capture, and with it every
            // other thread's work on it (refused until the capture ends).
            private = self.private_stream(stream.device())?;
            &private
        } else {
            stream
        };
        let own = self.stream()?.clone();
        if own == *stream {
            return f(stream);
        }
        stream.wait_event(&own.record_event()?)?;
        self.note_used(stream);
        {
            let mut stats = self.stats.lock();
            stats.events_recorded += 1;
            stats.event_waits += 1;
        }
        // Joined back whether `f` succeeded or not: the work it enqueued before an error is
        // this context's work all the same, which the op may go on after.
        let out = f(stream);
        let joined = stream.record_event().and_then(|done| own.wait_event(&done));
        let out = out?;
        joined?;
        let mut stats = self.stats.lock();
        stats.events_recorded += 1;
        stats.event_waits += 1;
        Ok(out)
    }

    /// Runs `f` on a stream of `device`, in order with this context's work: on this context's
    /// stream when it is of `device`, else on the stream that `device`'s default policy places
    /// a root on, joined with events as by [`ExecutionContext::on_stream`].
    ///
    /// While this context's stream is being captured, the work joins the capture on a stream
    /// of `device` private to this execution instead: a capture never records on a stream that
    /// a default policy hands to other ops.
    ///
    /// # Errors
    ///
    /// As [`ExecutionContext::on_stream`]; the error of creating `device`'s default policy (or,
    /// while capturing, the private stream); [`DeviceError::Usage`] when that policy places
    /// work on another device; [`DeviceError::Capture`] when it places it on a stream being
    /// captured.
    pub fn on_device<R>(
        &mut self,
        device: &Device,
        f: impl FnOnce(&Stream) -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        if *device == self.device {
            let stream = self.stream()?.clone();
            return f(&stream);
        }
        if self.in_capture() {
            let stream = self.private_stream(device)?;
            return self.on_stream(&stream, f);
        }
        let stream = crate::exec::place_root(&*cuflow_scheduler::default_policy(device)?)?;
        if stream.device() != device {
            return Err(DeviceError::usage(format!(
                "the default policy of {device} placed work on {}; give {device} a default \
                 policy of its own streams (set_default_policy)",
                stream.device()
            )));
        }
        self.on_stream(&stream, f)
    }

    /// The stream of `device` that this execution alone uses (created at its first use), for
    /// work placed on `device` while the execution is being captured.
    fn private_stream(&self, device: &Device) -> Result<Stream, DeviceError> {
        let mut streams = self.streams.lock();
        if let Some(s) = streams.private.iter().find(|s| s.device() == device) {
            return Ok(s.clone());
        }
        let stream = device.new_stream()?;
        streams.private.push(stream.clone());
        Ok(stream)
    }

    /// Whether device work was enqueued through this context.
    pub fn has_device_work(&self) -> bool {
        self.touched
    }

    /// Runs `f` with this context, and says whether `f` enqueued device work through it (its
    /// own work, or a wait that orders the context after other work), whatever the context did
    /// before.
    ///
    /// When `f` loses track of a context its work went through (it replaces or swaps this
    /// context, or leaves a context that enqueued work neither joined nor dropped: see
    /// [`ExecutionContext::join_stray_work`]), this context's stream is made to wait for the
    /// work of every stream of the execution, and that counts as work enqueued through it: so
    /// the work of `f` is behind this context's stream whatever `f` did with the contexts.
    ///
    /// # Errors
    ///
    /// The error of `f`, or of recording or waiting on an event of that join.
    pub(crate) fn tracking_work<R>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<R, DeviceError>,
    ) -> (Result<R, DeviceError>, bool) {
        let (id, counted, open) = (self.id, self.counted, self.streams.lock().open);
        let before = std::mem::replace(&mut self.enqueued, false);
        let mut out = f(self);
        if out.is_ok() {
            // Contexts that enqueued work and are still open: this one, if `f` made it so, and
            // none of those `f` made (each was joined, or handed over when dropped).
            let lost = self.id != id
                || self.streams.lock().open > open + usize::from(self.counted && !counted);
            if lost {
                if let Err(e) = self.join_used_streams() {
                    out = Err(e);
                }
            }
        }
        let enqueued = self.enqueued;
        self.enqueued |= before;
        (out, enqueued)
    }

    /// The requested priority of this context's work.
    pub fn priority(&self) -> PriorityLevel {
        self.priority
    }

    /// A context for branch `index` of `count`, on the stream the policy picks, which may be
    /// of another device of the same backend (the branch then runs there). Its fork from this
    /// context's stream is made lazily (see [`ExecutionContext::stream`]).
    ///
    /// # Errors
    ///
    /// The policy's error; [`DeviceError::DeviceMismatch`] when the policy picks a stream of
    /// another backend than this context's; [`DeviceError::Capture`] when it picks a stream
    /// being captured into a graph while this context's stream is not.
    pub fn fork_branch(
        &mut self,
        index: usize,
        count: usize,
    ) -> Result<ExecutionContext, DeviceError> {
        let placement = Placement::branch(&self.device, &self.stream, index, count)
            .with_priority(self.priority)
            .at_depth(self.depth + 1)
            .on_same_device(self.same_device);
        let stream = self.policy.place(&placement)?;
        // A capture's own branches are placed on streams that join it by waiting on their fork
        // (and a capturing stream of another capture is refused by that wait).
        if !self.in_capture() {
            crate::exec::check_placed(format_args!("branch {index} of {count}"), &stream)?;
        }
        if stream.device().kind() != self.device.kind() {
            return Err(DeviceError::device_mismatch(
                "ExecutionContext::fork_branch",
                "the stream the policy placed a branch on (a policy may spread branches over \
                 devices of one backend only)",
                &self.device,
                stream.device(),
            ));
        }
        let in_capture = self.in_capture();
        let pending_forks = if stream == self.stream
            || (!self.touched && (!in_capture || !self.pending_forks.is_empty()))
        {
            // Same stream: in order already. Untouched parent: its stream holds nothing of
            // this execution, so the branch depends only on the parent's own pending forks.
            self.pending_forks.clone()
        } else {
            // Also for an untouched parent with no fork of its own in a capture (a branch
            // kept on its parent's capturing stream): the branch's stream joins the capture
            // only by waiting on an event of a capturing stream, and without one its work
            // would run at once instead of being recorded.
            vec![self.fork_point()]
        };
        Ok(ExecutionContext {
            id: next_context_id(),
            device: stream.device().clone(),
            policy: self.policy.clone(),
            stream,
            pending_forks,
            fork_cache: None,
            touched: false,
            enqueued: false,
            counted: false,
            priority: self.priority,
            depth: self.depth + 1,
            same_device: self.same_device,
            stats: self.stats.clone(),
            streams: self.streams.clone(),
            unjoined: true,
            captured: in_capture,
            scope: ErrorScope::nested(),
        })
    }

    /// Enters this context's error scope, if it has one of its own (a branch's), until the
    /// guard is dropped. The combinators that fork branches enter it while a branch's op runs.
    pub(crate) fn enter_scope(&self) -> Option<EnteredScope> {
        self.scope.as_ref().map(ErrorScope::enter)
    }

    /// Whether this context's work is being captured into a graph: the execution's root was
    /// captured, or this context's stream is capturing (an op of the execution may have begun
    /// a capture on it). A branch's stream joins its capture only at the branch's first work,
    /// so the stream alone cannot tell before then.
    fn in_capture(&self) -> bool {
        self.captured || self.stream.is_capturing()
    }

    fn fork_point(&mut self) -> Arc<ForkPoint> {
        // Branches forked from the same point of this stream share one fork event.
        self.fork_cache
            .get_or_insert_with(|| {
                Arc::new(ForkPoint {
                    parent: self.stream.clone(),
                    event: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Joins a branch back: if it did device work on another stream, this context's stream
    /// waits on the branch's event.
    ///
    /// A branch dropped without being joined is joined into its execution all the same: the
    /// execution (or the `shared` producer the branch ran in) completes only after the
    /// branch's work, and its failure is the execution's. That join comes at the end, though:
    /// the work this context enqueues after the drop is not ordered after the branch's (but
    /// for the buffers both use, which are ordered as always), so join every branch whose
    /// work the rest of the op depends on.
    ///
    /// # Errors
    ///
    /// The error of recording or waiting on the join event.
    pub fn join_branch(&mut self, mut branch: ExecutionContext) -> Result<(), DeviceError> {
        branch.unjoined = false;
        if branch.counted {
            let mut streams = self.streams.lock();
            streams.open = streams.open.saturating_sub(1);
        }
        if !branch.touched {
            return Ok(());
        }
        if branch.stream == self.stream {
            self.stream()?;
            return Ok(());
        }
        // Recorded in the branch's scope: the event reports the failures of the branch's work.
        let event = {
            let _entered = branch.enter_scope();
            branch.stream.record_event()?
        };
        self.policy.on_enqueued(&branch.stream, &event);
        self.stream()?.wait_event(&event)?;
        let mut stats = self.stats.lock();
        stats.events_recorded += 1;
        stats.event_waits += 1;
        Ok(())
    }

    /// Makes this context's stream wait for the branches of the execution that were dropped
    /// without being joined (see [`ExecutionContext::join_branch`]).
    ///
    /// # Errors
    ///
    /// The error of recording an unjoined branch's event, or of waiting on it.
    pub(crate) fn join_dropped_branches(&mut self) -> Result<(), DeviceError> {
        self.join_dropped_branches_since(0)
    }

    /// How many branches of the execution have been dropped unjoined so far: the mark from
    /// which [`ExecutionContext::join_dropped_branches_since`] joins.
    pub(crate) fn dropped_branches(&self) -> usize {
        self.streams.lock().unjoined.len()
    }

    /// [`ExecutionContext::join_dropped_branches`] for the branches dropped since `mark` (from
    /// [`ExecutionContext::dropped_branches`]) only: those of an op that ran since, not those
    /// that other ops of the execution dropped before it, which stay for the execution's end.
    ///
    /// # Errors
    ///
    /// As [`ExecutionContext::join_dropped_branches`].
    pub(crate) fn join_dropped_branches_since(&mut self, mark: usize) -> Result<(), DeviceError> {
        let unjoined = {
            let mut streams = self.streams.lock();
            if mark >= streams.unjoined.len() {
                return Ok(());
            }
            streams.unjoined.split_off(mark)
        };
        for (stream, event) in unjoined {
            let event = event?;
            if stream == self.stream {
                self.stream()?;
                continue;
            }
            self.stream()?.wait_event(&event)?;
            self.stats.lock().event_waits += 1;
        }
        Ok(())
    }

    /// Makes this context's stream wait for `event` when it was recorded on another stream.
    ///
    /// # Errors
    ///
    /// The error of waiting; [`DeviceError::Capture`] when `event` was recorded during a
    /// capture into a graph that this context's stream is not part of (its work runs only when
    /// the graph is replayed, and the wait would pull this stream into that capture).
    pub fn wait_for(&mut self, event: &Event) -> Result<(), DeviceError> {
        // On its own stream an event orders nothing new, unless it stands for captured work
        // outside this stream's capture (refused below).
        let own = event.stream_id() == self.stream.id();
        if own && (!event.is_captured() || event.is_captured_with(&self.stream)) {
            self.stream()?;
            return Ok(());
        }
        // Claimed first: a branch of a capture joins it by waiting on its fork.
        let stream = self.stream()?;
        if event.is_captured() && !event.is_captured_with(stream) {
            return Err(DeviceError::Capture {
                op: "ExecutionContext::wait_for".into(),
                reason: format!(
                    "the event was recorded on stream {} during a capture into a graph that \
                     the op on stream {} is not part of: the work before it runs only when the \
                     graph is replayed, and waiting for it would pull stream {} into that \
                     capture; wait for it only inside the op being captured",
                    event.stream_id(),
                    stream.id(),
                    stream.id()
                ),
            });
        }
        stream.wait_event(event)?;
        self.stats.lock().event_waits += 1;
        Ok(())
    }

    /// Records an event on this context's stream after its work so far (counted in the
    /// execution's statistics).
    ///
    /// # Errors
    ///
    /// The error of recording.
    pub fn record_event(&mut self) -> Result<Event, DeviceError> {
        let e = self.stream()?.record_event()?;
        self.stats.lock().events_recorded += 1;
        Ok(e)
    }

    /// Runs `f` with this context's priority set to `priority`.
    pub fn with_priority<R>(
        &mut self,
        priority: PriorityLevel,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        let old = std::mem::replace(&mut self.priority, priority);
        let r = f(self);
        self.priority = old;
        r
    }

    /// Runs `f` with every branch it forks (and every branch nested in those) kept on this
    /// context's device, whatever the policy would spread: kernels run their lazy inputs this
    /// way, since they read them together on one device.
    pub fn with_same_device<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let old = std::mem::replace(&mut self.same_device, true);
        let r = f(self);
        self.same_device = old;
        r
    }

    pub(crate) fn stats(&self) -> ExecutionStats {
        self.stats.lock().clone()
    }

    /// The streams that received device work in this execution, in first-use order.
    pub(crate) fn used_streams(&self) -> Vec<Stream> {
        self.streams.lock().used.clone()
    }

    /// The stream this context enqueues on now.
    pub(crate) fn current_stream(&self) -> &Stream {
        &self.stream
    }

    /// Called by the executor on the execution's final context, after
    /// [`ExecutionContext::join_dropped_branches`]: when a context that enqueued work was
    /// neither joined, handed over when dropped, nor is this one (an op replaced its context
    /// with a branch, swapped the two, or forgot a branch), this context's stream waits for the
    /// work of every other stream of the execution, so that the execution still completes
    /// after all of it and its failures are the execution's. An execution whose contexts were
    /// all settled pays one lock here, and copies nothing.
    ///
    /// # Errors
    ///
    /// The error of recording an event or waiting on it.
    pub(crate) fn join_stray_work(&mut self) -> Result<(), DeviceError> {
        if self.streams.lock().open <= usize::from(self.counted) {
            return Ok(());
        }
        self.join_used_streams()
    }

    /// Makes this context's stream wait for the work so far of every other stream of the
    /// execution, and counts as work enqueued through this context.
    ///
    /// # Errors
    ///
    /// The error of recording an event or waiting on it.
    fn join_used_streams(&mut self) -> Result<(), DeviceError> {
        let used = self.streams.lock().used.clone();
        for stream in used {
            if stream == self.stream {
                continue;
            }
            let event = stream.record_event()?;
            self.stream()?.wait_event(&event)?;
            let mut stats = self.stats.lock();
            stats.events_recorded += 1;
            stats.event_waits += 1;
        }
        self.stream()?;
        Ok(())
    }
}

impl Drop for ExecutionContext {
    /// A branch with device work dropped without [`ExecutionContext::join_branch`] (an op that
    /// forked it and did not join it, or a `zip!` left by an error) is handed to its execution,
    /// which joins it before it completes.
    fn drop(&mut self) {
        if self.unjoined && self.touched {
            let event = {
                let _entered = self.enter_scope();
                self.stream.record_event()
            };
            if event.is_ok() {
                self.stats.lock().events_recorded += 1;
            }
            let mut streams = self.streams.lock();
            streams.unjoined.push((self.stream.clone(), event));
            if self.counted {
                streams.open = streams.open.saturating_sub(1);
            }
        }
    }
}

impl std::fmt::Debug for ExecutionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionContext")
            .field("device", &self.device)
            .field("stream", &self.stream.id())
            .field("policy", &self.policy)
            .field("pending_forks", &self.pending_forks.len())
            .finish()
    }
}

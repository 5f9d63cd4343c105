//! The execution context: the device, stream and policy an op runs with.
//!
//! Only the framework constructs contexts. A context may carry a *pending fork*: a branch
//! placed on a stream other than its parent's must first wait for the parent's earlier work.
//! That wait is made only when the branch first asks for its stream ([`ExecutionContext::stream`]),
//! so a branch that does no device work adds no events and no waits.

use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError, Event, Stream, StreamId};
use cuflow_scheduler::{Placement, PriorityLevel, SchedulingPolicy};
use parking_lot::Mutex;

/// What one execution did: events recorded, waits enqueued, streams used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    device: Device,
    policy: Arc<dyn SchedulingPolicy>,
    stream: Stream,
    /// Forks this context must wait on before its first device work.
    pending_forks: Vec<Arc<ForkPoint>>,
    /// The fork point shared by branches forked since this context last enqueued work.
    fork_cache: Option<Arc<ForkPoint>>,
    touched: bool,
    priority: PriorityLevel,
    stats: Arc<Mutex<ExecutionStats>>,
    /// The streams that received device work, shared by the whole execution.
    used: Arc<Mutex<Vec<Stream>>>,
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
        ExecutionContext {
            device: stream.device().clone(),
            policy,
            stream,
            pending_forks: Vec::new(),
            fork_cache: None,
            touched: prior_work,
            priority: PriorityLevel::Normal,
            stats: Arc::new(Mutex::new(ExecutionStats::default())),
            used: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The device the op runs on.
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
    pub fn stream(&mut self) -> Result<&Stream, DeviceError> {
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
        if !self.touched {
            self.touched = true;
        }
        {
            let mut stats = self.stats.lock();
            if !stats.streams.contains(&self.stream.id()) {
                stats.streams.push(self.stream.id());
                self.used.lock().push(self.stream.clone());
            }
        }
        Ok(&self.stream)
    }

    /// Whether device work was enqueued through this context.
    pub fn has_device_work(&self) -> bool {
        self.touched
    }

    /// The requested priority of this context's work.
    pub fn priority(&self) -> PriorityLevel {
        self.priority
    }

    /// A context for branch `index` of `count`, on the stream the policy picks. Its fork from
    /// this context's stream is made lazily (see [`ExecutionContext::stream`]).
    ///
    /// # Errors
    ///
    /// The policy's error.
    pub fn fork_branch(
        &mut self,
        index: usize,
        count: usize,
    ) -> Result<ExecutionContext, DeviceError> {
        let placement = Placement::branch(&self.device, &self.stream, index, count)
            .with_priority(self.priority);
        let stream = self.policy.place(&placement)?;
        if stream.device() != &self.device {
            return Err(DeviceError::DeviceMismatch {
                op: "ExecutionContext::fork_branch",
                expected: self.device.to_string(),
                found: stream.device().to_string(),
            });
        }
        let pending_forks = if stream == self.stream || !self.touched {
            // Same stream: in order already. Untouched parent: its stream holds nothing of
            // this execution, so the branch depends only on the parent's own pending forks.
            self.pending_forks.clone()
        } else {
            vec![self.fork_point()]
        };
        Ok(ExecutionContext {
            device: self.device.clone(),
            policy: self.policy.clone(),
            stream,
            pending_forks,
            fork_cache: None,
            touched: false,
            priority: self.priority,
            stats: self.stats.clone(),
            used: self.used.clone(),
        })
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
    /// # Errors
    ///
    /// The error of recording or waiting on the join event.
    pub fn join_branch(&mut self, branch: ExecutionContext) -> Result<(), DeviceError> {
        if !branch.touched {
            return Ok(());
        }
        if branch.stream == self.stream {
            self.stream()?;
            return Ok(());
        }
        let event = branch.stream.record_event()?;
        self.policy.on_enqueued(&branch.stream, &event);
        self.stream()?.wait_event(&event)?;
        let mut stats = self.stats.lock();
        stats.events_recorded += 1;
        stats.event_waits += 1;
        Ok(())
    }

    /// Makes this context's stream wait for `event` when it was recorded on another stream.
    ///
    /// # Errors
    ///
    /// The error of waiting.
    pub fn wait_for(&mut self, event: &Event) -> Result<(), DeviceError> {
        if event.stream_id() == self.stream.id() {
            self.stream()?;
            return Ok(());
        }
        self.stream()?.wait_event(event)?;
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

    pub(crate) fn stats(&self) -> ExecutionStats {
        self.stats.lock().clone()
    }

    /// The streams that received device work in this execution, in first-use order.
    pub(crate) fn used_streams(&self) -> Vec<Stream> {
        self.used.lock().clone()
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

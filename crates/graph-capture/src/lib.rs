//! Record and replay: freeze an op into a graph once, replay it many times.
//!
//! [`GraphCaptureExt::graph_on`] runs an op once while every piece of its device work (on its
//! root stream and on every stream its `zip!` branches were placed on) is recorded into one
//! graph, which is instantiated into a [`CudaGraph`]. Replays ([`CudaGraph::launch`]) cost one
//! enqueue, whatever the number of kernels. Inputs are changed between replays with
//! [`CudaGraph::update`], which runs a graph-safe op (a copy into a captured buffer) on the
//! graph's stream, ordered before the next replay. [`CudaGraph::recapture`] re-records an op and
//! updates the executable in place when the topology is unchanged.
//!
//! Safety rules kept here:
//! - allocations made while the op is captured (the outputs and intermediates of tensor
//!   kernels) belong to the graph: they are made once, at capture, and every replay writes the
//!   same memory, so a pointer baked into the graph stays valid for every replay; the memory is
//!   freed once the graph and the outputs taken from it are dropped;
//! - a host synchronization inside the op (reading a buffer back, `sync`) is refused with
//!   [`DeviceError::Capture`], the capture is ended and discarded, and the stream stays usable;
//! - every buffer the graph touches is kept alive by the graph, and each replay records its use
//!   on the replaying stream, so frees wait for the last replay;
//! - a replay is ordered like any other access: after the conflicting work of other streams on
//!   the buffers it touches, and before later work that conflicts with it;
//! - **a replay's failure is its graph's**: replays and updates run in the graph's own error
//!   scope (`cuflow_runtime::ErrorScope`), so a failure of their work after it was enqueued is
//!   reported by that graph's next [`CudaGraph::synchronize`] (or
//!   [`CudaGraph::replay_and_wait`]), once, and never to other work sharing the graph's stream
//!   (another graph, an op, a read-back); the graph's waits report no one else's failures;
//! - **a failed input fails the graph**: the capture runs in an error scope of its own, which
//!   depends on the eager work the captured op consumes (a `shared` op produced outside the
//!   capture). A capture whose input had failed already is refused, and an input that fails
//!   later fails every synchronization of the graph after it, on every backend (on CUDA an
//!   event carries device faults only, so the replays alone would not show it);
//! - **captures are isolated**: the op is recorded on private streams that mirror the stream
//!   and policy given (see `isolation.rs`), so work of other threads, or of other ops on the
//!   same streams, never enters a graph, and the stream a graph is bound to stays usable by
//!   everyone while the capture runs.
//!
//! On the host backend, capture records the enqueued work and replay runs it again: the same
//! semantics, so the same programs and tests run everywhere.
//!
//! ```
//! use std::sync::Arc;
//! use cuflow_device_op::{DeviceOp, ExecutionContext};
//! use cuflow_graph_capture::GraphCaptureExt;
//! use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig};
//!
//! /// Adds one to every element of a buffer it shares.
//! struct AddOne(Arc<DeviceBuffer<f32>>, Kernel);
//!
//! impl DeviceOp for AddOne {
//!     type Output = Arc<DeviceBuffer<f32>>;
//!     fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
//!         let n = self.0.len();
//!         let cfg = LaunchConfig::for_num_elems(n);
//!         self.1.launch(ctx.stream()?, cfg, KernelArgs::new().output(&*self.0).scalar(n as u32))?;
//!         Ok(self.0)
//!     }
//! }
//!
//! # fn main() -> Result<(), DeviceError> {
//! // SAFETY: the source writes only x[0..n], and n is the buffer's length.
//! let add_one = unsafe { Kernel::new("add_one", r#"extern "C" __global__ void add_one(float* x, unsigned n) {
//!     unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }"#) }
//!     .with_host(|a| { for v in a.output::<f32>(0)? { *v += 1.0 } Ok(()) });
//! let stream = Device::host().new_stream()?;
//! let x = Arc::new(DeviceBuffer::<f32>::zeroed(&stream, 8)?);
//! let mut graph = AddOne(x.clone(), add_one).graph_on(stream.clone())?;
//! for _ in 0..3 {
//!     graph.launch()?;
//! }
//! assert_eq!(x.to_host_vec(&stream)?, vec![3.0; 8]);
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod isolation;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cuflow_device_op::{enqueue_on, place_root, DeviceOp, ExecutionContext, ExecutionStats};
use cuflow_runtime::{Device, DeviceError, ErrorScope, Graph, GraphExec, Stream};
use cuflow_scheduler::{default_policy, SchedulingPolicy};
use isolation::IsolatedPolicy;
use parking_lot::Mutex;

/// An op frozen into an instantiated graph, with its output, bound to a stream.
///
/// `Send`: it can move to another thread (e.g. a serving task) with its buffers.
///
/// The failures of its replays and updates are the graph's: its [`CudaGraph::synchronize`]
/// reports them. A graph dropped with replays in flight lets them complete; a failure it never
/// reported is dropped with it, as an unread `Result` is: the buffers a failed replay was to
/// write hold what they held before, and later work that uses them is not necessarily told.
/// Synchronize a graph before dropping it to know how its last replays went.
pub struct CudaGraph<T> {
    stream: Stream,
    policy: Arc<dyn SchedulingPolicy>,
    graph: Graph,
    exec: GraphExec,
    output: Option<T>,
    stats: ExecutionStats,
    launches: u64,
    /// The failures of the replays and updates enqueued since the last synchronization.
    pending: Mutex<ErrorScope>,
    /// The capture's scope: the failures of the eager work the captured op consumed, which
    /// every replay reads.
    inputs: ErrorScope,
}

/// What a capture made.
struct Captured<T> {
    output: T,
    graph: Graph,
    stats: ExecutionStats,
    /// The scope the capture ran in (see [`CudaGraph::inputs`]).
    inputs: ErrorScope,
}

/// How a recapture was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecaptureOutcome {
    /// Same topology: the executable was updated in place.
    Updated,
    /// The topology changed: a new executable was instantiated.
    Reinstantiated,
}

/// Waits for the work enqueued on `stream` so far without taking the failures the stream keeps
/// for others (work enqueued outside any error scope): a graph reports its own failures only.
/// Device errors (a fault) are reported.
fn wait_for(stream: &Stream) -> Result<(), DeviceError> {
    let waiting = ErrorScope::new();
    let _entered = waiting.enter();
    stream.synchronize()
}

/// Captures `op` as if it ran on `stream` under `policy`, on private streams that mirror the
/// ones `stream` and `policy` name (see [`isolation`]): nothing else is recorded.
///
/// The capture runs in an error scope of its own, which the consumers of eagerly produced
/// `shared` ops make depend on their production: a capture whose inputs failed already is
/// refused.
fn capture<O: DeviceOp>(
    op: O,
    stream: &Stream,
    policy: &Arc<dyn SchedulingPolicy>,
) -> Result<Captured<O::Output>, DeviceError> {
    let isolated = IsolatedPolicy::new(policy.clone());
    let inputs = ErrorScope::new();
    let result = {
        let _entered = inputs.enter();
        capture_on_private_streams(op, stream, &isolated)
    };
    isolated.release();
    let (output, graph, stats) = result?;
    if let Some(failed) = inputs.error() {
        return Err(DeviceError::Capture {
            op: "graph capture".into(),
            reason: format!(
                "the op reads the output of work that failed, which every replay would read: \
                 {failed}"
            ),
        });
    }
    Ok(Captured {
        output,
        graph,
        stats,
        inputs,
    })
}

fn capture_on_private_streams<O: DeviceOp>(
    op: O,
    stream: &Stream,
    isolated: &Arc<IsolatedPolicy>,
) -> Result<(O::Output, Graph, ExecutionStats), DeviceError> {
    let root = isolated.mirror(stream)?;
    root.begin_capture()?;
    let enqueued = enqueue_on(op, &root, isolated.clone());
    let ended = root.end_capture();
    match (enqueued, ended) {
        (Ok((out, stats)), Ok(graph)) => Ok((out, graph, stats)),
        // The op's own error, as when it runs eagerly (an invalid shape stays an
        // `InvalidShape`): nothing of the op was recorded into a graph.
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e),
    }
}

impl<T: Send> CudaGraph<T> {
    fn new(
        op: impl DeviceOp<Output = T>,
        stream: Stream,
        policy: Arc<dyn SchedulingPolicy>,
    ) -> Result<Self, DeviceError> {
        // The policy is the program's code: its panic is an error, as when an op is placed.
        let policy_device = catch_unwind(AssertUnwindSafe(|| policy.device().clone()))
            .map_err(|payload| DeviceError::from_panic_payload("the scheduling policy", payload))?;
        if policy_device != *stream.device() {
            return Err(DeviceError::device_mismatch(
                "graph_on",
                "the scheduling policy",
                stream.device(),
                &policy_device,
            ));
        }
        let Captured {
            output,
            graph,
            stats,
            inputs,
        } = capture(op, &stream, &policy)?;
        let exec = graph.instantiate()?;
        Ok(CudaGraph {
            stream,
            policy,
            graph,
            exec,
            output: Some(output),
            stats,
            launches: 0,
            pending: Mutex::new(ErrorScope::new()),
            inputs,
        })
    }

    /// The output of the captured op: buffers whose contents each replay rewrites. Taken once.
    ///
    /// Capturing records the op's work without running it, so until a replay has finished
    /// (for instance [`CudaGraph::replay_and_wait`]) the output holds whatever its memory held
    /// when it was allocated: unspecified contents, as a fresh `DeviceBuffer::alloc` has. Read
    /// it after a replay.
    pub fn take_output(&mut self) -> Option<T> {
        self.output.take()
    }

    /// Enqueues one replay on the graph's stream. Does not wait: a failure of the replayed
    /// work is reported by the graph's next [`CudaGraph::synchronize`].
    ///
    /// # Errors
    ///
    /// A driver error.
    pub fn launch(&mut self) -> Result<(), DeviceError> {
        let _entered = self.pending.get_mut().enter();
        self.exec.launch(&self.stream)?;
        self.launches += 1;
        Ok(())
    }

    /// Replays once and waits for the replay.
    ///
    /// # Errors
    ///
    /// A driver error or an error of the replayed work (as [`CudaGraph::synchronize`]).
    pub fn replay_and_wait(&mut self) -> Result<(), DeviceError> {
        self.launch()?;
        self.synchronize()
    }

    /// Waits until every replay (and update) enqueued so far has finished.
    ///
    /// # Errors
    ///
    /// The first failure of the work of the replays and updates enqueued since the last
    /// synchronization (each failure is reported once, by this graph only: not to other work
    /// on its stream); a failure of the eager work the captured op consumed (the output of a
    /// `shared` op produced outside the capture), which every replay reads, at every
    /// synchronization; or a device error.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        wait_for(&self.stream)?;
        // All of that work has finished: no failure can reach its scope any more.
        let finished = std::mem::take(&mut *self.pending.lock());
        finished.settle();
        let replayed = finished.check();
        self.inputs.check()?;
        replayed
    }

    /// Runs a graph-safe op (such as a copy into a captured input buffer) on the graph's
    /// stream, ordered after earlier replays and before the next one. Does not wait.
    ///
    /// # Errors
    ///
    /// Errors hit while enqueueing the op; a failure of its work after it was enqueued is
    /// reported by the graph's next [`CudaGraph::synchronize`], as a replay's is. Updates run
    /// outside the capture: an op that allocates here makes new memory the graph does not
    /// read, so feed the graph by copying into its buffers (`api::memcpy`).
    pub fn update<O: DeviceOp>(&mut self, op: O) -> Result<O::Output, DeviceError> {
        let _entered = self.pending.get_mut().enter();
        enqueue_on(op, &self.stream, self.policy.clone()).map(|(out, _)| out)
    }

    /// Re-records `op` and applies it: updated in place (the driver's exec update) when the
    /// topology is unchanged, else re-instantiated. The new output replaces the old one.
    /// Waits for the replays enqueued before; their failures stay for the next
    /// [`CudaGraph::synchronize`].
    ///
    /// # Errors
    ///
    /// As [`GraphCaptureExt::graph_on`].
    pub fn recapture(
        &mut self,
        op: impl DeviceOp<Output = T>,
    ) -> Result<RecaptureOutcome, DeviceError> {
        wait_for(&self.stream)?;
        let Captured {
            output,
            graph,
            stats,
            inputs,
        } = capture(op, &self.stream, &self.policy)?;
        let outcome = if self.exec.update(&graph)? {
            RecaptureOutcome::Updated
        } else {
            self.exec = graph.instantiate()?;
            RecaptureOutcome::Reinstantiated
        };
        self.graph = graph;
        self.output = Some(output);
        self.stats = stats;
        self.inputs = inputs;
        Ok(outcome)
    }

    /// The recorded graph (node count, dependency edges, parallelism).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The recorded graph in Graphviz DOT ([`Graph::to_dot`]): the driver's dump on CUDA,
    /// the recorded work on the host backend; either lists the graph's kernels by name.
    ///
    /// # Errors
    ///
    /// As [`Graph::to_dot`].
    pub fn to_dot(&self) -> Result<String, DeviceError> {
        self.graph.to_dot()
    }

    /// What the capture recorded: events, waits, streams used.
    pub fn capture_stats(&self) -> &ExecutionStats {
        &self.stats
    }

    /// The stream replays are enqueued on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The device the graph runs on.
    pub fn device(&self) -> &Device {
        self.stream.device()
    }

    /// Replays enqueued so far.
    pub fn launch_count(&self) -> u64 {
        self.launches
    }

    /// An op that enqueues one replay wherever it is executed (on the executing stream, which
    /// must belong to the graph's device), for use inside larger compositions.
    pub fn launch_op(&self) -> GraphLaunch<'_> {
        GraphLaunch {
            exec: &self.exec,
            inputs: &self.inputs,
        }
    }
}

impl<T> fmt::Debug for CudaGraph<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaGraph")
            .field("stream", &self.stream)
            .field("graph", &self.graph)
            .field("launches", &self.launches)
            .finish()
    }
}

/// One replay of a [`CudaGraph`] as an op; from [`CudaGraph::launch_op`].
#[must_use = "device ops do nothing until synced or awaited"]
pub struct GraphLaunch<'a> {
    exec: &'a GraphExec,
    /// The graph's capture scope: the execution that replays it reports its inputs' failures.
    inputs: &'a ErrorScope,
}

impl DeviceOp for GraphLaunch<'_> {
    type Output = ();

    fn execute(self, ctx: &mut ExecutionContext) -> Result<(), DeviceError> {
        self.exec.launch(ctx.stream()?)?;
        // The replay reads what the captured op consumed: a failure there is this execution's.
        self.inputs.depended_on_here();
        Ok(())
    }
}

impl fmt::Debug for GraphLaunch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphLaunch")
            .field("exec", self.exec)
            .finish()
    }
}

/// Capture for every op.
pub trait GraphCaptureExt: DeviceOp + Sized {
    /// Captures the op on `stream` into a replayable graph; branches the device's default
    /// policy puts on other streams are captured as parallel branches of the same graph.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Capture`] when the op waits for the host while captured (the stream
    /// stays usable); the op's own error when it fails while captured (the error it gives
    /// eagerly: a bad shape is [`DeviceError::InvalidShape`]); driver errors.
    fn graph_on(self, stream: Stream) -> Result<CudaGraph<Self::Output>, DeviceError> {
        let policy = default_policy(stream.device())?;
        CudaGraph::new(self, stream, policy)
    }

    /// Captures the op under `policy`, on a root stream the policy picks.
    ///
    /// # Errors
    ///
    /// As [`GraphCaptureExt::graph_on`].
    fn graph_with_policy<P: SchedulingPolicy + Clone + 'static>(
        self,
        policy: &P,
    ) -> Result<CudaGraph<Self::Output>, DeviceError> {
        let policy: Arc<dyn SchedulingPolicy> = Arc::new(policy.clone());
        let stream = place_root(&*policy)?;
        CudaGraph::new(self, stream, policy)
    }

    /// Captures the op on a stream of the default device's default policy.
    ///
    /// # Errors
    ///
    /// As [`GraphCaptureExt::graph_on`].
    fn graph(self) -> Result<CudaGraph<Self::Output>, DeviceError> {
        let device = cuflow_device_op::default_device()?;
        let policy = default_policy(&device)?;
        let stream = place_root(&*policy)?;
        CudaGraph::new(self, stream, policy)
    }
}

impl<O: DeviceOp> GraphCaptureExt for O {}

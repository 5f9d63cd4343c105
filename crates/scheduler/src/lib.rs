//! Scheduling policies: where each part of a device op runs.
//!
//! A [`SchedulingPolicy`] answers one question, "which stream should this piece of work run
//! on?", given a [`Placement`] request (the device, the parent stream, whether the work is a
//! branch of a `zip!`, a priority). It never orders work: the executor does, by making a branch
//! placed on another stream wait on an event of its parent's stream, and by making the parent
//! wait on the branch's event when the branch ends. So every policy is safe; policies differ
//! only in how much independent work they let overlap.
//!
//! Policies live one per file under [`policies`]. The default policy of each device is
//! process-wide (not thread-local), so work-stealing executors see the same one from every
//! thread; replace it with [`DevicePolicyExt::set_default_policy`].

#![forbid(unsafe_code)]

mod default;
pub mod policies;

pub use default::{default_policy, set_default_policy, DevicePolicyExt, DEFAULT_POOL_SIZE};
pub use policies::{
    DeviceSpread, LeastLoaded, MultiDevice, Priority, SingleStream, StreamPoolRoundRobin,
};

use cuflow_runtime::{Device, DeviceError, Event, Stream};

/// The urgency of a piece of work, for policies that keep streams of several priorities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PriorityLevel {
    /// Ordinary work.
    #[default]
    Normal,
    /// Latency-sensitive work, placed on high-priority streams where the policy has them.
    High,
}

/// Where a piece of work sits in its op, for the policy to decide its stream.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Placement<'a> {
    /// The device of the enclosing work (for the root: the policy's device).
    pub device: &'a Device,
    /// The stream of the enclosing work; `None` for the root of an execution.
    pub parent: Option<&'a Stream>,
    /// For a branch of a `zip!` / `join_all`: its index and the number of branches.
    pub branch: Option<(usize, usize)>,
    /// The requested urgency.
    pub priority: PriorityLevel,
    /// How many `zip!` / `join_all` levels enclose the work: 0 for the root, 1 for a branch of
    /// a `zip!` run by the root, 2 for a branch of a `zip!` inside such a branch, and so on.
    pub depth: usize,
    /// Whether the work must stay on its parent's device: set for the lazy inputs of a kernel,
    /// which the kernel reads together on one device. Policies that spread work over several
    /// devices keep such branches on `device`.
    pub same_device: bool,
}

impl<'a> Placement<'a> {
    /// The root of an execution on `device`.
    #[must_use]
    pub fn root(device: &'a Device) -> Self {
        Placement {
            device,
            parent: None,
            branch: None,
            priority: PriorityLevel::Normal,
            depth: 0,
            same_device: false,
        }
    }

    /// Branch `index` of `count` under `parent`, at depth 1 (see [`Placement::at_depth`]).
    #[must_use]
    pub fn branch(device: &'a Device, parent: &'a Stream, index: usize, count: usize) -> Self {
        Placement {
            device,
            parent: Some(parent),
            branch: Some((index, count)),
            priority: PriorityLevel::Normal,
            depth: 1,
            same_device: false,
        }
    }

    /// The same request with another priority.
    #[must_use]
    pub fn with_priority(mut self, priority: PriorityLevel) -> Self {
        self.priority = priority;
        self
    }

    /// The same request at another nesting depth (see [`Placement::depth`]).
    #[must_use]
    pub fn at_depth(mut self, depth: usize) -> Self {
        self.depth = depth;
        self
    }

    /// The same request, required (or not) to stay on the parent's device (see
    /// [`Placement::same_device`]).
    #[must_use]
    pub fn on_same_device(mut self, same_device: bool) -> Self {
        self.same_device = same_device;
        self
    }
}

/// Maps each part of an op onto a stream.
///
/// # Ordering guarantees
///
/// A policy only picks streams; it cannot break ordering. The executor guarantees, whatever
/// stream is returned:
/// - work chained with `then` runs on its parent's stream, after it (no placement is asked);
/// - a branch placed on a stream other than its parent's starts after everything enqueued on
///   the parent before the branch (an event recorded on the parent, waited on by the branch);
/// - the parent continues only after every branch with device work has finished (the parent
///   waits on each such branch's event);
/// - a branch with no device work adds no events and no waits.
///
/// Returning the parent stream for every branch serializes the branches (as [`SingleStream`]
/// does); returning distinct streams lets them overlap.
///
/// A policy may return a stream of another device than [`Placement::device`] for a branch (as
/// [`MultiDevice`] does): the branch then runs on that device, ordered by events across
/// devices. Streams of another backend than the parent's are refused by the executor, and a
/// policy must honour [`Placement::same_device`], or the kernel reading the branch's output
/// fails with [`DeviceError::DeviceMismatch`].
///
/// Implementations must be `Send + Sync`: one policy serves every thread.
pub trait SchedulingPolicy: Send + Sync + std::fmt::Debug {
    /// The device the policy places work on.
    fn device(&self) -> &Device;

    /// Chooses the stream for `request`.
    ///
    /// # Errors
    ///
    /// A [`DeviceError`] when no stream can be provided (e.g. creating one failed).
    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError>;

    /// Called by the executor after a branch's work was enqueued on `stream`, with an event
    /// that completes when that work has finished. Policies that track load use it; the
    /// default does nothing.
    fn on_enqueued(&self, stream: &Stream, done: &Event) {
        let _ = (stream, done);
    }
}

impl<P: SchedulingPolicy + ?Sized> SchedulingPolicy for std::sync::Arc<P> {
    fn device(&self) -> &Device {
        (**self).device()
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        (**self).place(request)
    }

    fn on_enqueued(&self, stream: &Stream, done: &Event) {
        (**self).on_enqueued(stream, done)
    }
}

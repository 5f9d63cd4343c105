//! `boxed`: type-erased ops.
//!
//! A chain built in a loop (`op = op.then(f).boxed()`) nests one box per level, and executing,
//! describing or dropping it recurses once per level. So that its depth is limited by memory
//! and not by the thread's stack, each boxed level runs on a stack grown on demand with
//! [`stacker`] (the crate rustc grows its own stack with): while more than [`RED_ZONE`] bytes
//! of stack are left, a check costs one stack-pointer comparison; below that, the next levels
//! run on a fresh [`STACK_SEGMENT`]-byte segment, freed when they return. Every boxed level
//! checks, when it executes, describes itself or is dropped unexecuted (an executed level has
//! nothing left to drop): checking only every so many levels would assume how much stack the
//! levels in between take, which no bound holds (a `zip!` level takes some 10 KiB in a debug
//! build, a user's op whatever its frame holds).

use cuflow_runtime::DeviceError;

use super::DeviceOp;
use crate::context::ExecutionContext;
use crate::describe::{DagBuilder, Described, NodeKind};

/// The stack a boxed level leaves for the op it boxes before it switches to a new segment: the
/// op's own execution (the combinators up to the next boxed level, its closures, a kernel
/// launch) runs within it.
const RED_ZONE: usize = 128 * 1024;

/// The size of each stack segment a deep chain grows.
const STACK_SEGMENT: usize = 1024 * 1024;

/// Runs `f` with at least [`RED_ZONE`] bytes of stack, on a new segment when fewer are left.
fn with_stack<R>(f: impl FnOnce() -> R) -> R {
    stacker::maybe_grow(RED_ZONE, STACK_SEGMENT, f)
}

/// Whether more than [`RED_ZONE`] bytes of this thread's stack are left (`false` where the
/// stack's bounds are unknown): the levels that find so run on the stack they are on.
#[inline]
fn stack_is_ample() -> bool {
    stacker::remaining_stack().is_some_and(|left| left > RED_ZONE)
}

/// Executes one boxed level on a stack of at least [`RED_ZONE`] bytes. Out of line and cold,
/// so that the levels that find enough stack stay small.
#[cold]
#[inline(never)]
fn execute_checked<T: Send>(
    inner: Box<dyn DynDeviceOp<Output = T> + '_>,
    ctx: &mut ExecutionContext,
) -> Result<T, DeviceError> {
    with_stack(|| inner.execute_boxed(ctx))
}

/// Object-safe form of [`DeviceOp`], implemented for the [`Level`] every boxed op holds.
pub(crate) trait DynDeviceOp: Send {
    /// What the op produces.
    type Output: Send;
    /// Executes the boxed op.
    ///
    /// # Errors
    ///
    /// As [`DeviceOp::execute`].
    fn execute_boxed(
        self: Box<Self>,
        ctx: &mut ExecutionContext,
    ) -> Result<Self::Output, DeviceError>;
    fn describe_boxed(&self, dag: &mut DagBuilder) -> Described;
}

/// What a [`BoxedOp`] boxes: the op, `None` once it was taken to run.
struct Level<O>(Option<O>);

impl<O: DeviceOp> DynDeviceOp for Level<O> {
    type Output = O::Output;
    fn execute_boxed(
        self: Box<Self>,
        ctx: &mut ExecutionContext,
    ) -> Result<O::Output, DeviceError> {
        // The box is freed before the op runs, not when it returns: a chain of boxed ops
        // frees its levels on the way in, so no free is left to interleave with the work
        // each level enqueues on the way out. (Moving out with `*self` would free the box
        // only when this returns.)
        let mut level = self;
        let op = level.0.take();
        drop(level);
        match op {
            Some(op) => op.execute(ctx),
            None => Err(DeviceError::internal("a boxed op was executed twice")),
        }
    }
    fn describe_boxed(&self, dag: &mut DagBuilder) -> Described {
        match &self.0 {
            Some(op) => op.describe_into(dag),
            None => dag.node(NodeKind::Opaque, "executed boxed op"),
        }
    }
}

impl<O> Drop for Level<O> {
    /// An unexecuted chain frees its levels on a stack grown as it goes, too.
    fn drop(&mut self) {
        if let Some(op) = self.0.take() {
            with_stack(|| drop(op));
        }
    }
}

/// A type-erased op yielding `T`, from [`DeviceOpExt::boxed`](super::DeviceOpExt::boxed).
///
/// Boxed ops nest to any depth: a chain of boxed levels executes, describes itself and drops
/// on a stack grown as it goes, so its depth is limited only by memory, on any thread.
#[must_use = "device ops do nothing until synced or awaited"]
pub struct BoxedOp<'a, T> {
    inner: Box<dyn DynDeviceOp<Output = T> + 'a>,
}

impl<'a, T: Send> BoxedOp<'a, T> {
    pub(crate) fn new(op: impl DeviceOp<Output = T> + 'a) -> Self {
        BoxedOp {
            inner: Box::new(Level(Some(op))),
        }
    }
}

impl<T: Send> DeviceOp for BoxedOp<'_, T> {
    type Output = T;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<T, DeviceError> {
        if stack_is_ample() {
            self.inner.execute_boxed(ctx)
        } else {
            execute_checked(self.inner, ctx)
        }
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        with_stack(|| self.inner.describe_boxed(dag))
    }
}

crate::impl_op_boilerplate!(['a, T] BoxedOp<'a, T>);

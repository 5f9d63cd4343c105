//! `from_fn`: an op from a closure over its execution context (futures' `poll_fn`
//! counterpart): the one primitive small ops, kernels and tests are written with.

use cuflow_runtime::DeviceError;

use super::DeviceOp;
use crate::context::ExecutionContext;
use crate::describe::{short_type_name, DagBuilder, Described, NodeKind};

/// The op returned by [`from_fn`].
#[must_use = "device ops do nothing until synced or awaited"]
pub struct FromFn<F>(F);

/// An op that runs `f` with its execution context when executed: `f` enqueues its device work
/// on `ctx.stream()?` and returns the op's output.
///
/// The op's errors are gathered per thread (an [`ErrorScope`](cuflow_runtime::ErrorScope)
/// entered where the op executes): work that `f` has another thread enqueue is the op's only if
/// that thread enters the op's scope, [`ErrorScope::current`](cuflow_runtime::ErrorScope::current)
/// taken inside `f`. Otherwise a failure of that work is not the op's: the stream keeps it for
/// its next synchronization outside any op.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::{from_fn, DeviceOpExt};
/// use cuflow_runtime::DeviceBuffer;
/// let read_back = from_fn(|ctx| {
///     let stream = ctx.stream()?;
///     let buf = DeviceBuffer::from_host(stream, &[1.0f32, 2.0])?;
///     buf.to_host_vec(stream)
/// })
/// .sync()?;
/// assert_eq!(read_back, vec![1.0, 2.0]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
///
/// # Errors
///
/// The error `f` returns, when the op is executed.
pub fn from_fn<F, T>(f: F) -> FromFn<F>
where
    F: FnOnce(&mut ExecutionContext) -> Result<T, DeviceError> + Send,
    T: Send,
{
    FromFn(f)
}

impl<F, T> DeviceOp for FromFn<F>
where
    F: FnOnce(&mut ExecutionContext) -> Result<T, DeviceError> + Send,
    T: Send,
{
    type Output = T;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<T, DeviceError> {
        (self.0)(ctx)
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        dag.node(NodeKind::Work, short_type_name::<F>())
    }
}

crate::impl_op_boilerplate!([F] FromFn<F>);

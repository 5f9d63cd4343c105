//! `with_context`: build an op from the execution context it will run with.

use cuflow_runtime::DeviceError;

use super::DeviceOp;
use crate::context::ExecutionContext;
use crate::describe::{short_type_name, DagBuilder, Described, NodeKind};

/// The op returned by [`with_context`].
#[must_use = "device ops do nothing until synced or awaited"]
pub struct WithContext<F>(F);

/// An op built at execution time from the context (device, stream, policy) it runs with.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::{value, with_context, DeviceOpExt};
/// let name = with_context(|ctx| value(ctx.device().name().to_string())).sync()?;
/// assert!(!name.is_empty());
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn with_context<F, B>(f: F) -> WithContext<F>
where
    F: FnOnce(&ExecutionContext) -> B + Send,
    B: DeviceOp,
{
    WithContext(f)
}

impl<F, B> DeviceOp for WithContext<F>
where
    F: FnOnce(&ExecutionContext) -> B + Send,
    B: DeviceOp,
{
    type Output = B::Output;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<B::Output, DeviceError> {
        (self.0)(ctx).execute(ctx)
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        dag.node(NodeKind::Work, short_type_name::<F>())
    }
}

crate::impl_op_boilerplate!([F] WithContext<F>);

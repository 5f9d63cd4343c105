//! `value`: an op that yields a host value and does no device work.

use cuflow_runtime::DeviceError;

use super::DeviceOp;
use crate::context::ExecutionContext;
use crate::describe::{DagBuilder, Described, NodeKind};

/// The op returned by [`value`].
#[must_use = "device ops do nothing until synced or awaited"]
pub struct Value<T>(T);

/// An op yielding `x`; it does no device work, so it adds no events or stream switches.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::{value, DeviceOpExt};
/// assert_eq!(value("hi").sync()?, "hi");
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn value<T: Send>(x: T) -> Value<T> {
    Value(x)
}

impl<T: Send> DeviceOp for Value<T> {
    type Output = T;

    fn execute(self, _ctx: &mut ExecutionContext) -> Result<T, DeviceError> {
        Ok(self.0)
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        dag.node(NodeKind::Value, "value")
    }
}

crate::impl_op_boilerplate!([T] Value<T>);

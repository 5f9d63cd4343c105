//! `with_priority`: run an op (and the branches it forks) at a scheduling priority.

use cuflow_runtime::DeviceError;
use cuflow_scheduler::PriorityLevel;

use super::DeviceOp;
use crate::context::ExecutionContext;
use crate::describe::{DagBuilder, Described};

/// The op returned by [`DeviceOpExt::with_priority`](super::DeviceOpExt::with_priority).
#[must_use = "device ops do nothing until synced or awaited"]
pub struct WithPriority<O> {
    op: O,
    level: PriorityLevel,
}

impl<O> WithPriority<O> {
    pub(crate) fn new(op: O, level: PriorityLevel) -> Self {
        WithPriority { op, level }
    }
}

impl<O: DeviceOp> DeviceOp for WithPriority<O> {
    type Output = O::Output;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<O::Output, DeviceError> {
        let op = self.op;
        ctx.with_priority(self.level, move |ctx| op.execute(ctx))
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        self.op.describe_into(dag)
    }
}

crate::impl_op_boilerplate!([O] WithPriority<O>);

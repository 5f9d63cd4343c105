//! `named`: give an op a name, shown as its span in a trace (and as an NVTX range).

use std::borrow::Cow;

use cuflow_runtime::{trace, DeviceError};

use super::DeviceOp;
use crate::context::ExecutionContext;
use crate::describe::{DagBuilder, Described};

/// The op returned by [`DeviceOpExt::named`](super::DeviceOpExt::named).
#[must_use = "device ops do nothing until synced or awaited"]
pub struct Named<O> {
    op: O,
    name: Cow<'static, str>,
}

impl<O> Named<O> {
    pub(crate) fn new(op: O, name: Cow<'static, str>) -> Self {
        Named { op, name }
    }
}

impl<O: DeviceOp> DeviceOp for Named<O> {
    type Output = O::Output;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<O::Output, DeviceError> {
        let _span = trace::op_span(self.name);
        self.op.execute(ctx)
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        dag.group(&self.name, |dag| self.op.describe_into(dag))
    }
}

crate::impl_op_boilerplate!([O] Named<O>);

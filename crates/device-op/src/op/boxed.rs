//! `boxed`: type-erased ops.

use cuflow_runtime::DeviceError;

use super::DeviceOp;
use crate::context::ExecutionContext;
use crate::describe::{DagBuilder, Described};

/// Object-safe form of [`DeviceOp`], implemented for every op.
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

impl<O: DeviceOp> DynDeviceOp for O {
    type Output = O::Output;
    fn execute_boxed(
        self: Box<Self>,
        ctx: &mut ExecutionContext,
    ) -> Result<O::Output, DeviceError> {
        // The box is freed before the op runs, not when it returns: a chain of boxed ops
        // frees its levels on the way in, so no free is left to interleave with the work
        // each level enqueues on the way out.
        let op: O = *{ self };
        op.execute(ctx)
    }
    fn describe_boxed(&self, dag: &mut DagBuilder) -> Described {
        self.describe_into(dag)
    }
}

/// A type-erased op yielding `T`, from [`DeviceOpExt::boxed`](super::DeviceOpExt::boxed).
#[must_use = "device ops do nothing until synced or awaited"]
pub struct BoxedOp<'a, T> {
    inner: Box<dyn DynDeviceOp<Output = T> + 'a>,
}

impl<'a, T: Send> BoxedOp<'a, T> {
    pub(crate) fn new(op: impl DeviceOp<Output = T> + 'a) -> Self {
        BoxedOp {
            inner: Box::new(op),
        }
    }
}

impl<T: Send> DeviceOp for BoxedOp<'_, T> {
    type Output = T;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<T, DeviceError> {
        self.inner.execute_boxed(ctx)
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        self.inner.describe_boxed(dag)
    }
}

crate::impl_op_boilerplate!(['a, T] BoxedOp<'a, T>);

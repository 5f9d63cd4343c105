//! `then`: run a continuation's op on the same stream, after the first op.

use cuflow_runtime::DeviceError;

use super::DeviceOp;
use crate::context::ExecutionContext;
use crate::describe::{short_type_name, DagBuilder, Described, EdgeKind, NodeKind};

/// What `then` accepts: a closure from the first op's output to the next op, or one of the
/// adapters behind `map` and `inspect`.
pub trait Continuation<In>: Send {
    /// The op to run next.
    type Next: DeviceOp;
    /// Builds the next op from the first op's output.
    fn call(self, input: In) -> Self::Next;

    /// How [`DeviceOpExt::describe`](super::DeviceOpExt::describe) labels the continuation.
    fn describe_label(&self) -> String {
        format!("then {}", short_type_name::<Self>())
    }
}

impl<In, F, B> Continuation<In> for F
where
    F: FnOnce(In) -> B + Send,
    B: DeviceOp,
{
    type Next = B;
    fn call(self, input: In) -> B {
        self(input)
    }
}

/// The op returned by [`DeviceOpExt::then`](super::DeviceOpExt::then).
#[must_use = "device ops do nothing until synced or awaited"]
pub struct Then<A, F> {
    first: A,
    next: F,
}

impl<A, F> Then<A, F> {
    pub(crate) fn new(first: A, next: F) -> Self {
        Then { first, next }
    }

    /// The op that runs first.
    pub(crate) fn first(&self) -> &A {
        &self.first
    }
}

impl<A, F> DeviceOp for Then<A, F>
where
    A: DeviceOp,
    F: Continuation<A::Output>,
{
    type Output = <F::Next as DeviceOp>::Output;

    #[inline]
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        let x = self.first.execute(ctx)?;
        self.next.call(x).execute(ctx)
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        let first = self.first.describe_into(dag);
        let next = dag.node(NodeKind::Continuation, self.next.describe_label());
        dag.edge(first.exit, next.entry, EdgeKind::Then);
        Described {
            entry: first.entry,
            exit: next.exit,
        }
    }
}

crate::impl_op_boilerplate!([A, F] Then<A, F>);

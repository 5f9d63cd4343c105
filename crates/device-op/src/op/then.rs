//! `then`: run a continuation's op on the same stream, after the first op.

use cuflow_runtime::DeviceError;

use super::DeviceOp;
use crate::context::ExecutionContext;

/// What `then` accepts: a closure from the first op's output to the next op, or one of the
/// adapters behind `map` and `inspect`.
pub trait Continuation<In>: Send {
    /// The op to run next.
    type Next: DeviceOp;
    /// Builds the next op from the first op's output.
    fn call(self, input: In) -> Self::Next;
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
}

impl<A, F> DeviceOp for Then<A, F>
where
    A: DeviceOp,
    F: Continuation<A::Output>,
{
    type Output = <F::Next as DeviceOp>::Output;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        let x = self.first.execute(ctx)?;
        self.next.call(x).execute(ctx)
    }
}

crate::impl_op_boilerplate!([A, F] Then<A, F>);

//! `unzip`: split an op yielding a tuple into one op per element (`shared` + `map`).
//!
//! The original op runs once, as a `shared` op whose output is the tuple moved into one slot
//! per element. Each part is the only op that takes its slot, so it moves its element out:
//! elements need not be `Clone` (nor `Sync`), only `Send`.

use std::sync::Arc;

use cuflow_runtime::DeviceError;
use parking_lot::Mutex;

use super::map::Map;
use super::shared::Shared;
use super::{DeviceOp, DeviceOpExt};
use crate::context::ExecutionContext;
use crate::describe::{DagBuilder, Described, EdgeKind, NodeKind};

/// An element of an unzipped tuple, waiting for its part to take it.
type Slot<A> = Mutex<Option<A>>;

/// The shared op behind the parts of an unzipped `O`.
type Source<O> =
    Shared<Map<O, fn(<O as DeviceOp>::Output) -> <<O as DeviceOp>::Output as UnzipOutput>::Slots>>;

/// A tuple that [`unzip`](UnzipExt::unzip) can split: `(A, B)` up to eight elements, each
/// `Send`.
#[diagnostic::on_unimplemented(
    message = "`unzip` splits an op whose output is a tuple of 2 to 8 elements, but this op yields `{Self}`",
    label = "this op's output is not a tuple of 2 to 8 `Send` elements",
    note = "zip ops together with `zip!` (or map the output into a tuple) before unzipping"
)]
pub trait UnzipOutput: Send + Sized {
    /// One slot per element, each taken once by its part.
    #[doc(hidden)]
    type Slots: Send + Sync;
    /// One op per element.
    type Parts<O: DeviceOp<Output = Self>>;
    /// The tuple moved into its slots.
    #[doc(hidden)]
    fn into_slots(self) -> Self::Slots;
    /// The parts over a shared source.
    #[doc(hidden)]
    fn parts<O: DeviceOp<Output = Self>>(source: Source<O>) -> Self::Parts<O>;
}

/// One element of an unzipped op: runs the original op (once, whichever part runs first) and
/// moves its element out.
#[must_use = "device ops do nothing until synced or awaited"]
pub struct UnzipPart<O: DeviceOp, A>
where
    O::Output: UnzipOutput,
{
    source: Source<O>,
    take: fn(&<O::Output as UnzipOutput>::Slots) -> Option<A>,
    index: usize,
}

impl<O: DeviceOp, A: Send> DeviceOp for UnzipPart<O, A>
where
    O::Output: UnzipOutput,
{
    type Output = A;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<A, DeviceError> {
        let slots: Arc<_> = self.source.execute(ctx)?;
        (self.take)(&slots).ok_or_else(|| {
            DeviceError::internal(format!(
                "the element {} of an unzipped tuple was taken twice",
                self.index
            ))
        })
    }

    /// The original op, once for all parts (as the shared op it runs as), then the element
    /// this part takes.
    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        let source = self
            .source
            .describe_producer_with(dag, |split, dag| split.first().describe_into(dag));
        let part = dag.node(
            NodeKind::Continuation,
            format!("unzip element {}", self.index),
        );
        dag.edge(source.exit, part.entry, EdgeKind::Then);
        Described {
            entry: source.entry,
            exit: part.exit,
        }
    }
}

crate::impl_op_boilerplate!([O: DeviceOp, A: Send] UnzipPart<O, A> where O::Output: UnzipOutput);

/// Splits an op whose output is a tuple (of 2 to 8 elements) into one op per element. The
/// original op runs once, when the first part executes; each part moves its element out, so
/// elements need not be `Clone`. A part on another stream than the original waits for its
/// work, as a `shared` consumer does.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::{value, zip, DeviceOpExt, UnzipExt};
/// let (a, b) = value((1, String::from("b"))).unzip();
/// assert_eq!(zip!(b, a).sync()?, (String::from("b"), 1));
///
/// // Elements that cannot be cloned, in tuples of up to eight.
/// struct Token(u8);
/// let (t, _, _, _, _, _, _, last) =
///     value((Token(7), 1, 2, 3, 4, 5, 6, Token(9))).unzip();
/// assert_eq!((t.sync()?.0, last.sync()?.0), (7, 9));
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
///
/// An op whose output is not such a tuple is refused at compile time, with a message that
/// says so:
///
/// ```compile_fail,E0277
/// use cuflow_device_op::{value, UnzipExt};
/// let (a, b) = value(3).unzip();
/// ```
pub trait UnzipExt: DeviceOp + Sized {
    /// One op per tuple element.
    fn unzip(self) -> <Self::Output as UnzipOutput>::Parts<Self>
    where
        Self::Output: UnzipOutput;
}

impl<O: DeviceOp> UnzipExt for O {
    fn unzip(self) -> <O::Output as UnzipOutput>::Parts<O>
    where
        O::Output: UnzipOutput,
    {
        let split = <O::Output as UnzipOutput>::into_slots as fn(_) -> _;
        <O::Output as UnzipOutput>::parts(self.map(split).shared())
    }
}

macro_rules! unzip_tuple {
    ($($ty:ident $idx:tt),+) => {
        impl<$($ty: Send),+> UnzipOutput for ($($ty,)+) {
            type Slots = ($(Slot<$ty>,)+);
            type Parts<O: DeviceOp<Output = Self>> = ($(UnzipPart<O, $ty>,)+);

            fn into_slots(self) -> Self::Slots {
                ($(Mutex::new(Some(self.$idx)),)+)
            }

            fn parts<O: DeviceOp<Output = Self>>(source: Source<O>) -> Self::Parts<O> {
                ($(UnzipPart {
                    source: source.clone(),
                    take: |slots: &Self::Slots| slots.$idx.lock().take(),
                    index: $idx,
                },)+)
            }
        }
    };
}

unzip_tuple!(A 0, B 1);
unzip_tuple!(A 0, B 1, C 2);
unzip_tuple!(A 0, B 1, C 2, D 3);
unzip_tuple!(A 0, B 1, C 2, D 3, E 4);
unzip_tuple!(A 0, B 1, C 2, D 3, E 4, F 5);
unzip_tuple!(A 0, B 1, C 2, D 3, E 4, F 5, G 6);
unzip_tuple!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);

//! `zip!` and `join_all`: independent ops whose branches the policy may spread over streams.
//!
//! Each branch gets its own context from [`ExecutionContext::fork_branch`]. Branches placed on
//! another stream than the parent's are executed first, so that their lazily recorded fork
//! events precede the work of branches that share the parent's stream (which would otherwise
//! serialize them). Every branch with device work is joined back into the parent with an event.

use cuflow_runtime::{trace, DeviceError};

use super::DeviceOp;
use crate::context::ExecutionContext;
use crate::describe::{DagBuilder, Described, EdgeKind, NodeKind};

/// The op span of branch `index` while it executes (`zip branch 2 → stream 7`); nothing
/// while untraced.
fn branch_span(ctx: &ExecutionContext, index: usize) -> trace::OpSpan {
    if !trace::is_enabled() {
        return trace::op_span("");
    }
    trace::op_span(format!("zip branch {index} -> stream {}", ctx.stream_id()))
}

fn unfilled() -> DeviceError {
    DeviceError::internal("a zip branch produced no output")
}

macro_rules! zip_op {
    ($(#[$doc:meta])* $name:ident, $n:expr; $($ty:ident $op:ident $out:ident $ctx:ident $idx:tt),+) => {
        $(#[$doc])*
        #[must_use = "device ops do nothing until synced or awaited"]
        pub struct $name<$($ty),+>($($ty),+);

        impl<$($ty),+> $name<$($ty),+> {
            #[doc(hidden)]
            #[allow(clippy::too_many_arguments)]
            pub fn new($($op: $ty),+) -> Self {
                $name($($op),+)
            }
        }

        impl<$($ty: DeviceOp),+> DeviceOp for $name<$($ty),+> {
            type Output = ($($ty::Output,)+);

            fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
                let $name($($op),+) = self;
                $(
                    let mut $ctx = ctx.fork_branch($idx, $n)?;
                    let mut $op = Some($op);
                    let mut $out = None;
                )+
                let parent = ctx.stream_id();
                $(
                    if $ctx.stream_id() != parent {
                        if let Some(op) = $op.take() {
                            let _span = branch_span(&$ctx, $idx);
                            let _scope = $ctx.enter_scope();
                            $out = Some(op.execute(&mut $ctx)?);
                        }
                    }
                )+
                $(
                    if let Some(op) = $op.take() {
                        let _span = branch_span(&$ctx, $idx);
                        let _scope = $ctx.enter_scope();
                        $out = Some(op.execute(&mut $ctx)?);
                    }
                )+
                $( ctx.join_branch($ctx)?; )+
                Ok(($($out.ok_or_else(unfilled)?,)+))
            }

            fn describe_into(&self, dag: &mut DagBuilder) -> Described {
                let $name($($op),+) = self;
                let fork = dag.node(NodeKind::Fork, format!("zip ({} branches)", $n)).entry;
                let ends = [$($op.describe_into(dag)),+];
                let join = dag.node(NodeKind::Join, "join").entry;
                for b in ends {
                    dag.edge(fork, b.entry, EdgeKind::Fork);
                    dag.edge(b.exit, join, EdgeKind::Join);
                }
                Described { entry: fork, exit: join }
            }
        }

        crate::impl_op_boilerplate!([$($ty),+] $name<$($ty),+>);
    };
}

zip_op!(
    /// Two independent ops; from `zip!`.
    Zip2, 2; A a_op a_out a_ctx 0, B b_op b_out b_ctx 1);
zip_op!(
    /// Three independent ops; from `zip!`.
    Zip3, 3; A a_op a_out a_ctx 0, B b_op b_out b_ctx 1, C c_op c_out c_ctx 2);
zip_op!(
    /// Four independent ops; from `zip!`.
    Zip4, 4; A a_op a_out a_ctx 0, B b_op b_out b_ctx 1, C c_op c_out c_ctx 2,
    D d_op d_out d_ctx 3);
zip_op!(
    /// Five independent ops; from `zip!`.
    Zip5, 5; A a_op a_out a_ctx 0, B b_op b_out b_ctx 1, C c_op c_out c_ctx 2,
    D d_op d_out d_ctx 3, E e_op e_out e_ctx 4);
zip_op!(
    /// Six independent ops; from `zip!`.
    Zip6, 6; A a_op a_out a_ctx 0, B b_op b_out b_ctx 1, C c_op c_out c_ctx 2,
    D d_op d_out d_ctx 3, E e_op e_out e_ctx 4, F f_op f_out f_ctx 5);
zip_op!(
    /// Seven independent ops; from `zip!`.
    Zip7, 7; A a_op a_out a_ctx 0, B b_op b_out b_ctx 1, C c_op c_out c_ctx 2,
    D d_op d_out d_ctx 3, E e_op e_out e_ctx 4, F f_op f_out f_ctx 5, G g_op g_out g_ctx 6);
zip_op!(
    /// Eight independent ops; from `zip!`.
    Zip8, 8; A a_op a_out a_ctx 0, B b_op b_out b_ctx 1, C c_op c_out c_ctx 2,
    D d_op d_out d_ctx 3, E e_op e_out e_ctx 4, F f_op f_out f_ctx 5, G g_op g_out g_ctx 6,
    H h_op h_out h_ctx 7);

/// Combines 2 to 8 independent ops into one whose output is the tuple of theirs. The
/// scheduling policy may place the branches on different streams; the executor forks and joins
/// them with events. Branches without device work add no events.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::{value, zip, DeviceOpExt};
/// let (a, b, c) = zip!(value(1), value("two"), value(3.0)).sync()?;
/// assert_eq!((a, b, c), (1, "two", 3.0));
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
#[macro_export]
macro_rules! zip {
    ($a:expr, $b:expr $(,)?) => {
        $crate::op::zip::Zip2::new($a, $b)
    };
    ($a:expr, $b:expr, $c:expr $(,)?) => {
        $crate::op::zip::Zip3::new($a, $b, $c)
    };
    ($a:expr, $b:expr, $c:expr, $d:expr $(,)?) => {
        $crate::op::zip::Zip4::new($a, $b, $c, $d)
    };
    ($a:expr, $b:expr, $c:expr, $d:expr, $e:expr $(,)?) => {
        $crate::op::zip::Zip5::new($a, $b, $c, $d, $e)
    };
    ($a:expr, $b:expr, $c:expr, $d:expr, $e:expr, $f:expr $(,)?) => {
        $crate::op::zip::Zip6::new($a, $b, $c, $d, $e, $f)
    };
    ($a:expr, $b:expr, $c:expr, $d:expr, $e:expr, $f:expr, $g:expr $(,)?) => {
        $crate::op::zip::Zip7::new($a, $b, $c, $d, $e, $f, $g)
    };
    ($a:expr, $b:expr, $c:expr, $d:expr, $e:expr, $f:expr, $g:expr, $h:expr $(,)?) => {
        $crate::op::zip::Zip8::new($a, $b, $c, $d, $e, $f, $g, $h)
    };
}

/// The op returned by [`join_all`].
#[must_use = "device ops do nothing until synced or awaited"]
pub struct JoinAll<O>(Vec<O>);

/// Combines any number of independent ops of one type (box them to mix types) into one whose
/// output is the `Vec` of theirs, in order. Branches are placed as with `zip!`.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::{join_all, value, DeviceOpExt};
/// let v = join_all((0..5).map(|i| value(i * i)).collect()).sync()?;
/// assert_eq!(v, vec![0, 1, 4, 9, 16]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn join_all<O: DeviceOp>(ops: Vec<O>) -> JoinAll<O> {
    JoinAll(ops)
}

impl<O: DeviceOp> DeviceOp for JoinAll<O> {
    type Output = Vec<O::Output>;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        let n = self.0.len();
        let mut branches = Vec::with_capacity(n);
        for (i, op) in self.0.into_iter().enumerate() {
            branches.push((ctx.fork_branch(i, n)?, Some(op), None));
        }
        let parent = ctx.stream_id();
        for pass_on_parent in [false, true] {
            for (index, (bctx, op, out)) in branches.iter_mut().enumerate() {
                if (bctx.stream_id() == parent) == pass_on_parent {
                    if let Some(op) = op.take() {
                        let _span = branch_span(bctx, index);
                        let _scope = bctx.enter_scope();
                        *out = Some(op.execute(bctx)?);
                    }
                }
            }
        }
        let mut outputs = Vec::with_capacity(n);
        for (bctx, _, out) in branches {
            ctx.join_branch(bctx)?;
            outputs.push(out.ok_or_else(unfilled)?);
        }
        Ok(outputs)
    }

    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        let label = format!("join_all ({} branches)", self.0.len());
        dag.fork_join(
            label,
            self.0
                .iter()
                .map(|op| move |dag: &mut DagBuilder| op.describe_into(dag)),
        )
    }
}

crate::impl_op_boilerplate!([O] JoinAll<O>);

//! Lazy device ops: build a DAG of device work with combinators, then run it.
//!
//! ```
//! use cuflow_device_op::{value, zip, DeviceOpExt};
//! # fn main() -> Result<(), cuflow_runtime::DeviceError> {
//! // Nothing runs while building.
//! let op = zip!(value(1), value(2)).map(|(a, b)| a + b).then(|s| value(s * 10));
//! assert_eq!(op.sync()?, 30);
//! # Ok(()) }
//! ```
//!
//! Execution semantics (the guarantees every combinator keeps):
//! - `then` runs its continuation on the same stream, after the first op's work.
//! - `zip!` / `join_all` branches may run on different streams chosen by the policy; a branch
//!   on another stream waits for its parent's earlier work (an event), and the parent waits for
//!   each branch with device work. Branches without device work add no events.
//! - `shared` runs once; consumers on other streams wait on its producer's event.
//! - Outputs reach the program only after their work completed (`sync*` returns, the future
//!   resolves).
//! - Errors are values; a panic in a closure becomes [`DeviceError::Panicked`].
//! - A chain's depth is limited only by memory: a chain built in a loop
//!   (`op = op.then(f).boxed()`) nests one call per level when it executes or is dropped, and
//!   [`BoxedOp`] runs its levels on a stack grown on demand with the `stacker` crate (the one
//!   rustc grows its own stack with), so no chain overflows the thread's stack, whatever that
//!   stack's size. While the stack has room, a level costs an increment and, every 16th level,
//!   one stack-pointer comparison.

#![forbid(unsafe_code)]

mod completion;
mod context;
pub mod describe;
mod exec;
mod future;
pub mod op;

#[cfg(all(test, loom))]
mod loom_tests;

pub use context::{ExecutionContext, ExecutionStats};
pub use cuflow_runtime::DeviceError;
pub use exec::{default_device, enqueue_on, place_root};
pub use future::DeviceFuture;
pub use op::{
    from_fn, join_all, value, with_context, BoxedOp, Continuation, DeviceOp, DeviceOpExt, FromFn,
    Inspect, Map, Named, Shared, Then, UnzipExt, UnzipOutput, UnzipPart, Value, WithContext,
    WithPriority,
};

/// Negative auto-trait cases, checked by the compiler (`compile_fail` doctests); the positive
/// ones are pinned in `tests/auto_traits.rs`.
///
/// An op that captures an `Rc` is not `Send`, so it is not an op at all: neither a closure
/// given to a combinator...
///
/// ```compile_fail,E0277
/// use std::rc::Rc;
/// use cuflow_device_op::{value, DeviceOpExt};
/// let rc = Rc::new(1);
/// let _ = value(1).map(move |x| x + *rc).sync();
/// ```
///
/// ...nor a value...
///
/// ```compile_fail,E0277
/// use std::rc::Rc;
/// use cuflow_device_op::{value, DeviceOpExt};
/// let _ = value(Rc::new(1)).sync();
/// ```
///
/// ...nor an op type holding one, so it can never be run on, or moved to, another thread:
///
/// ```compile_fail,E0277
/// use std::rc::Rc;
/// use cuflow_device_op::{DeviceError, DeviceOp, ExecutionContext};
/// struct Local(Rc<i32>);
/// impl DeviceOp for Local {
///     type Output = i32;
///     fn execute(self, _: &mut ExecutionContext) -> Result<i32, DeviceError> {
///         Ok(*self.0)
///     }
/// }
/// ```
///
/// A `BoxedOp` is `Send` but not `Sync`: it cannot be shared between threads by reference.
///
/// ```compile_fail,E0277
/// use cuflow_device_op::BoxedOp;
/// fn assert_sync<T: Sync>() {}
/// assert_sync::<BoxedOp<'static, i32>>();
/// ```
///
/// `shared` hands one output to several threads at once, so the output must be `Sync`.
///
/// ```compile_fail,E0277
/// use std::cell::Cell;
/// use cuflow_device_op::{value, DeviceOpExt};
/// let _ = value(Cell::new(1)).shared();
/// ```
///
/// A `DeviceFuture` of a non-`Send` output cannot be moved to another thread.
///
/// ```compile_fail,E0277
/// use cuflow_device_op::DeviceFuture;
/// fn assert_send<T: Send>() {}
/// assert_send::<DeviceFuture<std::rc::Rc<i32>>>();
/// ```
///
/// For contrast, the same shapes with `Arc` compile:
///
/// ```
/// use std::sync::Arc;
/// use cuflow_device_op::{value, BoxedOp, DeviceOpExt};
/// fn assert_send<T: Send>() {}
/// let arc = Arc::new(1);
/// assert_eq!(value(1).map(move |x| x + *arc).sync()?, 2);
/// assert_eq!(value(Arc::new(3)).shared().sync()?.as_ref(), &Arc::new(3));
/// assert_send::<BoxedOp<'static, i32>>();
/// # Ok::<(), cuflow_device_op::DeviceError>(())
/// ```
#[doc(hidden)]
pub mod compile_fail_checks {}

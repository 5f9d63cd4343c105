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

#![forbid(unsafe_code)]

mod completion;
mod context;
mod exec;
mod future;
pub mod op;

pub use context::{ExecutionContext, ExecutionStats};
pub use cuflow_runtime::DeviceError;
pub use exec::{default_device, enqueue_on};
pub use future::DeviceFuture;
pub use op::{
    join_all, value, with_context, BoxedOp, Continuation, DeviceOp, DeviceOpExt, Inspect, Map,
    Shared, Then, UnzipExt, Value, WithContext,
};

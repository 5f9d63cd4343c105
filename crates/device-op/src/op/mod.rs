//! The [`DeviceOp`] trait and its combinators, one per file.
//!
//! An op is a value describing device work; building one does nothing. Executing it
//! ([`DeviceOpExt::sync`], [`DeviceOpExt::sync_on`], [`DeviceOpExt::schedule`], `.await`)
//! enqueues its work on streams chosen by a scheduling policy and returns its output once the
//! work has completed.
//!
//! Primitives: [`from_fn`](fn@from_fn) (an op from a closure over its context),
//! [`then`](DeviceOpExt::then), [`value`](fn@value), `zip!`, [`join_all`],
//! [`shared`](DeviceOpExt::shared), [`boxed`](DeviceOpExt::boxed),
//! [`with_context`](fn@with_context), [`with_priority`](DeviceOpExt::with_priority). Derived: [`map`](DeviceOpExt::map) and
//! [`inspect`](DeviceOpExt::inspect) are `then` + `value`; [`unzip`](UnzipExt::unzip) is
//! `shared` + `map`.

pub(crate) mod boxed;
pub(crate) mod from_fn;
pub(crate) mod map;
pub(crate) mod named;
pub(crate) mod shared;
pub(crate) mod then;
pub(crate) mod unzip;
pub(crate) mod value;
pub(crate) mod with_context;
pub(crate) mod with_priority;
#[doc(hidden)]
pub mod zip;

pub use boxed::BoxedOp;
pub use from_fn::{from_fn, FromFn};
pub use map::{Inspect, InspectFn, Map, MapFn};
pub use named::Named;
pub use shared::Shared;
pub use then::{Continuation, Then};
pub use unzip::{UnzipExt, UnzipOutput, UnzipPart};
pub use value::{value, Value};
pub use with_context::{with_context, WithContext};
pub use with_priority::WithPriority;
pub use zip::{join_all, JoinAll};

use std::sync::Arc;

use cuflow_runtime::{DeviceError, Stream};
use cuflow_scheduler::{PriorityLevel, SchedulingPolicy};

use crate::context::{ExecutionContext, ExecutionStats};
use crate::describe::{short_type_name, DagBuilder, DagDump, Described, NodeKind};
use crate::future::DeviceFuture;

/// Lazy device work producing `Output`.
///
/// Implementations enqueue their work on `ctx.stream()?` (for device work) and return their
/// output; the framework waits for completion before the output reaches the program. The
/// output must be `Send` so that futures can move between threads.
pub trait DeviceOp: Send {
    /// What the op produces.
    type Output: Send;

    /// Enqueues the op's work with `ctx`. Called by the framework only.
    ///
    /// # Errors
    ///
    /// Any [`DeviceError`] hit while enqueueing.
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError>;

    /// Adds the op's structure to `dag` and returns its entry and exit nodes (see
    /// [`DeviceOpExt::describe`]). By default, one node named after the op's type; the
    /// combinators describe their parts.
    fn describe_into(&self, dag: &mut DagBuilder) -> Described {
        dag.node(NodeKind::Opaque, short_type_name::<Self>())
    }
}

/// The combinators and executors of every [`DeviceOp`].
pub trait DeviceOpExt: DeviceOp + Sized {
    /// Runs `f` on this op's output and then the op it returns, on the same stream, after this
    /// op's work.
    ///
    /// A chain built in a loop (`op = op.then(f).boxed()`) may be as deep as memory allows:
    /// executing, awaiting, sharing, capturing, describing or dropping it never exhausts the
    /// thread's stack (see [`boxed`](DeviceOpExt::boxed)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::{value, DeviceOpExt};
    /// let n = value(20).then(|x| value(x + 1)).map(|x| x * 2).sync()?;
    /// assert_eq!(n, 42);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn then<F, B>(self, f: F) -> Then<Self, F>
    where
        F: FnOnce(Self::Output) -> B + Send,
        B: DeviceOp,
    {
        Then::new(self, f)
    }

    /// Transforms the output on the host; adds no device work.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::{value, DeviceOpExt};
    /// assert_eq!(value(21).map(|v| v * 2).sync()?, 42);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn map<F, R>(self, f: F) -> Map<Self, F>
    where
        F: FnOnce(Self::Output) -> R + Send,
        R: Send,
    {
        Then::new(self, MapFn(f))
    }

    /// Looks at the output on the host and passes it on unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::{value, DeviceOpExt};
    /// let mut seen = 0;
    /// let v = value(7).inspect(|v| seen = *v).sync()?;
    /// assert_eq!((v, seen), (7, 7));
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn inspect<F>(self, f: F) -> Inspect<Self, F>
    where
        F: FnOnce(&Self::Output) + Send,
    {
        Then::new(self, InspectFn(f))
    }

    /// Makes the op cloneable: it runs at most once, and every clone yields an `Arc` of its
    /// output. Consumers on other streams wait on the producer's event.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::{value, zip, DeviceOpExt};
    /// let s = value(vec![1, 2, 3]).shared();
    /// let (a, b) = zip!(s.clone(), s).sync()?;
    /// assert!(std::sync::Arc::ptr_eq(&a, &b));
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn shared(self) -> Shared<Self>
    where
        Self::Output: Sync,
    {
        Shared::new(self)
    }

    /// Runs the op, and every branch it forks, at priority `level`: policies that keep
    /// streams of several priorities (`Priority`) place its work on the matching ones.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::{from_fn, DeviceOpExt};
    /// use cuflow_scheduler::PriorityLevel;
    /// let level = from_fn(|ctx| Ok(ctx.priority()))
    ///     .with_priority(PriorityLevel::High)
    ///     .sync()?;
    /// assert_eq!(level, PriorityLevel::High);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn with_priority(self, level: PriorityLevel) -> WithPriority<Self> {
        WithPriority::new(self, level)
    }

    /// Names the op: while a trace is recorded ([`cuflow_runtime::trace`]), its execution is
    /// an op span of that name, holding the work it enqueues and the spans of the ops inside
    /// it; with NVTX available (Nsight Systems), it is also an NVTX range. Untraced, the name
    /// costs one atomic load.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::{value, DeviceOpExt};
    /// use cuflow_runtime::trace;
    /// # let _lock = trace::tests_serial();
    /// trace::start()?;
    /// let n = value(20).named("answer").map(|v| v + 1).sync()?;
    /// let t = trace::stop()?;
    /// assert_eq!(n, 21);
    /// let span = t.op_spans().find(|s| s.name == "answer").unwrap();
    /// assert_eq!(t.op_path(span), ["sync"]);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn named(self, name: impl Into<std::borrow::Cow<'static, str>>) -> Named<Self> {
        Named::new(self, name.into())
    }

    /// The op's structure before it runs, as a graph: its `from_fn` work, values, `then`
    /// continuations, `zip!` forks and joins, `shared` producers and named ops (see
    /// [`crate::describe`] for what is known before an op runs and what only its trace shows).
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::{from_fn, value, zip, DeviceOpExt};
    /// let op = zip!(value(2), from_fn(|_ctx| Ok(3))).map(|(a, b)| a * b);
    /// let dag = op.describe();
    /// let dot = dag.to_dot();
    /// assert!(dot.contains("zip (2 branches)") && dot.contains("label=\"join\""));
    /// println!("{dag}");
    /// assert_eq!(op.sync()?, 6);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn describe(&self) -> DagDump {
        let mut dag = DagBuilder::new();
        self.describe_into(&mut dag);
        dag.finish()
    }

    /// Erases the op's type, e.g. to keep ops of different types in one `Vec`, or to build a
    /// chain in a loop.
    ///
    /// Boxed ops nest to any depth: a chain's depth is limited only by memory. Each boxed
    /// level nests one call when the chain executes, describes itself or is dropped, so a
    /// deep chain runs on a stack grown on demand (a 1 MiB segment at a time, on any thread,
    /// whatever its own stack size) instead of overflowing the thread's stack.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::{join_all, value, BoxedOp, DeviceOpExt};
    /// let ops: Vec<BoxedOp<'static, i32>> = vec![value(1).boxed(), value(2).map(|x| x * 10).boxed()];
    /// assert_eq!(join_all(ops).sync()?, vec![1, 20]);
    ///
    /// // A chain 300,000 levels deep, on a thread with a 256 KiB stack.
    /// let n = std::thread::Builder::new().stack_size(256 * 1024).spawn(|| {
    ///     let mut op = value(0u64).boxed();
    ///     for _ in 0..300_000 {
    ///         op = op.then(|v| value(v + 1)).boxed();
    ///     }
    ///     op.sync()
    /// }).unwrap().join().unwrap()?;
    /// assert_eq!(n, 300_000);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    fn boxed<'a>(self) -> BoxedOp<'a, Self::Output>
    where
        Self: 'a,
    {
        BoxedOp::new(self)
    }

    /// Runs the op on the default device with its default policy and waits for it.
    ///
    /// # Errors
    ///
    /// Any error of the op or its work; [`DeviceError::Reentrant`] when called from inside
    /// another op's execution; [`DeviceError::Panicked`] when a closure panicked. When the op
    /// fails part-way, the work it had already enqueued has finished before the error is
    /// returned.
    fn sync(self) -> Result<Self::Output, DeviceError> {
        crate::exec::sync(self)
    }

    /// Runs the op with `stream` as its root stream (branches may go elsewhere, per the
    /// device's default policy) and waits for it.
    ///
    /// # Errors
    ///
    /// As [`DeviceOpExt::sync`]; [`DeviceError::Capture`], before anything is enqueued, when
    /// `stream` is being captured into a graph (the work would be recorded, not run) or is a
    /// stream made for captures ([`Device::new_stream_for_captures`](cuflow_runtime::Device::new_stream_for_captures),
    /// which a capture may take at any moment).
    fn sync_on(self, stream: &Stream) -> Result<Self::Output, DeviceError> {
        crate::exec::sync_on(self, stream).map(|(out, _)| out)
    }

    /// Like [`DeviceOpExt::sync_on`], and also reports what the execution did (events,
    /// waits, streams used).
    ///
    /// # Errors
    ///
    /// As [`DeviceOpExt::sync_on`].
    fn sync_on_with_stats(
        self,
        stream: &Stream,
    ) -> Result<(Self::Output, ExecutionStats), DeviceError> {
        crate::exec::sync_on(self, stream)
    }

    /// Like [`DeviceOpExt::sync`] with an explicit policy, also reporting what the execution
    /// did.
    ///
    /// # Errors
    ///
    /// As [`DeviceOpExt::sync`].
    fn sync_with_policy<P>(self, policy: &P) -> Result<(Self::Output, ExecutionStats), DeviceError>
    where
        P: SchedulingPolicy + Clone + 'static,
    {
        crate::exec::sync_with_policy(self, Arc::new(policy.clone()))
    }

    /// Enqueues the op now under `policy` and returns a future that resolves when its work
    /// has completed. The future is `Send` and works on any async runtime.
    ///
    /// # Errors
    ///
    /// Errors hit while enqueueing (the work enqueued before the error has then finished);
    /// errors of the work itself come from the future.
    fn schedule<P>(self, policy: &P) -> Result<DeviceFuture<Self::Output>, DeviceError>
    where
        P: SchedulingPolicy + Clone + 'static,
    {
        crate::exec::schedule(self, Arc::new(policy.clone()))
    }
}

impl<T: DeviceOp> DeviceOpExt for T {}

/// Implements the boilerplate every op type shares: `Debug` (naming the op type) and
/// `IntoFuture` (so that `.await` runs it on the default device). Use it for op types of
/// crates built on cuflow, as `impl_op_boilerplate!([A: DeviceOp] MyOp<A>);`, with the
/// type's `where` clause after it if it has one.
#[macro_export]
macro_rules! impl_op_boilerplate {
    ([$($generics:tt)*] $ty:ty $(where $($bounds:tt)*)?) => {
        impl<$($generics)*> ::core::fmt::Debug for $ty $(where $($bounds)*)? {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(::core::any::type_name::<Self>())
            }
        }

        impl<$($generics)*> ::core::future::IntoFuture for $ty
        where
            $ty: $crate::DeviceOp + 'static,
            $($($bounds)*)?
        {
            type Output = ::core::result::Result<
                <$ty as $crate::DeviceOp>::Output,
                $crate::DeviceError,
            >;
            type IntoFuture = $crate::DeviceFuture<<$ty as $crate::DeviceOp>::Output>;

            fn into_future(self) -> Self::IntoFuture {
                $crate::DeviceFuture::lazy(self)
            }
        }
    };
}

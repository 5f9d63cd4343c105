//! The synchronization primitives of cuflow's concurrency cores, and the switch that lets loom
//! model-check them.
//!
//! The cores are the small, CUDA-free state machines that threads hand work and results through:
//! the hazard tracker and the streams' access clocks (`access.rs`), and in `cuflow-device-op`
//! the completion handoff behind `.await` (`completion.rs`) and the run-once state machine of
//! `shared` (`op/shared.rs`). They take every `Arc`, atomic, lock and thread function they use
//! from here. In a normal build these are `std`'s and `parking_lot`'s. Built with
//! `RUSTFLAGS="--cfg loom"`, they are [loom]'s instrumented ones, and the crates' `loom_tests`
//! modules run the cores' own code under every interleaving of a few threads (`.ci/run` says
//! how).
//!
//! Invariants:
//! - Only a core imports from here. Code that loom cannot run (devices, streams, events, the
//!   backends' worker threads, FFI handles, process-wide statics) takes its primitives from
//!   `std` and `parking_lot` directly, so a loom build compiles it unchanged.
//! - Both builds offer the same API, `parking_lot`'s: [`Mutex::lock`] returns the guard itself
//!   (no poisoning), and [`Condvar::wait`] takes the guard by `&mut`. A core compiles the same
//!   way in both.
//! - In a loom build a core's primitives work only inside `loom::model`: such a build runs
//!   nothing but the models.
//!
//! [loom]: https://docs.rs/loom

#[cfg(not(loom))]
pub use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub use std::sync::Arc;

#[cfg(loom)]
pub use self::model::{Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(loom)]
pub use loom::sync::Arc;

/// The thread functions of the cores: which thread runs (a thread of the model, in a loom
/// build) and yielding in a spin.
pub mod thread {
    #[cfg(loom)]
    pub use loom::thread::{current, yield_now, ThreadId};
    #[cfg(not(loom))]
    pub use std::thread::{current, yield_now, ThreadId};
}

/// loom's mutex and condition variable behind `parking_lot`'s API.
#[cfg(loom)]
mod model {
    use std::fmt;
    use std::ops::{Deref, DerefMut};

    /// A mutex of the model; [`Mutex::lock`] returns the guard itself, as `parking_lot`'s.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        /// A new, unlocked mutex.
        pub fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        /// Blocks until the lock is acquired. A panic while it was held (which fails the model
        /// anyway) does not poison it.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            let guard = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            MutexGuard(Some(guard))
        }
    }

    /// The guard of a [`Mutex`]. Always holds loom's guard, except inside [`Condvar::wait`],
    /// which moves it out and back while nothing else can reach the guard.
    pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> MutexGuard<'_, T> {
        fn held(&self) -> &loom::sync::MutexGuard<'_, T> {
            match &self.0 {
                Some(guard) => guard,
                None => unreachable!("a mutex guard is held outside Condvar::wait"),
            }
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            self.held()
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            match &mut self.0 {
                Some(guard) => guard,
                None => unreachable!("a mutex guard is held outside Condvar::wait"),
            }
        }
    }

    impl<T: fmt::Debug> fmt::Debug for MutexGuard<'_, T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Debug::fmt(&**self.held(), f)
        }
    }

    /// A condition variable of the model; [`Condvar::wait`] takes the guard by `&mut`, as
    /// `parking_lot`'s.
    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        /// A new condition variable.
        pub fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }

        /// Releases the guard's lock, blocks until notified, and takes the lock again.
        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            if let Some(held) = guard.0.take() {
                let held = self
                    .0
                    .wait(held)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                guard.0 = Some(held);
            }
        }

        /// Wakes one thread blocked in [`Condvar::wait`].
        pub fn notify_one(&self) {
            self.0.notify_one();
        }

        /// Wakes every thread blocked in [`Condvar::wait`].
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

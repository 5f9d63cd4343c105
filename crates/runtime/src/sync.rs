//! Synchronization primitives used by cuflow's concurrency cores.
//!
//! Completion slots and shared state import their atomics and locks from here rather than from
//! `std` directly, so that a model checker can swap them for instrumented versions without
//! touching the cores themselves.

pub use parking_lot::{
    Condvar, MappedMutexGuard, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
pub use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
pub use std::sync::{Arc, Weak};

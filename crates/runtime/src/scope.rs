//! Error scopes: which caller an asynchronous error belongs to.
//!
//! Work that fails after it was enqueued (a host kernel that returns an error, a host function
//! that panics) cannot return its error to the call that enqueued it. Without scopes, the error
//! is kept by the stream and reported by the stream's next synchronization, whoever asks.
//! That is the right owner for plain runtime use (one caller, one stream), but not when several
//! independent units of work share a stream: one unit's failure would be reported to another.
//!
//! An [`ErrorScope`] names one such unit. While a scope is entered on a thread, every piece of
//! work that thread enqueues is tagged with it, and an asynchronous failure of that work is
//! stored in the scope instead of the stream. Synchronizing a stream, or reading a buffer back,
//! while the scope is entered, reports the scope's error (and not other scopes' errors, nor the
//! stream's untagged ones). A scope keeps its first error until it is dropped: reading it does
//! not clear it, so a unit that observed its error and carried on still ends in that error.
//!
//! An event recorded while the scope is entered reports the failures of the work it follows,
//! and no other: the first failure of the scope's work enqueued before it on its stream (a wait
//! on an event that failed fails too, so that covers the work of other streams the stream
//! waited for). A unit's failure thus travels along events to the work that depends on it, in
//! this unit or in another that waits on its events, but not to another unit that waits on an
//! event of this unit's work that did not depend on the failed work (on the host backend; a
//! CUDA event reports device faults only).
//!
//! The device-op layer enters one scope per execution (`sync`, `schedule`, `.await`), which is
//! what makes an op's error reach that op and its dependants only.
//!
//! A CUDA kernel's fault is not scoped: the driver reports it to every later call of the
//! context (see [`DeviceError::DeviceFaulted`]).

use std::cell::RefCell;
use std::fmt;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::DeviceError;

/// The errors of one unit of asynchronous work (see the [module docs](self)).
///
/// # Examples
///
/// ```
/// use cuflow_runtime::{Device, ErrorScope};
///
/// let device = Device::host();
/// let stream = device.new_stream()?;
/// let scope = ErrorScope::new();
/// {
///     let _entered = scope.enter();
///     stream.enqueue_host_fn(|| panic!("this unit's work fails"))?;
///     // The failure is this scope's: the synchronization inside it reports it ...
///     assert!(stream.synchronize().is_err());
/// }
/// // ... and the stream is not left holding it for someone else.
/// stream.synchronize()?;
/// assert!(scope.error().is_some());
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
#[derive(Clone, Default)]
pub struct ErrorScope {
    error: Arc<Mutex<Option<DeviceError>>>,
}

thread_local! {
    static CURRENT: RefCell<Option<ErrorScope>> = const { RefCell::new(None) };
}

impl ErrorScope {
    /// A new scope, holding no error.
    pub fn new() -> ErrorScope {
        ErrorScope::default()
    }

    /// Makes this the current thread's scope until the guard is dropped (the previous one, if
    /// any, is restored then).
    pub fn enter(&self) -> EnteredScope {
        let previous = CURRENT.with(|c| c.replace(Some(self.clone())));
        EnteredScope { previous }
    }

    /// The scope's first error, if its work failed so far.
    pub fn error(&self) -> Option<DeviceError> {
        self.error.lock().clone()
    }

    /// `Err` with the scope's first error, if any.
    ///
    /// # Errors
    ///
    /// The scope's first error.
    pub fn check(&self) -> Result<(), DeviceError> {
        match self.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stores `error` unless the scope already holds one (the first error is the cause; what
    /// follows it is usually its consequence).
    pub(crate) fn record(&self, error: DeviceError) {
        let mut slot = self.error.lock();
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    /// The scope entered on this thread, if any.
    pub(crate) fn current() -> Option<ErrorScope> {
        CURRENT.with(|c| c.borrow().clone())
    }
}

impl fmt::Debug for ErrorScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ErrorScope")
            .field("error", &self.error())
            .finish()
    }
}

/// The guard of an entered [`ErrorScope`]; dropping it restores the thread's previous scope.
#[must_use = "the scope is left when this guard is dropped"]
pub struct EnteredScope {
    previous: Option<ErrorScope>,
}

impl Drop for EnteredScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

impl fmt::Debug for EnteredScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnteredScope").finish_non_exhaustive()
    }
}

/// Where an asynchronous failure of a piece of work goes: its scope, or else its stream.
#[derive(Clone)]
pub(crate) struct ErrorSink {
    scope: Option<ErrorScope>,
    stream: Arc<Mutex<Option<DeviceError>>>,
}

impl ErrorSink {
    /// The sink of work enqueued now, on the thread's current scope or the stream's slot.
    pub(crate) fn here(stream: &Arc<Mutex<Option<DeviceError>>>) -> ErrorSink {
        ErrorSink {
            scope: ErrorScope::current(),
            stream: stream.clone(),
        }
    }

    /// Stores the failure of the work (first error wins).
    pub(crate) fn record(&self, error: DeviceError) {
        match &self.scope {
            Some(scope) => scope.record(error),
            None => {
                let mut slot = self.stream.lock();
                if slot.is_none() {
                    *slot = Some(error);
                }
            }
        }
    }

    /// The error the work's observers see: the scope's, or a copy of the stream's.
    pub(crate) fn peek(&self) -> Option<DeviceError> {
        match &self.scope {
            Some(scope) => scope.error(),
            None => self.stream.lock().clone(),
        }
    }

    /// The error a synchronization reports: the scope's (kept), or the stream's (taken).
    pub(crate) fn take_for_sync(&self) -> Option<DeviceError> {
        match &self.scope {
            Some(scope) => scope.error(),
            None => self.stream.lock().take(),
        }
    }
}

/// The failures of the work run by one stream, per scope: what the stream's events report (see
/// the [module docs](self)). Kept by the host backend's stream worker, which runs the stream's
/// work in order, so that an event sees exactly the failures of the work before it.
#[derive(Default)]
pub(crate) struct StreamFailures {
    /// The first failure of each scope's work on this stream; a scope that was dropped is
    /// forgotten when the next failure is stored.
    scoped: Vec<(Weak<Mutex<Option<DeviceError>>>, DeviceError)>,
}

impl StreamFailures {
    /// Stores the failure of a piece of work enqueued with `sink`: in its scope (or stream),
    /// and as this stream's failure of that scope.
    pub(crate) fn record(&mut self, sink: &ErrorSink, error: DeviceError) {
        if let Some(scope) = &sink.scope {
            if self.of(scope).is_none() {
                self.scoped.retain(|(key, _)| key.strong_count() > 0);
                self.scoped
                    .push((Arc::downgrade(&scope.error), error.clone()));
            }
        }
        sink.record(error);
    }

    /// The error an event recorded with `sink` completes with: the first failure of its
    /// scope's work on this stream so far; for untagged work, the stream's error.
    pub(crate) fn seen_by(&self, sink: &ErrorSink) -> Option<DeviceError> {
        match &sink.scope {
            Some(scope) => self.of(scope).cloned(),
            None => sink.peek(),
        }
    }

    fn of(&self, scope: &ErrorScope) -> Option<&DeviceError> {
        let key = Arc::as_ptr(&scope.error);
        self.scoped
            .iter()
            .find(|(k, _)| std::ptr::eq(k.as_ptr(), key))
            .map(|(_, e)| e)
    }
}

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
//! and no other: the first failure of the scope's work (its nested scopes' included) enqueued
//! before it on its stream, or of the work of a scope it is nested in that was enqueued before
//! the nested scope was made (a wait on an event that failed fails too, so that covers the
//! work of other streams the stream waited for). The work an outer scope enqueues after a
//! nested scope was made is not among it: the device-op layer gives each branch of an
//! execution a scope of its own, made when the branches are forked, and branches that happen to
//! share a stream do not depend on each other's work. A unit's failure thus travels along
//! events to the work that depends on it, in this unit or in another that waits on its events,
//! but not to another unit that waits on an event of this unit's work that did not depend on
//! the failed work (on the host backend; a CUDA event reports device faults only).
//!
//! A scope can be *nested* in the scope entered on the thread ([`ErrorScope::nested`]): its
//! failures are also its parent's, and it holds only those of the part of the work that ran
//! while it was entered. A scope can *depend on* another ([`ErrorScope::depend_on`]) whose work
//! its own work waits for: it then reports that scope's errors as its own. That is how a
//! failure reaches work that depends on it on every backend, whatever its events carry.
//! Once all of a scope's work has completed, [`ErrorScope::settle`] folds the errors of the
//! scopes it depends on into its own and forgets them, so that chains of dependent scopes do
//! not grow with a long-running program.
//!
//! The device-op layer enters one scope per execution (`sync`, `schedule`, `.await`), which is
//! what makes an op's error reach that op and its dependants only. A `shared` op's production
//! runs in a scope nested in its producer's execution, and each consumer's scope depends on
//! it.
//!
//! A CUDA kernel's fault is not scoped: the driver reports it to every later call of the
//! context (see [`DeviceError::DeviceFaulted`]).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;
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
    inner: Arc<ScopeInner>,
}

struct ScopeInner {
    /// The first failure of the scope's own work (nested scopes' included).
    error: Mutex<Option<DeviceError>>,
    /// The scope this one is nested in: every failure stored here is stored there too.
    parent: Option<Weak<ScopeInner>>,
    links: Mutex<Links>,
    /// When the scope was made, on the process's [`next_tick`] clock: of the failures of the
    /// scope it is nested in, its events report only those of work enqueued before this.
    created: u64,
}

impl Default for ScopeInner {
    fn default() -> Self {
        ScopeInner {
            error: Mutex::new(None),
            parent: None,
            links: Mutex::new(Links::default()),
            created: next_tick(),
        }
    }
}

/// A process-wide count that orders the making of scopes and the enqueueing of work.
fn next_tick() -> u64 {
    static CLOCK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    CLOCK.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The scopes whose errors a scope reports, and the scopes nested in it, until it settles.
#[derive(Default)]
struct Links {
    depends_on: Vec<ErrorScope>,
    nested: Vec<ErrorScope>,
}

impl Drop for ScopeInner {
    /// Unlinks the scopes this one held, and those they held, one after the other: a chain of
    /// scopes each holding the next (deep chains of shared ops make them) would otherwise be
    /// dropped by one nested drop per link, past the end of the thread's stack.
    fn drop(&mut self) {
        let links = std::mem::take(self.links.get_mut());
        let mut pending = links.depends_on;
        pending.extend(links.nested);
        while let Some(scope) = pending.pop() {
            // The last handle of that scope: take its links before it is dropped (with none).
            if let Some(mut inner) = Arc::into_inner(scope.inner) {
                let links = std::mem::take(inner.links.get_mut());
                pending.extend(links.depends_on);
                pending.extend(links.nested);
            }
        }
    }
}

thread_local! {
    /// The scopes entered on this thread and not left yet, each with the number of its guard,
    /// most recently entered last: the current scope is the last one. A guard removes its own
    /// entry, wherever it is, so guards dropped out of order leave the others' scopes entered.
    static ENTERED: RefCell<Vec<(u64, ErrorScope)>> = const { RefCell::new(Vec::new()) };
    /// The number of the next guard made on this thread.
    static NEXT_GUARD: Cell<u64> = const { Cell::new(0) };
}

impl ErrorScope {
    /// A new scope, holding no error.
    pub fn new() -> ErrorScope {
        ErrorScope::default()
    }

    /// A scope nested in the one entered on this thread, or `None` when no scope is entered:
    /// a failure of the work enqueued while the nested scope is entered is stored in both.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{Device, ErrorScope};
    ///
    /// let stream = Device::host().new_stream()?;
    /// let outer = ErrorScope::new();
    /// let _outer = outer.enter();
    /// let part = ErrorScope::nested().expect("a scope is entered");
    /// {
    ///     let _part = part.enter();
    ///     stream.enqueue_host_fn(|| panic!("this part fails"))?;
    /// }
    /// assert!(stream.synchronize().is_err());
    /// assert!(part.error().is_some() && outer.error().is_some());
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn nested() -> Option<ErrorScope> {
        let parent = ErrorScope::current()?;
        let child = ErrorScope {
            inner: Arc::new(ScopeInner {
                error: Mutex::new(None),
                parent: Some(Arc::downgrade(&parent.inner)),
                links: Mutex::new(Links::default()),
                created: next_tick(),
            }),
        };
        parent.inner.links.lock().nested.push(child.clone());
        Some(child)
    }

    /// Makes this scope, and the scopes it is nested in, report `other`'s errors as their own:
    /// their work waits for `other`'s, so a failure there is a failure here. The errors `other`
    /// holds when this scope [settles](Self::settle) stay with it; later ones do not.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{Device, ErrorScope};
    ///
    /// let stream = Device::host().new_stream()?;
    /// let (producer, consumer) = (ErrorScope::new(), ErrorScope::new());
    /// {
    ///     let _entered = producer.enter();
    ///     stream.enqueue_host_fn(|| panic!("the producer fails"))?;
    ///     assert!(stream.synchronize().is_err());
    /// }
    /// consumer.depend_on(&producer);
    /// assert!(consumer.check().is_err());
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn depend_on(&self, other: &ErrorScope) {
        // The work of a nested scope is part of its parents' work: they depend on `other` too.
        for scope in self.with_parents() {
            if Arc::ptr_eq(&scope, &other.inner) {
                continue;
            }
            let mut links = scope.links.lock();
            if !links
                .depends_on
                .iter()
                .any(|d| Arc::ptr_eq(&d.inner, &other.inner))
            {
                links.depends_on.push(other.clone());
            }
        }
    }

    /// [`depend_on`](Self::depend_on) for the scope entered on this thread, if any.
    pub fn depended_on_here(&self) {
        if let Some(current) = ErrorScope::current() {
            current.depend_on(self);
        }
    }

    /// Makes this the current thread's scope until the guard is dropped. Dropping it leaves
    /// this entry of the scope, wherever it is: the thread is then in the scope most recently
    /// entered whose guard is still alive (the one entered before, when guards are dropped in
    /// the reverse order of their entries), or in none.
    pub fn enter(&self) -> EnteredScope {
        let token = NEXT_GUARD.with(|n| {
            let token = n.get();
            n.set(token.wrapping_add(1));
            token
        });
        ENTERED.with(|e| e.borrow_mut().push((token, self.clone())));
        EnteredScope {
            token,
            _not_send: PhantomData,
        }
    }

    /// The scope's first error, if its work (or the work of a scope it depends on) failed so
    /// far.
    pub fn error(&self) -> Option<DeviceError> {
        if let Some(e) = self.inner.error.lock().clone() {
            return Some(e);
        }
        // The scopes it depends on, and theirs, each once (they form no cycle: a scope depends
        // on work enqueued before its own, but one scope is reachable along several paths).
        let mut seen: HashSet<*const ScopeInner> = HashSet::from([Arc::as_ptr(&self.inner)]);
        let mut next: Vec<ErrorScope> = self.inner.links.lock().depends_on.clone();
        while let Some(scope) = next.pop() {
            if !seen.insert(Arc::as_ptr(&scope.inner)) {
                continue;
            }
            if let Some(e) = scope.inner.error.lock().clone() {
                return Some(e);
            }
            next.extend(scope.inner.links.lock().depends_on.iter().cloned());
        }
        None
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

    /// Says that all the work of this scope, of the scopes nested in it and of the scopes it
    /// depends on has completed: no failure can reach any of them any more. Each of them keeps
    /// the error it reports now as its own and forgets its links, so that a long chain of
    /// dependent scopes is not kept alive. Calling it earlier loses the failures that arrive
    /// afterwards in the scopes depended on.
    pub fn settle(&self) {
        {
            let links = self.inner.links.lock();
            if links.depends_on.is_empty() && links.nested.is_empty() {
                return;
            }
        }
        // Every scope reachable along links, in the order found (each once).
        let mut found: Vec<ErrorScope> = Vec::new();
        let mut seen: HashSet<*const ScopeInner> = HashSet::new();
        let mut next = vec![self.clone()];
        while let Some(scope) = next.pop() {
            if !seen.insert(Arc::as_ptr(&scope.inner)) {
                continue;
            }
            {
                let links = scope.inner.links.lock();
                next.extend(links.depends_on.iter().cloned());
                next.extend(links.nested.iter().cloned());
            }
            found.push(scope);
        }
        // The last found first: along a chain, each scope's dependencies are folded before it
        // is, so each fold looks one link deep.
        for scope in found.iter().rev() {
            let error = scope.error();
            {
                let mut slot = scope.inner.error.lock();
                if slot.is_none() {
                    *slot = error;
                }
            }
            *scope.inner.links.lock() = Links::default();
        }
    }

    /// Stores `error` unless the scope already holds one (the first error is the cause; what
    /// follows it is usually its consequence), and in the scopes it is nested in.
    pub(crate) fn record(&self, error: DeviceError) {
        let mut scope = Some(self.inner.clone());
        while let Some(s) = scope {
            {
                let mut slot = s.error.lock();
                if slot.is_none() {
                    *slot = Some(error.clone());
                }
            }
            scope = s.parent.as_ref().and_then(Weak::upgrade);
        }
    }

    /// The scope entered on this thread (the innermost), if any.
    ///
    /// A scope is entered per thread: work that another thread enqueues carries that thread's
    /// scope, not this one. Work a unit hands to a thread of its own (an op's closure that
    /// launches from a worker thread, say) belongs to the unit only if that thread enters the
    /// unit's scope, taken here; else its failure is kept by the stream, for the stream's next
    /// synchronization outside any scope.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{Device, ErrorScope};
    ///
    /// let stream = Device::host().new_stream()?;
    /// let scope = ErrorScope::new();
    /// let _entered = scope.enter();
    /// let unit = ErrorScope::current().expect("a scope is entered here");
    /// std::thread::scope(|threads| {
    ///     threads.spawn(|| {
    ///         let _entered = unit.enter();
    ///         stream.enqueue_host_fn(|| panic!("the helper thread's work fails"))
    ///     });
    /// });
    /// // The helper thread's failure is this unit's.
    /// assert!(stream.synchronize().is_err());
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn current() -> Option<ErrorScope> {
        ENTERED.with(|e| e.borrow().last().map(|(_, scope)| scope.clone()))
    }

    /// This scope and the scopes it is nested in that are still alive, innermost first.
    fn with_parents(&self) -> impl Iterator<Item = Arc<ScopeInner>> {
        std::iter::successors(Some(self.inner.clone()), |s| {
            s.parent.as_ref().and_then(Weak::upgrade)
        })
    }
}

impl fmt::Debug for ErrorScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ErrorScope")
            .field("error", &self.error())
            .finish()
    }
}

/// The guard of an entered [`ErrorScope`]; dropping it leaves that entry of the scope (see
/// [`ErrorScope::enter`]).
///
/// It is not `Send`: the scope is entered on the thread that entered it, and only that
/// thread can leave it.
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// send(cuflow_runtime::ErrorScope::new().enter());
/// ```
#[must_use = "the scope is left when this guard is dropped"]
pub struct EnteredScope {
    /// The number of this entry among the thread's entered scopes.
    token: u64,
    _not_send: PhantomData<*const ()>,
}

impl Drop for EnteredScope {
    fn drop(&mut self) {
        let token = self.token;
        // The scope is dropped once the list's borrow has ended. `try_with`: a guard dropped
        // while the thread's locals are destroyed has nothing left to leave.
        let left = ENTERED.try_with(|e| {
            let mut entered = e.borrow_mut();
            let pos = entered.iter().rposition(|(t, _)| *t == token)?;
            Some(entered.remove(pos))
        });
        drop(left);
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
    /// When the work was enqueued, on the [`next_tick`] clock.
    at: u64,
}

impl ErrorSink {
    /// The sink of work enqueued now, on the thread's current scope or the stream's slot.
    pub(crate) fn here(stream: &Arc<Mutex<Option<DeviceError>>>) -> ErrorSink {
        ErrorSink {
            scope: ErrorScope::current(),
            stream: stream.clone(),
            at: next_tick(),
        }
    }

    /// The sink of the stream's own slot, whatever scope the calling thread is in: where what
    /// is left of a dropped stream's work reports (see `Device::synchronize`).
    pub(crate) fn of_stream(stream: &Arc<Mutex<Option<DeviceError>>>) -> ErrorSink {
        ErrorSink {
            scope: None,
            stream: stream.clone(),
            at: next_tick(),
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

    /// What a synchronization returns once the work before it has run: `Err` with the
    /// scope's error (kept), or the stream's (taken), if any.
    pub(crate) fn sync_result(&self) -> Result<(), DeviceError> {
        let error = match &self.scope {
            Some(scope) => scope.error(),
            None => self.stream.lock().take(),
        };
        error.map_or(Ok(()), Err)
    }
}

/// The failures of the work run by one stream, per scope: what the stream's events report (see
/// the [module docs](self)). Kept by the host backend's stream worker, which runs the stream's
/// work in order, so that an event sees exactly the failures of the work before it.
#[derive(Default)]
pub(crate) struct StreamFailures {
    /// The first failure on this stream of each scope's work (a nested scope's failure counts
    /// for the scopes it is nested in too), with when that work was enqueued; a scope that was
    /// dropped is forgotten when the next failure is stored.
    scoped: Vec<(Weak<ScopeInner>, DeviceError, u64)>,
}

impl StreamFailures {
    /// Stores the failure of a piece of work enqueued with `sink`: in its scope (or stream),
    /// and as this stream's failure of that scope and of the scopes it is nested in.
    pub(crate) fn record(&mut self, sink: &ErrorSink, error: DeviceError) {
        if let Some(scope) = &sink.scope {
            self.scoped.retain(|(key, _, _)| key.strong_count() > 0);
            for s in scope.with_parents() {
                if self.of(&s).is_none() {
                    self.scoped
                        .push((Arc::downgrade(&s), error.clone(), sink.at));
                }
            }
        }
        sink.record(error);
    }

    /// The error an event recorded with `sink` completes with: the first failure on this
    /// stream so far of its scope's work; or of the work of a scope it is nested in enqueued
    /// before the nested scope (the one on the way down to the event's) was made, which the
    /// nested part follows. Not the failures of work enqueued in the outer scope after that:
    /// that is the work of other branches of the execution (made beside this one, each in a
    /// scope of its own), on which the nested part does not depend even where it shares their
    /// stream. For untagged work, the stream's error.
    pub(crate) fn seen_by(&self, sink: &ErrorSink) -> Option<DeviceError> {
        match &sink.scope {
            Some(scope) => {
                let mut before = u64::MAX;
                for s in scope.with_parents() {
                    if let Some((e, at)) = self.of(&s) {
                        if *at < before {
                            return Some(e.clone());
                        }
                    }
                    before = s.created;
                }
                None
            }
            None => sink.peek(),
        }
    }

    fn of(&self, scope: &Arc<ScopeInner>) -> Option<(&DeviceError, &u64)> {
        let key = Arc::as_ptr(scope);
        self.scoped
            .iter()
            .find(|(k, _, _)| std::ptr::eq(k.as_ptr(), key))
            .map(|(_, e, at)| (e, at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(what: &str) -> DeviceError {
        DeviceError::usage(what.to_string())
    }

    #[test]
    fn a_dependency_of_a_nested_scope_is_its_parents_too() {
        let producer = ErrorScope::new();
        producer.record(failure("the producer's work failed"));
        let execution = ErrorScope::new();
        let _entered = execution.enter();
        let part = ErrorScope::nested().expect("a scope is entered");
        part.depend_on(&producer);
        assert!(part.error().is_some());
        assert!(
            execution.error().is_some(),
            "the execution's work includes its nested part's"
        );
        // A failure recorded in the nested part is its parent's too, and not the producer's.
        let other = ErrorScope::new();
        let _in_other = other.enter();
        let nested = ErrorScope::nested().expect("a scope is entered");
        nested.record(failure("the nested part failed"));
        assert!(other.error().is_some());
        assert_eq!(
            producer.error().map(|e| e.to_string()),
            Some(failure("the producer's work failed").to_string())
        );
    }

    #[test]
    fn settling_keeps_the_errors_and_frees_the_chain() {
        // A failure at the start of a chain of dependent scopes reaches its end, and survives
        // the settling of the scopes between.
        let first = ErrorScope::new();
        first.record(failure("first"));
        let second = ErrorScope::new();
        second.depend_on(&first);
        let third = ErrorScope::new();
        third.depend_on(&second);
        third.settle();
        let freed = Arc::downgrade(&first.inner);
        drop(first);
        assert!(
            freed.upgrade().is_none(),
            "a settled chain still holds its start"
        );
        assert!(second.error().is_some() && third.error().is_some());

        // A long chain settled as it goes keeps no more than its last links alive.
        let start = ErrorScope::new();
        let start_weak = Arc::downgrade(&start.inner);
        let mut last = start;
        for _ in 0..100_000 {
            let next = ErrorScope::new();
            next.depend_on(&last);
            next.settle();
            last = next;
        }
        assert!(
            start_weak.upgrade().is_none(),
            "the chain grew with every link"
        );
        assert!(last.error().is_none());
    }

    #[test]
    fn an_event_reports_what_its_scope_follows_and_not_its_siblings_failures() {
        let slot = Arc::new(Mutex::new(None));
        let sink_in = |scope: &ErrorScope| {
            let _entered = scope.enter();
            ErrorSink::here(&slot)
        };
        let execution = ErrorScope::new();
        let mut failures = StreamFailures::default();
        // Work enqueued in a scope before a part of it was made: a failure the part follows.
        let outer = ErrorScope::new();
        let earlier_work = sink_in(&outer);
        let part = {
            let _entered = outer.enter();
            ErrorScope::nested().expect("a scope is entered")
        };
        let later_work = sink_in(&outer);
        failures.record(&earlier_work, failure("work before the part was made"));
        assert!(failures.seen_by(&sink_in(&part)).is_some());
        // Work enqueued in the outer scope after the part was made is not the part's to follow.
        let mut failures_after = StreamFailures::default();
        failures_after.record(&later_work, failure("work after the part was made"));
        assert!(failures_after.seen_by(&sink_in(&part)).is_none());

        // Two branches made together; the first one's work fails on the shared stream.
        let (a, b) = {
            let _entered = execution.enter();
            (
                ErrorScope::nested().expect("a scope is entered"),
                ErrorScope::nested().expect("a scope is entered"),
            )
        };
        failures.record(&sink_in(&a), failure("branch a's work"));
        assert!(failures.seen_by(&sink_in(&a)).is_some(), "a's own event");
        assert!(
            failures.seen_by(&sink_in(&b)).is_none(),
            "b does not follow a's work"
        );
        assert!(
            failures.seen_by(&sink_in(&execution)).is_some(),
            "the execution's later work follows its branches"
        );
        // A part made in the execution after the branches follows them.
        let after = {
            let _entered = execution.enter();
            ErrorScope::nested().expect("a scope is entered")
        };
        assert!(failures.seen_by(&sink_in(&after)).is_some());
        // Every failure is still its scopes' error.
        assert!(a.error().is_some() && execution.error().is_some() && b.error().is_none());
    }
}

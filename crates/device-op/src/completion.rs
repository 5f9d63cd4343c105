//! Completion of in-flight work for futures: one reactor thread per process polls the events
//! of pending futures and wakes them.
//!
//! No host callback is added to any stream: a future's work ends with an ordinary event, and
//! completion is observed by polling that event. The first poll of a future spins on its event
//! for a few microseconds (a tiny op completes within them, and handing it to another thread
//! would cost two thread wake-ups); if the work is still running it parks its waker in a slot
//! watched by the reactor, which
//! spins (yielding) while work is pending and sleeps briefly after a millisecond without news,
//! so short ops complete with microsecond latency and long ones do not burn a core.
//!
//! A slot's state is a [`Handoff`], one mutex over the result and the waker: the reactor
//! stores the result and takes the waker under it, and `poll` checks for the result (and
//! looks at the event) and stores the waker under it, so no wake-up is lost, and the stored
//! result is moved out to one poll only. A later poll's waker replaces the parked one, and only
//! the first poll that parks hands the slot to the reactor. An error of the work (a device fault) completes the
//! slot with that error: no future stays pending because its work failed.
//!
//! The handoff is a concurrency core (see `cuflow_runtime::sync`): it knows no event and no
//! reactor, takes its mutex from the `sync` shim, and the loom models in
//! `loom_tests/completion.rs` run it against a completing thread in every interleaving.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use cuflow_runtime::{sync, DeviceError, ErrorScope, Event};
use parking_lot::{Condvar, Mutex};

/// How long the first poll of a future waits on its event before parking its waker.
const FIRST_POLL_SPIN: Duration = Duration::from_micros(20);

/// The handoff of a result from the thread that sees the work complete to the future that
/// waits for it.
pub(crate) struct Handoff<T> {
    state: sync::Mutex<HandoffState<T>>,
}

struct HandoffState<T> {
    result: Option<T>,
    waker: Option<Waker>,
    /// Whether a poll has parked a waker before (the slot is then watched by the reactor).
    watched: bool,
}

/// What [`Handoff::poll`] found.
pub(crate) enum Polled<T> {
    /// The result: stored by [`Handoff::complete`], or found by the poll's probe.
    Ready(T),
    /// No result yet: the waker is parked. `first`: no poll parked one before, so the caller
    /// hands the slot to whoever will complete it.
    Parked { first: bool },
}

impl<T> Handoff<T> {
    pub(crate) fn new() -> Self {
        Handoff {
            state: sync::Mutex::new(HandoffState {
                result: None,
                waker: None,
                watched: false,
            }),
        }
    }

    /// Takes the stored result if there is one; otherwise runs `probe` (given whether this is
    /// the first poll to get that far), which may find the work complete by itself; otherwise
    /// parks `waker`, replacing the one an earlier poll parked. All under the lock that
    /// [`Handoff::complete`] takes.
    pub(crate) fn poll(&self, waker: &Waker, probe: impl FnOnce(bool) -> Option<T>) -> Polled<T> {
        let mut s = self.state.lock();
        if let Some(r) = s.result.take() {
            return Polled::Ready(r);
        }
        if let Some(r) = probe(!s.watched) {
            return Polled::Ready(r);
        }
        s.waker = Some(waker.clone());
        let first = !s.watched;
        s.watched = true;
        Polled::Parked { first }
    }

    /// Marks the slot as watched without parking a waker (for a future dropped in flight);
    /// whether no poll had parked one before, so that the caller hands the slot to whoever
    /// will complete it, as [`Handoff::poll`]'s first park does.
    pub(crate) fn watch(&self) -> bool {
        let mut s = self.state.lock();
        let first = !s.watched;
        s.watched = true;
        first
    }

    /// Stores the result and wakes the parked waker, if any (after releasing the lock).
    ///
    /// A waker is the program's code, and the thread completing is the process's one
    /// completion thread: a panic of the waker is caught and dropped here (its payload's drop
    /// guarded too), so that it cannot end that thread and leave every later future pending.
    /// The result stays stored for the next poll.
    pub(crate) fn complete(&self, result: T) {
        let waker = {
            let mut s = self.state.lock();
            s.result = Some(result);
            s.waker.take()
        };
        if let Some(w) = waker {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| w.wake())) {
                tracing::warn!("a future's waker panicked when its work completed");
                let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            }
        }
    }
}

/// The completion state of one future's work.
pub(crate) struct CompletionSlot {
    event: Event,
    handoff: Handoff<Result<(), DeviceError>>,
    /// The error scope of a future dropped before its work completed, settled once it has.
    settle: Mutex<Option<ErrorScope>>,
}

impl CompletionSlot {
    pub(crate) fn new(event: Event) -> Arc<Self> {
        Arc::new(CompletionSlot {
            event,
            handoff: Handoff::new(),
            settle: Mutex::new(None),
        })
    }

    /// Settles `scope` (see `ErrorScope::settle`) once the work of the slot has completed: at
    /// once when it has, else on the completion thread when it sees it complete. For a future
    /// that ends before its work does (dropped, or refused inside a host function): an
    /// unsettled scope would be freed one recursion per `shared` production nested in it.
    pub(crate) fn settle_when_complete(self: &Arc<Self>, scope: ErrorScope) {
        *self.settle.lock() = Some(scope);
        // Inside a host function the event cannot be asked (it would answer with that
        // refusal, not with its work's state): the completion thread asks it.
        if !cuflow_runtime::in_host_function() && !matches!(self.event.is_complete(), Ok(false)) {
            self.settle_now();
            return;
        }
        if self.handoff.watch() {
            reactor().watch(self.clone());
        }
    }

    /// Settles the scope handed over by [`CompletionSlot::settle_when_complete`], if any.
    fn settle_now(&self) {
        let scope = self.settle.lock().take();
        if let Some(scope) = scope {
            scope.settle();
        }
    }

    pub(crate) fn poll(self: &Arc<Self>, cx: &mut Context<'_>) -> Poll<Result<(), DeviceError>> {
        match self.handoff.poll(cx.waker(), |first| self.probe(first)) {
            Polled::Ready(r) => Poll::Ready(r),
            Polled::Parked { first } => {
                if first {
                    reactor().watch(self.clone());
                }
                Poll::Pending
            }
        }
    }

    /// Looks at the event: for a few microseconds on the first poll, once afterwards.
    fn probe(&self, first: bool) -> Option<Result<(), DeviceError>> {
        let spin_until = first.then(|| Instant::now() + FIRST_POLL_SPIN);
        loop {
            match self.event.is_complete() {
                Ok(true) => return Some(Ok(())),
                Err(e) => return Some(Err(e)),
                Ok(false) => {}
            }
            match spin_until {
                Some(t) if Instant::now() < t => std::hint::spin_loop(),
                _ => return None,
            }
        }
    }

    /// Checks the event; true when the slot is finished.
    fn check(&self) -> bool {
        let r = match self.event.is_complete() {
            Ok(false) => return false,
            Ok(true) => Ok(()),
            Err(e) => Err(e),
        };
        self.settle_now();
        self.handoff.complete(r);
        true
    }
}

struct Reactor {
    pending: Mutex<Vec<Arc<CompletionSlot>>>,
    wake: Condvar,
    /// Whether the reactor's thread was started. A failed start is tried again at the next
    /// watch; meanwhile each watched slot completes at once with the reason.
    started: Mutex<bool>,
}

fn reactor() -> &'static Reactor {
    static REACTOR: OnceLock<&'static Reactor> = OnceLock::new();
    REACTOR.get_or_init(|| Box::leak(Box::new(Reactor::new())))
}

/// Starts the thread that runs `reactor`.
fn spawn_reactor(reactor: &'static Reactor) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("cuflow-completion".into())
        .spawn(move || reactor.run())
        .map(drop)
}

impl Reactor {
    fn new() -> Reactor {
        Reactor {
            pending: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            started: Mutex::new(false),
        }
    }

    fn watch(&'static self, slot: Arc<CompletionSlot>) {
        self.watch_with(slot, spawn_reactor);
    }

    /// Hands `slot` to the reactor's thread, started first with `spawn` if it is not running.
    /// Where the thread cannot be started, the slot completes with an error that says so: a
    /// future never stays pending for want of a thread to complete it.
    fn watch_with(
        &'static self,
        slot: Arc<CompletionSlot>,
        spawn: impl FnOnce(&'static Reactor) -> std::io::Result<()>,
    ) {
        {
            let mut started = self.started.lock();
            if !*started {
                if let Err(e) = spawn(self) {
                    drop(started);
                    tracing::warn!("could not start the completion thread: {e}");
                    slot.handoff.complete(Err(DeviceError::usage(format!(
                        "cannot await the op: the process could not start cuflow's completion \
                         thread ({e}); wait for it with .sync() or .sync_on(), which need no \
                         thread of their own"
                    ))));
                    return;
                }
                *started = true;
            }
        }
        self.pending.lock().push(slot);
        self.wake.notify_one();
    }

    fn run(&self) {
        let mut watched: Vec<Arc<CompletionSlot>> = Vec::new();
        let mut last_progress = Instant::now();
        loop {
            {
                let mut pending = self.pending.lock();
                while pending.is_empty() && watched.is_empty() {
                    self.wake.wait(&mut pending);
                    last_progress = Instant::now();
                }
                watched.append(&mut pending);
            }
            let before = watched.len();
            watched.retain(|slot| !slot.check());
            if watched.len() != before {
                last_progress = Instant::now();
            }
            if watched.is_empty() {
                continue;
            }
            if last_progress.elapsed() < Duration::from_millis(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use cuflow_runtime::{Device, DeviceError};

    use super::{CompletionSlot, Reactor};

    /// Where the completion thread cannot be started, a watched future resolves with an error
    /// naming the cause instead of staying pending; a later watch tries to start it again.
    #[test]
    fn a_failed_thread_start_completes_the_future_with_an_error() -> Result<(), DeviceError> {
        let stream = Device::host().new_stream()?;
        let reactor: &'static Reactor = Box::leak(Box::new(Reactor::new()));
        let slot = CompletionSlot::new(stream.record_event()?);
        reactor.watch_with(slot.clone(), |_| {
            Err(std::io::Error::other("no more threads"))
        });
        let mut cx = Context::from_waker(Waker::noop());
        match slot.handoff.poll(cx.waker(), |_| None) {
            super::Polled::Ready(Err(DeviceError::Usage { what })) => {
                assert!(
                    what.contains("no more threads") && what.contains(".sync()"),
                    "{what}"
                );
            }
            super::Polled::Ready(other) => panic!("unexpected result {other:?}"),
            super::Polled::Parked { .. } => panic!("the future would stay pending"),
        }
        // The next watch starts the thread, which completes the slot.
        let slot = CompletionSlot::new(stream.record_event()?);
        reactor.watch_with(slot.clone(), super::spawn_reactor);
        stream.synchronize()?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Poll::Ready(r) = slot.poll(&mut cx) {
                return r;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the slot never completed"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

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

use cuflow_runtime::{sync, DeviceError, Event};
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
}

impl CompletionSlot {
    pub(crate) fn new(event: Event) -> Arc<Self> {
        Arc::new(CompletionSlot {
            event,
            handoff: Handoff::new(),
        })
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
        self.handoff.complete(r);
        true
    }
}

struct Reactor {
    pending: Mutex<Vec<Arc<CompletionSlot>>>,
    wake: Condvar,
}

fn reactor() -> &'static Reactor {
    static REACTOR: OnceLock<&'static Reactor> = OnceLock::new();
    REACTOR.get_or_init(|| {
        let r: &'static Reactor = Box::leak(Box::new(Reactor {
            pending: Mutex::new(Vec::new()),
            wake: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("cuflow-completion".into())
            .spawn(move || r.run());
        if let Err(e) = spawned {
            tracing::warn!("could not start the completion thread: {e}");
        }
        r
    })
}

impl Reactor {
    fn watch(&self, slot: Arc<CompletionSlot>) {
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

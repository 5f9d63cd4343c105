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
//! A slot's state is one mutex: the reactor stores the result and takes the waker under it,
//! and `poll` checks for the result and stores the waker under it, so no wake-up is lost. An
//! error of the work (a device fault) completes the slot with that error: no future stays
//! pending because its work failed.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use cuflow_runtime::sync::{Condvar, Mutex};
use cuflow_runtime::{DeviceError, Event};

/// How long the first poll of a future waits on its event before parking its waker.
const FIRST_POLL_SPIN: Duration = Duration::from_micros(20);

struct SlotState {
    result: Option<Result<(), DeviceError>>,
    waker: Option<Waker>,
    watched: bool,
}

/// The completion state of one future's work.
pub(crate) struct CompletionSlot {
    event: Event,
    state: Mutex<SlotState>,
}

impl CompletionSlot {
    pub(crate) fn new(event: Event) -> Arc<Self> {
        Arc::new(CompletionSlot {
            event,
            state: Mutex::new(SlotState {
                result: None,
                waker: None,
                watched: false,
            }),
        })
    }

    pub(crate) fn poll(self: &Arc<Self>, cx: &mut Context<'_>) -> Poll<Result<(), DeviceError>> {
        let mut s = self.state.lock();
        if let Some(r) = s.result.take() {
            return Poll::Ready(r);
        }
        let spin_until = (!s.watched).then(|| Instant::now() + FIRST_POLL_SPIN);
        loop {
            match self.event.is_complete() {
                Ok(true) => return Poll::Ready(Ok(())),
                Err(e) => return Poll::Ready(Err(e)),
                Ok(false) => {}
            }
            match spin_until {
                Some(t) if Instant::now() < t => std::hint::spin_loop(),
                _ => break,
            }
        }
        s.waker = Some(cx.waker().clone());
        if !s.watched {
            s.watched = true;
            drop(s);
            reactor().watch(self.clone());
        }
        Poll::Pending
    }

    /// Checks the event; true when the slot is finished.
    fn check(&self) -> bool {
        let r = match self.event.is_complete() {
            Ok(false) => return false,
            Ok(true) => Ok(()),
            Err(e) => Err(e),
        };
        let waker = {
            let mut s = self.state.lock();
            s.result = Some(r);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
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

//! The deadline of NCCL's waits: one thread of the process watches every eager group of NCCL
//! calls until it finishes on the GPU.
//!
//! NCCL's kernels wait for the other ranks without a deadline, so a rank that never makes its
//! part of a collective (it returned early, crashed, or called something else) would stall
//! this rank's stream for ever, and every wait on it with it. A [`Flight`] holds two events of
//! the call's stream, one recorded before the group and one after it. Its clock starts when
//! it is first seen with the first event complete (the work before the group, however long it
//! took, does not count) and stops when the second completes. Once a flight of a communicator
//! has run past the communicator's timeout ([`Core::expire`]):
//!
//! 1. every flight of that communicator gets a [`DeviceError::Timeout`], through the error
//!    sink each took when it was enqueued (the op that enqueued it, or its stream), before
//!    anything can see those calls finish;
//! 2. the communicator is aborted (`ncclCommAbort`, see `Core::abort`): NCCL's kernels in
//!    flight return, so the stream moves on and its waits end with that error.
//!
//! The watchdog's thread looks at the communicators with flights every [`POLL`], and sleeps
//! while there are none. It never destroys a communicator: an [`NcclComm`](super::NcclComm)
//! dropped with calls in flight waits for them in the dropping thread ([`Core::settle`]), up
//! to the same deadline, then destroys (or aborts) it there. A communicator locked by a call
//! being issued on another thread is tried again at the next look. A communicator that a
//! capture recorded is never aborted (see the parent module); its flights are dropped with a
//! warning. If the thread cannot be made, calls are not watched (with a warning).
//!
//! Watching costs two events a group, a lock, and the looks.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::Core;
use crate::backend::cuda::stream::CudaEventHandle;
use crate::error::DeviceError;
use crate::scope::ErrorSink;

/// How often the watched communicators are looked at.
const POLL: Duration = Duration::from_millis(20);

/// One eager group of NCCL calls, watched until it finishes.
pub(super) struct Flight {
    what: &'static str,
    /// Recorded on the call's stream before the group, and after it.
    start: CudaEventHandle,
    done: CudaEventHandle,
    /// Where the call's failure goes (see [`ErrorSink`]).
    sink: ErrorSink,
    /// When `start` was first seen complete.
    started: Option<Instant>,
}

impl Flight {
    pub(super) fn new(
        what: &'static str,
        start: CudaEventHandle,
        done: CudaEventHandle,
        sink: ErrorSink,
    ) -> Flight {
        Flight {
            what,
            start,
            done,
            sink,
            started: None,
        }
    }

    /// Whether the group finished (or its device faulted or was reset, which its own errors
    /// report); notes when it started.
    fn finished(&mut self, now: Instant) -> bool {
        match self.done.is_complete() {
            Ok(false) => {}
            Ok(true) | Err(_) => return true,
        }
        if self.started.is_none() && matches!(self.start.is_complete(), Ok(true)) {
            self.started = Some(now);
        }
        false
    }
}

/// What a look at a communicator's flights found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Look {
    /// None left.
    Idle,
    /// Some running, none past the deadline.
    Busy,
    /// One ran past the deadline.
    Expired,
}

impl Core {
    /// Drops the finished flights and says what is left.
    fn look(&self, now: Instant) -> Look {
        let mut flights = self.flights.lock();
        flights.retain_mut(|f| !f.finished(now));
        if flights.is_empty() {
            Look::Idle
        } else if flights.iter().any(|f| {
            f.started
                .is_some_and(|t| now.duration_since(t) >= self.timeout)
        }) {
            Look::Expired
        } else {
            Look::Busy
        }
    }

    /// Fails every flight, one of which ran past the deadline, and aborts the communicator.
    /// Returns whether that is done: `false` while another thread's call holds the
    /// communicator (the next look tries again).
    fn expire(&self) -> bool {
        if self.captured.load(Ordering::Acquire) {
            tracing::warn!(
                rank = self.rank,
                "an NCCL call ran past the communicator's timeout of {:?}; a graph recorded \
                 calls of this communicator, so it is not aborted and the call keeps waiting",
                self.timeout
            );
            self.flights.lock().clear();
            return true;
        }
        let waited_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let reason = {
            let flights = self.flights.lock();
            // Before the abort lets the calls' work finish: whoever waits for it sees this.
            for f in flights.iter() {
                f.sink.record(DeviceError::Timeout {
                    what: format!(
                        "{} on rank {}: NCCL waited for the other ranks past the \
                         communicator's timeout, and this rank's communicator was aborted \
                         (make a new one)",
                        f.what, self.rank
                    ),
                    waited_ms,
                });
            }
            let first = flights.first().map_or("collective", |f| f.what);
            format!(
                "{first} on rank {}: the other ranks did not complete it within the \
                 communicator's timeout of {:?}",
                self.rank, self.timeout
            )
        };
        self.abort(&reason)
    }

    /// Waits for the flights to finish, up to the deadline (then expires them): for a
    /// communicator being dropped.
    pub(super) fn settle(&self) {
        loop {
            match self.look(Instant::now()) {
                Look::Idle => return,
                // Aborted: its kernels return; nothing of it is used again.
                Look::Expired if self.expire() => return,
                Look::Expired | Look::Busy => std::thread::sleep(POLL / 4),
            }
        }
    }
}

struct Watchdog {
    /// The communicators with flights.
    cores: Mutex<Vec<Arc<Core>>>,
    wake: Condvar,
}

static WATCHDOG: Watchdog = Watchdog {
    cores: Mutex::new(Vec::new()),
    wake: Condvar::new(),
};

/// Watches `flight`, a group of calls of `core` just enqueued, until it finishes (see the
/// module docs).
pub(super) fn watch(core: &Arc<Core>, flight: Flight) {
    if core.captured.load(Ordering::Acquire) || !thread_running() {
        return;
    }
    core.flights.lock().push(flight);
    if !core.watched.swap(true, Ordering::SeqCst) {
        let mut cores = WATCHDOG.cores.lock();
        if !cores.iter().any(|c| Arc::ptr_eq(c, core)) {
            cores.push(core.clone());
        }
        WATCHDOG.wake.notify_one();
    }
}

/// Whether the watching thread runs, made at the first call.
fn thread_running() -> bool {
    static RUNNING: OnceLock<bool> = OnceLock::new();
    *RUNNING.get_or_init(|| {
        match std::thread::Builder::new()
            .name("cuflow-nccl-watchdog".into())
            .spawn(run)
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "no thread to watch NCCL calls: their waits have no deadline in this process"
                );
                false
            }
        }
    })
}

fn run() {
    loop {
        let cores: Vec<Arc<Core>> = {
            let mut cores = WATCHDOG.cores.lock();
            while cores.is_empty() {
                WATCHDOG.wake.wait(&mut cores);
            }
            cores.clone()
        };
        let now = Instant::now();
        for core in &cores {
            match core.look(now) {
                Look::Idle => unwatch(core),
                Look::Busy => {}
                Look::Expired => {
                    core.expire();
                }
            }
        }
        drop(cores);
        std::thread::sleep(POLL);
    }
}

/// Stops watching `core`, seen without flights, unless one came meanwhile (`watch` pushes its
/// flight before it reads the flag that this clears first).
fn unwatch(core: &Arc<Core>) {
    let mut cores = WATCHDOG.cores.lock();
    core.watched.store(false, Ordering::SeqCst);
    if !core.flights.lock().is_empty() {
        core.watched.store(true, Ordering::SeqCst);
        return;
    }
    cores.retain(|c| !Arc::ptr_eq(c, core));
}

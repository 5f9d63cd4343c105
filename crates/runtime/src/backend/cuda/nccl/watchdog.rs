//! The deadline of NCCL's waits: one thread of the process watches every eager group of NCCL
//! calls until it finishes on the GPU.
//!
//! NCCL's kernels wait for the other ranks without a deadline, so a rank that never makes its
//! part of a collective (it returned early, crashed, or called something else) would stall
//! this rank's stream for ever, and every wait on it with it. A communicator's calls run in the
//! order they were issued (NCCL serializes them), so only its oldest unfinished call is
//! running, and an event after a call tells when it and every call before it finished.
//!
//! A call issued while its communicator has none in flight is a [`Flight`] at once: an event
//! recorded after it on its stream, its clock started (so work queued on the stream ahead of
//! it counts towards its deadline, as in other NCCL watchdogs). A call issued while others are
//! in flight puts nothing on its stream: it waits in [`Flights::unwatched`] until those are
//! seen finished, when the watchdog records one event after the calls waiting on each of
//! their streams and starts their clock. An event between two NCCL kernels on a stream slows
//! back-to-back calls: with one after every call, all-reduces of 128 and 512 KiB between two
//! H200s lost 30% and 54% of their bus bandwidth (medians of three runs) and 32 MiB ones up to
//! 6%, while this puts an event on the stream about once per look. Once the oldest flight of a communicator has run past the communicator's timeout
//! ([`Core::expire`]):
//!
//! 1. every call of that communicator in flight gets a [`DeviceError::Timeout`], through the
//!    error sink each took when it was issued (the op that issued it, or its stream), before
//!    anything can see those calls finish;
//! 2. the communicator is aborted (`ncclCommAbort`, see `Core::abort`): NCCL's kernels in
//!    flight return, so the stream moves on and its waits end with that error.
//!
//! The watchdog's thread looks at the communicators with calls in flight every [`POLL`], and
//! sleeps while there are none. It never destroys a communicator: an
//! [`NcclComm`](super::NcclComm) dropped with calls in flight waits for them in the dropping
//! thread ([`Core::settle`]), up to the same deadline, then destroys (or aborts) it there. A
//! communicator locked by a call being issued on another thread is tried again at the next
//! look; so is an event that cannot be recorded yet (its stream is being captured by another
//! thread). A communicator that a capture recorded is never aborted (see the parent module);
//! its calls are dropped with a warning. If the thread cannot be made, calls are not watched
//! (with a warning).

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::Core;
use crate::error::{DeviceError, Result};
use crate::event::Event;
use crate::scope::ErrorSink;
use crate::stream::Stream;

/// How often the watched communicators are looked at.
const POLL: Duration = Duration::from_millis(20);

/// A communicator's calls in flight.
#[derive(Default)]
pub(super) struct Flights {
    /// In issue order.
    watched: Vec<Flight>,
    /// Issued while others were in flight, with nothing recorded after them yet.
    unwatched: Vec<Unwatched>,
    /// The streams of calls caught up, dropped by the next thread issuing a call or dropping
    /// the communicator: the watchdog's thread never drops a stream's last handle, whose drop
    /// calls the driver, and could do so while the process exits.
    parked: Vec<Stream>,
}

/// Calls of a communicator, watched until an event recorded after them completes.
struct Flight {
    what: &'static str,
    done: Event,
    /// Where the calls' failure goes (see [`ErrorSink`]).
    sinks: Vec<ErrorSink>,
    /// When they became their communicator's oldest unfinished calls.
    started: Option<Instant>,
}

impl Flight {
    /// Whether the calls finished (or their device faulted or was reset, which their own
    /// errors report).
    fn finished(&self) -> bool {
        !matches!(self.done.is_complete(), Ok(false))
    }
}

/// A call issued while others were in flight.
struct Unwatched {
    stream: Stream,
    what: &'static str,
    sink: ErrorSink,
}

impl Flights {
    /// Records an event after the unwatched calls of each of their streams, which become
    /// flights, the first of them running from `now` (called when no flight is left). Those
    /// whose event cannot be recorded yet stay.
    fn catch_up(&mut self, now: Instant) {
        let mut waiting = std::mem::take(&mut self.unwatched);
        while let Some(first) = waiting.first() {
            let stream = first.stream.clone();
            let (mine, rest): (Vec<Unwatched>, Vec<Unwatched>) =
                waiting.into_iter().partition(|u| u.stream.same(&stream));
            waiting = rest;
            match stream.record_event() {
                Ok(done) => self.watched.push(Flight {
                    what: mine[0].what,
                    done,
                    sinks: mine.into_iter().map(|u| u.sink).collect(),
                    started: self.watched.is_empty().then_some(now),
                }),
                // Its device faulted or was reset: their own errors report it.
                Err(_) if !stream.is_capturing() => drop(mine),
                // Another thread is capturing the stream: tried again at the next look.
                Err(_) => {
                    self.unwatched.extend(mine);
                    continue;
                }
            }
            self.parked.push(stream);
        }
    }

    /// Adds a call of `what` just issued on `stream` (whose gate the caller holds) at `now`:
    /// a flight running from `now` with an event recorded after it when none is in flight,
    /// else an unwatched call.
    fn issue(
        &mut self,
        stream: &Stream,
        what: &'static str,
        sink: ErrorSink,
        now: Instant,
    ) -> Result<()> {
        if self.watched.is_empty() && self.unwatched.is_empty() {
            // Every call before it was seen finished: it runs once the stream reaches it.
            let done = stream.record_event()?;
            self.watched.push(Flight {
                what,
                done,
                sinks: vec![sink],
                started: Some(now),
            });
        } else {
            self.unwatched.push(Unwatched {
                stream: stream.clone(),
                what,
                sink,
            });
        }
        Ok(())
    }

    /// Drops the finished flights, catches up with the unwatched calls when none is left,
    /// and says what is left at `now` against `timeout`.
    fn look(&mut self, now: Instant, timeout: Duration) -> Look {
        // In issue order: the first unfinished one is the one running.
        let done = self.watched.iter().take_while(|f| f.finished()).count();
        self.watched.drain(..done);
        if self.watched.is_empty() {
            self.catch_up(now);
        }
        let Some(oldest) = self.watched.first_mut() else {
            return if self.unwatched.is_empty() {
                Look::Idle
            } else {
                Look::Busy
            };
        };
        let started = *oldest.started.get_or_insert(now);
        if now.duration_since(started) >= timeout {
            Look::Expired
        } else {
            Look::Busy
        }
    }

    fn sinks(&self) -> impl Iterator<Item = (&'static str, &ErrorSink)> {
        self.watched
            .iter()
            .flat_map(|f| f.sinks.iter().map(move |s| (f.what, s)))
            .chain(self.unwatched.iter().map(|u| (u.what, &u.sink)))
    }
}

/// What a look at a communicator's flights found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
        self.flights.lock().look(now, self.timeout)
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
            *self.flights.lock() = Flights::default();
            return true;
        }
        let waited_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let reason = {
            let flights = self.flights.lock();
            // Before the abort lets the calls' work finish: whoever waits for it sees this.
            for (what, sink) in flights.sinks() {
                sink.record(DeviceError::Timeout {
                    what: format!(
                        "{what} on rank {}: NCCL waited for the other ranks past the \
                         communicator's timeout, and this rank's communicator was aborted \
                         (make a new one)",
                        self.rank
                    ),
                    waited_ms,
                });
            }
            let first = flights
                .sinks()
                .next()
                .map_or("collective", |(what, _)| what);
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
            drop(std::mem::take(&mut self.flights.lock().parked));
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

/// Watches a group of calls of `core` (`what`) just issued on `stream`, whose gate the caller
/// holds, until it finishes (see the module docs); `sink` is where its failure goes.
///
/// # Errors
///
/// The error of recording an event after the calls on `stream`.
pub(super) fn watch(
    core: &Arc<Core>,
    stream: &Stream,
    what: &'static str,
    sink: ErrorSink,
) -> Result<()> {
    if core.captured.load(Ordering::Acquire) || !thread_running() {
        return Ok(());
    }
    let parked = {
        let mut flights = core.flights.lock();
        flights.issue(stream, what, sink, Instant::now())?;
        std::mem::take(&mut flights.parked)
    };
    drop(parked);
    if !core.watched.swap(true, Ordering::SeqCst) {
        let mut cores = WATCHDOG.cores.lock();
        if !cores.iter().any(|c| Arc::ptr_eq(c, core)) {
            cores.push(core.clone());
        }
        WATCHDOG.wake.notify_one();
    }
    Ok(())
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
    let flights = core.flights.lock();
    if !flights.watched.is_empty() || !flights.unwatched.is_empty() {
        core.watched.store(true, Ordering::SeqCst);
        return;
    }
    cores.retain(|c| !Arc::ptr_eq(c, core));
}

#[cfg(test)]
mod tests {
    //! The bookkeeping of the calls in flight, on host streams (it is the same for any
    //! backend's streams and events; the NCCL side runs in the dist crate's GPU tests).

    use std::sync::mpsc;
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;
    use crate::Device;

    fn sink() -> (ErrorSink, Arc<Mutex<Option<DeviceError>>>) {
        let slot = Arc::new(Mutex::new(None));
        (ErrorSink::of_stream(&slot), slot)
    }

    /// A stream held by a host function until the returned sender is dropped.
    fn held_stream(device: &Device) -> (Stream, mpsc::Sender<()>) {
        let stream = device.new_stream().unwrap();
        let (tx, rx) = mpsc::channel::<()>();
        stream
            .enqueue_host_fn(move || {
                let _ = rx.recv();
            })
            .unwrap();
        (stream, tx)
    }

    #[test]
    fn a_call_alone_runs_from_its_issue_and_expires_past_the_timeout() {
        let device = Device::host_numbered(90);
        let (stream, release) = held_stream(&device);
        let mut flights = Flights::default();
        let t0 = Instant::now();
        let (s, slot) = sink();
        flights.issue(&stream, "all_reduce", s, t0).unwrap();
        let timeout = Duration::from_secs(5);
        assert_eq!(
            flights.look(t0 + Duration::from_secs(4), timeout),
            Look::Busy
        );
        assert_eq!(
            flights.look(t0 + Duration::from_secs(5), timeout),
            Look::Expired
        );
        let failures: Vec<_> = flights.sinks().map(|(what, _)| what).collect();
        assert_eq!(failures, ["all_reduce"]);
        assert!(slot.lock().is_none(), "looking records nothing");
        drop(release);
        stream.synchronize().unwrap();
        assert_eq!(
            flights.look(t0 + Duration::from_secs(6), timeout),
            Look::Idle
        );
    }

    #[test]
    fn calls_behind_a_running_one_record_nothing_until_it_finished_then_run_from_then() {
        let device = Device::host_numbered(91);
        let (a, release_a) = held_stream(&device);
        let (b, release_b) = held_stream(&device);
        let timeout = Duration::from_secs(10);
        let mut flights = Flights::default();
        let t0 = Instant::now();
        flights.issue(&a, "first", sink().0, t0).unwrap();
        for what in ["on a", "on b", "on a again"] {
            let stream = if what == "on b" { &b } else { &a };
            flights.issue(stream, what, sink().0, t0).unwrap();
        }
        assert_eq!(flights.watched.len(), 1);
        assert_eq!(flights.unwatched.len(), 3);
        // The first call runs past what the calls behind it may take: they are not counted.
        assert_eq!(
            flights.look(t0 + Duration::from_secs(9), timeout),
            Look::Busy
        );
        let every: Vec<_> = flights.sinks().map(|(what, _)| what).collect();
        assert_eq!(every, ["first", "on a", "on b", "on a again"]);

        // Stream a's work finishes: the first call is done, and one event is recorded after
        // the waiting calls of each stream.
        drop(release_a);
        a.synchronize().unwrap();
        let t1 = t0 + Duration::from_secs(9);
        assert_eq!(flights.look(t1, timeout), Look::Busy);
        assert!(flights.unwatched.is_empty());
        assert_eq!(flights.watched.len(), 2, "one flight per stream");
        assert_eq!(flights.watched[0].sinks.len(), 2, "stream a's two calls");
        assert_eq!(flights.watched[0].started, Some(t1));
        assert_eq!(
            flights.watched[1].started, None,
            "not running before the one ahead"
        );
        assert_eq!(flights.parked.len(), 2);

        // Stream a's flight is done once its event is; stream b's is held and runs from the
        // next look.
        a.synchronize().unwrap();
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(flights.look(t2, timeout), Look::Busy);
        assert_eq!(flights.watched.len(), 1);
        assert_eq!(flights.watched[0].started, Some(t2));
        assert_eq!(flights.look(t2 + timeout, timeout), Look::Expired);
        drop(release_b);
        b.synchronize().unwrap();
        assert_eq!(flights.look(t2 + timeout, timeout), Look::Idle);
    }
}

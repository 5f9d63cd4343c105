//! The completion [`Handoff`] under loom: a completing thread (the reactor) stores a result
//! while the future's thread polls and parks its waker.
//!
//! A waker here signals a [`Notify`] that the polling thread blocks on after a poll parked:
//! a lost wake-up leaves that thread blocked forever, which loom reports as a deadlock.

use std::sync::Arc as WakerArc;
use std::task::{Wake, Waker};

use cuflow_runtime::sync::{Arc, AtomicBool, AtomicUsize, Ordering};
use loom::model;
use loom::sync::Notify;
use loom::thread;

use crate::completion::{Handoff, Polled};

/// A waker that counts its wake-ups and signals a [`Notify`].
struct TestWaker {
    wakes: AtomicUsize,
    notify: Notify,
}

impl Wake for TestWaker {
    fn wake(self: WakerArc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &WakerArc<Self>) {
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.notify.notify();
    }
}

fn test_waker() -> (WakerArc<TestWaker>, Waker) {
    let inner = WakerArc::new(TestWaker {
        wakes: AtomicUsize::new(0),
        notify: Notify::new(),
    });
    (inner.clone(), Waker::from(inner))
}

/// Polls like `DeviceFuture`: until the first `Ready`, blocking until woken after each park.
/// Checks that only the first park asks to be watched; returns the result.
fn poll_until_ready(
    handoff: &Handoff<u32>,
    probe: impl Fn() -> Option<u32>,
    waker: &(WakerArc<TestWaker>, Waker),
) -> u32 {
    let mut parked = 0;
    loop {
        match handoff.poll(&waker.1, |_| probe()) {
            Polled::Ready(v) => return v,
            Polled::Parked { first } => {
                assert_eq!(
                    first,
                    parked == 0,
                    "only the first park hands the slot over"
                );
                parked += 1;
                waker.0.notify.wait();
            }
        }
    }
}

/// The result stored by the completing thread reaches the poll exactly once, and a poll that
/// parked is woken.
#[test]
fn a_result_completed_while_a_poll_parks_is_delivered_once() {
    model(|| {
        let handoff = Arc::new(Handoff::new());
        let reactor = {
            let handoff = handoff.clone();
            thread::spawn(move || handoff.complete(7))
        };
        let waker = test_waker();
        assert_eq!(poll_until_ready(&handoff, || None, &waker), 7);
        reactor.join().unwrap();
        assert!(waker.0.wakes.load(Ordering::Relaxed) <= 1);
        // The result was moved out: a later poll finds none.
        assert!(matches!(
            handoff.poll(&waker.1, |_| None),
            Polled::Parked { .. }
        ));
    });
}

/// A poll with a new waker (the future moved to another task) replaces the parked one: the
/// completing thread wakes the newest waker, or the poll sees the result.
#[test]
fn a_repoll_with_another_waker_is_the_one_woken() {
    model(|| {
        let handoff = Arc::new(Handoff::new());
        let reactor = {
            let handoff = handoff.clone();
            thread::spawn(move || handoff.complete(7))
        };
        let (first, second) = (test_waker(), test_waker());
        let value = match handoff.poll(&first.1, |_| None) {
            Polled::Ready(v) => v,
            Polled::Parked { .. } => poll_until_ready_after_first(&handoff, &second),
        };
        assert_eq!(value, 7);
        reactor.join().unwrap();
    });
}

/// Polls once more with `waker` after a first park with another waker, then as
/// [`poll_until_ready`] but waiting on `waker` only.
fn poll_until_ready_after_first(
    handoff: &Handoff<u32>,
    waker: &(WakerArc<TestWaker>, Waker),
) -> u32 {
    loop {
        match handoff.poll(&waker.1, |_| None) {
            Polled::Ready(v) => return v,
            Polled::Parked { first } => {
                assert!(!first, "the slot was handed over at the first park");
                waker.0.notify.wait();
            }
        }
    }
}

/// The poll's own look at the event (its probe) and the completing thread race to deliver
/// the result: the future gets it once, whichever wins, and never hangs.
#[test]
fn a_probe_that_sees_the_event_races_the_completion() {
    model(|| {
        let handoff = Arc::new(Handoff::new());
        let event = Arc::new(AtomicBool::new(false));
        let reactor = {
            let (handoff, event) = (handoff.clone(), event.clone());
            thread::spawn(move || {
                event.store(true, Ordering::Release);
                handoff.complete(7);
            })
        };
        let waker = test_waker();
        let probe = || event.load(Ordering::Acquire).then_some(7);
        assert_eq!(poll_until_ready(&handoff, probe, &waker), 7);
        reactor.join().unwrap();
    });
}

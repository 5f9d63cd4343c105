//! The run-once state machine of `shared` ([`RunOnce`], [`WaitGraph`]) under loom: consumers
//! on several threads race to produce one value.
//!
//! A consumer that blocks for ever (a lost notification, a cycle of waits left undetected)
//! leaves the model deadlocked, which loom reports.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use cuflow_runtime::sync::{Arc, AtomicBool, AtomicUsize, Ordering};
use cuflow_runtime::DeviceError;
use loom::model;
use loom::thread;

use crate::op::shared::{Producing, RunOnce, Turn, WaitGraph};

/// What one consumer got.
#[derive(Debug)]
enum Got {
    /// It produced the value.
    Produced(u32),
    /// It took the value another consumer produced.
    Took(u32),
    /// It produced, and its producer panicked.
    Panicked,
    /// The error of its turn.
    Failed(DeviceError),
}

/// A consumer whose producer, if it wins, counts itself in `runs` and produces `produce()`
/// (an error, or a panic when `None`).
fn consume(
    once: &RunOnce<u32>,
    graph: &WaitGraph,
    runs: &AtomicUsize,
    produce: impl FnOnce() -> Option<Result<u32, DeviceError>>,
) -> Got {
    match once.turn(graph) {
        Ok(Turn::Produce(producing)) => {
            runs.fetch_add(1, Ordering::Relaxed);
            match produce() {
                Some(Ok(v)) => {
                    producing.finish(Ok(v));
                    Got::Produced(v)
                }
                Some(Err(e)) => {
                    producing.finish(Err(e.clone()));
                    Got::Failed(e)
                }
                None => {
                    // Unwinds through the producer's guard; `resume_unwind` skips the panic
                    // hook, so nothing is printed.
                    let unwound = catch_unwind(AssertUnwindSafe(move || {
                        let _producing = producing;
                        resume_unwind(Box::new("the producer panicked"));
                    }));
                    assert!(unwound.is_err());
                    Got::Panicked
                }
            }
        }
        Ok(Turn::Ready(v)) => Got::Took(v),
        Err(e) => Got::Failed(e),
    }
}

/// Two shared ops, the wait graph of their consumers, and flags their producers raise.
struct World {
    ops: [RunOnce<u32>; 2],
    graph: WaitGraph,
    runs: AtomicUsize,
    running: [AtomicBool; 2],
}

fn world() -> Arc<World> {
    Arc::new(World {
        ops: [RunOnce::new(), RunOnce::new()],
        graph: WaitGraph::default(),
        runs: AtomicUsize::new(0),
        running: [AtomicBool::new(false), AtomicBool::new(false)],
    })
}

impl World {
    /// A consumer of op 0 (see [`consume`]).
    fn consume(&self, produce: impl FnOnce() -> Option<Result<u32, DeviceError>>) -> Got {
        consume(&self.ops[0], &self.graph, &self.runs, produce)
    }

    /// Wins the race for op `own` (no other thread consumes it before it runs), and raises
    /// its flag once it runs.
    fn start_producing(&self, own: usize) -> Producing<'_, u32> {
        let Ok(Turn::Produce(producing)) = self.ops[own].turn(&self.graph) else {
            panic!("no other thread consumes op {own} before it runs");
        };
        self.running[own].store(true, Ordering::Release);
        producing
    }

    /// Waits until op `other` runs (on another thread).
    fn wait_running(&self, other: usize) {
        while !self.running[other].load(Ordering::Acquire) {
            thread::yield_now();
        }
    }

    /// Consumes op `other`, produced by another thread.
    fn take(&self, other: usize) -> Result<u32, DeviceError> {
        match self.ops[other].turn(&self.graph) {
            Ok(Turn::Ready(v)) => Ok(v),
            Ok(Turn::Produce(_)) => panic!("op {other} is produced by another thread"),
            Err(e) => Err(e),
        }
    }

    /// Produces op `own`, consuming op `other` (produced by another thread) inside; returns
    /// what it produced.
    fn produce_consuming(&self, own: usize, other: usize) -> Result<u32, DeviceError> {
        let producing = self.start_producing(own);
        self.wait_running(other);
        let result = self.take(other).map(|v| v + 1);
        producing.finish(result.clone());
        result
    }
}

/// Two consumers race: the producer runs once, and both get its value.
#[test]
fn two_consumers_run_the_producer_once_and_both_get_the_value() {
    model(|| {
        let w = world();
        let other = {
            let w = w.clone();
            thread::spawn(move || w.consume(|| Some(Ok(42))))
        };
        let mine = w.consume(|| Some(Ok(42)));
        let theirs = other.join().unwrap();
        assert_eq!(w.runs.load(Ordering::Relaxed), 1);
        match (&mine, &theirs) {
            (Got::Produced(42), Got::Took(42)) | (Got::Took(42), Got::Produced(42)) => {}
            _ => panic!("consumers got {mine:?} and {theirs:?}"),
        }
        assert!(w.ops[0].is_finished());
    });
}

/// The producer panics: the op is poisoned, and every other consumer, then and later, gets
/// [`DeviceError::Poisoned`].
#[test]
fn a_panicking_producer_poisons_every_consumer() {
    model(|| {
        let w = world();
        let other = {
            let w = w.clone();
            thread::spawn(move || w.consume(|| None))
        };
        let mine = w.consume(|| None);
        let theirs = other.join().unwrap();
        assert_eq!(w.runs.load(Ordering::Relaxed), 1);
        match (&mine, &theirs) {
            (Got::Panicked, Got::Failed(DeviceError::Poisoned { .. }))
            | (Got::Failed(DeviceError::Poisoned { .. }), Got::Panicked) => {}
            _ => panic!("consumers got {mine:?} and {theirs:?}"),
        }
        let late = w.consume(|| Some(Ok(1)));
        assert!(
            matches!(late, Got::Failed(DeviceError::Poisoned { .. })),
            "{late:?}"
        );
    });
}

/// The producer fails: every other consumer gets its error.
#[test]
fn a_failing_producer_hands_its_error_to_every_consumer() {
    model(|| {
        let w = world();
        let failure = || Some(Err(DeviceError::usage("the producer failed")));
        let other = {
            let w = w.clone();
            thread::spawn(move || w.consume(failure))
        };
        let mine = w.consume(failure);
        let theirs = other.join().unwrap();
        assert_eq!(w.runs.load(Ordering::Relaxed), 1);
        for got in [&mine, &theirs] {
            assert!(
                matches!(got, Got::Failed(DeviceError::Usage { .. })),
                "{got:?}"
            );
        }
    });
}

/// Two threads each produce one op and consume the other's (a cycle): instead of both
/// blocking for ever, one is refused with [`DeviceError::Reentrant`], its op fails, and so
/// does the other's.
#[test]
fn two_ops_consuming_each_other_from_two_threads_fail_instead_of_blocking() {
    model(|| {
        let w = world();
        let other = {
            let w = w.clone();
            thread::spawn(move || w.produce_consuming(1, 0))
        };
        let mine = w.produce_consuming(0, 1);
        let theirs = other.join().unwrap();
        for got in [&mine, &theirs] {
            assert!(matches!(got, Err(DeviceError::Reentrant { .. })), "{got:?}");
        }
    });
}

/// One thread produces op 0, then consumes op 1; the other produces op 1 and consumes op 0
/// inside. No cycle: the second thread waits for op 0 at most until it is finished, and the
/// first thread then waits for op 1. Both get their values, whenever the first thread
/// finishes op 0 relative to the other's look at it.
#[test]
fn a_wait_for_an_op_that_finished_is_not_taken_for_a_cycle() {
    model(|| {
        let w = world();
        let other = {
            let w = w.clone();
            thread::spawn(move || w.produce_consuming(1, 0))
        };
        let producing = w.start_producing(0);
        w.wait_running(1);
        producing.finish(Ok(1));
        let mine = w.take(1);
        let theirs = other.join().unwrap();
        assert!(matches!(mine, Ok(2)), "{mine:?}");
        assert!(matches!(theirs, Ok(2)), "{theirs:?}");
    });
}

//! `shared`: runs at most once whatever the number of clones and threads; consumers on other
//! streams wait on the producer's event; failures and panics reach every consumer.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use cuflow_device_op::{
    from_fn, value, with_context, zip, BoxedOp, DeviceError, DeviceFuture, DeviceOp, DeviceOpExt,
    Shared,
};
use cuflow_runtime::BackendKind;
use cuflow_scheduler::{SingleStream, StreamPoolRoundRobin};
use cuflow_testing::{
    device::{device, stream},
    ops::*,
};
use parking_lot::Mutex;

/// Fails unless `r` is the error of a panic, saying `what` got something else.
#[track_caller]
fn assert_panicked<T: std::fmt::Debug>(r: &Result<T, DeviceError>, what: std::fmt::Arguments<'_>) {
    assert!(
        matches!(r, Err(DeviceError::Panicked { .. })),
        "{what} got {r:?}"
    );
}

#[test]
fn shared_runs_once_across_eight_clones_consumed_from_four_threads() -> Result<(), DeviceError> {
    let device = device();
    let runs = Arc::new(AtomicUsize::new(0));
    let produced = buffer(0.0);
    let shared = counted(&runs, spin_then_write(&produced, 7.0, SPIN)).shared();
    let clones: Vec<_> = (0..8).map(|_| shared.clone()).collect();
    drop(shared);
    let start = Barrier::new(4);
    let results: Vec<(Arc<Buf>, Arc<Buf>, Buf)> = std::thread::scope(|scope| {
        let handles: Vec<_> = clones
            .chunks(2)
            .map(|pair| {
                let (first, second) = (pair[0].clone(), pair[1].clone());
                let (device, start) = (device.clone(), &start);
                scope.spawn(move || -> Result<_, DeviceError> {
                    let own = device.new_stream()?;
                    let copied = buffer(0.0);
                    start.wait();
                    let a = first.sync()?;
                    // The second clone is consumed on this thread's own stream, and copied
                    // there: the copy must be ordered after the producer's write.
                    let (b, copy_out) = second
                        .then({
                            let copied = copied.clone();
                            move |b| copy(&copied, &b).map(move |c| (b, c))
                        })
                        .sync_on(&own)?;
                    Ok((a, b, copy_out))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("consumer thread"))
            .collect::<Result<Vec<_>, _>>()
    })?;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the shared op ran more than once"
    );
    let first = &results[0].0;
    for (a, b, copied) in &results {
        assert!(
            Arc::ptr_eq(a, first) && Arc::ptr_eq(b, first),
            "clones see the same Arc"
        );
        assert_all(copied, 7.0, "a consumer on another stream saw the write");
    }
    assert!(Arc::ptr_eq(&**first, &produced));
    assert_all(first, 7.0, "the shared output");
    Ok(())
}

#[test]
fn a_consumer_in_a_later_execution_waits_on_the_producers_event() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let (produced, copied) = (buffer(0.0), buffer(0.0));
    let shared = spin_then_write(&produced, 3.0, SPIN).shared();
    // The producer is enqueued and not waited for.
    let in_flight = shared.clone().schedule(&policy)?;
    let other = device.new_stream()?;
    let (out, stats) = shared
        .clone()
        .then({
            let copied = copied.clone();
            move |_| copy(&copied, &produced)
        })
        .sync_on_with_stats(&other)?;
    assert_all(
        &out,
        3.0,
        "the consumer's copy must wait for the producer's write",
    );
    // The consumer's stream waits on the producer's event; nothing else is needed.
    assert_events(&stats, 0, 1);
    let from_future = futures::executor::block_on(in_flight)?;
    assert!(shared.is_finished());
    assert!(Arc::ptr_eq(&from_future, &shared.sync()?));
    Ok(())
}

#[test]
fn consumers_in_one_dag_on_other_streams_wait_on_the_producer() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 8)?;
    let (produced, d1, d2) = (buffer(0.0), buffer(0.0), buffer(0.0));
    let shared = spin_then_write(&produced, 4.0, SPIN).shared();
    let consume = |dst: &Buf| {
        let dst = dst.clone();
        with_stream(shared.clone().then(move |b| copy(&dst, &b)))
    };
    let (((c1, on_1), (c2, on_2)), stats) =
        zip!(consume(&d1), consume(&d2)).sync_with_policy(&policy)?;
    assert_ne!(on_1, on_2);
    assert_all(&c1, 4.0, "the producing branch");
    assert_all(
        &c2,
        4.0,
        "the consuming branch must wait on the producer's event",
    );
    // The producer's event, and one join per branch; the second branch waits on the producer.
    assert_events(&stats, 3, 3);
    Ok(())
}

#[test]
fn a_shared_host_value_adds_no_events() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let shared = value(vec![1, 2, 3])
        .map(|v| v.into_iter().sum::<i32>())
        .shared();
    let ((a, b, c), stats) =
        zip!(shared.clone(), shared.clone(), shared).sync_with_policy(&policy)?;
    assert_eq!((*a, *b, *c), (6, 6, 6));
    assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&b, &c));
    assert_events(&stats, 0, 0);
    assert!(stats.streams.is_empty(), "{stats:?}");
    Ok(())
}

#[test]
fn a_shared_host_value_produced_after_device_work_stays_a_host_value() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let buf = buffer(0.0);
    // Produced by a consumer whose context did device work before: the value itself has none,
    // so its consumers wait on nothing.
    let shared = value(vec![1, 2, 3]).map(|v| v.len()).shared();
    let producer = shared.clone();
    let (n, _) = fill(&buf, 1.0)
        .then(move |_| producer)
        .sync_with_policy(&policy)?;
    assert_eq!(*n, 3);
    let ((a, b), stats) = zip!(shared.clone(), shared).sync_with_policy(&policy)?;
    assert_eq!((*a, *b), (3, 3));
    assert_events(&stats, 0, 0);
    assert!(stats.streams.is_empty(), "{stats:?}");

    // The same inside a capture: the value is not written by the graph, so it is read outside.
    let s = device.new_stream()?;
    let shared = value(7).shared();
    let producer = shared.clone();
    s.begin_capture()?;
    let inside = cuflow_device_op::enqueue_on(
        fill(&buf, 2.0).then(move |_| producer),
        &s,
        Arc::new(SingleStream::on(&s)),
    );
    let graph = s.end_capture()?;
    assert_eq!(*inside?.0, 7);
    assert_eq!(graph.node_count()?, 1, "the fill alone is recorded");
    assert_eq!(
        *shared.sync_on(&s)?,
        7,
        "the host value outside the capture"
    );
    Ok(())
}

#[test]
fn a_failing_shared_op_gives_its_error_to_every_consumer() {
    let runs = Arc::new(AtomicUsize::new(0));
    let failing = counted(&runs, bad_launch(&buffer(0.0))).shared();
    let errors: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let op = failing.clone();
                scope.spawn(move || op.sync())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("consumer thread"))
            .collect()
    });
    for e in errors.iter().chain([&failing.clone().sync()]) {
        assert!(
            matches!(e, Err(DeviceError::InvalidLaunch { .. })),
            "every consumer gets the producer's error, got {e:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(failing.is_finished());
    // Awaiting it gives the error too.
    assert!(matches!(
        futures::executor::block_on(failing.into_future()),
        Err(DeviceError::InvalidLaunch { .. })
    ));
}

/// A shared op whose work fails after it was enqueued (here a host function's panic on its
/// stream) fails every consumer in other executions, however they run it (`sync`, `.await`,
/// or through another shared op that consumes it), on every backend: not only where events
/// carry failures. On CUDA they resolved `Ok`.
#[test]
fn a_shared_op_whose_work_fails_later_fails_its_consumers_in_other_executions(
) -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let failing = fill(&buffer(0.0), 1.0)
        .then(|b| panic_on_stream().map(move |()| b))
        .shared();
    let downstream = failing.clone().then(|b| add_scalar(&b, 1.0)).shared();
    let producing = failing.clone().schedule(&policy)?;
    let consumers = [
        ("sync", failing.clone().sync_with_policy(&policy).map(drop)),
        (
            "await",
            futures::executor::block_on(failing.clone().schedule(&policy)?).map(drop),
        ),
        (
            "a second shared op",
            downstream.clone().sync_with_policy(&policy).map(drop),
        ),
        (
            "a consumer of the second shared op",
            downstream
                .then(|b| add_scalar(&b, 1.0))
                .sync_with_policy(&policy)
                .map(drop),
        ),
    ];
    for (how, consumed) in consumers {
        assert_panicked(
            &consumed,
            format_args!("a consumer ({how}) of a shared op whose work failed"),
        );
    }
    let produced = futures::executor::block_on(producing).map(drop);
    assert_panicked(&produced, format_args!("the producing execution"));
    Ok(())
}

/// Consumers that succeed leave nothing behind: a chain of shared ops, each consuming the one
/// before in its own execution, runs in executions that each complete `Ok`, and a failure
/// early in such a chain still reaches the end of it.
#[test]
fn a_long_chain_of_shared_ops_reports_a_failure_at_its_start() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let start = buffer(0.0);
    let mut last = fill(&start, 1.0).boxed().shared();
    for _ in 0..200 {
        last = last.clone().then(|b| add_scalar(&b, 1.0)).boxed().shared();
        last.clone().sync_with_policy(&policy)?;
    }
    assert_all(&start, 201.0, "after the chain");

    let mut last = fill(&start, 1.0)
        .then(|b| panic_on_stream().map(move |()| b))
        .boxed()
        .shared();
    let first = last.clone().schedule(&policy)?;
    for _ in 0..50 {
        last = last.clone().then(|b| add_scalar(&b, 1.0)).boxed().shared();
    }
    let end = last.sync_with_policy(&policy).map(drop);
    assert_panicked(
        &end,
        format_args!("the end of a chain whose first op failed"),
    );
    assert!(futures::executor::block_on(first).is_err());
    Ok(())
}

#[test]
fn a_panicking_shared_op_poisons_every_consumer_and_threads_stay_usable() {
    let panicking = spin_then_write(&buffer(0.0), 1.0, SPIN / 10)
        .then(|_| -> BoxedOp<'static, i32> { panic!("the shared producer panics") })
        .shared();
    let start = Barrier::new(4);
    let outcomes: Vec<Vec<Result<Arc<i32>, DeviceError>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (a, b) = (panicking.clone(), panicking.clone());
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    let outcomes = vec![a.sync(), b.sync()];
                    // This thread can run ops normally afterwards.
                    let buf = buffer(0.0);
                    let after = fill(&buf, 2.0).then(|b| add_scalar(&b, 1.0)).sync();
                    assert_all(
                        &after.expect("an op after the panic"),
                        3.0,
                        "after the panic",
                    );
                    outcomes
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("consumer thread"))
            .collect()
    });
    let all: Vec<_> = outcomes.into_iter().flatten().collect();
    let panicked = all
        .iter()
        .filter(|r| matches!(r, Err(DeviceError::Panicked { .. })))
        .count();
    let poisoned = all
        .iter()
        .filter(|r| matches!(r, Err(DeviceError::Poisoned { .. })))
        .count();
    assert_eq!((panicked, poisoned), (1, 7), "{all:?}");
    assert!(matches!(
        panicking.sync(),
        Err(DeviceError::Poisoned { .. })
    ));
    assert_eq!(
        value(5)
            .map(|v| v + 1)
            .sync()
            .expect("this thread still works"),
        6
    );
}

#[test]
fn a_shared_op_consumed_while_it_is_being_produced_is_refused() {
    // The op consumes its own shared handle while it runs: a cycle, reported instead of hanging.
    let slot: Arc<Mutex<Option<cuflow_device_op::Shared<BoxedOp<'static, i32>>>>> =
        Arc::new(Mutex::new(None));
    let inner = slot.clone();
    let cyclic = with_context(move |_| {
        let me = inner.lock().take().expect("the shared handle was stored");
        me.map(|v| *v + 1)
    })
    .boxed()
    .shared();
    *slot.lock() = Some(cyclic.clone());
    assert!(matches!(
        cyclic.clone().sync(),
        Err(DeviceError::Reentrant { .. })
    ));
    assert!(matches!(cyclic.sync(), Err(DeviceError::Reentrant { .. })));
}

#[test]
fn a_consumer_on_the_producers_stream_waits_for_the_producer() -> Result<(), DeviceError> {
    let s = stream();
    let on_s = SingleStream::on(&s);
    for entry in ["sync_on", "schedule"] {
        let produced = buffer(0.0);
        let shared = spin_then_write(&produced, 5.0, SPIN).shared();
        // The producer is enqueued on s and not waited for.
        let in_flight = shared.clone().schedule(&on_s)?;
        let producer_done = s.record_event()?;
        // A consumer placed on the same stream.
        let out = match entry {
            "sync_on" => shared.clone().sync_on(&s)?,
            _ => futures::executor::block_on(shared.clone().schedule(&on_s)?)?,
        };
        // Its completion means the producer's work has completed.
        assert!(
            producer_done.is_complete()?,
            "{entry}: the consumer resolved before the producer's kernels ran"
        );
        assert!(Arc::ptr_eq(&*out, &produced));
        futures::executor::block_on(in_flight)?;
    }
    Ok(())
}

#[test]
fn two_branches_reading_a_shared_op_read_what_it_wrote() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 3)?;
    for trial in 0..20 {
        let (produced, d1, d2) = (buffer(0.0), buffer(-1.0), buffer(-1.0));
        let value = trial as f32 + 1.0;
        let shared = spin_then_write(&produced, value, SPIN / 4).shared();
        let read_into = |dst: &Buf| {
            let dst = dst.clone();
            shared.clone().then(move |b| copy(&dst, &b))
        };
        let ((c1, c2), _) = zip!(read_into(&d1), read_into(&d2)).sync_with_policy(&policy)?;
        assert_all(&c1, value, "the first branch");
        assert_all(&c2, value, "the second branch");
    }
    Ok(())
}

#[test]
fn a_shared_op_produced_inside_a_capture_is_not_read_outside_it() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let produced = buffer(0.0);
    let shared = spin_then_write(&produced, 6.0, SPIN / 10).shared();
    // Produced while s captures: its kernels are recorded, not run.
    s.begin_capture()?;
    let inside = cuflow_device_op::enqueue_on(shared.clone(), &s, Arc::new(SingleStream::on(&s)));
    let graph = s.end_capture()?;
    assert!(inside.is_ok(), "{inside:?}");
    drop(graph); // never launched: nothing will ever write the buffer
    for (what, outcome) in [
        ("on the capture's stream", shared.clone().sync_on(&s)),
        (
            "on another stream",
            shared.clone().sync_on(&device.new_stream()?),
        ),
    ] {
        assert!(
            matches!(outcome, Err(DeviceError::Capture { .. })),
            "a consumer {what} after the capture got {outcome:?}"
        );
    }
    Ok(())
}

#[test]
fn two_shared_ops_consuming_each_other_from_two_threads_fail_instead_of_deadlocking() {
    type Handle = Arc<Mutex<Option<cuflow_device_op::Shared<BoxedOp<'static, i32>>>>>;
    let (slot_a, slot_b): (Handle, Handle) = Default::default();
    let start = Arc::new(Barrier::new(2));
    let make = |other: &Handle, start: &Arc<Barrier>| {
        let (other, start) = (other.clone(), start.clone());
        with_context(move |_| {
            start.wait(); // both producers are running before either consumes the other
            let other = other.lock().clone().expect("the other handle was stored");
            other.map(|v| *v + 1)
        })
        .boxed()
        .shared()
    };
    let a = make(&slot_b, &start);
    let b = make(&slot_a, &start);
    *slot_a.lock() = Some(a.clone());
    *slot_b.lock() = Some(b.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    for op in [a, b] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send(op.sync());
        });
    }
    let outcomes: Vec<_> = (0..2)
        .map(|_| {
            rx.recv_timeout(std::time::Duration::from_secs(30))
                .expect("a thread consuming a cycle of shared ops hung")
        })
        .collect();
    assert!(
        outcomes.iter().all(Result::is_err),
        "a cycle has no value: {outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .any(|r| matches!(r, Err(DeviceError::Reentrant { .. }))),
        "one side sees the cycle: {outcomes:?}"
    );
}

#[test]
fn consumers_of_a_shared_op_wait_for_the_branches_it_dropped_unjoined() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let buf = buffer(0.0);
    let flag = Arc::new(AtomicBool::new(false));
    // The op forks a branch of its own, writes slowly and sets the flag there, and drops the
    // branch unjoined: its own stream gets no work.
    let shared = on_unjoined_branch(spin_then_write(&buf, 4.0, SPIN).then({
        let flag = flag.clone();
        move |b| set_flag(&flag).map(move |()| b)
    }))
    .shared();
    // Produced by an execution nobody waits for; consumed by another one.
    let producing = shared.clone().schedule(&policy)?;
    let (out, _) = shared.clone().sync_with_policy(&policy)?;
    assert!(
        flag.load(Ordering::SeqCst),
        "a consumer saw the shared output before the work of the producer's branch completed"
    );
    assert_all(&out, 4.0, "the consumer's output");
    futures::executor::block_on(producing)?;

    // The failure of such a branch reaches the consumers of the shared op.
    let failing = on_unjoined_branch(fill(&buf, 5.0).then(|_| panic_on_stream())).shared();
    let producing = failing.clone().schedule(&policy)?;
    let consumed = failing.clone().sync_with_policy(&policy).map(drop);
    assert_panicked(
        &consumed,
        format_args!("the consumer of a shared op whose branch failed"),
    );
    let produced = futures::executor::block_on(producing).map(drop);
    assert_panicked(&produced, format_args!("the producer whose branch failed"));
    Ok(())
}

#[test]
fn a_failure_beside_a_shared_producer_does_not_reach_its_consumers_elsewhere(
) -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let produced = buffer(0.0);
    let shared = fill(&produced, 5.0).shared();
    let (failed, after_failure) = std::sync::mpsc::channel::<()>();
    // Branch 0 fails on its stream, then says so on the host. Branch 1 waits to hear it on the
    // thread that enqueues the op (no event joins the branches: the shared op does not depend
    // on branch 0), and only then enqueues the shared op, so that its work completes after
    // branch 0's failure. The wait is not a host function on branch 1's stream: the driver may
    // run the host functions of every stream on one thread, where waiting for another stream's
    // host function would never end.
    let producing = zip!(
        panic_on_stream().then(move |()| from_fn(move |ctx| {
            ctx.stream()?.enqueue_host_fn(move || {
                let _ = failed.send(());
            })
        })),
        from_fn(move |_| {
            after_failure
                .recv_timeout(std::time::Duration::from_secs(60))
                .map_err(|e| {
                    DeviceError::usage(format!("branch 0's failure was never reported: {e}"))
                })
        })
        .then({
            let shared = shared.clone();
            move |()| shared
        })
    )
    .schedule(&policy)?;
    // A consumer in another execution depends on the shared op only.
    let consumed = shared.clone().sync_with_policy(&policy).map(|(out, _)| out);
    match consumed {
        Ok(out) => assert_all(&out, 5.0, "the consumer's output"),
        Err(e) => panic!("a consumer of the shared op got its sibling's failure: {e}"),
    }
    let produced = futures::executor::block_on(producing).map(drop);
    assert_panicked(&produced, format_args!("the execution whose branch failed"));

    // A shared op produced after failed work that it follows (on its stream, or through the
    // fork of a branch) depends on it: that failure does reach its consumers elsewhere, along
    // the producer's event. Only host events carry the failures of the work they follow (a
    // CUDA event reports device faults only: see `cuflow_runtime::ErrorScope`), so on CUDA the
    // failure reaches the execution that enqueued it alone.
    let events_carry_failures = device().kind() == BackendKind::Host;
    // And after a `zip!` whose branch failed on the very stream the shared op is produced on
    // (no event joins a branch on its parent's stream).
    let one_stream = StreamPoolRoundRobin::new(&device(), 1)?;
    for placed in [
        "on the failed work's stream",
        "on a branch forked after it",
        "after a zip whose branch on its stream failed",
    ] {
        let shared = fill(&buffer(0.0), 6.0).shared();
        let producer = shared.clone();
        let producing = match placed {
            "on the failed work's stream" => {
                panic_on_stream().then(move |()| producer).map(drop).boxed()
            }
            "on a branch forked after it" => panic_on_stream()
                .then(move |()| zip!(value(()), producer))
                .map(drop)
                .boxed(),
            _ => zip!(panic_on_stream(), value(()))
                .then(move |_| producer)
                .map(drop)
                .boxed(),
        }
        .schedule(if placed.starts_with("after") {
            &one_stream
        } else {
            &policy
        })?;
        let consumed = shared.sync_with_policy(&policy).map(drop);
        if events_carry_failures {
            assert_panicked(
                &consumed,
                format_args!("a consumer of a shared op produced {placed}"),
            );
        }
        let produced = futures::executor::block_on(producing).map(drop);
        assert_panicked(
            &produced,
            format_args!("the execution whose work failed {placed}"),
        );
    }
    Ok(())
}

/// A branch that another op of the same execution forked, dropped without joining, and whose
/// work failed, is not the shared op's: the producer does not take it up, so a consumer of the
/// shared op in another execution gets the value, and the failure is the execution's own.
#[test]
fn a_failed_branch_dropped_beside_a_shared_producer_does_not_reach_its_consumers_elsewhere(
) -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let produced = buffer(0.0);
    let shared = fill(&produced, 5.0).shared();
    let producing =
        zip!(on_unjoined_branch(panic_on_stream()), shared.clone()).schedule(&policy)?;
    let consumed = shared.clone().sync_with_policy(&policy).map(|(out, _)| out);
    match consumed {
        Ok(out) => assert_all(&out, 5.0, "the consumer's output"),
        Err(e) => panic!("a consumer of the shared op got a dropped sibling branch's failure: {e}"),
    }
    let produced = futures::executor::block_on(producing).map(drop);
    assert_panicked(
        &produced,
        format_args!("the execution whose dropped branch failed"),
    );
    Ok(())
}

/// Schedules an execution that produces `shared`: the shared op alone, or `after_work`, other
/// work and then the shared op.
fn producing<O>(
    shared: Shared<O>,
    after_work: bool,
    policy: &StreamPoolRoundRobin,
) -> Result<DeviceFuture<Arc<O::Output>>, DeviceError>
where
    O: DeviceOp + 'static,
    O::Output: Sync,
{
    if after_work {
        fill(&buffer(0.0), 2.0)
            .then(move |_| shared)
            .schedule(policy)
    } else {
        shared.schedule(policy)
    }
}

/// A shared op that loses track of the context its work went through is still produced when
/// that work is: a consumer in another execution completes only after it, and its failure is
/// the consumer's too, as for a shared op that keeps its context. Produced first thing in its
/// execution, and after other work of it.
#[test]
fn consumers_elsewhere_wait_for_a_shared_op_that_loses_its_context() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let cases = Lost::ALL
        .into_iter()
        .flat_map(|how| [(how, false), (how, true)]);
    for (how, after_work) in cases {
        let case = format!("{how:?}{}", if after_work { " after work" } else { "" });
        let flag = Arc::new(AtomicBool::new(false));
        let buf = buffer(0.0);
        let shared = {
            let flag = flag.clone();
            losing_its_context(
                spin_then_write(&buf, 1.0, SPIN).then(move |b| set_flag(&flag).map(move |()| b)),
                how,
            )
            .shared()
        };
        let produced = producing(shared.clone(), after_work, &policy)?;
        let (out, _) = shared.sync_with_policy(&policy)?;
        assert!(
            flag.load(Ordering::SeqCst),
            "{case}: a consumer elsewhere completed before the shared op's work"
        );
        assert_all(&out, 1.0, &format!("{case}: the consumer's output"));
        futures::executor::block_on(produced)?;

        let failing = losing_its_context(
            fill(&buffer(0.0), 1.0).then(|b| panic_on_stream().map(move |()| b)),
            how,
        )
        .shared();
        let produced = producing(failing.clone(), after_work, &policy)?;
        assert_panicked(
            &failing.sync_with_policy(&policy).map(drop),
            format_args!("{case}: a consumer elsewhere of a shared op whose work failed"),
        );
        assert_panicked(
            &futures::executor::block_on(produced).map(drop),
            format_args!("{case}: the producing execution"),
        );
    }
    Ok(())
}

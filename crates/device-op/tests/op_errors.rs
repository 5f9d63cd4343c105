//! Errors are values: nested execution is refused, panics in closures become
//! `DeviceError::Panicked`, failed launches come back from the op that hit them, and the
//! thread and the device stay usable afterwards.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_device_op::{
    from_fn, value, with_context, zip, BoxedOp, DeviceError, DeviceOpExt, FromFn,
};
use cuflow_scheduler::StreamPoolRoundRobin;
use cuflow_testing::{device::device, ops::*};
use parking_lot::Mutex;

#[test]
fn executing_an_op_inside_another_ops_closure_is_refused() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 2)?;
    let stream = device.new_stream()?;
    let buf = buffer(0.0);
    type Outcomes = Vec<(&'static str, Result<i32, DeviceError>)>;
    let nested: Arc<Mutex<Outcomes>> = Arc::default();
    let seen = nested.clone();
    let out = spin_then_write(&buf, 1.0, SPIN)
        .then(move |b| {
            let mut seen = seen.lock();
            seen.push(("sync", value(2).sync()));
            seen.push(("sync_on", value(2).sync_on(&stream)));
            seen.push((
                "sync_with_policy",
                value(2).sync_with_policy(&policy).map(|(v, _)| v),
            ));
            seen.push((
                "schedule",
                value(2)
                    .schedule(&policy)
                    .and_then(futures::executor::block_on),
            ));
            seen.push((
                ".await",
                futures::executor::block_on(value(2).into_future()),
            ));
            add_scalar(&b, 1.0)
        })
        .sync()?;
    assert_all(&out, 2.0, "the outer op completes");
    let nested = nested.lock();
    assert_eq!(nested.len(), 5);
    for (entry, r) in nested.iter() {
        // The error names the call that was refused.
        assert!(
            matches!(r, Err(DeviceError::Reentrant { what }) if what.ends_with(entry)),
            "{entry} inside an op's closure gave {r:?}"
        );
    }
    // Outside any op, the same calls work.
    assert_eq!(value(2).sync()?, 2);
    Ok(())
}

#[test]
fn a_panic_in_a_closure_is_an_error_and_the_thread_stays_usable() -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let r = value(1)
        .map(|_: i32| -> i32 { panic!("a map closure panics") })
        .sync();
    assert!(matches!(r, Err(DeviceError::Panicked { .. })), "{r:?}");

    // After device work was enqueued.
    let r = spin_then_write(&buf, 1.0, SPIN)
        .then(|_| -> BoxedOp<'static, Buf> { panic!("a continuation panics") })
        .sync();
    assert!(matches!(r, Err(DeviceError::Panicked { .. })), "{r:?}");

    // In one branch of a zip while the other has work in flight.
    let other = buffer(0.0);
    let r = zip!(
        spin_then_write(&other, 1.0, SPIN),
        with_context(|_| -> BoxedOp<'static, ()> { panic!("a branch panics") })
    )
    .sync();
    assert!(matches!(r, Err(DeviceError::Panicked { .. })), "{r:?}");

    // The same thread runs ops normally.
    let out = fill(&buf, 2.0).then(|b| mul_scalar(&b, 3.0)).sync()?;
    assert_all(&out, 6.0, "an op after the panics");
    assert_eq!(value(3).map(|v| v + 1).sync()?, 4);
    Ok(())
}

#[test]
fn panics_reach_schedule_and_await_as_errors() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 2)?;
    let r = value(1)
        .map(|_: i32| -> i32 { panic!("panics under schedule") })
        .schedule(&policy);
    assert!(matches!(r, Err(DeviceError::Panicked { .. })), "{r:?}");
    let r = futures::executor::block_on(
        value(1)
            .map(|_: i32| -> i32 { panic!("panics under await") })
            .into_future(),
    );
    assert!(matches!(r, Err(DeviceError::Panicked { .. })), "{r:?}");
    assert_eq!(
        futures::executor::block_on(value(5).map(|v| v * 2).into_future())?,
        10
    );
    Ok(())
}

#[test]
fn a_failed_launch_comes_back_from_every_entry_point() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let stream = device.new_stream()?;
    let buf = buffer(0.0);
    let invalid =
        |r: &Result<Buf, DeviceError>| matches!(r, Err(DeviceError::InvalidLaunch { .. }));

    let r = bad_launch(&buf).sync();
    assert!(invalid(&r), "sync: {r:?}");
    let r = bad_launch(&buf).sync_on(&stream);
    assert!(invalid(&r), "sync_on: {r:?}");
    let r = bad_launch(&buf).sync_with_policy(&policy).map(|(b, _)| b);
    assert!(invalid(&r), "sync_with_policy: {r:?}");
    let r = bad_launch(&buf).schedule(&policy).map(|_| buf.clone());
    assert!(invalid(&r), "schedule: {r:?}");
    let r = futures::executor::block_on(bad_launch(&buf).into_future());
    assert!(invalid(&r), ".await: {r:?}");

    // From a branch, with another branch's work in flight.
    let r = zip!(spin_then_write(&buf, 1.0, SPIN), bad_launch(&buf))
        .map(|(a, _)| a)
        .sync_with_policy(&policy)
        .map(|(b, _)| b);
    assert!(invalid(&r), "zip branch: {r:?}");

    // The continuation of a failed op does not run.
    let continued = Arc::new(AtomicUsize::new(0));
    let c = continued.clone();
    let r = bad_launch(&buf)
        .then(move |b| {
            c.fetch_add(1, Ordering::SeqCst);
            fill(&b, 9.0)
        })
        .sync();
    assert!(invalid(&r), "then: {r:?}");
    assert_eq!(continued.load(Ordering::SeqCst), 0);

    // The device is healthy afterwards.
    let out = fill(&buf, 4.0)
        .then(|b| add_scalar(&b, 1.0))
        .sync_on(&stream)?;
    assert_all(&out, 5.0, "an op after the failed launches");
    Ok(())
}

#[test]
fn a_failed_execution_waits_for_the_work_it_had_enqueued() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let other = device.new_stream()?;
    let buf = buffer(0.0);
    // Each failing op first enqueues a slow write of 1 on another stream than its root; the
    // write of 2 made after the error must not be overwritten by it.
    type Failing<'a> = Box<dyn Fn() -> Result<(), DeviceError> + 'a>;
    let failures: Vec<(&str, Failing<'_>)> = vec![
        (
            "an error in a branch",
            Box::new(|| {
                zip!(spin_then_write(&buf, 1.0, SPIN), bad_launch(&buf))
                    .sync_with_policy(&policy)
                    .map(drop)
            }),
        ),
        (
            "a panic in a branch",
            Box::new(|| {
                zip!(
                    spin_then_write(&buf, 1.0, SPIN),
                    with_context(|_| -> BoxedOp<'static, ()> { panic!("a branch panics") })
                )
                .sync()
                .map(drop)
            }),
        ),
        (
            "an error under schedule",
            Box::new(|| {
                zip!(spin_then_write(&buf, 1.0, SPIN), bad_launch(&buf))
                    .schedule(&policy)
                    .map(drop)
            }),
        ),
    ];
    for (what, run) in failures {
        let r = run();
        assert!(r.is_err(), "{what}: {r:?}");
        let out = fill(&buf, 2.0).sync_on(&other)?;
        assert_all(&out, 2.0, what);
    }
    Ok(())
}

/// An op whose work fails after it was enqueued: a host function that panics on the stream,
/// behind the op's other work. The failure is asynchronous on every backend: enqueueing
/// succeeds, and the error is known only once the stream reaches it.
fn fails_on_its_stream(buf: &Buf) -> FromFn<impl OpFn<Buf>> {
    let buf = buf.clone();
    from_fn(move |ctx| {
        ctx.stream()?
            .enqueue_host_fn(|| panic!("the op's work fails on the stream"))?;
        Ok(buf)
    })
}

#[test]
fn an_ops_asynchronous_error_reaches_that_op_and_not_the_next_op_on_its_stream(
) -> Result<(), DeviceError> {
    let device = device();
    // One stream: every op below runs on it, in order.
    let policy = StreamPoolRoundRobin::new(&device, 1)?;
    let buf = buffer(0.0);

    let failing = fails_on_its_stream(&buf).schedule(&policy)?;
    let innocent = fill(&buf, 3.0).sync_with_policy(&policy).map(|(b, _)| b);
    assert!(innocent.is_ok(), "an innocent op got {innocent:?}");
    assert_all(&buf, 3.0, "the innocent op's result");
    let r = futures::executor::block_on(failing);
    assert!(matches!(r, Err(DeviceError::Panicked { .. })), "{r:?}");

    // A failing op whose future is dropped: its error is not handed to whoever comes next.
    drop(fails_on_its_stream(&buf).schedule(&policy)?);
    let out = add_scalar(&buf, 1.0).sync_with_policy(&policy)?.0;
    assert_all(&out, 4.0, "an op after a dropped failing op");
    let out = futures::executor::block_on(add_scalar(&buf, 1.0).schedule(&policy)?)?;
    assert_all(&out, 5.0, "a scheduled op after a dropped failing op");
    Ok(())
}

/// Work an op has a thread of its own enqueue is the op's when that thread enters the op's
/// error scope: its failure is the op's error, and the stream is not left holding it for
/// whoever synchronizes next.
#[test]
fn work_enqueued_from_a_helper_thread_in_the_ops_scope_fails_that_op() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 1)?;
    let stream = policy.streams()[0].clone();
    let r = from_fn(|ctx| {
        let s = ctx.stream()?.clone();
        let scope = cuflow_runtime::ErrorScope::current();
        std::thread::scope(|threads| {
            threads
                .spawn(move || {
                    let _entered = scope.as_ref().map(cuflow_runtime::ErrorScope::enter);
                    s.enqueue_host_fn(|| panic!("the helper thread's work fails"))
                })
                .join()
                .expect("the helper thread")
        })
    })
    .sync_with_policy(&policy);
    assert!(
        matches!(&r, Err(DeviceError::Panicked { message, .. }) if message.contains("helper")),
        "{r:?}"
    );
    stream.synchronize()?;
    Ok(())
}

/// A shared op produced beside unrelated work that fails on the same stream, in the same
/// execution: the execution fails, but the shared op's value is its own work's, which did not
/// fail, so every later consumer gets it, on the producer's stream or another. (Its completion
/// event followed the failed work on the stream, and carried that failure to every consumer
/// that waited for it, for ever.) Whether the producing execution is awaited, dropped in flight
/// or dropped unpolled.
#[test]
fn a_shared_op_produced_beside_failing_work_does_not_inherit_its_error() -> Result<(), DeviceError>
{
    let device = device();
    compile_kernels(&device)?;
    for how in ["awaited", "dropped in flight", "dropped unpolled"] {
        let policy = StreamPoolRoundRobin::new(&device, 1)?;
        let (a, b, c) = (buffer(0.0), buffer(0.0), buffer(0.0));
        let shared = spin_then_write(&b, 4.0, SPIN / 10).shared();
        let op = zip!(
            fill(&a, 1.0).then(|a| fails_on_its_stream(&a)),
            shared.clone().then(move |b| copy(&c, &b))
        );
        let mut future = op.schedule(&policy)?;
        match how {
            "awaited" => {
                let r = futures::executor::block_on(future);
                assert!(matches!(r, Err(DeviceError::Panicked { .. })), "{r:?}");
            }
            "dropped in flight" => {
                let waker = futures::task::noop_waker();
                let mut cx = std::task::Context::from_waker(&waker);
                let _ = std::future::Future::poll(std::pin::Pin::new(&mut future), &mut cx);
                drop(future);
            }
            _ => drop(future),
        }
        // Consumers on the producer's stream and on another one (which waits for its event).
        let elsewhere = StreamPoolRoundRobin::new(&device, 1)?;
        for (consumer, policy) in [&policy, &elsewhere, &policy].into_iter().enumerate() {
            let d = buffer(0.0);
            let got = shared
                .clone()
                .then(move |b| copy(&d, &b))
                .sync_with_policy(policy)
                .map(|(d, _)| d);
            match got {
                Ok(d) => assert_all(&d, 4.0, &format!("{how}: consumer {consumer}")),
                Err(e) => panic!("{how}: consumer {consumer} of the shared op got {e}"),
            }
        }
    }
    Ok(())
}

#[test]
fn a_failing_op_that_reads_back_inside_its_closure_is_still_an_error() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let policy = StreamPoolRoundRobin::new(&device, 1)?;
    let buf = buffer(1.0);
    let reads_back = |buf: &Buf| {
        let read = buf.clone();
        fails_on_its_stream(buf).then(move |b| {
            from_fn(move |ctx| {
                // The read waits for the failed work; the op ignores what it says.
                let _ = read.to_host_vec(ctx.stream()?);
                Ok(b)
            })
        })
    };
    let r = reads_back(&buf).sync_on(&stream);
    assert!(
        matches!(r, Err(DeviceError::Panicked { .. })),
        "sync_on: {r:?}"
    );
    let r = reads_back(&buf).sync_with_policy(&policy).map(|(b, _)| b);
    assert!(
        matches!(r, Err(DeviceError::Panicked { .. })),
        "sync_with_policy: {r:?}"
    );
    let r = reads_back(&buf)
        .schedule(&policy)
        .and_then(futures::executor::block_on);
    assert!(
        matches!(r, Err(DeviceError::Panicked { .. })),
        "schedule: {r:?}"
    );
    // The stream is not left holding the error for the next op.
    let out = add_scalar(&buf, 1.0).sync_on(&stream)?;
    assert_all(&out, 2.0, "the next op on the stream");
    Ok(())
}

/// An event recorded during a capture that has ended stands for work that runs only when its
/// graph is replayed: waiting for it from an op is a capture error on every stream, the one it
/// was recorded on included (which took it as already ordered).
#[test]
fn waiting_for_an_event_of_an_ended_capture_is_refused_on_its_own_stream_too(
) -> Result<(), DeviceError> {
    let d = device();
    let (s, other) = (d.new_stream()?, d.new_stream()?);
    s.begin_capture()?;
    let captured = s.record_event();
    let graph = s.end_capture();
    let captured = captured?;
    graph?;
    for stream in [&s, &other] {
        let event = captured.clone();
        let r = from_fn(move |ctx| ctx.wait_for(&event)).sync_on(stream);
        assert!(
            matches!(r, Err(DeviceError::Capture { .. })),
            "on stream {}: {r:?}",
            stream.id()
        );
    }
    Ok(())
}

/// `sync_on` waits for the op's work, which a stream being captured into a graph only records:
/// it refuses such a stream before enqueueing anything, with an error that names it (one
/// sentence, without the source's indentation inside it), and the capture goes on untouched
/// (the work was recorded into it and the wait broke it).
#[test]
fn sync_on_a_stream_being_captured_is_refused_and_leaves_the_capture_intact(
) -> Result<(), DeviceError> {
    let s = device().new_stream()?;
    let buf = buffer(0.0);
    s.begin_capture()?;
    let plain = fill(&buf, 1.0).sync_on(&s).map(drop);
    let with_stats = zip!(fill(&buf, 2.0), value(3))
        .sync_on_with_stats(&s)
        .map(drop);
    let graph = s.end_capture();
    for (how, r) in [("sync_on", plain), ("sync_on_with_stats", with_stats)] {
        match r {
            Err(DeviceError::Capture { op, reason }) => assert!(
                op.contains("sync_on")
                    && reason.contains(&s.id().to_string())
                    && !reason.contains("  "),
                "{how}: {op}: {reason}"
            ),
            other => panic!("{how}: a capture error naming sync_on, got {other:?}"),
        }
    }
    let graph = graph?;
    assert_eq!(
        graph.node_count()?,
        0,
        "nothing was recorded into the capture"
    );
    assert_all(&buf, 0.0, "nothing ran");
    Ok(())
}

/// An event recorded during a capture that is still open stands for work that runs only when
/// the graph is replayed: an op that is not part of that capture, on the capturing thread or
/// another one, cannot wait for it. It is refused with an error naming the wait, before the
/// op's stream joins the capture, and the capture goes on untouched.
#[test]
fn waiting_for_an_event_of_an_open_capture_from_outside_it_is_refused() -> Result<(), DeviceError> {
    let d = device();
    let capturing = d.new_stream()?;
    let buf = buffer(0.0);
    capturing.begin_capture()?;
    let captured = capturing.record_event();
    let waits_then_fills = |event: &cuflow_runtime::Event| {
        let (event, buf) = (event.clone(), buf.clone());
        from_fn(move |ctx| ctx.wait_for(&event)).then(move |()| fill(&buf, 4.0))
    };
    let outcomes = captured.clone().map(|event| {
        let here = waits_then_fills(&event).sync().map(drop);
        let elsewhere = {
            let op = waits_then_fills(&event);
            std::thread::spawn(move || op.sync().map(drop))
                .join()
                .expect("the other thread")
        };
        [
            ("on the capturing thread", here),
            ("on another thread", elsewhere),
        ]
    });
    let graph = capturing.end_capture();
    for (how, r) in outcomes? {
        match r {
            Err(DeviceError::Capture { op, .. }) => {
                assert_eq!(op, "ExecutionContext::wait_for", "{how}")
            }
            other => panic!("{how}: a capture error of the wait, got {other:?}"),
        }
    }
    assert_eq!(graph?.node_count()?, 0, "nothing joined the capture");
    assert_all(&buf, 0.0, "nothing ran");
    Ok(())
}

/// A panic payload whose drop panics in turn.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("the panic's payload panics when dropped");
    }
}

/// A policy that panics placing work (`at` "place") or naming its device (`at` "device"),
/// with a payload that panics when dropped.
#[derive(Debug)]
struct PolicyPanicsWithABadPayload {
    inner: StreamPoolRoundRobin,
    at: &'static str,
}

impl cuflow_scheduler::SchedulingPolicy for PolicyPanicsWithABadPayload {
    fn device(&self) -> &cuflow_runtime::Device {
        if self.at == "device" {
            std::panic::panic_any(PanicsWhenDropped)
        }
        self.inner.device()
    }

    fn place(
        &self,
        _: &cuflow_scheduler::Placement<'_>,
    ) -> Result<cuflow_runtime::Stream, DeviceError> {
        std::panic::panic_any(PanicsWhenDropped)
    }
}

/// A panic whose payload panics again when dropped (in an op's closure, or in a policy) is a
/// `Panicked` error from every entry point: the payload's own panic does not unwind out of
/// the call that caught the first.
#[test]
fn a_panic_whose_payload_panics_when_dropped_is_an_error_from_every_entry_point(
) -> Result<(), DeviceError> {
    use cuflow_scheduler::DevicePolicyExt;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let policy = StreamPoolRoundRobin::new(&device(), 2)?;
    let stream = device().new_stream()?;
    let panicking = |at| {
        Arc::new(PolicyPanicsWithABadPayload {
            inner: policy.clone(),
            at,
        })
    };
    let op = || value(1).map(|_: i32| -> i32 { std::panic::panic_any(PanicsWhenDropped) });
    type EntryPoint<'a> = (&'a str, Box<dyn FnOnce() -> Result<(), DeviceError> + 'a>);
    let entry_points: Vec<EntryPoint<'_>> = vec![
        ("sync", Box::new(|| op().sync().map(drop))),
        ("sync_on", Box::new(|| op().sync_on(&stream).map(drop))),
        (
            "sync_with_policy",
            Box::new(|| op().sync_with_policy(&policy).map(drop)),
        ),
        ("schedule", Box::new(|| op().schedule(&policy).map(drop))),
        (
            ".await",
            Box::new(|| futures::executor::block_on(op().into_future()).map(drop)),
        ),
        (
            "enqueue_on",
            Box::new(|| {
                cuflow_device_op::enqueue_on(op(), &stream, Arc::new(policy.clone())).map(drop)
            }),
        ),
        (
            "a policy placing the root",
            Box::new(|| value(1).sync_with_policy(&panicking("place")).map(drop)),
        ),
        (
            "set_default_policy with a policy naming its device",
            Box::new(|| device().set_default_policy(panicking("device"))),
        ),
    ];
    for (entry, run) in entry_points {
        match catch_unwind(AssertUnwindSafe(run)) {
            Ok(Err(DeviceError::Panicked { .. })) => {}
            Ok(other) => panic!("{entry}: expected a Panicked error, got {other:?}"),
            Err(_) => panic!("{entry}: the payload's panic unwound out of the API"),
        }
    }
    assert_eq!(value(3).map(|v| v + 1).sync()?, 4);
    Ok(())
}

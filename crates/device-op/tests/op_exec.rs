//! The entry points: `sync`, `sync_on`, `sync_with_policy`, `schedule`, `.await` and
//! `enqueue_on`. Outputs reach the program only after their work has completed.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_device_op::{
    default_device, enqueue_on, from_fn, value, with_context, DeviceError, DeviceOp, DeviceOpExt,
    FromFn,
};
use cuflow_runtime::{Device, Stream};
use cuflow_scheduler::{SingleStream, StreamPoolRoundRobin};
use cuflow_testing::{
    device::{device, stream},
    ops::*,
};

/// A slow write followed by a host function that sets `flag`: the flag is set only once the
/// write has finished, so a caller that sees the op's output must also see the flag.
fn slow_then_flag(buf: &Buf, v: f32, flag: &Arc<AtomicBool>) -> impl DeviceOp<Output = Buf> {
    let flag = flag.clone();
    spin_then_write(buf, v, SPIN).then(move |b| set_flag(&flag).map(move |()| b))
}

#[test]
fn every_entry_point_returns_only_after_the_work_completed() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let stream = device.new_stream()?;
    let buf = buffer(0.0);
    let check = |entry: &str, out: Buf, flag: &AtomicBool, v: f32| {
        assert!(
            flag.load(Ordering::SeqCst),
            "{entry} returned before the op's work completed"
        );
        assert_all(&out, v, entry);
    };

    let flag = Arc::new(AtomicBool::new(false));
    let out = slow_then_flag(&buf, 1.0, &flag).sync()?;
    check("sync", out, &flag, 1.0);

    let flag = Arc::new(AtomicBool::new(false));
    let out = slow_then_flag(&buf, 2.0, &flag).sync_on(&stream)?;
    check("sync_on", out, &flag, 2.0);

    let flag = Arc::new(AtomicBool::new(false));
    let (out, _) = slow_then_flag(&buf, 3.0, &flag).sync_with_policy(&policy)?;
    check("sync_with_policy", out, &flag, 3.0);

    let flag = Arc::new(AtomicBool::new(false));
    let future = slow_then_flag(&buf, 4.0, &flag).schedule(&policy)?;
    let out = futures::executor::block_on(future)?;
    check("schedule + block_on", out, &flag, 4.0);

    let flag = Arc::new(AtomicBool::new(false));
    let op = spin_then_write(&buf, 5.0, SPIN).then({
        let flag = flag.clone();
        move |b| set_flag(&flag).map(move |()| b)
    });
    let out = futures::executor::block_on(async move { op.await })?;
    check(".await under futures::executor::block_on", out, &flag, 5.0);

    let flag = Arc::new(AtomicBool::new(false));
    let op = spin_then_write(&buf, 6.0, SPIN).then({
        let flag = flag.clone();
        move |b| set_flag(&flag).map(move |()| b)
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let out = rt.block_on(async move { op.await })?;
    check(".await on a tokio current-thread runtime", out, &flag, 6.0);
    Ok(())
}

#[test]
fn sync_on_runs_after_the_streams_earlier_work_and_stays_on_it() -> Result<(), DeviceError> {
    let stream = stream();
    let buf = buffer(0.0);
    // Earlier work on the stream, enqueued and not waited for.
    enqueue_on(
        spin_then_write(&buf, 5.0, SPIN),
        &stream,
        Arc::new(SingleStream::on(&stream)),
    )?;
    let (out, stats) = add_scalar(&buf, 1.0)
        .then(|b| mul_scalar(&b, 2.0))
        .sync_on_with_stats(&stream)?;
    assert_all(
        &out,
        12.0,
        "sync_on must run after the stream's earlier work",
    );
    assert_eq!(stats.streams, vec![stream.id()], "{stats:?}");
    assert_events(&stats, 0, 0);
    Ok(())
}

#[test]
fn schedule_enqueues_at_once_and_await_at_the_first_poll() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let buf = buffer(0.0);
    let runs = Arc::new(AtomicUsize::new(0));

    let scheduled = counted(&runs, fill(&buf, 3.0)).schedule(&policy)?;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "schedule enqueues the op at once"
    );
    let out = futures::executor::block_on(scheduled)?;
    assert_all(&out, 3.0, "the scheduled fill");

    let lazy = counted(&runs, add_scalar(&buf, 1.0)).into_future();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "into_future does not run the op"
    );
    let out = futures::executor::block_on(lazy)?;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_all(&out, 4.0, "the awaited add");

    // enqueue_on neither waits nor needs the output to be awaited.
    let stream = stream();
    let (out, _) = enqueue_on(
        counted(&runs, mul_scalar(&buf, 2.0)),
        &stream,
        Arc::new(policy.clone()),
    )?;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_all(&out, 8.0, "reading back waits for the enqueued multiply");
    Ok(())
}

#[test]
fn sync_and_await_run_on_the_default_device() -> Result<(), DeviceError> {
    let device = device();
    assert_eq!(default_device()?, device);
    assert_eq!(default_device()?, Device::auto()?);
    let seen = with_context(|ctx| value(ctx.device().clone())).sync()?;
    assert_eq!(seen, device);
    let seen =
        futures::executor::block_on(with_context(|ctx| value(ctx.device().clone())).into_future())?;
    assert_eq!(seen, device);
    Ok(())
}

/// Runs `op(v, flag)` through every entry point (`sync_on` on `stream`, the policy ones on
/// `policy`), a value `v` each, and checks that each returned the op's output only after its
/// work (`what`) had set the flag.
fn assert_every_entry_point_waits_for_the_work<O>(
    what: &str,
    stream: &Stream,
    policy: &StreamPoolRoundRobin,
    op: impl Fn(f32, &Arc<AtomicBool>) -> O,
) -> Result<(), DeviceError>
where
    O: DeviceOp<Output = Buf> + IntoFuture<Output = Result<Buf, DeviceError>>,
{
    type Entry<'a> = Box<dyn Fn(f32, &Arc<AtomicBool>) -> Result<Buf, DeviceError> + 'a>;
    let op = &op;
    let entries: Vec<(&str, Entry<'_>)> = vec![
        ("sync", Box::new(|v, flag| op(v, flag).sync())),
        ("sync_on", Box::new(|v, flag| op(v, flag).sync_on(stream))),
        (
            "sync_with_policy",
            Box::new(|v, flag| op(v, flag).sync_with_policy(policy).map(|(b, _)| b)),
        ),
        (
            "schedule",
            Box::new(|v, flag| {
                op(v, flag)
                    .schedule(policy)
                    .and_then(futures::executor::block_on)
            }),
        ),
        (
            ".await",
            Box::new(|v, flag| futures::executor::block_on(op(v, flag).into_future())),
        ),
    ];
    for (i, (entry, run)) in entries.iter().enumerate() {
        let flag = Arc::new(AtomicBool::new(false));
        let v = i as f32 + 1.0;
        let out = run(v, &flag)?;
        assert!(
            flag.load(Ordering::SeqCst),
            "{entry} returned before the work of {what} completed"
        );
        assert_all(&out, v, entry);
    }
    Ok(())
}

/// Runs the op `failing()` makes through every entry point (`sync_on` on `stream`, the policy
/// ones on `policy`) and checks that each fails with the panic of its work (`what`).
fn assert_every_entry_point_fails_with_the_panic<T: std::fmt::Debug + Send + 'static, O>(
    what: &str,
    stream: &Stream,
    policy: &StreamPoolRoundRobin,
    failing: impl Fn() -> O,
) where
    O: DeviceOp<Output = T> + IntoFuture<Output = Result<T, DeviceError>>,
{
    let outcomes = [
        ("sync", failing().sync().map(drop)),
        ("sync_on", failing().sync_on(stream).map(drop)),
        (
            "sync_with_policy",
            failing().sync_with_policy(policy).map(drop),
        ),
        (
            "schedule",
            failing()
                .schedule(policy)
                .and_then(futures::executor::block_on)
                .map(drop),
        ),
        (
            ".await",
            futures::executor::block_on(failing().into_future()).map(drop),
        ),
    ];
    for (entry, outcome) in outcomes {
        assert!(
            matches!(outcome, Err(DeviceError::Panicked { .. })),
            "{entry}: {what} is the op's: {outcome:?}"
        );
    }
}

#[test]
fn a_branch_an_op_forks_and_drops_unjoined_completes_before_the_op() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let stream = device.new_stream()?;
    let buf = buffer(0.0);
    // The branch's work: a slow write, then a flag; the op's own stream gets nothing.
    assert_every_entry_point_waits_for_the_work(
        "the op's unjoined branch",
        &stream,
        &policy,
        |v, flag| on_unjoined_branch(slow_then_flag(&buf, v, flag)),
    )?;
    // The branch's failure after it was enqueued is the op's error.
    let failing = || on_unjoined_branch(fill(&buf, 9.0).then(|_| panic_on_stream()));
    assert_every_entry_point_fails_with_the_panic(
        "the unjoined branch's failure",
        &stream,
        &policy,
        failing,
    );
    Ok(())
}

/// Whatever an op does with its context, every entry point returns after all of the work it
/// enqueued, and a failure of that work is the op's error.
#[test]
fn an_op_that_replaces_swaps_or_forgets_its_context_still_completes_after_its_work(
) -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let stream = device.new_stream()?;
    let buf = buffer(0.0);
    for how in Lost::ALL {
        assert_every_entry_point_waits_for_the_work(
            &format!("an op whose context was {how:?}"),
            &stream,
            &policy,
            |v, flag| losing_its_context(slow_then_flag(&buf, v, flag), how),
        )?;
        let failing = losing_its_context(panic_on_stream(), how).sync_with_policy(&policy);
        assert!(
            matches!(failing, Err(DeviceError::Panicked { .. })),
            "an op whose context was {how:?} and whose work failed: {failing:?}"
        );
    }
    Ok(())
}

/// Runs `work` on `other` through `ExecutionContext::on_stream`, which fails after `work`
/// enqueued it, and goes on: the op's own error handling (a fallback, say) swallows the error.
fn on_stream_failing_after<W>(other: &Stream, work: W) -> FromFn<impl OpFn<()>>
where
    W: FnOnce(&Stream) -> Result<(), DeviceError> + Send + 'static,
{
    let other = other.clone();
    from_fn(move |ctx| {
        let tried = ctx.on_stream(&other, |s| {
            work(s)?;
            Err::<(), _>(DeviceError::usage("the work on the other stream fails"))
        });
        assert!(tried.is_err(), "on_stream returns the error of its closure");
        Ok(())
    })
}

/// Work that `ExecutionContext::on_stream` enqueued before its closure failed is the op's work
/// all the same: every entry point returns after it, and its failure is the op's, even when
/// the op goes on after the error.
#[test]
fn work_enqueued_by_a_failed_on_stream_completes_before_the_op() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let (stream, other) = (device.new_stream()?, device.new_stream()?);
    let buf = buffer(0.0);
    assert_every_entry_point_waits_for_the_work(
        "a failed on_stream",
        &stream,
        &policy,
        |v, flag| {
            let (flag, other) = (flag.clone(), other.clone());
            fill(&buf, v).then(move |b| {
                on_stream_failing_after(&other, move |s| {
                    s.enqueue_host_fn(move || {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        flag.store(true, Ordering::SeqCst);
                    })
                })
                .map(move |()| b)
            })
        },
    )?;
    let failing = || {
        on_stream_failing_after(&other, |s| {
            s.enqueue_host_fn(|| panic!("the work on the other stream panics"))
        })
    };
    assert_every_entry_point_fails_with_the_panic(
        "the failed on_stream's work",
        &stream,
        &policy,
        failing,
    );
    Ok(())
}

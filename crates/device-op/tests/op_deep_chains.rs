//! A boxed chain built in a loop is as deep as the loop is long: executing it, awaiting it,
//! sharing it, zipping it, describing it or dropping it unexecuted must work at any depth, on
//! the test harness's threads and on threads with small stacks alike (a chain's depth is
//! limited only by memory, never by the thread's stack).

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};

use cuflow_device_op::{
    enqueue_on, from_fn, value, zip, BoxedOp, DeviceError, DeviceOp, DeviceOpExt, Shared,
};
use cuflow_scheduler::{default_policy, StreamPoolRoundRobin};
use cuflow_testing::{
    device::{device, stream},
    ops::*,
    thread::on_small_stack,
};

/// Far deeper than any thread's stack holds one recursion level per link.
const DEPTH: u64 = 200_000;

/// Every how many levels the chain adds one to its buffer on the device.
const DEVICE_EVERY: u64 = 10_000;

/// `value(0)` followed by `depth` boxed `then` levels, each adding one to the count; every
/// `DEVICE_EVERY`th level also adds one to `buf` on the device, so the chain's device work is
/// ordered along the whole chain.
fn deep_chain(depth: u64, buf: &Buf) -> BoxedOp<'static, u64> {
    let mut op = value(0u64).boxed();
    for i in 1..=depth {
        op = if i % DEVICE_EVERY == 0 {
            let buf = buf.clone();
            op.then(move |n| add_scalar(&buf, 1.0).map(move |_| n + 1))
                .boxed()
        } else {
            op.then(|n| value(n + 1)).boxed()
        };
    }
    op
}

/// The same chain built with `map` levels.
fn deep_map_chain(depth: u64) -> BoxedOp<'static, u64> {
    let mut op = value(0u64).boxed();
    for _ in 0..depth {
        op = op.map(|n| n + 1).boxed();
    }
    op
}

/// Checks the count a chain returned and the device work it did.
fn check(n: u64, buf: &Buf, depth: u64) {
    assert_eq!(n, depth, "every level of the chain ran once");
    assert_all(
        buf,
        (depth / DEVICE_EVERY) as f32,
        "the chain's device work, in order",
    );
}

fn sync_runs(depth: u64) -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let n = deep_chain(depth, &buf).sync()?;
    check(n, &buf, depth);
    Ok(())
}

fn sync_on_runs(depth: u64) -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let s = stream();
    let n = deep_chain(depth, &buf).sync_on(&s)?;
    s.synchronize()?;
    check(n, &buf, depth);
    Ok(())
}

fn await_runs(depth: u64) -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let n = futures::executor::block_on(async { deep_chain(depth, &buf).await })?;
    check(n, &buf, depth);
    Ok(())
}

fn schedule_runs(depth: u64) -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let policy = StreamPoolRoundRobin::new(&device(), 2)?;
    let future = deep_chain(depth, &buf).schedule(&policy)?;
    let n = futures::executor::block_on(future)?;
    check(n, &buf, depth);
    Ok(())
}

fn enqueue_on_runs(depth: u64) -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let s = stream();
    let policy = default_policy(s.device())?;
    let (n, _stats) = enqueue_on(deep_chain(depth, &buf), &s, policy)?;
    s.synchronize()?;
    check(n, &buf, depth);
    Ok(())
}

fn drop_unexecuted(depth: u64) {
    let buf = buffer(0.0);
    let op = deep_chain(depth, &buf);
    drop(op);
    assert_all(&buf, 0.0, "an op dropped unexecuted did nothing");
}

#[test]
fn a_deep_then_chain_syncs() -> Result<(), DeviceError> {
    sync_runs(DEPTH)
}

#[test]
fn a_deep_then_chain_syncs_on_a_small_stack() -> Result<(), DeviceError> {
    on_small_stack(|| sync_runs(DEPTH))
}

#[test]
fn a_deep_then_chain_syncs_on_a_stream() -> Result<(), DeviceError> {
    sync_on_runs(DEPTH)
}

#[test]
fn a_deep_then_chain_syncs_on_a_stream_on_a_small_stack() -> Result<(), DeviceError> {
    on_small_stack(|| sync_on_runs(DEPTH))
}

#[test]
fn a_deep_then_chain_awaits() -> Result<(), DeviceError> {
    await_runs(DEPTH)
}

#[test]
fn a_deep_then_chain_awaits_on_a_small_stack() -> Result<(), DeviceError> {
    on_small_stack(|| await_runs(DEPTH))
}

#[test]
fn a_deep_then_chain_schedules() -> Result<(), DeviceError> {
    schedule_runs(DEPTH)
}

#[test]
fn a_deep_then_chain_schedules_on_a_small_stack() -> Result<(), DeviceError> {
    on_small_stack(|| schedule_runs(DEPTH))
}

#[test]
fn a_deep_then_chain_enqueues_on_a_stream() -> Result<(), DeviceError> {
    enqueue_on_runs(DEPTH)?;
    on_small_stack(|| enqueue_on_runs(DEPTH))
}

#[test]
fn a_deep_then_chain_drops_unexecuted() {
    drop_unexecuted(DEPTH);
}

#[test]
fn a_deep_then_chain_drops_unexecuted_on_a_small_stack() {
    on_small_stack(|| drop_unexecuted(DEPTH));
}

#[test]
fn a_deep_map_chain_syncs_and_drops() -> Result<(), DeviceError> {
    assert_eq!(deep_map_chain(DEPTH).sync()?, DEPTH);
    on_small_stack(|| {
        drop(deep_map_chain(DEPTH));
        deep_map_chain(DEPTH).sync()
    })
    .map(|n| assert_eq!(n, DEPTH))
}

#[test]
fn a_shared_deep_chain_runs_once_for_every_clone() -> Result<(), DeviceError> {
    on_small_stack(|| {
        let buf = buffer(0.0);
        let shared = deep_chain(DEPTH, &buf).shared();
        let (a, b) = zip!(shared.clone(), shared.clone()).sync()?;
        assert!(Arc::ptr_eq(&a, &b), "one output for every clone");
        check(*a, &buf, DEPTH);
        // A shared deep chain dropped unexecuted, with its clones.
        let unrun = deep_chain(DEPTH, &buf).shared();
        drop((unrun.clone(), unrun));
        Ok(())
    })
}

#[test]
fn deep_chains_zip_on_several_streams() -> Result<(), DeviceError> {
    on_small_stack(|| {
        let policy = StreamPoolRoundRobin::new(&device(), 4)?;
        let (x, y) = (buffer(0.0), buffer(0.0));
        let ((a, b), _stats) =
            zip!(deep_chain(DEPTH, &x), deep_chain(DEPTH, &y)).sync_with_policy(&policy)?;
        check(a, &x, DEPTH);
        check(b, &y, DEPTH);
        Ok(())
    })
}

#[test]
fn a_deep_chain_describes_itself() {
    on_small_stack(|| {
        let buf = buffer(0.0);
        let dag = deep_chain(DEPTH, &buf).describe();
        // The value, then one continuation node per level (the op a continuation returns is
        // unknown before it runs).
        assert_eq!(dag.nodes.len() as u64, DEPTH + 1, "one node per level");
        assert_eq!(dag.edges.len() as u64, DEPTH, "one edge per level");
    });
}

#[test]
fn a_panic_deep_in_a_chain_is_an_error_and_the_thread_stays_usable() {
    on_small_stack(|| {
        // The first continuation runs at the chain's deepest level.
        let mut op = value(0u64)
            .then(|_| -> cuflow_device_op::Value<u64> { panic!("deep") })
            .boxed();
        for _ in 0..DEPTH {
            op = op.then(|n| value(n + 1)).boxed();
        }
        match op.sync() {
            Err(DeviceError::Panicked { .. }) => {}
            other => panic!("a panic deep in a chain is DeviceError::Panicked, got {other:?}"),
        }
        let buf = buffer(0.0);
        check(
            deep_chain(DEPTH, &buf)
                .sync()
                .expect("the thread stays usable"),
            &buf,
            DEPTH,
        );
    });
}

#[test]
fn a_deep_chain_of_named_ops_draws_as_dot() {
    on_small_stack(|| {
        let levels = 20_000;
        let mut op = value(0u64).boxed();
        for _ in 0..levels {
            op = op.named("level").boxed();
        }
        let dag = op.describe();
        assert_eq!(dag.groups.len(), levels, "one group per named level");
        let dot = dag.to_dot();
        assert_eq!(
            dot.matches("subgraph cluster_").count(),
            levels,
            "one cluster per named level"
        );
        assert_eq!(
            dot.matches('{').count(),
            dot.matches('}').count(),
            "the clusters are closed"
        );
        assert_eq!(op.sync().expect("runs"), 0);
    });
}

/// How many shared ops [`nested_shared_chain`] nests: each one's production runs inside the
/// next one's, so that far deeper than a small stack holds one frame per level.
const SHARED_DEPTH: usize = 10_000;

/// `first` made shared, then `SHARED_DEPTH` shared ops, each adding one to the one before:
/// executing the last produces every other one inside its own production.
fn nested_shared_chain(first: BoxedOp<'static, u64>) -> Shared<BoxedOp<'static, u64>> {
    let mut last = first.shared();
    for _ in 0..SHARED_DEPTH {
        last = last.then(|n: Arc<u64>| value(*n + 1)).boxed().shared();
    }
    last
}

/// A chain of shared ops whose first one fails.
fn failing_nested_shared_chain() -> Shared<BoxedOp<'static, u64>> {
    nested_shared_chain(
        from_fn(|_ctx| Err::<u64, _>(DeviceError::usage("the first op of the chain fails")))
            .boxed(),
    )
}

/// Shared ops produced one inside another, as deep as a loop makes them, end in an error
/// (when the first one fails) or are dropped in flight without exhausting the stack: their
/// execution's bookkeeping is released level by level, from every entry point.
#[test]
fn a_deep_chain_of_nested_shared_ops_fails_or_is_dropped_on_a_small_stack(
) -> Result<(), DeviceError> {
    on_small_stack(|| {
        let failed = |r: Result<Arc<u64>, DeviceError>, how: &str| match r {
            Err(DeviceError::Usage { what }) => {
                assert!(
                    what.contains("the first op of the chain fails"),
                    "{how}: {what}"
                )
            }
            other => panic!("{how}: the first op's error, got {other:?}"),
        };
        failed(failing_nested_shared_chain().sync(), "sync");
        failed(failing_nested_shared_chain().sync_on(&stream()), "sync_on");
        let policy = StreamPoolRoundRobin::new(&device(), 2)?;
        failed(
            failing_nested_shared_chain()
                .schedule(&policy)
                .and_then(futures::executor::block_on),
            "schedule",
        );
        failed(
            futures::executor::block_on(failing_nested_shared_chain().into_future()),
            ".await",
        );

        // Dropped in flight (its first op's work waits behind a closed gate), unpolled, and
        // after one poll.
        for poll_first in [false, true] {
            let buf = buffer(0.0);
            let mut gate = Gate::closed(&device())?;
            let first = fill_after(gate.event(), &buf, 1.0).map(|_| 1u64).boxed();
            let mut in_flight = nested_shared_chain(first).schedule(&policy)?;
            if poll_first {
                let mut cx = Context::from_waker(Waker::noop());
                assert!(Pin::new(&mut in_flight).poll(&mut cx).is_pending());
            }
            drop(in_flight);
            gate.open();
            assert_all(&buf, 1.0, "the dropped future's work");
        }
        Ok(())
    })
}

/// A chain whose every level takes a lot of stack of its own (a `zip!` of the chain with a
/// value, inside an op whose frame holds 16 KiB) runs on a small stack too: the stack is
/// checked at every boxed level, however much stack a level takes.
#[test]
fn a_deep_chain_of_wide_levels_syncs_on_a_small_stack() -> Result<(), DeviceError> {
    on_small_stack(|| {
        let levels = 20_000u64;
        let mut op = value(0u64).boxed();
        for _ in 0..levels {
            let inner = zip!(op, value(1u64)).map(|(a, b)| a + b);
            op = from_fn(move |ctx| {
                let pad = std::hint::black_box([0u8; 16 * 1024]);
                let n = inner.execute(ctx)?;
                Ok(n + u64::from(std::hint::black_box(&pad)[0]))
            })
            .boxed();
        }
        assert_eq!(op.sync()?, levels);
        Ok(())
    })
}

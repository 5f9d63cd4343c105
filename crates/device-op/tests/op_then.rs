//! `then`, `map`, `inspect`: continuations run on the same stream, after the first op's work;
//! host-only transforms add no device work; building an op runs nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_device_op::{value, with_context, DeviceError, DeviceOpExt};
use cuflow_scheduler::StreamPoolRoundRobin;
use cuflow_testing::{
    device::{device, stream},
    ops::*,
};

#[test]
fn then_runs_dependent_kernels_in_order() -> Result<(), DeviceError> {
    // (1 + 1) * 3 = 6. Were the add or the multiply not ordered after the slow write, it would
    // see the initial 0 and be overwritten later: the result would be 1.
    let buf = buffer(0.0);
    let out = spin_then_write(&buf, 1.0, SPIN)
        .then(|b| add_scalar(&b, 1.0))
        .then(|b| mul_scalar(&b, 3.0))
        .sync()?;
    assert!(Arc::ptr_eq(&out, &buf));
    assert_all(&out, 6.0, "spin_then_write(1) then add(1) then multiply(3)");

    // The same chain on an explicit stream and under an explicit policy.
    let stream = stream();
    let (out, stats) = spin_then_write(&buf, 2.0, SPIN)
        .then(|b| mul_scalar(&b, 5.0))
        .then(|b| add_scalar(&b, -1.0))
        .sync_on_with_stats(&stream)?;
    assert_all(
        &out,
        9.0,
        "spin_then_write(2) then multiply(5) then add(-1)",
    );
    assert_eq!(stats.streams, vec![stream.id()], "{stats:?}");
    assert_events(&stats, 0, 0);

    let policy = StreamPoolRoundRobin::new(&device(), 8)?;
    let (out, stats) = spin_then_write(&buf, 4.0, SPIN)
        .then(|b| add_scalar(&b, 4.0))
        .then(|b| mul_scalar(&b, 0.5))
        .sync_with_policy(&policy)?;
    assert_all(
        &out,
        4.0,
        "spin_then_write(4) then add(4) then multiply(0.5)",
    );
    assert_eq!(
        stats.streams.len(),
        1,
        "a chain stays on one stream: {stats:?}"
    );
    assert_events(&stats, 0, 0);
    Ok(())
}

#[test]
fn every_step_of_a_chain_runs_on_the_same_stream() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 8)?;
    let buf = buffer(0.0);
    let ((ids, _), stats) = with_stream(fill(&buf, 1.0))
        .then(|(b, first)| {
            with_stream(add_scalar(&b, 1.0)).map(move |(b, second)| (first, second, b))
        })
        .then(|(first, second, b)| {
            with_stream(mul_scalar(&b, 2.0)).map(move |(b, third)| ([first, second, third], b))
        })
        .sync_with_policy(&policy)?;
    assert_eq!(distinct(&ids), 1, "{ids:?}");
    assert_eq!(stats.streams, vec![ids[0]]);
    assert_all(&buf, 4.0, "fill(1) then add(1) then multiply(2)");
    Ok(())
}

#[test]
fn then_hands_the_first_output_to_the_continuation() -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let out = value(2.5f32)
        .then({
            let buf = buf.clone();
            move |v| fill(&buf, v)
        })
        .then(|b| add_scalar(&b, 0.25))
        .sync()?;
    assert_all(&out, 2.75, "value(2.5) then fill then add(0.25)");
    Ok(())
}

#[test]
fn map_and_inspect_run_on_the_host_and_add_no_device_work() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let (n, stats) = value(20)
        .map(|v| v + 1)
        .inspect(move |v| s.store(*v, Ordering::SeqCst))
        .map(|v| v * 2)
        .sync_with_policy(&policy)?;
    assert_eq!(n, 42);
    assert_eq!(seen.load(Ordering::SeqCst), 21);
    assert!(stats.streams.is_empty(), "{stats:?}");
    assert_events(&stats, 0, 0);

    // After device work, `map` sees the op's output and adds nothing to it.
    let buf = buffer(0.0);
    let (len, stats) = fill(&buf, 3.0).map(|b| b.len()).sync_with_policy(&policy)?;
    assert_eq!(len, LEN);
    assert_eq!(stats.streams.len(), 1, "{stats:?}");
    assert_events(&stats, 0, 0);
    assert_all(&buf, 3.0, "fill(3) then map");
    Ok(())
}

#[test]
fn building_an_op_runs_nothing_until_it_is_synced() -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let runs = Arc::new(AtomicUsize::new(0));
    let continued = Arc::new(AtomicUsize::new(0));
    let c = continued.clone();
    let op = counted(&runs, fill(&buf, 9.0))
        .then(move |b| {
            c.fetch_add(1, Ordering::SeqCst);
            add_scalar(&b, 1.0)
        })
        .then(|b| with_context(move |_| value(b)));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(continued.load(Ordering::SeqCst), 0);
    assert_all(&buf, 0.0, "an op that was built but not run");

    let out = op.sync()?;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(continued.load(Ordering::SeqCst), 1);
    assert_all(&out, 10.0, "fill(9) then add(1)");

    // An op dropped without running does nothing.
    let dropped = counted(&runs, fill(&buf, -1.0)).then(|b| add_scalar(&b, 1.0));
    drop(dropped);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_all(&buf, 10.0, "after dropping an op that never ran");
    Ok(())
}

//! `zip!` and `join_all`: branches spread over the policy's streams, forked from the parent's
//! earlier work and joined back with events; branches without device work add no events.
//!
//! The event counts asserted here follow from the executor's rules: a root stream chosen by
//! the policy holds nothing the op depends on, so its branches need no fork event; a root given
//! by the program (`sync_on`) may, so the first branch to enqueue work on another stream
//! records one fork event that every such branch waits on; each branch with device work on
//! another stream than its parent's is joined with one event and one wait.

use cuflow_device_op::{join_all, value, zip, DeviceError, DeviceOpExt};
use cuflow_scheduler::{SchedulingPolicy, SingleStream, StreamPoolRoundRobin};
use cuflow_testing::{
    device::{device, stream},
    ops::*,
};

#[test]
fn zip_branches_land_on_distinct_streams_and_the_join_sees_their_writes() -> Result<(), DeviceError>
{
    let policy = StreamPoolRoundRobin::new(&device(), 8)?;
    let (a, b, sum) = (buffer(0.0), buffer(0.0), buffer(-1.0));
    let op = zip!(
        with_stream(spin_then_write(&a, 2.0, SPIN)),
        with_stream(spin_then_write(&b, 5.0, SPIN))
    )
    .then({
        let sum = sum.clone();
        // Runs on the parent's stream: without the join waits it would read zeros.
        move |((a, on_a), (b, on_b))| add(&sum, &a, &b).map(move |s| (s, on_a, on_b))
    });
    let ((out, on_a, on_b), stats) = op.sync_with_policy(&policy)?;
    assert_all(&out, 7.0, "the join must wait for both branches");
    assert_ne!(
        on_a, on_b,
        "round-robin puts the two branches on distinct streams"
    );
    assert!(
        stats.streams.contains(&on_a) && stats.streams.contains(&on_b),
        "{stats:?}"
    );
    // The two branch streams plus the parent's, which received the joins and the add.
    assert_eq!(stats.streams.len(), 3, "{stats:?}");
    assert_eq!(distinct(&stats.streams), 3, "{stats:?}");
    // No fork under a policy-chosen root; one join event and wait per branch.
    assert_events(&stats, 2, 2);
    assert_all(&a, 2.0, "branch a");
    assert_all(&b, 5.0, "branch b");
    Ok(())
}

#[test]
fn zip_of_host_values_records_no_events() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let op = || {
        zip!(
            value(1),
            value(2).map(|v| v * 2),
            value("x"),
            value(4.0).map(|v| v + 1.0)
        )
    };
    let (out, stats) = op().sync_with_policy(&policy)?;
    assert_eq!(out, (1, 4, "x", 5.0));
    assert_events(&stats, 0, 0);
    assert!(stats.streams.is_empty(), "{stats:?}");

    // Also from a program-given root stream, whose earlier work branches would fork from.
    let stream = device.new_stream()?;
    let (out, stats) = op().sync_on_with_stats(&stream)?;
    assert_eq!(out, (1, 4, "x", 5.0));
    assert_events(&stats, 0, 0);
    assert!(stats.streams.is_empty(), "{stats:?}");
    Ok(())
}

#[test]
fn only_branches_with_device_work_are_joined() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 8)?;
    let (a, out) = (buffer(0.0), buffer(0.0));
    let ((copied, n, s), stats) = zip!(
        with_stream(spin_then_write(&a, 3.0, SPIN)),
        value(9),
        value("host").map(str::len)
    )
    .then({
        let out = out.clone();
        move |((a, on_a), n, s)| copy(&out, &a).map(move |c| ((c, on_a), n, s))
    })
    .sync_with_policy(&policy)?;
    assert_eq!((n, s), (9, 4));
    assert_all(&copied.0, 3.0, "the join must wait for the device branch");
    assert_events(&stats, 1, 1);
    assert_eq!(stats.streams.len(), 2, "{stats:?}");
    assert_eq!(stats.streams[0], copied.1, "{stats:?}");
    Ok(())
}

#[test]
fn branches_from_an_explicit_stream_fork_after_its_earlier_work() -> Result<(), DeviceError> {
    let stream = stream();
    let (src, d1, d2) = (buffer(0.0), buffer(0.0), buffer(0.0));
    // Earlier work on `stream`, enqueued without waiting for it.
    cuflow_device_op::enqueue_on(
        spin_then_write(&src, 5.0, SPIN),
        &stream,
        std::sync::Arc::new(SingleStream::on(&stream)),
    )?;
    // The branches go to the default pool's streams; each must start after the slow write.
    let ((c1, c2), stats) = zip!(copy(&d1, &src), copy(&d2, &src)).sync_on_with_stats(&stream)?;
    assert_all(
        &c1,
        5.0,
        "branch 1 must fork after the stream's earlier work",
    );
    assert_all(
        &c2,
        5.0,
        "branch 2 must fork after the stream's earlier work",
    );
    // One fork event shared by both branches, one join event per branch; each branch waits on
    // the fork, the parent waits on each branch.
    assert_events(&stats, 3, 4);
    assert!(stats.streams.contains(&stream.id()), "{stats:?}");
    Ok(())
}

#[test]
fn nested_zips_join_level_by_level() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 8)?;
    let (a, b, c, sum) = (buffer(0.0), buffer(0.0), buffer(0.0), buffer(0.0));
    let (out, stats) = zip!(
        zip!(
            spin_then_write(&a, 1.0, SPIN),
            spin_then_write(&b, 10.0, SPIN)
        ),
        spin_then_write(&c, 100.0, SPIN)
    )
    .then({
        let sum = sum.clone();
        move |((a, b), c)| sum_into(&sum, vec![a, b, c])
    })
    .sync_with_policy(&policy)?;
    assert_all(&out, 111.0, "every level must be joined before the sum");
    // Root, outer branches 1 and 2, inner branches 3 and 4 of a pool of 8: all distinct.
    assert_eq!(distinct(&stats.streams), 5, "{stats:?}");
    // Inner: two joins into the first outer branch; outer: two joins into the root. No forks:
    // neither the root nor the first outer branch had work before its branches.
    assert_events(&stats, 4, 4);
    Ok(())
}

#[test]
fn zip_yields_its_branches_outputs_in_order_for_every_arity() -> Result<(), DeviceError> {
    assert_eq!(zip!(value(1), value('b')).sync()?, (1, 'b'));
    assert_eq!(zip!(value(1), value(2), value(3)).sync()?, (1, 2, 3));
    assert_eq!(
        zip!(value(1), value(2), value(3), value(4)).sync()?,
        (1, 2, 3, 4)
    );
    assert_eq!(
        zip!(value(1), value(2), value(3), value(4), value(5)).sync()?,
        (1, 2, 3, 4, 5)
    );
    assert_eq!(
        zip!(value(1), value(2), value(3), value(4), value(5), value(6)).sync()?,
        (1, 2, 3, 4, 5, 6)
    );
    assert_eq!(
        zip!(
            value(1),
            value(2),
            value(3),
            value(4),
            value(5),
            value(6),
            value(7)
        )
        .sync()?,
        (1, 2, 3, 4, 5, 6, 7)
    );
    assert_eq!(
        zip!(
            value(1),
            value(2),
            value(3),
            value(4),
            value(5),
            value(6),
            value(7),
            value("eight"),
        )
        .sync()?,
        (1, 2, 3, 4, 5, 6, 7, "eight")
    );
    Ok(())
}

#[test]
fn join_all_joins_every_branch() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 8)?;
    let values = [1.0f32, 2.0, 4.0, 8.0, 16.0];
    let bufs = buffers(&[0.0; 5]);
    let sum = buffer(0.0);
    let (out, stats) =
        spin_writes_then_sum(&sum, &bufs, &values, SPIN).sync_with_policy(&policy)?;
    assert_all(&out, 31.0, "the sum must see every branch's write");
    assert_eq!(
        distinct(&stats.streams),
        6,
        "root and five branches: {stats:?}"
    );
    assert_events(&stats, 5, 5);

    // No branches: nothing to do.
    let (out, stats) = join_all(Vec::<TestOp<Buf>>::new()).sync_with_policy(&policy)?;
    assert!(out.is_empty());
    assert_events(&stats, 0, 0);
    assert!(stats.streams.is_empty(), "{stats:?}");

    // Branch outputs come back in branch order.
    let order = join_all((0..10).map(|i| value(i).map(|v| v * v)).collect()).sync()?;
    assert_eq!(order, (0..10).map(|v| v * v).collect::<Vec<_>>());
    assert_eq!(policy.device(), &device);
    Ok(())
}

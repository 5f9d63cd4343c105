//! `boxed`: ops of different types behind one type, e.g. in a `Vec` for `join_all`.

use std::future::IntoFuture;
use std::sync::Arc;

use cuflow_device_op::{join_all, value, zip, BoxedOp, DeviceError, DeviceOpExt};
use cuflow_scheduler::StreamPoolRoundRobin;
use cuflow_testing::{device::device, ops::*};

#[test]
fn a_vec_of_heterogeneous_boxed_ops_runs_through_join_all() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 8)?;
    let bufs = buffers(&[0.0; 6]);
    let sum = buffer(0.0);
    let ready = buffer(32.0);
    let shared = fill(&bufs[5], 64.0).shared();
    let ops: Vec<BoxedOp<'static, Buf>> = vec![
        fill(&bufs[0], 1.0).boxed(),
        spin_then_write(&bufs[1], 2.0, SPIN).boxed(),
        fill(&bufs[2], 1.0).then(|b| add_scalar(&b, 3.0)).boxed(),
        zip!(value("unused"), spin_then_write(&bufs[3], 8.0, SPIN))
            .map(|(_, b)| b)
            .boxed(),
        value(bufs[4].clone())
            .then(|b| fill(&b, 4.0))
            .then(|b| mul_scalar(&b, 4.0))
            .boxed(),
        value(ready.clone()).boxed(),
        shared.map(|b| Buf::clone(&b)).boxed(),
    ];
    let (out, stats) = join_all(ops)
        .then({
            let sum = sum.clone();
            move |written| sum_into(&sum, written)
        })
        .sync_with_policy(&policy)?;
    assert_all(
        &out,
        1.0 + 2.0 + 4.0 + 8.0 + 16.0 + 32.0 + 64.0,
        "sum of every branch",
    );
    // Seven branches on streams 1..=7 of the pool (the root has stream 0). Six have device
    // work and are joined (6 events, 6 waits); the value branch is not. The zip inside branch 3
    // places its branches next, on streams 0 and 1: the value one adds nothing, the device one
    // is joined into branch 3 (1 event, 1 wait). The shared producer records its event.
    assert_events(&stats, 8, 7);
    for (b, want) in bufs.iter().zip([1.0, 2.0, 4.0, 8.0, 16.0, 64.0]) {
        assert_all(b, want, "a branch's buffer");
    }
    Ok(())
}

#[test]
fn boxed_ops_may_borrow_local_data() -> Result<(), DeviceError> {
    let names = vec![String::from("a"), String::from("bc"), String::from("def")];
    let ops: Vec<BoxedOp<'_, usize>> = names
        .iter()
        .map(|n| value(n.as_str()).map(str::len).boxed())
        .chain([value(&names).map(|all| all.len()).boxed()])
        .collect();
    assert_eq!(join_all(ops).sync()?, vec![1, 2, 3, 3]);
    Ok(())
}

#[test]
fn boxing_keeps_ordering_and_can_be_awaited() -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let mut op: BoxedOp<'static, Buf> = spin_then_write(&buf, 1.0, SPIN).boxed();
    for _ in 0..5 {
        op = op.then(|b| mul_scalar(&b, 2.0)).boxed();
    }
    let out = futures::executor::block_on(op.into_future())?;
    assert!(Arc::ptr_eq(&out, &buf));
    assert_all(
        &out,
        32.0,
        "spin_then_write(1) then five doublings, boxed at each step",
    );

    let boxed = fill(&buf, 5.0).boxed();
    assert!(format!("{boxed:?}").contains("BoxedOp"), "{boxed:?}");
    let out = boxed.sync()?;
    assert_all(&out, 5.0, "a boxed fill");
    Ok(())
}

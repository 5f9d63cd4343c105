//! `unzip`: an op yielding a tuple split into one op per element; the original runs once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_device_op::{value, zip, DeviceError, DeviceOpExt, UnzipExt};
use cuflow_scheduler::StreamPoolRoundRobin;
use cuflow_testing::{device::device, ops::*};

#[test]
fn unzip_splits_pairs_and_runs_the_original_once() -> Result<(), DeviceError> {
    let runs = Arc::new(AtomicUsize::new(0));
    let (a, b) = (buffer(0.0), buffer(0.0));
    let (first, second) =
        counted(&runs, zip!(spin_then_write(&a, 1.0, SPIN), fill(&b, 2.0))).unzip();
    assert_eq!(runs.load(Ordering::SeqCst), 0, "unzip runs nothing");
    // Either part may run first.
    let got_b = second.sync()?;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let got_a = first.sync()?;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the original op ran twice");
    assert!(Arc::ptr_eq(&got_a, &a) && Arc::ptr_eq(&got_b, &b));
    assert_all(&got_a, 1.0, "first part");
    assert_all(&got_b, 2.0, "second part");

    let (n, s) = value((7, String::from("seven"))).unzip();
    assert_eq!(zip!(s, n).sync()?, (String::from("seven"), 7));
    Ok(())
}

#[test]
fn unzip_splits_triples() -> Result<(), DeviceError> {
    let runs = Arc::new(AtomicUsize::new(0));
    let (x, y, z) = counted(&runs, value((1u8, String::from("two"), 3.5f64))).unzip();
    assert_eq!(zip!(z, x, y).sync()?, (3.5, 1, String::from("two")));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let (a, b, c) = (buffer(0.0), buffer(0.0), buffer(0.0));
    let sum = buffer(0.0);
    let (pa, pb, pc) = zip!(
        spin_then_write(&a, 1.0, SPIN),
        fill(&b, 20.0),
        spin_then_write(&c, 300.0, SPIN)
    )
    .unzip();
    let out = zip!(pc, pa, pb)
        .then({
            let sum = sum.clone();
            move |(c, a, b)| sum_into(&sum, vec![a, b, c])
        })
        .sync()?;
    assert_all(&out, 321.0, "the sum of the three parts");
    Ok(())
}

#[test]
fn unzipped_parts_on_other_streams_wait_for_the_original() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 8)?;
    let (a, b, da, db) = (buffer(0.0), buffer(0.0), buffer(0.0), buffer(0.0));
    let (pa, pb) = zip!(
        spin_then_write(&a, 4.0, SPIN),
        spin_then_write(&b, 6.0, SPIN)
    )
    .unzip();
    let ((ca, cb), _) = zip!(
        pa.then({
            let da = da.clone();
            move |a| copy(&da, &a)
        }),
        pb.then({
            let db = db.clone();
            move |b| copy(&db, &b)
        })
    )
    .sync_with_policy(&policy)?;
    assert_all(&ca, 4.0, "the part that ran the original");
    assert_all(&cb, 6.0, "the part that waited for the original");
    Ok(())
}

#[test]
fn unzipped_parts_can_be_consumed_from_different_threads() -> Result<(), DeviceError> {
    let runs = Arc::new(AtomicUsize::new(0));
    let (a, b) = (buffer(0.0), buffer(0.0));
    let (pa, pb) = counted(
        &runs,
        zip!(
            spin_then_write(&a, 8.0, SPIN),
            spin_then_write(&b, 9.0, SPIN)
        ),
    )
    .unzip();
    let (ra, rb) = std::thread::scope(|scope| {
        let ha = scope.spawn(move || pa.sync());
        let hb = scope.spawn(move || pb.sync());
        (ha.join().expect("thread a"), hb.join().expect("thread b"))
    });
    let (ra, rb) = (ra?, rb?);
    assert_all(&ra, 8.0, "part a");
    assert_all(&rb, 9.0, "part b");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

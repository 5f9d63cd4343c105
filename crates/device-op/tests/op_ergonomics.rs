//! What porting programs from other libraries asked of the combinators: `unzip` of tuples up
//! to eight and of elements that cannot be cloned, and a `shared` op from an existing `Arc`.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_device_op::{value, zip, DeviceError, DeviceOpExt, Shared, UnzipExt};
use cuflow_testing::ops::*;

/// An element that is neither `Clone` nor `Sync`.
struct Owned(Cell<u32>);

#[test]
fn unzip_moves_elements_that_cannot_be_cloned() -> Result<(), DeviceError> {
    let runs = Arc::new(AtomicUsize::new(0));
    let (a, b) = counted(
        &runs,
        value((Owned(Cell::new(3)), vec![Owned(Cell::new(4))])),
    )
    .unzip();
    let (b, a) = zip!(b, a).sync()?;
    assert_eq!((a.0.get(), b[0].0.get()), (3, 4));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the original op ran once");
    Ok(())
}

#[test]
fn unzip_splits_tuples_of_four_to_eight() -> Result<(), DeviceError> {
    let (a, b, c, d) = value((1u8, 2u16, 3u32, 4u64)).unzip();
    assert_eq!(zip!(d, c, b, a).sync()?, (4, 3, 2, 1));

    let (a, b, c, d, e) = value((1, 2, 3, 4, 5)).unzip();
    assert_eq!(zip!(e, d, c, b, a).sync()?, (5, 4, 3, 2, 1));

    let (a, _, _, _, _, f) = value((1, 2, 3, 4, 5, String::from("six"))).unzip();
    assert_eq!((f.sync()?, a.sync()?), (String::from("six"), 1));

    let (_, _, _, _, _, _, g) = value((1, 2, 3, 4, 5, 6, 7)).unzip();
    assert_eq!(g.sync()?, 7);

    let runs = Arc::new(AtomicUsize::new(0));
    let parts = counted(&runs, value((0, 1, 2, 3, 4, 5, 6, Owned(Cell::new(7))))).unzip();
    let (p0, p1, p2, p3, p4, p5, p6, p7) = parts;
    assert_eq!(p7.sync()?.0.get(), 7);
    assert_eq!(
        zip!(p0, p1, p2, p3, p4, p5, p6).sync()?,
        (0, 1, 2, 3, 4, 5, 6)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the original op ran once");
    Ok(())
}

#[test]
fn unzipped_device_work_is_ordered_for_every_part() -> Result<(), DeviceError> {
    let (a, b, c, d) = (buffer(0.0), buffer(0.0), buffer(0.0), buffer(0.0));
    let (pa, pb, pc, pd) = zip!(
        spin_then_write(&a, 1.0, SPIN),
        fill(&b, 2.0),
        spin_then_write(&c, 3.0, SPIN),
        fill(&d, 4.0)
    )
    .unzip();
    let sum = buffer(0.0);
    let out = zip!(pd, pc, pb, pa)
        .then({
            let sum = sum.clone();
            move |(d, c, b, a)| sum_into(&sum, vec![a, b, c, d])
        })
        .sync()?;
    assert_all(&out, 10.0, "sum of the four parts");
    Ok(())
}

#[test]
fn unzip_parts_are_static_and_spawnable() -> Result<(), DeviceError> {
    let (a, b, c) = value((1, 2, Owned(Cell::new(3)))).unzip();
    let boxed = a.boxed();
    let handle = std::thread::spawn(move || boxed.sync());
    let c = std::thread::spawn(move || c.sync().map(|o| o.0.get()))
        .join()
        .expect("the thread ran");
    assert_eq!(handle.join().expect("the thread ran")?, 1);
    assert_eq!((b.sync()?, c?), (2, 3));
    Ok(())
}

#[test]
fn unzip_parts_share_the_original_error() {
    let (a, b) = value(())
        .then(|()| {
            cuflow_device_op::from_fn(|_| -> Result<(u8, u8), _> {
                Err(DeviceError::usage("no pair today"))
            })
        })
        .unzip();
    for part in [a.sync(), b.sync()] {
        match part {
            Err(DeviceError::Usage { what }) => assert!(what.contains("no pair today")),
            other => panic!("expected the original error, got {other:?}"),
        }
    }
}

#[test]
fn shared_ready_yields_the_given_arc_to_every_consumer() -> Result<(), DeviceError> {
    let weights = Arc::new(vec![1.0f32, 2.0, 3.0]);
    let s = Shared::ready(weights.clone());
    assert!(s.is_finished(), "a ready op has finished before it runs");
    let (a, b, n) = zip!(s.clone(), s.clone(), s.clone().map(|w| w.len())).sync()?;
    assert!(Arc::ptr_eq(&a, &weights) && Arc::ptr_eq(&b, &weights));
    assert_eq!(n, 3);
    let spawned = std::thread::spawn(move || s.sync())
        .join()
        .expect("the thread ran")?;
    assert!(Arc::ptr_eq(&spawned, &weights));
    Ok(())
}

#[test]
fn shared_ready_after_device_work() -> Result<(), DeviceError> {
    let buf = buffer(0.0);
    let produced = Arc::new(fill(&buf, 5.0).sync()?);
    let consumed = Shared::ready(produced)
        .then(|b| add_scalar(&b, 1.0))
        .sync()?;
    assert_all(&consumed, 6.0, "a ready buffer read by a later kernel");
    Ok(())
}

#[test]
fn one_element_of_a_tuple_and_an_arc_unwrapped_are_maps() -> Result<(), DeviceError> {
    // The first and the last element of a tuple op, without splitting it.
    assert_eq!(value((1, "b", 3.5)).map(|(a, _, _)| a).sync()?, 1);
    assert_eq!(value((1, "b", 3.5)).map(|(_, _, c)| c).sync()?, 3.5);
    // A shared op's Arc unwrapped once its last other owner is gone: an error value, never a
    // panic, when another owner remains.
    let s = value(String::from("only")).shared();
    assert_eq!(s.map(Arc::try_unwrap).sync()?, Ok(String::from("only")));
    let kept = Arc::new(7);
    let held = Shared::ready(kept.clone()).map(Arc::try_unwrap).sync()?;
    assert_eq!(held, Err(Arc::new(7)), "another owner remains");
    Ok(())
}

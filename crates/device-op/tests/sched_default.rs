//! The default policy of a device: a round-robin pool of `DEFAULT_POOL_SIZE` streams,
//! process-wide (the same from every thread), replaceable at run time. In its own test binary
//! (its own process), since replacing it affects every op run with `sync()` or `.await`.

use std::future::IntoFuture;
use std::sync::Arc;

use cuflow_device_op::{value, with_context, zip, DeviceError, DeviceOpExt};
use cuflow_runtime::StreamId;
use cuflow_scheduler::{
    default_policy, DevicePolicyExt, SchedulingPolicy, SingleStream, StreamPoolRoundRobin,
    DEFAULT_POOL_SIZE,
};
use cuflow_testing::{device::device, ops::*};
use parking_lot::Mutex;

/// The tests of this file observe or replace the one default policy: one at a time.
static DEFAULT_POLICY: Mutex<()> = Mutex::new(());

/// The root stream `sync()` picks for an op, seen from inside the op.
fn root_stream_of_sync() -> Result<StreamId, DeviceError> {
    with_context(|ctx| value(ctx.stream_id())).sync()
}

#[test]
fn the_default_policy_is_a_round_robin_pool() -> Result<(), DeviceError> {
    let _one_at_a_time = DEFAULT_POLICY.lock();
    let device = device();
    let roots: Vec<StreamId> = (0..2 * DEFAULT_POOL_SIZE)
        .map(|_| root_stream_of_sync())
        .collect::<Result<_, _>>()?;
    assert_eq!(distinct(&roots), DEFAULT_POOL_SIZE, "{roots:?}");
    assert_eq!(roots[..DEFAULT_POOL_SIZE], roots[DEFAULT_POOL_SIZE..]);
    // The free function and the method agree, and so does every call.
    assert!(Arc::ptr_eq(
        &default_policy(&device)?,
        &device.default_policy()?
    ));
    assert_eq!(device.default_policy()?.device(), &device);
    Ok(())
}

#[test]
fn the_default_policy_set_on_one_thread_is_seen_on_every_other() -> Result<(), DeviceError> {
    let _one_at_a_time = DEFAULT_POLICY.lock();
    let device = device();
    let before = device.default_policy()?;
    let only = device.new_stream()?;
    let replacement: Arc<dyn SchedulingPolicy> = Arc::new(SingleStream::on(&only));

    std::thread::scope(|scope| {
        let setter = scope.spawn(|| device.set_default_policy(replacement.clone()));
        setter.join().expect("setting thread")
    })?;

    let (a, b) = (buffer(0.0), buffer(0.0));
    let seen = std::thread::scope(|scope| {
        let observer = scope.spawn(|| -> Result<_, DeviceError> {
            let policy = device.default_policy()?;
            let root = root_stream_of_sync()?;
            // A zip run with sync(): both branches on the one stream of the new default.
            let ((_, sa), (_, sb)) = zip!(
                with_stream(spin_then_write(&a, 1.0, SPIN)),
                with_stream(fill(&b, 2.0))
            )
            .sync()?;
            let awaited = futures::executor::block_on(
                with_context(|ctx| value(ctx.stream_id())).into_future(),
            )?;
            Ok((policy, root, sa, sb, awaited))
        });
        observer.join().expect("observing thread")
    })?;
    let (policy, root, sa, sb, awaited) = seen;
    assert!(
        Arc::ptr_eq(&policy, &replacement),
        "the other thread sees the new default"
    );
    assert_eq!([root, sa, sb, awaited], [only.id(); 4]);
    assert_all(&a, 1.0, "branch a under the new default");
    assert_all(&b, 2.0, "branch b under the new default");

    // Restore a round-robin default, from yet another thread, and see it here.
    let restored: Arc<dyn SchedulingPolicy> =
        Arc::new(StreamPoolRoundRobin::new(&device, DEFAULT_POOL_SIZE)?);
    std::thread::scope(|scope| {
        scope
            .spawn(|| device.set_default_policy(restored.clone()))
            .join()
            .expect("restoring thread")
    })?;
    assert!(Arc::ptr_eq(&device.default_policy()?, &restored));
    assert!(!Arc::ptr_eq(&device.default_policy()?, &before));
    let roots: Vec<StreamId> = (0..DEFAULT_POOL_SIZE)
        .map(|_| root_stream_of_sync())
        .collect::<Result<_, _>>()?;
    assert_eq!(distinct(&roots), DEFAULT_POOL_SIZE, "{roots:?}");
    assert!(!roots.contains(&only.id()));
    Ok(())
}

/// A policy whose `device` panics.
#[derive(Debug)]
struct NoDevice;

impl SchedulingPolicy for NoDevice {
    fn device(&self) -> &cuflow_runtime::Device {
        panic!("the policy panics naming its device")
    }

    fn place(
        &self,
        _: &cuflow_scheduler::Placement<'_>,
    ) -> Result<cuflow_runtime::Stream, DeviceError> {
        Err(DeviceError::usage("never placed"))
    }
}

/// Setting a default policy that panics when asked its device is a `Panicked` error naming the
/// policy (the panic crossed `set_default_policy`), and the default stays as it was.
#[test]
fn setting_a_default_policy_that_panics_is_an_error_and_keeps_the_default(
) -> Result<(), DeviceError> {
    let _one_at_a_time = DEFAULT_POLICY.lock();
    let device = device();
    let before = device.default_policy()?;
    let set = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        device.set_default_policy(Arc::new(NoDevice))
    }));
    match set {
        Ok(Err(DeviceError::Panicked { .. })) => {}
        Ok(other) => panic!("expected a Panicked error, got {other:?}"),
        Err(_) => panic!("set_default_policy let the policy's panic through"),
    }
    assert!(Arc::ptr_eq(&device.default_policy()?, &before));
    assert_eq!(value(2).map(|v| v * 3).sync()?, 6);
    Ok(())
}

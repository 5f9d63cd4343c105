//! The executor over several devices: branches run on the device of the stream the policy
//! picks, `with_same_device` keeps them home, and `on_device` joins work of another device
//! into the op. Placement is the same on every backend, so these run on two host devices.

use cuflow_device_op::{from_fn, value, with_context, zip, DeviceError, DeviceOp, DeviceOpExt};
use std::sync::Arc;

use cuflow_runtime::{Device, DeviceBuffer};
use cuflow_scheduler::{DevicePolicyExt, MultiDevice, SingleStream, StreamPoolRoundRobin};
use cuflow_testing::ops::assert_events;

fn devices() -> [Device; 2] {
    [Device::host(), Device::host_numbered(1)]
}

/// An op yielding the device its context runs on.
fn where_am_i() -> impl DeviceOp<Output = Device> {
    with_context(|ctx| value(ctx.device().clone()))
}

#[test]
fn branches_run_on_the_device_of_their_stream() -> Result<(), DeviceError> {
    let [a, b] = devices();
    let policy = MultiDevice::new(&[a.clone(), b.clone()], 2)?;
    let ((x, (y, z), w), _) = zip!(where_am_i(), zip!(where_am_i(), where_am_i()), where_am_i())
        .sync_with_policy(&policy)?;
    assert_eq!(
        (x, w),
        (a.clone(), a.clone()),
        "branches 0 and 2 of 2 devices"
    );
    assert_eq!(
        (y, z),
        (b.clone(), b),
        "a nested zip stays on its branch's device"
    );

    // Branches forked under `with_same_device` (as kernels fork their inputs) stay home.
    let kept_home =
        from_fn(|ctx| ctx.with_same_device(|ctx| zip!(where_am_i(), where_am_i()).execute(ctx)));
    let ((p, q), _) = kept_home.sync_with_policy(&policy)?;
    assert_eq!((p, q), (a.clone(), a));
    Ok(())
}

#[test]
fn on_device_orders_work_of_another_device_into_the_op() -> Result<(), DeviceError> {
    let [a, b] = devices();
    let home = a.new_stream()?;
    let src = DeviceBuffer::from_host(&home, &[1.0f32, 2.0, 3.0])?;
    let gather = from_fn({
        let b = b.clone();
        move |ctx| {
            ctx.on_device(&b, |stream| {
                let dst = DeviceBuffer::<f32>::alloc(stream, src.len())?;
                dst.copy_from_device(stream, &src)?;
                Ok(dst)
            })
        }
    });
    let (out, stats) = gather.sync_on_with_stats(&home)?;
    assert_eq!(out.device(), &b);
    assert_eq!(out.to_host_vec(&b.new_stream()?)?, vec![1.0, 2.0, 3.0]);
    assert_eq!(stats.streams.len(), 2, "{stats:?}");
    assert_events(&stats, 2, 2);
    Ok(())
}

#[test]
fn on_device_refuses_a_default_policy_that_places_work_on_a_capturing_stream(
) -> Result<(), DeviceError> {
    // A device of its own: its default policy is replaced for this test only.
    let (home, other) = (Device::host(), Device::host_numbered(5));
    let capturing = other.new_stream()?;
    capturing.begin_capture()?;
    other.set_default_policy(Arc::new(SingleStream::on(&capturing)))?;
    let stream = home.new_stream()?;
    let src = DeviceBuffer::from_host(&stream, &[1.0f32, 2.0, 3.0])?;
    let outcome = from_fn({
        let other = other.clone();
        move |ctx| {
            ctx.on_device(&other, |s| {
                let dst = DeviceBuffer::<f32>::alloc(s, src.len())?;
                dst.copy_from_device(s, &src)?;
                Ok(dst)
            })
        }
    })
    .sync_on(&stream);
    other.set_default_policy(Arc::new(StreamPoolRoundRobin::new(&other, 4)?))?;
    match outcome {
        Err(DeviceError::Capture { reason, .. }) => assert!(
            reason.contains("scheduling policy") && reason.contains("captured"),
            "the error names the policy and the capture: {reason}"
        ),
        other => panic!("expected a capture error, got {other:?}"),
    }
    assert!(!stream.is_capturing(), "the op's stream joined the capture");
    let graph = capturing.end_capture()?;
    assert_eq!(graph.node_count()?, 0, "the op's work was recorded");
    Ok(())
}

/// `on_stream` given a stream that is being captured, by an op that is not: the op's own
/// stream would wait on a captured event and so join the capture, recording the rest of the op
/// instead of running it, and leaving the capture with work it cannot join back.
#[test]
fn on_stream_refuses_a_stream_being_captured_while_the_op_is_not() -> Result<(), DeviceError> {
    let [a, b] = devices();
    for other in [a.clone(), b] {
        let home = a.new_stream()?;
        let capturing = other.new_stream()?;
        let src = Arc::new(DeviceBuffer::from_host(&home, &[1.0f32, 2.0, 3.0])?);
        home.synchronize()?;
        capturing.begin_capture()?;
        let outcome = from_fn({
            let (capturing, src) = (capturing.clone(), src.clone());
            move |ctx| {
                ctx.on_stream(&capturing, |s| {
                    let dst = DeviceBuffer::<f32>::alloc(s, src.len())?;
                    dst.copy_from_device(s, &src)?;
                    Ok(dst)
                })
            }
        })
        .sync_on(&home);
        let home_captured = home.is_capturing();
        let graph = capturing.end_capture();
        match outcome {
            Err(DeviceError::Capture { op, reason }) => {
                assert_eq!(op, "ExecutionContext::on_stream", "{reason}");
                assert!(reason.contains("captured"), "{reason}");
            }
            other => panic!("expected a capture error, got {other:?}"),
        }
        assert!(!home_captured, "the op's stream joined the capture");
        assert_eq!(graph?.node_count()?, 0, "the op's work was recorded");
        let copy = DeviceBuffer::<f32>::alloc(&home, 3)?;
        copy.copy_from(&home, &src)?;
        assert_eq!(copy.to_host_vec(&home)?, vec![1.0, 2.0, 3.0]);
    }
    Ok(())
}

//! Captures of ops whose work spans two devices: branches a `MultiDevice` policy spreads, and
//! work an op places on another device with `ExecutionContext::on_device`. The capture stays
//! isolated: it records on private streams only, never on a stream that a device's default
//! policy hands to other work.

use std::sync::Arc;

use cuflow_device_op::{from_fn, value, zip, DeviceOpExt};
use cuflow_graph_capture::GraphCaptureExt;
use cuflow_runtime::{DeviceBuffer, DeviceError};
use cuflow_scheduler::{DevicePolicyExt, MultiDevice, StreamPoolRoundRobin};
use cuflow_testing::{
    device::device_pair,
    kernels::{affine as affine_kernel, launch_affine},
    ops::{affine, compile_kernels},
};

#[test]
fn branches_spread_over_two_devices_replay_on_both() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    let x = Arc::new(DeviceBuffer::from_host(&sa, &[1.0f32; 100])?);
    let y = Arc::new(DeviceBuffer::from_host(&sb, &[2.0f32; 100])?);
    sa.synchronize()?;
    sb.synchronize()?;
    let policy = MultiDevice::new(&[a, b], 2)?;
    let mut graph = zip!(affine(&x, 2.0, 1.0), affine(&y, 3.0, 0.0)).graph_with_policy(&policy)?;
    assert_eq!(x.to_host_vec(&sa)?, vec![1.0; 100], "the capture ran");
    for _ in 0..3 {
        graph.launch()?;
    }
    graph.synchronize()?;
    assert_eq!(x.to_host_vec(&sa)?, vec![15.0; 100], "((1·2+1)·2+1)·2+1");
    assert_eq!(y.to_host_vec(&sb)?, vec![54.0; 100], "2·3·3·3");
    Ok(())
}

/// `on_device` inside a capture joins a stream of the other device into the capture: that
/// stream must be private to the capture, not one of the streams the device's default policy
/// hands to every op, or another thread's op placed there is refused (or recorded).
#[test]
fn on_device_during_a_capture_records_on_a_private_stream() -> Result<(), DeviceError> {
    let Some((home, other)) = device_pair() else {
        return Ok(());
    };
    compile_kernels(&other)?;
    affine_kernel().compile(&other)?;
    // One stream in the other device's default pool, so that any op of that policy lands on
    // the stream `on_device` would take from it.
    let pool = StreamPoolRoundRobin::new(&other, 1)?;
    let previous = other.default_policy()?;
    other.set_default_policy(Arc::new(pool.clone()))?;
    let so = other.new_stream()?;
    let x = Arc::new(DeviceBuffer::from_host(&so, &[1.0f32; 256])?);
    let unrelated = Arc::new(DeviceBuffer::from_host(&so, &[5.0f32; 256])?);
    so.synchronize()?;

    let op = from_fn({
        let (other, x) = (other.clone(), x.clone());
        move |ctx| {
            ctx.on_device(&other, |s| {
                launch_affine(s, &*x, 2.0, 1.0)?;
                Ok(s.clone())
            })
        }
    })
    .then({
        let (pool, unrelated) = (pool.clone(), unrelated.clone());
        move |taken| {
            value(()).map(move |()| {
                // Another thread's op on the other device, while the capture is open.
                let unrelated_run = std::thread::spawn(move || {
                    affine(&unrelated, 3.0, 0.0)
                        .sync_with_policy(&pool)
                        .map(|_| ())
                })
                .join();
                (taken, unrelated_run)
            })
        }
    });
    let captured = op.graph_on(home.new_stream()?);
    other.set_default_policy(previous)?;
    let mut graph = captured?;
    let (taken, unrelated_run) = graph.take_output().expect("the output");
    match unrelated_run {
        Ok(result) => result?,
        Err(_) => panic!("the other thread panicked"),
    }
    assert!(
        !pool.streams().contains(&taken),
        "the capture recorded on a stream of the default policy"
    );
    assert_eq!(unrelated.to_host_vec(&so)?, vec![15.0; 256]);
    assert_eq!(x.to_host_vec(&so)?, vec![1.0; 256], "the capture ran");
    graph.replay_and_wait()?;
    graph.replay_and_wait()?;
    assert_eq!(x.to_host_vec(&so)?, vec![7.0; 256], "(1·2+1)·2+1");
    Ok(())
}

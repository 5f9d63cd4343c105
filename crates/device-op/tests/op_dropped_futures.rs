//! Dropping in-flight futures frees nothing a kernel still uses, and everything once the work
//! is done. In its own test binary (its own process), so that no other test allocates while
//! device memory is counted.

use std::future::Future;

use cuflow_device_op::{DeviceError, DeviceOpExt};
use cuflow_scheduler::StreamPoolRoundRobin;
use cuflow_testing::{device::device, ops::*};

#[test]
fn dropping_in_flight_futures_returns_memory_to_its_baseline() -> Result<(), DeviceError> {
    let device = device();
    compile_kernels(&device)?;
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let len = 1 << 16;
    let baseline = device.bytes_in_use();
    for i in 0..100 {
        // Each op allocates a buffer on its stream, spins, then fills it: the buffer is still
        // being written when its future (and with it the buffer) is dropped.
        let mut future = alloc_spin_fill(len, i as f32, SPIN / 40).schedule(&policy)?;
        if i % 10 == 0 {
            // Some are polled once first, so that the completion thread watches them.
            let _ = std::pin::Pin::new(&mut future)
                .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        }
        drop(future);
    }
    device.synchronize()?;
    assert_eq!(
        device.bytes_in_use(),
        baseline,
        "dropped futures' buffers must be freed once their work has finished"
    );

    // The device is healthy: a later op completes with the right contents.
    let out = futures::executor::block_on(alloc_spin_fill(len, 3.0, SPIN / 40).schedule(&policy)?)?;
    assert_eq!(out.len(), len);
    assert!(read(&out).iter().all(|v| *v == 3.0));
    assert!(
        device.bytes_in_use() > baseline,
        "the live output is counted"
    );
    drop(out);
    device.synchronize()?;
    assert_eq!(device.bytes_in_use(), baseline);
    Ok(())
}

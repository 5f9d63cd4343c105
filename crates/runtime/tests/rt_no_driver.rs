//! Opening CUDA devices: without a driver (or without a device) the answer is an error that
//! says so, never a panic; with a driver and a device it is that device.

use cuflow_runtime::{BackendKind, Device, DeviceError};

/// Whether this run asked for CUDA (then a missing GPU must fail the run).
fn cuda_requested() -> bool {
    std::env::var("CUFLOW_DEVICE").is_ok_and(|v| {
        let v = v.trim();
        v.starts_with("cuda") || v == "gpu"
    })
}

#[test]
fn device_zero_agrees_with_the_driver() {
    let count = Device::cuda_count();
    let first = Device::cuda(0);
    if count == 0 {
        assert!(
            !cuda_requested(),
            "CUFLOW_DEVICE asks for CUDA but no CUDA device is visible: {first:?}"
        );
        match &first {
            Err(e @ DeviceError::NoDriver { reason }) => {
                assert!(!reason.is_empty());
                let msg = e.to_string();
                assert!(msg.contains("CUDA driver"), "{msg}");
                assert!(
                    msg.contains("host"),
                    "the message should name the way out: {msg}"
                );
            }
            Err(DeviceError::NoDevice { ordinal, count }) => {
                assert_eq!((*ordinal, *count), (0, 0));
            }
            other => panic!("no visible device, yet Device::cuda(0) gave {other:?}"),
        }
    } else {
        let gpu = first
            .as_ref()
            .expect("the driver reports a device, so device 0 must open");
        assert_eq!(gpu.kind(), BackendKind::Cuda);
        assert_eq!(gpu.ordinal(), Some(0));
        assert!(gpu.compute_capability().is_some());
        assert!(!gpu.name().is_empty());
        assert!(gpu.memory_info().expect("memory info").total > 0);
    }
    // Asking again gives the same answer (the same device, or the same kind of error).
    match (&first, Device::cuda(0)) {
        (Ok(a), Ok(b)) => assert_eq!(a, &b),
        (Err(a), Err(b)) => assert_eq!(
            std::mem::discriminant(a),
            std::mem::discriminant(&b),
            "{a} then {b}"
        ),
        (a, b) => panic!("Device::cuda(0) changed its answer: {a:?} then {b:?}"),
    }
}

#[test]
fn ordinals_past_the_last_device_are_refused() {
    let count = Device::cuda_count();
    for ordinal in [count, count + 1, 4096] {
        match Device::cuda(ordinal) {
            Err(DeviceError::NoDevice {
                ordinal: o,
                count: c,
            }) => {
                assert_eq!(o, ordinal);
                assert_eq!(c, count);
                let msg = DeviceError::NoDevice {
                    ordinal: o,
                    count: c,
                }
                .to_string();
                assert!(msg.contains("CUDA device"), "{msg}");
            }
            Err(DeviceError::NoDriver { .. }) => assert_eq!(count, 0),
            other => panic!("cuda({ordinal}) with {count} devices: {other:?}"),
        }
    }
}

#[test]
fn a_run_that_asks_for_cuda_gets_it() {
    match Device::cuda(0) {
        Ok(gpu) => assert!(
            Device::cuda_count() >= 1,
            "{gpu} opened with no device counted"
        ),
        Err(e) => {
            assert!(!cuda_requested(), "CUFLOW_DEVICE asks for CUDA: {e}");
            // Without CUFLOW_DEVICE the host stands in; with it, the error comes back.
            if std::env::var("CUFLOW_DEVICE").is_err() {
                assert_eq!(Device::auto().expect("auto"), Device::host());
            }
        }
    }
}

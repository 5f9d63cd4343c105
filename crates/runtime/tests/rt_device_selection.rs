//! Device selection without a driver, and `CUFLOW_DEVICE`. In its own test binary because it
//! sets the environment variable.

use cuflow_runtime::{BackendKind, Device, DeviceError};

#[test]
fn selection_follows_cuflow_device_and_never_falls_back_silently() {
    let before = std::env::var("CUFLOW_DEVICE").ok();
    match Device::cuda(0) {
        Ok(d) => {
            assert_eq!(d.kind(), BackendKind::Cuda);
            assert!(Device::cuda_count() >= 1);
            assert!(d.compute_capability().is_some());
            assert!(d.memory_info().expect("memory info").total > 0);
        }
        Err(DeviceError::NoDriver { reason }) => {
            assert_eq!(Device::cuda_count(), 0);
            assert!(!reason.is_empty());
        }
        Err(DeviceError::NoDevice { ordinal, .. }) => assert_eq!(ordinal, 0),
        Err(other) => panic!("Device::cuda(0) must be Ok, NoDriver or NoDevice: {other}"),
    }
    assert!(matches!(
        Device::cuda(4096),
        Err(DeviceError::NoDriver { .. } | DeviceError::NoDevice { .. })
    ));
    assert!(matches!(
        Device::from_selector("bogus"),
        Err(DeviceError::BadDeviceSelector { .. })
    ));
    assert_eq!(
        Device::from_selector("host").expect("host").kind(),
        BackendKind::Host
    );

    // SAFETY of the test: this binary has one test, so no other thread reads the environment.
    std::env::set_var("CUFLOW_DEVICE", "cuda");
    match Device::auto() {
        Ok(d) => assert_eq!(
            d.kind(),
            BackendKind::Cuda,
            "CUFLOW_DEVICE=cuda must give CUDA"
        ),
        Err(e) => {
            assert!(Device::cuda(0).is_err());
            let msg = e.to_string();
            assert!(
                msg.contains("CUDA"),
                "the error must say what is missing: {msg}"
            );
        }
    }
    match before {
        Some(v) => std::env::set_var("CUFLOW_DEVICE", v),
        None => std::env::remove_var("CUFLOW_DEVICE"),
    }
}

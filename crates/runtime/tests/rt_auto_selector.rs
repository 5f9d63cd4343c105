//! `CUFLOW_DEVICE` and `Device::auto()`. One test in its own process, because it sets the
//! environment variable and no other thread may read the environment meanwhile.

use cuflow_runtime::{BackendKind, Device, DeviceError};

#[test]
fn cuflow_device_picks_the_device_and_never_falls_back_to_the_host() {
    let before = std::env::var("CUFLOW_DEVICE").ok();

    std::env::set_var("CUFLOW_DEVICE", "cuda");
    let gpu = match Device::auto() {
        Ok(d) => {
            assert_eq!(d.kind(), BackendKind::Cuda, "CUFLOW_DEVICE=cuda gave {d}");
            assert_eq!(d.ordinal(), Some(0));
            assert!(Device::cuda_count() >= 1);
            Some(d)
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    DeviceError::NoDriver { .. }
                        | DeviceError::NoDevice { .. }
                        | DeviceError::Driver { .. }
                ),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains("CUDA"),
                "the error must say what is missing: {msg}"
            );
            assert!(
                msg.contains("driver") || msg.contains("device"),
                "the error must say what is missing: {msg}"
            );
            assert!(Device::cuda(0).is_err());
            // A run that itself asks for CUDA must have it.
            assert!(
                !before
                    .as_deref()
                    .is_some_and(|v| v.trim().starts_with("cuda")),
                "this run asks for CUDA (CUFLOW_DEVICE={before:?}) and cannot have it: {e}"
            );
            None
        }
    };

    std::env::set_var("CUFLOW_DEVICE", "cuda:0");
    match (&gpu, Device::auto()) {
        (Some(g), Ok(d)) => assert_eq!(g, &d),
        (None, Err(_)) => {}
        (g, d) => panic!("cuda and cuda:0 disagree: {g:?} vs {d:?}"),
    }

    std::env::set_var("CUFLOW_DEVICE", "cuda:4096");
    assert!(matches!(
        Device::auto(),
        Err(DeviceError::NoDriver { .. } | DeviceError::NoDevice { .. })
    ));

    std::env::set_var("CUFLOW_DEVICE", "bogus");
    match Device::auto() {
        Err(DeviceError::BadDeviceSelector { value }) => assert_eq!(value, "bogus"),
        other => panic!("expected BadDeviceSelector, got {other:?}"),
    }
    assert!(matches!(
        Device::from_selector("bogus"),
        Err(DeviceError::BadDeviceSelector { .. })
    ));

    std::env::set_var("CUFLOW_DEVICE", "host");
    assert_eq!(Device::auto().expect("host"), Device::host());
    assert_eq!(Device::from_selector("host").expect("host"), Device::host());

    std::env::remove_var("CUFLOW_DEVICE");
    let unset = Device::auto().expect("auto without CUFLOW_DEVICE");
    match &gpu {
        Some(g) => assert_eq!(&unset, g),
        None => assert_eq!(unset, Device::host()),
    }

    if let Some(v) = before {
        std::env::set_var("CUFLOW_DEVICE", v);
    }
}

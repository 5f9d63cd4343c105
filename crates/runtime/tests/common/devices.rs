//! The devices of a multi-device test: those of `Device::auto()`'s backend (every visible CUDA
//! device under CUDA; `Device::host()` and `Device::host_numbered(1)` on the host backend),
//! checked against `CUFLOW_MIN_DEVICES`. Shared by the runtime's and the tensor crate's
//! multi-device tests.

#![allow(dead_code, unreachable_pub)]

use cuflow_runtime::{BackendKind, Device};

/// The devices of the backend under test (see the module docs). Fails when
/// `CUFLOW_MIN_DEVICES` asks for more than are visible.
pub fn devices() -> Vec<Device> {
    let first = Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable");
    let devices: Vec<Device> = match first.kind() {
        BackendKind::Cuda => (0..Device::cuda_count())
            .map(|i| Device::cuda(i).expect("a visible CUDA device must open"))
            .collect(),
        _ => vec![Device::host(), Device::host_numbered(1)],
    };
    if let Ok(min) = std::env::var("CUFLOW_MIN_DEVICES") {
        let min: usize = min
            .trim()
            .parse()
            .expect("CUFLOW_MIN_DEVICES must be a number of devices");
        assert!(
            devices.len() >= min,
            "CUFLOW_MIN_DEVICES={min} but only {} {} device(s) are visible",
            devices.len(),
            first.kind()
        );
    }
    devices
}

/// Two or more devices, or `None` (with a message) when fewer are visible and
/// `CUFLOW_MIN_DEVICES` does not require them.
pub fn two_devices() -> Option<Vec<Device>> {
    let devices = devices();
    if devices.len() >= 2 {
        return Some(devices);
    }
    // Straight to stderr, past the test harness's capture, so that the run shows it.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipped: needs 2 devices, {} visible (set CUFLOW_MIN_DEVICES=2 to require them)",
        devices.len()
    );
    None
}

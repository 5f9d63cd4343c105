//! The device under test, and the devices of a multi-device test.
//!
//! Every test takes its device from `Device::auto()`: the host backend where no GPU is present,
//! the device `CUFLOW_DEVICE=host|cuda|cuda:N` names otherwise. A device that was asked for and
//! cannot be had fails the test (a GPU run never passes silently on the host). The devices of a
//! multi-device test are those of the same backend: every visible CUDA device under CUDA,
//! `Device::host()` and `Device::host_numbered(1)` on the host backend. A test that needs two
//! and sees fewer skips with a message, unless `CUFLOW_MIN_DEVICES` requires them: then it
//! fails.

use std::io::Write;

use cuflow_runtime::{BackendKind, Device, DeviceError, Stream};

/// The device under test. Panics when the device `CUFLOW_DEVICE` selects is not usable.
pub fn device() -> Device {
    Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable")
}

/// A new stream of the device under test.
pub fn stream() -> Stream {
    device()
        .new_stream()
        .expect("a stream of the device under test")
}

/// `n` new streams of `device`.
pub fn new_streams(device: &Device, n: usize) -> Result<Vec<Stream>, DeviceError> {
    (0..n).map(|_| device.new_stream()).collect()
}

/// The devices of the backend under test (see the module docs). Panics when
/// `CUFLOW_MIN_DEVICES` asks for more than are visible.
pub fn devices() -> Vec<Device> {
    let first = device();
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
    skip(&format!(
        "needs 2 devices, {} visible (set CUFLOW_MIN_DEVICES=2 to require them)",
        devices.len()
    ));
    None
}

/// The first two devices of [`two_devices`], or `None` (with a message) under the same rule.
pub fn device_pair() -> Option<(Device, Device)> {
    let mut devices = two_devices()?.into_iter();
    Some((devices.next()?, devices.next()?))
}

/// Every ordered pair of distinct devices of `devices`.
pub fn pairs(devices: &[Device]) -> Vec<(Device, Device)> {
    let mut out = Vec::new();
    for a in devices {
        for b in devices.iter().filter(|b| *b != a) {
            out.push((a.clone(), b.clone()));
        }
    }
    out
}

/// Says that a test skips, and why: straight to stderr, past the test harness's capture, so
/// that the run shows it.
pub fn skip(why: &str) {
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
}

/// The devices of `n` ranks of the backend under test: host devices `0..n` on the host
/// backend, CUDA devices `0..n` under CUDA, or `None` (with a message) when fewer GPUs are
/// visible and `CUFLOW_MIN_DEVICES` does not require them (when it does, this panics).
///
/// Under CUDA the returned devices also hold this process's lock on groups of ranks until
/// they are dropped: one test's group runs at a time. NCCL's kernels (and the one-shot sums')
/// wait on the GPU for the other ranks, and a device-synchronizing call of another group
/// (NCCL's own setup, a module load) can then wait for them while their peers wait behind
/// it: two groups of ranks working at once on the same GPUs can deadlock, as NCCL's
/// documentation warns, so the tests, run on several threads, keep them apart.
pub fn rank_devices(n: usize) -> Option<RankDevices> {
    // On every backend, so that a test holding two groups at once (which would wait for
    // itself under CUDA) fails on the host too.
    assert!(
        !HOLDS_GROUP.get(),
        "this thread already holds the devices of a group of ranks: drop them (and the \
         communicators made of them) before taking those of another group"
    );
    let (devices, serial) = match device().kind() {
        BackendKind::Cuda => {
            let visible = devices();
            if visible.len() < n {
                skip(&format!(
                    "needs {n} CUDA devices, {} visible (set CUFLOW_MIN_DEVICES={n} to require them)",
                    visible.len()
                ));
                return None;
            }
            let serial = GROUPS
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            (visible.into_iter().take(n).collect(), Some(serial))
        }
        _ => ((0..n).map(Device::host_numbered).collect(), None),
    };
    HOLDS_GROUP.set(true);
    Some(RankDevices {
        devices,
        _serial: serial,
    })
}

thread_local! {
    /// Whether this thread holds the devices of a group of ranks ([`RankDevices`]).
    static HOLDS_GROUP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One group of ranks at a time in this process, on CUDA (see [`rank_devices`]).
static GROUPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The devices of a multi-rank test, from [`rank_devices`]: a slice of devices that, under
/// CUDA, holds the process's lock on groups of ranks until it is dropped.
#[derive(Debug)]
pub struct RankDevices {
    devices: Vec<Device>,
    _serial: Option<std::sync::MutexGuard<'static, ()>>,
}

impl Drop for RankDevices {
    fn drop(&mut self) {
        HOLDS_GROUP.set(false);
    }
}

impl std::ops::Deref for RankDevices {
    type Target = [Device];
    fn deref(&self) -> &[Device] {
        &self.devices
    }
}

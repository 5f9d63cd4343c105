//! Shared by the dist tests: the devices of N ranks, and running every rank on its own thread.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use cuflow_dist::Communicator;
use cuflow_runtime::{BackendKind, Device, DeviceError};
use cuflow_testing::device::{device, skip};

/// The devices of `n` ranks of the backend under test: host devices `0..n` on the host
/// backend, CUDA devices `0..n` under CUDA; `None` (with a message) when fewer are visible.
pub fn rank_devices(n: usize) -> Option<Vec<Device>> {
    let first = device();
    match first.kind() {
        BackendKind::Cuda => {
            if Device::cuda_count() < n {
                skip(&format!(
                    "needs {n} CUDA devices, {} visible",
                    Device::cuda_count()
                ));
                return None;
            }
            Some(
                (0..n)
                    .map(|i| Device::cuda(i).expect("a visible CUDA device"))
                    .collect(),
            )
        }
        _ => Some((0..n).map(Device::host_numbered).collect()),
    }
}

/// Communicators over `n` devices of the backend under test, waiting at most `timeout`.
pub fn communicators(n: usize, timeout: Duration) -> Option<Vec<Communicator>> {
    let devices = rank_devices(n)?;
    Some(Communicator::local_with_timeout(&devices, timeout).expect("local communicators"))
}

/// Runs `f` for every rank on its own thread; the results in rank order.
pub fn on_every_rank<R: Send>(
    comms: &[Communicator],
    f: impl Fn(&Communicator) -> Result<R, DeviceError> + Sync,
) -> Vec<Result<R, DeviceError>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

//! Shared by the dist tests: the devices of N ranks, and running every rank on its own thread.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use cuflow_dist::Communicator;
use cuflow_runtime::DeviceError;
use cuflow_testing::device::rank_devices;

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

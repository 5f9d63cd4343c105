//! Shared by the dist tests: the communicators of N ranks (`cuflow_testing::thread::on_each`
//! runs every rank on its own thread).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use cuflow_dist::Communicator;
use cuflow_testing::device::rank_devices;

/// Communicators over `n` devices of the backend under test, waiting at most `timeout`.
pub fn communicators(n: usize, timeout: Duration) -> Option<Vec<Communicator>> {
    let devices = rank_devices(n)?;
    Some(Communicator::local_with_timeout(&devices, timeout).expect("local communicators"))
}

//! Shared by the dist tests: the communicators of N ranks (`cuflow_testing::thread::on_each`
//! runs every rank on its own thread).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use cuflow_dist::Communicator;
use cuflow_testing::device::{rank_devices, RankDevices};

/// Communicators over `n` devices of the backend under test, waiting at most `timeout`; under
/// CUDA they hold the process's lock on groups of ranks until dropped (see
/// `cuflow_testing::device::rank_devices`).
pub fn communicators(n: usize, timeout: Duration) -> Option<Group> {
    let devices = rank_devices(n)?;
    let comms = Communicator::local_with_timeout(&devices, timeout).expect("local communicators");
    Some(Group {
        comms,
        _devices: devices,
    })
}

/// The communicators of one group of ranks, with the devices that hold its turn.
#[derive(Debug)]
pub struct Group {
    comms: Vec<Communicator>,
    _devices: RankDevices,
}

impl std::ops::Deref for Group {
    type Target = Vec<Communicator>;
    fn deref(&self) -> &Vec<Communicator> {
        &self.comms
    }
}

impl std::ops::DerefMut for Group {
    fn deref_mut(&mut self) -> &mut Vec<Communicator> {
        &mut self.comms
    }
}

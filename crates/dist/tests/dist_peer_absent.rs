//! A rank whose peer never makes its part of a small sum: the sum fails once the
//! communicator's timeout has passed, not after the default 300 s. On CUDA ranks of one
//! process a small `f32` sum goes through a one-shot kernel whose waits trap at that deadline
//! (a device fault); on the host backend the wait for the peer times out.
//!
//! One test in its own binary: on CUDA it faults the devices on purpose.

mod common;

use std::time::{Duration, Instant};

use common::communicators;
use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{all_reduce, ReduceOp};
use cuflow_runtime::{BackendKind, DeviceError};
use cuflow_tensor::api;
use cuflow_testing::thread::on_each;

#[test]
fn a_small_sum_without_its_peer_fails_after_the_communicators_timeout() {
    let timeout = Duration::from_secs(2);
    let Some(comms) = communicators(2, timeout) else {
        return;
    };
    let len = 1024;
    // One sum on both ranks first, so the ranks are set up and in step.
    for g in on_each(&comms, |c| {
        all_reduce(c, api::from_vec(vec![1.5f32; len], &[len]), ReduceOp::Sum)
            .sync_on(c.stream())?
            .to_host_vec()
    }) {
        assert_eq!(g.expect("a first sum"), vec![3.0; len]);
    }

    let c = &comms[0];
    let start = Instant::now();
    let alone = all_reduce(c, api::from_vec(vec![1.0f32; len], &[len]), ReduceOp::Sum)
        .sync_on(c.stream())
        .map(|y| y.len());
    let waited = start.elapsed();
    if c.device().kind() == BackendKind::Cuda {
        assert!(
            matches!(alone, Err(DeviceError::DeviceFaulted { .. })),
            "a one-shot sum without its peer: {alone:?}"
        );
    } else {
        assert!(
            matches!(alone, Err(DeviceError::Timeout { .. })),
            "a sum without its peer: {alone:?}"
        );
    }
    // Far from both the 2 s asked for and the 300 s default.
    assert!(
        waited < Duration::from_secs(100),
        "the sum failed after {waited:?}, not after the communicator's timeout of {timeout:?}"
    );
}

//! Ranks whose small sums disagree on the element count (a program that breaks the rule of the
//! same collectives in the same order): no rank gets `Ok` with a sum of parts of other lengths.
//! On the host backend the exchange sees the lengths differ; on CUDA ranks of one process,
//! whose small `f32` sums go through a one-shot kernel over peer memory, the kernel compares
//! the counts the ranks publish beside their flags and stops the device.
//!
//! One test in its own binary: on CUDA it faults the devices, so nothing else may run on them.

mod common;

use std::time::Duration;

use common::communicators;
use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{all_reduce, ReduceOp};
use cuflow_tensor::api;
use cuflow_testing::thread::on_each;

#[test]
fn small_sums_of_different_lengths_fail_on_every_rank() {
    let Some(comms) = communicators(2, Duration::from_secs(10)) else {
        return;
    };
    let got = on_each(&comms, |c| {
        let len = if c.rank() == 0 { 4096 } else { 2048 };
        all_reduce(c, api::from_vec(vec![1.0f32; len], &[len]), ReduceOp::Sum)
            .sync_on(c.stream())?
            .to_host_vec()
    });
    for (r, g) in got.iter().enumerate() {
        assert!(g.is_err(), "rank {r} summed parts of other lengths: {g:?}");
    }
}

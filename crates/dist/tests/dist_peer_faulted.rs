//! A rank whose peer's device faulted: its next small sum fails at once (naming the peer, or
//! with its own device's fault where the driver stops it too), instead of waiting for a rank
//! that will never arrive. (On CUDA ranks of one process, a small
//! `f32` sum goes through a one-shot kernel that writes into every peer's memory; once a peer's
//! device faulted, or was reset, that memory is gone.) On the host backend a kernel's failure
//! faults no device, and the lone rank's sum runs out of time waiting for its peer.
//!
//! One test in its own binary: it faults a device on purpose.

mod common;

use std::time::Duration;

use common::communicators;
use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{all_reduce, ReduceOp};
use cuflow_runtime::{BackendKind, DeviceError, Kernel, KernelArgs, LaunchConfig};
use cuflow_tensor::api;
use cuflow_testing::thread::on_each;

#[test]
fn a_small_sum_after_a_peer_faulted_fails_at_once() {
    let Some(comms) = communicators(2, Duration::from_secs(3)) else {
        return;
    };
    let len = 4096;
    // One sum on both ranks first, so the ranks are set up and in step.
    for g in on_each(&comms, |c| {
        all_reduce(c, api::from_vec(vec![1.0f32; len], &[len]), ReduceOp::Sum)
            .sync_on(c.stream())?
            .to_host_vec()
    }) {
        assert_eq!(g.expect("a first sum"), vec![2.0; len]);
    }
    // SAFETY: the kernel touches no memory; it stops the device on purpose.
    let trap = unsafe {
        Kernel::new(
            "dist_trap",
            r#"extern "C" __global__ void dist_trap() { __trap(); }"#,
        )
    }
    .with_host(|args| {
        Err(DeviceError::HostKernel {
            kernel: args.kernel_name().to_string(),
            reason: "the kernel stops on purpose".into(),
        })
    });
    let peer = comms[1].stream();
    let stopped = trap
        .launch(peer, LaunchConfig::linear(1, 1), &KernelArgs::new())
        .and_then(|()| peer.synchronize());
    assert!(stopped.is_err(), "the trap kernel failed: {stopped:?}");

    let c = &comms[0];
    let alone = all_reduce(c, api::from_vec(vec![1.0f32; len], &[len]), ReduceOp::Sum)
        .sync_on(c.stream())
        .map(|y| y.len());
    if c.device().kind() == BackendKind::Cuda {
        // Refused naming the peer, or, where the driver stops every device of the process
        // that can reach the faulted one's memory (NVIDIA's driver 580 does), failed with this
        // device's own fault: at once either way.
        assert!(
            matches!(&alone, Err(DeviceError::Collective { reason, .. }) if reason.contains("rank 1"))
                || matches!(&alone, Err(DeviceError::DeviceFaulted { .. })),
            "a sum with a faulted peer: {alone:?}"
        );
    } else {
        assert!(
            matches!(alone, Err(DeviceError::Timeout { .. })),
            "a sum without its peer: {alone:?}"
        );
    }
}

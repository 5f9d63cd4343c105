//! A rank whose peer never makes its part of a sum too large for the one-shot path: on CUDA
//! the call runs NCCL's own kernels, which wait without a deadline of their own. The call must
//! fail with a timeout once the communicator's timeout has passed (not hang), the device must
//! go on working, the communicator must refuse its later calls at once, and a new group of
//! communicators must work. On the host backend the transport's wait times out.
//!
//! One test in its own binary: on CUDA it aborts an NCCL communicator on purpose.

mod common;

use std::time::{Duration, Instant};

use common::communicators;
use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{all_reduce, ReduceOp};
use cuflow_runtime::{collective, CollectiveCall, DeviceBuffer, DeviceError};
use cuflow_tensor::api;
use cuflow_testing::rng::{fresh_seed, random_f32, seeded_rng};
use cuflow_testing::thread::on_each;

/// More elements than the one-shot path takes (16,384), so that CUDA ranks go through NCCL.
const LEN: usize = 1 << 16;

/// Every rank of `comms` sums `LEN` elements of `rank + 0.5`; each must get the sum.
fn sum_on_every_rank(comms: &[cuflow_dist::Communicator]) {
    let n = comms.len();
    let want: f32 = (0..n).map(|r| r as f32 + 0.5).sum();
    for (rank, got) in on_each(comms, |c| {
        all_reduce(
            c,
            api::from_vec(vec![c.rank() as f32 + 0.5; LEN], &[LEN]),
            ReduceOp::Sum,
        )
        .sync_on(c.stream())?
        .to_host_vec()
    })
    .into_iter()
    .enumerate()
    {
        let got = got.unwrap_or_else(|e| panic!("rank {rank}'s sum: {e}"));
        assert!(
            got.iter().all(|&v| v == want),
            "rank {rank}: expected every element {want}"
        );
    }
}

#[test]
fn a_large_sum_without_its_peer_times_out_and_the_device_goes_on() {
    let timeout = Duration::from_secs(2);
    {
        let Some(comms) = communicators(2, timeout) else {
            return;
        };
        // Both ranks first, so that the ranks are set up and in step.
        sum_on_every_rank(&comms);

        let c = &comms[0];
        let start = Instant::now();
        let alone = all_reduce(c, api::from_vec(vec![1.0f32; LEN], &[LEN]), ReduceOp::Sum)
            .sync_on(c.stream())
            .map(|y| y.len());
        let waited = start.elapsed();
        match &alone {
            Err(DeviceError::Timeout { what, .. }) => {
                assert!(what.contains("all_reduce"), "{what}");
            }
            other => panic!("a sum without its peer: {other:?}"),
        }
        assert!(
            waited >= timeout && waited < Duration::from_secs(100),
            "the sum failed after {waited:?}, not after the communicator's timeout of {timeout:?}"
        );

        // The device goes on: fresh values through the same stream come back intact.
        let values = random_f32(&mut seeded_rng(fresh_seed()), 4096);
        let back = api::from_vec(values.clone(), &[values.len()])
            .sync_on(c.stream())
            .and_then(|t| t.to_host_vec())
            .expect("work after the timed-out sum");
        assert_eq!(back, values);

        // The communicator refuses its next call at once.
        let start = Instant::now();
        let next = all_reduce(c, api::from_vec(vec![1.0f32; LEN], &[LEN]), ReduceOp::Sum)
            .sync_on(c.stream());
        assert!(
            matches!(next, Err(DeviceError::Collective { .. })),
            "the next call of a communicator whose call timed out: {next:?}"
        );
        assert!(
            start.elapsed() < timeout,
            "the refusal took {:?}",
            start.elapsed()
        );
        // Both ranks' communicators are dropped here, the peer's never having made the call.
    }
    // A new group works on the same devices.
    let Some(comms) = communicators(2, timeout) else {
        return;
    };
    sum_on_every_rank(&comms);

    // A group dropped while one rank's call waits for a peer that never comes: the drop
    // returns (under NCCL once the deadline has passed: it waits for the call, then gives up
    // on it), and the stream reports the failure (a timeout; on the host backend the peer's
    // drop is told to the rank at once).
    let stream = comms[0].stream().clone();
    let send = DeviceBuffer::from_host(&stream, &vec![1.0f32; LEN]).expect("send buffer");
    let recv = DeviceBuffer::from_host(&stream, &vec![0.0f32; LEN]).expect("recv buffer");
    collective(
        &stream,
        comms[0].comm(),
        &[CollectiveCall::all_reduce(
            send.view(),
            recv.view(),
            ReduceOp::Sum,
        )],
    )
    .expect("the call is enqueued");
    let start = Instant::now();
    drop(comms);
    let dropped = start.elapsed();
    assert!(
        dropped < Duration::from_secs(100),
        "dropping the group took {dropped:?}"
    );
    let synced = stream.synchronize();
    assert!(
        matches!(
            synced,
            Err(DeviceError::Timeout { .. } | DeviceError::Collective { .. })
        ),
        "the stream of a call whose group was dropped before its peer came: {synced:?}"
    );
}

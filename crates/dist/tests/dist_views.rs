//! Collectives of tensor views: a contiguous view moves its own elements (not its whole
//! buffer's), and a strided view is refused with an error that says how to fix it.

mod common;

use std::time::Duration;

use common::communicators;
use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{all_gather, all_reduce, broadcast, reduce_scatter, GroupCall, ReduceOp};
use cuflow_runtime::DeviceError;
use cuflow_tensor::api;
use cuflow_testing::rng::{fresh_seed, random_f32, seeded_rng};
use cuflow_testing::thread::on_each;

const TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn a_contiguous_view_moves_its_own_elements() {
    let seed = fresh_seed();
    let Some(comms) = communicators(2, TIMEOUT) else {
        return;
    };
    let data: Vec<Vec<f32>> = (0..2)
        .map(|r| random_f32(&mut seeded_rng(seed + r), 24))
        .collect();
    let got: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
        let x = api::from_slice(&data[c.rank()], &[6, 4]).sync_on(c.stream())?;
        // Rows 2 and 3: 8 elements from element 8 of the buffer.
        let rows = x.narrow(0, 2, 2)?;
        let sum = all_reduce(c, rows.clone(), ReduceOp::Sum).sync_on(c.stream())?;
        let gathered = all_gather(c, rows.clone()).sync_on(c.stream())?;
        let scattered = reduce_scatter(c, rows.clone(), ReduceOp::Sum).sync_on(c.stream())?;
        let sent = broadcast(c, rows, 1).sync_on(c.stream())?;
        Ok((
            sum.to_host_vec()?,
            gathered.to_host_vec()?,
            scattered.to_host_vec()?,
            sent.to_host_vec()?,
        ))
    });
    let rows = |r: usize| data[r][8..16].to_vec();
    let sum: Vec<f32> = (0..8).map(|i| rows(0)[i] + rows(1)[i]).collect();
    for (rank, g) in got.into_iter().enumerate() {
        let (s, gathered, scattered, sent) = g.unwrap();
        assert_eq!(s, sum, "all_reduce on rank {rank}");
        assert_eq!(
            gathered,
            [rows(0), rows(1)].concat(),
            "all_gather on rank {rank}"
        );
        assert_eq!(
            scattered,
            sum[rank * 4..(rank + 1) * 4],
            "reduce_scatter on rank {rank}"
        );
        assert_eq!(sent, rows(1), "broadcast on rank {rank}");
    }
}

#[test]
fn a_strided_view_is_refused_naming_contiguous() {
    let Some(comms) = communicators(1, TIMEOUT) else {
        return;
    };
    let c = &comms[0];
    let x = api::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
        .sync_on(c.stream())
        .unwrap();
    let t = x.transpose(0, 1).unwrap();
    let check = |e: DeviceError| {
        assert!(matches!(e, DeviceError::InvalidShape { .. }), "{e}");
        assert!(e.to_string().contains("contiguous"), "{e}");
    };
    check(
        all_reduce(c, t.clone(), ReduceOp::Sum)
            .sync_on(c.stream())
            .unwrap_err(),
    );
    check(all_gather(c, t.clone()).sync_on(c.stream()).unwrap_err());
    check(broadcast(c, t.clone(), 0).sync_on(c.stream()).unwrap_err());
    check(
        cuflow_dist::group(c, vec![GroupCall::AllReduce(t, ReduceOp::Max)])
            .sync_on(c.stream())
            .unwrap_err(),
    );
}

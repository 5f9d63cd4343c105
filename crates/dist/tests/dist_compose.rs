//! Collectives compose with then / zip!, order themselves against other streams' work, and
//! replay from a captured graph.

mod common;

use std::time::Duration;

use common::communicators;
use cuflow_device_op::{zip, DeviceOpExt};
use cuflow_dist::{all_gather, all_reduce, group, recv, GroupCall, ReduceOp};
use cuflow_graph_capture::GraphCaptureExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, kernels};
use cuflow_testing::measure::assert_close_in_norm;
use cuflow_testing::rng::{fresh_seed, random_f32, seeded_rng};
use cuflow_testing::thread::on_each;

const TIMEOUT: Duration = Duration::from_secs(30);

fn input(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    random_f32(&mut seeded_rng(seed.wrapping_add(rank as u64 * 7919)), len)
}

#[test]
fn collectives_compose_with_then_and_zip() {
    let seed = fresh_seed();
    let n = 2;
    let Some(comms) = communicators(n, TIMEOUT) else {
        return;
    };
    let a: Vec<Vec<f32>> = (0..n).map(|r| input(seed, r, 64)).collect();
    let b: Vec<Vec<f32>> = (0..n).map(|r| input(seed ^ 1, r, 64)).collect();
    let got: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
        let r = c.rank();
        // Lazy inputs, two collectives side by side, and a kernel after each.
        let left = all_reduce(c, api::from_slice(&a[r], &[64]), ReduceOp::Sum)
            .then(|t| kernels::scale(t, 2.0));
        let right = all_gather(c, api::from_slice(&b[r], &[64]));
        let (left, right) = zip!(left, right).sync_on(c.stream())?;
        Ok((left.to_host_vec()?, right.to_host_vec()?))
    });
    let want_left: Vec<f64> = (0..64)
        .map(|i| 2.0 * (f64::from(a[0][i]) + f64::from(a[1][i])))
        .collect();
    let want_right: Vec<f64> = b.concat().into_iter().map(f64::from).collect();
    for g in got {
        let (left, right) = g.unwrap();
        assert_close_in_norm("then", &left, &want_left, 1e-6);
        assert_close_in_norm("zip", &right, &want_right, 0.0);
    }
}

#[test]
fn a_collective_orders_itself_after_a_write_on_another_stream() {
    let seed = fresh_seed();
    let n = 2;
    let Some(comms) = communicators(n, TIMEOUT) else {
        return;
    };
    let parts: Vec<Vec<f32>> = (0..n).map(|r| input(seed, r, 4096)).collect();
    let got = on_each(&comms, |c| {
        let other = c.device().new_stream()?;
        let x = api::zeros::<f32>(&[4096]).sync_on(&other)?;
        let src = api::from_slice(&parts[c.rank()], &[4096]).sync_on(&other)?;
        // Written on `other` (not waited for), then reduced on the communicator's stream.
        x.buffer().copy_from(&other, src.buffer())?;
        all_reduce(c, x, ReduceOp::Sum)
            .sync_on(c.stream())?
            .to_host_vec()
    });
    let want: Vec<f64> = (0..4096)
        .map(|i| f64::from(parts[0][i]) + f64::from(parts[1][i]))
        .collect();
    for g in got {
        assert_close_in_norm("ordered all_reduce", &g.unwrap(), &want, 1e-6);
    }
}

#[test]
fn a_captured_step_with_an_all_reduce_replays() {
    let seed = fresh_seed();
    for n in [1, 2] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let steps = 3;
        let inputs: Vec<Vec<Vec<f32>>> = (0..steps)
            .map(|s| (0..n).map(|r| input(seed + s as u64, r, 32)).collect())
            .collect();
        let got: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
            let r = c.rank();
            let mut x = api::zeros::<f32>(&[32]).sync_on(c.stream())?;
            // The step: scale the input, all-reduce it. Captured once, the all-reduce not run.
            let step = all_reduce(c, kernels::scale(x.clone(), 3.0), ReduceOp::Sum);
            let mut graph = step.graph_on(c.stream().clone())?;
            let out = graph
                .take_output()
                .ok_or_else(|| DeviceError::usage("no output"))?;
            let mut results = Vec::new();
            for step in &inputs {
                let src = api::from_slice(&step[r], &[32]).sync_on(c.stream())?;
                graph.update(api::memcpy(&mut x, &src))?;
                graph.replay_and_wait()?;
                results.push(out.to_host_vec()?);
            }
            Ok(results)
        });
        for g in got {
            for (s, result) in g.unwrap().into_iter().enumerate() {
                let want: Vec<f64> = (0..32)
                    .map(|i| 3.0 * inputs[s].iter().map(|p| f64::from(p[i])).sum::<f64>())
                    .collect();
                assert_close_in_norm(&format!("replay {s} of {n} ranks"), &result, &want, 1e-6);
            }
        }
    }
}

/// Small sums, eager and replayed, on either side of the size below which CUDA ranks of one
/// process sum through each other's memory instead of NCCL (16,384 `f32`): every rank gets
/// the same bits, within f32 rounding of a float64 sum, and eager calls between replays keep
/// the ranks in step.
#[test]
fn small_all_reduces_agree_on_every_rank_eager_and_replayed() {
    let seed = fresh_seed();
    for n in [2, 4] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let sizes = [1usize, 5, 4096, 16_384, 16_385];
        let eager = on_each(&comms, |c| {
            sizes
                .iter()
                .map(|&len| {
                    let part = input(seed + len as u64, c.rank(), len);
                    let x = api::from_slice(&part, &[len]);
                    all_reduce(c, x, ReduceOp::Sum)
                        .sync_on(c.stream())?
                        .to_host_vec()
                })
                .collect::<Result<Vec<_>, _>>()
        });
        let eager: Vec<Vec<Vec<f32>>> = eager.into_iter().map(Result::unwrap).collect();
        for (k, &len) in sizes.iter().enumerate() {
            let parts: Vec<Vec<f32>> = (0..n).map(|r| input(seed + len as u64, r, len)).collect();
            let want: Vec<f64> = (0..len)
                .map(|i| parts.iter().map(|p| f64::from(p[i])).sum())
                .collect();
            for (r, got) in eager.iter().enumerate() {
                assert_close_in_norm(&format!("{len} on rank {r} of {n}"), &got[k], &want, 1e-6);
                assert_eq!(
                    got[k], eager[0][k],
                    "rank {r} of {n} differs from rank 0 at {len}"
                );
            }
        }

        // A step of three sums in a row, captured, replayed with new inputs, an eager sum
        // between replays.
        let (len, replays) = (4096, 4);
        let step_input = |s: usize, r: usize| input(seed ^ (s as u64 + 1) << 20, r, len);
        let replayed: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
            let r = c.rank();
            let mut x = api::zeros::<f32>(&[len]).sync_on(c.stream())?;
            let step = all_reduce(c, x.clone(), ReduceOp::Sum)
                .then(|y| all_reduce(c, y, ReduceOp::Sum))
                .then(|y| all_reduce(c, y, ReduceOp::Sum));
            let mut graph = step.graph_on(c.stream().clone())?;
            let out = graph
                .take_output()
                .ok_or_else(|| DeviceError::usage("no output"))?;
            let mut results = Vec::new();
            for s in 0..replays {
                let src = api::from_slice(&step_input(s, r), &[len]).sync_on(c.stream())?;
                graph.update(api::memcpy(&mut x, &src))?;
                graph.replay_and_wait()?;
                results.push(out.to_host_vec()?);
                let part = step_input(s + 100, r);
                let between = api::from_slice(&part, &[len]);
                results.push(
                    all_reduce(c, between, ReduceOp::Sum)
                        .sync_on(c.stream())?
                        .to_host_vec()?,
                );
            }
            Ok(results)
        });
        let replayed: Vec<Vec<Vec<f32>>> = replayed.into_iter().map(Result::unwrap).collect();
        let nf = n as f64;
        for s in 0..replays {
            let sum_of = |s: usize| -> Vec<f64> {
                let parts: Vec<Vec<f32>> = (0..n).map(|r| step_input(s, r)).collect();
                (0..len)
                    .map(|i| parts.iter().map(|p| f64::from(p[i])).sum())
                    .collect()
            };
            let want: Vec<f64> = sum_of(s).into_iter().map(|v| nf * nf * v).collect();
            let want_between = sum_of(s + 100);
            for (r, got) in replayed.iter().enumerate() {
                let what = format!("replay {s} on rank {r} of {n}");
                assert_close_in_norm(&what, &got[2 * s], &want, 1e-6);
                assert_close_in_norm(
                    &format!("{what}, eager after"),
                    &got[2 * s + 1],
                    &want_between,
                    1e-6,
                );
                assert_eq!(got[2 * s], replayed[0][2 * s], "{what} differs from rank 0");
            }
        }
    }
}

/// Small sums in groups beside other calls, against the same sums made alone on the other
/// rank: which way a small `f32` sum goes (the one-shot kernel of CUDA ranks in one process, or
/// NCCL) depends on the call, never on what else its group holds, and the group's other calls
/// proceed beside it, so none of these valid programs waits for ever:
/// - rank 0 groups a small sum with a send, rank 1 makes the sum alone, then the receive;
/// - rank 0 groups a large sum and a small one, rank 1 makes them one after the other;
/// - each rank groups the small sum with its half of a send/receive pair, in opposite orders.
#[test]
fn small_sums_grouped_with_other_calls_pair_with_the_same_sums_made_alone() {
    let seed = fresh_seed();
    let Some(comms) = communicators(2, TIMEOUT) else {
        return;
    };
    let (small, large) = (4096usize, 16_385usize);
    let part = |what: u64, r: usize, len: usize| input(seed ^ what << 24, r, len);
    let sum_of = |what: u64, len: usize| -> Vec<f64> {
        let (a, b) = (part(what, 0, len), part(what, 1, len));
        a.iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) + f64::from(*y))
            .collect()
    };
    let got: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
        let r = c.rank();
        let t = |what: u64, len: usize| api::from_vec(part(what, r, len), &[len]);
        let mut out = Vec::new();
        // A small sum and a send in one group, against the sum and then the receive.
        if r == 0 {
            let calls = vec![
                GroupCall::AllReduce(t(1, small).sync_on(c.stream())?, ReduceOp::Sum),
                GroupCall::Send(t(2, 64).sync_on(c.stream())?, 1),
            ];
            let g = group(c, calls).sync_on(c.stream())?;
            out.push(g[0].to_host_vec()?);
        } else {
            let y = all_reduce(c, t(1, small), ReduceOp::Sum)
                .then(|y| recv::<f32>(c, &[64], 0).map(|got| (y, got)))
                .sync_on(c.stream())?;
            out.push(y.0.to_host_vec()?);
            out.push(y.1.to_host_vec()?);
        }
        // A large sum and a small one in one group, against the two made one after the other.
        if r == 0 {
            let calls = vec![
                GroupCall::AllReduce(t(3, large).sync_on(c.stream())?, ReduceOp::Sum),
                GroupCall::AllReduce(t(4, small).sync_on(c.stream())?, ReduceOp::Sum),
            ];
            let g = group(c, calls).sync_on(c.stream())?;
            out.push(g[0].to_host_vec()?);
            out.push(g[1].to_host_vec()?);
        } else {
            let (a, b) = all_reduce(c, t(3, large), ReduceOp::Sum)
                .then(|a| all_reduce(c, t(4, small), ReduceOp::Sum).map(|b| (a, b)))
                .sync_on(c.stream())?;
            out.push(a.to_host_vec()?);
            out.push(b.to_host_vec()?);
        }
        // The small sum first on one rank, last on the other, each beside its half of a pair.
        let sum = GroupCall::AllReduce(t(5, small).sync_on(c.stream())?, ReduceOp::Sum);
        let calls = if r == 0 {
            vec![GroupCall::Send(t(6, 64).sync_on(c.stream())?, 1), sum]
        } else {
            vec![sum, GroupCall::Recv(vec![64], 0)]
        };
        let g = group(c, calls).sync_on(c.stream())?;
        let at = if r == 0 { 1 } else { 0 };
        out.push(g[at].to_host_vec()?);
        if r == 1 {
            out.push(g[1].to_host_vec()?);
        }
        Ok(out)
    });
    let (g0, g1) = match &got[..] {
        [Ok(a), Ok(b)] => (a, b),
        other => panic!("a rank failed: {other:?}"),
    };
    let sums = [(1, small), (3, large), (4, small), (5, small)];
    let rank0 = [&g0[0], &g0[1], &g0[2], &g0[3]];
    let rank1 = [&g1[0], &g1[2], &g1[3], &g1[4]];
    for (k, &(what, len)) in sums.iter().enumerate() {
        let want = sum_of(what, len);
        assert_close_in_norm(&format!("sum {what} on rank 0"), rank0[k], &want, 1e-6);
        assert_close_in_norm(&format!("sum {what} on rank 1"), rank1[k], &want, 1e-6);
        assert_eq!(rank0[k], rank1[k], "sum {what}: the ranks differ");
    }
    assert_eq!(g1[1], part(2, 0, 64), "the first send");
    assert_eq!(g1[5], part(6, 0, 64), "the second send");
}

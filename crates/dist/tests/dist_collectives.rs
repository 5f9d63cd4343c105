//! Every collective against a float64 reference, with 1, 2 and 4 ranks in one process.

mod common;

use std::time::Duration;

use common::communicators;
use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{
    all_gather, all_reduce, broadcast, group, recv, reduce_scatter, send, GroupCall, ReduceOp,
};
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, Tensor};
use cuflow_testing::measure::assert_close_in_norm;
use cuflow_testing::rng::{fresh_seed, random_f32, seeded_rng};
use cuflow_testing::thread::on_each;

const TIMEOUT: Duration = Duration::from_secs(30);
const LEN: usize = 96;

/// Rank `r`'s input: fresh random values, the same for a given seed and rank on every rank.
fn input(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    random_f32(&mut seeded_rng(seed.wrapping_add(rank as u64 * 7919)), len)
}

fn reference(op: ReduceOp, parts: &[Vec<f32>]) -> Vec<f64> {
    let n = parts.len();
    (0..parts[0].len())
        .map(|i| {
            let xs = parts.iter().map(|p| f64::from(p[i]));
            match op {
                ReduceOp::Sum => xs.sum(),
                ReduceOp::Avg => xs.sum::<f64>() / n as f64,
                ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
                _ => unreachable!(),
            }
        })
        .collect()
}

fn tensor(
    comm: &cuflow_dist::Communicator,
    data: &[f32],
    shape: &[usize],
) -> Result<Tensor<f32>, DeviceError> {
    api::from_slice(data, shape).sync_on(comm.stream())
}

#[test]
fn all_reduce_matches_the_reference_for_every_op_and_world_size() {
    let seed = fresh_seed();
    for n in [1, 2, 4] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let parts: Vec<Vec<f32>> = (0..n).map(|r| input(seed, r, LEN)).collect();
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
            let got = on_each(&comms, |c| {
                let x = tensor(c, &parts[c.rank()], &[8, LEN / 8])?;
                let y = all_reduce(c, x, op).sync_on(c.stream())?;
                assert_eq!(y.shape(), &[8, LEN / 8]);
                y.to_host_vec()
            });
            let want = reference(op, &parts);
            for (rank, g) in got.into_iter().enumerate() {
                let g = g.unwrap();
                assert_close_in_norm(
                    &format!("all_reduce {op:?}, rank {rank} of {n}"),
                    &g,
                    &want,
                    1e-6,
                );
            }
        }
    }
}

#[test]
fn integer_all_reduce_is_exact() {
    for n in [1, 2, 4] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let got = on_each(&comms, |c| {
            let r = c.rank() as i32;
            let x = api::from_vec((0..10).map(|i| i * (r + 1) - r).collect(), &[10])
                .sync_on(c.stream())?;
            all_reduce(c, x, ReduceOp::Sum)
                .sync_on(c.stream())?
                .to_host_vec()
        });
        let want: Vec<i32> = (0..10)
            .map(|i| (0..n as i32).map(|r| i * (r + 1) - r).sum())
            .collect();
        for g in got {
            assert_eq!(g.unwrap(), want);
        }
    }
}

#[test]
fn an_average_of_bytes_over_more_ranks_than_a_byte_counts_divides_by_the_world_size() {
    // 256 and 257 ranks: the world size itself does not fit in a u8. The sum wraps as a u8
    // sum does (under NCCL too), and is then divided by the world size.
    for n in [256, 257] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let part = |r: usize| -> Vec<u8> { vec![1, 255, (r % 256) as u8, (r * 7 % 256) as u8] };
        let got: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
            let x = api::from_vec(part(c.rank()), &[4]).sync_on(c.stream())?;
            let sum = all_reduce(c, x.clone(), ReduceOp::Sum).sync_on(c.stream())?;
            let avg = all_reduce(c, x, ReduceOp::Avg).sync_on(c.stream())?;
            Ok((sum.to_host_vec()?, avg.to_host_vec()?))
        });
        let sum: Vec<u8> = (0..4)
            .map(|i| (0..n).fold(0u8, |acc, r| acc.wrapping_add(part(r)[i])))
            .collect();
        let avg: Vec<u8> = sum.iter().map(|&s| (usize::from(s) / n) as u8).collect();
        assert!(sum.iter().any(|&s| s != 0), "{sum:?}");
        for (rank, g) in got.into_iter().enumerate() {
            let (got_sum, got_avg) = g.unwrap_or_else(|e| panic!("rank {rank} of {n} failed: {e}"));
            assert_eq!(got_sum, sum, "the sum on rank {rank} of {n}");
            assert_eq!(got_avg, avg, "the average on rank {rank} of {n}");
        }
    }
}

#[test]
fn all_gather_concatenates_along_axis_0_in_rank_order() {
    let seed = fresh_seed();
    for n in [1, 2, 4] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let parts: Vec<Vec<f32>> = (0..n).map(|r| input(seed, r, 12)).collect();
        let got = on_each(&comms, |c| {
            let y = all_gather(c, tensor(c, &parts[c.rank()], &[3, 4])?).sync_on(c.stream())?;
            assert_eq!(y.shape(), &[3 * n, 4]);
            y.to_host_vec()
        });
        let want: Vec<f64> = parts.concat().into_iter().map(f64::from).collect();
        for g in got {
            assert_close_in_norm("all_gather", &g.unwrap(), &want, 0.0);
        }
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_part_of_the_reduction() {
    let seed = fresh_seed();
    for n in [1, 2, 4] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let parts: Vec<Vec<f32>> = (0..n).map(|r| input(seed, r, 6 * n)).collect();
        let got = on_each(&comms, |c| {
            let x = tensor(c, &parts[c.rank()], &[2 * n, 3])?;
            let y = reduce_scatter(c, x, ReduceOp::Sum).sync_on(c.stream())?;
            assert_eq!(y.shape(), &[2, 3]);
            y.to_host_vec()
        });
        let full = reference(ReduceOp::Sum, &parts);
        for (rank, g) in got.into_iter().enumerate() {
            assert_close_in_norm(
                "reduce_scatter",
                &g.unwrap(),
                &full[rank * 6..(rank + 1) * 6],
                1e-6,
            );
        }
    }
}

#[test]
fn broadcast_copies_the_root_to_every_rank() {
    let seed = fresh_seed();
    for n in [1, 2, 4] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let root = n - 1;
        let parts: Vec<Vec<f32>> = (0..n).map(|r| input(seed, r, 20)).collect();
        let got = on_each(&comms, |c| {
            broadcast(c, tensor(c, &parts[c.rank()], &[20])?, root)
                .sync_on(c.stream())?
                .to_host_vec()
        });
        for g in got {
            assert_eq!(g.unwrap(), parts[root]);
        }
    }
}

#[test]
fn send_and_recv_pair_up_and_a_group_shifts_a_ring() {
    let seed = fresh_seed();
    for n in [2, 4] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let parts: Vec<Vec<f32>> = (0..n).map(|r| input(seed, r, 10)).collect();
        // Rank 0 sends to the last rank, alone.
        let got = on_each(&comms, |c| match c.rank() {
            0 => send(c, tensor(c, &parts[0], &[10])?, n - 1)
                .sync_on(c.stream())?
                .to_host_vec(),
            r if r == n - 1 => recv::<f32>(c, &[10], 0).sync_on(c.stream())?.to_host_vec(),
            _ => Ok(Vec::new()),
        });
        assert_eq!(got[n - 1].as_ref().unwrap(), &parts[0]);
        // Every rank sends right and receives from the left in one group, beside an all-reduce.
        let got: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
            let r = c.rank();
            let mine = tensor(c, &parts[r], &[10])?;
            let calls = vec![
                GroupCall::Recv(vec![10], (r + n - 1) % n),
                GroupCall::AllReduce(mine.clone(), ReduceOp::Max),
                GroupCall::Send(mine, (r + 1) % n),
            ];
            let out = group(c, calls).sync_on(c.stream())?;
            Ok((out[0].to_host_vec()?, out[1].to_host_vec()?))
        });
        let max = reference(ReduceOp::Max, &parts);
        for (r, g) in got.into_iter().enumerate() {
            let (received, reduced) = g.unwrap();
            assert_eq!(received, parts[(r + n - 1) % n]);
            assert_close_in_norm("group all_reduce", &reduced, &max, 0.0);
        }
    }
}

/// A call this rank refuses (a length that does not split, a send to itself, a root outside
/// the world, a tensor of another rank's device) is an error naming what is wrong, and it
/// breaks the communicator: its peers may have enqueued their part of it, so this rank's next
/// collective is refused rather than paired with theirs.
#[test]
fn mismatched_lengths_and_bad_peers_are_errors() {
    type Case = fn(&[cuflow_dist::Communicator]) -> DeviceError;
    type Says = fn(&DeviceError) -> bool;
    let cases: [(Case, Says); 4] = [
        (
            |comms| {
                let c = &comms[0];
                let x = tensor(c, &[1.0; 5], &[5]).unwrap();
                reduce_scatter(c, x, ReduceOp::Sum)
                    .sync_on(c.stream())
                    .unwrap_err()
            },
            |e| {
                matches!(
                    e,
                    DeviceError::InvalidShape {
                        op: "reduce_scatter",
                        ..
                    }
                )
            },
        ),
        (
            |comms| {
                let c = &comms[0];
                let x = tensor(c, &[1.0; 5], &[5]).unwrap();
                send(c, x, 0).sync_on(c.stream()).unwrap_err()
            },
            |e| e.to_string().contains("is this rank itself"),
        ),
        (
            |comms| {
                let c = &comms[0];
                let x = tensor(c, &[1.0; 5], &[5]).unwrap();
                broadcast(c, x, 2).sync_on(c.stream()).unwrap_err()
            },
            |e| e.to_string().contains("not a rank of this world of 2"),
        ),
        (
            |comms| {
                // A tensor of another rank's device.
                let other = tensor(&comms[1], &[1.0; 5], &[5]).unwrap();
                all_reduce(&comms[0], other, ReduceOp::Sum)
                    .sync_on(comms[0].stream())
                    .unwrap_err()
            },
            |e| matches!(e, DeviceError::DeviceMismatch { .. }),
        ),
    ];
    for (refused, says) in cases {
        let Some(comms) = communicators(2, TIMEOUT) else {
            return;
        };
        let e = refused(&comms);
        assert!(says(&e), "{e}");
        let c = &comms[0];
        let next = all_reduce(c, tensor(c, &[1.0; 4], &[4]).unwrap(), ReduceOp::Sum)
            .sync_on(c.stream())
            .unwrap_err();
        assert!(
            next.to_string().contains("make a new communicator"),
            "after {e}: {next}"
        );
    }
}

#[test]
fn a_rank_that_never_arrives_is_a_timeout() {
    if cuflow_testing::device::device().kind() != cuflow_runtime::BackendKind::Host {
        // On CUDA this small sum takes the one-shot path, which faults the device at its
        // deadline (`dist_peer_absent`); a sum through NCCL times out (`dist_deadline`).
        cuflow_testing::device::skip("host backend only: see dist_peer_absent and dist_deadline");
        return;
    }
    let Some(comms) = communicators(2, Duration::from_millis(200)) else {
        return;
    };
    let c = &comms[0];
    let x = tensor(c, &[1.0; 4], &[4]).unwrap();
    let e = all_reduce(c, x, ReduceOp::Sum)
        .sync_on(c.stream())
        .unwrap_err();
    match &e {
        DeviceError::Timeout { what, waited_ms } => {
            assert!(
                what.contains("all_reduce") && what.contains("rank 1"),
                "{e}"
            );
            assert_eq!(*waited_ms, 200);
        }
        other => panic!("expected a timeout, got {other}"),
    }
    // The ranks are out of step now: the next collective fails at once, saying why.
    let x = tensor(c, &[1.0; 4], &[4]).unwrap();
    let e = all_reduce(c, x, ReduceOp::Sum)
        .sync_on(c.stream())
        .unwrap_err();
    assert!(
        matches!(&e, DeviceError::Collective { reason, .. } if reason.contains("make a new communicator")),
        "{e}"
    );
}

#[test]
fn nccl_is_found_or_its_absence_is_a_clear_error() {
    match cuflow_runtime::Comm::nccl_unique_id() {
        Ok(id) => assert_eq!(id.len(), 128),
        Err(e) => {
            assert!(matches!(e, DeviceError::NoNccl { .. }), "{e}");
            let text = e.to_string();
            assert!(
                text.contains("CUFLOW_NCCL_LIB") && text.contains("libnccl.so.2"),
                "{text}"
            );
        }
    }
}

/// A float max or min skips a NaN wherever it sits, as NCCL's (`fmaxf` / `fminf`, `__hmax` /
/// `__hmin`): the answer is the max or min of the numbers, NaN only where every rank holds
/// NaN, and the same whichever rank holds it.
#[test]
fn a_nan_in_a_float_max_or_min_is_skipped_on_every_rank_position() {
    for n in [2, 4] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        for nan_rank in 0..n {
            // Element 0 is a number everywhere, element 1 NaN on `nan_rank` only, element 2
            // NaN everywhere.
            let part = |r: usize| -> Vec<f32> {
                let v = r as f32 + 1.0;
                vec![v, if r == nan_rank { f32::NAN } else { -v }, f32::NAN]
            };
            for op in [ReduceOp::Max, ReduceOp::Min] {
                let got = on_each(&comms, |c| {
                    let x = tensor(c, &part(c.rank()), &[3])?;
                    all_reduce(c, x, op).sync_on(c.stream())?.to_host_vec()
                });
                let numbers = |i: usize| (0..n).map(move |r| part(r)[i]).filter(|v| !v.is_nan());
                let pick = |i: usize| match op {
                    ReduceOp::Max => numbers(i).fold(f32::NEG_INFINITY, f32::max),
                    _ => numbers(i).fold(f32::INFINITY, f32::min),
                };
                for (rank, g) in got.into_iter().enumerate() {
                    let g = g.unwrap_or_else(|e| panic!("rank {rank} of {n} failed: {e}"));
                    let what = format!("{op:?} with NaN on rank {nan_rank}, rank {rank} of {n}");
                    assert_eq!(g[..2], [pick(0), pick(1)], "{what}");
                    assert!(g[2].is_nan(), "{what}: NaN everywhere gave {}", g[2]);
                }
            }
        }
    }
}

/// `gather_words` hands every rank every rank's words in rank order, whatever the backend (the
/// ranks of one process exchange through the host), again and again.
#[test]
fn gather_words_gives_every_rank_the_words_of_all_in_rank_order() {
    for n in [1, 2, 4] {
        let Some(comms) = communicators(n, TIMEOUT) else {
            continue;
        };
        let got = on_each(&comms, |c| {
            (0..3u32)
                .map(|round| c.gather_words(&[c.rank() as u32, round, 7]))
                .collect::<Result<Vec<_>, _>>()
        });
        for (rank, g) in got.into_iter().enumerate() {
            for (round, words) in g.expect("every gather").into_iter().enumerate() {
                let want: Vec<u32> = (0..n as u32).flat_map(|r| [r, round as u32, 7]).collect();
                assert_eq!(words, want, "rank {rank}, round {round}");
            }
        }
    }
}

/// A rank that never gathers fails its peer's gather by the communicator's deadline, without
/// a device involved; the ranks are out of step from then on, so every later gather of either
/// fails at once; ranks giving different numbers of words both fail, naming the counts.
#[test]
fn gathers_that_do_not_pair_fail_on_every_rank() {
    let short = Duration::from_millis(300);
    let Some(comms) = communicators(2, short) else {
        return;
    };
    let done = std::sync::Barrier::new(2);
    let got = on_each(&comms, |c| {
        let (first, second) = match c.rank() {
            0 => {
                let first = c.gather_words(&[1]);
                (first, c.gather_words(&[2]))
            }
            _ => (Ok(Vec::new()), Ok(Vec::new())),
        };
        done.wait();
        let late = c.gather_words(&[3]);
        (first, second, late)
    });
    let (first, second, late) = &got[0];
    assert!(
        matches!(first, Err(DeviceError::Timeout { .. })),
        "{first:?}"
    );
    assert!(
        matches!(second, Err(DeviceError::Collective { .. })),
        "{second:?}"
    );
    assert!(late.is_err(), "{late:?}");
    let late = &got[1].2;
    assert!(late.is_err(), "rank 1's late gather: {late:?}");
    // One group at a time: this one goes before the next is made.
    drop(comms);

    let Some(comms) = communicators(2, TIMEOUT) else {
        return;
    };
    let got = on_each(&comms, |c| c.gather_words(&vec![0; 1 + c.rank()]));
    for g in got {
        let e = g.expect_err("different word counts").to_string();
        assert!(e.contains("words"), "{e}");
    }
}

/// An average of floats near the type's largest value stays finite: the parts are scaled by
/// `1/n` before they are summed, as NCCL's average of floats does, not summed past the
/// largest value first.
#[test]
fn an_average_of_the_largest_floats_is_the_largest_float() {
    let Some(comms) = communicators(2, TIMEOUT) else {
        return;
    };
    let got = on_each(&comms, |c| {
        let x = tensor(c, &[f32::MAX, -f32::MAX, 1.0, 3.0], &[4])?;
        all_reduce(c, x, ReduceOp::Avg)
            .sync_on(c.stream())?
            .to_host_vec()
    });
    for (rank, g) in got.into_iter().enumerate() {
        assert_eq!(
            g.unwrap(),
            vec![f32::MAX, -f32::MAX, 1.0, 3.0],
            "rank {rank}"
        );
    }
}

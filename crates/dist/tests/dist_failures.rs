//! How the host backend's collectives fail when the ranks disagree: every rank gets an error
//! (never a hang, never an `Ok` carrying another collective's data).

mod common;

use std::time::Duration;

use common::communicators;
use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{
    all_gather, all_reduce, broadcast, group, recv, reduce_scatter, send, Communicator, GroupCall,
    ReduceOp,
};
use cuflow_runtime::{BackendKind, DeviceError};
use cuflow_tensor::{api, Tensor};
use cuflow_testing::rng::{fresh_seed, random_f32, seeded_rng};
use cuflow_testing::thread::on_each;

const SHORT: Duration = Duration::from_millis(300);

/// The host backend's communicators of `n` ranks, or `None` (with a note) on other backends:
/// NCCL does not check that the ranks' calls agree (disagreeing ranks wait there until the
/// communicator's timeout, or mix their data).
fn host_communicators(n: usize) -> Option<common::Group> {
    if cuflow_testing::device::device().kind() != BackendKind::Host {
        cuflow_testing::device::skip(
            "host backend only: NCCL does not check that the ranks' calls agree",
        );
        return None;
    }
    communicators(n, SHORT)
}

fn tensor(c: &Communicator, data: &[f32]) -> Result<Tensor<f32>, DeviceError> {
    api::from_slice(data, &[data.len()]).sync_on(c.stream())
}

#[test]
fn a_length_mismatch_leaves_no_stale_message_for_the_next_collective() {
    let Some(comms) = host_communicators(3) else {
        return;
    };
    let seed = fresh_seed();
    // Rank 0 reduces 4 elements, ranks 1 and 2 reduce 8: every rank fails.
    let first = on_each(&comms, |c| {
        let len = if c.rank() == 0 { 4 } else { 8 };
        let x = tensor(c, &random_f32(&mut seeded_rng(seed + c.rank() as u64), len))?;
        all_reduce(c, x, ReduceOp::Sum)
            .sync_on(c.stream())?
            .to_host_vec()
    });
    for (rank, r) in first.iter().enumerate() {
        assert!(
            r.is_err(),
            "rank {rank}: the mismatched all_reduce succeeded"
        );
    }
    // The ranks agree now, but the first all_reduce left messages behind: no rank may take
    // them for this one's.
    let second = on_each(&comms, |c| {
        let x = tensor(c, &[c.rank() as f32 + 1.0; 8])?;
        all_reduce(c, x, ReduceOp::Sum)
            .sync_on(c.stream())?
            .to_host_vec()
    });
    for (rank, r) in second.iter().enumerate() {
        match r {
            Ok(v) => assert_eq!(
                v,
                &vec![6.0f32; 8],
                "rank {rank} got another collective's data"
            ),
            Err(e) => assert!(
                e.to_string().contains("make a new communicator"),
                "rank {rank}: {e}"
            ),
        }
    }
}

#[test]
fn ranks_calling_different_collectives_fail_on_every_rank_naming_the_order() {
    let Some(comms) = host_communicators(2) else {
        return;
    };
    let got = on_each(&comms, |c| {
        let x = tensor(c, &[1.0; 4])?;
        if c.rank() == 0 {
            all_reduce(c, x, ReduceOp::Sum)
                .sync_on(c.stream())?
                .to_host_vec()
        } else {
            all_gather(c, x).sync_on(c.stream())?.to_host_vec()
        }
    });
    for (rank, r) in got.iter().enumerate() {
        let e = r.as_ref().expect_err("disagreeing ranks succeeded");
        // The first rank to time out tells the other, which fails at once with its reason.
        assert!(
            matches!(
                e,
                DeviceError::Timeout { .. } | DeviceError::Collective { .. }
            ),
            "rank {rank}: {e}"
        );
        assert!(
            e.to_string().contains("in the same order"),
            "rank {rank}: {e}"
        );
    }
}

#[test]
fn one_rank_alone_reduces_to_its_own_input() {
    let Some(comms) = host_communicators(1) else {
        return;
    };
    let c = &comms[0];
    let data = random_f32(&mut seeded_rng(fresh_seed()), 5);
    let got = all_reduce(c, tensor(c, &data).unwrap(), ReduceOp::Avg)
        .sync_on(c.stream())
        .and_then(|t| t.to_host_vec())
        .unwrap();
    assert_eq!(got, data);
}

#[test]
fn a_communicator_dropped_while_its_collective_waits_still_completes_it() {
    let Some(mut comms) = host_communicators(2) else {
        return;
    };
    let c1 = comms.pop().unwrap();
    let c0 = comms.pop().unwrap();
    let stream = c0.stream().clone();
    let x = cuflow_runtime::DeviceBuffer::from_host(&stream, &[1.0f32, 2.0]).unwrap();
    let y = cuflow_runtime::DeviceBuffer::<f32>::alloc(&stream, 2).unwrap();
    let call = cuflow_runtime::CollectiveCall::all_reduce(x.view(), y.view(), ReduceOp::Sum);
    cuflow_runtime::collective(&stream, c0.comm(), &[call]).unwrap();
    // Rank 0's communicator goes while its all_reduce waits for rank 1.
    drop(c0);
    let x1 = tensor(&c1, &[10.0, 20.0]).unwrap();
    let got1 = all_reduce(&c1, x1, ReduceOp::Sum)
        .sync_on(c1.stream())
        .unwrap();
    assert_eq!(got1.to_host_vec().unwrap(), vec![11.0, 22.0]);
    assert_eq!(y.to_host_vec(&stream).unwrap(), vec![11.0, 22.0]);
}

#[test]
fn a_graph_replayed_on_one_rank_only_times_out_there() {
    use cuflow_graph_capture::GraphCaptureExt;
    let Some(comms) = host_communicators(2) else {
        return;
    };
    let got: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
        let x = tensor(c, &[c.rank() as f32 + 1.0; 4])?;
        let mut graph = all_reduce(c, x, ReduceOp::Sum).graph_on(c.stream().clone())?;
        let out = graph
            .take_output()
            .ok_or_else(|| DeviceError::usage("no output"))?;
        graph.replay_and_wait()?;
        let first = out.to_host_vec()?;
        // Rank 0 replays once more, alone.
        let again = if c.rank() == 0 {
            Some(graph.replay_and_wait())
        } else {
            None
        };
        Ok((first, again))
    });
    for (rank, r) in got.into_iter().enumerate() {
        let (first, again) = r.unwrap();
        assert_eq!(first, vec![3.0; 4], "rank {rank}");
        if let Some(again) = again {
            let e = again.expect_err("a replay on one rank alone succeeded");
            assert!(matches!(e, DeviceError::Timeout { .. }), "{e}");
            assert!(e.to_string().contains("same order"), "{e}");
        }
    }
}

#[test]
fn a_rank_that_retries_after_its_peer_failed_gets_an_error_not_stale_data() {
    let Some(comms) = host_communicators(2) else {
        return;
    };
    // Rank 0's reduce_scatter is refused before it sends anything, which breaks its
    // communicator and tells rank 1: rank 1's fails at once instead of timing out.
    let first = on_each(&comms, |c| {
        let len = if c.rank() == 0 { 3 } else { 4 };
        let x = tensor(c, &vec![c.rank() as f32 + 1.0; len])?;
        reduce_scatter(c, x, ReduceOp::Sum)
            .sync_on(c.stream())?
            .to_host_vec()
    });
    assert!(
        matches!(first[0], Err(DeviceError::InvalidShape { .. })),
        "{:?}",
        first[0]
    );
    assert!(
        matches!(&first[1], Err(DeviceError::Collective { reason, .. })
            if reason.contains("rank 0 gave up this call")),
        "{:?}",
        first[1]
    );
    // Rank 0 fixes its input and tries again; rank 1 is long gone from that reduce_scatter,
    // so its part still waiting at rank 0 must not be taken for this one's.
    let c = &comms[0];
    let x = tensor(c, &[5.0; 4]).unwrap();
    let got = reduce_scatter(c, x, ReduceOp::Sum)
        .sync_on(c.stream())
        .and_then(|t| t.to_host_vec());
    let e = got.expect_err("rank 0 reduced rank 1's part of a collective that failed there");
    assert!(e.to_string().contains("make a new communicator"), "{e}");
}

#[test]
fn a_timeout_past_the_clocks_range_waits_instead_of_panicking() {
    let Some(devices) = cuflow_testing::device::rank_devices(2) else {
        return;
    };
    // `Duration::MAX` reads as "wait as long as it takes": no deadline is representable.
    let comms = Communicator::local_with_timeout(&devices, Duration::MAX).unwrap();
    let got = on_each(&comms, |c| {
        let x = tensor(c, &[c.rank() as f32 + 1.0; 3])?;
        all_reduce(c, x, ReduceOp::Sum)
            .sync_on(c.stream())?
            .to_host_vec()
    });
    for (rank, r) in got.into_iter().enumerate() {
        assert_eq!(r.unwrap(), vec![3.0; 3], "rank {rank}");
    }
}

/// Every rank's result of `f` failed with a [`DeviceError::Collective`] that says `says`.
fn assert_every_rank_fails_saying<R: std::fmt::Debug>(
    got: &[Result<R, DeviceError>],
    says: &[&str],
) {
    for (rank, r) in got.iter().enumerate() {
        let e = r.as_ref().expect_err("disagreeing ranks succeeded");
        assert!(
            matches!(e, DeviceError::Collective { .. }),
            "rank {rank}: {e}"
        );
        for s in says {
            assert!(e.to_string().contains(s), "rank {rank}: {e}");
        }
    }
}

#[test]
fn ranks_broadcasting_from_different_roots_fail_and_leave_no_stale_data() {
    let Some(comms) = host_communicators(2) else {
        return;
    };
    // Each rank takes itself for the root: neither may keep its own values as the broadcast.
    let first = on_each(&comms, |c| {
        let x = tensor(c, &[c.rank() as f32 + 1.0; 4])?;
        broadcast(c, x, c.rank()).sync_on(c.stream())?.to_host_vec()
    });
    assert_every_rank_fails_saying(&first, &["from rank 0", "from rank 1"]);
    // The ranks agree now; the first broadcast's parts must not be taken for this one's.
    let second = on_each(&comms, |c| {
        let x = tensor(c, &[c.rank() as f32 + 10.0; 4])?;
        broadcast(c, x, 0).sync_on(c.stream())?.to_host_vec()
    });
    for (rank, r) in second.iter().enumerate() {
        match r {
            Ok(v) => assert_eq!(v, &vec![10.0f32; 4], "rank {rank} got stale data"),
            Err(e) => assert!(
                e.to_string().contains("make a new communicator"),
                "rank {rank}: {e}"
            ),
        }
    }
}

#[test]
fn a_rank_that_missed_the_root_gets_an_error_or_the_roots_data_never_a_stale_part() {
    let Some(comms) = host_communicators(3) else {
        return;
    };
    // Ranks 0 and 1 broadcast from rank 0, rank 2 from itself: rank 2 and rank 0 fail.
    let first = on_each(&comms, |c| {
        let x = tensor(c, &[c.rank() as f32 + 1.0; 4])?;
        let root = if c.rank() == 2 { 2 } else { 0 };
        broadcast(c, x, root).sync_on(c.stream())?.to_host_vec()
    });
    for rank in [0, 2] {
        let e = first[rank]
            .as_ref()
            .expect_err("a rank of another root succeeded");
        assert!(e.to_string().contains("from rank 2"), "rank {rank}: {e}");
    }
    if let Ok(v) = &first[1] {
        assert_eq!(v, &vec![1.0f32; 4], "rank 1");
    }
    // Rank 1 goes on to broadcast from rank 2: rank 2's part of the first one is stale.
    let c = &comms[1];
    let got = broadcast(c, tensor(c, &[0.0; 4]).unwrap(), 2)
        .sync_on(c.stream())
        .and_then(|t| t.to_host_vec());
    let e = got.expect_err("rank 1 took a part of a failed broadcast for a new one's");
    assert!(e.to_string().contains("rank 2"), "{e}");
}

#[test]
fn ranks_reducing_with_different_ops_fail_naming_both() {
    for scatter in [false, true] {
        let Some(comms) = host_communicators(2) else {
            return;
        };
        let got = on_each(&comms, |c| {
            let x = tensor(c, &[c.rank() as f32 + 1.0; 4])?;
            let op = if c.rank() == 0 {
                ReduceOp::Sum
            } else {
                ReduceOp::Max
            };
            let reduced = if scatter {
                reduce_scatter(c, x, op).sync_on(c.stream())?
            } else {
                all_reduce(c, x, op).sync_on(c.stream())?
            };
            reduced.to_host_vec()
        });
        assert_every_rank_fails_saying(&got, &["(sum)", "(max)"]);
    }
}

#[test]
fn ranks_moving_different_element_types_fail_naming_both() {
    let Some(comms) = host_communicators(2) else {
        return;
    };
    let got = on_each(&comms, |c| {
        if c.rank() == 0 {
            let x = tensor(c, &[1.0; 4])?;
            all_gather(c, x)
                .sync_on(c.stream())?
                .to_host_vec()
                .map(drop)
        } else {
            let x = api::from_slice(&[1i32; 4], &[4]).sync_on(c.stream())?;
            all_gather(c, x)
                .sync_on(c.stream())?
                .to_host_vec()
                .map(drop)
        }
    });
    assert_every_rank_fails_saying(&got, &["f32", "i32"]);
    drop(comms);
    // A send of f32 to a receive of i32 of the same byte length.
    let comms = host_communicators(2).unwrap();
    let got = on_each(&comms, |c| {
        if c.rank() == 0 {
            send(c, tensor(c, &[1.0; 4])?, 1)
                .sync_on(c.stream())
                .map(drop)
        } else {
            recv::<i32>(c, &[4], 0).sync_on(c.stream()).map(drop)
        }
    });
    let e = got[1].as_ref().expect_err("an i32 receive took f32 data");
    assert!(matches!(e, DeviceError::Collective { .. }), "{e}");
    assert!(
        e.to_string().contains("f32") && e.to_string().contains("i32"),
        "{e}"
    );
}

#[test]
fn a_rank_whose_thread_panicked_with_its_communicator_fails_its_peers_at_once() {
    let Some(mut comms) = host_communicators(3) else {
        return;
    };
    let c2 = comms.pop().unwrap();
    // Rank 2's thread dies holding its communicator, before any collective.
    let died = std::thread::spawn(move || {
        let _comm = c2;
        panic!("rank 2 gives up");
    })
    .join();
    assert!(died.is_err());
    let got = on_each(&comms, |c| {
        let x = tensor(c, &[1.0; 4])?;
        all_reduce(c, x, ReduceOp::Sum)
            .sync_on(c.stream())?
            .to_host_vec()
    });
    for (rank, r) in got.iter().enumerate() {
        let e = r
            .as_ref()
            .expect_err("an all_reduce without rank 2 succeeded");
        // Said at once, not after the deadline.
        assert!(
            matches!(e, DeviceError::Collective { .. }),
            "rank {rank}: {e}"
        );
        assert!(e.to_string().contains("rank 2"), "rank {rank}: {e}");
        assert!(e.to_string().contains("dropped"), "rank {rank}: {e}");
    }
}

/// An empty call is a call: on the host transport it is exchanged like any other, so a rank
/// whose tensor is empty where its peer's is not fails with it, instead of its peer's call
/// pairing with the next collective of that rank.
#[test]
fn an_empty_tensor_on_one_rank_is_not_paired_with_its_next_collective() {
    let Some(comms) = host_communicators(2) else {
        return;
    };
    // Rank 0 reduces an empty tensor where rank 1 reduces 4 elements; then both reduce 4.
    let got: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
        let first: &[f32] = if c.rank() == 0 { &[] } else { &[1.0; 4] };
        let first = all_reduce(c, tensor(c, first)?, ReduceOp::Sum)
            .sync_on(c.stream())
            .and_then(|t| t.to_host_vec());
        let second = tensor(c, &[100.0 * (c.rank() as f32 + 1.0); 4])?;
        let second = all_reduce(c, second, ReduceOp::Sum)
            .sync_on(c.stream())
            .and_then(|t| t.to_host_vec());
        Ok((first, second))
    });
    for (rank, r) in got.into_iter().enumerate() {
        let (first, second) = r.unwrap();
        if rank == 1 {
            assert!(
                first.is_err(),
                "rank 1 reduced 4 elements with an empty tensor: {first:?}"
            );
        }
        // Never rank 1's first input reduced with rank 0's second.
        if let Ok(v) = second {
            assert_eq!(v, vec![300.0; 4], "rank {rank}'s second all_reduce");
        }
    }
}

/// A collective one rank refuses before enqueueing it (a strided view, a failing input, a
/// tensor of another device, a root outside the world, one bad call of a group) while its peer
/// enqueues its own: the peer's collective fails instead of pairing with the refusing rank's
/// next one, and that next one is refused on the refusing rank too. Never an `Ok` that mixes
/// the two collectives' data.
#[test]
fn a_collective_refused_on_one_rank_is_never_paired_with_its_next_one() {
    type Refused = fn(&Communicator) -> Result<Vec<f32>, DeviceError>;
    let refusals: [(&str, Refused); 5] = [
        ("a strided view", |c| {
            let x = api::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).sync_on(c.stream())?;
            all_reduce(c, x.transpose(0, 1)?, ReduceOp::Sum)
                .sync_on(c.stream())?
                .to_host_vec()
        }),
        ("a failing input", |c| {
            let x = api::from_slice(&[1.0f32; 4], &[5]);
            all_reduce(c, x, ReduceOp::Sum)
                .sync_on(c.stream())?
                .to_host_vec()
        }),
        ("a tensor of another device", |c| {
            let other = cuflow_runtime::Device::host_numbered(7).new_stream()?;
            let x = api::from_slice(&[1.0f32; 4], &[4]).sync_on(&other)?;
            all_reduce(c, x, ReduceOp::Sum)
                .sync_on(c.stream())?
                .to_host_vec()
        }),
        ("a root outside the world", |c| {
            broadcast(c, tensor(c, &[1.0; 4])?, 7)
                .sync_on(c.stream())?
                .to_host_vec()
        }),
        ("a bad call of a group", |c| {
            let x = api::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).sync_on(c.stream())?;
            let calls = vec![
                GroupCall::AllReduce(tensor(c, &[1.0; 4])?, ReduceOp::Sum),
                GroupCall::AllReduce(x.transpose(0, 1)?, ReduceOp::Sum),
            ];
            group(c, calls).sync_on(c.stream())?[0].to_host_vec()
        }),
    ];
    for (how, refused) in refusals {
        let Some(comms) = host_communicators(2) else {
            return;
        };
        let got = on_each(&comms, |c| {
            let first = if c.rank() == 0 {
                refused(c)
            } else {
                let x = tensor(c, &[1.0; 4])?;
                all_reduce(c, x, ReduceOp::Sum)
                    .sync_on(c.stream())
                    .and_then(|t| t.to_host_vec())
            };
            let second = tensor(c, &[100.0 * (c.rank() as f32 + 1.0); 4])?;
            let second = all_reduce(c, second, ReduceOp::Sum)
                .sync_on(c.stream())
                .and_then(|t| t.to_host_vec());
            Ok::<_, DeviceError>((first, second))
        });
        for (rank, r) in got.into_iter().enumerate() {
            let (first, second) = r.unwrap();
            assert!(
                first.is_err(),
                "{how}: rank {rank}'s first collective: {first:?}"
            );
            let e = second.expect_err("the second collective after a refusal");
            assert!(
                e.to_string().contains("make a new communicator"),
                "{how}: rank {rank}'s second collective: {e}"
            );
        }
    }
}

/// Ranks that take different ranks for the root where the root agrees with one of them
/// (roots 0, 0 and 1 over three ranks): every rank fails at once, the one that got the
/// root's data too, instead of one succeeding and the others waiting out their deadline.
#[test]
fn ranks_that_disagree_on_a_broadcasts_root_all_fail_at_once() {
    if cuflow_testing::device::device().kind() != BackendKind::Host {
        cuflow_testing::device::skip(
            "host backend only: NCCL does not check that the ranks' calls agree",
        );
        return;
    }
    // A deadline far longer than the test may take: failing at once is not a timeout.
    let Some(comms) = communicators(3, Duration::from_secs(20)) else {
        return;
    };
    let start = std::time::Instant::now();
    let got = on_each(&comms, |c| {
        let root = if c.rank() == 2 { 1 } else { 0 };
        let x = tensor(c, &[c.rank() as f32 + 1.0; 4])?;
        broadcast(c, x, root).sync_on(c.stream())?.to_host_vec()
    });
    assert_every_rank_fails_saying(&got, &["broadcast"]);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the ranks waited for their deadline: {:?}",
        start.elapsed()
    );
}

/// A raw `collective()` refused by the enqueue itself (its stream is being captured by another
/// thread) breaks the communicator as an argument refusal does: the peer's call fails, and
/// this rank's next call is refused instead of pairing with it.
#[test]
fn a_raw_collective_refused_at_its_enqueue_breaks_the_communicator() {
    use cuflow_runtime::{collective, CollectiveCall, DeviceBuffer};
    let Some(comms) = host_communicators(2) else {
        return;
    };
    let got = on_each(&comms, |c| {
        let s = c.stream();
        let x = DeviceBuffer::from_host(s, &[1.0f32; 4])?;
        s.synchronize()?;
        fn call(b: &DeviceBuffer<f32>) -> CollectiveCall<'_> {
            CollectiveCall::all_reduce(b.view(), b.view(), ReduceOp::Sum)
        }
        if c.rank() == 1 {
            return Ok((
                collective(s, c.comm(), &[call(&x)]).and_then(|()| s.synchronize()),
                Ok(()),
            ));
        }
        let (began, begun) = std::sync::mpsc::channel();
        let (end, ended) = std::sync::mpsc::channel::<()>();
        let capturing = std::thread::spawn({
            let s = s.clone();
            move || {
                s.begin_capture().unwrap();
                began.send(()).unwrap();
                ended.recv().unwrap();
                drop(s.end_capture());
            }
        });
        begun.recv().unwrap();
        let first = collective(s, c.comm(), &[call(&x)]);
        end.send(()).unwrap();
        capturing.join().unwrap();
        let y = DeviceBuffer::from_host(s, &[100.0f32; 4])?;
        let second = collective(s, c.comm(), &[call(&y)]).and_then(|()| s.synchronize());
        Ok::<_, DeviceError>((first, second))
    });
    let (first0, second0) = got[0].as_ref().unwrap();
    assert!(
        matches!(first0, Err(DeviceError::Capture { .. })),
        "{first0:?}"
    );
    let second0 = second0.as_ref().expect_err("rank 0's next call");
    assert!(
        second0.to_string().contains("make a new communicator"),
        "{second0}"
    );
    let (first1, _) = got[1].as_ref().unwrap();
    assert!(
        first1.is_err(),
        "rank 1's call paired with rank 0's next one: {first1:?}"
    );
}

/// A call refused on a stream of another device is given up where no work of its rank can
/// be ordered: the peers are told only after the rank's earlier collectives, which complete on
/// every rank.
#[test]
fn a_call_given_up_leaves_the_earlier_collectives_alone() {
    use cuflow_runtime::{collective, CollectiveCall, DeviceBuffer};
    let Some(comms) = host_communicators(2) else {
        return;
    };
    let got = on_each(&comms, |c| {
        let s = c.stream();
        let x = DeviceBuffer::from_host(s, &[c.rank() as f32 + 1.0; 4])?;
        s.synchronize()?;
        if c.rank() == 1 {
            // Late: rank 0 gives up its second call before this one is even enqueued.
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let call = CollectiveCall::all_reduce(x.view(), x.view(), ReduceOp::Sum);
        collective(s, c.comm(), &[call])?;
        if c.rank() == 0 {
            let other = cuflow_runtime::Device::host_numbered(29).new_stream()?;
            let call = CollectiveCall::all_reduce(x.view(), x.view(), ReduceOp::Sum);
            let e = collective(&other, c.comm(), &[call]).unwrap_err();
            assert!(matches!(e, DeviceError::DeviceMismatch { .. }), "{e}");
        }
        s.synchronize()?;
        x.to_host_vec(s)
    });
    for (rank, r) in got.into_iter().enumerate() {
        assert_eq!(
            r.unwrap(),
            vec![3.0f32; 4],
            "rank {rank}'s earlier all_reduce"
        );
    }
}

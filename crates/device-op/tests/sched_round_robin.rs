//! `StreamPoolRoundRobin`: consecutive placements take consecutive streams of the pool, from
//! any number of threads; branches spread over the pool and are joined correctly however it
//! wraps.

use std::collections::HashMap;
use std::sync::Barrier;

use cuflow_device_op::{zip, DeviceError, DeviceOpExt};
use cuflow_runtime::StreamId;
use cuflow_scheduler::{Placement, SchedulingPolicy, StreamPoolRoundRobin};
use cuflow_testing::{device::device, ops::*};

fn ids(policy: &StreamPoolRoundRobin) -> Vec<StreamId> {
    policy.streams().iter().map(|s| s.id()).collect()
}

#[test]
fn placements_cycle_through_the_pool() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 3)?;
    let pool = ids(&policy);
    assert_eq!(distinct(&pool), 3);
    assert_eq!(policy.device(), &device);
    let parent = device.new_stream()?;
    let placed: Vec<StreamId> = (0..7)
        .map(|i| {
            // Roots and branches share the cursor.
            let request = if i % 2 == 0 {
                Placement::root(&device)
            } else {
                Placement::branch(&device, &parent, i, 7)
            };
            policy.place(&request).map(|s| s.id())
        })
        .collect::<Result<_, _>>()?;
    assert_eq!(
        placed,
        vec![pool[0], pool[1], pool[2], pool[0], pool[1], pool[2], pool[0]]
    );

    // Clones share the pool and the cursor.
    let clone = policy.clone();
    assert_eq!(ids(&clone), pool);
    assert_eq!(clone.place(&Placement::root(&device))?.id(), pool[1]);
    assert_eq!(policy.place(&Placement::root(&device))?.id(), pool[2]);
    Ok(())
}

#[test]
fn an_empty_pool_is_refused() {
    let r = StreamPoolRoundRobin::new(&device(), 0);
    assert!(matches!(r, Err(DeviceError::Usage { .. })), "{r:?}");
}

#[test]
fn concurrent_placements_spread_evenly() -> Result<(), DeviceError> {
    // Four threads place at once; each stream of a pool of four gets exactly a quarter.
    const PER_THREAD: usize = 5000;
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let start = Barrier::new(4);
    let placed: Vec<StreamId> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (policy, device, start) = (&policy, &device, &start);
                scope.spawn(move || {
                    start.wait();
                    (0..PER_THREAD)
                        .map(|_| policy.place(&Placement::root(device)).map(|s| s.id()))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("placing thread"))
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.concat())
    })?;
    let mut per_stream: HashMap<StreamId, usize> = HashMap::new();
    for id in placed {
        *per_stream.entry(id).or_default() += 1;
    }
    assert_eq!(per_stream.len(), 4);
    assert!(
        per_stream.values().all(|n| *n == PER_THREAD),
        "{per_stream:?}"
    );
    Ok(())
}

#[test]
fn eight_branches_on_a_pool_of_eight_use_every_stream() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 8)?;
    let bufs = buffers(&[0.0; 8]);
    let sum = buffer(0.0);
    let w = |i: usize| with_stream(spin_then_write(&bufs[i], (i + 1) as f32, SPIN));
    let ((out, branch_streams), stats) = zip!(w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7))
        .then({
            let sum = sum.clone();
            move |(a, b, c, d, e, f, g, h)| {
                let all = [a, b, c, d, e, f, g, h];
                let streams: Vec<StreamId> = all.iter().map(|(_, s)| *s).collect();
                sum_into(&sum, all.into_iter().map(|(b, _)| b).collect())
                    .map(move |out| (out, streams))
            }
        })
        .sync_with_policy(&policy)?;
    assert_all(&out, 36.0, "the sum of 1..=8 must see every branch's write");
    // The root takes the pool's first stream and the branches the next eight placements:
    // seven other streams, then the root's again.
    assert_eq!(distinct(&branch_streams), 8, "{branch_streams:?}");
    assert_eq!(distinct(&stats.streams), 8, "{stats:?}");
    let pool = ids(&policy);
    assert!(branch_streams.iter().all(|s| pool.contains(s)));
    // Seven branches off the root's stream are joined with an event each; the eighth runs on
    // the root's stream, in order, and needs none.
    assert_events(&stats, 7, 7);
    Ok(())
}

#[test]
fn a_pool_smaller_than_the_branch_count_still_joins_every_branch() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 2)?;
    let values = [1.0f32, 2.0, 4.0, 8.0, 16.0, 32.0];
    let bufs = buffers(&[0.0; 6]);
    let sum = buffer(0.0);
    let (out, stats) =
        spin_writes_then_sum(&sum, &bufs, &values, SPIN / 4).sync_with_policy(&policy)?;
    assert_all(&out, 63.0, "the sum must see every branch's write");
    assert_eq!(distinct(&stats.streams), 2, "{stats:?}");
    // Root on stream 0; branches alternate 1, 0, 1, 0, 1, 0. The three on stream 1 are joined
    // with an event each; the three on the root's stream are in order already.
    assert_events(&stats, 3, 3);
    Ok(())
}

//! Two ranks as two processes through the TCP rendezvous (loopback, an ephemeral port): this
//! test binary runs rank 0 and starts itself again as rank 1.

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{
    all_gather, all_reduce, broadcast, group, Communicator, DistConfig, GroupCall, ReduceOp,
};
use cuflow_runtime::{Device, DeviceError};
use cuflow_tensor::api;
use cuflow_testing::rng::{fresh_seed, random_f32, seeded_rng};

const WORLD: usize = 2;
const LEN: usize = 1000;

fn input(seed: u64, rank: usize) -> Vec<f32> {
    random_f32(&mut seeded_rng(seed.wrapping_add(rank as u64 * 7919)), LEN)
}

/// What every rank runs, checking its own results against the reference.
fn run_rank(comm: &Communicator, seed: u64) -> Result<(), DeviceError> {
    let (rank, s) = (comm.rank(), comm.stream());
    let parts: Vec<Vec<f32>> = (0..WORLD).map(|r| input(seed, r)).collect();
    let x = api::from_slice(&parts[rank], &[LEN]).sync_on(s)?;
    let sum = all_reduce(comm, x.clone(), ReduceOp::Sum)
        .sync_on(s)?
        .to_host_vec()?;
    let want: Vec<f32> = (0..LEN).map(|i| parts[0][i] + parts[1][i]).collect();
    assert_eq!(sum, want, "all_reduce on rank {rank}");
    let gathered = all_gather(comm, x.clone()).sync_on(s)?.to_host_vec()?;
    assert_eq!(gathered, parts.concat(), "all_gather on rank {rank}");
    let from_1 = broadcast(comm, x.clone(), 1).sync_on(s)?.to_host_vec()?;
    assert_eq!(from_1, parts[1], "broadcast on rank {rank}");
    let peer = 1 - rank;
    let out = group(
        comm,
        vec![GroupCall::Send(x, peer), GroupCall::Recv(vec![LEN], peer)],
    )
    .sync_on(s)?;
    assert_eq!(
        out[1].to_host_vec()?,
        parts[peer],
        "send/recv on rank {rank}"
    );
    Ok(())
}

/// Rank 1, when started by `two_processes_meet_through_the_rendezvous`; ignored otherwise.
#[test]
#[ignore = "rank 1 of two_processes_meet_through_the_rendezvous, started by it"]
fn rank_1_process() {
    let config = DistConfig::from_env().expect("the environment of rank 1");
    let seed: u64 = std::env::var("CUFLOW_DIST_TEST_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let comm = Communicator::connect(&Device::host_numbered(1), &config).expect("rank 1 connects");
    run_rank(&comm, seed).expect("rank 1's collectives");
}

#[test]
fn two_processes_meet_through_the_rendezvous() {
    let seed = fresh_seed();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "rank_1_process", "--test-threads=1"])
        .env("RANK", "1")
        .env("WORLD_SIZE", WORLD.to_string())
        .env("LOCAL_RANK", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("CUFLOW_DIST_TIMEOUT_MS", "60000")
        .env("CUFLOW_DIST_TEST_SEED", seed.to_string())
        .spawn()
        .unwrap();
    let config = DistConfig::new(0, WORLD, "127.0.0.1", port).with_timeout(Duration::from_secs(60));
    let result =
        Communicator::serve(&Device::host(), &config, listener).and_then(|c| run_rank(&c, seed));
    let status = child.wait().unwrap();
    result.expect("rank 0's collectives");
    assert!(status.success(), "rank 1's process failed: {status}");
}

#[test]
fn a_rank_that_never_connects_is_a_timeout_naming_it() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = DistConfig::new(0, 3, "127.0.0.1", port).with_timeout(Duration::from_millis(300));
    let e = Communicator::serve(&Device::host(), &config, listener).unwrap_err();
    match &e {
        DeviceError::Timeout { what, waited_ms } => {
            assert!(what.contains("waiting for ranks [1, 2] of 3"), "{e}");
            assert_eq!(*waited_ms, 300);
        }
        other => panic!("expected a timeout, got {other}"),
    }
    // And a rank whose rank 0 never listens.
    let free = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let config = DistConfig::new(1, 2, "127.0.0.1", port).with_timeout(Duration::from_millis(300));
    let e = Communicator::connect(&Device::host(), &config).unwrap_err();
    assert!(matches!(e, DeviceError::Timeout { .. }), "{e}");
}

#[test]
fn a_peer_process_that_died_is_an_error_at_once() {
    // Rank 1 is this process too, on its own thread; it leaves after the rendezvous.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let timeout = Duration::from_secs(60);
    let rank1 = std::thread::spawn(move || {
        let config = DistConfig::new(1, 2, "127.0.0.1", port).with_timeout(timeout);
        drop(Communicator::connect(&Device::host_numbered(1), &config).unwrap());
    });
    let config = DistConfig::new(0, 2, "127.0.0.1", port).with_timeout(timeout);
    let comm = Communicator::serve(&Device::host(), &config, listener).unwrap();
    rank1.join().unwrap();
    let x = api::ones::<f32>(&[4]).sync_on(comm.stream()).unwrap();
    let e = all_reduce(&comm, x, ReduceOp::Sum)
        .sync_on(comm.stream())
        .unwrap_err();
    assert!(
        // Whichever the exchange hits first: the write to the closed link, or the read.
        matches!(&e, DeviceError::Collective { rank: 0, reason, .. } if reason.contains("rank 1")),
        "{e}"
    );
}

//! The TCP rendezvous against strangers and misconfigured ranks: strangers are dropped and the
//! ranks still meet; misconfigured ranks get clear errors before the deadline, never a panic or
//! a hang. Ranks run on threads of this process, on host devices.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{all_reduce, Communicator, DistConfig, ReduceOp};
use cuflow_runtime::{Device, DeviceError};
use cuflow_tensor::api;

const SHORT: Duration = Duration::from_millis(1500);

/// Rank 0 of a world of `world`, serving on a fresh port: the port and rank 0's result.
fn rank_0(world: usize) -> (u16, JoinHandle<Result<Communicator, DeviceError>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let config = DistConfig::new(0, world, "127.0.0.1", port).with_timeout(SHORT);
        Communicator::serve(&Device::host(), &config, listener)
    });
    (port, handle)
}

fn join_as(rank: usize, world: usize, port: u16) -> JoinHandle<Result<Communicator, DeviceError>> {
    std::thread::spawn(move || {
        let config = DistConfig::new(rank, world, "127.0.0.1", port).with_timeout(SHORT);
        Communicator::connect(&Device::host_numbered(rank), &config)
    })
}

/// Strangers on rank 0's port (garbage, a connect-and-close port probe, a connection that says
/// nothing) are dropped: rank 0 goes on waiting, and the real rank that connects after them
/// joins. (The silent one is dropped after rank 0's wait for a hello, a few seconds: the
/// deadline here is longer.)
#[test]
fn strangers_on_rank_0s_port_are_dropped_and_the_ranks_still_meet() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let long = Duration::from_secs(30);
    let mut garbage = TcpStream::connect(("127.0.0.1", port)).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    let silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let rank0 = std::thread::spawn(move || {
        let config = DistConfig::new(0, 2, "127.0.0.1", port).with_timeout(long);
        Communicator::serve(&Device::host(), &config, listener)
    });
    let rank1 = std::thread::spawn(move || {
        let config = DistConfig::new(1, 2, "127.0.0.1", port).with_timeout(long);
        Communicator::connect(&Device::host_numbered(1), &config)
    });
    let (c0, c1) = (rank0.join().unwrap(), rank1.join().unwrap());
    let (c0, c1) = (c0.expect("rank 0"), c1.expect("rank 1"));
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let sum = |c: Communicator| {
            s.spawn(move || {
                let x = api::full::<f32>(&[4], c.rank() as f32 + 1.0)
                    .sync_on(c.stream())
                    .unwrap();
                all_reduce(&c, x, ReduceOp::Sum)
                    .sync_on(c.stream())
                    .and_then(|t| t.to_host_vec())
                    .unwrap()
            })
        };
        let handles = [sum(c0), sum(c1)];
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![vec![3.0f32; 4]; 2]);
    drop((garbage, silent));
}

#[test]
fn two_processes_claiming_one_rank_fail_every_rank() {
    let (port, rank0) = rank_0(3);
    let first = join_as(1, 3, port);
    let second = join_as(1, 3, port);
    let e = rank0.join().unwrap().unwrap_err();
    assert!(
        e.to_string().contains("two processes say they are rank 1"),
        "{e}"
    );
    for claimant in [first, second] {
        claimant.join().unwrap().unwrap_err();
    }
}

#[test]
fn a_rank_of_another_world_size_is_named() {
    let (port, rank0) = rank_0(2);
    let stray = join_as(1, 3, port);
    let e = rank0.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("check RANK and WORLD_SIZE"), "{e}");
    stray.join().unwrap().unwrap_err();
    let e = join_as(2, 2, port).join().unwrap().unwrap_err();
    assert!(matches!(e, DeviceError::Usage { .. }), "{e}");
}

#[test]
fn a_zero_timeout_is_refused_up_front() {
    let e = Communicator::local_with_timeout(&[Device::host()], Duration::ZERO).unwrap_err();
    assert!(matches!(e, DeviceError::Usage { .. }), "{e}");
    assert!(e.to_string().contains("timeout of 0"), "{e}");
    let config = DistConfig::new(1, 2, "127.0.0.1", 1).with_timeout(Duration::ZERO);
    let e = Communicator::connect(&Device::host(), &config).unwrap_err();
    assert!(e.to_string().contains("timeout of 0"), "{e}");
}

#[test]
fn a_master_port_already_taken_says_to_pick_another() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let config = DistConfig::new(0, 2, "127.0.0.1", port).with_timeout(SHORT);
    let e = Communicator::connect(&Device::host(), &config).unwrap_err();
    let text = e.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(text.contains("MASTER_PORT"), "{e}");
}

#[test]
fn a_timeout_past_the_clocks_range_waits_instead_of_panicking() {
    // `Duration::MAX` reads as "wait as long as it takes": no deadline is representable.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let rank1 = std::thread::spawn(move || {
        let config = DistConfig::new(1, 2, "127.0.0.1", port).with_timeout(Duration::MAX);
        let comm = Communicator::connect(&Device::host_numbered(1), &config)?;
        reduce(&comm, 10.0)
    });
    let config = DistConfig::new(0, 2, "127.0.0.1", port).with_timeout(Duration::MAX);
    let got0 =
        Communicator::serve(&Device::host(), &config, listener).and_then(|c| reduce(&c, 1.0));
    let got1 = rank1.join().expect("rank 1 panicked");
    assert_eq!(got0.unwrap(), vec![11.0; 3]);
    assert_eq!(got1.unwrap(), vec![11.0; 3]);
}

fn reduce(comm: &Communicator, value: f32) -> Result<Vec<f32>, DeviceError> {
    let x = api::full::<f32>(&[3], value).sync_on(comm.stream())?;
    all_reduce(comm, x, ReduceOp::Sum)
        .sync_on(comm.stream())?
        .to_host_vec()
}

#[test]
fn an_absurd_world_size_is_an_error_not_an_abort() {
    // Past what the rendezvous counts in: refused, on rank 0 and on the others.
    for rank in [0, 1] {
        let config = DistConfig::new(rank, (1 << 32) + 2, "127.0.0.1", 1).with_timeout(SHORT);
        let e = Communicator::connect(&Device::host(), &config).unwrap_err();
        assert!(matches!(e, DeviceError::Usage { .. }), "rank {rank}: {e}");
        assert!(e.to_string().contains("4294967298"), "rank {rank}: {e}");
    }
    // Within it, but with ranks that never come: a timeout naming a few of them, without
    // making room for every rank before any arrived.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let world = u32::MAX as usize;
    let config = DistConfig::new(0, world, "127.0.0.1", port).with_timeout(SHORT);
    let e = Communicator::serve(&Device::host(), &config, listener).unwrap_err();
    match &e {
        DeviceError::Timeout { what, .. } => {
            assert!(what.contains("waiting for ranks [1, 2, 3"), "{e}");
            assert!(what.contains(&format!("of {world}")), "{e}");
            assert!(what.len() < 200, "{e}");
        }
        other => panic!("expected a timeout, got {other}"),
    }
}

#[test]
fn a_rank_of_the_previous_wire_version_is_refused() {
    // Host messages carry a header since version 2: a rank of version 1 would misread them.
    let (port, rank0) = rank_0(2);
    let mut old = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut hello = b"cuflow\x01\x00".to_vec();
    hello.extend_from_slice(&1u32.to_le_bytes());
    hello.extend_from_slice(&2u32.to_le_bytes());
    hello.extend_from_slice(&0u16.to_le_bytes());
    old.write_all(&hello).unwrap();
    let e = rank0.join().unwrap().unwrap_err();
    assert!(
        e.to_string().contains("not a cuflow rank of this version"),
        "{e}"
    );
}

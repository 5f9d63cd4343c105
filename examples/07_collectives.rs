//! Collectives between ranks: an all-reduce, an all-gather and a ring exchange, checked on
//! every rank.
//!
//! ```text
//! cargo run --example 07_collectives -- --ranks 4          # 4 ranks in this process
//! torchrun --nproc-per-node 2 --no-python target/debug/examples/07_collectives   # one rank per process
//! RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 target/debug/examples/07_collectives &
//! RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 target/debug/examples/07_collectives
//! ```
//!
//! In one process, each rank gets a device of the backend `Device::auto()` picks (CUDA devices
//! `0..N`, else host devices `0..N`) and runs on its own thread. Under `torchrun` (when `RANK`
//! is set) each process is one rank, on the device of its `LOCAL_RANK`.

use cuflow::dist::{all_gather, all_reduce, group, Communicator, GroupCall, ReduceOp};
use cuflow::prelude::*;
use cuflow::runtime::BackendKind;

/// What every rank runs; returns one line about its results.
fn run_rank(comm: &Communicator) -> Result<String, DeviceError> {
    let (rank, n, s) = (comm.rank(), comm.world_size(), comm.stream());
    let mine = api::full::<f32>(&[4], rank as f32 + 1.0).sync_on(s)?;
    // 1 + 2 + … + n on every rank.
    let sum = all_reduce(comm, &mine, ReduceOp::Sum)
        .sync_on(s)?
        .to_host_vec()?;
    let want = (n * (n + 1) / 2) as f32;
    let gathered = all_gather(comm, &mine).sync_on(s)?.to_host_vec()?;
    // Each rank sends to the next and receives from the previous, in one group. One rank has
    // no neighbour (a send to itself is refused: that is a copy), so it keeps its own values.
    let from_left = if n > 1 {
        let calls = vec![
            GroupCall::Send(mine.clone(), (rank + 1) % n),
            GroupCall::Recv(vec![4], (rank + n - 1) % n),
        ];
        group(comm, calls).sync_on(s)?[1].to_host_vec()?
    } else {
        mine.to_host_vec()?
    };
    let left = ((rank + n - 1) % n) as f32 + 1.0;
    let ok = sum.iter().all(|&v| v == want)
        && gathered
            .chunks(4)
            .enumerate()
            .all(|(r, c)| c.iter().all(|&v| v == r as f32 + 1.0))
        && from_left.iter().all(|&v| v == left);
    if !ok {
        return Err(DeviceError::usage(format!(
            "rank {rank}: wrong results: sum {sum:?}, gathered {gathered:?}, from the left \
             {from_left:?}"
        )));
    }
    Ok(format!(
        "rank {rank}/{n} on {}: all_reduce = {want}, all_gather and the ring exchange agree",
        comm.device()
    ))
}

/// Prints an error with its `Display` form, which says what went wrong and how to fix it, and
/// exits with status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), DeviceError> {
    let auto = Device::auto()?;
    let on_device = |i: usize| match auto.kind() {
        BackendKind::Cuda => Device::cuda(i),
        _ => Ok(Device::host_numbered(i)),
    };
    if std::env::var_os("RANK").is_some() {
        let config = cuflow::dist::DistConfig::from_env()?;
        let comm = Communicator::connect(&on_device(config.local_rank)?, &config)?;
        println!("{}", run_rank(&comm)?);
        return Ok(());
    }
    const USAGE: &str = "usage: 07_collectives [--ranks N]";
    // The ranks of one process: each is a thread, with a device of its own.
    const MAX_RANKS: usize = 1024;
    let mut ranks = 2;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            "--ranks" => {
                let value = args.next();
                ranks = value
                    .as_deref()
                    .and_then(|v| v.parse::<usize>().ok())
                    .filter(|&n| (1..=MAX_RANKS).contains(&n))
                    .ok_or_else(|| {
                        DeviceError::usage(format!(
                            "--ranks takes a count of ranks from 1 to {MAX_RANKS} (each is a \
                             thread of this process), not {}; {USAGE}",
                            value.map_or("nothing".into(), |v| format!("{v:?}"))
                        ))
                    })?;
            }
            _ => {
                return Err(DeviceError::usage(format!(
                    "unknown argument {arg:?}; {USAGE}"
                )))
            }
        }
    }
    let devices = (0..ranks).map(on_device).collect::<Result<Vec<_>, _>>()?;
    let comms = Communicator::local(&devices)?;
    let lines = std::thread::scope(|scope| {
        let handles: Vec<_> = comms.iter().map(|c| scope.spawn(|| run_rank(c))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(DeviceError::usage("a rank panicked")))
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

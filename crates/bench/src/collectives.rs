//! `collectives`: all-reduce bus bandwidth over buffer sizes from 8 KiB to 1 GiB, cuflow
//! (`cuflow::dist`, NCCL on CUDA devices) beside PyTorch's `torch.distributed.all_reduce` (NCCL)
//! on the same GPUs in the same run.
//!
//! cuflow runs one rank per visible GPU in this process (`Communicator::local`), each rank on
//! its own thread; PyTorch one process per GPU. Both reduce float32 buffers in place, time
//! `iters` all-reduces enqueued back to back after a warm-up, and report the bus bandwidth of
//! nccl-tests: `bytes / time · 2 (n − 1) / n`. The goal is 0.95× PyTorch at every size of at
//! least 1 MiB. With one rank nothing moves, so the rows are the time per call instead (the
//! cost of enqueueing a collective), without a goal.
//!
//! With `CUFLOW_DEVICE=host` it runs on two host devices instead, over sizes up to 4 MiB and
//! without a baseline: a smoke check of the program and of the host backend.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use cuflow::dist::{Communicator, ReduceOp};
use cuflow::prelude::*;
use cuflow::runtime::{collective, BackendKind, CollectiveCall};
use serde_json::json;

use crate::error::BenchError;
use crate::report::{Goal, Results, Row};

const TORCH_SCRIPT: &str = include_str!("collectives_torch.py");
const WARMUP: usize = 5;
/// At most this many bytes are all-reduced per timed size (fewer iterations for large sizes).
const BYTES_PER_SIZE: usize = 1 << 34;

fn sizes(host: bool) -> Vec<usize> {
    let top = if host { 4 << 20 } else { 1 << 30 };
    let mut v = Vec::new();
    let mut s = 8 << 10;
    while s <= top {
        v.push(s);
        s *= 4;
    }
    if v.last() != Some(&top) {
        v.push(top);
    }
    v
}

fn iterations(iters: usize, bytes: usize) -> usize {
    iters.min(BYTES_PER_SIZE / bytes.max(1)).max(1)
}

/// Seconds per all-reduce of `bytes` on rank `comm`, all ranks starting together.
fn time_rank(
    comm: &Communicator,
    bytes: usize,
    iters: usize,
    barrier: &Barrier,
) -> Result<f64, BenchError> {
    let stream = comm.stream();
    let x = DeviceBuffer::<f32>::zeroed(stream, bytes / 4)?;
    let call = || CollectiveCall::all_reduce(x.view(), x.view(), ReduceOp::Sum);
    for _ in 0..WARMUP {
        collective(stream, comm.comm(), &[call()])?;
    }
    stream.synchronize()?;
    barrier.wait();
    let start = Instant::now();
    for _ in 0..iters {
        collective(stream, comm.comm(), &[call()])?;
    }
    stream.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / iters as f64)
}

/// Runs the benchmark over every visible GPU (two host devices under `CUFLOW_DEVICE=host`).
pub(crate) fn run(device: &Device, iters: usize) -> Result<Results, BenchError> {
    let host = device.kind() == BackendKind::Host;
    let devices: Vec<Device> = if host {
        vec![Device::host_numbered(0), Device::host_numbered(1)]
    } else {
        (0..Device::cuda_count())
            .map(Device::cuda)
            .collect::<Result<_, _>>()?
    };
    let n = devices.len();
    let comms = Communicator::local(&devices)?;
    let sizes = sizes(host);
    let mut ours = Vec::new();
    for &bytes in &sizes {
        let reps = iterations(iters, bytes);
        let barrier = Arc::new(Barrier::new(n));
        let times: Vec<Result<f64, BenchError>> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .map(|c| {
                    let barrier = barrier.clone();
                    s.spawn(move || time_rank(c, bytes, reps, &barrier))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(BenchError::Verification("a rank's thread panicked".into()))
                    })
                })
                .collect()
        });
        // The slowest rank sets the collective's time.
        let mut worst: f64 = 0.0;
        for t in times {
            worst = worst.max(t?);
        }
        ours.push((bytes, worst));
    }
    let factor = 2.0 * n.saturating_sub(1) as f64 / n.max(1) as f64;
    let bandwidth = |bytes: usize, seconds: f64| bytes as f64 / seconds * factor / 1e9;

    let mut notes = vec![format!(
        "{n} rank(s) on {}: in-place float32 sum, {WARMUP} warm-up all-reduces, then up to \
         --iters ({iters}) back to back (at most {} GiB per size); {}",
        if host {
            "host devices"
        } else {
            "the visible GPUs"
        },
        BYTES_PER_SIZE >> 30,
        if n > 1 {
            "bus bandwidth = bytes / time · 2(n−1)/n"
        } else {
            "one rank: time per call"
        }
    )];
    let torch = if host {
        notes.push("host smoke check: no PyTorch baseline".into());
        None
    } else {
        let args = json!({"ranks": n, "sizes": sizes, "iters": iters, "warmup": WARMUP});
        match crate::python::run_script("collectives", TORCH_SCRIPT, &args) {
            Ok(t) => {
                notes.push(format!(
                    "baseline: {}, torch.distributed.all_reduce, one process per GPU, after \
                     cuflow's runs",
                    t["version"].as_str().unwrap_or("PyTorch")
                ));
                Some(t)
            }
            Err(why) => {
                notes.push(format!("no PyTorch baseline: {why}"));
                None
            }
        }
    };
    if n == 1 {
        notes.push(
            "one rank moves no data (NCCL's in-place all-reduce over one rank is the identity): \
             each row is the time per call, what it costs to enqueue the collective, and has no \
             goal; the bandwidth goal needs 2 or more GPUs"
                .into(),
        );
    }
    let mut rows = Vec::new();
    for (bytes, seconds) in ours {
        let theirs = torch.as_ref().and_then(|t| {
            t["sizes"]
                .as_array()?
                .iter()
                .find(|r| r["bytes"].as_u64() == Some(bytes as u64))?["seconds"]
                .as_f64()
        });
        if n == 1 {
            let figure = format!("all-reduce {}, one rank, per call", human(bytes));
            rows.push(match theirs {
                Some(t) => Row::derived(figure, "us", seconds * 1e6, "PyTorch NCCL", t * 1e6),
                None => Row::without_baseline(figure, "us", &[seconds * 1e6], "PyTorch NCCL"),
            });
            continue;
        }
        let figure = format!("all-reduce {}, bus bandwidth", human(bytes));
        let value = bandwidth(bytes, seconds);
        let row = match theirs {
            Some(t) => Row::derived(figure, "GB/s", value, "PyTorch NCCL", bandwidth(bytes, t)),
            None => Row::without_baseline(figure, "GB/s", &[value], "PyTorch NCCL"),
        }
        .higher_is_better();
        rows.push(if bytes >= 1 << 20 {
            row.with_goal(Goal::AtLeast(0.95))
        } else {
            row
        });
    }
    Ok(Results { notes, rows })
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_span_8_kib_to_1_gib() {
        let s = sizes(false);
        assert_eq!((s[0], *s.last().unwrap()), (8 << 10, 1 << 30));
        assert!(s.contains(&(2 << 20)) && s.contains(&(512 << 20)), "{s:?}");
        assert_eq!(*sizes(true).last().unwrap(), 4 << 20);
    }

    #[test]
    fn the_host_smoke_check_runs() {
        let results = run(&Device::host(), 3).unwrap();
        assert_eq!(results.rows.len(), sizes(true).len());
        assert!(
            results.rows.iter().all(|r| r.value > 0.0),
            "{:?}",
            results.rows
        );
    }
}

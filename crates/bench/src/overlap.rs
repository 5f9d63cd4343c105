//! `overlap`: `zip!` of 8 independent single-block ~1 ms kernels under round-robin over 8
//! streams against `SingleStream` (which runs them one after another).

use std::sync::Arc;
use std::time::Instant;

use cuflow::prelude::*;

use crate::error::BenchError;
use crate::kernels::{spin_kernel, SpinOp};
use crate::report::{median, Goal, Results, Row};

fn eight(
    kernel: &Kernel,
    counters: &[Arc<DeviceBuffer<u64>>],
    cycles: u64,
) -> impl DeviceOp + use<> {
    let op = |i: usize| SpinOp {
        kernel: kernel.clone(),
        counter: counters[i].clone(),
        cycles,
    };
    zip!(op(0), op(1), op(2), op(3), op(4), op(5), op(6), op(7))
}

/// Runs the benchmark with `iters` trials (clamped to 3..=21).
pub(crate) fn run(device: &Device, iters: usize) -> Result<Results, BenchError> {
    let stream = device.new_stream()?;
    let kernel = spin_kernel();
    let counters: Vec<_> = (0..8)
        .map(|_| DeviceBuffer::<u64>::zeroed(&stream, 1).map(Arc::new))
        .collect::<Result<_, _>>()?;
    stream.synchronize()?;
    // ~1 ms at the SM clock (about 1.98 GHz on an H100 under load).
    let cycles = 2_000_000u64;
    let pool = StreamPoolRoundRobin::new(device, 8)?;
    let single = SingleStream::new(device)?;

    eight(&kernel, &counters, cycles).sync_with_policy(&pool)?;
    eight(&kernel, &counters, cycles).sync_with_policy(&single)?;

    let trials = iters.clamp(3, 21);
    let (mut par, mut ser) = (Vec::new(), Vec::new());
    let mut streams_used = 0;
    for _ in 0..trials {
        let t = Instant::now();
        let (_, stats) = eight(&kernel, &counters, cycles).sync_with_policy(&pool)?;
        par.push(t.elapsed().as_secs_f64() * 1e3);
        streams_used = stats.streams.len();
        let t = Instant::now();
        eight(&kernel, &counters, cycles).sync_with_policy(&single)?;
        ser.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // Every kernel ran: each counter was incremented once per execution.
    let expected = 2 + 2 * trials as u64;
    for c in &counters {
        let got = c.to_host_vec(&stream)?[0];
        if got != expected {
            return Err(BenchError::Verification(format!(
                "a spin kernel did not run: counter {got}, expected {expected}"
            )));
        }
    }
    let speedup = median(&ser) / median(&par);
    Ok(Results {
        notes: vec![format!(
            "ms per zip! of 8 single-thread kernels spinning {cycles} cycles each, median of \
             {trials} trials; round-robin used {streams_used} streams"
        )],
        rows: vec![
            Row::derived(
                "SingleStream time / round-robin(8) time",
                "x",
                speedup,
                "1.0 (no overlap)",
                1.0,
            )
            .higher_is_better()
            .with_goal(Goal::AtLeast(6.0)),
            Row::from_trials(
                "zip! of 8 under round-robin(8)",
                "ms",
                &par,
                "the same under SingleStream",
                &ser,
            ),
        ],
    })
}

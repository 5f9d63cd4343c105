//! `overlap`: `zip!` of 8 independent single-block ~1 ms kernels under round-robin over 8
//! streams against `SingleStream` (which runs them one after another).

use std::sync::Arc;
use std::time::Instant;

use cuflow::prelude::*;

use crate::kernels::{spin_kernel, SpinOp};
use crate::report::{median, Report, Row};

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

pub(crate) fn run(device: &Device, iters: usize) -> Result<Report, String> {
    let e = |e: DeviceError| e.to_string();
    let stream = device.new_stream().map_err(e)?;
    let kernel = spin_kernel();
    let counters: Vec<_> = (0..8)
        .map(|_| DeviceBuffer::<u64>::zeroed(&stream, 1).map(Arc::new))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    stream.synchronize().map_err(e)?;
    // ~1 ms at the SM clock (about 1.98 GHz on an H100 under load).
    let cycles = 2_000_000u64;
    let pool = StreamPoolRoundRobin::new(device, 8).map_err(e)?;
    let single = SingleStream::new(device).map_err(e)?;

    eight(&kernel, &counters, cycles)
        .sync_with_policy(&pool)
        .map_err(e)?;
    eight(&kernel, &counters, cycles)
        .sync_with_policy(&single)
        .map_err(e)?;

    let trials = iters.clamp(3, 21);
    let (mut par, mut ser) = (Vec::new(), Vec::new());
    let mut streams_used = 0;
    for _ in 0..trials {
        let t = Instant::now();
        let (_, stats) = eight(&kernel, &counters, cycles)
            .sync_with_policy(&pool)
            .map_err(e)?;
        par.push(t.elapsed().as_secs_f64() * 1e3);
        streams_used = stats.streams.len();
        let t = Instant::now();
        eight(&kernel, &counters, cycles)
            .sync_with_policy(&single)
            .map_err(e)?;
        ser.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // Every kernel ran: each counter was incremented once per execution.
    let expected = 2 + 2 * trials as u64;
    for c in &counters {
        let got = c.to_host_vec(&stream).map_err(e)?[0];
        if got != expected {
            return Err(format!(
                "a spin kernel did not run: counter {got}, expected {expected}"
            ));
        }
    }
    let (par, ser) = (median(&mut par), median(&mut ser));
    Ok(Report {
        benchmark: "overlap".into(),
        device: device.to_string(),
        notes: vec![format!(
            "ms per zip! of 8 single-thread kernels spinning {cycles} cycles each, median of \
             {trials} trials; round-robin used {streams_used} streams"
        )],
        rows: vec![
            Row {
                name: "SingleStream time / round-robin(8) time".into(),
                value: ser / par,
                unit: "x",
                baseline_name: "1.0 (no overlap)".into(),
                baseline: 1.0,
                lower_is_better: false,
                goal: Some((">=", 6.0)),
            },
            Row {
                name: "zip! of 8 under round-robin(8)".into(),
                value: par,
                unit: "ms",
                baseline_name: "the same under SingleStream".into(),
                baseline: ser,
                lower_is_better: true,
                goal: None,
            },
        ],
    })
}

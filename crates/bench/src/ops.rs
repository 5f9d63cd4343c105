//! `ops`: the cost of composing through cuflow's ops. A 1,000-kernel dependent chain built with
//! `then` against the same 1,000 raw cudarc launches; and `.await` of one tiny op against a
//! `.sync_on` round trip.

use std::time::Instant;

use cuflow::prelude::*;

use crate::kernels::{empty_kernel, EmptyOp, EMPTY_SRC};
use crate::raw::Raw;
use crate::report::{median, Report, Row};

fn chain(kernel: &Kernel, n: usize) -> BoxedOp<'static, ()> {
    let mut op = value(()).boxed();
    for _ in 0..n {
        let k = kernel.clone();
        op = op.then(move |_| EmptyOp(k)).boxed();
    }
    op
}

pub(crate) fn run(device: &Device, iters: usize) -> Result<Report, String> {
    let e = |e: DeviceError| e.to_string();
    let stream = device.new_stream().map_err(e)?;
    let kernel = empty_kernel();
    let mut raw = Raw::new(EMPTY_SRC, "empty_kernel", false, false)?;
    let n = 1000;

    // Warm up.
    chain(&kernel, n).sync_on(&stream).map_err(e)?;
    raw.launch_n(n, 0)?;

    let trials = iters.clamp(5, 51);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..trials {
        let t = Instant::now();
        chain(&kernel, n).sync_on(&stream).map_err(e)?;
        ours.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        theirs.push(raw.launch_n(n, 0)? * 1e6 / n as f64);
    }
    let chain_ours = median(&mut ours);
    let chain_raw = median(&mut theirs);

    // One tiny op: `.await` (default policy, completion reactor) vs `.sync_on`.
    let rounds = 2000;
    for _ in 0..200 {
        futures::executor::block_on(async { EmptyOp(kernel.clone()).await }).map_err(e)?;
        EmptyOp(kernel.clone()).sync_on(&stream).map_err(e)?;
    }
    let (mut awaits, mut syncs) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..rounds {
            futures::executor::block_on(async { EmptyOp(kernel.clone()).await }).map_err(e)?;
        }
        awaits.push(t.elapsed().as_secs_f64() * 1e6 / rounds as f64);
        let t = Instant::now();
        for _ in 0..rounds {
            EmptyOp(kernel.clone()).sync_on(&stream).map_err(e)?;
        }
        syncs.push(t.elapsed().as_secs_f64() * 1e6 / rounds as f64);
    }
    let awaited = median(&mut awaits);
    let synced = median(&mut syncs);

    Ok(Report {
        benchmark: "ops".into(),
        device: device.to_string(),
        notes: vec![
            format!(
                "chain: µs per op of a {n}-kernel dependent chain built with `then` (boxed ops, \
                 build + enqueue + sync), median of {trials} trials; raw: {n} launches of the \
                 same empty kernel + sync"
            ),
            format!("round trip: µs per op, median of 7 trials of {rounds} one-kernel ops"),
        ],
        rows: vec![
            Row {
                name: "then-chain of 1000 empty kernels".into(),
                value: chain_ours,
                unit: "us/op",
                baseline_name: "raw cudarc launches, tracking off".into(),
                baseline: chain_raw,
                lower_is_better: true,
                goal: Some(("<=", 1.10)),
            },
            Row {
                name: ".await of one tiny op".into(),
                value: awaited,
                unit: "us",
                baseline_name: ".sync_on round trip".into(),
                baseline: synced,
                lower_is_better: true,
                goal: Some(("<=", 1.10)),
            },
        ],
    })
}

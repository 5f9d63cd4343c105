//! `ops`: the cost of composing through cuflow's ops. A 1,000-kernel dependent chain built with
//! `then` against the same 1,000 raw cudarc launches, and against the same launches made
//! directly through `Kernel::launch` (what the chain itself adds); and `.await` of one tiny op
//! against a `.sync_on` round trip.

use std::time::Instant;

use cuflow::prelude::*;

use crate::error::BenchError;
use crate::kernels::{empty_kernel, EmptyOp};
use crate::raw::{EventTracking, RawKernel, RawLauncher};
use crate::report::{Goal, Results, Row};

fn chain(kernel: &Kernel, n: usize) -> BoxedOp<'static, ()> {
    let mut op = value(()).boxed();
    for _ in 0..n {
        let k = kernel.clone();
        op = op.then(move |_| EmptyOp(k)).boxed();
    }
    op
}

/// Runs the benchmark with `iters` trials of the chain (clamped to 5..=51).
pub(crate) fn run(device: &Device, iters: usize) -> Result<Results, BenchError> {
    let stream = device.new_stream()?;
    let kernel = empty_kernel();
    // Compile through cuflow first: it reports a missing NVRTC before any raw cudarc call.
    kernel.compile(device)?;
    let mut raw = RawLauncher::new(device, EventTracking::Off, RawKernel::Empty)?;
    let n = 1000;

    // Warm up.
    chain(&kernel, n).sync_on(&stream)?;
    raw.launch_n(n)?;

    let trials = iters.clamp(5, 51);
    let (mut ours, mut theirs, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    let (mut prebuilt, mut one_op) = (Vec::new(), Vec::new());
    let per_op = |t: Instant| t.elapsed().as_secs_f64() * 1e6 / n as f64;
    for _ in 0..trials {
        let t = Instant::now();
        chain(&kernel, n).sync_on(&stream)?;
        ours.push(per_op(t));
        theirs.push(raw.launch_n(n)?.as_secs_f64() * 1e6 / n as f64);
        // The same launches made directly through `Kernel::launch`: what the chain adds to
        // the launch path.
        let elapsed = crate::launch::cuflow_launches(&stream, &kernel, None, n)?;
        direct.push(elapsed.as_secs_f64() * 1e6 / n as f64);
        // Where the chain's own cost lies: the chain built before the timer starts (its
        // execution alone), and one op whose closure makes the same launches (an execution
        // without a chain).
        let built = chain(&kernel, n);
        let t = Instant::now();
        built.sync_on(&stream)?;
        prebuilt.push(per_op(t));
        let k = kernel.clone();
        let t = Instant::now();
        from_fn(move |ctx: &mut ExecutionContext| {
            for _ in 0..n {
                k.launch(
                    ctx.stream()?,
                    LaunchConfig::linear(1, 1),
                    &KernelArgs::new(),
                )?;
            }
            Ok(())
        })
        .sync_on(&stream)?;
        one_op.push(per_op(t));
    }

    // One tiny op: `.await` (default policy, completion reactor) vs `.sync_on`.
    let rounds = 2000;
    for _ in 0..200 {
        futures::executor::block_on(async { EmptyOp(kernel.clone()).await })?;
        EmptyOp(kernel.clone()).sync_on(&stream)?;
    }
    let (mut awaits, mut syncs) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..rounds {
            futures::executor::block_on(async { EmptyOp(kernel.clone()).await })?;
        }
        awaits.push(t.elapsed().as_secs_f64() * 1e6 / rounds as f64);
        let t = Instant::now();
        for _ in 0..rounds {
            EmptyOp(kernel.clone()).sync_on(&stream)?;
        }
        syncs.push(t.elapsed().as_secs_f64() * 1e6 / rounds as f64);
    }

    Ok(Results {
        notes: vec![
            format!(
                "chain: µs per op of a {n}-kernel dependent chain built with `then` (boxed ops, \
                 build + enqueue + sync), median of {trials} trials; raw: {n} launches of the \
                 same empty kernel + sync; direct: the same {n} launches through \
                 Kernel::launch + sync, in the same trials; the chain built before the timer: \
                 its execution + sync alone; one op: a from_fn op whose closure makes the \
                 {n} launches, + sync"
            ),
            format!("round trip: µs per op, median of 7 trials of {rounds} one-kernel ops"),
        ],
        rows: vec![
            Row::from_trials(
                "then-chain of 1000 empty kernels",
                "us/op",
                &ours,
                "raw cudarc launches, tracking off",
                &theirs,
            )
            .with_goal(Goal::AtMost(1.05)),
            Row::from_trials(
                "then-chain of 1000 empty kernels",
                "us/op",
                &ours,
                "the same launches through Kernel::launch",
                &direct,
            ),
            Row::from_trials(
                "the chain built before the timer",
                "us/op",
                &prebuilt,
                "the same launches through Kernel::launch",
                &direct,
            ),
            Row::from_trials(
                "one op making the 1000 launches",
                "us/op",
                &one_op,
                "the same launches through Kernel::launch",
                &direct,
            ),
            Row::from_trials(
                ".await of one tiny op",
                "us",
                &awaits,
                ".sync_on round trip",
                &syncs,
            )
            .with_goal(Goal::AtMost(1.10)),
        ],
    })
}

//! `launch`: the host cost of one empty-kernel launch through cuflow's `Stream`/`Kernel`, beside
//! raw cudarc on the same device in the same process.
//!
//! Five variants, each a loop of back-to-back launches of one thread followed by one stream
//! synchronize, timed with the wall clock (the cost is host-bound: the GPU runs an empty kernel
//! faster than the host enqueues it):
//!
//! - cuflow, `empty_kernel()`, and raw cudarc with event tracking off, the same kernel;
//! - cuflow, `empty_kernel_arg(float*)` with one buffer, and raw cudarc with tracking off;
//! - raw cudarc with tracking on (its default), the one-buffer kernel: there, each buffer
//!   argument costs stream waits and an event record, so it is the baseline a cudarc user who
//!   keeps the defaults pays;
//! - the cross-stream case: the one-buffer kernel launched alternately on two streams, so that
//!   every launch writes a buffer the other stream wrote last and must wait for it: cuflow's
//!   automatic ordering (an event recorded on the other stream and a wait, per launch) beside
//!   raw cudarc with tracking on doing the same;
//! - cuflow, `empty_kernel()`, while a timeline trace is recorded (`cuflow::trace`), beside
//!   the same launches untraced: the cost of tracing when on (two timed events per launch and
//!   the record); the trace is resolved after the timed loop, outside the timing.
//!
//! Trials of the variants are interleaved (a b c d e a b c d e ...) so that clock and thermal
//! drift affect all alike; each figure is the median of its trials.

use std::time::{Duration, Instant};

use cuflow::prelude::*;

use crate::error::BenchError;
use crate::kernels::{empty_arg_kernel, empty_kernel};
use crate::raw::{EventTracking, RawKernel, RawLauncher};
use crate::report::{Goal, Results, Row};

/// Trials of each variant; odd, so the median is one of them. A launch's host cost moves by
/// 5-10% from one trial to the next on a virtual machine; with 21 trials the median of each
/// variant is known to about 1.5%, finer than the 5% goal.
const TRIALS: usize = 21;

/// Launches of each variant before the first trial (compilation, module load, first-launch
/// costs, clocks up).
const WARMUP_LAUNCHES: usize = 500;

/// The project's goal: cuflow, with its checks and automatic access ordering, costs at most
/// this many times raw cudarc with tracking off.
const GOAL: Goal = Goal::AtMost(1.05);

/// Launches `kernel` `n` times on `stream` (with `buffer` as its one argument, if any), then
/// synchronizes; returns the wall time of the whole, synchronize included.
pub(crate) fn cuflow_launches(
    stream: &Stream,
    kernel: &Kernel,
    buffer: Option<&DeviceBuffer<f32>>,
    n: usize,
) -> Result<Duration, DeviceError> {
    let config = LaunchConfig::linear(1, 1);
    let start = Instant::now();
    match buffer {
        None => {
            for _ in 0..n {
                kernel.launch(stream, config, &KernelArgs::new())?;
            }
        }
        Some(buffer) => {
            for _ in 0..n {
                kernel.launch(stream, config, KernelArgs::new().output(buffer))?;
            }
        }
    }
    stream.synchronize()?;
    Ok(start.elapsed())
}

/// Launches the one-buffer `kernel` `n` times, alternately on `a` and `b`, each launch writing
/// `buffer`; then synchronizes both. Every launch is ordered after the previous one on the
/// other stream by cuflow's access ordering.
fn cuflow_alternating(
    (a, b): (&Stream, &Stream),
    kernel: &Kernel,
    buffer: &DeviceBuffer<f32>,
    n: usize,
) -> Result<Duration, DeviceError> {
    let config = LaunchConfig::linear(1, 1);
    let start = Instant::now();
    for i in 0..n {
        let stream = if i % 2 == 0 { a } else { b };
        kernel.launch(stream, config, KernelArgs::new().output(buffer))?;
    }
    a.synchronize()?;
    b.synchronize()?;
    Ok(start.elapsed())
}

/// [`cuflow_launches`] of `kernel` while a trace is recorded; the trace is stopped (its
/// timestamps resolved) after the timing.
fn cuflow_launches_traced(
    stream: &Stream,
    kernel: &Kernel,
    n: usize,
) -> Result<Duration, DeviceError> {
    cuflow::trace::start()?;
    let elapsed = cuflow_launches(stream, kernel, None, n);
    let trace = cuflow::trace::stop()?;
    let launches = trace
        .entries()
        .iter()
        .filter(|e| e.kind == cuflow::trace::EntryKind::Kernel)
        .count();
    if launches != n {
        return Err(DeviceError::internal(format!(
            "the trace holds {launches} launches of the {n} made"
        )));
    }
    elapsed
}

/// One variant: a way to run `n` launches, and its per-trial µs per launch.
struct Variant<'a> {
    launch_n: Box<dyn FnMut(usize) -> Result<Duration, BenchError> + 'a>,
    trials: Vec<f64>,
}

impl<'a> Variant<'a> {
    fn new(launch_n: impl FnMut(usize) -> Result<Duration, BenchError> + 'a) -> Variant<'a> {
        Variant {
            launch_n: Box::new(launch_n),
            trials: Vec::with_capacity(TRIALS),
        }
    }
}

/// Runs the benchmark with `iters` launches per trial.
pub(crate) fn run(device: &Device, iters: usize) -> Result<Results, BenchError> {
    // Each variant launches on streams of its own, as each raw launcher does: what one
    // variant leaves on a stream (the traced one's timing events, the alternating one's
    // cross-stream waits) never lands in another's figure.
    let stream = device.new_stream()?;
    let stream_arg = device.new_stream()?;
    let (alt_a, alt_b) = (device.new_stream()?, device.new_stream()?);
    let stream_traced = device.new_stream()?;
    let no_arg = empty_kernel();
    let one_arg = empty_arg_kernel();
    // Compile through cuflow first: it reports a missing NVRTC or a compile error as a
    // `DeviceError`, before any raw cudarc call.
    no_arg.compile(device)?;
    one_arg.compile(device)?;
    let buffer = DeviceBuffer::<f32>::zeroed(&stream_arg, 1)?;
    let alt_buffer = DeviceBuffer::<f32>::zeroed(&alt_a, 1)?;
    stream_arg.synchronize()?;
    alt_a.synchronize()?;

    let mut raw_off = RawLauncher::new(device, EventTracking::Off, RawKernel::Empty)?;
    let mut raw_off_arg = RawLauncher::new(device, EventTracking::Off, RawKernel::EmptyOneBuffer)?;
    let mut raw_on_arg = RawLauncher::new(device, EventTracking::On, RawKernel::EmptyOneBuffer)?;
    let mut raw_on_alt = RawLauncher::new(device, EventTracking::On, RawKernel::EmptyOneBuffer)?;

    let mut variants = [
        Variant::new(|n| Ok(cuflow_launches(&stream, &no_arg, None, n)?)),
        Variant::new(|n| raw_off.launch_n(n)),
        Variant::new(|n| Ok(cuflow_launches(&stream_arg, &one_arg, Some(&buffer), n)?)),
        Variant::new(|n| raw_off_arg.launch_n(n)),
        Variant::new(|n| raw_on_arg.launch_n(n)),
        Variant::new(|n| {
            Ok(cuflow_alternating(
                (&alt_a, &alt_b),
                &one_arg,
                &alt_buffer,
                n,
            )?)
        }),
        Variant::new(|n| raw_on_alt.launch_n_alternating(n)),
        Variant::new(|n| Ok(cuflow_launches_traced(&stream_traced, &no_arg, n)?)),
    ];
    for variant in &mut variants {
        (variant.launch_n)(WARMUP_LAUNCHES)?;
    }
    for _ in 0..TRIALS {
        for variant in &mut variants {
            let elapsed = (variant.launch_n)(iters)?;
            variant
                .trials
                .push(elapsed.as_secs_f64() * 1e6 / iters as f64);
        }
    }
    let [cuflow_no_arg, raw_off_no_arg, cuflow_one_arg, raw_off_one_arg, raw_on_one_arg, cuflow_alt, raw_on_alt, cuflow_traced] =
        variants.map(|v| v.trials);

    Ok(Results {
        notes: vec![format!(
            "µs per launch: median of {TRIALS} interleaved trials of {iters} back-to-back \
             launches of one thread each, timed on the host including the final stream \
             synchronize; {WARMUP_LAUNCHES} warm-up launches per variant"
        )],
        rows: vec![
            Row::from_trials(
                "cuflow, empty_kernel()",
                "us",
                &cuflow_no_arg,
                "raw cudarc, tracking off, same kernel",
                &raw_off_no_arg,
            )
            .with_goal(GOAL),
            Row::from_trials(
                "cuflow, empty_kernel_arg(float*)",
                "us",
                &cuflow_one_arg,
                "raw cudarc, tracking off, same kernel",
                &raw_off_one_arg,
            )
            .with_goal(GOAL),
            Row::from_trials(
                "cuflow, empty_kernel_arg(float*)",
                "us",
                &cuflow_one_arg,
                "raw cudarc, tracking on, same kernel",
                &raw_on_one_arg,
            ),
            Row::from_trials(
                "cuflow, alternating 2 streams, ordered",
                "us",
                &cuflow_alt,
                "raw cudarc, tracking on, alternating 2 streams",
                &raw_on_alt,
            ),
            Row::from_trials(
                "cuflow, empty_kernel(), trace recording",
                "us",
                &cuflow_traced,
                "cuflow, empty_kernel(), no trace",
                &cuflow_no_arg,
            ),
        ],
    })
}

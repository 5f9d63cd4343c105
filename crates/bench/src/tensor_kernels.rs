//! `kernels`: cuflow's tensor kernels on the GPU, each beside PyTorch eager measured in the same
//! run: saxpy f32 over 2^28 elements, rms_norm and softmax f32 over 4096×4096 and 16384×1024,
//! and matmul 4096³ in f32 and bf16.
//!
//! Timing: a kernel's op is enqueued `iters` times back to back on one stream, with
//! [`enqueue_on`] under [`SingleStream`] on that stream (nothing waits between ops), between
//! two timed events; a trial is the GPU time between the events divided by `iters`, and each
//! figure is the median of [`TRIALS`] trials after [`WARMUP`] warm-up launches. The ops are
//! built inside the loop, as a program builds them. Bandwidth is the bytes a kernel must move
//! (each input read once, each output written once) over its time; matmul's rate is
//! `2·m·n·k` over its time.
//!
//! Before it is timed, every kernel runs once and sampled outputs are checked against a
//! float64 computation on the host, so that a wrong kernel fails the benchmark rather than
//! report a figure.
//!
//! saxpy writes through a partition, whose tiles set the launch decomposition; it is measured
//! under a few partitions, and its headline row, which carries the absolute goal, is the
//! fastest of them.
//!
//! The PyTorch side is [`TORCH_SCRIPT`], written to a temporary file and run with `python3`
//! (or the interpreter named by `CUFLOW_BENCH_PYTHON`) after cuflow's measurements, with the
//! same cases and counts, timed the same way with `torch.cuda.Event`; it prints one JSON
//! object. Where the interpreter or torch is missing, or a case fails there, cuflow's figures
//! are still reported, without that baseline, and a note says why.

use std::sync::Arc;

use cuflow::device_op::enqueue_on;
use cuflow::prelude::*;
use cuflow::runtime::GemmElem;
use serde_json::{json, Value};

use crate::error::BenchError;
use crate::report::{median, Goal, Results, Row};

/// Trials of each figure; odd, so the median is one of them.
const TRIALS: usize = 7;

/// Launches of each kernel before its first trial (after the checked run, which compiles it).
const WARMUP: usize = 5;

/// saxpy's length.
const SAXPY_N: usize = 1 << 28;

/// saxpy's `a`. Every launch adds `a·x` to `y` again; with `|x| < 1`, `y` stays far from
/// overflow over any number of launches a run makes.
const SAXPY_A: f32 = 0.5;

/// The project's goal for saxpy f32, in TB/s.
const SAXPY_GOAL: Goal = Goal::ValueAtLeast(3.0);

/// The shapes (rows, cols) of rms_norm and softmax.
const ROW_SHAPES: [(usize, usize); 2] = [(4096, 4096), (16384, 1024)];

/// rms_norm's epsilon.
const RMS_EPS: f32 = 1e-6;

/// matmul's `m = n = k`.
const MATMUL_SIZE: usize = 4096;

/// The goal of matmul: at least 0.95× PyTorch's rate.
const MATMUL_GOAL: Goal = Goal::AtLeast(0.95);

/// rms_norm and softmax: at least PyTorch eager's bandwidth.
const ROWS_GOAL: Goal = Goal::AtLeast(1.0);

/// The PyTorch baseline; its docstring gives its command line and output.
const TORCH_SCRIPT: &str = include_str!("tensor_kernels_torch.py");

/// Seeds of the random inputs (any fixed values: runs see the same data).
const SEED: u64 = 0x6b65_726e_656c_7300;

/// The matmul element types measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MatmulType {
    F32,
    Bf16,
}

impl MatmulType {
    fn name(self) -> &'static str {
        match self {
            MatmulType::F32 => "f32",
            MatmulType::Bf16 => "bf16",
        }
    }
}

/// One operation measured on both sides, in the order of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Saxpy,
    RmsNorm { rows: usize, cols: usize },
    Softmax { rows: usize, cols: usize },
    Matmul(MatmulType),
}

/// Every case, in the order of the report and of the PyTorch script's results.
const CASES: [Case; 7] = [
    Case::Saxpy,
    Case::RmsNorm {
        rows: ROW_SHAPES[0].0,
        cols: ROW_SHAPES[0].1,
    },
    Case::RmsNorm {
        rows: ROW_SHAPES[1].0,
        cols: ROW_SHAPES[1].1,
    },
    Case::Softmax {
        rows: ROW_SHAPES[0].0,
        cols: ROW_SHAPES[0].1,
    },
    Case::Softmax {
        rows: ROW_SHAPES[1].0,
        cols: ROW_SHAPES[1].1,
    },
    Case::Matmul(MatmulType::F32),
    Case::Matmul(MatmulType::Bf16),
];

impl Case {
    /// The figure's name.
    fn name(self) -> String {
        match self {
            Case::Saxpy => format!("saxpy f32 {}", pow2(SAXPY_N)),
            Case::RmsNorm { rows, cols } => format!("rms_norm f32 {rows}x{cols}"),
            Case::Softmax { rows, cols } => format!("softmax f32 {rows}x{cols}"),
            Case::Matmul(t) => format!("matmul {} {MATMUL_SIZE}^3", t.name()),
        }
    }

    /// The PyTorch call it is compared with.
    fn torch_call(self) -> &'static str {
        match self {
            Case::Saxpy => "PyTorch y.add_(x, alpha=a)",
            Case::RmsNorm { .. } => "PyTorch F.rms_norm",
            Case::Softmax { .. } => "PyTorch torch.softmax(x, -1)",
            Case::Matmul(_) => "PyTorch torch.matmul",
        }
    }

    /// The unit of the figure, and the amount of it one call does: bytes moved, in TB, or
    /// floating-point operations, in TFLOP.
    fn work(self) -> (&'static str, f64) {
        let f32_bytes = std::mem::size_of::<f32>() as f64;
        match self {
            Case::Saxpy => ("TB/s", 3.0 * f32_bytes * SAXPY_N as f64 / 1e12),
            Case::RmsNorm { rows, cols } => (
                "TB/s",
                (2.0 * (rows * cols) as f64 + cols as f64) * f32_bytes / 1e12,
            ),
            Case::Softmax { rows, cols } => ("TB/s", 2.0 * f32_bytes * (rows * cols) as f64 / 1e12),
            Case::Matmul(_) => ("TFLOP/s", 2.0 * (MATMUL_SIZE as f64).powi(3) / 1e12),
        }
    }

    /// The case as the PyTorch script reads it.
    fn torch_json(self) -> Value {
        match self {
            Case::Saxpy => json!({"op": "saxpy", "n": SAXPY_N, "a": SAXPY_A}),
            Case::RmsNorm { rows, cols } => {
                json!({"op": "rms_norm", "rows": rows, "cols": cols, "eps": RMS_EPS})
            }
            Case::Softmax { rows, cols } => json!({"op": "softmax", "rows": rows, "cols": cols}),
            Case::Matmul(t) => json!({
                "op": "matmul",
                "dtype": t.name(),
                "m": MATMUL_SIZE,
                "n": MATMUL_SIZE,
                "k": MATMUL_SIZE,
            }),
        }
    }
}

/// `n` as `2^k` when it is a power of two.
fn pow2(n: usize) -> String {
    if n.is_power_of_two() && n >= 1024 {
        format!("2^{}", n.trailing_zeros())
    } else {
        n.to_string()
    }
}

/// A figure per trial from milliseconds per call: `amount` (TB or TFLOP) per second.
fn rates(amount: f64, ms: &[f64]) -> Vec<f64> {
    ms.iter().map(|ms| amount / (ms * 1e-3)).collect()
}

/// One stream, a policy that keeps every op on it, and the launches per trial.
struct Timer {
    stream: Stream,
    policy: Arc<dyn SchedulingPolicy>,
    launches: usize,
}

impl Timer {
    fn new(device: &Device, launches: usize) -> Result<Timer, BenchError> {
        let stream = device.new_stream()?;
        let policy: Arc<dyn SchedulingPolicy> = Arc::new(SingleStream::on(&stream));
        Ok(Timer {
            stream,
            policy,
            launches,
        })
    }

    /// Enqueues `op` on the stream without waiting for it; its output is dropped (a tensor's
    /// memory is freed in stream order, after the kernel).
    fn enqueue<O: DeviceOp>(&self, op: O) -> Result<(), BenchError> {
        enqueue_on(op, &self.stream, self.policy.clone())?;
        Ok(())
    }

    /// One trial: milliseconds per launch of `launch`, over `launches` back-to-back launches
    /// between two timed events.
    fn trial(
        &self,
        launch: &mut impl FnMut() -> Result<(), BenchError>,
    ) -> Result<f64, BenchError> {
        let start = self.stream.record_timed_event()?;
        for _ in 0..self.launches {
            launch()?;
        }
        let end = self.stream.record_timed_event()?;
        end.synchronize()?;
        Ok(f64::from(start.elapsed_ms(&end)?) / self.launches as f64)
    }

    /// [`WARMUP`] launches, then [`TRIALS`] trials; milliseconds per launch of each.
    fn trials(
        &self,
        mut launch: impl FnMut() -> Result<(), BenchError>,
    ) -> Result<Vec<f64>, BenchError> {
        for _ in 0..WARMUP {
            launch()?;
        }
        self.stream.synchronize()?;
        (0..TRIALS).map(|_| self.trial(&mut launch)).collect()
    }
}

/// SplitMix64: the sample positions of the checks.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `count` indices in `0..n`: the first, the last, and the rest random.
fn sample_indices(n: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64(seed);
    let mut indices = vec![0, n - 1];
    indices.extend((2..count).map(|_| rng.below(n)));
    indices
}

/// Elements `start..start + len` of `t`, read back after the work queued on it.
fn read<T: DType>(
    stream: &Stream,
    t: &Tensor<T>,
    start: usize,
    len: usize,
) -> Result<Vec<T>, BenchError> {
    Ok(t.buffer().slice(start..start + len)?.to_host_vec(stream)?)
}

/// Fails with a [`BenchError::Verification`] when `got` is not within `tol` of `want`.
fn check_close(
    what: impl FnOnce() -> String,
    got: f64,
    want: f64,
    tol: f64,
) -> Result<(), BenchError> {
    if (got - want).abs() <= tol {
        Ok(())
    } else {
        Err(BenchError::Verification(format!(
            "{}: got {got}, expected {want} (tolerance {tol:.3e})",
            what()
        )))
    }
}

/// How saxpy's output is partitioned; each tile is one block of the launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SaxpyPartition {
    /// The `[2^28]` tensor in 1-D tiles of this many elements.
    Tiles1d(usize),
    /// The tensor viewed as `[2^28 / cols, cols]`, one row per tile: a tile spanning the last
    /// axis is contiguous, which the elementwise kernels access with 16-byte vectors.
    Rows(usize),
}

/// The partitions saxpy is measured under: the 1-D tiles a program would write first, and
/// contiguous tiles of 2^16, 2^14 and 2^12 elements (4096, 16384 and 65536 blocks).
const SAXPY_PARTITIONS: [SaxpyPartition; 5] = [
    SaxpyPartition::Tiles1d(1 << 16),
    SaxpyPartition::Tiles1d(1 << 20),
    SaxpyPartition::Rows(1 << 16),
    SaxpyPartition::Rows(1 << 14),
    SaxpyPartition::Rows(1 << 12),
];

impl SaxpyPartition {
    fn shape(self) -> Vec<usize> {
        match self {
            SaxpyPartition::Tiles1d(_) => vec![SAXPY_N],
            SaxpyPartition::Rows(cols) => vec![SAXPY_N / cols, cols],
        }
    }

    fn describe(self) -> String {
        let dims = |d: &[usize]| d.iter().map(|&n| pow2(n)).collect::<Vec<_>>().join(", ");
        let tile = match self {
            SaxpyPartition::Tiles1d(t) => vec![t],
            SaxpyPartition::Rows(cols) => vec![1, cols],
        };
        format!("[{}] in tiles of [{}]", dims(&self.shape()), dims(&tile))
    }

    /// `y` viewed in this partition's shape (sharing its memory).
    fn view(self, y: &Tensor<f32>) -> Result<Tensor<f32>, BenchError> {
        Ok(Tensor::from_buffer(y.buffer().clone(), &self.shape())?)
    }

    /// Enqueues `y += a·x` over this partition; `y` and `x` have [`SaxpyPartition::shape`].
    fn enqueue(
        self,
        timer: &Timer,
        y: &mut Tensor<f32>,
        x: &Tensor<f32>,
    ) -> Result<(), BenchError> {
        match self {
            SaxpyPartition::Tiles1d(t) => {
                timer.enqueue(kernels::saxpy((&mut *y).partition([t]), SAXPY_A, x))
            }
            SaxpyPartition::Rows(cols) => {
                timer.enqueue(kernels::saxpy((&mut *y).partition([1, cols]), SAXPY_A, x))
            }
        }
    }
}

/// saxpy under every partition of [`SAXPY_PARTITIONS`], each checked once; milliseconds per
/// launch of each trial, per partition. Trials of the partitions are interleaved so that clock
/// and thermal drift affect all alike.
fn measure_saxpy(timer: &Timer) -> Result<Vec<Vec<f64>>, BenchError> {
    let stream = &timer.stream;
    let x = api::rand_seeded::<f32>(-1.0, 1.0, &[SAXPY_N], SEED).sync_on(stream)?;
    let y = api::rand_seeded::<f32>(-1.0, 1.0, &[SAXPY_N], SEED + 1).sync_on(stream)?;
    let mut views = SAXPY_PARTITIONS
        .iter()
        .map(|p| Ok((*p, p.view(&y)?, p.view(&x)?)))
        .collect::<Result<Vec<_>, BenchError>>()?;

    const CHUNK: usize = 256;
    let starts = sample_indices(SAXPY_N - CHUNK + 1, 257, SEED);
    let xs = starts
        .iter()
        .map(|&s| read(stream, &x, s, CHUNK))
        .collect::<Result<Vec<_>, _>>()?;
    for (partition, yv, xv) in &mut views {
        let before = starts
            .iter()
            .map(|&s| read(stream, &y, s, CHUNK))
            .collect::<Result<Vec<_>, _>>()?;
        partition.enqueue(timer, yv, xv)?;
        stream.synchronize()?;
        for ((&start, xs), before) in starts.iter().zip(&xs).zip(&before) {
            let after = read(stream, &y, start, CHUNK)?;
            for (i, ((&x, &y0), &y1)) in xs.iter().zip(before).zip(&after).enumerate() {
                let (ax, y0) = (f64::from(SAXPY_A) * f64::from(x), f64::from(y0));
                let tol = 4.0 * f64::from(f32::EPSILON) * (ax.abs() + y0.abs());
                check_close(
                    || format!("saxpy over {}, element {}", partition.describe(), start + i),
                    f64::from(y1),
                    ax + y0,
                    tol,
                )?;
            }
        }
    }

    for (partition, yv, xv) in &mut views {
        for _ in 0..WARMUP {
            partition.enqueue(timer, yv, xv)?;
        }
    }
    stream.synchronize()?;
    let mut trials = vec![Vec::with_capacity(TRIALS); views.len()];
    for _ in 0..TRIALS {
        for ((partition, yv, xv), trials) in views.iter_mut().zip(&mut trials) {
            trials.push(timer.trial(&mut || partition.enqueue(timer, yv, xv))?);
        }
    }
    Ok(trials)
}

/// Outputs of each matmul checked against a float64 dot product.
const CHECKED_PRODUCTS: usize = 256;

/// `MATMUL_SIZE³` matmul of random matrices in `T`, checked once: milliseconds per launch of
/// each trial, and the largest error of the checked outputs relative to `Σ|a·b|` of their dot
/// products.
fn measure_matmul<T: FloatDType + GemmElem>(
    timer: &Timer,
    rel_tol: f64,
    dot_tol: f64,
) -> Result<(Vec<f64>, f64), BenchError> {
    let stream = &timer.stream;
    let n = MATMUL_SIZE;
    let a = api::rand_seeded::<T>(-1.0, 1.0, &[n, n], SEED + 7).sync_on(stream)?;
    let b = api::rand_seeded::<T>(-1.0, 1.0, &[n, n], SEED + 8).sync_on(stream)?;

    let c = kernels::matmul(&a, &b).sync_on(stream)?;
    if c.shape() != [n, n] {
        return Err(BenchError::Verification(format!(
            "matmul {}: the product of two {n}x{n} matrices has shape {:?}",
            T::NAME,
            c.shape()
        )));
    }
    let (ah, bh, ch) = (
        a.to_host_vec_on(stream)?,
        b.to_host_vec_on(stream)?,
        c.to_host_vec_on(stream)?,
    );
    let rows = sample_indices(n, CHECKED_PRODUCTS, SEED + 9);
    let cols = sample_indices(n, CHECKED_PRODUCTS, SEED + 10);
    let mut worst = 0.0f64;
    for (&i, &j) in rows.iter().zip(cols.iter().rev()) {
        let (mut want, mut magnitude) = (0.0f64, 0.0f64);
        for p in 0..n {
            let term = ah[i * n + p].to_f64() * bh[p * n + j].to_f64();
            want += term;
            magnitude += term.abs();
        }
        let got = ch[i * n + j].to_f64();
        worst = worst.max((got - want).abs() / magnitude);
        check_close(
            || format!("matmul {}, element ({i}, {j})", T::NAME),
            got,
            want,
            rel_tol * want.abs() + dot_tol * magnitude,
        )?;
    }
    drop(c);

    let trials = timer.trials(|| timer.enqueue(kernels::matmul(&a, &b)))?;
    Ok((trials, worst))
}

/// What the PyTorch script measured.
struct TorchRun {
    /// Per case of [`CASES`], in order: milliseconds per call of each trial, or why the case
    /// failed there.
    cases: Vec<Result<Vec<f64>, String>>,
    /// The versions and device it ran on, and the script's own notes.
    notes: Vec<String>,
}

/// Runs [`TORCH_SCRIPT`] on [`CASES`] with `launches` calls per trial; `Err` says why there is
/// no PyTorch baseline at all.
fn run_torch(launches: usize) -> Result<TorchRun, String> {
    let args = json!({
        "trials": TRIALS,
        "launches": launches,
        "warmup": WARMUP,
        "cases": CASES.iter().map(|c| c.torch_json()).collect::<Vec<_>>(),
    });
    let reply = crate::python::run_script("kernels", TORCH_SCRIPT, &args)?;
    parse_torch_reply(&reply)
}

/// Reads the script's JSON output (see [`TORCH_SCRIPT`]).
fn parse_torch_reply(reply: &Value) -> Result<TorchRun, String> {
    let cases = reply["cases"]
        .as_array()
        .filter(|cases| cases.len() == CASES.len())
        .ok_or_else(|| format!("the PyTorch script's reply has no result per case: {reply}"))?
        .iter()
        .map(
            |case| match (case["ms"].as_array(), case["error"].as_str()) {
                (Some(ms), _) => ms
                    .iter()
                    .map(|v| v.as_f64().filter(|v| *v > 0.0))
                    .collect::<Option<Vec<f64>>>()
                    .filter(|ms| ms.len() == TRIALS)
                    .ok_or_else(|| format!("malformed trials {case}")),
                (None, Some(error)) => Err(error.to_string()),
                (None, None) => Err(format!("malformed result {case}")),
            },
        )
        .collect();
    let text = |key: &str| reply[key].as_str().unwrap_or("unknown").to_string();
    let mut notes = vec![format!(
        "baseline: PyTorch {} (CUDA {}) eager, in a separate process on {}, after cuflow's \
         measurements; f32 matmul with torch.backends.cuda.matmul.allow_tf32 = {}, so both \
         sides compute in full f32 (bf16: PyTorch's defaults)",
        text("torch_version"),
        text("cuda_version"),
        text("device_name"),
        if reply["allow_tf32"] == json!(false) {
            "False"
        } else {
            "True (it could not be turned off)"
        },
    )];
    if let Some(script_notes) = reply["notes"].as_array() {
        notes.extend(
            script_notes
                .iter()
                .filter_map(Value::as_str)
                .map(|n| format!("baseline: {n}")),
        );
    }
    Ok(TorchRun { cases, notes })
}

/// A row of `case`'s figure, from cuflow's and PyTorch's milliseconds per call.
fn row(case: Case, figure: String, ours_ms: &[f64], theirs_ms: Result<&[f64], &str>) -> Row {
    let (unit, amount) = case.work();
    let ours = rates(amount, ours_ms);
    match theirs_ms {
        Ok(ms) => Row::from_trials(figure, unit, &ours, case.torch_call(), &rates(amount, ms)),
        Err(_) => Row::without_baseline(
            figure,
            unit,
            &ours,
            format!("{} (unavailable)", case.torch_call()),
        ),
    }
    .higher_is_better()
}

/// Rows of `rows × cols` checked for rms_norm and softmax.
const CHECKED_ROWS: usize = 16;

/// rms_norm of random rows with a random weight, checked once; milliseconds per launch of each
/// trial.
fn measure_rms_norm(timer: &Timer, rows: usize, cols: usize) -> Result<Vec<f64>, BenchError> {
    let stream = &timer.stream;
    let x = api::randn_seeded::<f32>(0.0, 1.0, &[rows, cols], SEED + 2).sync_on(stream)?;
    let w = api::rand_seeded::<f32>(0.5, 1.5, &[cols], SEED + 3).sync_on(stream)?;

    let out = kernels::rms_norm(&x, &w, RMS_EPS).sync_on(stream)?;
    let weight = w.to_host_vec_on(stream)?;
    for r in sample_indices(rows, CHECKED_ROWS, SEED + 4) {
        let xr = read(stream, &x, r * cols, cols)?;
        let got = read(stream, &out, r * cols, cols)?;
        let mean_square = xr.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / cols as f64;
        let scale = 1.0 / (mean_square + f64::from(RMS_EPS)).sqrt();
        for (c, ((&xv, &wv), &g)) in xr.iter().zip(&weight).zip(&got).enumerate() {
            let want = f64::from(xv) * scale * f64::from(wv);
            check_close(
                || format!("rms_norm {rows}x{cols}, element ({r}, {c})"),
                f64::from(g),
                want,
                1e-4 * want.abs() + 1e-5,
            )?;
        }
    }
    drop(out);

    timer.trials(|| timer.enqueue(kernels::rms_norm(&x, &w, RMS_EPS)))
}

/// softmax over the last axis of random rows, checked once; milliseconds per launch of each
/// trial.
fn measure_softmax(timer: &Timer, rows: usize, cols: usize) -> Result<Vec<f64>, BenchError> {
    let stream = &timer.stream;
    let x = api::randn_seeded::<f32>(0.0, 1.0, &[rows, cols], SEED + 5).sync_on(stream)?;

    let out = kernels::softmax(&x).sync_on(stream)?;
    for r in sample_indices(rows, CHECKED_ROWS, SEED + 6) {
        let xr = read(stream, &x, r * cols, cols)?;
        let got = read(stream, &out, r * cols, cols)?;
        let max = xr
            .iter()
            .map(|&v| f64::from(v))
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = xr.iter().map(|&v| (f64::from(v) - max).exp()).sum();
        for (c, (&xv, &g)) in xr.iter().zip(&got).enumerate() {
            let want = (f64::from(xv) - max).exp() / sum;
            check_close(
                || format!("softmax {rows}x{cols}, element ({r}, {c})"),
                f64::from(g),
                want,
                1e-4 * want.abs() + 1e-8,
            )?;
        }
    }
    drop(out);

    timer.trials(|| timer.enqueue(kernels::softmax(&x)))
}

/// Runs the benchmark with `iters` launches per trial.
pub(crate) fn run(device: &Device, iters: usize) -> Result<Results, BenchError> {
    let timer = Timer::new(device, iters)?;

    // cuflow first, each kernel checked, then timed.
    let saxpy = measure_saxpy(&timer)?;
    let mut measured: Vec<(Case, Vec<f64>, Goal)> = Vec::new();
    let mut matmul_f32_error = f64::NAN;
    for case in CASES {
        let (trials, goal) = match case {
            // Measured above, under every partition.
            Case::Saxpy => continue,
            Case::RmsNorm { rows, cols } => (measure_rms_norm(&timer, rows, cols)?, ROWS_GOAL),
            Case::Softmax { rows, cols } => (measure_softmax(&timer, rows, cols)?, ROWS_GOAL),
            Case::Matmul(MatmulType::F32) => {
                let (trials, worst) = measure_matmul::<f32>(&timer, 1e-5, 1e-4)?;
                matmul_f32_error = worst;
                (trials, MATMUL_GOAL)
            }
            Case::Matmul(MatmulType::Bf16) => {
                (measure_matmul::<bf16>(&timer, 1e-2, 1e-3)?.0, MATMUL_GOAL)
            }
        };
        measured.push((case, trials, goal));
    }
    // Nothing of cuflow's runs on the GPU while PyTorch does.
    timer.stream.synchronize()?;

    let mut notes = vec![
        format!(
            "GPU time from CUDA events around {iters} back-to-back launches on one stream \
             (ops enqueued with enqueue_on under SingleStream, no wait per op), per launch, \
             median of {TRIALS} trials after {WARMUP} warm-up launches; PyTorch timed the same \
             way with torch.cuda.Event"
        ),
        "TB/s = bytes moved / time: saxpy 3·4·n (read x, read y, write y), rms_norm \
         2·4·rows·cols + 4·cols (x, out, weight), softmax 2·4·rows·cols; TFLOP/s = 2·m·n·k / \
         time"
            .to_string(),
        format!(
            "each kernel was checked once before timing against float64 on the host (sampled \
             outputs); f32 matmul's largest sampled error is {matmul_f32_error:.1e} of Σ|a·b| \
             (full f32 accumulation gives about 1e-7 here, TF32 inputs about 1e-5)"
        ),
        format!(
            "saxpy is measured under {} partitions (each tile one block; saxpy has no \
             unpartitioned launch); the first saxpy row is the fastest of them",
            SAXPY_PARTITIONS.len()
        ),
    ];
    let theirs: Vec<Result<Vec<f64>, String>> = match run_torch(iters) {
        Ok(run) => {
            notes.extend(run.notes);
            for (case, result) in CASES.iter().zip(&run.cases) {
                if let Err(why) = result {
                    notes.push(format!("baseline unavailable for {}: {why}", case.name()));
                }
            }
            run.cases
        }
        Err(why) => {
            notes.push(format!("baseline unavailable: no PyTorch figures ({why})"));
            CASES.iter().map(|_| Err(why.clone())).collect()
        }
    };
    let baseline = |case: Case| {
        let i = CASES.iter().position(|c| *c == case).unwrap_or(usize::MAX);
        match theirs.get(i) {
            Some(Ok(ms)) => Ok(ms.as_slice()),
            Some(Err(why)) => Err(why.as_str()),
            None => Err("not measured"),
        }
    };

    let best = saxpy
        .iter()
        .enumerate()
        .min_by(|(_, a), (_, b)| median(a).total_cmp(&median(b)))
        .map_or(0, |(i, _)| i);
    let mut rows = vec![row(
        Case::Saxpy,
        format!(
            "{}, fastest: {}",
            Case::Saxpy.name(),
            SAXPY_PARTITIONS[best].describe()
        ),
        &saxpy[best],
        baseline(Case::Saxpy),
    )
    .with_goal(SAXPY_GOAL)];
    for (partition, trials) in SAXPY_PARTITIONS.iter().zip(&saxpy) {
        rows.push(row(
            Case::Saxpy,
            format!("{}, {}", Case::Saxpy.name(), partition.describe()),
            trials,
            baseline(Case::Saxpy),
        ));
    }
    for (case, trials, goal) in measured {
        rows.push(row(case, case.name(), &trials, baseline(case)).with_goal(goal));
    }
    Ok(Results { notes, rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_per_call() {
        let (unit, tb) = Case::Saxpy.work();
        assert_eq!(unit, "TB/s");
        assert_eq!(tb, 12.0 * (1u64 << 28) as f64 / 1e12);
        let (_, tb) = Case::Softmax {
            rows: 4096,
            cols: 4096,
        }
        .work();
        assert_eq!(tb, 8.0 * 4096.0 * 4096.0 / 1e12);
        let (_, tb) = Case::RmsNorm { rows: 2, cols: 3 }.work();
        assert_eq!(tb, (8.0 * 6.0 + 4.0 * 3.0) / 1e12);
        let (unit, tflop) = Case::Matmul(MatmulType::Bf16).work();
        assert_eq!(unit, "TFLOP/s");
        assert_eq!(tflop, 2.0 * 4096f64.powi(3) / 1e12);
        // 1 TB in 1 s.
        assert_eq!(rates(1.0, &[1000.0, 500.0]), vec![1.0, 2.0]);
    }

    #[test]
    fn names() {
        assert_eq!(Case::Saxpy.name(), "saxpy f32 2^28");
        assert_eq!(Case::Matmul(MatmulType::F32).name(), "matmul f32 4096^3");
        assert_eq!(SAXPY_PARTITIONS[0].describe(), "[2^28] in tiles of [2^16]");
        assert_eq!(
            SAXPY_PARTITIONS[3].describe(),
            "[2^14, 2^14] in tiles of [1, 2^14]"
        );
        for p in SAXPY_PARTITIONS {
            assert_eq!(p.shape().iter().product::<usize>(), SAXPY_N);
        }
    }

    #[test]
    fn samples_cover_both_ends() {
        let s = sample_indices(100, 10, 1);
        assert_eq!(s.len(), 10);
        assert_eq!((s[0], s[1]), (0, 99));
        assert!(s.iter().all(|&i| i < 100));
        assert_eq!(s, sample_indices(100, 10, 1));
    }

    fn reply(cases: Value) -> Value {
        json!({
            "torch_version": "2.5.1",
            "cuda_version": "12.4",
            "device_name": "Test GPU",
            "allow_tf32": false,
            "notes": ["a note"],
            "cases": cases,
        })
    }

    #[test]
    fn reads_the_torch_reply() {
        let trials = json!([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        let mut cases: Vec<Value> = CASES.iter().map(|_| json!({"ms": trials})).collect();
        cases[6] = json!({"error": "RuntimeError: no bf16"});
        let run = parse_torch_reply(&reply(Value::from(cases))).unwrap();
        assert_eq!(run.cases.len(), CASES.len());
        assert_eq!(run.cases[0].as_ref().unwrap()[6], 7.0);
        assert_eq!(run.cases[6], Err("RuntimeError: no bf16".into()));
        assert!(run.notes[0].contains("PyTorch 2.5.1 (CUDA 12.4)"));
        assert!(run.notes[0].contains("allow_tf32 = False"));
        assert_eq!(run.notes[1], "baseline: a note");
    }

    #[test]
    fn rejects_malformed_torch_replies() {
        // One result short.
        let short: Vec<Value> = CASES[1..].iter().map(|_| json!({"ms": [1.0]})).collect();
        assert!(parse_torch_reply(&reply(Value::from(short))).is_err());
        // Wrong trial counts and non-positive times are per-case errors.
        let mut cases: Vec<Value> = CASES
            .iter()
            .map(|_| json!({"ms": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}))
            .collect();
        cases[1] = json!({"ms": [1.0]});
        cases[2] = json!({"ms": [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]});
        cases[3] = json!({});
        let run = parse_torch_reply(&reply(Value::from(cases))).unwrap();
        assert!(run.cases[0].is_ok());
        assert!(run.cases[1].is_err() && run.cases[2].is_err() && run.cases[3].is_err());
    }

    #[test]
    fn rows_with_and_without_a_baseline() {
        let with = row(Case::Saxpy, "s".into(), &[1.0], Ok(&[2.0]));
        assert!(!with.lower_is_better);
        assert_eq!(with.ratio(), Some(2.0));
        let without = row(Case::Saxpy, "s".into(), &[2.0], Err("no torch")).with_goal(SAXPY_GOAL);
        assert_eq!(without.baseline, None);
        assert!(without.baseline_name.ends_with("(unavailable)"));
        // saxpy's goal is absolute, so it is decided without the baseline: 3.22 TB moved
        // per second at 1 ms a call, half that at 2 ms.
        assert_eq!(without.goal_met(), Some(false));
        let fast = row(Case::Saxpy, "s".into(), &[1.0], Err("no torch")).with_goal(SAXPY_GOAL);
        assert_eq!(fast.goal_met(), Some(true));
    }

    #[test]
    fn the_case_list_matches_the_script() {
        for case in CASES {
            let op = case.torch_json()["op"].as_str().unwrap().to_string();
            assert!(TORCH_SCRIPT.contains(&format!("op == \"{op}\"")), "{op}");
        }
    }
}

//! `kernels`: cuflow's tensor kernels on the GPU, each beside PyTorch eager measured in the same
//! run: saxpy f32 over 2^28 elements, rms_norm and softmax f32 over 4096×4096 and 16384×1024,
//! matmul 4096³ in f32 and bf16, and over an 8192×8192 f32 matrix the strided and broadcast
//! elementwise kernel (a column broadcast, a transposed view) and axis reductions (sum over
//! each axis, argmax over the first).
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
//!
//! [`enqueue_on`]: cuflow::device_op::enqueue_on
//! [`TORCH_SCRIPT`]: torch::TORCH_SCRIPT

mod measure;
mod strided;
mod torch;

use cuflow::prelude::*;
use serde_json::{json, Value};

use self::measure::{
    measure_matmul, measure_rms_norm, measure_saxpy, measure_softmax, Timer, SAXPY_PARTITIONS,
};
use self::strided::Strided;
use self::torch::run_torch;
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

/// The side of the matrix of the strided, broadcast and reduction cases.
const STRIDED_N: usize = 8192;

/// Strided, broadcast and reduction kernels: at least 0.9× PyTorch eager's bandwidth.
const STRIDED_GOAL: Goal = Goal::AtLeast(0.9);

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
    Strided(Strided),
}

/// Every case, in the order of the report and of the PyTorch script's results.
const CASES: [Case; 12] = [
    Case::Saxpy,
    Case::rms_norm(ROW_SHAPES[0]),
    Case::rms_norm(ROW_SHAPES[1]),
    Case::softmax(ROW_SHAPES[0]),
    Case::softmax(ROW_SHAPES[1]),
    Case::Matmul(MatmulType::F32),
    Case::Matmul(MatmulType::Bf16),
    Case::Strided(Strided::BroadcastAdd),
    Case::Strided(Strided::TransposedAdd),
    Case::Strided(Strided::SumAxis(0)),
    Case::Strided(Strided::SumAxis(1)),
    Case::Strided(Strided::ArgmaxAxis0),
];

impl Case {
    /// rms_norm over `(rows, cols)`.
    const fn rms_norm((rows, cols): (usize, usize)) -> Case {
        Case::RmsNorm { rows, cols }
    }

    /// softmax over `(rows, cols)`.
    const fn softmax((rows, cols): (usize, usize)) -> Case {
        Case::Softmax { rows, cols }
    }

    /// The figure's name.
    fn name(self) -> String {
        match self {
            Case::Saxpy => format!("saxpy f32 {}", pow2(SAXPY_N)),
            Case::RmsNorm { rows, cols } => format!("rms_norm f32 {rows}x{cols}"),
            Case::Softmax { rows, cols } => format!("softmax f32 {rows}x{cols}"),
            Case::Matmul(t) => format!("matmul {} {MATMUL_SIZE}^3", t.name()),
            Case::Strided(s) => s.name(),
        }
    }

    /// The PyTorch call it is compared with.
    fn torch_call(self) -> &'static str {
        match self {
            Case::Saxpy => "PyTorch y.add_(x, alpha=a)",
            Case::RmsNorm { .. } => "PyTorch F.rms_norm",
            Case::Softmax { .. } => "PyTorch torch.softmax(x, -1)",
            Case::Matmul(_) => "PyTorch torch.matmul",
            Case::Strided(s) => s.torch_call(),
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
            Case::Strided(s) => ("TB/s", s.terabytes()),
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
            Case::Strided(s) => s.torch_json(),
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
            Case::Strided(s) => (strided::measure(&timer, s)?, STRIDED_GOAL),
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
         2·4·rows·cols + 4·cols (x, out, weight), softmax 2·4·rows·cols, broadcast add \
         4·(2·n² + n), transposed add 3·4·n², sum_axis and argmax_axis 4·(n² + n); TFLOP/s = \
         2·m·n·k / time"
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
}

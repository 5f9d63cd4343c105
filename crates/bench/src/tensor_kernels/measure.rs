//! cuflow's side of the kernel benchmark: each kernel run once and checked against float64 on
//! the host at sampled outputs, then timed with CUDA events around back-to-back launches on
//! one stream.

use std::sync::Arc;

use cuflow::device_op::enqueue_on;
use cuflow::prelude::*;
use cuflow::runtime::GemmElem;

use super::{pow2, MATMUL_SIZE, RMS_EPS, SAXPY_A, SAXPY_N, SEED, TRIALS, WARMUP};
use crate::error::BenchError;

/// One stream, a policy that keeps every op on it, and the launches per trial.
pub(super) struct Timer {
    pub(super) stream: Stream,
    policy: Arc<dyn SchedulingPolicy>,
    launches: usize,
}

impl Timer {
    pub(super) fn new(device: &Device, launches: usize) -> Result<Timer, BenchError> {
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
    pub(super) fn enqueue<O: DeviceOp>(&self, op: O) -> Result<(), BenchError> {
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
    pub(super) fn trials(
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
pub(super) fn sample_indices(n: usize, count: usize, seed: u64) -> Vec<usize> {
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
pub(super) enum SaxpyPartition {
    /// The `[2^28]` tensor in 1-D tiles of this many elements.
    Tiles1d(usize),
    /// The tensor viewed as `[2^28 / cols, cols]`, one row per tile: a tile spanning the last
    /// axis is contiguous, which the elementwise kernels access with 16-byte vectors.
    Rows(usize),
}

/// The partitions saxpy is measured under: the 1-D tiles a program would write first, and
/// contiguous tiles of 2^16, 2^14 and 2^12 elements (4096, 16384 and 65536 blocks).
pub(super) const SAXPY_PARTITIONS: [SaxpyPartition; 5] = [
    SaxpyPartition::Tiles1d(1 << 16),
    SaxpyPartition::Tiles1d(1 << 20),
    SaxpyPartition::Rows(1 << 16),
    SaxpyPartition::Rows(1 << 14),
    SaxpyPartition::Rows(1 << 12),
];

impl SaxpyPartition {
    pub(super) fn shape(self) -> Vec<usize> {
        match self {
            SaxpyPartition::Tiles1d(_) => vec![SAXPY_N],
            SaxpyPartition::Rows(cols) => vec![SAXPY_N / cols, cols],
        }
    }

    pub(super) fn describe(self) -> String {
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
pub(super) fn measure_saxpy(timer: &Timer) -> Result<Vec<Vec<f64>>, BenchError> {
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
pub(super) fn measure_matmul<T: FloatDType + GemmElem>(
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

/// Rows of `rows × cols` checked for rms_norm and softmax.
const CHECKED_ROWS: usize = 16;

/// Checks [`CHECKED_ROWS`] sampled rows of `out`, computed by `what` from the rows of `x`
/// (`rows × cols`), against `reference` (a float64 row from an input row), each element within
/// `1e-4` of its value plus `abs_tol`.
fn check_rows(
    stream: &Stream,
    what: &str,
    (x, out): (&Tensor<f32>, &Tensor<f32>),
    (rows, cols): (usize, usize),
    seed: u64,
    abs_tol: f64,
    reference: impl Fn(&[f32]) -> Vec<f64>,
) -> Result<(), BenchError> {
    for r in sample_indices(rows, CHECKED_ROWS, seed) {
        let want = reference(&read(stream, x, r * cols, cols)?);
        let got = read(stream, out, r * cols, cols)?;
        for (c, (&g, &want)) in got.iter().zip(&want).enumerate() {
            check_close(
                || format!("{what} {rows}x{cols}, element ({r}, {c})"),
                f64::from(g),
                want,
                1e-4 * want.abs() + abs_tol,
            )?;
        }
    }
    Ok(())
}

/// rms_norm of random rows with a random weight, checked once; milliseconds per launch of each
/// trial.
pub(super) fn measure_rms_norm(
    timer: &Timer,
    rows: usize,
    cols: usize,
) -> Result<Vec<f64>, BenchError> {
    let stream = &timer.stream;
    let x = api::randn_seeded::<f32>(0.0, 1.0, &[rows, cols], SEED + 2).sync_on(stream)?;
    let w = api::rand_seeded::<f32>(0.5, 1.5, &[cols], SEED + 3).sync_on(stream)?;

    let out = kernels::rms_norm(&x, &w, RMS_EPS).sync_on(stream)?;
    let weight = w.to_host_vec_on(stream)?;
    check_rows(
        stream,
        "rms_norm",
        (&x, &out),
        (rows, cols),
        SEED + 4,
        1e-5,
        |xr| {
            let mean_square = xr.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / cols as f64;
            let scale = 1.0 / (mean_square + f64::from(RMS_EPS)).sqrt();
            xr.iter()
                .zip(&weight)
                .map(|(&xv, &wv)| f64::from(xv) * scale * f64::from(wv))
                .collect()
        },
    )?;
    drop(out);

    timer.trials(|| timer.enqueue(kernels::rms_norm(&x, &w, RMS_EPS)))
}

/// softmax over the last axis of random rows, checked once; milliseconds per launch of each
/// trial.
pub(super) fn measure_softmax(
    timer: &Timer,
    rows: usize,
    cols: usize,
) -> Result<Vec<f64>, BenchError> {
    let stream = &timer.stream;
    let x = api::randn_seeded::<f32>(0.0, 1.0, &[rows, cols], SEED + 5).sync_on(stream)?;

    let out = kernels::softmax(&x).sync_on(stream)?;
    check_rows(
        stream,
        "softmax",
        (&x, &out),
        (rows, cols),
        SEED + 6,
        1e-8,
        |xr| {
            let max = xr
                .iter()
                .map(|&v| f64::from(v))
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = xr.iter().map(|&v| (f64::from(v) - max).exp()).sum();
            xr.iter()
                .map(|&xv| (f64::from(xv) - max).exp() / sum)
                .collect()
        },
    )?;
    drop(out);

    timer.trials(|| timer.enqueue(kernels::softmax(&x)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_cover_both_ends() {
        let s = sample_indices(100, 10, 1);
        assert_eq!(s.len(), 10);
        assert_eq!((s[0], s[1]), (0, 99));
        assert!(s.iter().all(|&i| i < 100));
        assert_eq!(s, sample_indices(100, 10, 1));
    }
}

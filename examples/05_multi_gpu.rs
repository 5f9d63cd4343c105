//! Several GPUs: a batch of matrix products split over every visible device by the
//! `MultiDevice` policy, each result gathered onto the first device with `.to_device(..)`, and
//! checked against a float64 computation on the host.
//!
//! Uses every CUDA device when CUDA is usable, else the host backend (one device);
//! `CUFLOW_DEVICE=host|cuda|cuda:N` chooses explicitly (with `cuda:N`, device N comes first).

use std::time::Instant;

use cuflow::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The devices to spread the batch over: `Device::auto()` first, then every other CUDA device.
fn visible_devices() -> Result<Vec<Device>, DeviceError> {
    let first = Device::auto()?;
    let mut devices = vec![first.clone()];
    if first.kind() == BackendKind::Cuda {
        for ordinal in 0..Device::cuda_count() {
            let device = Device::cuda(ordinal)?;
            if device != first {
                devices.push(device);
            }
        }
    }
    Ok(devices)
}

/// `softmax(relu(a · b))` over rows, in float64, for square `n × n` matrices.
fn reference(a: &[f32], b: &[f32], n: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; n * n];
    for i in 0..n {
        let row = &mut out[i * n..(i + 1) * n];
        for l in 0..n {
            let av = f64::from(a[i * n + l]);
            for (o, bv) in row.iter_mut().zip(&b[l * n..(l + 1) * n]) {
                *o += av * f64::from(*bv);
            }
        }
        row.iter_mut().for_each(|v| *v = v.max(0.0));
        let max = row.iter().copied().fold(f64::MIN, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        row.iter_mut().for_each(|v| *v = (*v - max).exp() / sum);
    }
    out
}

/// Relative error of `got` against `want` in the 2-norm.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Refuses arguments (it takes none); prints an error of the run with its `Display` form,
/// which says what went wrong and how to fix it (a missing driver names the host backend as
/// the way out), and exits with status 1.
fn main() {
    if let Some(arg) = std::env::args().nth(1) {
        eprintln!("error: unexpected argument {arg:?}; 05_multi_gpu takes no arguments");
        std::process::exit(1);
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), DeviceError> {
    let devices = visible_devices()?;
    let home = devices[0].clone();
    // 512 × 512 on GPUs; smaller on the host backend, whose GEMM runs on the CPU.
    let n = if home.kind() == BackendKind::Cuda {
        512
    } else {
        192
    };
    let batch = 8;
    println!(
        "{batch} products of {n}x{n} matrices over {} device(s): {}",
        devices.len(),
        devices
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let mut rng = StdRng::seed_from_u64(5);
    let mut random =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect() };
    let inputs: Vec<(Vec<f32>, Vec<f32>)> =
        (0..batch).map(|_| (random(n * n), random(n * n))).collect();

    // One branch per product. Branch i runs on device i mod N; its inputs are uploaded inside
    // the branch, so they live where it computes. The result then moves to the first device.
    let policy = MultiDevice::new(&devices, 2)?;
    let ops: Vec<_> = inputs
        .iter()
        .map(|(a, b)| {
            let home = home.clone();
            kernels::softmax(kernels::relu(kernels::matmul(
                api::from_slice(a, &[n, n]),
                api::from_slice(b, &[n, n]),
            )))
            .then(move |y| {
                let computed_on = y.device().clone();
                y.to_device(&home).map(move |y| (y, computed_on))
            })
        })
        .collect();
    let start = Instant::now();
    let (results, stats) = join_all(ops).sync_with_policy(&policy)?;
    println!(
        "computed and gathered in {:.1} ms on {} streams",
        start.elapsed().as_secs_f64() * 1e3,
        stats.streams.len()
    );

    let mut worst = 0.0f64;
    for (i, ((y, computed_on), (a, b))) in results.iter().zip(&inputs).enumerate() {
        assert_eq!(y.device(), &home, "every result is gathered on {home}");
        let err = rel_err(&y.to_host_vec()?, &reference(a, b, n));
        println!("product {i}: computed on {computed_on}, relative error {err:.2e}");
        worst = worst.max(err);
    }
    if worst > 2e-5 {
        return Err(DeviceError::usage(format!(
            "a result differs from the host's float64 computation: relative error {worst:e}"
        )));
    }
    println!("all {batch} results match the host computation (worst relative error {worst:.2e})");
    Ok(())
}

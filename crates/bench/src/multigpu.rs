//! `multigpu`: a batch of independent 4096³ f32 matrix products spread over two GPUs by
//! `MultiDevice`, against the same batch on one GPU; and the bandwidth of a 256 MiB copy from
//! GPU 0 to GPU 1, peer-to-peer (where the driver allows it) against staged through pinned host
//! memory.
//!
//! It needs two CUDA devices; with fewer it says so and the program exits with the status of a
//! missing device.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use cuflow::prelude::*;
use cuflow::runtime::DeviceId;

use crate::error::BenchError;
use crate::report::{median, Goal, Results, Row};

/// The side of each square matrix.
const N: usize = 4096;

/// Products per batch: eight per GPU of the two-GPU run.
const BATCH: usize = 16;

/// Bytes per copy of the bandwidth figures.
const COPY_BYTES: usize = 256 << 20;

/// Streams per device in the policies.
const STREAMS_PER_DEVICE: usize = 4;

/// The inputs of the products on each device: `a` all ones and `b` all halves, so that every
/// element of `a · b` is exactly `N / 2`.
type Inputs = Arc<HashMap<DeviceId, (Arc<Tensor<f32>>, Arc<Tensor<f32>>)>>;

fn inputs_on(devices: &[Device]) -> Result<Inputs, BenchError> {
    let mut map = HashMap::new();
    for d in devices {
        let stream = d.new_stream()?;
        let a = api::ones::<f32>(&[N, N]).sync_on(&stream)?;
        let b = api::full::<f32>(&[N, N], 0.5).sync_on(&stream)?;
        map.insert(d.id(), (Arc::new(a), Arc::new(b)));
    }
    Ok(Arc::new(map))
}

/// One product of the batch, of the inputs on the device its branch runs on.
struct Product(Inputs);

impl DeviceOp for Product {
    type Output = Tensor<f32>;

    fn execute(self, ctx: &mut ExecutionContext) -> Result<Tensor<f32>, DeviceError> {
        let (a, b) = self.0.get(&ctx.device().id()).cloned().ok_or_else(|| {
            DeviceError::usage(format!(
                "the benchmark has no inputs on {}, where a branch was placed",
                ctx.device()
            ))
        })?;
        kernels::matmul(a, b).execute(ctx)
    }
}

/// The batch as one op: `BATCH` independent products, one `join_all` branch each.
fn batch(inputs: &Inputs) -> impl DeviceOp<Output = Vec<Tensor<f32>>> + use<> {
    join_all((0..BATCH).map(|_| Product(inputs.clone())).collect())
}

/// Milliseconds per batch under `policy`, one per trial, after a warm-up; checks one product
/// of the last batch on each device.
fn time_batches(
    policy: &MultiDevice,
    inputs: &Inputs,
    trials: usize,
) -> Result<Vec<f64>, BenchError> {
    batch(inputs).sync_with_policy(policy)?;
    let mut times = Vec::with_capacity(trials);
    let mut last = Vec::new();
    for _ in 0..trials {
        let start = Instant::now();
        let (out, _) = batch(inputs).sync_with_policy(policy)?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
        last = out;
    }
    for d in policy.devices() {
        let Some(product) = last.iter().find(|t| t.device() == d) else {
            return Err(BenchError::Verification(format!(
                "no product of the batch ran on {d}"
            )));
        };
        let want = (N / 2) as f32;
        if let Some(bad) = product.to_host_vec()?.into_iter().find(|v| *v != want) {
            return Err(BenchError::Verification(format!(
                "a product on {d} holds {bad}, expected {want}"
            )));
        }
    }
    Ok(times)
}

/// GB/s of copying `COPY_BYTES` from `src` into `dst`, one per trial, after a warm-up; the
/// copy is enqueued on `stream` (of `dst`'s device) and waited for.
fn time_copies(
    stream: &Stream,
    src: &DeviceBuffer<u8>,
    dst: &DeviceBuffer<u8>,
    staged: bool,
    trials: usize,
) -> Result<Vec<f64>, BenchError> {
    let copy = || {
        if staged {
            dst.copy_from_device_staged(stream, src)
        } else {
            dst.copy_from_device(stream, src)
        }
    };
    copy()?;
    stream.synchronize()?;
    let mut rates = Vec::with_capacity(trials);
    for _ in 0..trials {
        let start = Instant::now();
        copy()?;
        stream.synchronize()?;
        rates.push(COPY_BYTES as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    Ok(rates)
}

/// Runs the benchmark with `iters` trials (clamped to 3..=21) on `device` and the next CUDA
/// device.
pub(crate) fn run(device: &Device, iters: usize) -> Result<Results, BenchError> {
    let visible = Device::cuda_count();
    if visible < 2 {
        return Err(BenchError::MissingDevices { needed: 2, visible });
    }
    let other_ordinal = match device.ordinal() {
        Some(0) | None => 1,
        Some(_) => 0,
    };
    let other = Device::cuda(other_ordinal)?;
    let pair = [device.clone(), other.clone()];
    let trials = iters.clamp(3, 21);

    let inputs = inputs_on(&pair)?;
    let one = MultiDevice::new(&pair[..1], STREAMS_PER_DEVICE)?;
    let two = MultiDevice::new(&pair, STREAMS_PER_DEVICE)?;
    let one_ms = time_batches(&one, &inputs, trials)?;
    let two_ms = time_batches(&two, &inputs, trials)?;
    drop(inputs);
    let flops = (BATCH * 2 * N * N * N) as f64;
    let tflops = |ms: &[f64]| flops / (median(ms) * 1e-3) / 1e12;
    let speedup = median(&one_ms) / median(&two_ms);

    let (src_stream, dst_stream) = (device.new_stream()?, other.new_stream()?);
    let src = DeviceBuffer::<u8>::alloc(&src_stream, COPY_BYTES)?;
    src.view().fill_bytes(&src_stream, 0x5A)?;
    let dst = DeviceBuffer::<u8>::alloc(&dst_stream, COPY_BYTES)?;
    src_stream.synchronize()?;
    let peer = other.can_access_peer(device)?;
    let direct = time_copies(&dst_stream, &src, &dst, false, trials)?;
    let staged = time_copies(&dst_stream, &src, &dst, true, trials)?;
    if let Some(bad) = dst
        .to_host_vec(&dst_stream)?
        .into_iter()
        .find(|b| *b != 0x5A)
    {
        return Err(BenchError::Verification(format!(
            "the copy to {other} holds byte {bad:#x}, expected 0x5a"
        )));
    }

    Ok(Results {
        notes: vec![
            format!(
                "{BATCH} independent {N}x{N}x{N} f32 matmuls (cuBLAS, no TF32) as one join_all \
                 under MultiDevice ({STREAMS_PER_DEVICE} streams per device), wall time per \
                 batch, median of {trials} trials: {:.1} TFLOP/s on {device}, {:.1} TFLOP/s \
                 on {device} and {other}",
                tflops(&one_ms),
                tflops(&two_ms)
            ),
            format!(
                "{} MiB copy from {device} to {other}, enqueued and waited for, median of \
                 {trials} trials; {}",
                COPY_BYTES >> 20,
                if peer {
                    "peer access available: copy_from_device is a peer copy"
                } else {
                    "no peer access between these devices: copy_from_device is staged too"
                }
            ),
        ],
        rows: vec![
            Row::derived(
                "batch throughput, 2 GPUs / 1 GPU",
                "x",
                speedup,
                "1.0 (no scaling)",
                1.0,
            )
            .higher_is_better()
            .with_goal(Goal::AtLeast(1.8)),
            Row::from_trials(
                format!("{BATCH} matmuls {N}^3 on 2 GPUs"),
                "ms",
                &two_ms,
                "the same on 1 GPU",
                &one_ms,
            ),
            Row::from_trials(
                format!(
                    "copy_from_device {} MiB ({})",
                    COPY_BYTES >> 20,
                    if peer { "peer" } else { "staged" }
                ),
                "GB/s",
                &direct,
                "copy_from_device_staged",
                &staged,
            )
            .higher_is_better(),
        ],
    })
}

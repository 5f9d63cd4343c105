//! `copies`: copies between pageable host memory and the device through cuflow
//! (`BufferView::copy_from_host`, `BufferView::copy_to_host`) beside raw cudarc's
//! `memcpy_htod` / `memcpy_dtoh` of the same pageable memory, for 256 KiB to 256 MiB.
//!
//! On CUDA cuflow stages both directions through page-locked memory of the device's own (so
//! that a copy never waits for the stream's earlier work while it holds the buffer's
//! ordering); the driver stages pageable copies through buffers of its own. These figures say
//! what cuflow's staging costs, or gains, in bandwidth. Each trial is one copy enqueued and
//! waited for (`Stream::synchronize` after a copy from the host; a copy to the host waits by
//! itself), timed with the wall clock; trials of the two sides alternate, and each figure is
//! the median of its trials. The bytes that each side copied are checked once, after the
//! timed trials.

use std::time::Instant;

use cuflow::prelude::*;

use crate::error::BenchError;
use crate::raw::RawCopier;
use crate::report::{Results, Row};

/// The sizes copied, in bytes.
const SIZES: [usize; 7] = [
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
    128 << 20,
    256 << 20,
];

/// A byte pattern that no zeroed or one-byte-filled buffer holds.
fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(11) as u8 ^ salt)
        .collect()
}

/// `bytes` as the figures name it: "256 KiB", "16 MiB".
fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// GB/s of `bytes` moved in `seconds`.
fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Runs the benchmark with `iters` trials per size and direction (clamped to 3..=51).
pub(crate) fn run(device: &Device, iters: usize) -> Result<Results, BenchError> {
    let trials = iters.clamp(3, 51);
    let stream = device.new_stream()?;
    let max = SIZES[SIZES.len() - 1];
    let buffer = DeviceBuffer::<u8>::zeroed(&stream, max)?;
    let mut raw = RawCopier::new(device, max)?;
    let mut rows = Vec::new();
    for &bytes in &SIZES {
        let data = pattern(bytes, 0x3c);
        let mut back = vec![0u8; bytes];
        let view = buffer.slice(..bytes)?;
        // Warm-up: the staging buffers, the driver's, page faults of `back`.
        for _ in 0..2 {
            view.copy_from_host(&stream, &data)?;
            stream.synchronize()?;
            view.copy_to_host(&stream, &mut back)?;
            raw.upload(&data)?;
            raw.download(&mut back)?;
        }
        let (mut ours_up, mut raw_up, mut ours_down, mut raw_down) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..trials {
            let t = Instant::now();
            view.copy_from_host(&stream, &data)?;
            stream.synchronize()?;
            ours_up.push(gbps(bytes, t.elapsed().as_secs_f64()));
            let t = Instant::now();
            raw.upload(&data)?;
            raw_up.push(gbps(bytes, t.elapsed().as_secs_f64()));
            let t = Instant::now();
            view.copy_to_host(&stream, &mut back)?;
            ours_down.push(gbps(bytes, t.elapsed().as_secs_f64()));
            let t = Instant::now();
            raw.download(&mut back)?;
            raw_down.push(gbps(bytes, t.elapsed().as_secs_f64()));
        }
        // What each side copied: a pattern neither buffer holds yet, read back by the side
        // that wrote it.
        let check = pattern(bytes, 0xa5);
        back.fill(0);
        view.copy_from_host(&stream, &check)?;
        view.copy_to_host(&stream, &mut back)?;
        if back != check {
            return Err(BenchError::Verification(format!(
                "cuflow's copy of {bytes} bytes to the device and back differs from the data"
            )));
        }
        back.fill(0);
        raw.upload(&check)?;
        raw.download(&mut back)?;
        if back != check {
            return Err(BenchError::Verification(format!(
                "raw cudarc's copy of {bytes} bytes to the device and back differs from the data"
            )));
        }
        let size = size_label(bytes);
        rows.push(
            Row::from_trials(
                format!("copy_from_host {size}"),
                "GB/s",
                &ours_up,
                "raw cudarc memcpy_htod, pageable",
                &raw_up,
            )
            .higher_is_better(),
        );
        rows.push(
            Row::from_trials(
                format!("copy_to_host {size}"),
                "GB/s",
                &ours_down,
                "raw cudarc memcpy_dtoh, pageable",
                &raw_down,
            )
            .higher_is_better(),
        );
    }
    Ok(Results {
        notes: vec![format!(
            "GB/s of one copy between pageable host memory and the device, enqueued and waited \
             for; median of {trials} trials per size and direction, the two sides alternating; \
             cuflow stages copies of up to 128 MiB through the device's page-locked \
             buffers (larger ones go through the driver's staging), raw cudarc's copies go \
             through the driver's staging"
        )],
        rows,
    })
}

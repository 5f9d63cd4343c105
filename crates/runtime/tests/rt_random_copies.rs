//! Random sequences of copies and kernels over sub-views of a few buffers, on three streams
//! at random, against a host model of every buffer: copies from and to the host (pageable
//! memory, staged through page-locked buffers and cut into parts copied by several threads
//! past a size), copies between views of two buffers, byte fills, and kernels that write a
//! view after a spin without the host waiting for them. Sizes cross the thresholds of the
//! staged copies (one part, several parts, parts on helper threads). Every read back must
//! give the model's elements: a copy that read or wrote before the work ordered before it,
//! or a part left uncopied, shows as a wrong element. Four threads run sequences at once.
//! `CUFLOW_RANDOM_COPIES=N` runs N times as many sequences.

use cuflow_runtime::{DeviceBuffer, DeviceError, KernelArgs, LaunchConfig, Stream};
use cuflow_testing::{
    device::device,
    kernels,
    rng::{scale_from_env, seeded_rng},
    thread::within_a_minute,
};
use rand::rngs::StdRng;
use rand::Rng;

/// Lengths of the buffers, in `f32`s: empty, tiny, under and over the sizes where staged
/// copies are cut into parts (256 KiB) and spread over threads (1 MiB).
const LENS: [usize; 6] = [0, 1, 1000, 65_539, 300_007, 1_100_003];

/// Cycles of the spin before a kernel's write: about 50 µs (a 50 µs sleep on the host).
const SPIN: u64 = 100_000;

/// A range of `0..len`, often empty or whole.
fn range(rng: &mut StdRng, len: usize) -> std::ops::Range<usize> {
    match rng.gen_range(0..6) {
        0 => 0..len,
        1 => {
            let at = rng.gen_range(0..=len);
            at..at
        }
        _ => {
            let a = rng.gen_range(0..=len);
            let b = rng.gen_range(0..=len);
            a.min(b)..a.max(b)
        }
    }
}

/// One sequence: `steps` random operations over three buffers, then every buffer read back.
fn sequence(
    rng: &mut StdRng,
    streams: &[Stream],
    steps: usize,
    what: &str,
) -> Result<(), DeviceError> {
    let lens: Vec<usize> = (0..3).map(|_| LENS[rng.gen_range(0..LENS.len())]).collect();
    let mut model: Vec<Vec<f32>> = lens
        .iter()
        .map(|&n| (0..n).map(|i| i as f32).collect())
        .collect();
    let bufs: Vec<DeviceBuffer<f32>> = model
        .iter()
        .map(|m| DeviceBuffer::from_host(&streams[0], m))
        .collect::<Result<_, _>>()?;
    let mut log = Vec::new();
    for _ in 0..steps {
        let s = &streams[rng.gen_range(0..streams.len())];
        let b = rng.gen_range(0..bufs.len());
        let r = range(rng, lens[b]);
        match rng.gen_range(0..6) {
            0 => {
                let data: Vec<f32> = (0..r.len()).map(|_| rng.gen_range(-1e6..1e6)).collect();
                bufs[b].slice(r.clone())?.copy_from_host(s, &data)?;
                model[b][r.clone()].copy_from_slice(&data);
                log.push(format!("from host {b}[{r:?}]"));
            }
            1 => {
                let mut out = vec![f32::NAN; r.len()];
                bufs[b].slice(r.clone())?.copy_to_host(s, &mut out)?;
                log.push(format!("to host {b}[{r:?}]"));
                compare(&out, &model[b][r.clone()], what, &log);
            }
            2 => {
                // A copy between views of two different buffers.
                let c = (b + 1 + rng.gen_range(0..bufs.len() - 1)) % bufs.len();
                let n = r.len().min(lens[c]);
                let at = rng.gen_range(0..=lens[c] - n);
                let (src, dst) = (r.start..r.start + n, at..at + n);
                bufs[c]
                    .slice(dst.clone())?
                    .copy_from(s, bufs[b].slice(src.clone())?)?;
                let moved = model[b][src.clone()].to_vec();
                model[c][dst.clone()].copy_from_slice(&moved);
                log.push(format!("device {b}[{src:?}] to {c}[{dst:?}]"));
            }
            3 => {
                let byte = rng.gen_range(0..=255u8);
                bufs[b].slice(r.clone())?.fill_bytes(s, byte)?;
                model[b][r.clone()].fill(f32::from_ne_bytes([byte; 4]));
                log.push(format!("fill {b}[{r:?}] with {byte:#x}"));
            }
            _ => {
                // A kernel writes the view after a spin; nothing waits for it here.
                if r.is_empty() {
                    continue;
                }
                let value = f32::from(rng.gen_range(-1000i16..1000));
                kernels::spin().launch(
                    s,
                    LaunchConfig::linear(1, 1),
                    KernelArgs::new().scalar(SPIN),
                )?;
                let view = bufs[b].slice(r.clone())?;
                kernels::fill().launch(
                    s,
                    LaunchConfig::for_num_elems(r.len()),
                    KernelArgs::new()
                        .output(view)
                        .scalar(value)
                        .scalar(r.len() as u32),
                )?;
                model[b][r.clone()].fill(value);
                log.push(format!("kernel fill {b}[{r:?}] with {value}"));
            }
        }
    }
    for (b, buf) in bufs.iter().enumerate() {
        let s = &streams[rng.gen_range(0..streams.len())];
        compare(
            &buf.to_host_vec(s)?,
            &model[b],
            &format!("{what}, buffer {b} at the end"),
            &log,
        );
    }
    Ok(())
}

/// Bitwise comparison (fills write NaN patterns too).
#[track_caller]
fn compare(got: &[f32], want: &[f32], what: &str, log: &[String]) {
    assert_eq!(got.len(), want.len(), "{what}");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i} is {} where the model has {} (of {}), after {log:?}",
            got[i],
            want[i],
            want.len()
        );
    }
}

#[test]
fn random_copies_and_kernels_over_views_match_a_host_model() {
    within_a_minute("random copies hung", || {
        let device = device();
        let count = 6 * scale_from_env("CUFLOW_RANDOM_COPIES");
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let device = device.clone();
                scope.spawn(move || {
                    let seed = 0x0c09_1e50_0001 ^ ((t + 1) << 32);
                    let mut rng = seeded_rng(seed);
                    let streams: Vec<Stream> = (0..3)
                        .map(|_| device.new_stream().expect("a stream"))
                        .collect();
                    for s in 0..count {
                        let what = format!("thread {t}, sequence {s} of seed {seed:#x}");
                        sequence(&mut rng, &streams, 16, &what)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                    }
                });
            }
        });
    });
}

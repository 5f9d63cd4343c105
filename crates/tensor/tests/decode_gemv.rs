//! The fused decode GEMV against float64 references: every input (plain, RMS norm) with every
//! epilogue (store, residual add, SwiGLU), on ragged shapes and on products large enough to
//! stream their weights through shared memory; on whatever `Device::auto()` gives.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::trace::{self, EntryKind};
use cuflow_runtime::{DeviceError, Stream};
use cuflow_tensor::kernels::decode::{self, GemvEpilogue, GemvInput};
use cuflow_tensor::{api, bf16, Tensor};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng as rng;
use cuflow_testing::tensor::{read, upload};
use rand::rngs::StdRng;
use rand::Rng;

/// `(rows, cols)`: a single row, odd row counts (the last row pair is half used), rows too
/// few to fill a device (split over several warps) and many, short rows (fewer 16-byte
/// vectors than a warp has lanes) and long ones (8192 columns), columns not a multiple of a
/// warp's 256-element stride, and an input too long to stage in shared memory (read through
/// the norm as it is loaded).
const SHAPES: &[(usize, usize)] = &[
    (1, 8),
    (2, 8),
    (7, 24),
    (33, 1000),
    (64, 256),
    (130, 2048),
    (5, 8192),
    (258, 520),
    (2050, 64),
    (6, 8200),
];

/// Largest error allowed, relative to the sum of the magnitudes of the terms (`f32`
/// accumulation over up to 8192 products).
const TOL: f64 = 2e-5;

const EPS: f32 = 1e-5;

fn random_f32(rng: &mut StdRng, n: usize, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-scale..scale) as f32)
        .collect()
}

fn random_bf16(rng: &mut StdRng, n: usize, scale: f64) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f64(rng.gen_range(-scale..scale)))
        .collect()
}

/// The input the GEMV multiplies by, in `f64`: `x`, or its RMS norm times `weight`.
fn input_ref(x: &[f32], norm: Option<&[bf16]>) -> Vec<f64> {
    let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    match norm {
        None => x,
        Some(w) => {
            let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
            let r = 1.0 / (ms + f64::from(EPS)).sqrt();
            x.iter().zip(w).map(|(v, g)| v * r * g.to_f64()).collect()
        }
    }
}

/// `(Σ w·x, Σ |w·x|)` of each row.
fn products(w: &[bf16], x: &[f64]) -> Vec<(f64, f64)> {
    w.chunks(x.len())
        .map(|row| {
            row.iter().zip(x).fold((0.0, 0.0), |(s, a), (w, x)| {
                (s + w.to_f64() * x, a + (w.to_f64() * x).abs())
            })
        })
        .collect()
}

fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

/// Runs one variant on `(rows, cols)` and checks every output element.
fn check(s: &Stream, rng: &mut StdRng, (n, k): (usize, usize), norm: bool, e: GemvEpilogue) {
    let wh = random_bf16(rng, n * k, 1.0);
    let xh = random_f32(rng, k, 3.0);
    let gh = random_bf16(rng, k, 2.0);
    let out_len = if e == GemvEpilogue::SwiGlu { n / 2 } else { n };
    // Outputs start poisoned; the residual add starts from random values it must keep.
    let start: Vec<f32> = match e {
        GemvEpilogue::Accumulate => random_f32(rng, out_len, 4.0),
        _ => vec![f32::NAN; out_len],
    };
    let w = upload(s, &wh, &[n, k]);
    let x = upload(s, &xh, &[k]);
    let g = upload(s, &gh, &[k]);
    let mut out = upload(s, &start, &[out_len]);
    let input = if norm {
        GemvInput::RmsNorm {
            weight: &g,
            eps: EPS,
        }
    } else {
        GemvInput::Plain
    };
    decode::gemv_fused(&mut out, &w, &x, input, e)
        .sync_on(s)
        .expect("the fused GEMV runs");
    let got = read(&out);
    let y = products(&wh, &input_ref(&xh, norm.then_some(&gh[..])));
    // (reference, scale of its rounding errors) per output element.
    let want: Vec<(f64, f64)> = match e {
        GemvEpilogue::Store => y,
        GemvEpilogue::Accumulate => y
            .iter()
            .zip(&start)
            .map(|(&(v, a), &o)| (f64::from(o) + v, a + f64::from(o).abs()))
            .collect(),
        GemvEpilogue::SwiGlu => {
            let (gate, up) = y.split_at(n / 2);
            gate.iter()
                .zip(up)
                .map(|(&(gv, ga), &(uv, ua))| {
                    let v = silu(gv) * uv;
                    // silu' is at most 1.1 in magnitude; expf adds a few ulps of `v`.
                    (v, 1.1 * ga * uv.abs() + (gv.abs() + 0.3) * ua + v.abs())
                })
                .collect()
        }
    };
    for (i, (&got, &(v, scale))) in got.iter().zip(&want).enumerate() {
        let err = (f64::from(got) - v).abs() / scale.max(f64::MIN_POSITIVE);
        assert!(
            err <= TOL,
            "{e:?} (norm {norm}) on [{n}, {k}]: element {i} is {got}, want {v} \
             (error {err:e} of the terms' magnitude {scale:e})"
        );
    }
}

#[test]
fn fused_gemv_matches_float64() {
    let s = stream();
    let mut rng = rng(14);
    for &shape in SHAPES {
        for norm in [false, true] {
            for e in [GemvEpilogue::Store, GemvEpilogue::Accumulate] {
                check(&s, &mut rng, shape, norm, e);
            }
            let (n, k) = shape;
            check(&s, &mut rng, (2 * n, k), norm, GemvEpilogue::SwiGlu);
        }
    }
}

/// `(rows, cols)` of at least 12 MB of weights with whole 512-column slabs and too few rows
/// for a warp each on a device of 100 or more multiprocessors, which stream through shared
/// memory on devices of compute capability 9.0 and later: a QKV-like product, odd rows
/// (blocks of unequal runs; for SwiGLU, 2001 outputs), a down-projection-like product (16
/// slabs a row), and an input of 16384 columns (64 KiB staged beside the ring).
const STREAMED: &[(usize, usize)] = &[(3072, 2048), (2001, 3072), (1500, 8192), (400, 16384)];

#[test]
fn streamed_gemv_matches_float64() {
    let s = stream();
    let mut rng = rng(16);
    // Devices that copy in bulk, with the 227 KiB of shared memory a block of the datacenter
    // GPUs of compute capability 9.0 and later may opt into (every case here fits in it).
    let device = s.device();
    let bulk = device.compute_capability().is_some_and(|cc| cc >= (9, 0))
        && device.limits().max_shared_mem_per_block_optin >= 227 * 1024;
    let mut cases = Vec::new();
    for &(n, k) in STREAMED {
        for norm in [false, true] {
            cases.push(((n, k), norm, GemvEpilogue::Store));
            cases.push(((n, k), norm, GemvEpilogue::Accumulate));
            cases.push(((2 * n, k), norm, GemvEpilogue::SwiGlu));
        }
    }
    if !bulk {
        // Nothing streams here, and float64 checks of these sizes are slow on the host: one
        // product checks that the launch keeps the grid-stride kernel.
        cases.truncate(1);
    } else if device.limits().multiprocessor_count < 100 {
        // With fewer multiprocessors the others have rows enough for a warp each; the 400
        // rows of 16384 columns stream on any device of seven or more.
        cases.retain(|&((_, k), _, _)| k == 16384);
    }
    let _serial = trace::tests_serial();
    trace::start().expect("a trace starts");
    for &(shape, norm, e) in &cases {
        check(&s, &mut rng, shape, norm, e);
    }
    let trace = trace::stop().expect("the trace stops");
    let streamed = trace
        .entries()
        .iter()
        .filter(|e| e.kind == EntryKind::Kernel && e.name.ends_with("_ring"))
        .count();
    // Only these products are large enough to stream, in this binary.
    assert_eq!(
        streamed,
        if bulk { cases.len() } else { 0 },
        "streaming launches on {:?}",
        s.device().compute_capability()
    );
}

#[test]
fn gemv_reads_the_given_row_of_x() {
    let s = stream();
    let mut rng = rng(15);
    let (n, k) = (37, 136);
    let wh = random_bf16(&mut rng, n * k, 1.0);
    let xh = random_f32(&mut rng, 3 * k, 2.0);
    let w = upload(&s, &wh, &[n, k]);
    let x = upload(&s, &xh, &[3, k]);
    let mut out = upload(&s, &vec![f32::NAN; n], &[n]);
    decode::gemv(&mut out, &w, &x, 2).sync_on(&s).unwrap();
    let want = products(&wh, &input_ref(&xh[2 * k..], None));
    for (got, (v, scale)) in read(&out).iter().zip(want) {
        assert!((f64::from(*got) - v).abs() <= TOL * scale, "{got} vs {v}");
    }
}

fn zeros(s: &Stream, shape: &[usize]) -> Tensor<f32> {
    api::zeros::<f32>(shape).sync_on(s).unwrap()
}

#[test]
fn fused_gemv_rejects_bad_shapes() {
    let s = stream();
    let bf = |shape: &[usize]| {
        api::zeros::<bf16>(shape)
            .sync_on(&s)
            .expect("a zero weight")
    };
    let is_shape_error = |r: Result<(), DeviceError>| {
        matches!(
            r,
            Err(DeviceError::InvalidShape {
                op: "gemv_fused",
                ..
            })
        )
    };
    let (w, w_odd, w_ragged) = (bf(&[6, 16]), bf(&[5, 16]), bf(&[6, 12]));
    let x = zeros(&s, &[16]);
    let norm_short = bf(&[8]);
    let plain = GemvInput::Plain;
    let run = |out: &mut Tensor<f32>, w: &Tensor<bf16>, x: &Tensor<f32>, i, e| {
        decode::gemv_fused(out, w, x, i, e).sync_on(&s)
    };
    // Columns not a multiple of 8.
    let x12 = zeros(&s, &[12]);
    assert!(is_shape_error(run(
        &mut zeros(&s, &[6]),
        &w_ragged,
        &x12,
        plain,
        GemvEpilogue::Store
    )));
    // `out` of the wrong length, for a plain and a SwiGLU epilogue.
    assert!(is_shape_error(run(
        &mut zeros(&s, &[5]),
        &w,
        &x,
        plain,
        GemvEpilogue::Accumulate
    )));
    assert!(is_shape_error(run(
        &mut zeros(&s, &[6]),
        &w,
        &x,
        plain,
        GemvEpilogue::SwiGlu
    )));
    // SwiGLU of an odd row count.
    assert!(is_shape_error(run(
        &mut zeros(&s, &[2]),
        &w_odd,
        &x,
        plain,
        GemvEpilogue::SwiGlu
    )));
    // `x` and the norm weight must hold one value per column.
    assert!(is_shape_error(run(
        &mut zeros(&s, &[6]),
        &w,
        &zeros(&s, &[8]),
        plain,
        GemvEpilogue::Store
    )));
    let norm = GemvInput::RmsNorm {
        weight: &norm_short,
        eps: EPS,
    };
    assert!(is_shape_error(run(
        &mut zeros(&s, &[6]),
        &w,
        &x,
        norm,
        GemvEpilogue::Store
    )));
}

/// A weight without columns multiplies to zeros (empty sums), written over whatever `out`
/// held: stored, through SwiGLU (`silu(0) · 0`), and through an RMS norm of the empty input;
/// the residual add leaves `out` as it was.
#[test]
fn a_weight_without_columns_gives_zeros() -> Result<(), DeviceError> {
    let s = stream();
    let w = api::zeros::<bf16>(&[4, 0]).sync_on(&s)?;
    let x = zeros(&s, &[0]);
    let norm_weight = api::zeros::<bf16>(&[0]).sync_on(&s)?;
    let poisoned = |n: usize| api::full::<f32>(&[n], 7.0).sync_on(&s);
    let mut out = poisoned(4)?;
    decode::gemv(&mut out, &w, &x, 0).sync_on(&s)?;
    assert_eq!(read(&out), vec![0.0; 4], "gemv");
    let cases = [
        (GemvInput::Plain, GemvEpilogue::Store, 4, 0.0),
        (GemvInput::Plain, GemvEpilogue::SwiGlu, 2, 0.0),
        (GemvInput::Plain, GemvEpilogue::Accumulate, 4, 7.0),
        (
            GemvInput::RmsNorm {
                weight: &norm_weight,
                eps: EPS,
            },
            GemvEpilogue::Store,
            4,
            0.0,
        ),
    ];
    for (input, epilogue, n, want) in cases {
        let mut out = poisoned(n)?;
        decode::gemv_fused(&mut out, &w, &x, input, epilogue).sync_on(&s)?;
        assert_eq!(read(&out), vec![want; n], "{input:?} {epilogue:?}");
    }
    Ok(())
}

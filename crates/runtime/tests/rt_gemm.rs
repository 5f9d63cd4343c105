//! GEMM: `C = alpha · op(A) · op(B) + beta · C` over row-major matrices, checked against a
//! float64 reference on random inputs for every element type, transpose and scaling; batches
//! at dense, broadcast and padded strides; empty dimensions; refused shapes; capture and
//! replay; many threads with a stream each.

use cuflow_runtime::{
    gemm, BackendKind, Device, DeviceBuffer, DeviceError, GemmConfig, GemmElem, Stream,
};
use cuflow_testing::{
    device::{device, stream},
    measure::assert_close_in_norm,
    rng::rng,
    test_cases,
};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::Rng;

/// An element type under test: conversions to and from the float64 reference, and the largest
/// error allowed, relative to the size of the terms summed (`|alpha| · Σ|a·b| + |beta · c|`).
trait Elem: GemmElem + std::fmt::Debug {
    const TOL: f64;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
}

impl Elem for f32 {
    const TOL: f64 = 1e-4;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Elem for f64 {
    const TOL: f64 = 1e-10;
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}

impl Elem for f16 {
    const TOL: f64 = 5e-3;
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Elem for bf16 {
    const TOL: f64 = 2e-2;
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

fn random<T: Elem>(rng: &mut StdRng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| T::from_f64(rng.gen_range(-1.0..1.0)))
        .collect()
}

fn widen<T: Elem>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Elements an operand of `rows × cols` takes over the batch.
fn span(cfg: &GemmConfig, stride: usize, rows: usize, cols: usize) -> usize {
    if cfg.batch == 0 {
        0
    } else {
        (cfg.batch - 1) * stride + rows * cols
    }
}

fn a_len(cfg: &GemmConfig) -> usize {
    span(cfg, cfg.stride_a, cfg.m, cfg.k)
}

fn b_len(cfg: &GemmConfig) -> usize {
    span(cfg, cfg.stride_b, cfg.k, cfg.n)
}

fn c_len(cfg: &GemmConfig) -> usize {
    span(cfg, cfg.stride_c, cfg.m, cfg.n)
}

/// The float64 result for every element of `C`'s view (elements between the matrices of a
/// padded batch keep their value), with the size of the terms summed into each.
fn reference(cfg: &GemmConfig, a: &[f64], b: &[f64], c: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (alpha, beta) = (cfg.alpha as f64, cfg.beta as f64);
    let mut want = c.to_vec();
    let mut size = vec![0.0; c.len()];
    for t in 0..cfg.batch {
        for i in 0..cfg.m {
            for j in 0..cfg.n {
                let (mut sum, mut abs) = (0.0, 0.0);
                for p in 0..cfg.k {
                    let x = a[t * cfg.stride_a
                        + if cfg.trans_a {
                            p * cfg.m + i
                        } else {
                            i * cfg.k + p
                        }];
                    let y = b[t * cfg.stride_b
                        + if cfg.trans_b {
                            j * cfg.k + p
                        } else {
                            p * cfg.n + j
                        }];
                    sum += x * y;
                    abs += (x * y).abs();
                }
                let at = t * cfg.stride_c + i * cfg.n + j;
                let old = if beta == 0.0 { 0.0 } else { beta * c[at] };
                want[at] = alpha * sum + old;
                size[at] = alpha.abs() * abs + old.abs();
            }
        }
    }
    (want, size)
}

/// Whether element `at` of `C`'s view belongs to a matrix of the batch.
fn in_batch(cfg: &GemmConfig, at: usize) -> bool {
    cfg.m * cfg.n > 0
        && (0..cfg.batch).any(|t| {
            let start = t * cfg.stride_c;
            (start..start + cfg.m * cfg.n).contains(&at)
        })
}

/// Runs `cfg` on the device under test with random `A`, `B` and `C` (`C` is NaN where
/// `beta == 0`, which must then not be read) and checks it against the reference.
fn check<T: Elem>(s: &Stream, rng: &mut StdRng, cfg: GemmConfig) -> Result<(), DeviceError> {
    let a: Vec<T> = random(rng, a_len(&cfg));
    let b: Vec<T> = random(rng, b_len(&cfg));
    let mut c: Vec<T> = random(rng, c_len(&cfg));
    if cfg.beta == 0.0 {
        for (at, x) in c.iter_mut().enumerate() {
            if in_batch(&cfg, at) {
                *x = T::from_f64(f64::NAN);
            }
        }
    }
    let (ab, bb, cb) = (
        DeviceBuffer::from_host(s, &a)?,
        DeviceBuffer::from_host(s, &b)?,
        DeviceBuffer::from_host(s, &c)?,
    );
    gemm(s, cfg, ab.view(), bb.view(), cb.view())?;
    let got = widen(&cb.to_host_vec(s)?);
    let (want, size) = reference(&cfg, &widen(&a), &widen(&b), &widen(&c));
    let scale = size.iter().cloned().fold(f64::MIN_POSITIVE, f64::max);
    let mut worst = 0.0f64;
    for (at, (g, w)) in got.iter().zip(&want).enumerate() {
        if !in_batch(&cfg, at) {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{} {cfg:?}: element {at} between the batch's matrices changed: {g} (was {w})",
                std::any::type_name::<T>()
            );
            continue;
        }
        assert!(
            g.is_finite(),
            "{} {cfg:?}: element {at} is {g}",
            std::any::type_name::<T>()
        );
        worst = worst.max((g - w).abs() / scale);
    }
    assert!(
        worst <= T::TOL,
        "{} {cfg:?}: relative error {worst:e} exceeds {:e}",
        std::any::type_name::<T>(),
        T::TOL
    );
    Ok(())
}

/// Awkward sizes, every transpose, and scalings that overwrite and that accumulate.
fn check_all_shapes<T: Elem>() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = rng();
    let shapes = [
        (1, 1, 1),
        (7, 7, 7),
        (1, 7, 3),
        (7, 1, 5),
        (33, 65, 17),
        (128, 256, 64),
        (5, 600, 300),
    ];
    for (m, n, k) in shapes {
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            for (alpha, beta) in [(1.0, 0.0), (-0.75, 0.0), (1.5, 1.0), (0.5, -2.0)] {
                let cfg = GemmConfig::new(m, n, k)
                    .transpose(trans_a, trans_b)
                    .scale(alpha, beta);
                check::<T>(&s, &mut rng, cfg)?;
            }
        }
    }
    Ok(())
}

test_cases! {
    f32_products_match_the_reference => check_all_shapes::<f32>(),
    f64_products_match_the_reference => check_all_shapes::<f64>(),
    f16_products_accumulate_in_f32 => check_all_shapes::<f16>(),
    bf16_products_accumulate_in_f32 => check_all_shapes::<bf16>(),
}

/// A sum that f16 accumulation would get wrong: 4096 products of 1 (f16 counts exactly only
/// up to 2048).
#[test]
fn half_precision_sums_are_not_accumulated_in_half_precision() -> Result<(), DeviceError> {
    let s = stream();
    let k = 4096;
    for (a, b) in [
        (vec![f16::ONE; k], vec![f16::ONE; k]),
        (vec![f16::from_f32(0.5); k], vec![f16::from_f32(2.0); k]),
    ] {
        let (ab, bb) = (
            DeviceBuffer::from_host(&s, &a)?,
            DeviceBuffer::from_host(&s, &b)?,
        );
        let c = DeviceBuffer::<f16>::zeroed(&s, 1)?;
        gemm(&s, GemmConfig::new(1, 1, k), ab.view(), bb.view(), c.view())?;
        assert_eq!(c.to_host_vec(&s)?, vec![f16::from_f32(4096.0)]);
    }
    let ones = vec![bf16::ONE; k];
    let (ab, bb) = (
        DeviceBuffer::from_host(&s, &ones)?,
        DeviceBuffer::from_host(&s, &ones)?,
    );
    let c = DeviceBuffer::<bf16>::zeroed(&s, 1)?;
    gemm(&s, GemmConfig::new(1, 1, k), ab.view(), bb.view(), c.view())?;
    assert_eq!(c.to_host_vec(&s)?, vec![bf16::from_f32(4096.0)]);
    Ok(())
}

#[test]
fn batches_at_dense_broadcast_and_padded_strides() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = rng();
    let (m, n, k) = (9, 13, 11);
    let base = GemmConfig::new(m, n, k);
    let cases = [
        base.batched(3),
        base.batched(4).transpose(true, true).scale(0.5, 1.0),
        // One B for every A (a linear layer over a batch), C padded between matrices.
        base.batched(3).strides(m * k, 0, m * n + 5),
        // One A for every B, A stored transposed.
        base.batched(2)
            .transpose(true, false)
            .strides(0, k * n, m * n),
        base.batched(1),
    ];
    for cfg in cases {
        check::<f32>(&s, &mut rng, cfg)?;
        check::<bf16>(&s, &mut rng, cfg)?;
    }
    Ok(())
}

#[test]
fn accumulating_into_c_adds_to_what_it_holds() -> Result<(), DeviceError> {
    let s = stream();
    // A = [[1, 2], [3, 4]], B = I: A·B = A.
    let a = DeviceBuffer::from_host(&s, &[1.0f32, 2.0, 3.0, 4.0])?;
    let id = DeviceBuffer::from_host(&s, &[1.0f32, 0.0, 0.0, 1.0])?;
    let c = DeviceBuffer::from_host(&s, &[10.0f32, 20.0, 30.0, 40.0])?;
    let cfg = GemmConfig::new(2, 2, 2).scale(2.0, 1.0);
    gemm(&s, cfg, a.view(), id.view(), c.view())?;
    assert_eq!(c.to_host_vec(&s)?, vec![12.0, 24.0, 36.0, 48.0]);
    // Transposed A this time, and C halved first.
    gemm(
        &s,
        cfg.transpose(true, false).scale(1.0, 0.5),
        a.view(),
        id.view(),
        c.view(),
    )?;
    assert_eq!(c.to_host_vec(&s)?, vec![7.0, 15.0, 20.0, 28.0]);
    Ok(())
}

#[test]
fn empty_dimensions_do_what_blas_does() -> Result<(), DeviceError> {
    let s = stream();
    let c0 = [1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0];
    let empty = DeviceBuffer::<f32>::alloc(&s, 0)?;
    // k = 0: the product is empty, so C = beta · C.
    let c = DeviceBuffer::from_host(&s, &c0)?;
    let cfg = GemmConfig::new(2, 3, 0).scale(1.0, 0.5);
    gemm(&s, cfg, empty.view(), empty.view(), c.view())?;
    assert_eq!(
        c.to_host_vec(&s)?,
        c0.iter().map(|x| x * 0.5).collect::<Vec<_>>()
    );
    // k = 0 with beta = 0: zeros, even over NaN.
    let c = DeviceBuffer::from_host(&s, &[f32::NAN; 6])?;
    gemm(
        &s,
        cfg.scale(1.0, 0.0),
        empty.view(),
        empty.view(),
        c.view(),
    )?;
    assert_eq!(c.to_host_vec(&s)?, vec![0.0; 6]);
    // m, n or batch zero: nothing to compute, and nothing is touched.
    let a = DeviceBuffer::from_host(&s, &[1.0f32; 6])?;
    gemm(
        &s,
        GemmConfig::new(0, 3, 2),
        empty.view(),
        a.view(),
        empty.view(),
    )?;
    gemm(
        &s,
        GemmConfig::new(3, 0, 2),
        a.view(),
        empty.view(),
        empty.view(),
    )?;
    gemm(
        &s,
        GemmConfig::new(2, 3, 1).batched(0),
        empty.view(),
        empty.view(),
        empty.view(),
    )?;
    // An empty batch by one matrix shared by every batch (stride 0): that matrix is accepted
    // as it is, as is an empty view of it.
    let shared = DeviceBuffer::from_host(&s, &[1.0f32; 8])?;
    let broadcast = GemmConfig::new(3, 2, 4).batched(0).strides(12, 0, 6);
    gemm(&s, broadcast, empty.view(), shared.view(), empty.view())?;
    gemm(&s, broadcast, empty.view(), empty.view(), empty.view())?;
    assert_eq!(shared.to_host_vec(&s)?, vec![1.0; 8], "nothing is touched");
    s.synchronize()
}

#[track_caller]
fn assert_shape_error(r: Result<(), DeviceError>, needles: &[&str]) {
    match r {
        Err(e @ DeviceError::InvalidShape { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("gemm"), "{msg}");
            for needle in needles {
                assert!(msg.contains(needle), "{msg} should mention {needle:?}");
            }
        }
        other => panic!("expected a gemm shape error, got {other:?}"),
    }
}

#[test]
fn shapes_that_do_not_fit_are_refused_before_anything_runs() -> Result<(), DeviceError> {
    let s = stream();
    let (m, n, k) = (3, 4, 5);
    let a = DeviceBuffer::from_host(&s, &[1.0f32; 15])?;
    let b = DeviceBuffer::from_host(&s, &[1.0f32; 20])?;
    let c = DeviceBuffer::from_host(&s, &[7.0f32; 12])?;
    let cfg = GemmConfig::new(m, n, k);
    // Each operand one element short.
    assert_shape_error(
        gemm(&s, cfg, a.slice(1..)?, b.view(), c.view()),
        &["A", "3×5", "15", "14"],
    );
    assert_shape_error(
        gemm(&s, cfg, a.view(), b.slice(..19)?, c.view()),
        &["B", "5×4", "20", "19"],
    );
    assert_shape_error(
        gemm(&s, cfg, a.view(), b.view(), c.slice(..11)?),
        &["C", "3×4", "12", "11"],
    );
    // Dimensions swapped: A (15 elements) is not 5×4, B is not 3×4.
    assert_shape_error(
        gemm(&s, GemmConfig::new(k, m, n), a.view(), b.view(), c.view()),
        &["A", "5×4"],
    );
    // A batch whose output matrices overlap.
    let big = DeviceBuffer::from_host(&s, &[0.0f32; 24])?;
    assert_shape_error(
        gemm(
            &s,
            cfg.batched(2).strides(0, 0, 6),
            a.view(),
            b.view(),
            big.slice(..18)?,
        ),
        &["stride_c"],
    );
    // C aliasing an input.
    let shared = DeviceBuffer::from_host(&s, &[1.0f32; 16])?;
    let r = gemm(
        &s,
        GemmConfig::new(2, 2, 2),
        shared.slice(0..4)?,
        shared.slice(4..8)?,
        shared.slice(2..6)?,
    );
    assert!(
        matches!(&r, Err(DeviceError::InvalidArgument { kernel, .. }) if kernel == "gemm"),
        "{r:?}"
    );
    // Disjoint parts of one buffer are fine, inputs overlapping each other too.
    gemm(
        &s,
        GemmConfig::new(2, 2, 2).transpose(false, true),
        shared.slice(0..4)?,
        shared.slice(0..4)?,
        shared.slice(8..12)?,
    )?;
    assert_eq!(shared.to_host_vec(&s)?[8..12], [2.0, 2.0, 2.0, 2.0]);
    assert_eq!(c.to_host_vec(&s)?, vec![7.0; 12], "refused calls ran");
    Ok(())
}

#[test]
fn buffers_of_another_device_are_a_device_mismatch() -> Result<(), DeviceError> {
    let device = device();
    let other = match device.kind() {
        BackendKind::Cuda => Device::host(),
        _ => match Device::cuda(0) {
            Ok(gpu) => gpu,
            // The host is the only device: there is no second device to mix in.
            Err(_) => return Ok(()),
        },
    };
    let (s, so) = (device.new_stream()?, other.new_stream()?);
    let here = DeviceBuffer::from_host(&s, &[1.0f32; 4])?;
    let there = DeviceBuffer::from_host(&so, &[1.0f32; 4])?;
    let cfg = GemmConfig::new(2, 2, 2);
    for r in [
        gemm(&s, cfg, there.view(), here.view(), here.view()),
        gemm(&s, cfg, here.view(), there.view(), here.view()),
        gemm(&s, cfg, here.view(), here.view(), there.view()),
    ] {
        assert!(
            matches!(&r, Err(DeviceError::DeviceMismatch { op: "gemm", .. })),
            "{r:?}"
        );
    }
    Ok(())
}

/// Inputs may be dropped as soon as the GEMM is enqueued: their frees wait for it.
#[test]
fn inputs_dropped_after_enqueueing_are_still_read() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = rng();
    let (m, n, k) = (64, 48, 80);
    let a: Vec<f32> = random(&mut rng, m * k);
    let b: Vec<f32> = random(&mut rng, k * n);
    let c = DeviceBuffer::<f32>::alloc(&s, m * n)?;
    {
        let ab = DeviceBuffer::from_host(&s, &a)?;
        let bb = DeviceBuffer::from_host(&s, &b)?;
        gemm(&s, GemmConfig::new(m, n, k), ab.view(), bb.view(), c.view())?;
    }
    let (want, _) = reference(
        &GemmConfig::new(m, n, k),
        &widen(&a),
        &widen(&b),
        &vec![0.0; m * n],
    );
    assert_close_in_norm("gemm", &c.to_host_vec(&s)?, &want, 1e-5);
    Ok(())
}

/// A captured GEMM is recorded, not run; each replay runs it once. With `beta = 1` two replays
/// add the product twice.
#[test]
fn a_captured_gemm_accumulates_once_per_replay() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = rng();
    let (m, n, k) = (33, 65, 17);
    let a: Vec<f32> = random(&mut rng, m * k);
    let b: Vec<f32> = random(&mut rng, n * k);
    let c0: Vec<f32> = random(&mut rng, m * n);
    let (ab, bb, cb) = (
        DeviceBuffer::from_host(&s, &a)?,
        DeviceBuffer::from_host(&s, &b)?,
        DeviceBuffer::from_host(&s, &c0)?,
    );
    let cfg = GemmConfig::new(m, n, k)
        .transpose(false, true)
        .scale(1.0, 1.0);
    // Twice: the second capture follows eager GEMMs on the same stream.
    for round in 0..2 {
        cb.copy_from_host(&s, &c0)?;
        s.synchronize()?;
        s.begin_capture()?;
        gemm(&s, cfg, ab.view(), bb.view(), cb.view())?;
        let graph = s.end_capture()?;
        assert!(graph.node_count()? >= 1);
        assert_eq!(
            cb.to_host_vec(&s)?,
            c0,
            "round {round}: capturing ran the GEMM"
        );
        let exec = graph.instantiate()?;
        drop(graph);
        exec.launch(&s)?;
        exec.launch(&s)?;
        let (product, _) = reference(&cfg.scale(1.0, 0.0), &widen(&a), &widen(&b), &widen(&c0));
        let want: Vec<f64> = product
            .iter()
            .zip(&c0)
            .map(|(p, c)| *c as f64 + 2.0 * p)
            .collect();
        assert_close_in_norm("captured gemm", &cb.to_host_vec(&s)?, &want, 1e-5);
        // Eager work on the stream goes on as before.
        gemm(&s, cfg.scale(1.0, 0.0), ab.view(), bb.view(), cb.view())?;
        assert_close_in_norm(
            "gemm after the capture",
            &cb.to_host_vec(&s)?,
            &product,
            1e-5,
        );
    }
    Ok(())
}

/// GEMMs from several threads, each on its own stream, at once.
#[test]
fn threads_with_a_stream_each_get_their_own_results() -> Result<(), DeviceError> {
    let device = device();
    let mut rng = rng();
    let (m, n, k) = (40, 24, 56);
    let a: Vec<f32> = random(&mut rng, m * k);
    let bs: Vec<Vec<f32>> = (0..4).map(|_| random(&mut rng, k * n)).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = bs
            .iter()
            .map(|b| {
                let (device, a) = (&device, &a);
                scope.spawn(move || -> Result<(), DeviceError> {
                    let s = device.new_stream()?;
                    let ab = DeviceBuffer::from_host(&s, a)?;
                    let bb = DeviceBuffer::from_host(&s, b)?;
                    let cb = DeviceBuffer::<f32>::alloc(&s, m * n)?;
                    let cfg = GemmConfig::new(m, n, k);
                    let (want, _) = reference(&cfg, &widen(a), &widen(b), &vec![0.0; m * n]);
                    for _ in 0..5 {
                        gemm(&s, cfg, ab.view(), bb.view(), cb.view())?;
                        assert_close_in_norm("gemm", &cb.to_host_vec(&s)?, &want, 1e-5);
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a GEMM thread panicked"))
    })
}

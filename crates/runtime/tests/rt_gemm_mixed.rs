//! Mixed-precision GEMM: `f16` / `bf16` inputs, an `f32` output that accumulates
//! (`beta != 0`), checked against a float64 reference; and the overlap check across element
//! types.

use cuflow_runtime::{gemm, DeviceBuffer, DeviceError, GemmConfig};
use cuflow_testing::{device::stream, measure::assert_close_in_norm, rng::seeded_rng};
use half::{bf16, f16};
use rand::Rng;

/// `alpha · a · b + beta · c` in f64, for row-major `a` (m×k), `b` (k×n), `c` (m×n).
fn reference(
    a: &[f64],
    b: &[f64],
    c: &[f64],
    (m, n, k): (usize, usize, usize),
    alpha: f64,
    beta: f64,
) -> Vec<f64> {
    (0..m * n)
        .map(|at| {
            let (i, j) = (at / n, at % n);
            let dot: f64 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            alpha * dot + beta * c[at]
        })
        .collect()
}

fn check<H: Copy + Into<f32> + bytemuck::Pod + Send + Sync + cuflow_runtime::GemmElem>(
    from: fn(f64) -> H,
    seed: u64,
) -> Result<(), DeviceError>
where
    f32: cuflow_runtime::GemmOutput<H>,
{
    let s = stream();
    let mut rng = seeded_rng(seed);
    let (m, n, k) = (13, 21, 77);
    let a: Vec<H> = (0..m * k).map(|_| from(rng.gen_range(-1.0..1.0))).collect();
    let b: Vec<H> = (0..k * n).map(|_| from(rng.gen_range(-1.0..1.0))).collect();
    let c: Vec<f32> = (0..m * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let (ab, bb, cb) = (
        DeviceBuffer::from_host(&s, &a)?,
        DeviceBuffer::from_host(&s, &b)?,
        DeviceBuffer::from_host(&s, &c)?,
    );
    let cfg = GemmConfig::new(m, n, k).scale(0.5, 1.0);
    gemm(&s, cfg, ab.view(), bb.view(), cb.view())?;
    let wide = |v: &[H]| v.iter().map(|x| f64::from((*x).into())).collect::<Vec<_>>();
    let c64: Vec<f64> = c.iter().map(|x| f64::from(*x)).collect();
    let want = reference(&wide(&a), &wide(&b), &c64, (m, n, k), 0.5, 1.0);
    assert_close_in_norm(
        std::any::type_name::<H>(),
        &cb.to_host_vec(&s)?,
        &want,
        1e-5,
    );
    Ok(())
}

#[test]
fn f16_inputs_accumulate_into_f32() -> Result<(), DeviceError> {
    check::<f16>(f16::from_f64, 1)
}

#[test]
fn bf16_inputs_accumulate_into_f32() -> Result<(), DeviceError> {
    check::<bf16>(bf16::from_f64, 2)
}

#[test]
fn an_f32_output_overlapping_a_half_input_is_refused() -> Result<(), DeviceError> {
    let s = stream();
    let words = DeviceBuffer::<f32>::zeroed(&s, 8)?;
    let halves = words.reinterpret::<bf16>()?;
    // A is halves[0..4] (bytes 0..8), C is words[1..2] (bytes 4..8): they overlap.
    let err = gemm(
        &s,
        GemmConfig::new(1, 1, 4),
        halves.slice(..4)?,
        halves.slice(12..16)?,
        words.slice(1..2)?,
    )
    .expect_err("C overlaps A");
    assert!(err.to_string().contains("overlaps A"), "{err}");
    // Disjoint bytes of the same allocation are fine.
    gemm(
        &s,
        GemmConfig::new(1, 1, 4),
        halves.slice(..4)?,
        halves.slice(4..8)?,
        words.slice(7..8)?,
    )?;
    Ok(())
}

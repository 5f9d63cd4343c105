//! `matmul_f32` / `linear_f32`: half-precision inputs, `f32` outputs, against a float64
//! reference on random inputs (2-D, batched, shared weights, empty dimensions), and the same
//! shape errors as `matmul`.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, f16, kernels, DType, Tensor};
use cuflow_testing::device::stream;
use cuflow_testing::measure::{assert_close_in_norm, rel_err_in_norm};
use cuflow_testing::rng::seeded_rng;
use cuflow_testing::tensor::{f64s, random, read, upload};

/// `a · b` (or `a · bᵀ` when `trans_b`) in f64, with `b` shared by the batch when 2-D.
fn reference(
    a: &[f64],
    b: &[f64],
    (batch, m, k, n): (usize, usize, usize, usize),
    b_batched: bool,
    trans_b: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; batch * m * n];
    for t in 0..batch {
        let bo = if b_batched { t * k * n } else { 0 };
        for i in 0..m {
            for j in 0..n {
                out[(t * m + i) * n + j] = (0..k)
                    .map(|p| {
                        let bv = if trans_b {
                            b[bo + j * k + p]
                        } else {
                            b[bo + p * n + j]
                        };
                        a[(t * m + i) * k + p] * bv
                    })
                    .sum();
            }
        }
    }
    out
}

fn check<T: DType + cuflow_runtime::GemmElem>(
    dims: (usize, usize, usize, usize),
    batched: (bool, bool),
    trans_b: bool,
    seed: u64,
) -> Result<(), DeviceError>
where
    f32: cuflow_runtime::GemmOutput<T>,
{
    let s = stream();
    let mut rng = seeded_rng(seed);
    let (batch, m, k, n) = dims;
    let (a_batched, b_batched) = batched;
    let a_shape: Vec<usize> = if a_batched {
        vec![batch, m, k]
    } else {
        vec![m, k]
    };
    let b_dims = if trans_b { [n, k] } else { [k, n] };
    let b_shape: Vec<usize> = if b_batched {
        vec![batch, b_dims[0], b_dims[1]]
    } else {
        b_dims.to_vec()
    };
    let ah: Vec<T> = random(&mut rng, a_shape.iter().product());
    let bh: Vec<T> = random(&mut rng, b_shape.iter().product());
    let (a, b) = (upload(&s, &ah, &a_shape), upload(&s, &bh, &b_shape));
    let out: Tensor<f32> = if trans_b {
        kernels::linear_f32(&a, &b).sync_on(&s)?
    } else {
        kernels::matmul_f32(&a, &b).sync_on(&s)?
    };
    let want_shape: Vec<usize> = if a_batched {
        vec![batch, m, n]
    } else {
        vec![m, n]
    };
    assert_eq!(out.shape(), &want_shape[..]);
    let want = reference(&f64s(&ah), &f64s(&bh), dims, b_batched, trans_b);
    // Inputs are exact in f32; the only error is the f32 accumulation.
    let what = format!("{} {dims:?} {batched:?} trans_b={trans_b}", T::NAME);
    assert_close_in_norm(&what, &read(&out), &want, 1e-5);
    Ok(())
}

#[test]
fn bf16_inputs_f32_outputs() -> Result<(), DeviceError> {
    check::<bf16>((1, 17, 33, 9), (false, false), false, 1)?;
    check::<bf16>((1, 64, 300, 48), (false, false), true, 2)?;
    check::<bf16>((3, 5, 40, 7), (true, true), false, 3)?;
    check::<bf16>((4, 6, 20, 5), (true, false), true, 4)
}

#[test]
fn f16_inputs_f32_outputs() -> Result<(), DeviceError> {
    check::<f16>((1, 31, 65, 17), (false, false), false, 5)?;
    check::<f16>((2, 8, 128, 8), (true, true), true, 6)?;
    check::<f16>((3, 9, 10, 11), (true, false), false, 7)
}

#[test]
fn f32_inputs_are_a_plain_matmul() -> Result<(), DeviceError> {
    check::<f32>((1, 20, 30, 10), (false, false), false, 8)
}

#[test]
fn the_f32_output_keeps_what_half_would_round() -> Result<(), DeviceError> {
    // Sums of many half values: the f32 output is far closer to the reference than a half one.
    let s = stream();
    let mut rng = seeded_rng(9);
    let (m, k, n) = (8, 2048, 8);
    let ah: Vec<bf16> = random(&mut rng, m * k);
    let bh: Vec<bf16> = random(&mut rng, k * n);
    let (a, b) = (upload(&s, &ah, &[m, k]), upload(&s, &bh, &[k, n]));
    let want = reference(&f64s(&ah), &f64s(&bh), (1, m, k, n), false, false);
    let mixed = f64s(&read(&kernels::matmul_f32(&a, &b).sync_on(&s)?));
    let half = f64s(&read(&kernels::matmul(&a, &b).sync_on(&s)?));
    let err = |got: &[f64]| rel_err_in_norm(got, &want);
    assert!(err(&mixed) < 1e-5, "f32 output error {}", err(&mixed));
    assert!(
        err(&half) > 10.0 * err(&mixed),
        "bf16 {} vs f32 {}",
        err(&half),
        err(&mixed)
    );
    Ok(())
}

#[test]
fn empty_dimensions() -> Result<(), DeviceError> {
    let s = stream();
    let a = api::zeros::<bf16>(&[0, 4]).sync_on(&s)?;
    let b = api::zeros::<bf16>(&[4, 3]).sync_on(&s)?;
    assert_eq!(kernels::matmul_f32(&a, &b).sync_on(&s)?.shape(), &[0, 3]);
    // k = 0: the output is zeros.
    let a = api::ones::<f16>(&[2, 0]).sync_on(&s)?;
    let b = api::ones::<f16>(&[0, 3]).sync_on(&s)?;
    assert_eq!(
        read(&kernels::matmul_f32(&a, &b).sync_on(&s)?),
        vec![0.0f32; 6]
    );
    Ok(())
}

#[test]
fn shape_errors_name_the_op_and_the_inner_dimensions() -> Result<(), DeviceError> {
    let s = stream();
    let a = api::zeros::<bf16>(&[2, 3]).sync_on(&s)?;
    let b = api::zeros::<bf16>(&[4, 5]).sync_on(&s)?;
    let err = kernels::matmul_f32(&a, &b)
        .sync_on(&s)
        .expect_err("3 columns, 4 rows");
    let text = err.to_string();
    assert!(
        text.contains("matmul_f32") && text.contains("3 columns") && text.contains("4 rows"),
        "{text}"
    );
    let err = kernels::linear_f32(&a, &b)
        .sync_on(&s)
        .expect_err("3 columns, 5 columns");
    assert!(err.to_string().contains("linear_f32"), "{err}");
    Ok(())
}

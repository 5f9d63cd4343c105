//! Kernels over the last axis against float64 references: sum, max, argmax, softmax, rms_norm,
//! layer_norm; on whatever `Device::auto()` gives.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, f16, kernels};
use cuflow_testing::{
    device::stream,
    measure::assert_close_elementwise,
    rng::seeded_rng,
    tensor::{read, uniform, upload, Float},
    test_cases,
};
use rand::Rng;

/// Shapes with 1, 7, 1000 and 4097 columns (register-cached rows), 20000 (rows read twice)
/// and a rank-3 input; row counts divisible by 8, 4, 2 and none of them (the normalizing
/// kernels group short rows by the largest of those), and 1024 columns (the longest rows they
/// give one warp).
const SHAPES: &[&[usize]] = &[
    &[3, 1],
    &[5, 7],
    &[4, 1000],
    &[24, 1024],
    &[6, 250],
    &[3, 4097],
    &[2, 20000],
    &[2, 3, 33],
];

fn norms_for<T: Float>(seed: u64, tol: f64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    for shape in SHAPES {
        let cols = *shape.last().unwrap_or(&1);
        let n: usize = shape.iter().product();
        let xh: Vec<T> = uniform(&mut rng, n, -3.0, 3.0);
        let wh: Vec<T> = uniform(&mut rng, cols, -2.0, 2.0);
        let bh: Vec<T> = uniform(&mut rng, cols, -1.0, 1.0);
        let (x, w, b) = (
            upload(&s, &xh, shape),
            upload(&s, &wh, &[cols]),
            upload(&s, &bh, &[cols]),
        );

        let sm = kernels::softmax(&x).sync_on(&s)?;
        let rms = kernels::rms_norm(&x, &w, 1e-5).sync_on(&s)?;
        let ln = kernels::layer_norm(&x, &w, &b, 1e-5).sync_on(&s)?;
        assert_eq!(sm.shape(), *shape);

        let (mut want_sm, mut want_rms, mut want_ln) = (vec![], vec![], vec![]);
        for row in xh.chunks(cols) {
            let r: Vec<f64> = row.iter().map(|v| v.to_f64()).collect();
            let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = r.iter().map(|v| (v - m).exp()).sum();
            want_sm.extend(r.iter().map(|v| (v - m).exp() / z));
            let ms = r.iter().map(|v| v * v).sum::<f64>() / cols as f64;
            let mean = r.iter().sum::<f64>() / cols as f64;
            let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
            for (j, v) in r.iter().enumerate() {
                let (wj, bj) = (wh[j].to_f64(), bh[j].to_f64());
                want_rms.push(v / (ms + 1e-5).sqrt() * wj);
                want_ln.push((v - mean) / (var + 1e-5).sqrt() * wj + bj);
            }
        }
        let what = format!("softmax {} {shape:?}", T::NAME);
        assert_close_elementwise(&what, &read(&sm), &want_sm, T::MIN_NORMAL, tol);
        let what = format!("rms_norm {} {shape:?}", T::NAME);
        assert_close_elementwise(&what, &read(&rms), &want_rms, 1.0, tol);
        let what = format!("layer_norm {} {shape:?}", T::NAME);
        assert_close_elementwise(&what, &read(&ln), &want_ln, 1.0, tol);
    }
    Ok(())
}

test_cases! {
    softmax_rms_norm_layer_norm_f32 => norms_for::<f32>(11, 2e-5),
    softmax_rms_norm_layer_norm_half_types => {
        norms_for::<bf16>(12, 1.6e-2)?;
        norms_for::<f16>(13, 2e-3)
    },
    softmax_rms_norm_layer_norm_f64 => norms_for::<f64>(14, 1e-12),
}

#[test]
fn sum_max_argmax_f32() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(21);
    for shape in SHAPES {
        let cols = *shape.last().unwrap_or(&1);
        let n: usize = shape.iter().product();
        let xh: Vec<f32> = uniform(&mut rng, n, -10.0, 10.0);
        let x = upload(&s, &xh, shape);
        let (sum, max, arg) = (
            read(&kernels::sum(&x).sync_on(&s)?),
            read(&kernels::max(&x).sync_on(&s)?),
            read(&kernels::argmax(&x).sync_on(&s)?),
        );
        assert_eq!(sum.len(), n / cols);
        for (r, row) in xh.chunks(cols).enumerate() {
            let exact: f64 = row.iter().map(|v| *v as f64).sum();
            let mag: f64 = row.iter().map(|v| (*v as f64).abs()).sum();
            assert!(
                (sum[r] as f64 - exact).abs() <= 1e-5 * mag,
                "sum {shape:?} row {r}: {} vs {exact}",
                sum[r]
            );
            let (mut bi, mut bv) = (0usize, row[0]);
            for (i, v) in row.iter().enumerate() {
                if *v > bv {
                    (bi, bv) = (i, *v);
                }
            }
            assert_eq!(max[r], bv, "max {shape:?} row {r}");
            assert_eq!(arg[r] as usize, bi, "argmax {shape:?} row {r}");
        }
    }
    Ok(())
}

#[test]
fn integer_sum_wraps_and_argmax_takes_the_first_maximum() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(22);
    let cols = 1000;
    let xh: Vec<i32> = (0..3 * cols)
        .map(|_| rng.gen_range(-1_000_000_000..1_000_000_000))
        .collect();
    let x = upload(&s, &xh, &[3, cols]);
    let sum = read(&kernels::sum(&x).sync_on(&s)?);
    let max = read(&kernels::max(&x).sync_on(&s)?);
    for (r, row) in xh.chunks(cols).enumerate() {
        assert_eq!(
            sum[r],
            row.iter().fold(0i32, |a, v| a.wrapping_add(*v)),
            "row {r}"
        );
        assert_eq!(max[r], *row.iter().max().unwrap_or(&0), "row {r}");
    }
    // Ties: the first index wins, also across threads and warps.
    let mut tied = vec![0u8; 5000];
    for i in [4999, 1234, 777, 3000] {
        tied[i] = 9;
    }
    let t = upload(&s, &tied, &[5000]);
    assert_eq!(read(&kernels::argmax(&t).sync_on(&s)?), vec![777u32]);
    Ok(())
}

#[test]
fn row_kernels_refuse_bad_shapes() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::ones::<f32>(&[4, 8]).sync_on(&s)?;
    let w = api::ones::<f32>(&[7]).sync_on(&s)?;
    let err = kernels::rms_norm(&x, &w, 1e-5).sync_on(&s).unwrap_err();
    assert!(
        matches!(err, DeviceError::ShapeMismatch { op: "rms_norm", .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("[4, 8]") && err.to_string().contains("[7]"),
        "{err}"
    );
    assert!(err.to_string().contains("`weight` must be [8]"), "{err}");
    let w8 = api::ones::<f32>(&[8]).sync_on(&s)?;
    let err = kernels::layer_norm(&x, &w8, &w, 1e-5)
        .sync_on(&s)
        .unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::ShapeMismatch {
                op: "layer_norm",
                ..
            }
        ),
        "{err}"
    );
    // The message says which of weight or bias is wrong.
    let text = err.to_string();
    assert!(
        text.contains("`bias` must be [8]") && !text.contains("`weight`"),
        "{text}"
    );
    let err = kernels::layer_norm(&x, &w, &w8, 1e-5)
        .sync_on(&s)
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("`weight` must be [8]") && !text.contains("`bias`"),
        "{text}"
    );
    let scalar = api::ones::<f32>(&[]).sync_on(&s)?;
    let err = kernels::softmax(&scalar).sync_on(&s).unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "softmax", .. }),
        "{err}"
    );
    // The sum over an empty axis is 0 (as `sum_axis` and PyTorch), written over poison; the
    // maximum of nothing is an error naming the op.
    let empty = api::ones::<f32>(&[3, 0]).sync_on(&s)?;
    let zeros = kernels::sum(&empty).sync_on(&s)?;
    assert_eq!(zeros.shape(), &[3]);
    assert_eq!(read(&zeros), vec![0.0; 3]);
    assert_eq!(
        read(&kernels::sum(&empty).sync_on(&s)?),
        read(&kernels::sum_axis(&empty, 1, false).sync_on(&s)?)
    );
    let err = kernels::max(&empty).sync_on(&s).unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "max", .. }),
        "{err}"
    );
    // Nothing was left broken: the stream still runs the kernels.
    let y = kernels::rms_norm(&x, &w8, 0.0).sync_on(&s)?;
    assert!(read(&y).iter().all(|v| (*v - 1.0).abs() < 1e-6));
    Ok(())
}

//! Reductions along any axis (`sum`, `mean`, `max`, `min`, `argmax`, `argmin`, with and
//! without `keepdim`) and softmax / log-softmax along any axis, against float64 references
//! computed here on random inputs: every axis of dense tensors, views (permuted, narrowed,
//! expanded), few outputs over a long axis, zero-size axes, and bad axes.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, f16, kernels, DType, Tensor};
use cuflow_testing::{
    device::stream,
    rng::seeded_rng,
    tensor::{assert_dtype_close, assert_exact, read, uniform, upload, Float},
    test_cases,
};

/// The elements of `v` (of `shape`) grouped by output: for each index of the shape without
/// `axis` (row-major), the values along `axis`.
fn lanes<T: Copy>(v: &[T], shape: &[usize], axis: usize) -> Vec<Vec<T>> {
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let k = shape[axis];
    let mut out = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            out.push((0..k).map(|j| v[(o * k + j) * inner + i]).collect());
        }
    }
    out
}

/// `shape` reduced over `axis`.
fn reduced(shape: &[usize], axis: usize, keepdim: bool) -> Vec<usize> {
    let mut s = shape.to_vec();
    if keepdim {
        s[axis] = 1;
    } else {
        s.remove(axis);
    }
    s
}

/// The first index of the largest (`max`) or smallest value of `lane`.
fn arg<T: PartialOrd + Copy>(lane: &[T], max: bool) -> u32 {
    let mut best = 0;
    for (i, v) in lane.iter().enumerate() {
        if (max && *v > lane[best]) || (!max && *v < lane[best]) {
            best = i;
        }
    }
    best as u32
}

/// Checks every reduction of `x` (whose elements in row-major order are `data`, shape
/// `shape`) over `axis` against the references.
fn check_reductions<T: Float>(
    x: &Tensor<T>,
    data: &[T],
    shape: &[usize],
    axis: usize,
    what: &str,
) -> Result<(), DeviceError> {
    let s = stream();
    let ls = lanes(data, shape, axis);
    let tol = T::ARITH_TOL * (shape[axis] as f64).max(1.0);
    for keepdim in [false, true] {
        let want_shape = reduced(shape, axis, keepdim);
        let what = format!("{what} axis {axis} keepdim {keepdim}");
        let sum = kernels::sum_axis(x, axis, keepdim).sync_on(&s)?;
        let mean = kernels::mean_axis(x, axis, keepdim).sync_on(&s)?;
        let max = kernels::max_axis(x, axis, keepdim).sync_on(&s)?;
        let min = kernels::min_axis(x, axis, keepdim).sync_on(&s)?;
        let amax = kernels::argmax_axis(x, axis, keepdim).sync_on(&s)?;
        let amin = kernels::argmin_axis(x, axis, keepdim).sync_on(&s)?;
        for t in [&sum, &mean, &max, &min] {
            assert_eq!(t.shape(), &want_shape[..], "{what}");
        }
        assert_eq!(amax.shape(), &want_shape[..], "{what}");
        let f = |l: &Vec<T>| l.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
        let sums: Vec<f64> = ls.iter().map(|l| f(l).iter().sum()).collect();
        // Sums of random signs cancel: judge them against the sum of magnitudes.
        let scale: f64 = ls.iter().flat_map(f).map(f64::abs).sum::<f64>().max(1.0);
        let got_sum: Vec<f64> = read(&sum).iter().map(|v| v.to_f64()).collect();
        for (g, w) in got_sum.iter().zip(&sums) {
            assert!((g - w).abs() <= tol * scale, "{what}: sum {g} vs {w}");
        }
        let k = shape[axis] as f64;
        let got_mean: Vec<f64> = read(&mean).iter().map(|v| v.to_f64()).collect();
        for (g, w) in got_mean.iter().zip(&sums) {
            assert!(
                (g - w / k).abs() <= tol * scale / k,
                "{what}: mean {g} vs {}",
                w / k
            );
        }
        let maxes: Vec<f64> = ls
            .iter()
            .map(|l| f(l).into_iter().fold(f64::MIN, f64::max))
            .collect();
        let mins: Vec<f64> = ls
            .iter()
            .map(|l| f(l).into_iter().fold(f64::MAX, f64::min))
            .collect();
        assert_dtype_close(&read(&max), &maxes, 0.0, &format!("{what}: max"));
        assert_dtype_close(&read(&min), &mins, 0.0, &format!("{what}: min"));
        let amaxes: Vec<u32> = ls.iter().map(|l| arg(l, true)).collect();
        let amins: Vec<u32> = ls.iter().map(|l| arg(l, false)).collect();
        assert_exact(&read(&amax), &amaxes, &format!("{what}: argmax"));
        assert_exact(&read(&amin), &amins, &format!("{what}: argmin"));
    }
    Ok(())
}

fn every_axis<T: Float>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    for shape in [&[7usize][..], &[3, 4, 5], &[2, 33, 3], &[5, 1, 300]] {
        let data: Vec<T> = uniform(&mut rng, shape.iter().product(), -2.0, 2.0);
        let x = upload(&s, &data, shape);
        for axis in 0..shape.len() {
            check_reductions(&x, &data, shape, axis, &format!("{shape:?}"))?;
        }
    }
    Ok(())
}

/// Views: a permutation, a narrowed middle axis and an expanded axis, reduced over each axis;
/// the reference reads the view's elements from its dense copy made here.
fn views<T: Float>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let data: Vec<T> = uniform(&mut rng, 4 * 6 * 5, -2.0, 2.0);
    let x = upload(&s, &data, &[4, 6, 5]);
    let views = [
        ("permute", x.permute(&[2, 0, 1])?),
        ("narrow", x.narrow(1, 1, 4)?),
        ("expand", x.select(1, 2)?.unsqueeze(1)?.expand(&[4, 3, 5])?),
    ];
    for (what, v) in views {
        assert!(!v.is_contiguous(), "{what} is a strided view");
        let shape = v.shape().to_vec();
        let dense = read(&v);
        for axis in 0..shape.len() {
            check_reductions(&v, &dense, &shape, axis, what)?;
        }
    }
    // Few outputs over a long axis (split over blocks), from a transposed view.
    let long: Vec<T> = uniform(&mut rng, 5000 * 3, -2.0, 2.0);
    let y = upload(&s, &long, &[5000, 3]).transpose(0, 1)?;
    let dense = read(&y);
    check_reductions(&y, &dense, &[3, 5000], 1, "long transposed")?;
    let y = upload(&s, &long, &[5000, 3]);
    check_reductions(&y, &long, &[5000, 3], 0, "long first axis")?;
    Ok(())
}

test_cases! {
    axes_f32 => every_axis::<f32>(1),
    axes_f64 => every_axis::<f64>(2),
    axes_f16 => every_axis::<f16>(3),
    axes_bf16 => every_axis::<bf16>(4),
    views_f32 => views::<f32>(5),
    views_f64 => views::<f64>(6),
}

/// Integer sums wrap, integer max / min / arg are exact, along every axis.
#[test]
fn integer_reductions_along_every_axis() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(7);
    let shape = [3usize, 4, 5];
    let data: Vec<i32> = {
        use rand::Rng;
        (0..60)
            .map(|_| rng.gen_range(i32::MIN / 2..i32::MAX / 2))
            .collect()
    };
    let x = upload(&s, &data, &shape);
    for axis in 0..3 {
        let ls = lanes(&data, &shape, axis);
        let sums: Vec<i32> = ls
            .iter()
            .map(|l| l.iter().fold(0i32, |a, v| a.wrapping_add(*v)))
            .collect();
        let maxes: Vec<i32> = ls.iter().map(|l| *l.iter().max().unwrap()).collect();
        let mins: Vec<i32> = ls.iter().map(|l| *l.iter().min().unwrap()).collect();
        let t = x.permute(&[2, 1, 0])?; // the same reductions through a view
        let taxis = 2 - axis;
        for (what, input, a) in [("dense", &x, axis), ("permuted", &t, taxis)] {
            let sum = read(&kernels::sum_axis(input, a, false).sync_on(&s)?);
            let max = read(&kernels::max_axis(input, a, false).sync_on(&s)?);
            let min = read(&kernels::min_axis(input, a, false).sync_on(&s)?);
            let amax = read(&kernels::argmax_axis(input, a, false).sync_on(&s)?);
            if what == "dense" {
                assert_exact(&sum, &sums, "sum");
                assert_exact(&max, &maxes, "max");
                assert_exact(&min, &mins, "min");
                let am: Vec<u32> = ls.iter().map(|l| arg(l, true)).collect();
                assert_exact(&amax, &am, "argmax");
            } else {
                // The permuted output's axes are reversed: compare as sets of lanes.
                let (mut a, mut b) = (sum.clone(), sums.clone());
                a.sort_unstable();
                b.sort_unstable();
                assert_exact(&a, &b, "sum through a permutation");
            }
        }
    }
    Ok(())
}

fn softmaxes<T: Float>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    for shape in [&[3usize, 4, 5][..], &[2, 70], &[6]] {
        let data: Vec<T> = uniform(&mut rng, shape.iter().product(), -3.0, 3.0);
        let x = upload(&s, &data, shape);
        let t = x.transpose(0, shape.len() - 1)?;
        let tdata = read(&t);
        for (input, values, what) in [(&x, &data, "dense"), (&t, &tdata, "transposed")] {
            let shape = input.shape().to_vec();
            for axis in 0..shape.len() {
                let sm = kernels::softmax_axis(input, axis).sync_on(&s)?;
                let lsm = kernels::log_softmax_axis(input, axis).sync_on(&s)?;
                assert_eq!(sm.shape(), &shape[..]);
                assert!(sm.is_contiguous() && lsm.is_contiguous());
                // References, scattered back to row-major positions.
                let n = values.len();
                let inner: usize = shape[axis + 1..].iter().product();
                let k = shape[axis];
                let (mut want_sm, mut want_lsm) = (vec![0.0; n], vec![0.0; n]);
                for (lane_no, lane) in lanes(values, &shape, axis).iter().enumerate() {
                    let (o, i) = (lane_no / inner, lane_no % inner);
                    let r: Vec<f64> = lane.iter().map(|v| v.to_f64()).collect();
                    let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = r.iter().map(|v| (v - m).exp()).sum();
                    for (j, v) in r.iter().enumerate() {
                        want_sm[(o * k + j) * inner + i] = (v - m).exp() / z;
                        want_lsm[(o * k + j) * inner + i] = v - m - z.ln();
                    }
                }
                let what = format!("{what} {shape:?} axis {axis}");
                assert_dtype_close(
                    &read(&sm),
                    &want_sm,
                    T::TRANS_TOL * 4.0,
                    &format!("softmax {what}"),
                );
                let got: Vec<f64> = read(&lsm).iter().map(|v| v.to_f64()).collect();
                for (g, w) in got.iter().zip(&want_lsm) {
                    assert!(
                        (g - w).abs() <= T::TRANS_TOL * 8.0 * w.abs().max(1.0),
                        "log_softmax {what}: {g} vs {w}"
                    );
                }
            }
        }
    }
    Ok(())
}

test_cases! {
    softmax_f32 => softmaxes::<f32>(8),
    softmax_f64 => softmaxes::<f64>(9),
    softmax_f16 => softmaxes::<f16>(10),
}

/// The sum over an empty axis is 0; the other reductions of an empty axis are refused naming
/// it; an empty output needs no input elements; a bad axis is named.
#[test]
fn zero_size_axes_and_bad_axes() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::ones::<f32>(&[3, 0, 2]).sync_on(&s)?;
    let sum = kernels::sum_axis(&x, 1, false).sync_on(&s)?;
    assert_eq!(sum.shape(), &[3, 2]);
    assert_exact(&read(&sum), &[0.0; 6], "sum over an empty axis");
    let sum = kernels::sum_axis(&x, 1, true).sync_on(&s)?;
    assert_eq!(sum.shape(), &[3, 1, 2]);
    let empty = kernels::max_axis(&x, 0, false).sync_on(&s)?;
    assert_eq!(empty.shape(), &[0, 2]);
    let errs = [
        (
            "mean",
            kernels::mean_axis(&x, 1, false).sync_on(&s).map(|_| ()),
        ),
        (
            "max",
            kernels::max_axis(&x, 1, false).sync_on(&s).map(|_| ()),
        ),
        (
            "min",
            kernels::min_axis(&x, 1, true).sync_on(&s).map(|_| ()),
        ),
        (
            "argmax",
            kernels::argmax_axis(&x, 1, false).sync_on(&s).map(|_| ()),
        ),
        (
            "argmin",
            kernels::argmin_axis(&x, 1, false).sync_on(&s).map(|_| ()),
        ),
    ];
    for (op, r) in errs {
        let err = r.unwrap_err();
        assert!(
            matches!(err, DeviceError::InvalidShape { op: o, .. } if o == op),
            "{err}"
        );
        assert!(err.to_string().contains("axis 1"), "{op}: {err}");
    }
    let bad = [
        (
            "sum",
            kernels::sum_axis(&x, 3, false).sync_on(&s).map(|_| ()),
        ),
        (
            "softmax",
            kernels::softmax_axis(&x, 3).sync_on(&s).map(|_| ()),
        ),
    ];
    for (op, r) in bad {
        let err = r.unwrap_err();
        assert!(
            matches!(err, DeviceError::InvalidShape { op: o, .. } if o == op),
            "{err}"
        );
        assert!(err.to_string().contains("axis 3"), "{op}: {err}");
    }
    let p = kernels::softmax_axis(&x, 0).sync_on(&s)?;
    assert_eq!(p.shape(), &[3, 0, 2]);
    let _: Tensor<u32> = kernels::argmax_axis(&x, 2, false).sync_on(&s)?;
    Ok(())
}

/// The last-axis kernels and the general ones agree where both apply.
#[test]
fn last_axis_forms_agree() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(11);
    let data: Vec<f32> = uniform(&mut rng, 4 * 300, -1.0, 1.0);
    let x = upload(&s, &data, &[4, 300]);
    assert_exact(
        &read(&kernels::sum(&x).sync_on(&s)?),
        &read(&kernels::sum_axis(&x, 1, false).sync_on(&s)?),
        "sum",
    );
    assert_exact(
        &read(&kernels::argmax(&x).sync_on(&s)?),
        &read(&kernels::argmax_axis(&x, 1, false).sync_on(&s)?),
        "argmax",
    );
    assert_exact(
        &read(&kernels::softmax(&x).sync_on(&s)?),
        &read(&kernels::softmax_axis(&x, 1).sync_on(&s)?),
        "softmax",
    );
    let _ = DType::to_f64(1.0f32);
    Ok(())
}

/// The launch shapes of the strided kernel and the row kernels: many outputs over a short
/// axis (32 threads per output on a large device), fewer outputs over a long axis (the axis
/// split over blocks), a packed reduced axis under few and many outputs, odd sizes (rows not
/// a whole number of 16-byte vectors, nor starting on one), an axis of length 1, a single
/// output, transposed and narrowed views, long rows of a short tensor, all against the
/// float64 references.
fn launch_shapes<T: Float>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    for (shape, axes) in [
        (&[8191usize, 37][..], &[0usize, 1][..]),
        (&[64, 9000], &[0]),
        (&[2048, 600], &[0]),
        (&[1, 1000], &[0, 1]),
        (&[1000, 1], &[0, 1]),
        (&[2, 70001], &[1]),
        (&[3, 4099, 5], &[1]),
    ] {
        let data: Vec<T> = uniform(&mut rng, shape.iter().product(), -2.0, 2.0);
        let x = upload(&s, &data, shape);
        for &axis in axes {
            check_reductions(&x, &data, shape, axis, &format!("{shape:?}"))?;
        }
    }
    let data: Vec<T> = uniform(&mut rng, 37 * 8191, -2.0, 2.0);
    let t = upload(&s, &data, &[37, 8191]).transpose(0, 1)?;
    let dense = read(&t);
    for axis in 0..2 {
        check_reductions(&t, &dense, &[8191, 37], axis, "transposed [37, 8191]")?;
    }
    // The reduced axis packed (stride 1) under many outputs.
    let t = upload(&s, &data, &[8191, 37]).transpose(0, 1)?;
    let dense = read(&t);
    for axis in 0..2 {
        check_reductions(&t, &dense, &[37, 8191], axis, "transposed [8191, 37]")?;
    }
    let n = upload(&s, &data, &[8191, 37]).narrow(1, 1, 35)?;
    let dense = read(&n);
    for axis in 0..2 {
        check_reductions(&n, &dense, &[8191, 35], axis, "narrowed [8191, 37]")?;
    }
    Ok(())
}

test_cases! {
    launch_shapes_f32 => launch_shapes::<f32>(12),
    launch_shapes_f64 => launch_shapes::<f64>(13),
}

/// The same input gives the same bits, the axis split over blocks or not.
#[test]
fn reductions_are_deterministic() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(15);
    for (shape, axis) in [([4096usize, 40], 0), ([8191, 37], 1), ([64, 9000], 0)] {
        let data: Vec<f32> = uniform(&mut rng, shape.iter().product(), -1.0, 1.0);
        let x = upload(&s, &data, &shape);
        let a = read(&kernels::sum_axis(&x, axis, false).sync_on(&s)?);
        let b = read(&kernels::sum_axis(&x, axis, false).sync_on(&s)?);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        assert_exact(&bits(&a), &bits(&b), &format!("sum {shape:?} axis {axis}"));
    }
    Ok(())
}

/// Integer reductions on the split and the vectorized paths: `i64` sums wrap, `u8` maxima and
/// first-index arg-reductions are exact, with many ties.
#[test]
fn integer_reductions_on_long_axes() -> Result<(), DeviceError> {
    use rand::Rng;
    let s = stream();
    let mut rng = seeded_rng(16);
    let shape = [3000usize, 5];
    let big: Vec<i64> = (0..15_000)
        .map(|_| rng.gen_range(i64::MIN / 2..i64::MAX / 2))
        .collect();
    let x = upload(&s, &big, &shape);
    let small: Vec<u8> = (0..15_000).map(|_| rng.gen_range(0..40)).collect();
    let y = upload(&s, &small, &shape);
    for axis in 0..2 {
        let ls = lanes(&big, &shape, axis);
        let sums: Vec<i64> = ls
            .iter()
            .map(|l| l.iter().fold(0i64, |a, v| a.wrapping_add(*v)))
            .collect();
        let got = read(&kernels::sum_axis(&x, axis, false).sync_on(&s)?);
        assert_exact(&got, &sums, &format!("i64 sum axis {axis}"));
        let am: Vec<u32> = ls.iter().map(|l| arg(l, true)).collect();
        let got = read(&kernels::argmax_axis(&x, axis, false).sync_on(&s)?);
        assert_exact(&got, &am, &format!("i64 argmax axis {axis}"));
        let ls = lanes(&small, &shape, axis);
        let maxes: Vec<u8> = ls.iter().map(|l| *l.iter().max().unwrap()).collect();
        let got = read(&kernels::max_axis(&y, axis, false).sync_on(&s)?);
        assert_exact(&got, &maxes, &format!("u8 max axis {axis}"));
        for max in [true, false] {
            let want: Vec<u32> = ls.iter().map(|l| arg(l, max)).collect();
            let got = if max {
                kernels::argmax_axis(&y, axis, false).sync_on(&s)?
            } else {
                kernels::argmin_axis(&y, axis, false).sync_on(&s)?
            };
            assert_exact(
                &read(&got),
                &want,
                &format!("u8 arg (max {max}) axis {axis}"),
            );
        }
    }
    // Rows of u8: 16 elements a vector, rows starting off a vector boundary.
    let rows: Vec<u8> = (0..3 * 1001).map(|_| rng.gen_range(0..200)).collect();
    let r = upload(&s, &rows, &[3, 1001]);
    let want: Vec<u32> = rows.chunks(1001).map(|l| arg(l, true)).collect();
    assert_exact(
        &read(&kernels::argmax(&r).sync_on(&s)?),
        &want,
        "u8 row argmax",
    );
    let want: Vec<u8> = rows
        .chunks(1001)
        .map(|l| l.iter().fold(0u8, |a, v| a.wrapping_add(*v)))
        .collect();
    assert_exact(&read(&kernels::sum(&r).sync_on(&s)?), &want, "u8 row sum");
    Ok(())
}

/// `i32` sums that overflow wrap on the row kernel (its block reduction included) and on the
/// strided kernel (split over blocks or not), as `wrapping_add` does: the kernels add signed
/// integers in unsigned arithmetic, since C leaves signed overflow undefined.
#[test]
fn signed_sums_wrap_on_every_path() -> Result<(), DeviceError> {
    use rand::Rng;
    let s = stream();
    let mut rng = seeded_rng(17);
    for shape in [[3000usize, 5], [5, 3000], [2, 70_001]] {
        let n = shape[0] * shape[1];
        let v: Vec<i32> = (0..n)
            .map(|_| rng.gen_range(i32::MAX / 2..=i32::MAX))
            .collect();
        let x = upload(&s, &v, &shape);
        for axis in 0..2 {
            let want: Vec<i32> = lanes(&v, &shape, axis)
                .iter()
                .map(|l| l.iter().fold(0i32, |a, v| a.wrapping_add(*v)))
                .collect();
            let got = read(&kernels::sum_axis(&x, axis, false).sync_on(&s)?);
            assert_exact(&got, &want, &format!("i32 sum {shape:?} axis {axis}"));
        }
        let want: Vec<i32> = v
            .chunks(shape[1])
            .map(|l| l.iter().fold(0i32, |a, v| a.wrapping_add(*v)))
            .collect();
        let got = read(&kernels::sum(&x).sync_on(&s)?);
        assert_exact(&got, &want, &format!("i32 row sum {shape:?}"));
    }
    Ok(())
}

/// The largest (`max`) or smallest value of `lane` that is not NaN and its first index; NaN
/// and index 0 when every value is NaN.
fn nan_skipping<T: Float>(lane: &[T], max: bool) -> (T, u32) {
    let mut best: Option<(T, u32)> = None;
    for (i, &v) in lane.iter().enumerate() {
        let better = |b: T| if max { v > b } else { v < b };
        if !v.to_f64().is_nan() && best.is_none_or(|(b, _)| better(b)) {
            best = Some((v, i as u32));
        }
    }
    best.unwrap_or((lane[0], 0))
}

/// Checks `max`, `min`, `argmax` and `argmin` of `x` (elements `data`, shape `shape`) over
/// `axis` against [`nan_skipping`], NaN equal to NaN.
fn check_nan_skipping<T: Float>(
    x: &Tensor<T>,
    data: &[T],
    shape: &[usize],
    axis: usize,
    what: &str,
) -> Result<(), DeviceError> {
    let s = stream();
    let ls = lanes(data, shape, axis);
    for max in [true, false] {
        let want: Vec<(T, u32)> = ls.iter().map(|l| nan_skipping(l, max)).collect();
        let (value, index) = if max {
            (
                read(&kernels::max_axis(x, axis, false).sync_on(&s)?),
                read(&kernels::argmax_axis(x, axis, false).sync_on(&s)?),
            )
        } else {
            (
                read(&kernels::min_axis(x, axis, false).sync_on(&s)?),
                read(&kernels::argmin_axis(x, axis, false).sync_on(&s)?),
            )
        };
        for (o, &(v, i)) in want.iter().enumerate() {
            let same = value[o] == v || (value[o].to_f64().is_nan() && v.to_f64().is_nan());
            assert!(
                same && index[o] == i,
                "{what} ({}) axis {axis}, max {max}, output {o}: got {:?} at {}, expected {v:?} \
                 at {i}",
                T::NAME,
                value[o],
                index[o]
            );
        }
    }
    if axis + 1 == shape.len() && x.is_contiguous() {
        let want: Vec<u32> = ls.iter().map(|l| nan_skipping(l, true).1).collect();
        assert_exact(
            &read(&kernels::argmax(x).sync_on(&s)?),
            &want,
            &format!("{what}: row argmax"),
        );
        let want: Vec<T> = ls.iter().map(|l| nan_skipping(l, true).0).collect();
        let got = read(&kernels::max(x).sync_on(&s)?);
        for (o, (g, w)) in got.iter().zip(&want).enumerate() {
            let same = g == w || (g.to_f64().is_nan() && w.to_f64().is_nan());
            assert!(same, "{what}: row max {o}: got {g:?}, expected {w:?}");
        }
    }
    Ok(())
}

/// NaN is never the maximum or the minimum, nor their index, unless a lane is all NaN (then
/// the value is NaN and the index 0): the same on the row kernels (NaN first in a row, first
/// in a thread's share of it), the strided kernel, a packed view and an axis split over
/// blocks, so that `max` is the value `argmax` points at.
fn nan_is_never_chosen<T: Float>(seed: u64) -> Result<(), DeviceError> {
    use rand::Rng;
    let s = stream();
    let mut rng = seeded_rng(seed);
    let nan = T::from_f64(f64::NAN);
    for (shape, axes) in [
        (&[6usize, 300][..], &[0usize, 1][..]),
        (&[2, 70001], &[1]),
        (&[70001, 2], &[0]),
        (&[9, 4099], &[0, 1]),
    ] {
        let n: usize = shape.iter().product();
        let mut data: Vec<T> = uniform(&mut rng, n, -2.0, 2.0);
        for v in data.iter_mut() {
            if rng.gen_range(0..5) == 0 {
                *v = nan;
            }
        }
        // The first element of every row and of every column is NaN, and one row and one
        // column are all NaN.
        let cols = shape[1];
        for r in 0..shape[0] {
            data[r * cols] = nan;
        }
        data[..cols].fill(nan);
        data[(shape[0] - 1) * cols..].fill(nan);
        for r in 0..shape[0] {
            data[r * cols + cols - 1] = nan;
        }
        let x = upload(&s, &data, shape);
        for &axis in axes {
            check_nan_skipping(&x, &data, shape, axis, &format!("{shape:?}"))?;
        }
        let t = x.transpose(0, 1)?;
        let dense = read(&t);
        let tshape = [shape[1], shape[0]];
        for &axis in axes {
            check_nan_skipping(&t, &dense, &tshape, 1 - axis, &format!("{shape:?}ᵀ"))?;
        }
    }
    Ok(())
}

test_cases! {
    nan_is_never_chosen_f32 => nan_is_never_chosen::<f32>(17),
    nan_is_never_chosen_f64 => nan_is_never_chosen::<f64>(18),
    nan_is_never_chosen_bf16 => nan_is_never_chosen::<bf16>(19),
}

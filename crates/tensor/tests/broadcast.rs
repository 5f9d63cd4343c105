//! NumPy broadcasting of the binary elementwise kernels, comparisons, `where_` and `clamp`,
//! against float64 (or exact integer) references computed here by index arithmetic, on
//! random inputs: broadcast pairs of every kind, zero-size axes, views (transposed, narrowed,
//! expanded) as inputs, and shapes that do not broadcast.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, f16, kernels, DType, Tensor};
use cuflow_testing::{
    device::stream,
    rng::seeded_rng,
    tensor::{assert_dtype_close, assert_exact, few_values, read, signed, upload, Float, Int},
    test_cases,
};

/// An op's name, its result and its reference function.
type Case<T, F> = (&'static str, Tensor<T>, F);
type FloatRef = fn(f64, f64) -> f64;
type IntRef<T> = fn(T, T) -> T;
type CmpRef<T> = fn(&T, &T) -> bool;

/// The shape `a` and `b` broadcast to (the pairs below are all compatible).
fn out_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = (i + a.len()).checked_sub(r).map_or(1, |j| a[j]);
            let db = (i + b.len()).checked_sub(r).map_or(1, |j| b[j]);
            if da == 1 {
                db
            } else {
                da
            }
        })
        .collect()
}

/// The position in a tensor of `shape` of the element that output index `idx` (of a rank at
/// least `shape`'s) reads under broadcasting.
fn source(idx: &[usize], shape: &[usize]) -> usize {
    let lead = idx.len() - shape.len();
    shape.iter().enumerate().fold(0, |p, (a, &d)| {
        p * d + if d == 1 { 0 } else { idx[lead + a] }
    })
}

/// `f(a[..], b[..])` over the broadcast shape, with `a` of `sa` and `b` of `sb`.
fn bc_ref<A: Copy, B: Copy, R>(
    a: &[A],
    sa: &[usize],
    b: &[B],
    sb: &[usize],
    f: impl Fn(A, B) -> R,
) -> Vec<R> {
    let out = out_shape(sa, sb);
    let n: usize = out.iter().product();
    (0..n)
        .map(|mut i| {
            let mut idx = vec![0; out.len()];
            for k in (0..out.len()).rev() {
                idx[k] = i % out[k];
                i /= out[k];
            }
            f(a[source(&idx, sa)], b[source(&idx, sb)])
        })
        .collect()
}

/// Pairs of broadcastable shapes: a column, a leading row, an empty result, a middle axis of
/// one on both sides, the dense row fast path, equal shapes, and scalars.
const PAIRS: &[(&[usize], &[usize])] = &[
    (&[2, 3], &[2, 1]),
    (&[3], &[2, 3]),
    (&[1], &[0, 3]),
    (&[2, 1, 4], &[3, 1]),
    (&[4, 1000], &[1000]),
    (&[1, 1000], &[4, 1]),
    (&[5, 7], &[5, 7]),
    (&[], &[3, 2]),
    (&[6, 1, 1, 2], &[1, 5, 3, 1]),
];

fn float_ops<T: Float>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    for &(sa, sb) in PAIRS {
        let a: Vec<T> = signed(&mut rng, sa.iter().product(), 0.5, 2.0);
        let b: Vec<T> = signed(&mut rng, sb.iter().product(), 0.5, 2.0);
        let (x, y) = (upload(&s, &a, sa), upload(&s, &b, sb));
        let shape = out_shape(sa, sb);
        let ops: [Case<T, FloatRef>; 4] = [
            ("add", kernels::add(&x, &y).sync_on(&s)?, |a, b| a + b),
            ("sub", kernels::sub(&y, &x).sync_on(&s)?, |a, b| b - a),
            ("mul", kernels::mul(&x, &y).sync_on(&s)?, |a, b| a * b),
            ("div", kernels::div(&x, &y).sync_on(&s)?, |a, b| a / b),
        ];
        for (what, got, f) in ops {
            assert_eq!(got.shape(), &shape[..], "{what} {sa:?} {sb:?}");
            let want = bc_ref(&a, sa, &b, sb, |p: T, q: T| f(p.to_f64(), q.to_f64()));
            assert_dtype_close(
                &read(&got),
                &want,
                T::ARITH_TOL,
                &format!("{what} {sa:?} {sb:?}"),
            );
        }
    }
    Ok(())
}

fn int_ops<T: Int>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    for &(sa, sb) in PAIRS {
        let a: Vec<T> = (0..sa.iter().product())
            .map(|_| T::random(&mut rng))
            .collect();
        let b: Vec<T> = (0..sb.iter().product())
            .map(|_| T::random(&mut rng))
            .collect();
        let (x, y) = (upload(&s, &a, sa), upload(&s, &b, sb));
        let ops: [Case<T, IntRef<T>>; 3] = [
            ("add", kernels::add(&x, &y).sync_on(&s)?, T::ref_add),
            ("mul", kernels::mul(&x, &y).sync_on(&s)?, T::ref_mul),
            ("div", kernels::div(&x, &y).sync_on(&s)?, T::ref_div),
        ];
        for (what, got, f) in ops {
            assert_exact(&read(&got), &bc_ref(&a, sa, &b, sb, f), what);
        }
    }
    Ok(())
}

test_cases! {
    broadcast_f32 => float_ops::<f32>(1),
    broadcast_f64 => float_ops::<f64>(2),
    broadcast_f16 => float_ops::<f16>(3),
    broadcast_bf16 => float_ops::<bf16>(4),
    broadcast_i32 => int_ops::<i32>(5),
    broadcast_u32 => int_ops::<u32>(6),
    broadcast_i64 => int_ops::<i64>(7),
}

/// Views as operands: a transposed matrix plus a narrowed column, an expanded row times a
/// selected slice; each against the reference over the views' own elements.
fn views_as_operands<T: Float>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let a: Vec<T> = signed(&mut rng, 6 * 5, 0.5, 2.0);
    let b: Vec<T> = signed(&mut rng, 5 * 4, 0.5, 2.0);
    let (x, y) = (upload(&s, &a, &[6, 5]), upload(&s, &b, &[5, 4]));
    let xt = x.transpose(0, 1)?; // [5, 6]
    let col = y.narrow(1, 2, 1)?; // [5, 1], stride 4
    let got = read(&kernels::add(&xt, &col).sync_on(&s)?);
    let want: Vec<f64> = (0..30)
        .map(|k| {
            let (i, j) = (k / 6, k % 6);
            a[j * 5 + i].to_f64() + b[i * 4 + 2].to_f64()
        })
        .collect();
    assert_dtype_close(&got, &want, T::ARITH_TOL, "transpose + narrowed column");

    let row = y.select(0, 3)?.expand(&[2, 4])?; // [2, 4], strides [0, 1]
    let rows = x.slice(&[1..3, 1..5])?; // [2, 4], strides [5, 1]
    let got = read(&kernels::mul(&row, &rows).sync_on(&s)?);
    let want: Vec<f64> = (0..8)
        .map(|k| {
            let (i, j) = (k / 4, k % 4);
            b[12 + j].to_f64() * a[(i + 1) * 5 + j + 1].to_f64()
        })
        .collect();
    assert_dtype_close(&got, &want, T::ARITH_TOL, "expanded row * sliced block");
    Ok(())
}

test_cases! {
    views_broadcast_f32 => views_as_operands::<f32>(8),
    views_broadcast_f64 => views_as_operands::<f64>(9),
    views_broadcast_bf16 => views_as_operands::<bf16>(10),
}

fn comparisons_where_clamp<T: DType>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let (sa, sb) = (&[3usize, 1, 4][..], &[2usize, 4][..]);
    let (a, b) = (few_values::<T>(&mut rng, 12), few_values::<T>(&mut rng, 8));
    let (x, y) = (upload(&s, &a, sa), upload(&s, &b, sb));
    let cmps: [Case<u8, CmpRef<T>>; 6] = [
        ("eq", kernels::eq(&x, &y).sync_on(&s)?, PartialEq::eq),
        ("ne", kernels::ne(&x, &y).sync_on(&s)?, PartialEq::ne),
        ("lt", kernels::lt(&x, &y).sync_on(&s)?, PartialOrd::lt),
        ("le", kernels::le(&x, &y).sync_on(&s)?, PartialOrd::le),
        ("gt", kernels::gt(&x, &y).sync_on(&s)?, PartialOrd::gt),
        ("ge", kernels::ge(&x, &y).sync_on(&s)?, PartialOrd::ge),
    ];
    for (what, got, f) in cmps {
        assert_eq!(got.shape(), &[3, 2, 4], "{what}");
        let want = bc_ref(&a, sa, &b, sb, |p, q| u8::from(f(&p, &q)));
        assert_exact(&read(&got), &want, what);
    }

    // where_(x < y, x, y) is the elementwise minimum; the mask broadcasts against a column.
    let mask = kernels::lt(&x, &y).sync_on(&s)?;
    let got = kernels::where_(&mask, &x, &y).sync_on(&s)?;
    let want = bc_ref(&a, sa, &b, sb, |p, q| if p < q { p } else { q });
    assert_exact(&read(&got), &want, "where_ (minimum)");
    let col = upload(&s, &few_values::<T>(&mut rng, 3), &[3, 1, 1]);
    let got = kernels::where_(&mask, &col, &y).sync_on(&s)?;
    let colh = read(&col);
    let mh = read(&mask);
    let want: Vec<T> = (0..24)
        .map(|k| if mh[k] != 0 { colh[k / 8] } else { b[k % 8] })
        .collect();
    assert_exact(&read(&got), &want, "where_ with a broadcast column");

    // clamp of a transposed view.
    let t = x.squeeze(1)?.transpose(0, 1)?; // [4, 3]
    let (lo, hi) = (T::from_f64(1.0), T::from_f64(2.0));
    let got = kernels::clamp(&t, lo, hi).sync_on(&s)?;
    let want: Vec<T> = (0..12)
        .map(|k| {
            let v = a[(k % 3) * 4 + k / 3];
            if v < lo {
                lo
            } else if v > hi {
                hi
            } else {
                v
            }
        })
        .collect();
    assert_exact(&read(&got), &want, "clamp of a transpose");
    // min > max gives max everywhere.
    let got = kernels::clamp(&x, hi, lo).sync_on(&s)?;
    assert_exact(&read(&got), &[lo; 12], "clamp with min > max");
    Ok(())
}

test_cases! {
    compare_f32 => comparisons_where_clamp::<f32>(11),
    compare_f16 => comparisons_where_clamp::<f16>(12),
    compare_i32 => comparisons_where_clamp::<i32>(13),
    compare_u8 => comparisons_where_clamp::<u8>(14),
    compare_f64 => comparisons_where_clamp::<f64>(15),
}

/// NaN compares false (and unequal), and `clamp` keeps it.
#[test]
fn nan_compares_false_and_survives_clamp() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::from_vec(vec![f32::NAN, 1.0], &[2]).sync_on(&s)?;
    let y = api::from_vec(vec![f32::NAN], &[1]).sync_on(&s)?;
    for (what, got) in [
        ("eq", kernels::eq(&x, &y).sync_on(&s)?),
        ("lt", kernels::lt(&x, &y).sync_on(&s)?),
        ("ge", kernels::ge(&x, &y).sync_on(&s)?),
    ] {
        assert_exact(&read(&got), &[0, 0], what);
    }
    assert_exact(&read(&kernels::ne(&x, &y).sync_on(&s)?), &[1, 1], "ne");
    let c = read(&kernels::clamp(&x, 0.0, 0.5).sync_on(&s)?);
    assert!(c[0].is_nan() && c[1] == 0.5, "{c:?}");
    Ok(())
}

/// Shapes that do not broadcast are refused by every broadcasting op, naming the axis.
#[test]
fn incompatible_shapes_name_the_axis() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::ones::<f32>(&[2, 3]).sync_on(&s)?;
    let y = api::ones::<f32>(&[4, 1]).sync_on(&s)?;
    let m = api::ones::<u8>(&[2, 3]).sync_on(&s)?;
    let errs = [
        ("sub", kernels::sub(&x, &y).sync_on(&s).map(|_| ())),
        ("eq", kernels::eq(&x, &y).sync_on(&s).map(|_| ())),
        (
            "where_",
            kernels::where_(&m, &x, &y).sync_on(&s).map(|_| ()),
        ),
    ];
    for (op, r) in errs {
        let err = r.unwrap_err();
        assert!(
            matches!(err, DeviceError::ShapeMismatch { op: o, .. } if o == op),
            "{op}: {err}"
        );
        assert!(err.to_string().contains("axis 0"), "{op}: {err}");
    }
    Ok(())
}

/// Reference of `x + y` broadcast to `[2; rank]`, for `x` and `y` whose axes are 1 or 2.
fn add_ref(xh: &[f32], xs: &[usize], yh: &[f32], ys: &[usize]) -> Vec<f64> {
    let rank = xs.len();
    let at = |h: &[f32], shape: &[usize], i: usize| {
        let bit = |a: usize| (i >> (rank - 1 - a)) & 1;
        let k = (0..rank).fold(0, |p, a| if shape[a] == 2 { p * 2 + bit(a) } else { p });
        f64::from(h[k])
    };
    (0..1usize << rank)
        .map(|i| at(xh, xs, i) + at(yh, ys, i))
        .collect()
}

/// Operands broadcast along alternating axes, more of them than the strided kernel indexes,
/// are read from copies broadcast to the full shape; where only the operands together have
/// too many axes, the error names the shape and the way out, and that way works.
#[test]
fn broadcasts_along_more_than_eight_axes() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(30);
    let (xs, ys) = ([2, 1, 2, 1, 2, 1, 2, 1, 2], [1, 2, 1, 2, 1, 2, 1, 2, 1]);
    let (xh, yh): (Vec<f32>, Vec<f32>) = (
        signed(&mut rng, 32, 0.5, 2.0),
        signed(&mut rng, 16, 0.5, 2.0),
    );
    let (x, y) = (upload(&s, &xh, &xs), upload(&s, &yh, &ys));
    let got = read(&kernels::add(&x, &y).sync_on(&s)?);
    assert_dtype_close(
        &got,
        &add_ref(&xh, &xs, &yh, &ys),
        f32::ARITH_TOL,
        "alternating",
    );

    // Each operand alone merges to 8 axes, but together they break at 9 places.
    let (xs, ys) = (
        [1, 1, 2, 1, 2, 1, 2, 1, 2, 2],
        [2, 2, 1, 2, 1, 2, 1, 2, 2, 1],
    );
    let (xh, yh): (Vec<f32>, Vec<f32>) = (
        signed(&mut rng, 32, 0.5, 2.0),
        signed(&mut rng, 64, 0.5, 2.0),
    );
    let (x, y) = (upload(&s, &xh, &xs), upload(&s, &yh, &ys));
    let err = kernels::add(&x, &y).sync_on(&s).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "add", .. }),
        "{text}"
    );
    assert!(text.contains("[2, 2, 2, 2, 2, 2, 2, 2, 2, 2]"), "{text}");
    assert!(text.contains("contiguous(x.expand(shape))"), "{text}");
    let full = [2; 10];
    let wide_x = kernels::contiguous(x.expand(&full)?).sync_on(&s)?;
    let wide_y = kernels::contiguous(y.expand(&full)?).sync_on(&s)?;
    let got = read(&kernels::add(&wide_x, &wide_y).sync_on(&s)?);
    assert_dtype_close(
        &got,
        &add_ref(&xh, &xs, &yh, &ys),
        f32::ARITH_TOL,
        "after the copies",
    );
    Ok(())
}

//! Elementwise kernels against references computed here: floating-point kernels against `f64`
//! by relative error within each type's tolerance, integer kernels exactly against wrapping
//! arithmetic (a zero divisor gives 0).
//!
//! Every kernel runs on random inputs of awkward shapes: a last axis of 1, 7, 1000 and 4097
//! elements with a few rows, one element, and a rank-3 tensor. Odd element counts take the
//! kernels' scalar path; 4 × 1000 is a multiple of every vector width and takes the vector
//! path, with the broadcast row vectorized where the row length allows.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{DeviceError, Stream};
use cuflow_tensor::{api, bf16, f16, kernels, DType, Partition, PartitionExt, Tensor};
use cuflow_testing::{device::stream, rng::seeded_rng, tensor::*, test_cases};

/// The shapes every kernel runs on.
const SHAPES: &[&[usize]] = &[&[1], &[3, 1], &[5, 7], &[4, 1000], &[3, 4097], &[2, 3, 7]];

/// A seed per test and element type.
fn seed<T: DType>(salt: u64) -> u64 {
    T::NAME.bytes().fold(salt, |h, b| {
        h.wrapping_mul(1_000_003).wrapping_add(u64::from(b))
    })
}

/// Runs `op` on `stream`, checks that its output has `shape`, and reads it back.
fn run<T: DType>(
    stream: &Stream,
    shape: &[usize],
    op: impl cuflow_device_op::DeviceOp<Output = Tensor<T>>,
) -> Result<Vec<T>, DeviceError> {
    let out = op.sync_on(stream)?;
    assert_eq!(out.shape(), shape, "output shape");
    out.to_host_vec()
}

/// `z` split into tiles of one row (the last axes whole).
fn row_tiles<T: DType>(z: &mut Tensor<T>) -> Partition<&mut Tensor<T>> {
    match *z.shape() {
        [n] => z.partition([n]),
        [_, c] => z.partition([1, c]),
        [_, m, c] => z.partition([1, m, c]),
        ref s => panic!("no row tiling for rank {}", s.len()),
    }
}

/// The error function, by its Taylor series (accurate to about 1e-15 for |x| <= 2).
fn erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    let mut n = 0.0;
    while term.abs() > 1e-18 {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn reference_erf_is_accurate() {
    // Values of erf from tables (Abramowitz and Stegun 7.1).
    for (x, want) in [
        (0.0, 0.0),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (-1.5, -0.966_105_146_475_310_7),
        (2.0, 0.995_322_265_018_952_7),
    ] {
        assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {}", erf(x));
    }
}

/// The complementary error function `1 - erf(x)`: 2 below -6 (where it rounds to 2), by [`erf`]
/// below 2, where the difference cancels by less than a factor 220; beyond, `e^(-x²)/√π` times
/// the continued fraction `1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))` evaluated from its
/// 2000th level back.
fn erfc(x: f64) -> f64 {
    if x < -6.0 {
        return 2.0;
    }
    if x < 2.0 {
        return 1.0 - erf(x);
    }
    let mut t = x;
    for n in (1..=2000).rev() {
        t = x + f64::from(n) / 2.0 / t;
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / t
}

#[test]
fn reference_erfc_is_accurate() {
    // Values of erfc (mpmath, rounded to f64), from 2 down to 5.7e-296.
    for (x, want) in [
        (-2.0, 1.9953222650189528),
        (0.5, 0.4795001221869535),
        (2.0, 0.004677734981047266),
        (2.5, 0.0004069520174449589),
        (3.0, 2.209049699858544e-05),
        (5.0, 1.537459794428035e-12),
        (7.0710678118654755, 1.5239706048320995e-23),
        (10.0, 2.088487583762545e-45),
        (26.0, 5.663192408856143e-296),
    ] {
        let err = (erfc(x) - want).abs() / want;
        assert!(
            err < 1e-14,
            "erfc({x}) = {}, relative error {err:e}",
            erfc(x)
        );
    }
}

/// GELU `x · Φ(x) = 0.5 · x · erfc(-x / √2)`, without the cancellation of `1 + erf(x / √2)`.
fn gelu_ref(x: f64) -> f64 {
    0.5 * x * erfc(-x / std::f64::consts::SQRT_2)
}

/// SiLU `x / (1 + e^(-x))`; for negative `x` as `-e^(x + ln(-x)) / (1 + e^x)`, which neither
/// overflows `e^(-x)` nor rounds `e^x` to a subnormal before the product.
fn silu_ref(x: f64) -> f64 {
    if x < 0.0 {
        -(x + (-x).ln()).exp() / (1.0 + x.exp())
    } else {
        x / (1.0 + (-x).exp())
    }
}

/// ReLU as PyTorch computes it: NaN stays NaN.
fn relu_ref(x: f64) -> f64 {
    if x > 0.0 || x.is_nan() {
        x
    } else {
        0.0
    }
}

fn float_binary<T: Float>() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = seeded_rng(seed::<T>(1));
    for &shape in SHAPES {
        let (n, cols) = (numel(shape), shape[shape.len() - 1]);
        let what = |op: &str| format!("{op} {shape:?}");
        // Sums and differences of any values: a cancellation is exact or correctly rounded.
        let x: Vec<T> = uniform(&mut rng, n, -4.0, 4.0);
        let y: Vec<T> = uniform(&mut rng, n, -4.0, 4.0);
        let row: Vec<T> = uniform(&mut rng, cols, -4.0, 4.0);
        // Factors and denominators away from zero.
        let p: Vec<T> = signed(&mut rng, n, 0.25, 4.0);
        let q: Vec<T> = signed(&mut rng, n, 0.25, 4.0);
        let qrow: Vec<T> = signed(&mut rng, cols, 0.25, 4.0);
        let (tx, ty, tp, tq) = (
            upload(&stream, &x, shape),
            upload(&stream, &y, shape),
            upload(&stream, &p, shape),
            upload(&stream, &q, shape),
        );
        let (trow, tqrow) = (
            upload(&stream, &row, &[cols]),
            upload(&stream, &qrow, &[cols]),
        );
        let tol = T::ARITH_TOL;

        let got = run(&stream, shape, kernels::add(&tx, &ty))?;
        assert_dtype_close(&got, &zip_ref(&x, &y, |a, b| a + b), tol, &what("add"));
        let got = run(&stream, shape, kernels::sub(&tx, &ty))?;
        assert_dtype_close(&got, &zip_ref(&x, &y, |a, b| a - b), tol, &what("sub"));
        let got = run(&stream, shape, kernels::mul(&tp, &tq))?;
        assert_dtype_close(&got, &zip_ref(&p, &q, |a, b| a * b), tol, &what("mul"));
        let got = run(&stream, shape, kernels::div(&tp, &tq))?;
        assert_dtype_close(&got, &zip_ref(&p, &q, |a, b| a / b), tol, &what("div"));

        let got = run(&stream, shape, kernels::add(&tx, &trow))?;
        assert_dtype_close(
            &got,
            &row_ref(&x, &row, |a, b| a + b),
            tol,
            &what("add row"),
        );
        let got = run(&stream, shape, kernels::sub(&tx, &trow))?;
        assert_dtype_close(
            &got,
            &row_ref(&x, &row, |a, b| a - b),
            tol,
            &what("sub row"),
        );
        let got = run(&stream, shape, kernels::mul(&tp, &tqrow))?;
        assert_dtype_close(
            &got,
            &row_ref(&p, &qrow, |a, b| a * b),
            tol,
            &what("mul row"),
        );
        let got = run(&stream, shape, kernels::div(&tp, &tqrow))?;
        assert_dtype_close(
            &got,
            &row_ref(&p, &qrow, |a, b| a / b),
            tol,
            &what("div row"),
        );
    }
    Ok(())
}

fn float_scalar<T: Float>() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = seeded_rng(seed::<T>(2));
    for &shape in SHAPES {
        let what = |op: &str| format!("{op} {shape:?}");
        let x: Vec<T> = uniform(&mut rng, numel(shape), -4.0, 4.0);
        let s: T = signed(&mut rng, 1, 0.5, 2.0)[0];
        let tx = upload(&stream, &x, shape);
        let (sv, tol) = (s.to_f64(), T::ARITH_TOL);

        let got = run(&stream, shape, kernels::add_scalar(&tx, s))?;
        assert_dtype_close(&got, &map_ref(&x, |a| a + sv), tol, &what("add_scalar"));
        let got = run(&stream, shape, kernels::sub_scalar(&tx, s))?;
        assert_dtype_close(&got, &map_ref(&x, |a| a - sv), tol, &what("sub_scalar"));
        let got = run(&stream, shape, kernels::mul_scalar(&tx, s))?;
        assert_dtype_close(&got, &map_ref(&x, |a| a * sv), tol, &what("mul_scalar"));
        let got = run(&stream, shape, kernels::div_scalar(&tx, s))?;
        assert_dtype_close(&got, &map_ref(&x, |a| a / sv), tol, &what("div_scalar"));
        let got = run(&stream, shape, kernels::scale(&tx, s))?;
        assert_dtype_close(&got, &map_ref(&x, |a| a * sv), tol, &what("scale"));
    }
    Ok(())
}

fn float_unary<T: Float>() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = seeded_rng(seed::<T>(3));
    for &shape in SHAPES {
        let n = numel(shape);
        let what = |op: &str| format!("{op} {shape:?}");
        let mut input = |lo: f64, hi: f64| {
            let v: Vec<T> = uniform(&mut rng, n, lo, hi);
            let t = upload(&stream, &v, shape);
            (v, t)
        };

        let (x, tx) = input(-4.0, 4.0);
        let got = run(&stream, shape, kernels::relu(&tx))?;
        assert_dtype_close(&got, &map_ref(&x, relu_ref), 0.0, &what("relu"));

        let (x, tx) = input(-10.0, 4.0);
        let got = run(&stream, shape, kernels::gelu(&tx))?;
        assert_dtype_close(&got, &map_ref(&x, gelu_ref), T::GELU_TOL, &what("gelu"));

        let (x, tx) = input(-6.0, 6.0);
        let got = run(&stream, shape, kernels::silu(&tx))?;
        assert_dtype_close(&got, &map_ref(&x, silu_ref), T::TRANS_TOL, &what("silu"));

        let (x, tx) = input(-100.0, 20.0);
        let got = run(&stream, shape, kernels::silu(&tx))?;
        assert_dtype_close(&got, &map_ref(&x, silu_ref), T::TRANS_TOL, &what("silu"));

        let (x, tx) = input(-8.0, 8.0);
        let got = run(&stream, shape, kernels::exp(&tx))?;
        assert_dtype_close(&got, &map_ref(&x, f64::exp), T::TRANS_TOL, &what("exp"));

        let (x, tx) = input(-4.0, 4.0);
        let got = run(&stream, shape, kernels::tanh(&tx))?;
        assert_dtype_close(&got, &map_ref(&x, f64::tanh), T::TRANS_TOL, &what("tanh"));
    }
    Ok(())
}

/// The inputs where the textbook formulas fail, each as `T` rounds it (those it cannot hold
/// are left out): NaN stays NaN in every kernel (as in PyTorch; `relu(NaN)` gave 0), and silu
/// and gelu of very negative inputs keep their tiny results, which `x / (1 + e^(-x))` lost
/// where `e^(-x)` overflows (`silu(-90)` is -7.37e-38 in `f32`, `silu(-710)` -3.18e-306 in
/// `f64`) and `0.5 · x · (1 + erf(x / √2))` lost to cancellation (`gelu(-10)` is -7.62e-23).
fn float_unary_special_values<T: Float>() -> Result<(), DeviceError> {
    const X: &[f64] = &[
        f64::NAN,
        0.0,
        -0.0,
        1.0,
        -1.0,
        3.5,
        -5.0,
        -10.0,
        -20.0,
        -40.0,
        -90.0,
        -100.0,
        100.0,
        -700.0,
        -710.0,
        -720.0,
        1e4,
        f64::INFINITY,
    ];
    let stream = stream();
    let x: Vec<T> = X
        .iter()
        .map(|&v| (v, T::from_f64(v)))
        .filter(|(v, t)| t.to_f64().is_infinite() == v.is_infinite())
        .map(|(_, t)| t)
        .collect();
    let n = x.len();
    let tx = upload(&stream, &x, &[n]);
    let check = |op: &str, got: Vec<T>, f: fn(f64) -> f64, tol: f64| {
        for (&xi, &gi) in x.iter().zip(&got) {
            let (xv, g) = (xi.to_f64(), gi.to_f64());
            let want = f(xv);
            let what = format!("{op}({xv:e}) = {g:e}");
            // A NaN or an infinite result (exp(100) in f16) is exact.
            let rounded = T::from_f64(want).to_f64();
            if rounded.is_nan() {
                assert!(g.is_nan(), "{what} ({}), expected NaN", T::NAME);
            } else if rounded.is_infinite() {
                assert_eq!(g, rounded, "{what} ({})", T::NAME);
            } else {
                assert_dtype_close(&[gi], &[want], tol, &what);
            }
        }
    };
    check(
        "relu",
        run(&stream, &[n], kernels::relu(&tx))?,
        relu_ref,
        0.0,
    );
    check(
        "gelu",
        run(&stream, &[n], kernels::gelu(&tx))?,
        gelu_ref,
        T::TRANS_TOL,
    );
    check(
        "silu",
        run(&stream, &[n], kernels::silu(&tx))?,
        silu_ref,
        T::TRANS_TOL,
    );
    check(
        "exp",
        run(&stream, &[n], kernels::exp(&tx))?,
        f64::exp,
        T::TRANS_TOL,
    );
    check(
        "tanh",
        run(&stream, &[n], kernels::tanh(&tx))?,
        f64::tanh,
        T::TRANS_TOL,
    );
    Ok(())
}

/// `gelu` of `f64` holds double precision: the host backend computed it with an erf fit whose
/// fractional error is about 1.2e-7, off by that much from CUDA's `erf` in `double`.
#[test]
fn gelu_of_f64_holds_double_precision() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = seeded_rng(seed::<f64>(11));
    // |x / √2| <= 2, where the reference erf is accurate to 1e-15; near x = -2.8, 1 + erf
    // cancels to 0.006, which leaves both about 1e-13 of relative error.
    let x: Vec<f64> = uniform(&mut rng, 4096, -2.8, 2.8);
    let tx = upload(&stream, &x, &[4096]);
    let got = run(&stream, &[4096], kernels::gelu(&tx))?;
    let want = map_ref(&x, |a| 0.5 * a * (1.0 + erf(a / std::f64::consts::SQRT_2)));
    assert_dtype_close(&got, &want, 1e-12, "gelu");
    Ok(())
}

fn float_saxpy<T: Float>() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = seeded_rng(seed::<T>(4));
    let a = T::from_f64(1.5);
    for &shape in SHAPES {
        let n = numel(shape);
        // The old output stays well above |a·x|, so the sum never cancels.
        let old: Vec<T> = uniform(&mut rng, n, 4.0, 6.0);
        let x: Vec<T> = uniform(&mut rng, n, -1.0, 1.0);
        let tx = upload(&stream, &x, shape);
        let want = zip_ref(&old, &x, |o, x| 1.5 * x + o);

        // One tile per row.
        let mut z = upload(&stream, &old, shape);
        let (tiles, x_back) = kernels::saxpy(row_tiles(&mut z), a, &tx).sync_on(&stream)?;
        assert!(std::ptr::eq(x_back, &tx), "saxpy gives its input back");
        drop(tiles);
        let what = format!("saxpy {shape:?} by rows");
        assert_dtype_close(&read(&z), &want, T::ARITH_TOL, &what);

        // One tile for the whole tensor.
        let mut z = upload(&stream, &old, shape);
        let whole = match *shape {
            [n] => kernels::saxpy((&mut z).partition([n]), a, &tx).sync_on(&stream),
            [r, c] => kernels::saxpy((&mut z).partition([r, c]), a, &tx).sync_on(&stream),
            [r, m, c] => kernels::saxpy((&mut z).partition([r, m, c]), a, &tx).sync_on(&stream),
            _ => unreachable!("the shapes have rank 1 to 3"),
        };
        drop(whole?);
        let what = format!("saxpy {shape:?} in one tile");
        assert_dtype_close(&read(&z), &want, T::ARITH_TOL, &what);
    }
    Ok(())
}

/// A test per floating-point type for each function: `group::f32`, `group::bf16`, ...
macro_rules! float_tests {
    ($($group:ident => $body:ident),* $(,)?) => {$(
        mod $group {
            use super::*;

            test_cases! {
                f32 => $body::<f32>(),
                f64 => $body::<f64>(),
                f16 => $body::<f16>(),
                bf16 => $body::<bf16>(),
            }
        }
    )*};
}

float_tests!(
    binary => float_binary,
    scalar => float_scalar,
    unary => float_unary,
    unary_special_values => float_unary_special_values,
    saxpy => float_saxpy,
);

/// `n` random integers with every `k`-th (from the first) zero.
fn with_zeros<T: Int>(rng: &mut rand::rngs::StdRng, n: usize, k: usize) -> Vec<T> {
    (0..n)
        .map(|i| if i % k == 0 { T::ZERO } else { T::random(rng) })
        .collect()
}

fn int_zip<T: Int>(x: &[T], y: &[T], f: fn(T, T) -> T) -> Vec<T> {
    x.iter().zip(y).map(|(a, b)| f(*a, *b)).collect()
}

fn int_row<T: Int>(x: &[T], row: &[T], f: fn(T, T) -> T) -> Vec<T> {
    x.iter()
        .enumerate()
        .map(|(i, a)| f(*a, row[i % row.len()]))
        .collect()
}

fn int_kernels<T: Int>() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = seeded_rng(seed::<T>(5));
    for &shape in SHAPES {
        let (n, cols) = (numel(shape), shape[shape.len() - 1]);
        let what = |op: &str| format!("{op} {shape:?}");
        let x: Vec<T> = ints(&mut rng, n);
        let y: Vec<T> = ints(&mut rng, n);
        let row: Vec<T> = ints(&mut rng, cols);
        // Divisors with zeros among them.
        let d: Vec<T> = with_zeros(&mut rng, n, 4);
        let drow: Vec<T> = with_zeros(&mut rng, cols, 3);
        let (tx, ty, td) = (
            upload(&stream, &x, shape),
            upload(&stream, &y, shape),
            upload(&stream, &d, shape),
        );
        let (trow, tdrow) = (
            upload(&stream, &row, &[cols]),
            upload(&stream, &drow, &[cols]),
        );

        let got = run(&stream, shape, kernels::add(&tx, &ty))?;
        assert_exact(&got, &int_zip(&x, &y, T::ref_add), &what("add"));
        let got = run(&stream, shape, kernels::sub(&tx, &ty))?;
        assert_exact(&got, &int_zip(&x, &y, T::ref_sub), &what("sub"));
        let got = run(&stream, shape, kernels::mul(&tx, &ty))?;
        assert_exact(&got, &int_zip(&x, &y, T::ref_mul), &what("mul"));
        let got = run(&stream, shape, kernels::div(&tx, &td))?;
        assert_exact(&got, &int_zip(&x, &d, T::ref_div), &what("div"));
        assert!(got[0] == T::ZERO, "{}: x / 0 must be 0", what("div"));

        let got = run(&stream, shape, kernels::add(&tx, &trow))?;
        assert_exact(&got, &int_row(&x, &row, T::ref_add), &what("add row"));
        let got = run(&stream, shape, kernels::sub(&tx, &trow))?;
        assert_exact(&got, &int_row(&x, &row, T::ref_sub), &what("sub row"));
        let got = run(&stream, shape, kernels::mul(&tx, &trow))?;
        assert_exact(&got, &int_row(&x, &row, T::ref_mul), &what("mul row"));
        let got = run(&stream, shape, kernels::div(&tx, &tdrow))?;
        assert_exact(&got, &int_row(&x, &drow, T::ref_div), &what("div row"));

        let s = loop {
            let s = T::random(&mut rng);
            if s != T::ZERO {
                break s;
            }
        };
        let scalar = |f: fn(T, T) -> T| x.iter().map(|a| f(*a, s)).collect::<Vec<_>>();
        let got = run(&stream, shape, kernels::add_scalar(&tx, s))?;
        assert_exact(&got, &scalar(T::ref_add), &what("add_scalar"));
        let got = run(&stream, shape, kernels::sub_scalar(&tx, s))?;
        assert_exact(&got, &scalar(T::ref_sub), &what("sub_scalar"));
        let got = run(&stream, shape, kernels::mul_scalar(&tx, s))?;
        assert_exact(&got, &scalar(T::ref_mul), &what("mul_scalar"));
        let got = run(&stream, shape, kernels::scale(&tx, s))?;
        assert_exact(&got, &scalar(T::ref_mul), &what("scale"));
        let got = run(&stream, shape, kernels::div_scalar(&tx, s))?;
        assert_exact(&got, &scalar(T::ref_div), &what("div_scalar"));
        let got = run(&stream, shape, kernels::div_scalar(&tx, T::ZERO))?;
        assert_exact(&got, &vec![T::ZERO; n], &what("div_scalar by zero"));

        // saxpy wraps like the rest.
        let old: Vec<T> = ints(&mut rng, n);
        let mut z = upload(&stream, &old, shape);
        drop(kernels::saxpy(row_tiles(&mut z), s, &tx).sync_on(&stream)?);
        let want: Vec<T> = old
            .iter()
            .zip(&x)
            .map(|(o, a)| s.ref_mul(*a).ref_add(*o))
            .collect();
        assert_exact(&read(&z), &want, &what("saxpy"));
    }
    Ok(())
}

/// A test per integer type: `integer::i32`, ...
mod integer {
    use super::*;

    test_cases! {
        i32 => int_kernels::<i32>(),
        i64 => int_kernels::<i64>(),
        u32 => int_kernels::<u32>(),
        u8 => int_kernels::<u8>(),
    }
}

#[test]
fn integer_extremes_wrap() -> Result<(), DeviceError> {
    let stream = stream();
    let x = upload(&stream, &[i32::MAX, i32::MIN, -7, 7], &[4]);
    let y = upload(&stream, &[1, -1, 2, -2], &[4]);
    let got = run(&stream, &[4], kernels::add(&x, &y))?;
    assert_eq!(got, vec![i32::MIN, i32::MAX, -5, 5]);
    let got = run(&stream, &[4], kernels::mul_scalar(&x, 2))?;
    assert_eq!(got, vec![-2, 0, -14, 14]);
    // Division truncates toward zero.
    let y = upload(&stream, &[-1, 2, 2, -2], &[4]);
    let got = run(&stream, &[4], kernels::div(&x, &y))?;
    assert_eq!(got, vec![-i32::MAX, i32::MIN / 2, -3, -3]);
    let b = upload(&stream, &[250u8, 3, 0, 255], &[4]);
    let got = run(&stream, &[4], kernels::add_scalar(&b, 10))?;
    assert_eq!(got, vec![4u8, 13, 10, 9]);
    let got = run(&stream, &[4], kernels::sub_scalar(&b, 4))?;
    assert_eq!(got, vec![246u8, 255, 252, 251]);
    Ok(())
}

/// The one quotient that overflows, `MIN / -1`, wraps to `MIN` (as `wrapping_div`; C leaves it
/// undefined) on every path: dense, a broadcast row, a broadcast column (the strided kernel)
/// and a scalar divisor. Unsigned divisors of all ones are ordinary divisors.
#[test]
fn integer_division_overflow_wraps() -> Result<(), DeviceError> {
    let stream = stream();
    let x = upload(&stream, &[i32::MIN, i32::MIN, 7, i32::MIN + 1], &[2, 2]);
    let y = upload(&stream, &[-1, -1, -1, -1], &[2, 2]);
    let want = vec![i32::MIN, i32::MIN, -7, i32::MAX];
    assert_eq!(run(&stream, &[2, 2], kernels::div(&x, &y))?, want);
    let row = upload(&stream, &[-1, -1], &[2]);
    assert_eq!(run(&stream, &[2, 2], kernels::div(&x, &row))?, want);
    let col = upload(&stream, &[-1, -1], &[2, 1]);
    assert_eq!(run(&stream, &[2, 2], kernels::div(&x, &col))?, want);
    assert_eq!(run(&stream, &[2, 2], kernels::div_scalar(&x, -1))?, want);
    let x = upload(&stream, &[i64::MIN, 9, i64::MAX], &[3]);
    let want = vec![i64::MIN, -9, -i64::MAX];
    assert_eq!(run(&stream, &[3], kernels::div_scalar(&x, -1))?, want);
    let col = upload(&stream, &[-1i64], &[1]);
    assert_eq!(run(&stream, &[3], kernels::div(&x, &col))?, want);
    let x = upload(&stream, &[u32::MAX, 5, 0], &[3]);
    assert_eq!(
        run(&stream, &[3], kernels::div_scalar(&x, u32::MAX))?,
        vec![1, 0, 0]
    );
    let b = upload(&stream, &[255u8, 254, 3], &[3]);
    assert_eq!(
        run(&stream, &[3], kernels::div_scalar(&b, 255))?,
        vec![1u8, 0, 0]
    );
    Ok(())
}

#[test]
fn empty_tensors_pass_through() -> Result<(), DeviceError> {
    let stream = stream();
    let x = api::zeros::<f32>(&[0, 7]).sync_on(&stream)?;
    let y = api::zeros::<f32>(&[7]).sync_on(&stream)?;
    for out in [
        kernels::add(&x, &x).sync_on(&stream)?,
        kernels::mul(&x, &y).sync_on(&stream)?,
        kernels::relu(&x).sync_on(&stream)?,
        kernels::scale(&x, 2.0).sync_on(&stream)?,
    ] {
        assert_eq!(out.shape(), &[0, 7]);
        assert!(out.is_empty());
        assert_eq!(read(&out), Vec::<f32>::new());
    }
    let mut z = api::zeros::<f32>(&[0, 7]).sync_on(&stream)?;
    drop(kernels::saxpy((&mut z).partition([1, 7]), 2.0, &x).sync_on(&stream)?);
    assert_eq!(z.shape(), &[0, 7]);
    Ok(())
}

/// Signed sums, differences and products that overflow wrap on every path (dense operands, a
/// broadcast row, a broadcast column through the strided kernel, a scalar, saxpy), as the
/// host's `wrapping_*` do: the kernels compute them in unsigned arithmetic, since C leaves
/// signed overflow undefined.
#[test]
fn signed_overflow_wraps_on_every_path() -> Result<(), DeviceError> {
    fn check<T: DType + std::fmt::Debug>(
        stream: &Stream,
        x: &[T],
        y: &[T],
        ops: [fn(T, T) -> T; 3],
    ) -> Result<(), DeviceError> {
        let n = x.len();
        let xt = upload(stream, x, &[2, n / 2]);
        let yt = upload(stream, y, &[2, n / 2]);
        let row = upload(stream, &y[..n / 2], &[n / 2]);
        let col = upload(stream, &[y[0], y[n / 2]], &[2, 1]);
        let want = |op: fn(T, T) -> T, yi: &dyn Fn(usize) -> T| -> Vec<T> {
            (0..n).map(|i| op(x[i], yi(i))).collect()
        };
        let kernels_of = [(ops[0], "add"), (ops[1], "sub"), (ops[2], "mul")];
        for (k, (op, name)) in kernels_of.into_iter().enumerate() {
            let run2 = |y: &Tensor<T>| match k {
                0 => kernels::add(&xt, y).sync_on(stream),
                1 => kernels::sub(&xt, y).sync_on(stream),
                _ => kernels::mul(&xt, y).sync_on(stream),
            };
            let dense = want(op, &|i| y[i]);
            assert_eq!(run2(&yt)?.to_host_vec()?, dense, "{} {name} dense", T::NAME);
            let rows = want(op, &|i| y[i % (n / 2)]);
            assert_eq!(run2(&row)?.to_host_vec()?, rows, "{} {name} row", T::NAME);
            let cols = want(op, &|i| y[(i / (n / 2)) * (n / 2)]);
            assert_eq!(
                run2(&col)?.to_host_vec()?,
                cols,
                "{} {name} column",
                T::NAME
            );
            let s = y[1];
            let got = match k {
                0 => kernels::add_scalar(&xt, s).sync_on(stream),
                1 => kernels::sub_scalar(&xt, s).sync_on(stream),
                _ => kernels::mul_scalar(&xt, s).sync_on(stream),
            }?
            .to_host_vec()?;
            assert_eq!(got, want(op, &|_| s), "{} {name} scalar", T::NAME);
        }
        // saxpy: out = a · x + out, over an output holding `y`.
        let mut out = upload(stream, y, &[2, n / 2]);
        let a = x[1];
        kernels::saxpy((&mut out).partition([1, n / 2]), a, &xt).sync_on(stream)?;
        let want: Vec<T> = (0..n).map(|i| ops[0](ops[2](a, x[i]), y[i])).collect();
        assert_eq!(out.to_host_vec()?, want, "{} saxpy", T::NAME);
        Ok(())
    }
    let stream = stream();
    let x32 = [
        i32::MAX,
        i32::MIN,
        i32::MAX - 3,
        -5,
        1 << 30,
        -(1 << 30),
        77_777,
        i32::MIN + 1,
    ];
    let y32 = [3, -3, i32::MAX, i32::MIN, 5, 7, -99_999, i32::MAX];
    check(
        &stream,
        &x32,
        &y32,
        [i32::wrapping_add, i32::wrapping_sub, i32::wrapping_mul],
    )?;
    let x64 = [
        i64::MAX,
        i64::MIN,
        i64::MAX - 3,
        -5,
        1 << 62,
        -(1 << 62),
        7_777_777_777,
        i64::MIN + 1,
    ];
    let y64 = [3, -3, i64::MAX, i64::MIN, 5, 7, -9_999_999_999, i64::MAX];
    check(
        &stream,
        &x64,
        &y64,
        [i64::wrapping_add, i64::wrapping_sub, i64::wrapping_mul],
    )
}

/// saxpy whose `x` overlaps its output in one buffer (rows of one tensor, shifted by one row
/// either way, or the same rows; `x` a view of the tensor, or of the same memory reinterpreted):
/// every output is `a · x + out` of the values before the kernel, whatever order its blocks run
/// in.
#[test]
fn saxpy_reads_an_input_overlapping_its_output_as_it_was() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = seeded_rng(41);
    let (rows, cols, a) = (9usize, 8usize, 1.5f32);
    let zh: Vec<f32> = uniform(&mut rng, rows * cols, -1.0, 1.0);
    // (output rows, input rows), each 8 rows of the 9.
    for ((out_start, x_start), reinterpreted) in [(1, 1), (1, 0), (0, 1)]
        .into_iter()
        .flat_map(|rows| [(rows, false), (rows, true)])
    {
        let z = api::from_vec(zh.clone(), &[rows, cols]).sync_on(&stream)?;
        let mut out = z.narrow(0, out_start, rows - 1)?;
        let x = if reinterpreted {
            z.reinterpret::<u32>()?.reinterpret::<f32>()?
        } else {
            z.clone()
        }
        .narrow(0, x_start, rows - 1)?;
        let want: Vec<f64> = (0..(rows - 1) * cols)
            .map(|i| {
                f64::from(a) * f64::from(zh[x_start * cols + i])
                    + f64::from(zh[out_start * cols + i])
            })
            .collect();
        for tile in [[1, cols], [rows - 1, cols], [1, 1]] {
            memcpy_rows(&stream, &z, &zh)?;
            drop(kernels::saxpy((&mut out).partition(tile), a, &x).sync_on(&stream)?);
            assert_dtype_close(
                &out.to_host_vec()?,
                &want,
                1e-6,
                &format!(
                    "saxpy of rows {out_start}.. by rows {x_start}.. in tiles {tile:?} \
                     (x reinterpreted: {reinterpreted})"
                ),
            );
        }
    }
    Ok(())
}

/// Writes `data` back into the whole of `z`.
fn memcpy_rows(stream: &Stream, z: &Tensor<f32>, data: &[f32]) -> Result<(), DeviceError> {
    let mut z = z.clone();
    let src = api::from_vec(data.to_vec(), z.shape()).sync_on(stream)?;
    api::memcpy(&mut z, &src).sync_on(stream)
}

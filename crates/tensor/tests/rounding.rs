//! Rounding to the element type happens once, to nearest (ties to even), on both backends:
//! casts to `f16`/`bf16` from `f32` and `f64`, the constructors that compute in `f64` and store
//! halves (`arange`, `linspace`, `rand`, `randn`), and `saxpy`, which fuses its multiply and
//! add as CUDA's FMA does. `linspace` keeps wide finite bounds finite and refuses others.
//!
//! The references here round with [`round_to_format`], an exact rounding written from the
//! formats' definitions, independent of the `half` crate and of the library.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, f16, kernels, DType, PartitionExt};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng;
use cuflow_testing::tensor::{f64s, make, upload};
use rand::rngs::StdRng;
use rand::Rng;

/// A binary floating-point format: significant bits (with the hidden one) and exponent range.
#[derive(Clone, Copy, Debug)]
struct Format {
    bits: i32,
    min_exp: i32,
    max_exp: i32,
}

const F16: Format = Format {
    bits: 11,
    min_exp: -14,
    max_exp: 15,
};
const BF16: Format = Format {
    bits: 8,
    min_exp: -126,
    max_exp: 127,
};

/// `v` rounded to the nearest value of `format` (ties to the even significand; beyond the
/// largest finite value by half a step or more, infinity), as an `f64`. Exact: the value is
/// scaled by a power of two so that one step is 1, and split into integer and fraction.
fn round_to_format(v: f64, format: Format) -> f64 {
    if v.is_nan() || v.is_infinite() || v == 0.0 {
        return v;
    }
    let a = v.abs();
    let exp = if a < f64::MIN_POSITIVE {
        -1023
    } else {
        ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023
    };
    let step = 2f64.powi(exp.max(format.min_exp) - (format.bits - 1));
    let scaled = a / step;
    let whole = scaled.floor();
    let frac = scaled - whole;
    let up = frac > 0.5 || (frac == 0.5 && whole % 2.0 == 1.0);
    let r = (whole + f64::from(u8::from(up))) * step;
    let r = if r >= 2f64.powi(format.max_exp + 1) {
        f64::INFINITY
    } else {
        r
    };
    r.copysign(v)
}

/// The elements of `got` that are not `round_to_format(input)`, as messages (NaN equals NaN).
fn misrounded<I: DType, O: DType>(input: &[I], got: &[O], format: Format) -> Vec<String> {
    assert_eq!(input.len(), got.len());
    input
        .iter()
        .zip(got)
        .filter_map(|(x, g)| {
            let want = round_to_format(x.to_f64(), format);
            let g = g.to_f64();
            (!(g == want && g.is_sign_negative() == want.is_sign_negative()
                || (g.is_nan() && want.is_nan())))
            .then(|| format!("{x:?} ({:e}) gave {g:e}, expected {want:e}", x.to_f64()))
        })
        .collect()
}

#[track_caller]
fn assert_none(mismatches: Vec<String>, what: &str) {
    assert!(
        mismatches.is_empty(),
        "{what}: {} misrounded, first ones:\n{}",
        mismatches.len(),
        mismatches[..mismatches.len().min(8)].join("\n")
    );
}

/// Values around the midpoints between neighbours of `format` (exactly on them, and off by
/// amounts far below an `f32` step), over its whole exponent range and beyond, with both signs;
/// and values spread widely.
fn near_midpoints(rng: &mut StdRng, n: usize, format: Format) -> Vec<f64> {
    (0..n)
        .map(|k| {
            let sign = if rng.gen::<bool>() { 1.0 } else { -1.0 };
            if k % 8 == 7 {
                return sign * rng.gen_range(0.0..1.0) * 2f64.powi(rng.gen_range(-30..20));
            }
            let exp = rng.gen_range(format.min_exp - format.bits - 2..=format.max_exp + 1);
            let units = 1u64 << (format.bits - 1);
            let m = (units + rng.gen_range(0..units)) as f64 + 0.5;
            let offset = match rng.gen_range(0..4) {
                0 => 0.0,
                _ => rng.gen_range(-1i64 << 20..=1 << 20) as f64 * 2f64.powi(-48),
            };
            sign * (m + offset) * 2f64.powi(exp - (format.bits - 1))
        })
        .collect()
}

#[test]
fn cast_f32_to_bf16_rounds_on_every_bit() -> Result<(), DeviceError> {
    let s = stream();
    let x = 1.0f32 + 2f32.powi(-8) + 2f32.powi(-22);
    let t = api::from_vec(vec![x], &[1]).sync_on(&s)?;
    let got = api::cast::<f32, bf16, _>(&t).sync_on(&s)?.to_host_vec()?;
    assert_eq!(bf16::from_f32(x).to_f32(), 1.0078125);
    assert_eq!(got[0].to_f32(), 1.0078125, "cast::<f32, bf16> of {x:e}");
    Ok(())
}

#[test]
fn cast_f64_to_half_types_rounds_once() -> Result<(), DeviceError> {
    let s = stream();
    let x16 = 1.0f64 + 2f64.powi(-11) + 2f64.powi(-40);
    let xb = 1.0f64 + 2f64.powi(-8) + 2f64.powi(-40);
    let t = api::from_vec(vec![x16], &[1]).sync_on(&s)?;
    let h = api::cast::<f64, f16, _>(&t).sync_on(&s)?.to_host_vec()?;
    let t = api::from_vec(vec![xb], &[1]).sync_on(&s)?;
    let b = api::cast::<f64, bf16, _>(&t).sync_on(&s)?.to_host_vec()?;
    assert_eq!(
        (h[0].to_f64(), b[0].to_f64()),
        (1.0 + 2f64.powi(-10), 1.0 + 2f64.powi(-7))
    );
    Ok(())
}

/// `cast::<I, O>(input)` against the exact rounding of every input.
fn check_cast<I: DType, O: DType>(input: &[I], format: Format) -> Result<(), DeviceError> {
    let s = stream();
    let x = upload(&s, input, &[input.len()]);
    let got: Vec<O> = make(&s, &[input.len()], api::cast::<I, O, _>(&x))?;
    assert_none(
        misrounded(input, &got, format),
        &format!("cast::<{}, {}>", I::NAME, O::NAME),
    );
    Ok(())
}

#[test]
fn casts_to_half_types_round_to_nearest_on_random_inputs() -> Result<(), DeviceError> {
    let mut rng = seeded_rng(0x0dd);
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        f64::MAX,
        -f64::MAX,
        f64::MIN_POSITIVE,
        -5e-324,
        1e-300,
        65504.0,
        65519.999,
        65520.0,
        -65520.0,
        2f64.powi(-25),
        2f64.powi(-25) + 2f64.powi(-60),
        f64::from(f32::MAX),
        f64::from(f32::MAX) * (1.0 + 2f64.powi(-30)),
        2f64.powi(-150),
        2f64.powi(-134) + 2f64.powi(-170),
    ];
    for format in [F16, BF16] {
        let mut wide = near_midpoints(&mut rng, 1 << 14, format);
        wide.extend(specials);
        let narrow: Vec<f32> = wide
            .iter()
            .map(|v| *v as f32)
            .chain((0..1 << 14).map(|_| f32::from_bits(rng.gen())))
            .collect();
        if format.bits == F16.bits {
            check_cast::<f64, f16>(&wide, format)?;
            check_cast::<f32, f16>(&narrow, format)?;
        } else {
            check_cast::<f64, bf16>(&wide, format)?;
            check_cast::<f32, bf16>(&narrow, format)?;
        }
    }
    Ok(())
}

/// A constructor for `T` against the same constructor for `f64`, rounded exactly to `T`: they
/// compute the same `f64` values, and `T` must round each once.
fn check_against_f64<T: DType>(
    what: &str,
    format: Format,
    shape: &[usize],
    make_t: impl cuflow_device_op::DeviceOp<Output = cuflow_tensor::Tensor<T>>,
    make_f64: impl cuflow_device_op::DeviceOp<Output = cuflow_tensor::Tensor<f64>>,
) -> Result<(), DeviceError> {
    let s = stream();
    let exact = make(&s, shape, make_f64)?;
    let got = make(&s, shape, make_t)?;
    assert_none(misrounded(&exact, &got, format), what);
    Ok(())
}

#[test]
fn constructors_of_half_types_round_once() -> Result<(), DeviceError> {
    // Starts just above a midpoint of the half type, by far less than an f32 step.
    let sb = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    let sh = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    check_against_f64(
        "arange::<bf16>",
        BF16,
        &[64],
        api::arange::<bf16>(sb, sb + 64.0, 1.0),
        api::arange::<f64>(sb, sb + 64.0, 1.0),
    )?;
    check_against_f64(
        "arange::<f16>",
        F16,
        &[64],
        api::arange::<f16>(sh, sh + 16.0, 0.25),
        api::arange::<f64>(sh, sh + 16.0, 0.25),
    )?;
    check_against_f64(
        "linspace::<f16>",
        F16,
        &[33],
        api::linspace::<f16>(sh, sh + 32.0, 33),
        api::linspace::<f64>(sh, sh + 32.0, 33),
    )?;
    check_against_f64(
        "linspace::<bf16>",
        BF16,
        &[33],
        api::linspace::<bf16>(-sb, sb, 33),
        api::linspace::<f64>(-sb, sb, 33),
    )?;
    // Normal values within 2^-27 of a midpoint: `float` rounds most of them onto it.
    let n = 1 << 12;
    for (seed, format) in [(1u64, F16), (2, BF16)] {
        let mean = 1.0 + 2f64.powi(1 - format.bits);
        let std = 2f64.powi(-30);
        let exact = api::randn_seeded::<f64>(mean, std, &[n], seed);
        if format.bits == F16.bits {
            let got = api::randn_seeded::<f16>(mean, std, &[n], seed);
            check_against_f64("randn::<f16>", format, &[n], got, exact)?;
        } else {
            let got = api::randn_seeded::<bf16>(mean, std, &[n], seed);
            check_against_f64("randn::<bf16>", format, &[n], got, exact)?;
        }
    }
    // Uniform values from a midpoint of f16 over one f16 step: one in 2^14 lies within half an
    // f32 step above the midpoint, where rounding through `float` ties down to even.
    let n = 1 << 20;
    let (low, high) = (1.0 + 2f64.powi(-11), 1.0 + 2f64.powi(-11) + 2f64.powi(-10));
    check_against_f64(
        "rand::<f16>",
        F16,
        &[n],
        api::rand_seeded::<f16>(low, high, &[n], 3),
        api::rand_seeded::<f64>(low, high, &[n], 3),
    )
}

/// `saxpy` on `n` elements of `T`, against `want(a, x, o)`.
fn check_saxpy<T: DType>(
    a: T,
    x: &[T],
    o: &[T],
    want: impl Fn(T, T, T) -> T,
) -> Result<(), DeviceError> {
    let s = stream();
    let n = x.len();
    let mut z = upload(&s, o, &[n]);
    let xs = upload(&s, x, &[n]);
    let _ = kernels::saxpy((&mut z).partition([n / 4]), a, &xs).sync_on(&s)?;
    let got = z.to_host_vec()?;
    let bad: Vec<String> = (0..n)
        .filter(|&i| got[i] != want(a, x[i], o[i]))
        .map(|i| {
            format!(
                "{a:?} * {:?} + {:?} gave {:?}, expected {:?}",
                x[i],
                o[i],
                got[i],
                want(a, x[i], o[i])
            )
        })
        .collect();
    assert!(bad.is_empty(), "saxpy {}:\n{}", T::NAME, bad.join("\n"));
    Ok(())
}

#[test]
fn saxpy_f32_rounds_once_like_fma() -> Result<(), DeviceError> {
    let a = 1.0f32 + 2f32.powi(-15);
    let x = 2f32.powi(-24) * (1.0 - 2f32.powi(-15));
    let o = 1.0f32 + 2f32.powi(-23);
    check_saxpy(a, &[x; 4], &[o; 4], |a, x, o| a.mul_add(x, o))
}

#[test]
fn saxpy_rounds_once_on_random_inputs() -> Result<(), DeviceError> {
    let mut rng = seeded_rng(0xf3a);
    let n = 1024;
    // Products that cancel most of the addend, so a double rounding shows.
    let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let o: Vec<f32> = x
        .iter()
        .map(|v| -v * 1.75 + rng.gen_range(-1e-3..1e-3))
        .collect();
    check_saxpy(1.75 + 2f32.powi(-20), &x, &o, |a, x, o| a.mul_add(x, o))?;
    let x: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let o: Vec<f64> = x
        .iter()
        .map(|v| -v * 1.75 + rng.gen_range(-1e-9..1e-9))
        .collect();
    check_saxpy(1.75 + 2f64.powi(-45), &x, &o, |a, x, o| a.mul_add(x, o))?;
    // Halves compute in f32 (fused) and round on store, as CUDA does.
    let x: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(rng.gen_range(-4.0..4.0)))
        .collect();
    let o: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(rng.gen_range(-4.0..4.0)))
        .collect();
    check_saxpy(bf16::from_f32(1.2), &x, &o, |a, x, o| {
        bf16::from_f32(a.to_f32().mul_add(x.to_f32(), o.to_f32()))
    })?;
    let x: Vec<f16> = (0..n)
        .map(|_| f16::from_f32(rng.gen_range(-4.0..4.0)))
        .collect();
    let o: Vec<f16> = (0..n)
        .map(|_| f16::from_f32(rng.gen_range(-4.0..4.0)))
        .collect();
    check_saxpy(f16::from_f32(1.2), &x, &o, |a, x, o| {
        f16::from_f32(a.to_f32().mul_add(x.to_f32(), o.to_f32()))
    })
}

#[test]
fn linspace_over_the_whole_f64_range_stays_finite() -> Result<(), DeviceError> {
    let s = stream();
    assert_eq!(
        make(&s, &[3], api::linspace::<f64>(-1e308, 1e308, 3))?,
        vec![-1e308, 0.0, 1e308]
    );
    assert_eq!(
        make(&s, &[5], api::linspace::<f64>(-1e308, 1e308, 5))?,
        vec![-1e308, -5e307, 0.0, 5e307, 1e308]
    );
    assert_eq!(
        make(&s, &[2], api::linspace::<f64>(f64::MAX, -f64::MAX, 2))?,
        vec![f64::MAX, -f64::MAX]
    );
    let got = make(&s, &[7], api::linspace::<f64>(-f64::MAX, f64::MAX, 7))?;
    assert!(
        got.iter().all(|v| v.is_finite()) && got.windows(2).all(|w| w[0] < w[1]),
        "linspace(-max, max, 7) = {got:?}"
    );
    assert_eq!((got[0], got[6]), (-f64::MAX, f64::MAX));
    // Evenly spaced, up to the rounding of the step.
    for (i, v) in got.iter().enumerate() {
        let want = f64::MAX * (i as f64 / 3.0 - 1.0);
        assert!(
            (v - want).abs() <= 1e-15 * f64::MAX,
            "element {i}: {v:e}, not {want:e}"
        );
    }
    let got = make(&s, &[4], api::linspace::<f32>(-1e308, 1e308, 4))?;
    assert_eq!(
        got,
        vec![
            f32::NEG_INFINITY,
            -f32::INFINITY,
            f32::INFINITY,
            f32::INFINITY
        ]
    );
    Ok(())
}

#[test]
fn linspace_pins_both_ends() -> Result<(), DeviceError> {
    let s = stream();
    let got = make(&s, &[3], api::linspace::<f64>(-0.0, 1.0, 3))?;
    assert_eq!(f64s(&got), vec![0.0, 0.5, 1.0]);
    assert!(
        got[0].is_sign_negative(),
        "the first value is -0.0, got {}",
        got[0]
    );
    let got = make(&s, &[1], api::linspace::<f64>(-0.0, 1.0, 1))?;
    assert!(got[0] == 0.0 && got[0].is_sign_negative());
    let (a, b) = (0.1, 0.7);
    let got = make(&s, &[7], api::linspace::<f64>(a, b, 7))?;
    assert_eq!((got[0], got[6]), (a, b));
    Ok(())
}

#[test]
fn linspace_refuses_bounds_that_are_not_finite() {
    let s = stream();
    for (start, end, steps) in [
        (f64::NAN, 1.0, 3),
        (0.0, f64::INFINITY, 3),
        (f64::NEG_INFINITY, 0.0, 2),
        (f64::NAN, 1.0, 1),
        (0.0, f64::NAN, 0),
    ] {
        let err = api::linspace::<f32>(start, end, steps)
            .sync_on(&s)
            .expect_err("non-finite bounds");
        assert!(
            matches!(err, DeviceError::InvalidShape { op: "linspace", .. }),
            "linspace({start}, {end}, {steps}): {err:?}"
        );
    }
}

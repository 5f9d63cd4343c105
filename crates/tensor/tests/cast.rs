//! Casts between element types: rounding, truncating and saturating as documented.

use std::sync::Arc;

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, f16, DType};
use cuflow_testing::{device::stream, rng::seeded_rng, tensor::*};

/// The mismatches of `cast::<I, O>(input)` against `want` (NaN equals NaN), as messages.
fn cast_mismatches<I: DType, O: DType>(
    input: &[I],
    want: &[O],
) -> Result<Vec<String>, DeviceError> {
    let s = stream();
    let x = upload(&s, input, &[input.len()]);
    let got: Vec<O> = make(&s, &[input.len()], api::cast::<I, O, _>(&x))?;
    assert_eq!(got.len(), want.len());
    Ok(got
        .iter()
        .zip(want)
        .zip(input)
        .filter(|((g, w), _)| !(g == w || (g.to_f64().is_nan() && w.to_f64().is_nan())))
        .map(|((g, w), x)| {
            format!(
                "{} -> {}: {x:?} gives {g:?}, expected {w:?}",
                I::NAME,
                O::NAME
            )
        })
        .collect())
}

/// Collects the mismatches of several casts and fails with all of them.
#[derive(Default)]
struct Casts(Vec<String>);

impl Casts {
    fn check<I: DType, O: DType>(&mut self, input: &[I], want: &[O]) -> Result<(), DeviceError> {
        self.0.extend(cast_mismatches(input, want)?);
        Ok(())
    }

    #[track_caller]
    fn assert_none(self) {
        assert!(self.0.is_empty(), "cast mismatches:\n{}", self.0.join("\n"));
    }
}

#[test]
fn cast_from_float_to_integer_truncates_and_saturates() -> Result<(), DeviceError> {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let mut c = Casts::default();
    c.check::<f32, i32>(
        &[1.9, -1.9, 2.5, -0.5, 0.0, 3e9, -3e9, nan, inf, -inf],
        &[1, -1, 2, 0, 0, i32::MAX, i32::MIN, 0, i32::MAX, i32::MIN],
    )?;
    c.check::<f64, i64>(
        &[
            123_456_789.99,
            -0.999,
            1e19,
            -1e19,
            f64::NAN,
            2f64.powi(62),
            -2f64.powi(63),
        ],
        &[123_456_789, 0, i64::MAX, i64::MIN, 0, 1 << 62, i64::MIN],
    )?;
    c.check::<f32, i64>(&[nan, -inf, 7.9], &[0, i64::MIN, 7])?;
    c.check::<f64, i32>(&[f64::NAN, 1e10, -2147483648.5], &[0, i32::MAX, i32::MIN])?;
    c.check::<f32, u32>(
        &[-1.0, 7.5, 4e9, 5e9, nan, -inf],
        &[0, 7, 4_000_000_000, u32::MAX, 0, 0],
    )?;
    c.check::<f32, u8>(
        &[-5.0, -0.5, 0.99, 12.7, 255.9, 300.0, nan, inf],
        &[0, 0, 0, 12, 255, 255, 0, 255],
    )?;
    c.check::<f16, i32>(&[f16::from_f64(-2.75), f16::MAX, f16::NAN], &[-2, 65504, 0])?;
    c.check::<bf16, u8>(
        &[
            bf16::from_f64(-1.5),
            bf16::from_f64(100.5),
            bf16::from_f64(1e5),
            bf16::NAN,
        ],
        &[0, 100, 255, 0],
    )?;
    c.assert_none();
    Ok(())
}

#[test]
fn cast_from_integer_to_float_rounds_once() -> Result<(), DeviceError> {
    let mut c = Casts::default();
    c.check::<i32, f64>(
        &[i32::MIN, -1, 0, 1, i32::MAX],
        &[i32::MIN as f64, -1.0, 0.0, 1.0, i32::MAX as f64],
    )?;
    // 2^24 + 1 is not a float: it rounds to nearest even.
    c.check::<i32, f32>(
        &[-3, 16_777_217, 16_777_219],
        &[-3.0, 16_777_216.0, 16_777_220.0],
    )?;
    // 2^60 + 2^36 + 1 lies just above the midpoint of two floats; rounding through f64 would
    // land on the midpoint and round to even, below.
    let above_midpoint = (1i64 << 60) + (1 << 36) + 1;
    c.check::<i64, f32>(&[above_midpoint], &[((1i64 << 60) + (1 << 37)) as f32])?;
    c.check::<i64, f64>(&[(1 << 53) + 1, i64::MIN], &[2f64.powi(53), -2f64.powi(63)])?;
    c.check::<u8, f16>(
        &[0, 1, 255],
        &[f16::from_f64(0.0), f16::from_f64(1.0), f16::from_f64(255.0)],
    )?;
    c.check::<u32, f64>(&[u32::MAX, 3], &[u32::MAX as f64, 3.0])?;
    c.check::<i64, bf16>(
        &[-256, 1 << 40],
        &[bf16::from_f64(-256.0), bf16::from_f64(2f64.powi(40))],
    )?;
    c.assert_none();
    Ok(())
}

/// The bf16 nearest to `v` (ties to the even mantissa), found by comparing `v` exactly with
/// the bf16 values around a first guess: independent of how the library rounds.
fn nearest_bf16(v: i64) -> bf16 {
    let guess = bf16::from_f64(v as f64);
    let step = |b: bf16, up: bool| {
        let bits = b.to_bits();
        // Toward larger magnitude when `up` and the value is positive, and so on.
        let toward_up = (bits & 0x8000 == 0) == up;
        bf16::from_bits(if bits & 0x7fff == 0 {
            if up {
                0x0001
            } else {
                0x8001
            }
        } else if toward_up {
            bits + 1
        } else {
            bits - 1
        })
    };
    let candidates = [step(guess, false), guess, step(guess, true)];
    // Every candidate is an integer (or exactly representable): compare in i128.
    let distance = |b: &bf16| (b.to_f64() as i128 - i128::from(v)).abs();
    let best = candidates.iter().map(distance).min().unwrap_or(0);
    candidates
        .into_iter()
        .filter(|b| distance(b) == best)
        .min_by_key(|b| b.to_bits() & 1)
        .unwrap_or(guess)
}

/// Integers round to the nearest bf16 once: going through `float` first rounded twice, so that
/// 2^25 + 2^17 + 1 (just above the midpoint of two bf16 values) became 2^25.
#[test]
fn cast_from_integer_to_bf16_rounds_once() -> Result<(), DeviceError> {
    let mut c = Casts::default();
    let above = (1i32 << 25) + (1 << 17) + 1;
    let tie = (1i32 << 25) + (1 << 17);
    c.check::<i32, bf16>(
        &[above, -above, tie, -tie],
        &[
            bf16::from_f64(f64::from((1 << 25) + (1 << 18))),
            bf16::from_f64(-f64::from((1 << 25) + (1 << 18))),
            bf16::from_f64(f64::from(1 << 25)),
            bf16::from_f64(-f64::from(1 << 25)),
        ],
    )?;
    let mut rng = seeded_rng(41);
    let mut wide: Vec<i64> = vec![i64::MIN, i64::MAX, (1 << 62) + (1 << 54) + 1, 255, -256, 0];
    for bits in 1..63 {
        for _ in 0..8 {
            let v = rand::Rng::gen_range(&mut rng, (1i64 << (bits - 1))..(1i64 << bits));
            wide.push(if bits % 2 == 0 { v } else { -v });
        }
    }
    let want: Vec<bf16> = wide.iter().map(|v| nearest_bf16(*v)).collect();
    c.check::<i64, bf16>(&wide, &want)?;
    let narrow: Vec<i32> = wide.iter().filter_map(|v| i32::try_from(*v).ok()).collect();
    let want: Vec<bf16> = narrow.iter().map(|v| nearest_bf16(i64::from(*v))).collect();
    c.check::<i32, bf16>(&narrow, &want)?;
    let unsigned: Vec<u32> = wide
        .iter()
        .filter_map(|v| u32::try_from(*v).ok())
        .chain([u32::MAX])
        .collect();
    let want: Vec<bf16> = unsigned
        .iter()
        .map(|v| nearest_bf16(i64::from(*v)))
        .collect();
    c.check::<u32, bf16>(&unsigned, &want)?;
    c.assert_none();
    Ok(())
}

#[test]
fn cast_between_integers_keeps_the_low_bits() -> Result<(), DeviceError> {
    let mut c = Casts::default();
    // Widening is exact.
    c.check::<i32, i64>(
        &[i32::MIN, -1, i32::MAX],
        &[i32::MIN as i64, -1, i32::MAX as i64],
    )?;
    c.check::<u8, i32>(&[0, 200, 255], &[0, 200, 255])?;
    c.check::<u32, i64>(&[u32::MAX, 0], &[u32::MAX as i64, 0])?;
    // Beyond 2^53, and to the same type.
    let big = [(1i64 << 53) + 1, i64::MAX, i64::MIN, -3];
    c.check::<i64, i64>(&big, &big)?;
    // Narrowing and changing sign wrap, as Rust's `as` does.
    c.check::<i64, i32>(&[(1 << 32) + 5, -1, i64::MAX], &[5, -1, -1])?;
    c.check::<i32, u8>(&[300, -1, 255, -256], &[44, 255, 255, 0])?;
    c.check::<u32, i32>(&[u32::MAX, 1 << 31, 5], &[-1, i32::MIN, 5])?;
    c.check::<i32, u32>(&[-1, i32::MIN], &[u32::MAX, 1 << 31])?;
    c.check::<i64, u8>(&[-1, 0x1_0000_0102], &[255, 2])?;
    c.assert_none();
    Ok(())
}

#[test]
fn cast_between_floats_rounds_to_nearest() -> Result<(), DeviceError> {
    let mut rng = seeded_rng(12);
    let mut c = Casts::default();
    let x: Vec<f32> = uniform(&mut rng, 4097, -1000.0, 1000.0);
    let halves: Vec<f16> = x.iter().map(|v| f16::from_f32(*v)).collect();
    c.check::<f32, f16>(&x, &halves)?;
    let brains: Vec<bf16> = x.iter().map(|v| bf16::from_f32(*v)).collect();
    c.check::<f32, bf16>(&x, &brains)?;
    // Ties go to even; beyond the largest finite value lies infinity; NaN stays NaN.
    c.check::<f32, bf16>(
        &[1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, f32::MAX, f32::NAN],
        &[
            bf16::from_f64(1.0),
            bf16::from_f64(1.015_625),
            bf16::INFINITY,
            bf16::NAN,
        ],
    )?;
    c.check::<f32, f16>(
        &[1e5, -1e5, 6e-8, f32::NAN],
        &[
            f16::INFINITY,
            f16::NEG_INFINITY,
            f16::from_f64(5.960_464_477_539_063e-8),
            f16::NAN,
        ],
    )?;
    // Widening is exact.
    let wide: Vec<f32> = halves.iter().map(|h| h.to_f32()).collect();
    c.check::<f16, f32>(&halves, &wide)?;
    let wide: Vec<f64> = brains.iter().map(|b| b.to_f64()).collect();
    c.check::<bf16, f64>(&brains, &wide)?;
    let y: Vec<f64> = uniform(&mut rng, 1000, -1e10, 1e10);
    let narrow: Vec<f32> = y.iter().map(|v| *v as f32).collect();
    c.check::<f64, f32>(&y, &narrow)?;
    // To the same type: a copy.
    c.check::<f32, f32>(&x, &x)?;
    c.assert_none();
    Ok(())
}

#[test]
fn cast_of_an_op_and_of_an_arc() -> Result<(), DeviceError> {
    let s = stream();
    let got = make(
        &s,
        &[5],
        api::cast::<f32, i32, _>(api::linspace::<f32>(-2.0, 2.0, 5)),
    )?;
    assert_eq!(got, vec![-2, -1, 0, 1, 2]);
    let x = Arc::new(api::eye::<u8>(2).sync_on(&s)?);
    let got = make(&s, &[2, 2], api::cast::<u8, f32, _>(x))?;
    assert_eq!(got, vec![1.0, 0.0, 0.0, 1.0]);
    Ok(())
}

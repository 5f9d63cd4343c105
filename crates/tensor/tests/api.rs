//! Constructors and copies: exact values where they must be exact, random values within their
//! range and with plausible moments, seeded calls reproducible, casts rounding, truncating and
//! saturating as documented, copies into poisoned memory.

use std::sync::Arc;

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{Device, DeviceError, Stream};
use cuflow_tensor::{api, bf16, f16, kernels, DType, PartitionExt, Tensor};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng;
use cuflow_testing::tensor::*;

/// Runs `op` on `stream`, checks its output's shape, and reads it back.
fn make<T: DType>(
    stream: &Stream,
    shape: &[usize],
    op: impl cuflow_device_op::DeviceOp<Output = Tensor<T>>,
) -> Result<Vec<T>, DeviceError> {
    let t = op.sync_on(stream)?;
    assert_eq!(t.shape(), shape, "shape");
    assert_eq!(t.len(), numel(shape), "element count");
    assert_eq!(t.device(), stream.device(), "device");
    t.to_host_vec()
}

/// zeros, ones and full of `T`, over memory that held `poison` just before.
fn fills<T: DType>(value: T, poison: T) -> Result<(), DeviceError> {
    let stream = stream();
    for shape in [&[3, 5, 7][..], &[4097], &[1], &[], &[0, 3]] {
        let n = numel(shape);
        let what = format!("{} {shape:?}", T::NAME);
        // Freed memory a constructor may be handed again.
        drop(api::full(shape, poison).sync_on(&stream)?);
        assert_eq!(
            make(&stream, shape, api::zeros::<T>(shape))?,
            vec![T::from_f64(0.0); n],
            "zeros {what}"
        );
        drop(api::full(shape, poison).sync_on(&stream)?);
        assert_eq!(
            make(&stream, shape, api::ones::<T>(shape))?,
            vec![T::from_f64(1.0); n],
            "ones {what}"
        );
        assert_eq!(
            make(&stream, shape, api::full(shape, value))?,
            vec![value; n],
            "full {what}"
        );
    }
    Ok(())
}

#[test]
fn zeros_ones_and_full_in_every_type() -> Result<(), DeviceError> {
    fills::<f32>(-3.25, 9.0)?;
    fills::<f64>(1e300, -1.0)?;
    fills::<f16>(f16::from_f64(-3.25), f16::from_f64(9.0))?;
    fills::<bf16>(bf16::from_f64(-3.25), bf16::from_f64(9.0))?;
    fills::<i32>(-7, i32::MAX)?;
    fills::<i64>(1 << 40, -1)?;
    fills::<u32>(4_000_000_000, 7)?;
    fills::<u8>(200, 255)
}

#[test]
fn arange_counts_from_start_by_step() -> Result<(), DeviceError> {
    let s = stream();
    let count: Vec<f32> = (0..10).map(|i| i as f32).collect();
    assert_eq!(make(&s, &[10], api::arange::<f32>(0.0, 10.0, 1.0))?, count);
    assert_eq!(
        make(&s, &[4], api::arange::<f64>(1.0, 2.0, 0.25))?,
        vec![1.0, 1.25, 1.5, 1.75]
    );
    // The end is excluded, also when the last step falls short of it.
    assert_eq!(
        make(&s, &[3], api::arange::<f32>(0.0, 2.5, 1.0))?,
        vec![0.0, 1.0, 2.0]
    );
    assert_eq!(
        make(&s, &[3], api::arange::<i32>(5.0, 0.0, -2.0))?,
        vec![5, 3, 1]
    );
    assert_eq!(
        make(&s, &[6], api::arange::<i64>(-3.0, 3.0, 1.0))?,
        vec![-3, -2, -1, 0, 1, 2]
    );
    let bytes: Vec<u8> = (0..=255).collect();
    assert_eq!(make(&s, &[256], api::arange::<u8>(0.0, 256.0, 1.0))?, bytes);
    let halves: Vec<bf16> = (0..16).map(|i| bf16::from_f64(i as f64 * 0.5)).collect();
    assert_eq!(make(&s, &[16], api::arange::<bf16>(0.0, 8.0, 0.5))?, halves);
    let long: Vec<f32> = (0..4097).map(|i| i as f32).collect();
    assert_eq!(
        make(&s, &[4097], api::arange::<f32>(0.0, 4097.0, 1.0))?,
        long
    );
    // Empty ranges.
    assert!(make(&s, &[0], api::arange::<f32>(3.0, 3.0, 1.0))?.is_empty());
    assert!(make(&s, &[0], api::arange::<f32>(3.0, 0.0, 1.0))?.is_empty());
    Ok(())
}

#[test]
fn linspace_includes_both_ends() -> Result<(), DeviceError> {
    let s = stream();
    assert_eq!(
        make(&s, &[5], api::linspace::<f32>(0.0, 1.0, 5))?,
        vec![0.0, 0.25, 0.5, 0.75, 1.0]
    );
    assert_eq!(
        make(&s, &[3], api::linspace::<i32>(-10.0, 10.0, 3))?,
        vec![-10, 0, 10]
    );
    assert_eq!(
        make(&s, &[1], api::linspace::<f64>(2.0, 7.0, 1))?,
        vec![2.0]
    );
    assert!(make(&s, &[0], api::linspace::<f32>(0.0, 1.0, 0))?.is_empty());
    let got = make(&s, &[1001], api::linspace::<f64>(-1.0, 2.0, 1001))?;
    // Judged by absolute error: values pass through zero.
    let worst = (0..1001)
        .map(|i| (got[i] - (-1.0 + 3.0 * i as f64 / 1000.0)).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-14, "linspace(-1, 2, 1001) is off by {worst}");
    assert_eq!((got[0], got[1000]), (-1.0, 2.0));
    // 49 · (1 / 49) is not 1 in f64, yet the last value is the end.
    let got = make(&s, &[50], api::linspace::<f64>(0.0, 1.0, 50))?;
    assert_eq!((got[0], got[49]), (0.0, 1.0));
    let got = make(&s, &[7], api::linspace::<f32>(1.0, 0.0, 7))?;
    let want: Vec<f64> = (0..7).map(|i| 1.0 - i as f64 / 6.0).collect();
    assert_dtype_close(&got, &want, f32::ARITH_TOL, "linspace(1, 0, 7)");
    Ok(())
}

fn identity<T: DType>(n: usize) -> Vec<T> {
    (0..n * n)
        .map(|i| T::from_f64(if i / n == i % n { 1.0 } else { 0.0 }))
        .collect()
}

#[test]
fn eye_is_the_identity() -> Result<(), DeviceError> {
    let s = stream();
    assert_eq!(make(&s, &[4, 4], api::eye::<f32>(4))?, identity::<f32>(4));
    assert_eq!(
        make(&s, &[33, 33], api::eye::<f64>(33))?,
        identity::<f64>(33)
    );
    assert_eq!(make(&s, &[3, 3], api::eye::<i32>(3))?, identity::<i32>(3));
    assert_eq!(make(&s, &[5, 5], api::eye::<bf16>(5))?, identity::<bf16>(5));
    assert_eq!(make(&s, &[1, 1], api::eye::<u8>(1))?, vec![1u8]);
    assert!(make(&s, &[0, 0], api::eye::<f32>(0))?.is_empty());
    Ok(())
}

/// Mean and variance of `v`.
fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var)
}

const SAMPLES: usize = 100_000;

/// `rand_seeded(low, high)`: in `[low, high)`, spread over the whole range, with the moments
/// of a uniform distribution (bounds at about ten standard errors).
fn uniform_in_range<T: Float>(low: f64, high: f64, seed: u64) -> Result<(), DeviceError> {
    let v = f64s(&make(
        &stream(),
        &[SAMPLES],
        api::rand_seeded::<T>(low, high, &[SAMPLES], seed),
    )?);
    let what = format!("rand {} [{low}, {high})", T::NAME);
    if let Some(x) = v.iter().find(|x| !(low..high).contains(*x)) {
        panic!("{what}: {x} is out of range");
    }
    let (min, max) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    let width = high - low;
    assert!(
        min < low + 0.001 * width && max > high - 0.01 * width,
        "{what}: spans [{min}, {max}]"
    );
    let (mean, var) = moments(&v);
    let (want_mean, want_var) = ((low + high) / 2.0, width * width / 12.0);
    assert!(
        (mean - want_mean).abs() < 0.01 * width,
        "{what}: mean {mean}"
    );
    assert!(
        (var / want_var - 1.0).abs() < 0.03,
        "{what}: variance {var}"
    );
    // Each tenth of the range holds about a tenth of the values.
    let mut bins = [0usize; 10];
    for x in &v {
        bins[(((x - low) / width * 10.0) as usize).min(9)] += 1;
    }
    for (i, b) in bins.iter().enumerate() {
        assert!(
            (*b as f64 / SAMPLES as f64 - 0.1).abs() < 0.01,
            "{what}: bin {i} holds {b}"
        );
    }
    Ok(())
}

#[test]
fn rand_is_uniform_in_its_half_open_range() -> Result<(), DeviceError> {
    uniform_in_range::<f32>(-2.0, 3.0, 1)?;
    uniform_in_range::<f32>(1.0, 2.0, 2)?;
    uniform_in_range::<f64>(0.0, 1.0, 3)?;
    uniform_in_range::<f64>(-1e3, 1e3, 4)?;
    uniform_in_range::<f16>(0.0, 1.0, 5)?;
    uniform_in_range::<f16>(-2.0, 3.0, 6)?;
    uniform_in_range::<bf16>(0.0, 1.0, 7)?;
    uniform_in_range::<bf16>(-2.0, 3.0, 8)
}

/// `randn_seeded(mean, std)`: moments and the share within one standard deviation of a normal
/// distribution.
fn normal<T: Float>(mean: f64, std: f64, seed: u64) -> Result<(), DeviceError> {
    let v = f64s(&make(
        &stream(),
        &[SAMPLES],
        api::randn_seeded::<T>(mean, std, &[SAMPLES], seed),
    )?);
    let what = format!("randn {} ({mean}, {std})", T::NAME);
    assert!(
        v.iter().all(|x| x.is_finite()),
        "{what}: a value is not finite"
    );
    let (m, var) = moments(&v);
    assert!((m - mean).abs() < 0.05 * std, "{what}: mean {m}");
    assert!(
        (var / (std * std) - 1.0).abs() < 0.05,
        "{what}: variance {var}"
    );
    let within = v.iter().filter(|x| (*x - mean).abs() < std).count() as f64 / SAMPLES as f64;
    assert!(
        (within - 0.6827).abs() < 0.01,
        "{what}: {within} within one std"
    );
    let beyond = v.iter().filter(|x| (*x - mean).abs() > 3.0 * std).count();
    assert!(
        beyond > 100 && beyond < 450,
        "{what}: {beyond} beyond three std"
    );
    Ok(())
}

#[test]
fn randn_is_normal() -> Result<(), DeviceError> {
    normal::<f32>(1.5, 2.0, 1)?;
    normal::<f64>(-3.0, 0.5, 2)?;
    normal::<f16>(0.0, 1.0, 3)?;
    normal::<bf16>(10.0, 3.0, 4)
}

#[test]
fn seeded_random_tensors_are_reproducible() -> Result<(), DeviceError> {
    let s = stream();
    let shape = [7, 1001];
    let u = |seed| api::rand_seeded::<f32>(0.0, 1.0, &shape, seed).sync_on(&s);
    let n = |seed| api::randn_seeded::<f64>(0.0, 1.0, &shape, seed).sync_on(&s);
    let (a, b, c) = (read(&u(42)?), read(&u(42)?), read(&u(43)?));
    assert_eq!(a, b, "rand_seeded with one seed");
    let same = a.iter().zip(&c).filter(|(x, y)| x == y).count();
    assert!(
        same < 10,
        "rand_seeded: seeds 42 and 43 agree on {same} values"
    );
    let (a, b, c) = (read(&n(42)?), read(&n(42)?), read(&n(7)?));
    assert_eq!(a, b, "randn_seeded with one seed");
    assert!(
        a.iter().zip(&c).all(|(x, y)| x != y),
        "randn_seeded: seeds 42 and 7 agree"
    );
    // Elements are not repeated along the tensor.
    let mut sorted = a.clone();
    sorted.sort_by(f64::total_cmp);
    sorted.dedup();
    assert_eq!(sorted.len(), a.len(), "randn values repeat");
    Ok(())
}

#[test]
fn manual_seed_restarts_the_sequence() -> Result<(), DeviceError> {
    // The only test of this binary that draws from the global sequence.
    let s = stream();
    type Draws = (Vec<f32>, Vec<f32>, Vec<f32>);
    let draw = || -> Result<Draws, DeviceError> {
        Ok((
            read(&api::rand::<f32>(-1.0, 1.0, &[500]).sync_on(&s)?),
            read(&api::randn::<f32>(0.0, 1.0, &[500]).sync_on(&s)?),
            read(&api::rand::<f32>(-1.0, 1.0, &[500]).sync_on(&s)?),
        ))
    };
    api::manual_seed(1234);
    let first = draw()?;
    api::manual_seed(1234);
    let again = draw()?;
    assert_eq!(first, again, "the same seed gives the same tensors");
    assert_ne!(first.0, first.2, "each call takes the next seed");
    assert!(first.0.iter().all(|x| (-1.0..1.0).contains(x)));
    api::manual_seed(99);
    assert_ne!(draw()?.0, first.0, "another seed gives other tensors");
    Ok(())
}

#[test]
fn random_tensors_match_the_host_backend() -> Result<(), DeviceError> {
    // The same counter-based generator on every backend, up to the last rounding (and the
    // last bits of log and cos for normal values, judged relative to the standard deviation).
    let host = Device::host().new_stream()?;
    let dev = stream();
    let shape = [3, 4097];
    let u = |s: &Stream| api::rand_seeded::<f32>(-1.0, 4.0, &shape, 5).sync_on(s);
    let (a, b) = (read(&u(&dev)?), read(&u(&host)?));
    assert_dtype_close(
        &a,
        &f64s(&b),
        f32::ARITH_TOL,
        "rand f32 against the host backend",
    );
    let n = |s: &Stream| api::randn_seeded::<f64>(0.0, 1.0, &shape, 6).sync_on(s);
    let (a, b) = (read(&n(&dev)?), read(&n(&host)?));
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(
        worst < 1e-12,
        "randn f64 differs from the host backend by {worst}"
    );
    Ok(())
}

/// `from_vec` and `from_slice` give back exactly what they were given.
fn round_trip<T: DType>(data: Vec<T>, shape: &[usize]) -> Result<(), DeviceError> {
    let s = stream();
    assert_eq!(make(&s, shape, api::from_slice(&data, shape))?, data);
    assert_eq!(make(&s, shape, api::from_vec(data.clone(), shape))?, data);
    Ok(())
}

#[test]
fn from_vec_and_from_slice_round_trip() -> Result<(), DeviceError> {
    let mut rng = seeded_rng(9);
    round_trip::<f32>(uniform(&mut rng, 35, -1e6, 1e6), &[5, 7])?;
    round_trip::<f32>(vec![f32::NEG_INFINITY, f32::INFINITY, -0.0, 1e-45], &[4])?;
    round_trip::<f64>(uniform(&mut rng, 4097, -1.0, 1.0), &[4097])?;
    round_trip::<f16>(uniform(&mut rng, 24, -100.0, 100.0), &[2, 3, 4])?;
    round_trip::<bf16>(uniform(&mut rng, 7, -1e30, 1e30), &[7, 1])?;
    round_trip::<i32>(ints(&mut rng, 1000), &[10, 100])?;
    round_trip::<i64>(ints(&mut rng, 9), &[3, 3])?;
    round_trip::<u32>(ints(&mut rng, 1), &[1])?;
    round_trip::<u8>(ints(&mut rng, 4097), &[4097])?;
    round_trip::<f32>(vec![], &[0, 5])?;
    round_trip::<f32>(vec![2.5], &[])
}

#[test]
fn nan_survives_a_round_trip_bit_for_bit() -> Result<(), DeviceError> {
    let nan = f32::from_bits(0x7fc0_1234);
    let got = make(&stream(), &[1], api::from_vec(vec![nan], &[1]))?;
    assert_eq!(got[0].to_bits(), nan.to_bits());
    Ok(())
}

#[test]
fn dup_copies_into_new_memory() -> Result<(), DeviceError> {
    let s = stream();
    let data: Vec<f32> = (0..96).map(|i| i as f32 * 0.5 - 7.0).collect();
    let mut x = upload(&s, &data, &[8, 12]);
    let copy = api::dup(&x).sync_on(&s)?;
    assert_eq!(copy.shape(), &[8, 12]);
    assert!(!Arc::ptr_eq(copy.buffer(), x.buffer()));
    assert_eq!(read(&copy), data);
    // Writing the original leaves the copy as it was.
    let ones = api::ones::<f32>(&[8, 12]).sync_on(&s)?;
    drop(kernels::saxpy((&mut x).partition([2, 12]), 1.0, &ones).sync_on(&s)?);
    assert_eq!(read(&x), data.iter().map(|v| v + 1.0).collect::<Vec<_>>());
    assert_eq!(read(&copy), data);
    // Of an op, and of other types.
    let copy = api::dup(api::arange::<i64>(0.0, 5.0, 1.0)).sync_on(&s)?;
    assert_eq!(read(&copy), vec![0i64, 1, 2, 3, 4]);
    let bytes = upload(&s, &[1u8, 2, 3], &[3]);
    assert_eq!(
        read(&api::dup(Arc::new(bytes)).sync_on(&s)?),
        vec![1u8, 2, 3]
    );
    Ok(())
}

#[test]
fn memcpy_overwrites_poisoned_memory() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(10);
    let shape = [3, 4097];
    let data: Vec<f32> = uniform(&mut rng, numel(&shape), -5.0, 5.0);
    let src = upload(&s, &data, &shape);
    let mut dst = api::full(&shape, -999.0f32).sync_on(&s)?;
    let alias = dst.clone();
    api::memcpy(&mut dst, &src).sync_on(&s)?;
    assert_eq!(read(&dst), data);
    assert_eq!(read(&alias), data, "a clone sees the copy");
    assert_eq!(read(&src), data, "the source is unchanged");

    // From an op, into the same memory again.
    api::memcpy(&mut dst, api::full(&shape, 0.5f32)).sync_on(&s)?;
    assert_eq!(read(&dst), vec![0.5; numel(&shape)]);

    // Other types.
    let mut d = api::full(&[5], u8::MAX).sync_on(&s)?;
    api::memcpy(&mut d, api::arange::<u8>(0.0, 5.0, 1.0)).sync_on(&s)?;
    assert_eq!(read(&d), vec![0u8, 1, 2, 3, 4]);
    let mut d = api::full(&[2, 2], bf16::from_f64(7.0)).sync_on(&s)?;
    api::memcpy(&mut d, api::eye::<bf16>(2)).sync_on(&s)?;
    assert_eq!(read(&d), identity::<bf16>(2));
    Ok(())
}

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

//! Constructors and copies: exact values where they must be exact (fills, ranges, identity),
//! round trips, copies into poisoned memory. Random constructors are tested in `random.rs`,
//! casts in `cast.rs`.

use std::sync::Arc;

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, f16, kernels, DType, PartitionExt, TensorOpExt};
use cuflow_testing::{device::stream, rng::seeded_rng, tensor::*};

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

/// The values `start + i · step` (in `f64`, as `arange` computes them) before the first one
/// that is not below `end` (not above it, for a negative step). They are computed halved and
/// doubled, which is exact and keeps `i · step` finite in ranges wider than `f64` holds.
fn arange_reference(start: f64, end: f64, step: f64) -> Vec<f64> {
    let inside = |v: f64| if step > 0.0 { v < end } else { v > end };
    (0..)
        .map(|i| {
            if i == 0 {
                start
            } else {
                2.0 * (start / 2.0 + i as f64 * (step / 2.0))
            }
        })
        .take_while(|&v| inside(v))
        .collect()
}

#[test]
fn arange_holds_exactly_the_values_before_the_end() -> Result<(), DeviceError> {
    let s = stream();
    // (end - start) / step rounds up to a whole count where the last value is the end itself:
    // 1 + 3 · 0.1 == 1.3 exactly in f64, and likewise 1 - 3 · 0.1 == 0.7.
    assert_eq!(
        make(&s, &[3], api::arange::<f64>(1.0, 1.3, 0.1))?,
        vec![1.0, 1.1, 1.2]
    );
    assert_eq!(
        make(&s, &[3], api::arange::<f64>(1.0, 0.7, -0.1))?,
        vec![1.0, 0.9, 0.8]
    );
    // Decimal starts, ends and steps, either way: no value at or past the end, none missing.
    let decimals = [0.1, 0.2, 0.3, 0.7, 1.1, 1.3, 2.675, 3.0, 1e-3, 7.1];
    for &a in &decimals {
        for &b in &decimals {
            for &d in &[0.1, 0.3, 0.7, 1e-3, 0.05] {
                for (start, end, step) in [(a, a + b, d), (a + b, a, -d), (-a, b, d)] {
                    let want = arange_reference(start, end, step);
                    let got = api::arange::<f64>(start, end, step).to_host_vec()?;
                    assert_eq!(got, want, "arange({start}, {end}, {step})");
                }
            }
        }
    }
    Ok(())
}

/// A range wider than `f64` holds (`end - start` overflows) is counted all the same: its
/// values are finite. It was refused as "inf values, more than a tensor can hold" where it held
/// 36.
#[test]
fn arange_counts_a_range_wider_than_f64_holds() -> Result<(), DeviceError> {
    let s = stream();
    for (start, end, step) in [
        (-f64::MAX, f64::MAX, 1e307),
        (f64::MAX, -f64::MAX, -1e307),
        (-1.5e308, 1.7e308, 3e307),
    ] {
        let want = arange_reference(start, end, step);
        assert!(want.len() > 10 && want.iter().all(|v| v.is_finite()));
        let got = make(&s, &[want.len()], api::arange::<f64>(start, end, step))?;
        assert_eq!(got, want, "arange({start:e}, {end:e}, {step:e})");
    }
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

/// Integer ranges whose values leave the type saturate at its bounds, as
/// [`api::cast`] of the same `f64` values does; fractions truncate toward zero. (In CUDA C an
/// out-of-range `double` to integer conversion is undefined: the kernel must saturate itself.)
#[test]
fn integer_ranges_past_the_type_saturate_like_cast() -> Result<(), DeviceError> {
    let s = stream();
    let mut bytes: Vec<u8> = (250..=255).collect();
    bytes.extend([255; 4]);
    assert_eq!(
        make(&s, &[10], api::arange::<u8>(250.0, 260.0, 1.0))?,
        bytes
    );
    assert_eq!(
        make(&s, &[6], api::arange::<u8>(-3.0, 3.0, 1.0))?,
        vec![0, 0, 0, 0, 1, 2]
    );
    assert_eq!(
        make(&s, &[8], api::arange::<u8>(254.0, 258.0, 0.5))?,
        vec![254, 254, 255, 255, 255, 255, 255, 255]
    );
    assert_eq!(
        make(&s, &[4], api::arange::<i32>(2.1e9, 2.3e9, 0.05e9))?,
        vec![2_100_000_000, i32::MAX, i32::MAX, i32::MAX]
    );
    assert_eq!(
        make(&s, &[3], api::arange::<u32>(-1e10, 1e10, 0.8e10))?,
        vec![0, 0, u32::MAX]
    );
    assert_eq!(
        make(&s, &[3], api::linspace::<i32>(-1e10, 1e10, 3))?,
        vec![i32::MIN, 0, i32::MAX]
    );
    assert_eq!(
        make(&s, &[3], api::linspace::<i64>(-1e300, 1e300, 3))?,
        vec![i64::MIN, 0, i64::MAX]
    );
    assert_eq!(
        make(&s, &[5], api::linspace::<u8>(-300.0, 300.0, 5))?,
        vec![0, 0, 0, 150, 255]
    );
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

//! Random constructors: values within their range and with plausible moments, seeded calls
//! reproducible, the same values on the host backend as on the device under test.

use std::sync::Mutex;

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{Device, DeviceError, Stream};
use cuflow_tensor::{api, bf16, f16};
use cuflow_testing::{device::stream, tensor::*};

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

/// Held by the tests that draw seeds from the global sequence, which tests running beside
/// each other would otherwise advance under one another.
static GLOBAL_SEQUENCE: Mutex<()> = Mutex::new(());

#[test]
fn manual_seed_restarts_the_sequence() -> Result<(), DeviceError> {
    let _sequence = GLOBAL_SEQUENCE.lock().unwrap_or_else(|e| e.into_inner());
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

/// Ranges with no uniform distribution (reversed, not finite, wider than `f64` spans) and
/// normal distributions with a negative or non-finite deviation are refused naming the bounds,
/// instead of giving values outside `[low, high)` (a reversed range gave values in
/// `(high, low]`, an infinite one zeros or NaN). An empty range gives `low` everywhere.
#[test]
fn random_constructors_refuse_ranges_without_a_distribution() -> Result<(), DeviceError> {
    let _sequence = GLOBAL_SEQUENCE.lock().unwrap_or_else(|e| e.into_inner());
    let s = stream();
    let refused = |r: Result<cuflow_tensor::Tensor<f32>, DeviceError>, op: &str, what: &str| {
        let err = r.expect_err(what);
        let text = err.to_string();
        assert!(
            matches!(err, DeviceError::InvalidShape { op: o, .. } if o == op),
            "{what}: {text}"
        );
        assert!(text.contains(what), "{text:?} does not name {what}");
    };
    for (low, high, what) in [
        (1.0, 0.0, "[1, 0)"),
        (0.0, f64::INFINITY, "[0, inf)"),
        (f64::NAN, 1.0, "[NaN, 1)"),
        (-f64::MAX, f64::MAX, "wider"),
    ] {
        refused(api::rand::<f32>(low, high, &[4]).sync_on(&s), "rand", what);
        refused(
            api::rand_seeded::<f32>(low, high, &[4], 7).sync_on(&s),
            "rand",
            what,
        );
    }
    for (mean, std, what) in [
        (0.0, -1.0, "standard deviation -1"),
        (0.0, f64::NAN, "standard deviation NaN"),
        (f64::INFINITY, 1.0, "mean inf"),
    ] {
        refused(
            api::randn::<f32>(mean, std, &[4]).sync_on(&s),
            "randn",
            what,
        );
        refused(
            api::randn_seeded::<f32>(mean, std, &[4], 7).sync_on(&s),
            "randn",
            what,
        );
    }
    let same = read(&api::rand_seeded::<f32>(2.0, 2.0, &[4], 7).sync_on(&s)?);
    assert_eq!(same, vec![2.0; 4], "an empty range gives its low bound");
    let constant = read(&api::randn_seeded::<f32>(3.0, 0.0, &[4], 7).sync_on(&s)?);
    assert_eq!(constant, vec![3.0; 4], "a zero deviation gives the mean");
    Ok(())
}

/// Fails unless `err` is `op`'s shape error naming f16 and the value past its range.
#[track_caller]
fn assert_past_f16(err: DeviceError, op: &str, value: f64) {
    let text = err.to_string();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: got, .. } if got == op),
        "{text}"
    );
    assert!(
        text.contains("f16") && text.contains(&format!("{value}")),
        "{text}"
    );
}

/// A low bound past the largest finite value of the dtype is refused naming the dtype and the
/// bound, instead of giving infinities (`rand::<f16>(70000, 80000)` gave `inf` everywhere, and
/// `(-70000, 0)` `-inf` for the values below -65520). A high bound past it is fine: the
/// values stay finite and below it.
#[test]
fn rand_refuses_a_low_bound_the_dtype_cannot_hold() -> Result<(), DeviceError> {
    let s = stream();
    for (low, high) in [(70000.0, 80000.0), (-70000.0, 0.0)] {
        let err = api::rand_seeded::<f16>(low, high, &[8], 7)
            .sync_on(&s)
            .expect_err("a low bound past f16");
        assert_past_f16(err, "rand", low);
    }
    let err = api::rand_seeded::<f32>(-1e39, 0.0, &[8], 7)
        .sync_on(&s)
        .expect_err("a low bound past f32");
    assert!(err.to_string().contains("f32"), "{err}");
    let v = f64s(&read(
        &api::rand_seeded::<f16>(0.0, 70000.0, &[1000], 7).sync_on(&s)?,
    ));
    assert!(
        v.iter()
            .all(|x| x.is_finite() && (0.0..70000.0).contains(x)),
        "values of [0, 70000) in f16: {:?}",
        v.iter().find(|x| !x.is_finite())
    );
    Ok(())
}

/// A mean past the finite values of the dtype is refused, as `rand`'s low bound is: every value
/// of `randn::<f16>(1e5, 1.0)` rounded to inf (and those of a mean of -1e5 to -inf), as Ok.
#[test]
fn randn_refuses_a_mean_the_dtype_cannot_hold() -> Result<(), DeviceError> {
    let s = stream();
    for mean in [1e5, -1e5] {
        let err = api::randn_seeded::<f16>(mean, 1.0, &[8], 7)
            .sync_on(&s)
            .expect_err("a mean past f16");
        assert_past_f16(err, "randn", mean);
    }
    for err in [
        api::randn_seeded::<bf16>(1e39, 1.0, &[8], 7)
            .sync_on(&s)
            .expect_err("a mean past bf16"),
        api::randn_seeded::<f32>(-1e39, 1.0, &[8], 7)
            .sync_on(&s)
            .expect_err("a mean past f32"),
    ] {
        assert!(
            matches!(err, DeviceError::InvalidShape { op: "randn", .. }),
            "{err}"
        );
    }
    // A mean the dtype holds, near its largest value, gives finite values about it.
    let v = f64s(&read(
        &api::randn_seeded::<f16>(60000.0, 16.0, &[1000], 7).sync_on(&s)?,
    ));
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    assert!(
        v.iter().all(|x| x.is_finite()) && (mean - 60000.0).abs() < 8.0,
        "mean {mean}, a value {:?}",
        v.iter().find(|x| !x.is_finite())
    );
    Ok(())
}

/// A range holding no value of the dtype is refused naming it and the bounds: every value of
/// `rand::<f16>(1.0008, 1.0009)` was 1.0009766, at or above the high bound, and every value of
/// `rand::<f16>(1.0004, 1.0005)` was 1.0, below the low bound, both as Ok. A range holding a
/// single value gives it everywhere.
#[test]
fn rand_refuses_a_range_without_a_value_of_the_dtype() -> Result<(), DeviceError> {
    let s = stream();
    let refused = |err: DeviceError, dtype: &str, low: f64, high: f64| {
        let text = err.to_string();
        assert!(
            matches!(err, DeviceError::InvalidShape { op: "rand", .. }),
            "{text}"
        );
        assert!(
            text.contains(dtype) && text.contains(&format!("[{low}, {high})")),
            "{text}"
        );
    };
    for (low, high) in [(1.0008, 1.0009), (1.0004, 1.0005), (-1.0005, -1.0004)] {
        let err = api::rand_seeded::<f16>(low, high, &[8], 7)
            .sync_on(&s)
            .expect_err("a range between two f16");
        refused(err, "f16", low, high);
    }
    let err = api::rand_seeded::<bf16>(1.001, 1.002, &[8], 7)
        .sync_on(&s)
        .expect_err("a range between two bf16");
    refused(err, "bf16", 1.001, 1.002);
    let (low, high) = (1.0 + 1e-8, 1.0 + 2e-8);
    let err = api::rand_seeded::<f32>(low, high, &[8], 7)
        .sync_on(&s)
        .expect_err("a range between two f32");
    refused(err, "f32", low, high);
    // [1.0009, 1.001) holds one f16, 1 + 2^-10, and [1.0, 1.0005) holds 1.0.
    let one_value = read(&api::rand_seeded::<f16>(1.0009, 1.001, &[8], 7).sync_on(&s)?);
    assert_eq!(one_value, vec![f16::from_f64(1.0 + 1.0 / 1024.0); 8]);
    let one_value = read(&api::rand_seeded::<f16>(1.0, 1.0005, &[8], 7).sync_on(&s)?);
    assert_eq!(one_value, vec![f16::from_f64(1.0); 8]);
    Ok(())
}

/// A standard deviation whose values the dtype cannot hold is refused naming it: the values of
/// `randn::<f16>(0, 1e5)` and `randn::<f64>(0, f64::MAX)` were infinite as often as not, as
/// Ok. The values lie within 5.9 deviations of the mean, so `randn::<f16>(0, 1e4)` is fine.
#[test]
fn randn_refuses_a_deviation_the_dtype_cannot_hold() -> Result<(), DeviceError> {
    let s = stream();
    for (mean, std) in [(0.0, 1e5), (60000.0, 1000.0)] {
        let err = api::randn_seeded::<f16>(mean, std, &[8], 7)
            .sync_on(&s)
            .expect_err("a deviation past f16");
        assert_past_f16(err, "randn", std);
    }
    let err = api::randn_seeded::<f64>(0.0, f64::MAX, &[8], 7)
        .sync_on(&s)
        .expect_err("a deviation past f64");
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "randn", .. }),
        "{err}"
    );
    let v = f64s(&read(
        &api::randn_seeded::<f16>(0.0, 1e4, &[10_000], 7).sync_on(&s)?,
    ));
    assert!(
        v.iter().all(|x| x.is_finite()),
        "{:?}",
        v.iter().find(|x| !x.is_finite())
    );
    Ok(())
}

/// A low bound between two values of the dtype gives no value below it: `rand::<f16>(0.1, 0.2)`
/// gave 0.099975586 (the f16 nearest 0.1, below it) for the draws nearest the low bound, and
/// likewise in bf16 and f32 (whose 0.7 lies below 0.7).
#[test]
fn rand_gives_no_value_below_a_low_bound_the_dtype_rounds_down() -> Result<(), DeviceError> {
    fn check<T: Float>(low: f64, high: f64) -> Result<(), DeviceError> {
        assert!(
            T::from_f64(low).to_f64() < low,
            "{low} rounds down in {}",
            T::NAME
        );
        let v = f64s(&read(
            &api::rand_seeded::<T>(low, high, &[20_000], 11).sync_on(&stream())?,
        ));
        let out = v.iter().find(|x| !(low..high).contains(*x));
        assert!(out.is_none(), "rand {} [{low}, {high}): {out:?}", T::NAME);
        Ok(())
    }
    check::<f16>(0.1, 0.2)?;
    check::<f16>(-0.7, -0.6)?;
    check::<bf16>(0.7, 0.8)?;
    check::<f32>(0.7, 0.7 + 1e-6)
}

//! `eye_rect`, `fill`, `*_like` constructors and `reinterpret`, on the device under test.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, f16, kernels, DType, Tensor};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng;
use cuflow_testing::tensor::{make, random, read, upload};

fn check_eye_rect<T: DType>(rows: usize, cols: usize) -> Result<(), DeviceError> {
    let s = stream();
    let got = make(&s, &[rows, cols], api::eye_rect::<T>(rows, cols))?;
    for r in 0..rows {
        for c in 0..cols {
            let want = if r == c { 1.0 } else { 0.0 };
            assert_eq!(
                got[r * cols + c].to_f64(),
                want,
                "{rows}x{cols} at ({r}, {c})"
            );
        }
    }
    Ok(())
}

#[test]
fn eye_rect_of_wide_tall_square_and_empty_shapes() -> Result<(), DeviceError> {
    for (r, c) in [
        (1, 1),
        (3, 5),
        (5, 3),
        (4, 4),
        (0, 3),
        (3, 0),
        (0, 0),
        (1, 1000),
        (700, 2),
    ] {
        check_eye_rect::<f32>(r, c)?;
    }
    check_eye_rect::<bf16>(17, 9)?;
    check_eye_rect::<i64>(9, 17)?;
    check_eye_rect::<u8>(33, 31)
}

#[test]
fn fill_and_like_constructors() -> Result<(), DeviceError> {
    let s = stream();
    assert_eq!(
        make(&s, &[3, 7], api::fill(&[3, 7], -1.25f64))?,
        vec![-1.25; 21]
    );
    assert_eq!(
        make(&s, &[0, 4], api::fill(&[0, 4], 3u32))?,
        Vec::<u32>::new()
    );

    let mut rng = seeded_rng(71);
    let xh: Vec<f16> = random(&mut rng, 2 * 3 * 5);
    let x = upload(&s, &xh, &[2, 3, 5]);
    let z = make(&s, &[2, 3, 5], api::zeros_like(&x))?;
    assert!(z.iter().all(|v| v.to_f64() == 0.0));
    let o = make(&s, &[2, 3, 5], api::ones_like(x.clone()))?;
    assert!(o.iter().all(|v| v.to_f64() == 1.0));
    let f = make(&s, &[2, 3, 5], api::full_like(&x, f16::from_f32(0.5)))?;
    assert!(f.iter().all(|v| v.to_f64() == 0.5));
    assert_eq!(read(&x), xh, "the model tensor is unchanged");

    // From a lazy op, whose result is only looked at for its shape.
    let lazy = make(
        &s,
        &[4],
        api::full_like(kernels::relu(api::ones::<f32>(&[4])), 9.0),
    )?;
    assert_eq!(lazy, vec![9.0; 4]);
    Ok(())
}

fn bytes_of<T: DType>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice::<T, u8>(v).to_vec()
}

fn check_reinterpret<T: DType, U: DType>(
    shape: &[usize],
    want: &[usize],
) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(72);
    let n: usize = shape.iter().product();
    let xh: Vec<T> = random(&mut rng, n);
    let x = upload(&s, &xh, shape);
    let y: Tensor<U> = x.reinterpret::<U>()?;
    assert_eq!(y.shape(), want, "{} {shape:?} as {}", T::NAME, U::NAME);
    assert_eq!(
        bytes_of(&read(&y)),
        bytes_of(&xh),
        "the bytes are unchanged"
    );
    Ok(())
}

#[test]
fn reinterpret_scales_the_last_axis() -> Result<(), DeviceError> {
    check_reinterpret::<f32, u32>(&[3, 4], &[3, 4])?;
    check_reinterpret::<f32, bf16>(&[3, 4], &[3, 8])?;
    check_reinterpret::<f32, u8>(&[2, 5], &[2, 20])?;
    check_reinterpret::<u8, u32>(&[3, 8], &[3, 2])?;
    check_reinterpret::<bf16, f64>(&[2, 2, 8], &[2, 2, 2])?;
    check_reinterpret::<i64, f32>(&[5], &[10])?;
    check_reinterpret::<f16, i32>(&[0, 6], &[0, 3])?;
    check_reinterpret::<i32, u32>(&[], &[])
}

#[test]
fn reinterpret_shares_memory() -> Result<(), DeviceError> {
    let s = stream();
    let x = upload(&s, &[0.0f32; 4], &[4]);
    let bits = x.reinterpret::<u32>()?;
    let _ = kernels::add_scalar(&bits, 0x3f80_0000).sync_on(&s)?; // a new tensor, x unchanged
    assert_eq!(read(&x), vec![0.0; 4]);
    let mut bits = bits;
    let one = upload(&s, &[1.0f32.to_bits(); 4], &[4]);
    api::memcpy(&mut bits, &one).sync_on(&s)?;
    assert_eq!(
        read(&x),
        vec![1.0; 4],
        "a write through the reinterpreted tensor"
    );
    Ok(())
}

#[test]
fn reinterpret_errors_say_why() -> Result<(), DeviceError> {
    let s = stream();
    let odd = upload(&s, &[0u8; 6], &[2, 3]);
    let err = odd.reinterpret::<u32>().expect_err("3 bytes are not a u32");
    let text = err.to_string();
    assert!(
        text.contains("axis 1") && text.contains("[2, 3]") && text.contains("u32"),
        "{text}"
    );

    let scalar = upload(&s, &[1.0f64], &[]);
    let err = scalar
        .reinterpret::<f32>()
        .expect_err("a scalar cannot change size");
    assert!(err.to_string().contains("scalar"), "{err}");
    assert_eq!(scalar.reinterpret::<i64>()?.shape(), &[] as &[usize]);
    Ok(())
}

/// An empty `f32` tensor may have a last axis of 2^63 elements: read as `u8` it would have
/// 2^65, more than `usize` counts, so that reading is refused (it panicked on the overflow,
/// or wrapped to `[0, 0]`); read as `i64` it has 2^62, which is fine.
#[test]
fn reinterpret_refuses_a_last_axis_whose_bytes_overflow() -> Result<(), DeviceError> {
    let s = stream();
    let empty = api::zeros::<f32>(&[0, 1 << 63]).sync_on(&s)?;
    let err = empty
        .reinterpret::<u8>()
        .expect_err("2^65 bytes in the last axis");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            DeviceError::InvalidShape {
                op: "reinterpret",
                ..
            }
        ) && text.contains("overflow")
            && text.contains("axis 1"),
        "{text}"
    );
    assert_eq!(empty.reinterpret::<i64>()?.shape(), &[0, 1 << 62]);
    Ok(())
}

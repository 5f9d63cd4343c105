//! `Display` for tensors: exact printouts of small tensors, elision of large ones.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, Tensor};
use cuflow_testing::device::stream;

/// The printout's tail for a tensor of `shape` and dtype `dtype` on the device under test.
fn tail<T: cuflow_tensor::DType>(t: &Tensor<T>, dtype: &str) -> String {
    format!(
        "shape={:?}, dtype={dtype}, device={}",
        t.shape(),
        t.device()
    )
}

#[test]
fn matrix_of_floats() -> Result<(), DeviceError> {
    let s = stream();
    let t = api::from_vec(vec![1.0f32, -2.0, 3.5, 40.125], &[2, 2]).sync_on(&s)?;
    let want = format!(
        "tensor([[ 1.0000, -2.0000],\n        [ 3.5000, 40.1250]], {})",
        tail(&t, "f32")
    );
    assert_eq!(t.to_string(), want);
    Ok(())
}

#[test]
fn precision_comes_from_the_format() -> Result<(), DeviceError> {
    let s = stream();
    let t = api::from_vec(vec![0.5f64, -0.125, 2.0], &[3]).sync_on(&s)?;
    assert_eq!(
        format!("{t:.1}"),
        format!("tensor([ 0.5, -0.1,  2.0], {})", tail(&t, "f64"))
    );
    Ok(())
}

#[test]
fn scalar_and_empty() -> Result<(), DeviceError> {
    let s = stream();
    let scalar = api::from_vec(vec![bf16::from_f32(1.5)], &[]).sync_on(&s)?;
    assert_eq!(
        scalar.to_string(),
        format!("tensor(1.5000, {})", tail(&scalar, "bf16"))
    );
    let empty = api::zeros::<u8>(&[2, 0, 3]).sync_on(&s)?;
    assert_eq!(
        empty.to_string(),
        format!("tensor([], {})", tail(&empty, "u8"))
    );
    Ok(())
}

#[test]
fn three_axes_separate_blocks_with_a_blank_line() -> Result<(), DeviceError> {
    let s = stream();
    let t = api::from_vec((0..8i64).collect(), &[2, 2, 2]).sync_on(&s)?;
    let want = format!(
        "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]], {})",
        tail(&t, "i64")
    );
    assert_eq!(t.to_string(), want);
    Ok(())
}

#[test]
fn large_tensors_are_elided() -> Result<(), DeviceError> {
    let s = stream();
    let t = api::from_vec((0..50 * 30u32).collect(), &[50, 30]).sync_on(&s)?;
    let row = |r: u32| {
        let b = r * 30;
        format!(
            "[{:>4}, {:>4}, {:>4}, ..., {:>4}, {:>4}, {:>4}]",
            b,
            b + 1,
            b + 2,
            b + 27,
            b + 28,
            b + 29
        )
    };
    let sep = ",\n        ";
    let want = format!(
        "tensor([{}{sep}{}{sep}{}{sep}...{sep}{}{sep}{}{sep}{}], {})",
        row(0),
        row(1),
        row(2),
        row(47),
        row(48),
        row(49),
        tail(&t, "u32")
    );
    assert_eq!(t.to_string(), want);
    Ok(())
}

#[test]
fn up_to_a_thousand_elements_print_in_full() -> Result<(), DeviceError> {
    let s = stream();
    let t = api::from_vec((0..1000i32).collect(), &[10, 100]).sync_on(&s)?;
    let text = t.to_string();
    let (body, _) = text
        .split_once(", shape=")
        .expect("a shape after the elements");
    assert!(!body.contains("..."), "{text}");
    assert_eq!(body.matches(',').count(), 999, "{text}");
    Ok(())
}

#[test]
fn printing_waits_for_the_work_writing_the_tensor() -> Result<(), DeviceError> {
    let s = stream();
    let t = api::full::<f32>(&[3], 2.0)
        .then(|t| cuflow_tensor::kernels::scale(t, 3.0))
        .sync_on(&s)?;
    assert_eq!(
        t.to_string(),
        format!("tensor([6.0000, 6.0000, 6.0000], {})", tail(&t, "f32"))
    );
    Ok(())
}

/// An expanded view of far more elements than host memory holds prints its edges from the
/// buffer it covers, without being gathered, and `to_host_vec` of it is an error.
#[test]
fn a_huge_expanded_view_prints_without_being_gathered() -> Result<(), DeviceError> {
    let s = stream();
    let base = api::from_vec((0..30u32).map(|v| v * 7 + 1).collect(), &[30]).sync_on(&s)?;
    let t = base.expand(&[1 << 40, 30])?;
    let v = |i: u32| i * 7 + 1;
    let row = format!(
        "[{:>3}, {:>3}, {:>3}, ..., {:>3}, {:>3}, {:>3}]",
        v(0),
        v(1),
        v(2),
        v(27),
        v(28),
        v(29)
    );
    let sep = ",\n        ";
    let rows = [&row; 3].map(String::as_str).join(sep);
    let want = format!("tensor([{rows}{sep}...{sep}{rows}], {})", tail(&t, "u32"));
    assert_eq!(t.to_string(), want);

    let err = base.expand(&[1 << 58, 30])?.to_host_vec().unwrap_err();
    assert!(matches!(err, DeviceError::OutOfMemory { .. }), "{err}");
    let err = base
        .narrow(0, 0, 1)?
        .expand(&[1 << 62])?
        .to_host_vec()
        .unwrap_err();
    assert!(matches!(err, DeviceError::OutOfMemory { .. }), "{err}");
    Ok(())
}

/// A transposed, narrowed view prints its elements in its own row-major order.
#[test]
fn views_print_their_own_elements() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::from_vec((0..12i32).collect(), &[3, 4]).sync_on(&s)?;
    let t = x.narrow(1, 1, 2)?.transpose(0, 1)?;
    assert_eq!(
        t.to_string(),
        format!(
            "tensor([[ 1,  5,  9],\n        [ 2,  6, 10]], {})",
            tail(&t, "i32")
        )
    );
    Ok(())
}

/// Axes of length 1 print one pair of brackets each, however many there are: printing a view
/// under 100000 of them recursed once per axis and overflowed the thread's stack (an abort).
#[test]
fn thousands_of_unit_axes_print_their_brackets() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::from_vec(vec![0i32, 1, 2, 3], &[2, 2]).sync_on(&s)?;
    for units in [3, 100_000] {
        let mut shape = vec![1usize; units];
        shape.extend([2, 2]);
        let t = x.expand(&shape)?;
        // Rows are indented past `tensor(` and one bracket per enclosing axis.
        let want = format!(
            "tensor({}[[0, 1],\n{}[2, 3]]{}, {})",
            "[".repeat(units),
            " ".repeat("tensor([".len() + units),
            "]".repeat(units),
            tail(&t, "i32")
        );
        assert!(t.to_string() == want, "{units} unit axes print as expected");
    }
    Ok(())
}

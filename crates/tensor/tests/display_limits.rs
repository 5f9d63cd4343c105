//! `Display` of large views stays small and quick: the cells printed are capped however many
//! short axes a view has, and only the cells shown are read back from the device.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::api;
use cuflow_testing::device::stream;

#[test]
fn many_short_axes_are_elided() -> Result<(), DeviceError> {
    let s = stream();
    let t = api::zeros::<f32>(&[1]).sync_on(&s)?.expand(&[4; 11])?;
    let text = t.to_string();
    assert!(text.len() < 100_000, "{} bytes", text.len());
    assert!(
        text.starts_with("tensor([[[[[[[[[[[0.0000, "),
        "{}",
        &text[..80]
    );
    assert!(text.contains("..."), "elided");
    let tail = format!("shape={:?}, dtype=f32, device={})", [4; 11], t.device());
    assert!(text.ends_with(&tail), "{}", &text[text.len() - 200..]);
    // Every element shown is a zero, and there are at most a thousand of them.
    let (body, _) = text
        .split_once(", shape=")
        .expect("a shape after the elements");
    assert!(body.matches("0.0000").count() <= 1000);
    Ok(())
}

#[test]
fn twenty_axes_of_six_print_quickly() -> Result<(), DeviceError> {
    let s = stream();
    let t = api::ones::<i32>(&[1]).sync_on(&s)?.expand(&[6; 20])?;
    let start = std::time::Instant::now();
    let text = t.to_string();
    assert!(text.len() < 100_000, "{} bytes", text.len());
    assert!(start.elapsed().as_secs() < 10, "took {:?}", start.elapsed());
    Ok(())
}

/// The cells shown come from where the view points, for views that skip most of a buffer.
#[test]
fn sparse_views_print_their_own_elements() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::arange::<i64>(0.0, 1e6, 1.0)
        .sync_on(&s)?
        .reshape(&[1000, 1000])?;
    let corners = x.slice(&[0..1000, 0..1000])?.permute(&[1, 0])?;
    let text = corners.to_string();
    assert!(
        text.starts_with("tensor([[     0,   1000,   2000, ..., 997000, 998000, 999000],\n"),
        "{text}"
    );
    assert!(
        text.contains("[   999,   1999,   2999, ..., 997999, 998999, 999999]]"),
        "{text}"
    );
    let column = x.select(1, 999)?.to_string();
    assert!(column.starts_with("tensor([   999,   1999,"), "{column}");
    assert!(
        column.contains(" 998999, 999999], shape=[1000]"),
        "{column}"
    );
    let ends = x.select(0, 999)?.narrow(0, 998, 2)?;
    assert!(
        ends.to_string()
            .starts_with("tensor([999998, 999999], shape=[2]"),
        "{ends}"
    );
    Ok(())
}

/// An empty tensor prints `[]` whatever the length of its other axes: its axes list no
/// indices to show (an axis of 2^40 entries listed them all, which aborted the process on an
/// allocation of 16 TiB).
#[test]
fn an_empty_tensor_with_long_axes_prints_without_listing_them() -> Result<(), DeviceError> {
    let s = stream();
    for shape in [
        [0, 1 << 40, 1 << 23],
        [1 << 40, 1 << 23, 0],
        [3, 0, 1 << 60],
    ] {
        let t = api::zeros::<f32>(&[0]).sync_on(&s)?.reshape(&shape)?;
        assert_eq!(
            t.to_string(),
            format!(
                "tensor([], shape={shape:?}, dtype=f32, device={})",
                t.device()
            )
        );
    }
    Ok(())
}

//! Views against references computed here by index arithmetic (never through strides): every
//! view reads the elements its definition names, `contiguous` copies exactly those, kernels
//! given views compute what they compute on the dense copy, writes through a contiguous view
//! land in the base tensor in order with its readers, and bad axes are refused naming them.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{DeviceError, Kernel};
use cuflow_tensor::{api, bf16, f16, kernels, DType, Launch, PartitionExt, Tensor};
use cuflow_testing::{
    device::stream,
    rng::seeded_rng,
    tensor::{assert_dtype_close, assert_exact, random, read, uniform, upload, Float},
    test_cases,
};

/// The row-major multi-index of element `i` of `shape`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        idx[a] = i % shape[a];
        i /= shape[a];
    }
    idx
}

/// The row-major position of `idx` in `shape`.
fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |p, (i, d)| p * d + i)
}

/// The elements of a view of `out` shape over `base` (of `shape`), element `idx` of the view
/// being element `map(idx)` of the base.
fn reference<T: Copy>(
    base: &[T],
    shape: &[usize],
    out: &[usize],
    map: impl Fn(&[usize]) -> Vec<usize>,
) -> Vec<T> {
    let n: usize = out.iter().product();
    (0..n)
        .map(|i| base[ravel(&map(&unravel(i, out)), shape)])
        .collect()
}

/// Checks `view` (shape and elements, directly and through `contiguous`) against the
/// reference.
fn check<T: DType>(
    view: &Tensor<T>,
    want_shape: &[usize],
    want: &[T],
    what: &str,
) -> Result<(), DeviceError> {
    let s = stream();
    assert_eq!(view.shape(), want_shape, "{what}: shape");
    assert_eq!(view.len(), want.len(), "{what}: element count");
    assert_exact(&read(view), want, what);
    let dense = kernels::contiguous(view).sync_on(&s)?;
    assert!(dense.is_contiguous(), "{what}: contiguous() is contiguous");
    assert_eq!(dense.strides().len(), want_shape.len());
    assert_exact(&read(&dense), want, &format!("{what} (contiguous)"));
    Ok(())
}

fn every_view_reads_its_elements<T: DType>(seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let shape = [3usize, 4, 5];
    // Distinct-looking values for every dtype (u8 included).
    let data: Vec<T> = uniform(&mut rng, 60, 0.0, 100.0);
    let x = upload(&s, &data, &shape);

    let v = x.narrow(1, 1, 2)?;
    let want = reference(&data, &shape, &[3, 2, 5], |i| vec![i[0], i[1] + 1, i[2]]);
    check(&v, &[3, 2, 5], &want, "narrow")?;

    let v = x.slice(&[1..3, 0..4, 2..5])?;
    let want = reference(&data, &shape, &[2, 4, 3], |i| {
        vec![i[0] + 1, i[1], i[2] + 2]
    });
    check(&v, &[2, 4, 3], &want, "slice")?;

    let v = x.slice_axis(2, 3..)?;
    let want = reference(&data, &shape, &[3, 4, 2], |i| vec![i[0], i[1], i[2] + 3]);
    check(&v, &[3, 4, 2], &want, "slice_axis")?;

    let v = x.select(2, 4)?;
    let want = reference(&data, &shape, &[3, 4], |i| vec![i[0], i[1], 4]);
    check(&v, &[3, 4], &want, "select")?;

    let v = x.permute(&[2, 0, 1])?;
    let want = reference(&data, &shape, &[5, 3, 4], |i| vec![i[1], i[2], i[0]]);
    check(&v, &[5, 3, 4], &want, "permute")?;

    let v = x.transpose(0, 2)?;
    let want = reference(&data, &shape, &[5, 4, 3], |i| vec![i[2], i[1], i[0]]);
    check(&v, &[5, 4, 3], &want, "transpose")?;

    // A view of a view: the middle rows of the transpose, then one column of those.
    let v = x.transpose(0, 1)?.narrow(0, 1, 2)?.select(2, 3)?;
    let want = reference(&data, &shape, &[2, 3], |i| vec![i[1], i[0] + 1, 3]);
    check(&v, &[2, 3], &want, "transpose, narrow, select")?;

    let v = x.select(1, 2)?.unsqueeze(1)?.expand(&[2, 3, 4, 5])?;
    let want = reference(&data, &shape, &[2, 3, 4, 5], |i| vec![i[1], 2, i[3]]);
    check(&v, &[2, 3, 4, 5], &want, "select, unsqueeze, expand")?;

    let v = x.narrow(0, 2, 1)?.squeeze(0)?;
    let want = reference(&data, &shape, &[4, 5], |i| vec![2, i[0], i[1]]);
    check(&v, &[4, 5], &want, "narrow, squeeze")?;

    let v = x.unsqueeze(3)?.broadcast_to(&[3, 4, 5, 2])?;
    let want = reference(&data, &shape, &[3, 4, 5, 2], |i| vec![i[0], i[1], i[2]]);
    check(&v, &[3, 4, 5, 2], &want, "unsqueeze, broadcast_to")?;

    // Views without elements.
    let v = x.narrow(1, 4, 0)?;
    check(&v, &[3, 0, 5], &[], "empty narrow")?;
    let v = x.narrow(1, 4, 0)?.transpose(0, 2)?.select(0, 1)?;
    check(&v, &[0, 3], &[], "empty transposed select")?;
    Ok(())
}

test_cases! {
    views_f32 => every_view_reads_its_elements::<f32>(1),
    views_f64 => every_view_reads_its_elements::<f64>(2),
    views_f16 => every_view_reads_its_elements::<f16>(3),
    views_bf16 => every_view_reads_its_elements::<bf16>(4),
    views_i32 => every_view_reads_its_elements::<i32>(5),
    views_u8 => every_view_reads_its_elements::<u8>(6),
}

/// Kernels that read dense rows copy a view first: softmax, matmul, exp, rms_norm and
/// dup give on a view what they give on its dense copy.
fn kernels_read_views_as_their_copies<T: Float + cuflow_runtime::GemmElem>(
    seed: u64,
) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let data: Vec<T> = random(&mut rng, 6 * 40);
    let x = upload(&s, &data, &[6, 40]);
    let wdata: Vec<T> = random(&mut rng, 6);
    let w = upload(&s, &wdata, &[6]);
    let view = x.transpose(0, 1)?; // [40, 6], not contiguous
    let dense = kernels::contiguous(&view).sync_on(&s)?;
    let pairs: [(&str, Tensor<T>, Tensor<T>); 5] = [
        (
            "softmax",
            kernels::softmax(&view).sync_on(&s)?,
            kernels::softmax(&dense).sync_on(&s)?,
        ),
        (
            "matmul",
            kernels::matmul(&view, &x).sync_on(&s)?,
            kernels::matmul(&dense, &x).sync_on(&s)?,
        ),
        (
            "exp",
            kernels::exp(&view).sync_on(&s)?,
            kernels::exp(&dense).sync_on(&s)?,
        ),
        (
            "rms_norm",
            kernels::rms_norm(&view, &w, 1e-5).sync_on(&s)?,
            kernels::rms_norm(&dense, &w, 1e-5).sync_on(&s)?,
        ),
        ("dup", api::dup(&view).sync_on(&s)?, dense.clone()),
    ];
    for (what, got, want) in pairs {
        assert_eq!(got.shape(), want.shape(), "{what}");
        let want: Vec<f64> = read(&want).iter().map(|v| v.to_f64()).collect();
        assert_dtype_close(&read(&got), &want, 0.0, what);
    }
    // A contiguous view with an offset goes to kernels without a copy, from its first row.
    let rows = x.narrow(0, 2, 3)?;
    assert!(rows.is_contiguous());
    let got = read(&kernels::exp(&rows).sync_on(&s)?);
    let want: Vec<f64> = data[80..200].iter().map(|v| v.to_f64().exp()).collect();
    assert_dtype_close(&got, &want, T::TRANS_TOL, "exp of rows 2..5");
    Ok(())
}

test_cases! {
    kernels_on_views_f32 => kernels_read_views_as_their_copies::<f32>(7),
    kernels_on_views_f64 => kernels_read_views_as_their_copies::<f64>(8),
    kernels_on_views_f16 => kernels_read_views_as_their_copies::<f16>(9),
}

/// A write through a contiguous view changes the base tensor's elements in that range only,
/// after the reads of the base enqueued before it, and before the reads after it.
#[test]
fn writes_through_a_view_are_ordered_with_the_base() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(10);
    let data: Vec<f32> = random(&mut rng, 4 * 8);
    let base = upload(&s, &data, &[4, 8]);
    let fresh: Vec<f32> = random(&mut rng, 2 * 8);
    let src = upload(&s, &fresh, &[2, 8]);

    // Read the base (lazily, in one op with the write), then write rows 1..3 through a view,
    // then read the base again.
    let before = kernels::exp(&base);
    let mut rows = base.narrow(0, 1, 2)?;
    let (before, ()) = cuflow_device_op::zip!(before, api::memcpy(&mut rows, &src)).sync_on(&s)?;
    let after = kernels::exp(&base).sync_on(&s)?;

    let mut want: Vec<f32> = data.clone();
    want[8..24].copy_from_slice(&fresh);
    assert_exact(&read(&base), &want, "base after the write");
    let exp = |v: &[f32]| v.iter().map(|x| f64::from(*x).exp()).collect::<Vec<_>>();
    assert_dtype_close(&read(&before), &exp(&data), f32::TRANS_TOL, "read before");
    assert_dtype_close(&read(&after), &exp(&want), f32::TRANS_TOL, "read after");
    Ok(())
}

/// memcpy refuses overlapping ranges of one buffer (the result would depend on the copy's
/// order), and copies between disjoint views of one buffer.
#[test]
fn memcpy_between_views_of_one_buffer() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(12);
    let data: Vec<f32> = random(&mut rng, 4 * 3);
    let base = upload(&s, &data, &[4, 3]);
    let mut dst = base.narrow(0, 1, 2)?;
    let err = api::memcpy(&mut dst, base.narrow(0, 0, 2)?)
        .sync_on(&s)
        .unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "memcpy", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("overlap"), "{err}");
    assert_exact(&read(&base), &data, "base after a refused copy");
    let mut col = base.narrow(1, 0, 1)?;
    let err = api::memcpy(&mut col, api::zeros::<f32>(&[4, 1]))
        .sync_on(&s)
        .unwrap_err();
    assert!(
        err.to_string().contains("destination must be contiguous"),
        "{err}"
    );
    assert_exact(&read(&base), &data, "base after a refused copy");
    let mut dst = base.narrow(0, 2, 2)?;
    api::memcpy(&mut dst, base.narrow(0, 0, 2)?).sync_on(&s)?;
    let mut want = data.clone();
    want.copy_within(0..6, 6);
    assert_exact(&read(&base), &want, "rows 0..2 copied over rows 2..4");
    Ok(())
}

/// Saxpy writes into a contiguous view in place; a strided output is refused, untouched.
#[test]
fn in_place_kernels_write_contiguous_views_only() -> Result<(), DeviceError> {
    let s = stream();
    let mut base = api::full(&[4, 6], 1.0f32).sync_on(&s)?;
    let x = api::full(&[2, 6], 3.0f32).sync_on(&s)?;
    let mut rows = base.narrow(0, 2, 2)?;
    kernels::saxpy((&mut rows).partition([1, 6]), 2.0, &x).sync_on(&s)?;
    let mut want = vec![1.0f32; 24];
    want[12..].fill(7.0);
    assert_exact(&read(&base), &want, "saxpy into rows 2..4");

    let mut cols = base.narrow(1, 0, 2)?;
    let x = api::ones::<f32>(&[4, 2]).sync_on(&s)?;
    let err = kernels::saxpy((&mut cols).partition([4, 2]), 2.0, &x)
        .sync_on(&s)
        .unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "saxpy", .. }),
        "{err}"
    );
    // Writing into a copy would leave the base unchanged: the advice is a dense output.
    let text = err.to_string();
    assert!(
        text.contains("output") && text.contains("contiguous"),
        "{text}"
    );
    assert!(!text.contains("dense copy"), "{text}");
    assert_exact(&read(&base), &want, "base after a refused write");
    let mut spread = x.narrow(0, 0, 1)?.expand(&[4, 2])?;
    let err = kernels::saxpy((&mut spread).partition([4, 2]), 2.0, &x)
        .sync_on(&s)
        .unwrap_err();
    assert!(err.to_string().contains("output"), "{err}");

    // Rows 1..3 of [4, 6] f32 start 24 bytes in: kernels write 16-byte vectors, so such an
    // output is refused; as an input it is copied first.
    let mut rows = base.narrow(0, 1, 2)?;
    assert!(rows.is_contiguous());
    let x = api::full(&[2, 6], 3.0f32).sync_on(&s)?;
    let err = kernels::saxpy((&mut rows).partition([1, 6]), 2.0, &x)
        .sync_on(&s)
        .unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "saxpy", .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("16-byte") && text.contains("memcpy"),
        "{text}"
    );
    let got = read(&kernels::mul_scalar(&rows, 2.0).sync_on(&s)?);
    let doubled: Vec<f32> = want[6..18].iter().map(|v| v * 2.0).collect();
    assert_exact(&got, &doubled, "a misaligned view read through a copy");
    let copy = kernels::contiguous(&rows).sync_on(&s)?;
    assert_eq!(copy.offset(), 0, "contiguous() copies a misaligned view");
    assert_exact(&read(&base), &want, "base after a refused write");

    // Rows that overlap the rows written are read as they were before the kernel (copied
    // first, as a misaligned view is), so that no block reads an element another one wrote.
    let wide = api::arange::<f32>(0.0, 32.0, 1.0)
        .sync_on(&s)?
        .reshape(&[4, 8])?;
    let mut rows = wide.narrow(0, 1, 2)?;
    let above = wide.narrow(0, 0, 2)?;
    kernels::saxpy((&mut rows).partition([1, 8]), 2.0, &above).sync_on(&s)?;
    let mut overlapped: Vec<f32> = (0..32).map(|v| v as f32).collect();
    for (i, v) in overlapped[8..24].iter_mut().enumerate() {
        *v += 2.0 * i as f32;
    }
    assert_exact(&read(&wide), &overlapped, "rows 1..3 plus twice rows 0..2");
    let _ = &mut base;
    Ok(())
}

/// A user kernel gets contiguous tensors only: a strided input is refused (not copied behind
/// its back), its contiguous copy is accepted.
#[test]
fn launch_refuses_strided_inputs() -> Result<(), DeviceError> {
    let s = stream();
    let kernel = cuflow_testing::kernels::launch_copy();
    let x = api::arange::<f32>(0.0, 16.0, 1.0)
        .sync_on(&s)?
        .reshape(&[4, 4])?;
    let mut out = api::zeros::<f32>(&[16]).sync_on(&s)?;
    let t = x.transpose(0, 1)?;
    let err = Launch::new(kernel, (&mut out).partition([16]))
        .input(&t)
        .sync_on(&s)
        .unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "Launch", .. }),
        "{err}"
    );
    let dense = kernels::contiguous(&t).sync_on(&s)?;
    Launch::new(kernel, (&mut out).partition([16]))
        .input(&dense)
        .sync_on(&s)?;
    let want: Vec<f32> = (0..16).map(|i| ((i % 4) * 4 + i / 4) as f32).collect();
    assert_exact(&read(&out), &want, "copy of the transpose");
    let _: &Kernel = kernel;
    Ok(())
}

/// A decode kernel (which allocates nothing, so cannot copy) refuses a strided input and
/// leaves its output alone; a contiguous view of rows is read from its first row.
#[test]
fn decode_kernels_refuse_strided_views() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(11);
    let data: Vec<f32> = random(&mut rng, 6 * 8);
    let gate_up = upload(&s, &data, &[6, 8]);
    let mut out = api::full(&[2, 4], 9.0f32).sync_on(&s)?;
    let view = gate_up.transpose(0, 1)?.narrow(0, 0, 2)?.transpose(0, 1)?; // [6, 2], strided
    let mut small = api::full(&[6, 1], 9.0f32).sync_on(&s)?;
    let err = kernels::decode::silu_mul(&mut small, &view)
        .sync_on(&s)
        .unwrap_err();
    assert!(matches!(err, DeviceError::InvalidShape { .. }), "{err}");
    assert!(err.to_string().contains("contiguous"), "{err}");
    assert_exact(&read(&small), &[9.0; 6], "output after a refused launch");

    let rows = gate_up.narrow(0, 4, 2)?; // contiguous, from row 4
    kernels::decode::silu_mul(&mut out, &rows).sync_on(&s)?;
    let want: Vec<f64> = (0..8)
        .map(|k| {
            let (r, i) = (4 + k / 4, k % 4);
            let (g, u) = (f64::from(data[r * 8 + i]), f64::from(data[r * 8 + 4 + i]));
            g / (1.0 + (-g).exp()) * u
        })
        .collect();
    assert_dtype_close(&read(&out), &want, f32::TRANS_TOL, "silu_mul of rows 4..6");
    Ok(())
}

/// Joining, indexing, mixed-precision matmul, casting and printing take views as they take
/// their dense copies; `reinterpret` (which shares memory) refuses a view.
#[test]
fn other_ops_take_views_as_their_copies() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(13);
    let data: Vec<f32> = random(&mut rng, 4 * 6);
    let x = upload(&s, &data, &[4, 6]);
    let t = x.transpose(0, 1)?; // [6, 4], strided
    let d = kernels::contiguous(&t).sync_on(&s)?;
    let idx = api::from_vec(vec![3u32, 0, 5], &[3]).sync_on(&s)?;
    let pairs: Vec<(&str, Tensor<f32>, Tensor<f32>)> = vec![
        (
            "concat",
            kernels::concat(vec![&t, &d], 1).sync_on(&s)?,
            kernels::concat(vec![&d, &d], 1).sync_on(&s)?,
        ),
        (
            "stack",
            kernels::stack(vec![&t, &d], 0).sync_on(&s)?,
            kernels::stack(vec![&d, &d], 0).sync_on(&s)?,
        ),
        (
            "index_select",
            kernels::index_select(&t, 0, &idx).sync_on(&s)?,
            kernels::index_select(&d, 0, &idx).sync_on(&s)?,
        ),
        (
            "matmul_f32",
            kernels::matmul_f32(&t, &x).sync_on(&s)?,
            kernels::matmul_f32(&d, &x).sync_on(&s)?,
        ),
        ("cast", api::cast::<f32, f32, _>(&t).sync_on(&s)?, d.clone()),
    ];
    for (what, got, want) in pairs {
        assert_eq!(got.shape(), want.shape(), "{what}");
        assert_exact(&read(&got), &read(&want), what);
    }
    assert_eq!(format!("{t}"), format!("{d}"), "printing a view");
    let err = t.reinterpret::<u32>().unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::InvalidShape {
                op: "reinterpret",
                ..
            }
        ),
        "{err}"
    );
    Ok(())
}

/// Bad axes and ranges are refused with the axis named.
#[test]
fn bad_axes_and_ranges_name_the_axis() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::zeros::<f32>(&[2, 3]).sync_on(&s)?;
    type Case = (Result<Tensor<f32>, DeviceError>, &'static str, &'static str);
    let cases: Vec<Case> = vec![
        (x.narrow(2, 0, 1), "narrow", "axis 2"),
        (x.narrow(1, 2, 2), "narrow", "axis 1"),
        (x.slice(&[0..1, 0..1, 0..1]), "slice", "axis 2"),
        (x.select(0, 2), "select", "axis 0"),
        (x.permute(&[0, 0]), "permute", "axis 0"),
        (x.permute(&[1, 2]), "permute", "axis 2"),
        (x.transpose(0, 5), "transpose", "axis 5"),
        (x.expand(&[4, 3, 3]), "expand", "axis 1"),
        (x.squeeze(1), "squeeze", "axis 1"),
        (x.unsqueeze(3), "unsqueeze", "axis 3"),
    ];
    for (r, op, axis) in cases {
        let err = r.unwrap_err();
        assert!(
            matches!(err, DeviceError::InvalidShape { op: o, .. } if o == op),
            "{op}: {err}"
        );
        assert!(err.to_string().contains(axis), "{op}: {err}");
    }
    // Reshape needs a contiguous tensor.
    let err = x.transpose(0, 1)?.reshape(&[6]).unwrap_err();
    assert!(err.to_string().contains("contiguous"), "{err}");
    Ok(())
}

/// A view's error names the method called: `slice` and `slice_axis` said `narrow`, and
/// `broadcast_to` said `expand`.
#[test]
fn view_errors_name_the_method_called() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::zeros::<f32>(&[2, 3]).sync_on(&s)?;
    type Case = (Result<Tensor<f32>, DeviceError>, &'static str);
    #[allow(clippy::reversed_empty_ranges)]
    let cases: Vec<Case> = vec![
        (x.slice(&[0..2, 2..1]), "slice"),
        (x.slice(&[0..3, 0..1]), "slice"),
        (x.slice_axis(1, 1..5), "slice_axis"),
        (x.slice_axis(2, ..), "slice_axis"),
        (x.narrow(1, 2, 2), "narrow"),
        (x.broadcast_to(&[4, 3, 3]), "broadcast_to"),
        (x.broadcast_to(&[3]), "broadcast_to"),
        (x.expand(&[4, 3, 3]), "expand"),
    ];
    assert_each_refused_naming(cases);
    Ok(())
}

/// Asserts that each result is an `InvalidShape` naming the method beside it.
#[track_caller]
fn assert_each_refused_naming<T: std::fmt::Debug>(cases: Vec<(Result<T, DeviceError>, &str)>) {
    for (r, op) in cases {
        let err = r.unwrap_err();
        assert!(
            matches!(err, DeviceError::InvalidShape { op: o, .. } if o == op),
            "{op}: {err}"
        );
    }
}

/// The view methods of lazy ops name the method called as the tensor's do: `broadcast_to` on
/// an op said "expand".
#[test]
fn lazy_view_errors_name_the_method_called() -> Result<(), DeviceError> {
    use cuflow_tensor::TensorMethodsExt;
    let s = stream();
    let x = || api::zeros::<f32>(&[2, 3]);
    let cases = vec![
        (x().broadcast_to([4, 3, 3]).sync_on(&s), "broadcast_to"),
        (x().broadcast_to([3]).sync_on(&s), "broadcast_to"),
        (x().expand([4, 3, 3]).sync_on(&s), "expand"),
        (x().narrow(1, 2, 2).sync_on(&s), "narrow"),
        (x().slice_axis(1, 1..5).sync_on(&s), "slice_axis"),
        (x().select(0, 2).sync_on(&s), "select"),
        (x().permute([0, 0]).sync_on(&s), "permute"),
        (x().transpose(0, 2).sync_on(&s), "transpose"),
        (x().squeeze(1).sync_on(&s), "squeeze"),
        (x().unsqueeze(3).sync_on(&s), "unsqueeze"),
    ];
    assert_each_refused_naming(cases);
    Ok(())
}

/// Views of a tensor without elements never step past the address space: after a narrow near
/// the end of an axis of `usize::MAX` elements, viewed whole again, every view method gives an
/// empty view (which starts at element 0) instead of overflowing its offset.
#[test]
fn views_without_elements_never_overflow_their_offset() -> Result<(), DeviceError> {
    let s = stream();
    let empty = api::zeros::<f32>(&[0, usize::MAX]).sync_on(&s)?;
    let far = empty
        .narrow(1, usize::MAX - 1, 1)?
        .reshape(&[0, usize::MAX])?;
    let views: Vec<(&str, Result<Tensor<f32>, DeviceError>)> = vec![
        ("narrow", far.narrow(1, 2, 1)),
        ("slice_axis", far.slice_axis(1, usize::MAX - 1..)),
        ("slice", far.slice(&[0..0, 3..usize::MAX])),
        ("select", far.select(1, usize::MAX - 1)),
        (
            "transpose",
            far.transpose(0, 1).and_then(|t| t.narrow(0, 5, 1)),
        ),
        ("permute", far.permute(&[1, 0]).and_then(|t| t.select(0, 7))),
        (
            "unsqueeze",
            far.unsqueeze(2).and_then(|t| t.narrow(1, 9, 2)),
        ),
        (
            "squeeze",
            far.unsqueeze(0)
                .and_then(|t| t.squeeze(0))
                .and_then(|t| t.select(1, 3)),
        ),
        (
            "expand",
            far.narrow(1, usize::MAX - 1, 1)
                .and_then(|t| t.expand(&[0, 5]))
                .and_then(|t| t.narrow(1, 3, 1)),
        ),
    ];
    for (op, view) in views {
        let view = view?;
        assert!(view.is_empty(), "{op}: {:?}", view.shape());
        assert_eq!(
            view.offset(),
            0,
            "{op}: a view without elements starts at 0"
        );
        assert_eq!(view.to_host_vec()?, Vec::<f32>::new(), "{op}");
    }
    Ok(())
}

/// A view of more axes than the strided kernel indexes (none of them mergeable) is still
/// copied densely, and every kind of kernel takes it: those that read dense rows, the axis
/// reductions and the strided elementwise kernels.
#[test]
fn views_of_more_than_eight_unmergeable_axes_are_copied() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(21);
    for (shape, order) in [
        (
            vec![2usize, 3, 2, 2, 3, 2, 2, 2, 3],
            vec![8usize, 7, 6, 5, 4, 3, 2, 1, 0],
        ),
        (
            vec![3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
            vec![10, 0, 9, 1, 8, 2, 7, 3, 6, 4, 5],
        ),
    ] {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = random(&mut rng, n);
        let base = upload(&s, &data, &shape);
        let out: Vec<usize> = order.iter().map(|&a| shape[a]).collect();
        let view = base.permute(&order)?;
        let want = reference(&data, &shape, &out, |idx| {
            let mut b = vec![0; shape.len()];
            for (k, &a) in order.iter().enumerate() {
                b[a] = idx[k];
            }
            b
        });
        check(&view, &out, &want, &format!("permute {order:?}"))?;
        let relu = read(&kernels::relu(&view).sync_on(&s)?);
        let want_relu: Vec<f32> = want.iter().map(|v| v.max(0.0)).collect();
        assert_exact(&relu, &want_relu, "relu of the view");
        // Summed over its first axis, the view leaves more axes than the reduction indexes.
        let sum = read(&kernels::sum_axis(&view, 0, false).sync_on(&s)?);
        let inner = n / out[0];
        let want_sum: Vec<f64> = (0..inner)
            .map(|j| (0..out[0]).map(|i| f64::from(want[i * inner + j])).sum())
            .collect();
        assert_dtype_close(
            &sum,
            &want_sum,
            f32::TRANS_TOL,
            "sum over axis 0 of the view",
        );
        // The strided kernels read it from a dense copy.
        let doubled = read(&kernels::add(&view, &view).sync_on(&s)?);
        let want_doubled: Vec<f32> = want.iter().map(|v| v + v).collect();
        assert_exact(&doubled, &want_doubled, "the view added to itself");
        let zero = api::zeros::<f32>(&[1]).sync_on(&s)?;
        let mask = kernels::gt(&view, &zero).sync_on(&s)?;
        let want_mask: Vec<u8> = want.iter().map(|v| u8::from(*v > 0.0)).collect();
        assert_exact(&read(&mask), &want_mask, "the view compared with 0");
        let kept = read(&kernels::where_(&mask, &view, &zero).sync_on(&s)?);
        assert_exact(&kept, &want_relu, "where over the view");
        let clamped = read(&kernels::clamp(&view, -0.5, 0.5).sync_on(&s)?);
        let want_clamped: Vec<f32> = want.iter().map(|v| v.clamp(-0.5, 0.5)).collect();
        assert_exact(&clamped, &want_clamped, "the view clamped");
    }
    Ok(())
}

/// Such a view under thousands of axes of length 1 (a view may have any rank): copying it
/// walks its merged axes, of which there are at most 64, not its axes one by one. The copy
/// recursed once per leading axis, so a few hundred axes of length 1 overflowed a test
/// thread's stack (an abort, not an error).
#[test]
fn views_of_unmergeable_axes_under_thousands_of_unit_axes_are_copied() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(22);
    let shape = [2usize, 3, 2, 2, 3, 2, 2, 2, 3];
    let order = [8usize, 7, 6, 5, 4, 3, 2, 1, 0];
    let n: usize = shape.iter().product();
    let data: Vec<f32> = random(&mut rng, n);
    let view = upload(&s, &data, &shape).permute(&order)?;
    let out: Vec<usize> = order.iter().map(|&a| shape[a]).collect();
    let want = reference(&data, &shape, &out, |idx| {
        let mut b = vec![0; shape.len()];
        for (k, &a) in order.iter().enumerate() {
            b[a] = idx[k];
        }
        b
    });
    let mut tall = vec![1usize; 10_000];
    tall.extend(&out);
    let view = view.expand(&tall)?;
    check(&view, &tall, &want, "the view under 10000 unit axes")?;
    // Over a unit axis, the reduction leaves nine unmergeable axes: it reads a dense copy.
    let sum = read(&kernels::sum_axis(&view, 0, false).sync_on(&s)?);
    assert_exact(&sum, &want, "the sum over a unit axis");
    let relu = read(&kernels::relu(&view).sync_on(&s)?);
    let want_relu: Vec<f32> = want.iter().map(|v| v.max(0.0)).collect();
    assert_exact(&relu, &want_relu, "relu of the view");
    let doubled = read(&kernels::add(&view, &view).sync_on(&s)?);
    let want_doubled: Vec<f32> = want.iter().map(|v| v + v).collect();
    assert_exact(&doubled, &want_doubled, "the view added to itself");
    Ok(())
}

/// Two overlapping row views of one buffer, written in place from two threads on two
/// streams at once: every read-modify-write of the shared rows is ordered, none is lost.
#[test]
fn overlapping_views_written_on_two_streams_lose_no_update() -> Result<(), DeviceError> {
    let s = stream();
    let base = api::zeros::<f32>(&[6, 8]).sync_on(&s)?;
    let rounds = 40;
    let mut rng = seeded_rng(22);
    let steps: Vec<f32> = uniform(&mut rng, 2, 1.0, 2.0);
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        let workers: Vec<_> = [(0, steps[0]), (2, steps[1])]
            .into_iter()
            .map(|(first, a)| {
                let mut rows = base.narrow(0, first, 4)?;
                let stream = rows.device().new_stream()?;
                Ok(scope.spawn(move || -> Result<(), DeviceError> {
                    let x = api::ones::<f32>(&[4, 8]).sync_on(&stream)?;
                    for _ in 0..rounds {
                        kernels::saxpy((&mut rows).partition([1, 8]), a, &x).sync_on(&stream)?;
                    }
                    Ok(())
                }))
            })
            .collect::<Result<_, DeviceError>>()?;
        for w in workers {
            w.join().expect("worker thread")?;
        }
        Ok(())
    })?;
    let (a, b) = (f64::from(steps[0]), f64::from(steps[1]));
    let want: Vec<f64> = (0..6)
        .flat_map(|r| {
            let v = rounds as f64 * (if r < 4 { a } else { 0.0 } + if r >= 2 { b } else { 0.0 });
            [v; 8]
        })
        .collect();
    assert_dtype_close(&read(&base), &want, 1e-5, "rows after both writers");
    Ok(())
}

/// Two tensors sharing memory through `reinterpret` are two buffers of one allocation: a
/// memcpy between overlapping ranges of them is refused like one within a single tensor.
#[test]
fn memcpy_between_overlapping_reinterpreted_tensors_is_refused() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(23);
    let data: Vec<f32> = random(&mut rng, 4 * 4);
    let base = upload(&s, &data, &[4, 4]);
    let (a, b) = (base.reinterpret::<u32>()?, base.reinterpret::<u32>()?);
    let mut dst = a.narrow(0, 1, 2)?;
    let err = api::memcpy(&mut dst, b.narrow(0, 0, 2)?)
        .sync_on(&s)
        .unwrap_err();
    assert!(err.to_string().contains("overlap"), "{err}");
    assert_exact(&read(&base), &data, "base after a refused copy");
    let mut dst = a.narrow(0, 2, 2)?;
    api::memcpy(&mut dst, b.narrow(0, 0, 2)?).sync_on(&s)?;
    let mut want = data.clone();
    want.copy_within(0..8, 8);
    assert_exact(&read(&base), &want, "rows 0..2 copied over rows 2..4");
    Ok(())
}

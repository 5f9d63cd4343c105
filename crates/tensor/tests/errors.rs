//! Errors are values returned when the op runs, naming the operation and the shapes: shape
//! mismatches, wrong lengths, bad steps, bad reshapes and partitions that do not tile the
//! tensor. A failed kernel leaves its output as it was.
//!
//! A device mismatch needs two devices of which one is not the host; it is not tested here.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, kernels, PartitionExt, ReshapeOpExt, Tensor};
use cuflow_testing::{device::stream, tensor::*};

/// Asserts that `err` is a shape mismatch of `op` between `lhs` and `rhs`, and that its message
/// names them.
#[track_caller]
fn assert_shape_mismatch(err: DeviceError, op: &str, lhs: &[usize], rhs: &[usize]) {
    let msg = err.to_string();
    match err {
        DeviceError::ShapeMismatch {
            op: o,
            what,
            lhs: l,
            rhs: r,
            ..
        } => {
            assert_eq!((o, &l[..], &r[..]), (op, lhs, rhs), "{msg}");
            assert!(!what.is_empty() && msg.contains(&what), "{msg}");
        }
        other => panic!("expected a shape mismatch in {op}, got {other:?}"),
    }
    for part in [op.to_string(), format!("{lhs:?}"), format!("{rhs:?}")] {
        assert!(msg.contains(&part), "{msg:?} does not mention {part}");
    }
}

/// Asserts that `err` is an invalid shape in `op`, and returns its message.
#[track_caller]
fn assert_invalid_shape(err: DeviceError, op: &str) -> String {
    let msg = err.to_string();
    match err {
        DeviceError::InvalidShape { op: o, .. } => assert_eq!(o, op, "{msg}"),
        other => panic!("expected an invalid shape in {op}, got {other:?}"),
    }
    assert!(msg.contains(op), "{msg:?} does not name {op}");
    msg
}

#[test]
fn binary_kernels_name_themselves_and_both_shapes() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::ones::<f32>(&[2, 3]).sync_on(&s)?;
    let y = api::ones::<f32>(&[3, 2]).sync_on(&s)?;
    let err = kernels::add(&x, &y).sync_on(&s).unwrap_err();
    assert_shape_mismatch(err, "add", &[2, 3], &[3, 2]);
    let err = kernels::sub(&x, &y).sync_on(&s).unwrap_err();
    assert_shape_mismatch(err, "sub", &[2, 3], &[3, 2]);
    let err = kernels::mul(&y, &x).sync_on(&s).unwrap_err();
    assert_shape_mismatch(err, "mul", &[3, 2], &[2, 3]);
    let err = kernels::div(&x, &y).sync_on(&s).unwrap_err();
    assert_shape_mismatch(err, "div", &[2, 3], &[3, 2]);
    Ok(())
}

#[test]
fn shapes_that_do_not_broadcast_are_refused_naming_the_axis() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::ones::<f32>(&[2, 3]).sync_on(&s)?;
    // Aligned at the last axis: 2 against 3, 4 against 3, and [4, 3] against [2, 3] on axis 0.
    for (shape, axis) in [(&[2][..], 1), (&[4], 1), (&[4, 3], 0), (&[5, 4, 1], 1)] {
        let y = api::ones::<f32>(shape).sync_on(&s)?;
        let err = kernels::add(&x, &y).sync_on(&s).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&format!("axis {axis}")), "{text}");
        assert_shape_mismatch(err, "add", &[2, 3], shape);
    }
    Ok(())
}

#[test]
fn saxpy_needs_matching_shapes_and_leaves_the_output_alone() -> Result<(), DeviceError> {
    let s = stream();
    let mut z = api::full(&[4, 4], 9.0f32).sync_on(&s)?;
    let x = api::ones::<f32>(&[4, 5]).sync_on(&s)?;
    let err = kernels::saxpy((&mut z).partition([2, 2]), 1.0, &x)
        .sync_on(&s)
        .unwrap_err();
    assert_shape_mismatch(err, "saxpy", &[4, 4], &[4, 5]);
    assert_eq!(read(&z), vec![9.0; 16]);
    Ok(())
}

/// Asserts that saxpy over `shape` in tiles of `tile` fails with an invalid partition that
/// names saxpy, and leaves the output as it was.
fn bad_partition<const N: usize>(shape: &[usize], tile: [usize; N]) -> Result<(), DeviceError> {
    let s = stream();
    let mut z = api::full(shape, 9.0f32).sync_on(&s)?;
    let x = api::ones::<f32>(shape).sync_on(&s)?;
    let err = kernels::saxpy((&mut z).partition(tile), 1.0, &x)
        .sync_on(&s)
        .unwrap_err();
    let msg = err.to_string();
    match err {
        DeviceError::InvalidPartition { op, .. } => assert_eq!(op, "saxpy"),
        other => {
            panic!("tile {tile:?} over {shape:?}: expected an invalid partition, got {other:?}")
        }
    }
    assert!(
        msg.contains("saxpy") && msg.contains(&format!("{tile:?}")),
        "{msg}"
    );
    assert_eq!(
        read(&z),
        vec![9.0; numel(shape)],
        "tile {tile:?} over {shape:?}"
    );

    // Owned, the same.
    let z = api::full(shape, 9.0f32).sync_on(&s)?;
    let err = kernels::saxpy(z.partition(tile), 1.0, x)
        .sync_on(&s)
        .unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidPartition { op: "saxpy", .. }),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn a_tile_must_divide_the_tensor() -> Result<(), DeviceError> {
    bad_partition(&[16, 16], [5, 4])?;
    bad_partition(&[16, 16], [4, 3])?;
    bad_partition(&[3, 4097], [1, 4096])?;
    bad_partition(&[64], [7])?;
    // Larger than the tensor.
    bad_partition(&[6, 7], [12, 7])
}

#[test]
fn a_tile_must_have_the_tensor_rank() -> Result<(), DeviceError> {
    bad_partition(&[16, 16], [4])?;
    bad_partition(&[16, 16], [4, 4, 1])?;
    bad_partition(&[64], [8, 8])
}

#[test]
fn a_tile_must_not_be_empty() -> Result<(), DeviceError> {
    bad_partition(&[16, 16], [0, 4])?;
    bad_partition(&[16, 16], [4, 0])?;
    bad_partition(&[64], [0])
}

/// A tile with an axis of length 0 is refused for that reason: over an empty axis the error
/// said "0 is not a multiple of 0", which is false (0 = 0 · 0) and hid the fix.
#[test]
fn an_empty_tile_is_refused_as_empty() -> Result<(), DeviceError> {
    bad_partition(&[0, 4], [0, 4])?;
    let s = stream();
    for (shape, tile) in [([0usize, 4], [0usize, 4]), ([16, 16], [4, 0])] {
        let mut z = api::zeros::<f32>(&shape).sync_on(&s)?;
        let x = api::ones::<f32>(&shape).sync_on(&s)?;
        let msg = kernels::saxpy((&mut z).partition(tile), 1.0, &x)
            .sync_on(&s)
            .unwrap_err()
            .to_string();
        assert!(
            !msg.contains("multiple of 0")
                && msg.contains("length 0")
                && msg.contains("axis 1") == (tile[1] == 0),
            "tile {tile:?} over {shape:?}: {msg}"
        );
        // Only a tensor with an empty axis is called empty (a [16, 16] one was).
        assert_eq!(
            msg.contains("empty tensor"),
            shape.contains(&0),
            "tile {tile:?} over {shape:?}: {msg}"
        );
    }
    // What the message suggests for an empty tensor: tiles of length 1 along its empty axes.
    let mut z = api::zeros::<f32>(&[0, 4]).sync_on(&s)?;
    let x = api::ones::<f32>(&[0, 4]).sync_on(&s)?;
    kernels::saxpy((&mut z).partition([1, 4]), 1.0, &x).sync_on(&s)?;
    Ok(())
}

#[test]
fn a_tile_must_keep_middle_axes_whole() -> Result<(), DeviceError> {
    bad_partition(&[4, 3, 8], [2, 1, 4])?;
    bad_partition(&[4, 6, 8], [4, 3, 8])?;
    bad_partition(&[2, 2, 3, 10], [1, 2, 1, 5])
}

#[test]
fn from_vec_needs_the_element_count_of_its_shape() -> Result<(), DeviceError> {
    let s = stream();
    let err = api::from_vec(vec![1.0f32; 5], &[2, 3])
        .sync_on(&s)
        .unwrap_err();
    let msg = assert_invalid_shape(err, "from_vec");
    assert!(
        msg.contains("[2, 3]") && msg.contains('6') && msg.contains('5'),
        "{msg}"
    );
    let data = [1u8; 7];
    let err = api::from_slice(&data, &[8]).sync_on(&s).unwrap_err();
    assert_invalid_shape(err, "from_vec");
    let err = api::from_vec(Vec::<i32>::new(), &[1])
        .sync_on(&s)
        .unwrap_err();
    assert_invalid_shape(err, "from_vec");
    Ok(())
}

#[test]
fn arange_needs_a_finite_nonzero_step() -> Result<(), DeviceError> {
    let s = stream();
    for (start, end, step) in [
        (0.0, 10.0, 0.0),
        (0.0, 10.0, -0.0),
        (0.0, 10.0, f64::NAN),
        (0.0, 10.0, f64::INFINITY),
        (0.0, f64::INFINITY, 1.0),
        (f64::NAN, 1.0, 1.0),
    ] {
        let err = api::arange::<f32>(start, end, step)
            .sync_on(&s)
            .unwrap_err();
        assert_invalid_shape(err, "arange");
    }
    // The reason names what is wrong: the bound that is not finite, or a count too large.
    let err = api::arange::<f32>(0.0, f64::NAN, 1.0)
        .sync_on(&s)
        .unwrap_err();
    let text = assert_invalid_shape(err, "arange");
    assert!(text.contains("end") && text.contains("NaN"), "{text}");
    let err = api::arange::<f32>(0.0, 1e30, 1e-30)
        .sync_on(&s)
        .unwrap_err();
    let text = assert_invalid_shape(err, "arange");
    assert!(text.contains("values"), "{text}");
    Ok(())
}

#[test]
fn memcpy_needs_equal_shapes_and_leaves_the_destination_alone() -> Result<(), DeviceError> {
    let s = stream();
    let mut dst = api::full(&[4, 6], 9.0f32).sync_on(&s)?;
    let src = api::ones::<f32>(&[6, 4]).sync_on(&s)?;
    let err = api::memcpy(&mut dst, &src).sync_on(&s).unwrap_err();
    assert_shape_mismatch(err, "memcpy", &[4, 6], &[6, 4]);
    let err = api::memcpy(&mut dst, api::ones::<f32>(&[25]))
        .sync_on(&s)
        .unwrap_err();
    assert_shape_mismatch(err, "memcpy", &[4, 6], &[25]);
    assert_eq!(read(&dst), vec![9.0; 24]);
    Ok(())
}

#[test]
fn reshape_keeps_the_element_count() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::zeros::<f32>(&[3, 4]).sync_on(&s)?;
    let err = x.clone().reshape(&[5, 2]).unwrap_err();
    let msg = assert_invalid_shape(err, "reshape");
    assert!(msg.contains("[3, 4]") && msg.contains("[5, 2]"), "{msg}");
    let err = x.reshape(&[13]).unwrap_err();
    assert_invalid_shape(err, "reshape");
    // On an op: when it runs.
    let op = api::zeros::<f32>(&[3, 4]).reshape([2, 5]);
    assert_invalid_shape(op.sync_on(&s).unwrap_err(), "reshape");
    // An input's error is the kernel's error.
    let op = kernels::relu(api::ones::<f32>(&[6]).reshape([4]));
    assert_invalid_shape(op.sync_on(&s).unwrap_err(), "reshape");
    Ok(())
}

#[test]
fn an_input_error_stops_the_kernel() -> Result<(), DeviceError> {
    let s = stream();
    let bad = api::from_vec(vec![1.0f32; 3], &[2, 2]);
    let err = kernels::add(bad, api::ones::<f32>(&[2, 2]))
        .sync_on(&s)
        .unwrap_err();
    assert_invalid_shape(err, "from_vec");
    let err = kernels::add(api::ones::<f32>(&[2, 2]), api::arange::<f32>(0.0, 1.0, 0.0))
        .sync_on(&s)
        .unwrap_err();
    assert_invalid_shape(err, "arange");
    let mut z = api::full(&[4], 9.0f32).sync_on(&s)?;
    let err = kernels::saxpy(
        (&mut z).partition([2]),
        1.0,
        api::from_vec(vec![1.0f32; 5], &[4]),
    )
    .sync_on(&s)
    .unwrap_err();
    assert_invalid_shape(err, "from_vec");
    assert_eq!(read(&z), vec![9.0; 4]);
    // The stream stays usable.
    let t: Tensor<f32> = kernels::add_scalar(api::ones::<f32>(&[2]), 1.0).sync_on(&s)?;
    assert_eq!(read(&t), vec![2.0, 2.0]);
    Ok(())
}

#[test]
fn shapes_whose_sizes_overflow_are_invalid_shapes_not_panics() {
    let huge = 1usize << 40;
    // No elements, but strides past the address space.
    let err = api::zeros::<f32>(&[0, huge, huge])
        .sync_on(&stream())
        .expect_err("a shape whose strides overflow");
    assert_invalid_shape(err, "zeros");
    let err = api::from_vec::<f32>(Vec::new(), &[0, huge, huge])
        .sync_on(&stream())
        .expect_err("a shape whose strides overflow");
    assert!(matches!(err, DeviceError::InvalidShape { .. }), "{err:?}");
    // Too many elements.
    let err = api::zeros::<f32>(&[huge, huge])
        .sync_on(&stream())
        .expect_err("a shape of 2^80 elements");
    assert_invalid_shape(err, "zeros");
    // A reshape of an empty tensor to such a shape.
    let empty = api::zeros::<f32>(&[0])
        .sync_on(&stream())
        .expect("an empty tensor");
    let err = empty
        .reshape(&[huge, huge, 0])
        .and_then(|t| t.reshape(&[0, huge, huge]))
        .expect_err("a reshape whose strides overflow");
    assert_invalid_shape(err, "reshape");
    // Zero elements, but rows of 2^80 elements for the row kernels: refused at creation.
    let err = api::zeros::<f32>(&[huge, huge, 0])
        .sync_on(&stream())
        .expect_err("a shape whose rows overflow");
    assert_invalid_shape(err, "zeros");
    // Products of dimensions that fit are fine, zero-size axes included.
    let t = api::zeros::<f32>(&[huge, 0])
        .sync_on(&stream())
        .expect("[2^40, 0]");
    assert_eq!(
        kernels::scale(t, 2.0f32)
            .sync_on(&stream())
            .expect("scale")
            .len(),
        0
    );
}

/// An output or a copy too large for the address space is refused naming the function called,
/// not an internal step: constructors and `index_select` said `alloc`, and `concat`, `stack`
/// and kernels copying a huge expanded view said `DeviceBuffer::alloc` (of the copy of one
/// input, 2^63 elements, where the output holds 2^64).
#[test]
fn outputs_past_the_address_space_name_the_function_called() {
    let s = stream();
    let huge = 1usize << 40;
    let big = [usize::MAX, 2];
    let name = |r: Result<(), DeviceError>, op: &str| {
        let err = r.expect_err(op);
        assert_invalid_shape(err, op)
    };
    name(api::zeros::<f32>(&big).sync_on(&s).map(drop), "zeros");
    name(api::ones::<f32>(&big).sync_on(&s).map(drop), "ones");
    name(api::full(&big, 1.0f32).sync_on(&s).map(drop), "full");
    name(api::fill(&big, 1.0f32).sync_on(&s).map(drop), "fill");
    name(api::eye::<f32>(1 << 33).sync_on(&s).map(drop), "eye");
    name(
        api::eye_rect::<f32>(usize::MAX, 2).sync_on(&s).map(drop),
        "eye_rect",
    );
    name(
        api::rand::<f32>(0.0, 1.0, &big).sync_on(&s).map(drop),
        "rand",
    );
    name(
        api::randn::<f32>(0.0, 1.0, &big).sync_on(&s).map(drop),
        "randn",
    );
    // 2^62 f32 elements fit in usize, but not their bytes in the address space.
    name(api::zeros::<f32>(&[1 << 62]).sync_on(&s).map(drop), "zeros");
    let one = api::ones::<f32>(&[1, 1]).sync_on(&s).expect("a tensor");
    let wide = one
        .expand(&[huge, 1 << 23])
        .expect("a view of 2^63 elements");
    name(
        kernels::concat(vec![&wide, &wide], 0).sync_on(&s).map(drop),
        "concat",
    );
    name(
        kernels::stack(vec![&wide, &wide], 0).sync_on(&s).map(drop),
        "stack",
    );
    name(kernels::softmax(&wide).sync_on(&s).map(drop), "softmax");
    name(
        kernels::contiguous(&wide).sync_on(&s).map(drop),
        "contiguous",
    );
    name(api::dup(&wide).sync_on(&s).map(drop), "dup");
    let ids = api::zeros::<u32>(&[1])
        .sync_on(&s)
        .expect("an index")
        .expand(&[huge])
        .expect("a view");
    let table = one.expand(&[1, 1 << 24]).expect("a view");
    name(
        kernels::index_select(&table, 0, &ids).sync_on(&s).map(drop),
        "index_select",
    );
}

/// `where_` names its arguments: a `mask` that does not broadcast with `a` and `b` is named
/// with both their shapes (the shape it is compared with, their broadcast, is neither's), and
/// `a` and `b` that do not broadcast are named as such.
#[test]
fn where_names_the_arguments_that_do_not_broadcast() -> Result<(), DeviceError> {
    let s = stream();
    let mask = api::ones::<u8>(&[3]).sync_on(&s)?;
    let a = api::ones::<f32>(&[2, 1]).sync_on(&s)?;
    let b = api::zeros::<f32>(&[1, 4]).sync_on(&s)?;
    let err = kernels::where_(&mask, &a, &b).sync_on(&s).unwrap_err();
    let msg = err.to_string();
    assert_shape_mismatch(err, "where_", &[3], &[2, 4]);
    for part in ["`mask` [3]", "`a` [2, 1]", "`b` [1, 4]"] {
        assert!(msg.contains(part), "{msg:?} does not name {part}");
    }

    let mask = api::ones::<u8>(&[1]).sync_on(&s)?;
    let b = api::zeros::<f32>(&[3]).sync_on(&s)?;
    let a = api::ones::<f32>(&[2]).sync_on(&s)?;
    let err = kernels::where_(&mask, &a, &b).sync_on(&s).unwrap_err();
    let msg = err.to_string();
    assert_shape_mismatch(err, "where_", &[2], &[3]);
    for part in ["`a` [2]", "`b` [3]"] {
        assert!(msg.contains(part), "{msg:?} does not name {part}");
    }
    Ok(())
}

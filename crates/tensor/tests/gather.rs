//! `concat`, `stack`, `index_select` and `gather` against references computed on the host
//! by coordinates, on random data of several dtypes, every axis, zero-size axes and
//! out-of-range indices; and their shape errors, which name the axis.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16, kernels, DType, Tensor};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng;
use cuflow_testing::tensor::{numel, random, read, upload};
use rand::rngs::StdRng;
use rand::Rng;

/// The coordinates of flat index `k` in `shape` (row-major).
fn unravel(mut k: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = k % shape[d];
        k /= shape[d];
    }
    idx
}

/// The flat index of coordinates `idx` in `shape`.
fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (i, n)| acc * n + i)
}

fn random_tensor<T: DType>(rng: &mut StdRng, shape: &[usize]) -> (Vec<T>, Tensor<T>) {
    let data: Vec<T> = random(rng, numel(shape));
    let t = upload(&stream(), &data, shape);
    (data, t)
}

fn check_concat<T: DType>(shapes: &[&[usize]], axis: usize, seed: u64) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let inputs: Vec<(Vec<T>, Tensor<T>)> = shapes
        .iter()
        .map(|sh| random_tensor(&mut rng, sh))
        .collect();
    let out = kernels::concat(inputs.iter().map(|(_, t)| t).collect(), axis).sync_on(&s)?;
    let mut want_shape = shapes[0].to_vec();
    want_shape[axis] = shapes.iter().map(|sh| sh[axis]).sum();
    assert_eq!(out.shape(), &want_shape[..]);
    let got = read(&out);
    for (k, g) in got.iter().enumerate() {
        let mut idx = unravel(k, &want_shape);
        let mut part = 0;
        while idx[axis] >= shapes[part][axis] {
            idx[axis] -= shapes[part][axis];
            part += 1;
        }
        let want = inputs[part].0[ravel(&idx, shapes[part])];
        assert_eq!(*g, want, "concat {shapes:?} on axis {axis}, element {k}");
    }
    Ok(())
}

#[test]
fn concat_along_every_axis() -> Result<(), DeviceError> {
    check_concat::<f32>(&[&[3, 4], &[5, 4]], 0, 1)?;
    check_concat::<f32>(&[&[3, 4], &[3, 1], &[3, 7]], 1, 2)?;
    check_concat::<bf16>(&[&[2, 3, 5], &[2, 4, 5]], 1, 3)?;
    check_concat::<i64>(&[&[2, 3, 5], &[2, 3, 2], &[2, 3, 1]], 2, 4)?;
    check_concat::<u8>(&[&[33, 65, 3], &[33, 1, 3]], 1, 5)?;
    check_concat::<f64>(&[&[7]], 0, 6)?;
    check_concat::<f32>(&[&[1000, 3], &[1000, 5]], 1, 7)
}

#[test]
fn concat_with_zero_size_axes() -> Result<(), DeviceError> {
    check_concat::<f32>(&[&[3, 0], &[3, 4], &[3, 0]], 1, 8)?;
    check_concat::<f32>(&[&[0, 4], &[2, 4]], 0, 9)?;
    check_concat::<f32>(&[&[0, 4], &[0, 4]], 0, 10)?;
    check_concat::<i32>(&[&[0, 4], &[0, 2]], 1, 11)
}

fn check_stack<T: DType>(
    shape: &[usize],
    count: usize,
    axis: usize,
    seed: u64,
) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let inputs: Vec<(Vec<T>, Tensor<T>)> =
        (0..count).map(|_| random_tensor(&mut rng, shape)).collect();
    let out = kernels::stack(inputs.iter().map(|(_, t)| t.clone()).collect(), axis).sync_on(&s)?;
    let mut want_shape = shape.to_vec();
    want_shape.insert(axis, count);
    assert_eq!(out.shape(), &want_shape[..]);
    for (k, g) in read(&out).iter().enumerate() {
        let mut idx = unravel(k, &want_shape);
        let part = idx.remove(axis);
        assert_eq!(
            *g,
            inputs[part].0[ravel(&idx, shape)],
            "stack {shape:?} x{count} at {axis}"
        );
    }
    Ok(())
}

#[test]
fn stack_on_every_new_axis() -> Result<(), DeviceError> {
    for axis in 0..=2 {
        check_stack::<f32>(&[3, 5], 4, axis, 20 + axis as u64)?;
    }
    check_stack::<bf16>(&[2, 3, 4], 2, 3, 24)?;
    check_stack::<u32>(&[], 5, 0, 25)?;
    check_stack::<f32>(&[0, 3], 2, 1, 26)?;
    check_stack::<f64>(&[4], 1, 1, 27)
}

fn check_index_select<T: DType>(
    shape: &[usize],
    axis: usize,
    n: usize,
    seed: u64,
) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let (xh, x) = random_tensor::<T>(&mut rng, shape);
    let len = shape[axis] as i64;
    // Mostly in range, with some past the end and some negative.
    let ids: Vec<i64> = (0..n).map(|_| rng.gen_range(-2..len + 2)).collect();
    let idx = upload(&s, &ids, &[n]);
    let out = kernels::index_select(&x, axis, &idx).sync_on(&s)?;
    let mut want_shape = shape.to_vec();
    want_shape[axis] = n;
    assert_eq!(out.shape(), &want_shape[..]);
    for (k, g) in read(&out).iter().enumerate() {
        let mut pos = unravel(k, &want_shape);
        let id = ids[pos[axis]];
        let want = if (0..len).contains(&id) {
            pos[axis] = id as usize;
            xh[ravel(&pos, shape)]
        } else {
            T::default()
        };
        assert_eq!(
            *g, want,
            "index_select {shape:?} axis {axis} element {k} (id {id})"
        );
    }
    Ok(())
}

#[test]
fn index_select_along_every_axis() -> Result<(), DeviceError> {
    check_index_select::<f32>(&[5, 7], 0, 9, 30)?;
    check_index_select::<f32>(&[5, 7], 1, 3, 31)?;
    check_index_select::<bf16>(&[3, 6, 4], 1, 10, 32)?;
    check_index_select::<i32>(&[3, 6, 4], 2, 5, 33)?;
    check_index_select::<u8>(&[100, 65], 0, 300, 34)?;
    check_index_select::<f32>(&[4, 3], 1, 0, 35)?;
    check_index_select::<f32>(&[0, 3], 1, 4, 36)
}

#[test]
fn index_select_takes_every_index_type() -> Result<(), DeviceError> {
    let s = stream();
    let x = upload(&s, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let want = vec![5.0, 6.0, 1.0, 2.0];
    let rows = |ids: &[u32]| ids.to_vec();
    let u32s = upload(&s, &rows(&[2, 0]), &[2]);
    assert_eq!(
        read(&kernels::index_select(&x, 0, &u32s).sync_on(&s)?),
        want
    );
    let i32s = upload(&s, &[2i32, 0], &[2]);
    assert_eq!(
        read(&kernels::index_select(&x, 0, &i32s).sync_on(&s)?),
        want
    );
    let u8s = upload(&s, &[2u8, 0], &[2]);
    assert_eq!(read(&kernels::index_select(&x, 0, u8s).sync_on(&s)?), want);
    Ok(())
}

fn check_gather<T: DType>(
    shape: &[usize],
    axis: usize,
    n: usize,
    seed: u64,
) -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(seed);
    let (xh, x) = random_tensor::<T>(&mut rng, shape);
    let mut index_shape = shape.to_vec();
    index_shape[axis] = n;
    let len = shape[axis] as i64;
    let ids: Vec<i64> = (0..numel(&index_shape))
        .map(|_| rng.gen_range(-1..len + 1))
        .collect();
    let idx = upload(&s, &ids, &index_shape);
    let out = kernels::gather(&x, axis, &idx).sync_on(&s)?;
    assert_eq!(out.shape(), &index_shape[..]);
    for (k, g) in read(&out).iter().enumerate() {
        let mut pos = unravel(k, &index_shape);
        let id = ids[k];
        let want = if (0..len).contains(&id) {
            pos[axis] = id as usize;
            xh[ravel(&pos, shape)]
        } else {
            T::default()
        };
        assert_eq!(
            *g, want,
            "gather {shape:?} axis {axis} element {k} (id {id})"
        );
    }
    Ok(())
}

#[test]
fn gather_along_every_axis() -> Result<(), DeviceError> {
    check_gather::<f32>(&[6, 5], 0, 3, 40)?;
    check_gather::<f32>(&[6, 5], 1, 8, 41)?;
    check_gather::<f64>(&[3, 4, 5], 1, 2, 42)?;
    check_gather::<bf16>(&[3, 4, 5], 2, 5, 43)?;
    check_gather::<i64>(&[300, 7], 0, 1, 44)?;
    check_gather::<f32>(&[3, 4], 1, 0, 45)?;
    check_gather::<f32>(&[0, 4], 1, 2, 46)
}

fn error_text(r: Result<Tensor<f32>, DeviceError>) -> String {
    r.expect_err("a shape error").to_string()
}

#[test]
fn shape_errors_name_the_axis_and_the_sizes() -> Result<(), DeviceError> {
    let s = stream();
    let a = api::zeros::<f32>(&[2, 3]).sync_on(&s)?;
    let b = api::zeros::<f32>(&[4, 5]).sync_on(&s)?;
    let c = api::zeros::<f32>(&[2, 3, 1]).sync_on(&s)?;

    let t = error_text(kernels::concat(vec![&a, &b], 0).sync_on(&s));
    assert!(t.contains("axis 1") && t.contains("5 vs 3"), "{t}");
    let t = error_text(kernels::concat(vec![&a, &c], 0).sync_on(&s));
    assert!(t.contains("3 axes") && t.contains("2"), "{t}");
    let t = error_text(kernels::concat(vec![&a], 2).sync_on(&s));
    assert!(t.contains("axis 2") && t.contains("out of range"), "{t}");
    let t = error_text(kernels::concat(Vec::<&Tensor<f32>>::new(), 0).sync_on(&s));
    assert!(t.contains("at least one"), "{t}");

    let t = error_text(kernels::stack(vec![&a, &b], 0).sync_on(&s));
    assert!(t.contains("axis 0") && t.contains("same shape"), "{t}");
    let t = error_text(kernels::stack(vec![&a, &a], 3).sync_on(&s));
    assert!(t.contains("axis 3") && t.contains("new one"), "{t}");

    let idx2 = api::zeros::<u32>(&[2, 2]).sync_on(&s)?;
    let t = error_text(kernels::index_select(&a, 0, &idx2).sync_on(&s));
    assert!(t.contains("1-D") && t.contains("[2, 2]"), "{t}");
    let idx1 = api::zeros::<u32>(&[2]).sync_on(&s)?;
    let t = error_text(kernels::index_select(&a, 2, &idx1).sync_on(&s));
    assert!(t.contains("axis 2"), "{t}");

    let t = error_text(kernels::gather(&a, 0, &idx2).sync_on(&s));
    assert!(t.contains("axis 1") && t.contains("2 vs 3"), "{t}");
    let t = error_text(kernels::gather(&a, 0, &idx1).sync_on(&s));
    assert!(t.contains("1 axes") && t.contains("has 2"), "{t}");
    Ok(())
}

/// Indices at the extremes of their types (negative, past the end, the largest) select zeros,
/// never a wrapped-around element, and are not an error.
#[test]
fn extreme_indices_select_zeros() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(40);
    let (xh, x) = random_tensor::<f32>(&mut rng, &[3, 4]);
    let ids = upload(&s, &[i64::MIN, -1, 3, 4, i64::MAX, 0], &[6]);
    let got = read(&kernels::index_select(&x, 1, &ids).sync_on(&s)?);
    for r in 0..3 {
        let row = &got[r * 6..(r + 1) * 6];
        assert_eq!(
            row,
            &[0.0, 0.0, xh[r * 4 + 3], 0.0, 0.0, xh[r * 4]],
            "row {r}"
        );
    }
    let ids = upload(&s, &[u32::MAX, 2, 3, 1 << 31], &[1, 4]);
    let got = read(&kernels::gather(&x, 0, &ids).sync_on(&s)?);
    assert_eq!(got, vec![0.0, xh[2 * 4 + 1], 0.0, 0.0]);
    Ok(())
}

/// Shapes are checked on the tensors as given, before any view is copied to a dense tensor: a
/// mismatched broadcast view of 2^41 elements is a shape error, not an out-of-memory one.
#[test]
fn shape_errors_come_before_copying_views() -> Result<(), DeviceError> {
    let s = stream();
    let a = api::ones::<f32>(&[2, 3]).sync_on(&s)?;
    let huge = api::ones::<f32>(&[1]).sync_on(&s)?.expand(&[2, 1 << 40])?;
    let is_shape_error = |r: Result<Tensor<f32>, DeviceError>, op: &str| match r {
        Err(DeviceError::InvalidShape { op: got, .. }) if got == op => {}
        other => panic!(
            "{op}: expected a shape error, got {:?}",
            other.map(|t| t.shape().to_vec())
        ),
    };
    is_shape_error(kernels::concat(vec![&a, &huge], 0).sync_on(&s), "concat");
    is_shape_error(kernels::concat(vec![&huge, &a], 0).sync_on(&s), "concat");
    is_shape_error(kernels::stack(vec![&huge, &a], 0).sync_on(&s), "stack");
    let idx2 = api::zeros::<u32>(&[2, 2]).sync_on(&s)?;
    is_shape_error(
        kernels::index_select(&huge, 1, &idx2).sync_on(&s),
        "index_select",
    );
    let idx1 = api::zeros::<u32>(&[2]).sync_on(&s)?;
    is_shape_error(kernels::gather(&huge, 0, &idx1).sync_on(&s), "gather");
    let wide_idx = api::zeros::<u32>(&[1]).sync_on(&s)?.expand(&[3, 1 << 40])?;
    is_shape_error(kernels::gather(&a, 1, &wide_idx).sync_on(&s), "gather");
    Ok(())
}

/// An empty result is given without copying its inputs' views to dense tensors first: views of
/// 2^40 elements that nothing reads give an empty tensor, not an out-of-memory error.
#[test]
fn empty_results_copy_no_view() -> Result<(), DeviceError> {
    let s = stream();
    let none = api::zeros::<f32>(&[0, 5]).sync_on(&s)?;
    let wide_idx = api::zeros::<u32>(&[1]).sync_on(&s)?.expand(&[1 << 40])?;
    let y = kernels::index_select(&none, 1, &wide_idx).sync_on(&s)?;
    assert_eq!(y.shape(), &[0, 1 << 40]);
    let huge = api::ones::<f32>(&[1]).sync_on(&s)?.expand(&[3, 1 << 40])?;
    let no_idx = api::zeros::<u32>(&[0]).sync_on(&s)?;
    let y = kernels::index_select(&huge, 1, &no_idx).sync_on(&s)?;
    assert_eq!(y.shape(), &[3, 0]);
    let no_idx = api::zeros::<u32>(&[3, 0]).sync_on(&s)?;
    let y = kernels::gather(&huge, 1, &no_idx).sync_on(&s)?;
    assert_eq!(y.shape(), &[3, 0]);
    Ok(())
}

#[test]
fn concat_refuses_mismatched_shapes_before_copying() -> Result<(), DeviceError> {
    let s = stream();
    let a = api::ones::<f32>(&[2, 3]).sync_on(&s)?;
    let b = api::ones::<f32>(&[1]).sync_on(&s)?.expand(&[2, 1 << 40])?;
    let err = kernels::concat(vec![&a, &b], 0).sync_on(&s).unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "concat", .. }),
        "got {err:?}"
    );
    Ok(())
}

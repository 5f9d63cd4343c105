//! `.reshape(..)` and `.partition(..)` on lazy tensor ops: owned shapes, so the ops are
//! `'static` (boxed, sent to threads, spawned on tokio), and they compose with kernels.

use std::future::IntoFuture;

use cuflow_device_op::{BoxedOp, DeviceOpExt};
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, kernels, PartitionOpExt, ReshapeOpExt, Tensor};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng;
use cuflow_testing::tensor::{random, read, upload};

fn assert_static<T: 'static>(_: &T) {}

#[test]
fn a_reshaped_op_from_a_local_shape_is_static_and_boxable() -> Result<(), DeviceError> {
    let s = stream();
    let dims: Vec<usize> = vec![2, 3, 4];
    let op = api::arange::<f32>(0.0, 24.0, 1.0).reshape(&dims);
    drop(dims);
    assert_static(&op);
    let boxed: BoxedOp<'static, Tensor<f32>> = op.boxed();
    let t = std::thread::spawn(move || boxed.sync_on(&s))
        .join()
        .expect("the thread ran")?;
    assert_eq!(t.shape(), &[2, 3, 4]);
    assert_eq!(read(&t), (0..24).map(|i| i as f32).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn reshape_takes_arrays_vectors_and_slices() -> Result<(), DeviceError> {
    let s = stream();
    let slice: &[usize] = &[6, 1];
    assert_eq!(
        api::zeros::<u8>(&[6]).reshape([3, 2]).sync_on(&s)?.shape(),
        &[3, 2]
    );
    assert_eq!(
        api::zeros::<u8>(&[6])
            .reshape(vec![2, 3])
            .sync_on(&s)?
            .shape(),
        &[2, 3]
    );
    assert_eq!(
        api::zeros::<u8>(&[6]).reshape(slice).sync_on(&s)?.shape(),
        &[6, 1]
    );
    Ok(())
}

#[test]
fn a_reshaped_op_feeds_a_kernel() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(41);
    let xh: Vec<f32> = random(&mut rng, 12);
    let y = kernels::relu(api::from_vec(xh.clone(), &[12]).reshape([3, 4])).sync_on(&s)?;
    assert_eq!(y.shape(), &[3, 4]);
    let want: Vec<f32> = xh.iter().map(|v| v.max(0.0)).collect();
    assert_eq!(read(&y), want);
    Ok(())
}

#[test]
fn reshape_to_another_element_count_fails_naming_both_shapes() {
    let err = api::zeros::<f32>(&[2, 3])
        .reshape([4, 2])
        .sync_on(&stream())
        .expect_err("6 elements are not 8");
    let text = err.to_string();
    assert!(text.contains("[2, 3]") && text.contains("[4, 2]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshaped_op_spawns_on_tokio() -> Result<(), DeviceError> {
    let shape = vec![4, 4];
    let handle = tokio::spawn(api::ones::<f32>(&[16]).reshape(shape).into_future());
    let t = handle.await.expect("the task ran")?;
    assert_eq!(t.shape(), &[4, 4]);
    assert_eq!(t.to_host_vec()?, vec![1.0; 16]);
    Ok(())
}

#[test]
fn a_lazy_partition_feeds_an_explicit_output_kernel() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(42);
    let (xh, zh): (Vec<f32>, Vec<f32>) = (random(&mut rng, 64), random(&mut rng, 64));
    let x = upload(&s, &xh, &[8, 8]);
    let op = api::from_vec(zh.clone(), &[8, 8])
        .partition([2, 8])
        .then(move |z| kernels::saxpy(z, 3.0, x));
    assert_static(&op);
    let (z, _) = op.boxed().sync_on(&s)?;
    assert_eq!(z.tile(), &[2, 8]);
    let got = read(&z.unpartition());
    for (i, g) in got.iter().enumerate() {
        let want = 3.0 * f64::from(xh[i]) + f64::from(zh[i]);
        assert!(
            (f64::from(*g) - want).abs() <= 1e-6 * want.abs().max(1.0),
            "at {i}"
        );
    }
    Ok(())
}

#[test]
fn a_lazy_partition_that_does_not_divide_fails_when_the_kernel_runs() {
    let s = stream();
    let x = upload(&s, &[1.0f32; 12], &[3, 4]);
    let err = api::zeros::<f32>(&[3, 4])
        .partition([2, 4])
        .then(move |z| kernels::saxpy(z, 1.0, x))
        .sync_on(&s)
        .expect_err("2 does not divide 3");
    assert!(err.to_string().contains("axis 0"), "{err}");
}

//! Argument modes. Inputs come as `Tensor<T>`, `Arc<Tensor<T>>`, `&Tensor<T>` or an op that
//! produces one, and a kernel that gives its input back gives it in the mode it came in.
//! Outputs come as a `Partition` of an owned tensor (given back) or of a `&mut Tensor` (written
//! in place), in tiles that split the first and the last axis. Ops that yield tensors read
//! back with `.to_host_vec()` and reshape with `.reshape(..)`; kernel ops can be awaited.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_device_op::{value, DeviceOpExt};
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, kernels, Partition, PartitionExt, ReshapeOpExt, Tensor, TensorOpExt};
use cuflow_testing::{device::stream, rng::seeded_rng, tensor::*, test_cases};

/// What an output holds before a kernel writes it: an element left unwritten shows.
const SENTINEL: f32 = -777.0;

/// The saxpy factor.
const A: f32 = 2.5;

/// saxpy over `shape` in tiles of `tile`, into a poisoned output, through a borrowed and
/// through an owned partition.
fn saxpy_in_tiles<const N: usize>(shape: &[usize], tile: [usize; N]) -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = seeded_rng(numel(shape) as u64 * 31 + N as u64);
    // Never zero, so that a + x·A differs from the sentinel everywhere.
    let x: Vec<f32> = signed(&mut rng, numel(shape), 0.25, 1.0);
    let tx = upload(&stream, &x, shape);
    let want = map_ref(&x, |v| f64::from(A) * v + f64::from(SENTINEL));
    let what = format!("saxpy {shape:?} in tiles {tile:?}");

    // In place, through a borrow.
    let mut z = api::full(shape, SENTINEL).sync_on(&stream)?;
    let (tiles, x_back): (Partition<&mut Tensor<f32>>, &Tensor<f32>) =
        kernels::saxpy((&mut z).partition(tile), A, &tx).sync_on(&stream)?;
    assert_eq!(tiles.tile(), tile);
    assert_eq!(tiles.get().shape(), shape);
    assert!(std::ptr::eq(x_back, &tx), "the borrowed input comes back");
    drop(tiles);
    assert_dtype_close(
        &read(&z),
        &want,
        f32::ARITH_TOL,
        &format!("{what}, borrowed"),
    );

    // Owned: the output comes back in its partition.
    let z = api::full(shape, SENTINEL).sync_on(&stream)?;
    let (tiles, x_back): (Partition<Tensor<f32>>, Tensor<f32>) =
        kernels::saxpy(z.partition(tile), A, tx.clone()).sync_on(&stream)?;
    assert_eq!(tiles.tile(), tile);
    let z: Tensor<f32> = tiles.unpartition();
    assert_eq!(z.shape(), shape);
    assert!(Arc::ptr_eq(x_back.buffer(), tx.buffer()));
    assert_dtype_close(&read(&z), &want, f32::ARITH_TOL, &format!("{what}, owned"));
    Ok(())
}

test_cases! {
    square_tiles_split_rows_and_columns => saxpy_in_tiles(&[16, 16], [4, 4]),
    row_tiles_of_an_odd_length => saxpy_in_tiles(&[3, 4097], [1, 4097]),
    tiles_of_two_whole_rows => saxpy_in_tiles(&[6, 7], [2, 7]),
    tiles_of_one_column => saxpy_in_tiles(&[6, 7], [3, 1]),
    tiles_of_one_element => saxpy_in_tiles(&[64, 33], [1, 1]),
    tiles_larger_than_a_block => saxpy_in_tiles(&[32, 128], [16, 64]),
    one_dimensional_tiles => {
        saxpy_in_tiles(&[64], [8])?;
        saxpy_in_tiles(&[4097], [4097])
    },
    rank_3_tiles_keep_the_middle_axis_whole => {
        saxpy_in_tiles(&[4, 3, 8], [2, 3, 4])?;
        saxpy_in_tiles(&[2, 5, 7], [1, 5, 7])
    },
    rank_4_tiles_keep_the_middle_axes_whole => saxpy_in_tiles(&[2, 2, 3, 10], [1, 2, 3, 5]),
}

#[test]
fn a_clone_shares_memory_with_the_partitioned_tensor() -> Result<(), DeviceError> {
    let stream = stream();
    let z = api::full(&[8, 8], SENTINEL).sync_on(&stream)?;
    let alias = z.clone();
    let x = api::ones::<f32>(&[8, 8]).sync_on(&stream)?;
    let (tiles, _) = kernels::saxpy(z.partition([4, 8]), A, &x).sync_on(&stream)?;
    assert_eq!(read(&alias), vec![SENTINEL + A; 64]);
    assert_eq!(read(&tiles.unpartition()), vec![SENTINEL + A; 64]);
    Ok(())
}

#[test]
fn every_input_mode_gives_the_same_result() -> Result<(), DeviceError> {
    let stream = stream();
    let shape = [5, 9];
    let mut rng = seeded_rng(11);
    let xv: Vec<f32> = uniform(&mut rng, 45, -3.0, 3.0);
    let yv: Vec<f32> = uniform(&mut rng, 45, -3.0, 3.0);
    let want = zip_ref(&xv, &yv, |a, b| a + b);
    let (x, y) = (upload(&stream, &xv, &shape), upload(&stream, &yv, &shape));
    let (ax, ay) = (Arc::new(x.clone()), Arc::new(y.clone()));

    let results: Vec<(&str, Tensor<f32>)> = vec![
        ("&Tensor", kernels::add(&x, &y).sync_on(&stream)?),
        (
            "Tensor",
            kernels::add(x.clone(), y.clone()).sync_on(&stream)?,
        ),
        (
            "Arc",
            kernels::add(ax.clone(), ay.clone()).sync_on(&stream)?,
        ),
        (
            "&Tensor + Arc",
            kernels::add(&x, ay.clone()).sync_on(&stream)?,
        ),
        (
            "Arc + Tensor",
            kernels::add(ax, y.clone()).sync_on(&stream)?,
        ),
        (
            "value",
            kernels::add(value(x.clone()), value(&y)).sync_on(&stream)?,
        ),
        ("value(Arc)", kernels::add(value(ay), &x).sync_on(&stream)?),
    ];
    for (mode, out) in results {
        assert_eq!(out.shape(), &shape, "{mode}");
        assert_dtype_close(&read(&out), &want, f32::ARITH_TOL, mode);
    }
    Ok(())
}

#[test]
fn ops_as_inputs() -> Result<(), DeviceError> {
    let stream = stream();
    let shape = [4, 6];

    let out = kernels::add(api::ones::<f32>(&shape), api::full(&shape, 2.5)).sync_on(&stream)?;
    assert_eq!(read(&out), vec![3.5; 24]);

    // A shared op feeds two inputs and runs once.
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let data: Vec<f32> = (0..24).map(|i| i as f32 - 10.0).collect();
    let shared = api::from_vec(data.clone(), &shape)
        .inspect(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .shared();
    let out = kernels::add(shared.clone(), shared).sync_on(&stream)?;
    assert_eq!(read(&out), data.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a shared op runs once");

    // A chain.
    let tripled = api::ones::<f32>(&shape).then(|t| kernels::scale(t, 3.0));
    let out = kernels::sub(tripled, api::full(&shape, 0.5)).sync_on(&stream)?;
    assert_eq!(read(&out), vec![2.5; 24]);

    // Kernels of kernels: (x + y)(x - y) = x² - y².
    let x = upload(&stream, &data, &shape);
    let y = api::full(&shape, 2.0f32).sync_on(&stream)?;
    let out = kernels::mul(kernels::add(&x, &y), kernels::sub(&x, &y)).sync_on(&stream)?;
    let want = map_ref(&data, |v| v * v - 4.0);
    assert_dtype_close(&read(&out), &want, f32::ARITH_TOL, "(x + y)(x - y)");

    // A boxed op.
    let out = kernels::relu(api::arange::<f32>(-3.0, 3.0, 1.0).boxed()).sync_on(&stream)?;
    assert_eq!(read(&out), vec![0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
    Ok(())
}

#[test]
fn saxpy_gives_its_input_back_in_the_mode_it_came_in() -> Result<(), DeviceError> {
    let stream = stream();
    let shape = [2, 8];
    let xv: Vec<f32> = (0..16).map(|i| i as f32 * 0.25).collect();
    let x = upload(&stream, &xv, &shape);
    let ax = Arc::new(x.clone());
    let mut z = api::full(&shape, SENTINEL).sync_on(&stream)?;

    let (_, back): (_, &Tensor<f32>) =
        kernels::saxpy((&mut z).partition([1, 8]), A, &x).sync_on(&stream)?;
    assert!(std::ptr::eq(back, &x));

    let (_, back): (_, Tensor<f32>) =
        kernels::saxpy((&mut z).partition([1, 8]), A, x.clone()).sync_on(&stream)?;
    assert!(Arc::ptr_eq(back.buffer(), x.buffer()));

    let (_, back): (_, Arc<Tensor<f32>>) =
        kernels::saxpy((&mut z).partition([1, 8]), A, ax.clone()).sync_on(&stream)?;
    assert!(Arc::ptr_eq(&back, &ax));

    let (_, back): (_, Tensor<f32>) =
        kernels::saxpy((&mut z).partition([2, 4]), A, value(x.clone())).sync_on(&stream)?;
    assert!(Arc::ptr_eq(back.buffer(), x.buffer()));

    let (_, back): (_, Tensor<f32>) =
        kernels::saxpy((&mut z).partition([2, 4]), A, api::ones(&shape)).sync_on(&stream)?;
    assert_eq!(read(&back), vec![1.0; 16]);

    let ones = api::ones(&shape).shared();
    let (_, back): (_, Arc<Tensor<f32>>) =
        kernels::saxpy((&mut z).partition([2, 8]), A, ones).sync_on(&stream)?;
    assert_eq!(read(&back), vec![1.0; 16]);

    // z accumulated four times x and twice one.
    let want = map_ref(&xv, |v| {
        f64::from(SENTINEL) + f64::from(A) * (4.0 * v + 2.0)
    });
    assert_dtype_close(&read(&z), &want, f32::ARITH_TOL, "accumulated saxpy");
    Ok(())
}

#[test]
fn ops_read_back_and_reshape() -> Result<(), DeviceError> {
    let stream = stream();
    let values: Vec<f32> = (0..12).map(|i| i as f32).collect();

    // `.to_host_vec()` on ops of every output mode.
    assert_eq!(api::arange::<f32>(0.0, 12.0, 1.0).to_host_vec()?, values);
    let x = upload(&stream, &values, &[3, 4]);
    assert_eq!(
        kernels::add_scalar(&x, 1.0).to_host_vec()?,
        map_ref(&values, |v| v + 1.0)
            .iter()
            .map(|v| *v as f32)
            .collect::<Vec<_>>()
    );
    assert_eq!(api::ones::<i32>(&[3]).shared().to_host_vec()?, vec![1; 3]);
    assert_eq!(value(Arc::new(x.clone())).to_host_vec()?, values);

    // `.reshape` on a tensor keeps the elements and their order.
    let r = x.clone().reshape(&[2, 3, 2])?;
    assert_eq!(r.shape(), &[2, 3, 2]);
    assert_eq!(r.strides(), &[6, 2, 1]);
    assert_eq!(r.rank(), 3);
    assert_eq!(read(&r), values);
    assert!(
        Arc::ptr_eq(r.buffer(), x.buffer()),
        "a reshape shares memory"
    );
    assert_eq!(x.shape(), &[3, 4]);

    // `.reshape` on an op, feeding a kernel that broadcasts over the new last axis.
    let out = kernels::add(
        api::arange::<f32>(0.0, 12.0, 1.0).reshape([4, 3]),
        api::from_vec(vec![100.0f32, 200.0, 300.0], &[3]),
    )
    .sync_on(&stream)?;
    assert_eq!(out.shape(), &[4, 3]);
    let want: Vec<f32> = (0..12)
        .map(|i| i as f32 + 100.0 * (1 + i % 3) as f32)
        .collect();
    assert_eq!(read(&out), want);
    let flat = api::zeros::<u8>(&[2, 3, 4])
        .reshape([24])
        .sync_on(&stream)?;
    assert_eq!(flat.shape(), &[24]);
    assert_eq!(read(&flat), vec![0u8; 24]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_ops_await_under_tokio() -> Result<(), DeviceError> {
    let x = api::arange::<f32>(-4.0, 4.0, 0.5).await?;
    let xv = read(&x);
    assert_eq!(xv.len(), 16);
    // `.await` takes 'static ops: owned and `Arc` inputs.
    let y = kernels::relu(x.clone()).await?;
    assert_eq!(read(&y), xv.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());

    // Ops over owned and `Arc` inputs are 'static, so tasks can run them.
    let x = Arc::new(x);
    let tasks: Vec<_> = (1..=4)
        .map(|k| tokio::spawn(kernels::scale(x.clone(), k as f32).into_future()))
        .collect();
    for (k, task) in (1..=4).zip(tasks) {
        let out = task.await.expect("the task completes")?;
        let want: Vec<f32> = xv.iter().map(|v| v * k as f32).collect();
        assert_eq!(read(&out), want, "scale by {k}");
    }

    let z = api::full(&[16], SENTINEL).await?;
    let (tiles, back) = kernels::saxpy(z.partition([4]), A, x.clone()).await?;
    assert!(Arc::ptr_eq(&back, &x));
    let want: Vec<f32> = xv.iter().map(|v| SENTINEL + A * v).collect();
    assert_eq!(read(&tiles.unpartition()), want);
    Ok(())
}

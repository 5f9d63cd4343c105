//! `matmul` and `linear` against a float64 reference, on whatever `Device::auto()` gives.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{DeviceError, GemmElem};
use cuflow_tensor::{api, bf16, f16, kernels, DType, Tensor};
use cuflow_testing::{device::stream, tensor::random};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Max over outputs of |got - want| / (Σ|a·b| + tiny): error relative to the magnitude of the
/// terms summed, which is what the accumulation precision bounds.
#[allow(clippy::too_many_arguments)]
fn check<T: DType>(
    a: &[T],
    b: &[T],
    got: &[T],
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    b_batched: bool,
    trans_b: bool,
    tol: f64,
) {
    let mut worst = 0.0f64;
    for p in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut mag) = (0.0f64, 0.0f64);
                for l in 0..k {
                    let av = a[p * m * k + i * k + l].to_f64();
                    let boff = if b_batched { p * k * n } else { 0 };
                    let bv = if trans_b {
                        b[boff + j * k + l].to_f64()
                    } else {
                        b[boff + l * n + j].to_f64()
                    };
                    s += av * bv;
                    mag += (av * bv).abs();
                }
                let g = got[p * m * n + i * n + j].to_f64();
                worst = worst.max((g - s).abs() / (mag + 1e-30));
            }
        }
    }
    assert!(
        worst <= tol,
        "{}: relative error {worst:e} over {batch}x{m}x{n}x{k} exceeds {tol:e}",
        T::NAME
    );
}

fn run_matmul<T: DType + GemmElem>(
    rng: &mut StdRng,
    dims: (usize, usize, usize, usize),
    tol: f64,
) -> Result<(), DeviceError> {
    let (batch, m, n, k) = dims;
    let stream = stream();
    let (ah, bh): (Vec<T>, Vec<T>) = (random(rng, batch * m * k), random(rng, k * n));
    let a_shape: Vec<usize> = if batch > 1 {
        vec![batch, m, k]
    } else {
        vec![m, k]
    };
    let a = api::from_vec(ah.clone(), &a_shape).sync_on(&stream)?;
    let b = api::from_vec(bh.clone(), &[k, n]).sync_on(&stream)?;
    let c: Tensor<T> = kernels::matmul(&a, &b).sync_on(&stream)?;
    let want_shape: Vec<usize> = if batch > 1 {
        vec![batch, m, n]
    } else {
        vec![m, n]
    };
    assert_eq!(c.shape(), &want_shape[..]);
    check(
        &ah,
        &bh,
        &c.to_host_vec()?,
        batch,
        m,
        n,
        k,
        false,
        false,
        tol,
    );
    Ok(())
}

#[test]
fn matmul_f32_awkward_sizes() -> Result<(), DeviceError> {
    let mut rng = StdRng::seed_from_u64(1);
    for dims in [
        (1, 1, 1, 1),
        (1, 7, 1, 5),
        (1, 33, 65, 17),
        (1, 128, 96, 257),
        (3, 5, 7, 1000),
    ] {
        run_matmul::<f32>(&mut rng, dims, 1e-5)?;
    }
    Ok(())
}

#[test]
fn matmul_half_types_accumulate_in_f32() -> Result<(), DeviceError> {
    let mut rng = StdRng::seed_from_u64(2);
    for dims in [(1, 7, 9, 4097), (2, 64, 48, 96)] {
        run_matmul::<bf16>(&mut rng, dims, 1e-2)?;
        run_matmul::<f16>(&mut rng, dims, 2e-3)?;
    }
    run_matmul::<f64>(&mut rng, (1, 31, 17, 45), 1e-12)
}

#[test]
fn batched_matmul_and_linear() -> Result<(), DeviceError> {
    let mut rng = StdRng::seed_from_u64(3);
    let stream = stream();
    let (batch, m, n, k) = (4, 6, 5, 33);
    let (ah, bh) = (
        random::<f32>(&mut rng, batch * m * k),
        random::<f32>(&mut rng, batch * k * n),
    );
    let a = api::from_vec(ah.clone(), &[batch, m, k]).sync_on(&stream)?;
    let b = api::from_vec(bh.clone(), &[batch, k, n]).sync_on(&stream)?;
    let c = kernels::matmul(&a, &b).sync_on(&stream)?;
    assert_eq!(c.shape(), &[batch, m, n]);
    check(
        &ah,
        &bh,
        &c.to_host_vec()?,
        batch,
        m,
        n,
        k,
        true,
        false,
        1e-5,
    );

    // linear: x [m, k] times w [n, k] transposed.
    let wh = random::<f32>(&mut rng, n * k);
    let x = api::from_vec(ah[..m * k].to_vec(), &[m, k]).sync_on(&stream)?;
    let w = api::from_vec(wh.clone(), &[n, k]).sync_on(&stream)?;
    let y = kernels::linear(x, w).sync_on(&stream)?;
    assert_eq!(y.shape(), &[m, n]);
    check(
        &ah[..m * k],
        &wh,
        &y.to_host_vec()?,
        1,
        m,
        n,
        k,
        false,
        true,
        1e-5,
    );
    Ok(())
}

#[test]
fn matmul_inputs_may_be_ops() -> Result<(), DeviceError> {
    let stream = stream();
    let c = kernels::matmul(api::ones::<f32>(&[3, 4]), api::full::<f32>(&[4, 2], 0.5))
        .sync_on(&stream)?;
    assert_eq!(c.to_host_vec()?, vec![2.0; 6]);
    Ok(())
}

#[test]
fn matmul_shape_errors_name_the_op_and_shapes() -> Result<(), DeviceError> {
    let stream = stream();
    let a = api::ones::<f32>(&[3, 4]).sync_on(&stream)?;
    let b = api::ones::<f32>(&[5, 2]).sync_on(&stream)?;
    let err = kernels::matmul(&a, &b).sync_on(&stream).unwrap_err();
    assert!(
        matches!(err, DeviceError::ShapeMismatch { op: "matmul", .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("[3, 4]") && msg.contains("[5, 2]"), "{msg}");
    assert!(
        msg.contains("inner dimensions") && msg.contains("`a` has 4 columns but `b` has 5 rows"),
        "the message names both inner dimensions: {msg}"
    );

    let v = api::ones::<f32>(&[4]).sync_on(&stream)?;
    let err = kernels::matmul(&v, &b).sync_on(&stream).unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "matmul", .. }),
        "{err}"
    );

    let err = kernels::linear(&a, &b).sync_on(&stream).unwrap_err();
    assert!(
        matches!(err, DeviceError::ShapeMismatch { op: "linear", .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("`x` has 4 columns but `w` has 2 columns"),
        "linear names its own arguments: {err}"
    );
    // Batches of different sizes name both.
    let a3 = api::ones::<f32>(&[2, 3, 4]).sync_on(&stream)?;
    let b3 = api::ones::<f32>(&[3, 4, 2]).sync_on(&stream)?;
    let err = kernels::matmul(&a3, &b3).sync_on(&stream).unwrap_err();
    assert!(
        err.to_string()
            .contains("`a` holds 2 matrices but `b` holds 3"),
        "{err}"
    );
    // The stream still works.
    assert_eq!(
        kernels::matmul(&a, &api::ones::<f32>(&[4, 1]).sync_on(&stream)?)
            .sync_on(&stream)?
            .to_host_vec()?,
        vec![4.0; 3]
    );
    Ok(())
}

#[test]
fn an_empty_batch_times_a_shared_matrix_is_an_empty_batch() -> Result<(), DeviceError> {
    let stream = stream();
    let a = api::zeros::<f32>(&[0, 3, 4]).sync_on(&stream)?;
    let b = api::ones::<f32>(&[4, 2]).sync_on(&stream)?;
    let w = api::ones::<f32>(&[2, 4]).sync_on(&stream)?;
    assert_eq!(
        kernels::matmul(&a, &b).sync_on(&stream)?.shape(),
        &[0, 3, 2]
    );
    assert_eq!(
        kernels::linear(&a, &w).sync_on(&stream)?.shape(),
        &[0, 3, 2]
    );
    assert_eq!(
        kernels::matmul_f32(&a, &b).sync_on(&stream)?.shape(),
        &[0, 3, 2]
    );
    assert_eq!(
        kernels::linear_f32(&a, &w).sync_on(&stream)?.shape(),
        &[0, 3, 2]
    );
    let ah = api::zeros::<bf16>(&[0, 3, 4]).sync_on(&stream)?;
    let bh = api::ones::<bf16>(&[4, 2]).sync_on(&stream)?;
    assert_eq!(
        kernels::matmul_f32(&ah, &bh).sync_on(&stream)?.shape(),
        &[0, 3, 2]
    );
    // An empty batch of both.
    let b0 = api::ones::<f32>(&[0, 4, 2]).sync_on(&stream)?;
    assert_eq!(
        kernels::matmul(&a, &b0).sync_on(&stream)?.shape(),
        &[0, 3, 2]
    );
    // The stream still works.
    let x = api::ones::<f32>(&[2, 3, 4]).sync_on(&stream)?;
    assert_eq!(
        kernels::matmul(&x, &b).sync_on(&stream)?.to_host_vec()?,
        vec![4.0; 12]
    );
    Ok(())
}

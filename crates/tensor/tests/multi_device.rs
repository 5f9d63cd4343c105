//! Tensors on several devices: `.to_device(..)`, kernels refusing inputs of another device, and
//! `MultiDevice` spreading `zip!` branches over devices, checked against float64 references.
//!
//! The devices are those of `Device::auto()`'s backend: every visible CUDA device under CUDA,
//! and two host devices (`Device::host()` and `Device::host_numbered(1)`) on the host backend.
//! Tests that need two devices skip with a message when fewer are visible, or fail when
//! `CUFLOW_MIN_DEVICES` asks for more than are visible.

use std::sync::Arc;

use cuflow_device_op::{join_all, zip, DeviceOpExt};
use cuflow_runtime::{Device, DeviceError};
use cuflow_scheduler::MultiDevice;
use cuflow_tensor::{api, bf16, kernels, DType, Tensor, ToDeviceExt};

use cuflow_testing::device::device_pair;
use cuflow_testing::{device::two_devices, measure::rel_err_in_norm, rng::rng, tensor::random};
use rand::rngs::StdRng;

fn upload<T: DType>(
    device: &Device,
    data: &[T],
    shape: &[usize],
) -> Result<Tensor<T>, DeviceError> {
    api::from_slice(data, shape).sync_on(&device.new_stream()?)
}

/// `relu(a · b)` in float64, for `a` of `[m, k]` and `b` of `[k, n]`.
fn relu_matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for l in 0..k {
            let av = a[i * k + l] as f64;
            for j in 0..n {
                out[i * n + j] += av * b[l * n + j] as f64;
            }
        }
    }
    out.iter().map(|v| v.max(0.0)).collect()
}

#[test]
fn to_device_on_the_same_device_is_a_plain_copy() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    let mut rng = rng();
    let data: Vec<f32> = random(&mut rng, 1000);
    let x = upload(&device, &data, &[10, 100])?;
    let y = (&x).to_device(&device).sync_on(&device.new_stream()?)?;
    assert_eq!(y.device(), &device);
    assert_eq!(y.shape(), &[10, 100]);
    assert!(!Arc::ptr_eq(x.buffer(), y.buffer()), "to_device must copy");
    assert_eq!(y.to_host_vec()?, data);
    // The copy is independent of the original.
    let fresh: Vec<f32> = random(&mut rng, 1000);
    x.buffer().copy_from_host(&device.new_stream()?, &fresh)?;
    assert_eq!(y.to_host_vec()?, data);
    assert_eq!(x.to_host_vec()?, fresh);
    Ok(())
}

#[test]
fn to_device_moves_random_tensors_of_odd_shapes() -> Result<(), DeviceError> {
    let Some(devices) = two_devices() else {
        return Ok(());
    };
    let mut rng = rng();
    for a in &devices {
        for b in &devices {
            for shape in [vec![1], vec![7, 3], vec![3, 333, 5], vec![(1 << 20) + 3]] {
                let n: usize = shape.iter().product();
                let data: Vec<f32> = random(&mut rng, n);
                let x = upload(a, &data, &shape)?;
                // An owned tensor, run on a stream of the source device.
                let y = x.clone().to_device(b).sync_on(&a.new_stream()?)?;
                assert_eq!((y.device(), y.shape()), (b, &shape[..]));
                assert!(y.to_host_vec()? == data, "{shape:?} from {a} to {b}");
                // The source, last used by the copy's stream, reads back on its own device.
                assert!(x.to_host_vec()? == data, "{shape:?} source on {a}");
                // Another dtype, from an op, run on a stream of the destination device.
                let h: Vec<bf16> = random(&mut rng, n);
                let z = api::from_slice(&h, &shape)
                    .to_device(b)
                    .sync_on(&a.new_stream()?)?;
                assert!(z.to_host_vec()? == h, "bf16 {shape:?} from {a} to {b}");
                let w = (&z).to_device(a).sync_on(&b.new_stream()?)?;
                assert_eq!(w.device(), a);
                assert!(w.to_host_vec()? == h, "bf16 {shape:?} back from {b} to {a}");
            }
        }
    }
    Ok(())
}

#[test]
fn a_kernel_input_of_another_device_is_a_device_mismatch() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let x = upload(&a, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    let y = upload(&b, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    let cases: Vec<Result<Tensor<f32>, DeviceError>> = vec![
        kernels::add(&x, &y).sync_on(&a.new_stream()?),
        kernels::matmul(&y, &x).sync_on(&a.new_stream()?),
        kernels::relu(&y).sync_on(&a.new_stream()?),
    ];
    for result in cases {
        let err = result.expect_err("an input of another device was accepted");
        let text = err.to_string();
        match &err {
            DeviceError::DeviceMismatch {
                expected,
                found,
                expected_name,
                found_name,
                ..
            } => {
                assert_eq!((*expected, *found), (a.id(), b.id()), "{text}");
                assert_eq!(
                    (expected_name, found_name),
                    (&a.to_string(), &b.to_string())
                );
                assert!(
                    text.contains(&a.to_string()) && text.contains(&b.to_string()),
                    "{text}"
                );
                assert!(text.contains("a tensor [2, 2]"), "names the input: {text}");
            }
            other => panic!("expected a device mismatch, got {other}"),
        }
        assert!(
            text.contains("to_device"),
            "the error says how to fix it: {text}"
        );
    }
    // Moving it first is the fix.
    let moved = kernels::add(&x, y.to_device(&a)).sync_on(&a.new_stream()?)?;
    assert_eq!(moved.to_host_vec()?, vec![2.0, 4.0, 6.0, 8.0]);
    Ok(())
}

/// `relu(a_i · b_i)` for every `i`, one `join_all` branch each, under `policy`; every result
/// is gathered onto the home device with `to_device`. Returns each branch's device.
fn spread_matmuls(
    policy: &MultiDevice,
    rng: &mut StdRng,
    count: usize,
    (m, k, n): (usize, usize, usize),
) -> Result<Vec<Device>, DeviceError> {
    let home = policy.devices()[0].clone();
    let inputs: Vec<(Vec<f32>, Vec<f32>)> = (0..count)
        .map(|_| (random(rng, m * k), random(rng, k * n)))
        .collect();
    let ops: Vec<_> = inputs
        .iter()
        .map(|(a, b)| {
            let home = home.clone();
            // Built inside the branch, so that the inputs live where the branch runs.
            kernels::relu(kernels::matmul(
                api::from_slice(a, &[m, k]),
                api::from_slice(b, &[k, n]),
            ))
            .then(move |c| {
                let on = c.device().clone();
                c.to_device(&home).map(move |g| (g, on))
            })
        })
        .collect();
    let (out, stats) = join_all(ops).sync_with_policy(policy)?;
    let mut placed = Vec::new();
    for ((gathered, on), (a, b)) in out.iter().zip(&inputs) {
        assert_eq!(gathered.device(), &home);
        let err = rel_err_in_norm(&gathered.to_host_vec()?, &relu_matmul_ref(a, b, m, k, n));
        assert!(
            err <= 1e-5,
            "relative error {err:e} of a branch run on {on}"
        );
        placed.push(on.clone());
    }
    assert!(
        stats.streams.len() >= policy.devices().len().min(count),
        "{stats:?}"
    );
    Ok(placed)
}

#[test]
fn multi_device_spreads_branches_and_gathers_their_results() -> Result<(), DeviceError> {
    let Some(devices) = two_devices() else {
        return Ok(());
    };
    let mut rng = rng();
    let policy = MultiDevice::new(&devices, 2)?;
    let placed = spread_matmuls(&policy, &mut rng, 2 * devices.len() + 1, (33, 65, 17))?;
    for (i, on) in placed.iter().enumerate() {
        assert_eq!(on, &devices[i % devices.len()], "branch {i}");
    }
    let policy = MultiDevice::least_loaded(&devices, 2)?;
    let placed = spread_matmuls(&policy, &mut rng, 2 * devices.len(), (31, 7, 129))?;
    for d in &devices {
        assert_eq!(placed.iter().filter(|on| *on == d).count(), 2, "{placed:?}");
    }
    Ok(())
}

#[test]
fn multi_device_over_one_device_runs_everything_there() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    let policy = MultiDevice::new(std::slice::from_ref(&device), 3)?;
    let mut rng = rng();
    let placed = spread_matmuls(&policy, &mut rng, 4, (16, 24, 8))?;
    assert!(placed.iter().all(|on| on == &device));
    Ok(())
}

#[test]
fn kernel_inputs_and_nested_zips_stay_on_one_device() -> Result<(), DeviceError> {
    let Some(devices) = two_devices() else {
        return Ok(());
    };
    let policy = MultiDevice::new(&devices, 2)?;
    // A kernel whose lazy inputs the executor forks: they must not be spread.
    let (sum, _) = kernels::add(api::ones::<f32>(&[3, 5]), api::full::<f32>(&[3, 5], 2.0))
        .sync_with_policy(&policy)?;
    assert_eq!(sum.device(), &devices[0]);
    assert_eq!(sum.to_host_vec()?, vec![3.0; 15]);
    // A zip nested in a branch stays on that branch's device.
    let branch = |scale: f32| {
        zip!(api::ones::<f32>(&[4]), api::full::<f32>(&[4], scale))
            .then(|(x, y)| kernels::mul(x, y))
    };
    let ((p, q), _) = zip!(branch(2.0), branch(3.0)).sync_with_policy(&policy)?;
    assert_eq!((p.device(), q.device()), (&devices[0], &devices[1]));
    assert_eq!(p.to_host_vec()?, vec![2.0; 4]);
    assert_eq!(q.to_host_vec()?, vec![3.0; 4]);
    Ok(())
}

#[test]
fn softmax_on_every_device_matches_the_host() -> Result<(), DeviceError> {
    let Some(devices) = two_devices() else {
        return Ok(());
    };
    let mut rng = rng();
    let (rows, cols) = (37, 1001);
    let data: Vec<f32> = random(&mut rng, rows * cols);
    let mut want = Vec::with_capacity(data.len());
    for row in data.chunks(cols) {
        let max = row.iter().fold(f64::MIN, |m, v| m.max(*v as f64));
        let sum: f64 = row.iter().map(|v| (*v as f64 - max).exp()).sum();
        want.extend(row.iter().map(|v| (*v as f64 - max).exp() / sum));
    }
    let policy = MultiDevice::new(&devices, 1)?;
    let home = devices[0].clone();
    let x = upload(&home, &data, &[rows, cols])?;
    // Each branch takes the input to its device first, through the op itself.
    let ops: Vec<_> = devices
        .iter()
        .map(|d| {
            let (x, d, home) = (x.clone(), d.clone(), home.clone());
            cuflow_device_op::with_context(move |ctx| {
                assert_eq!(ctx.device(), &d, "branch placed on the wrong device");
                kernels::softmax(x.to_device(&d)).then(move |y| y.to_device(&home))
            })
            .boxed()
        })
        .collect();
    let (out, _) = join_all(ops).sync_with_policy(&policy)?;
    for (y, d) in out.iter().zip(&devices) {
        let err = rel_err_in_norm(&y.to_host_vec()?, &want);
        assert!(err <= 2e-5, "softmax on {d}: relative error {err:e}");
    }
    Ok(())
}

/// A strided view copied to another device, run on a stream of either device: the view is
/// packed on its own device first, then moved.
#[test]
fn to_device_copies_views_from_a_stream_of_either_device() -> Result<(), DeviceError> {
    let Some(devices) = two_devices() else {
        return Ok(());
    };
    let mut rng = rng();
    let (a, b) = (&devices[0], &devices[1]);
    let data: Vec<f32> = random(&mut rng, 5 * 7);
    let x = upload(a, &data, &[5, 7])?;
    let view = x.narrow(1, 1, 4)?.transpose(0, 1)?;
    let want: Vec<f32> = (0..4)
        .flat_map(|c| (0..5).map(move |r| (r, c + 1)))
        .map(|(r, c)| data[r * 7 + c])
        .collect();
    for stream in [a.new_stream()?, b.new_stream()?] {
        let y = (&view).to_device(b).sync_on(&stream)?;
        assert_eq!((y.device(), y.shape()), (b, &[4, 5][..]));
        assert!(
            y.to_host_vec()? == want,
            "view to {b} on {}",
            stream.device()
        );
    }
    Ok(())
}

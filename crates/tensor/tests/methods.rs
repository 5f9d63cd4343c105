//! Method syntax on tensors and on lazy ops gives what the functions give, and the ops it
//! builds own their arguments (`'static`: they can be boxed and sent to another thread).

use cuflow_device_op::{DeviceOp, DeviceOpExt};
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, kernels, Tensor, TensorMethodsExt};
use cuflow_testing::{
    device::stream,
    rng::seeded_rng,
    tensor::{assert_exact, random, read, upload},
};

fn owned<O: DeviceOp + Send + 'static>(op: O) -> O {
    op
}

#[test]
fn methods_on_tensors_match_the_functions() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(1);
    let data: Vec<f32> = random(&mut rng, 24);
    let x = upload(&s, &data, &[2, 3, 4]);
    let t = x.transpose(1, 2)?;
    let pairs: Vec<(&str, Tensor<f32>, Tensor<f32>)> = vec![
        (
            "contiguous",
            owned(t.contiguous()).sync_on(&s)?,
            kernels::contiguous(&t).sync_on(&s)?,
        ),
        (
            "sum_axis",
            owned(t.sum_axis(1, true)).sync_on(&s)?,
            kernels::sum_axis(&t, 1, true).sync_on(&s)?,
        ),
        (
            "mean_axis",
            t.mean_axis(0, false).sync_on(&s)?,
            kernels::mean_axis(&t, 0, false).sync_on(&s)?,
        ),
        (
            "max_axis",
            t.max_axis(2, false).sync_on(&s)?,
            kernels::max_axis(&t, 2, false).sync_on(&s)?,
        ),
        (
            "min_axis",
            t.min_axis(2, false).sync_on(&s)?,
            kernels::min_axis(&t, 2, false).sync_on(&s)?,
        ),
        (
            "softmax_axis",
            t.softmax_axis(1).sync_on(&s)?,
            kernels::softmax_axis(&t, 1).sync_on(&s)?,
        ),
        (
            "log_softmax_axis",
            t.log_softmax_axis(0).sync_on(&s)?,
            kernels::log_softmax_axis(&t, 0).sync_on(&s)?,
        ),
        (
            "clamp",
            t.clamp(-0.5, 0.5).sync_on(&s)?,
            kernels::clamp(&t, -0.5, 0.5).sync_on(&s)?,
        ),
    ];
    for (what, got, want) in pairs {
        assert_eq!(got.shape(), want.shape(), "{what}");
        assert_exact(&read(&got), &read(&want), what);
    }
    let zero = api::zeros::<f32>(&[1]).sync_on(&s)?;
    assert_exact(
        &read(&t.gt(&zero).sync_on(&s)?),
        &read(&kernels::gt(&t, &zero).sync_on(&s)?),
        "gt",
    );
    assert_exact(
        &read(&t.argmax_axis(1, false).sync_on(&s)?),
        &read(&kernels::argmax_axis(&t, 1, false).sync_on(&s)?),
        "argmax_axis",
    );
    Ok(())
}

#[test]
fn methods_on_lazy_ops_are_static_and_match() -> Result<(), DeviceError> {
    let s = stream();
    let mut rng = seeded_rng(2);
    let data: Vec<f32> = random(&mut rng, 24);
    let want = {
        let x = upload(&s, &data, &[2, 3, 4]);
        let v = x.permute(&[2, 0, 1])?.narrow(1, 1, 1)?.squeeze(1)?;
        read(&kernels::sum_axis(&v, 0, false).sync_on(&s)?)
    };
    let op = api::from_vec(data.clone(), &[2, 3, 4])
        .permute(&[2, 0, 1][..]) // a borrowed order: the op still owns its copy
        .narrow(1, 1, 1)
        .squeeze(1)
        .sum_axis(0, false);
    let op = owned(op).boxed();
    let s2 = s.clone();
    let got = std::thread::spawn(move || op.sync_on(&s2))
        .join()
        .expect("the thread runs the op")?;
    assert_exact(&read(&got), &want, "permute, narrow, squeeze, sum_axis");

    let e = api::from_vec(vec![1.0f32, 2.0], &[2, 1])
        .expand([2, 3])
        .unsqueeze(0)
        .select(0, 0)
        .transpose(0, 1)
        .slice_axis(0, 1..)
        .contiguous()
        .sync_on(&s)?;
    assert_eq!(e.shape(), &[2, 2]);
    assert_exact(&read(&e), &[1.0, 2.0, 1.0, 2.0], "expand ... slice_axis");
    Ok(())
}

#[test]
fn a_view_chain_deeper_than_the_stack_runs_and_drops() -> Result<(), DeviceError> {
    // View methods on lazy ops return one op type, so a loop can chain them: 200,000 levels,
    // far more than a thread's stack holds frames, run (and drop unrun) on a small stack too.
    const DEPTH: usize = 200_000;
    let run = || -> Result<(), DeviceError> {
        let s = stream();
        let data: Vec<f32> = random(&mut seeded_rng(7), 6);
        let x = upload(&s, &data, &[2, 3]);
        let chain = || {
            let mut view = x.transpose(0, 1)?.contiguous().transpose(0, 1);
            for _ in 0..DEPTH {
                view = view.transpose(0, 1);
            }
            Ok::<_, DeviceError>(view)
        };
        // DEPTH + 1 transposes of the [3, 2] copy: an odd number, so the [2, 3] view of it.
        let t = chain()?.sync_on(&s)?;
        assert_eq!(t.shape(), &[2, 3]);
        assert_exact(&read(&t), &data, "a deep view chain");
        drop(chain()?);
        Ok(())
    };
    run()?;
    cuflow_testing::thread::on_small_stack(run)
}

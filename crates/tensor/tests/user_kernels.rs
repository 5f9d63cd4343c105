//! User kernels launched over tensors with `Launch`: the launch appends every tensor's element
//! count, so a kernel bounds its accesses by values no caller chooses; a launch whose tile,
//! block size or scalars do not match what the kernel was written for stays within its
//! tensors; a kernel that does not declare the counts is refused before it runs.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{DeviceError, Kernel};
use cuflow_tensor::{api, Launch, PartitionExt};
use cuflow_testing::{
    device::stream,
    rng::seeded_rng,
    tensor::{assert_exact, random, read, upload},
};

/// `out[i] = 2 x[i]` for `i = blockIdx.x * 64 + threadIdx.x` below both counts: written for
/// tiles of 64 elements and blocks of 64 threads.
fn doubled() -> Kernel {
    // SAFETY: every access is below the element counts the launch appends (`n_out`, `n_x`),
    // whatever the tile, block size or scalars; each thread writes its own element.
    unsafe {
        Kernel::new(
            "user_doubled",
            r#"extern "C" __global__ void user_doubled(float* out, const float* x,
                                                     unsigned long long n_out,
                                                     unsigned long long n_x) {
                const unsigned long long i = blockIdx.x * 64ull + threadIdx.x;
                if (i < n_out && i < n_x) out[i] = 2.0f * x[i];
            }"#,
        )
    }
    .with_host(|args| {
        let (n_out, n_x) = (args.scalar::<u64>(2)?, args.scalar::<u64>(3)?);
        let x = args.input::<f32>(1)?;
        let out = args.output::<f32>(0)?;
        if (out.len() as u64, x.len() as u64) != (n_out, n_x) {
            return Err(DeviceError::usage(
                "user_doubled: counts differ from the tensors",
            ));
        }
        for (o, x) in out.iter_mut().zip(x) {
            *o = 2.0 * x;
        }
        Ok(())
    })
}

/// The counts reach the kernel, and a launch whose tiles are half what the kernel was written
/// for (so twice the blocks, each covering 64 elements) writes nothing past its output: the
/// elements after it in the same buffer keep their values.
#[test]
fn a_user_kernel_bounds_its_accesses_by_the_counts_the_launch_appends() -> Result<(), DeviceError> {
    let s = stream();
    let (n, canary) = (256usize, 7.0f32);
    let x0 = random::<f32>(&mut seeded_rng(3), n);
    let x = upload(&s, &x0, &[n]);
    let base = api::full::<f32>(&[2 * n], canary).sync_on(&s)?;
    let mut out = base.narrow(0, 0, n)?;
    Launch::new(&doubled(), (&mut out).partition([32]))
        .block_threads(64)
        .input(&x)
        .sync_on(&s)?;
    let want: Vec<f32> = x0.iter().map(|v| 2.0 * v).collect();
    assert_exact(&read(&out), &want, "the doubled input");
    assert_exact(
        &read(&base.narrow(0, n, n)?),
        &vec![canary; n],
        "the elements after the output",
    );

    // An input shorter than the output: the kernel reads only what is there.
    let short = upload(&s, &x0[..100], &[100]);
    let mut out = api::full::<f32>(&[n], canary).sync_on(&s)?;
    let r = Launch::new(&doubled(), (&mut out).partition([64]))
        .block_threads(64)
        .input(&short)
        .sync_on(&s);
    if r.is_ok() {
        let got = read(&out);
        assert_exact(&got[..100], &want[..100], "the elements the input has");
        assert_exact(
            &got[100..],
            &vec![canary; n - 100],
            "the elements it has not",
        );
    } else {
        // The host implementation refuses what the CUDA kernel bounds.
        assert!(matches!(r, Err(DeviceError::Usage { .. })), "{r:?}");
    }
    Ok(())
}

/// A kernel written without the counts is refused at launch, before it runs, naming the
/// launch's extra arguments; its output keeps its values.
#[test]
fn a_user_kernel_without_the_counts_is_refused() -> Result<(), DeviceError> {
    let s = stream();
    // SAFETY: the kernel never runs (its launch is refused); were it to run, it writes
    // out[0] only when both tensors hold an element.
    let old_style = unsafe {
        Kernel::new(
            "user_no_counts",
            r#"extern "C" __global__ void user_no_counts(float* out, const float* x) {
                (void)out; (void)x;
            }"#,
        )
    }
    .with_host(|_| Ok(()));
    let x = api::ones::<f32>(&[4]).sync_on(&s)?;
    let mut out = api::full::<f32>(&[4], 3.0).sync_on(&s)?;
    let err = Launch::new(&old_style, (&mut out).partition([4]))
        .input(&x)
        .sync_on(&s)
        .unwrap_err();
    assert!(
        matches!(err, DeviceError::InvalidArgument { .. }),
        "a kernel declaring 2 parameters given 4: {err}"
    );
    assert_exact(&read(&out), &[3.0; 4], "the output of a refused launch");
    Ok(())
}

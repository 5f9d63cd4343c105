//! Whose error a failed replay is: the failures of a graph's replays (and of the updates run
//! between them) are reported by that graph's `synchronize` / `replay_and_wait`, once, and
//! never to other work that shares the graph's stream.
//!
//! A replay fails after it was enqueued only where work can fail without faulting the device:
//! on the host backend (a kernel's host implementation that returns an error). On CUDA a
//! failing replay is a device fault, which the device reports to every op (see
//! `DeviceError::DeviceFaulted`), so these tests run on the host backend only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cuflow_device_op::{from_fn, DeviceOp, DeviceOpExt};
use cuflow_graph_capture::GraphCaptureExt;
use cuflow_runtime::{BackendKind, DeviceError, Kernel, KernelArgs, LaunchConfig};
use cuflow_testing::{
    device::{device, skip},
    ops::{add_scalar, assert_all, buffer, Buf},
};

/// `x[i] = x[i]`, whose host implementation fails while `fail` is set: work that fails on the
/// stream, after it was enqueued, each time it runs.
fn fails_while(fail: &Arc<AtomicBool>) -> Kernel {
    let fail = fail.clone();
    // SAFETY: the kernel reads and writes only `x[0..n)`, one element per thread.
    let kernel = unsafe {
        Kernel::new(
            "keep_or_fail",
            r#"extern "C" __global__ void keep_or_fail(float* x, unsigned n) {
            for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
                 i += blockDim.x * gridDim.x) {
                x[i] = x[i];
            }
        }"#,
        )
    };
    kernel.with_host(move |_| {
        if fail.load(Ordering::SeqCst) {
            Err(DeviceError::usage("keep_or_fail was told to fail"))
        } else {
            Ok(())
        }
    })
}

/// An op launching `kernel` over `x`.
fn launch(kernel: &Kernel, x: &Buf) -> impl DeviceOp<Output = ()> + 'static {
    let (kernel, x) = (kernel.clone(), x.clone());
    from_fn(move |ctx| {
        kernel.launch(
            ctx.stream()?,
            LaunchConfig::for_num_elems(x.len()),
            KernelArgs::new().output(&*x).scalar(x.len() as u32),
        )
    })
}

/// Whether the device under test can show these failures; says why not when it cannot.
fn failures_show_on_this_backend() -> bool {
    if device().kind() == BackendKind::Host {
        return true;
    }
    skip("host backend only: a replay that fails on CUDA is a device fault");
    false
}

#[track_caller]
fn assert_told_to_fail(r: Result<(), DeviceError>, what: &str) {
    match r {
        Err(DeviceError::Usage { what: why }) if why.contains("told to fail") => {}
        other => panic!("{what}: expected the replayed kernel's failure, got {other:?}"),
    }
}

#[test]
fn a_failed_replay_is_reported_by_its_graph_and_not_by_others_on_its_stream(
) -> Result<(), DeviceError> {
    if !failures_show_on_this_backend() {
        return Ok(());
    }
    let stream = device().new_stream()?;
    let fail = Arc::new(AtomicBool::new(false));
    let kernel = fails_while(&fail);
    let (x, y) = (buffer(0.0), buffer(0.0));
    let mut failing = launch(&kernel, &x).graph_on(stream.clone())?;
    let mut other = add_scalar(&y, 1.0).graph_on(stream.clone())?;

    fail.store(true, Ordering::SeqCst);
    failing.launch()?;
    // Another graph on the same stream, an op on it and a read of a buffer through it: none
    // of them is told of the failed replay.
    other.replay_and_wait()?;
    add_scalar(&y, 1.0).sync_on(&stream)?;
    assert_eq!(y.to_host_vec(&stream)?, vec![2.0; y.len()]);
    other.synchronize()?;
    // The failing graph is, once.
    assert_told_to_fail(failing.synchronize(), "the failed replay's graph");
    failing.synchronize()?;

    // Every failed replay is reported, by replay_and_wait too; a replay that succeeds again
    // reports nothing.
    assert_told_to_fail(failing.replay_and_wait(), "replay_and_wait");
    fail.store(false, Ordering::SeqCst);
    failing.replay_and_wait()?;
    assert_eq!(failing.launch_count(), 3);
    Ok(())
}

#[test]
fn a_failed_update_is_reported_by_its_graph_and_not_by_others_on_its_stream(
) -> Result<(), DeviceError> {
    if !failures_show_on_this_backend() {
        return Ok(());
    }
    let stream = device().new_stream()?;
    let fail = Arc::new(AtomicBool::new(true));
    let kernel = fails_while(&fail);
    let (x, y) = (buffer(0.0), buffer(0.0));
    let mut graph = add_scalar(&x, 1.0).graph_on(stream.clone())?;
    let mut other = add_scalar(&y, 1.0).graph_on(stream.clone())?;

    // The update's work fails after it was enqueued: the graph reports it at its next
    // synchronization, and the work around it on the stream still runs.
    graph.update(launch(&kernel, &x))?;
    graph.launch()?;
    other.replay_and_wait()?;
    assert_all(&y, 1.0, "the other graph's replay");
    assert_told_to_fail(graph.synchronize(), "the failed update's graph");
    assert_all(&x, 1.0, "the replay after the failed update");
    Ok(())
}

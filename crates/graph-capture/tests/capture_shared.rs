//! A `shared` op inside a captured multi-stream graph: the branches that read it are recorded
//! after its work, so every replay gives them what this replay's producer wrote.

use std::sync::Arc;

use cuflow_device_op::{from_fn, zip, DeviceOp, DeviceOpExt, Shared};
use cuflow_graph_capture::GraphCaptureExt;
use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig};
use cuflow_scheduler::StreamPoolRoundRobin;
use cuflow_testing::ops::{add_scalar, buffer, fill, fill_after, panic_on_stream, Gate};
use rand::Rng;

type Buf = Arc<DeviceBuffer<f32>>;

/// `x[i] += 1` after a pause, so that a reader not ordered after it reads the old value.
fn slow_increment() -> Kernel {
    // SAFETY: the kernel reads and writes only `x[0..n)`, one element per thread, and has no
    // data race of its own.
    let kernel = unsafe {
        Kernel::new(
            "slow_increment",
            r#"extern "C" __global__ void slow_increment(float* x, unsigned n, long long spin) {
            long long start = clock64();
            while (clock64() - start < spin) {}
            for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
                 i += blockDim.x * gridDim.x) {
                x[i] = x[i] + 1.0f;
            }
        }"#,
        )
    };
    kernel.with_host(|args| {
        std::thread::sleep(std::time::Duration::from_millis(2));
        for v in args.output::<f32>(0)? {
            *v += 1.0;
        }
        Ok(())
    })
}

/// `dst[i] = src[i]`.
fn copy() -> Kernel {
    // SAFETY: the kernel reads `src[0..n)` and writes `dst[0..n)`, one element per thread.
    let kernel = unsafe {
        Kernel::new(
            "copy_f32",
            r#"extern "C" __global__ void copy_f32(float* dst, const float* src, unsigned n) {
            for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
                 i += blockDim.x * gridDim.x) {
                dst[i] = src[i];
            }
        }"#,
        )
    };
    kernel.with_host(|args| {
        let src = args.input::<f32>(1)?;
        args.output::<f32>(0)?.copy_from_slice(src);
        Ok(())
    })
}

/// `src += 1` by [`slow_increment`] (spinning `spin` cycles first), as a shared op whose
/// output is `src`.
fn shared_increment(src: &Buf, n: usize, spin: i64) -> Shared<impl DeviceOp<Output = Buf>> {
    let src = src.clone();
    from_fn(move |ctx| {
        slow_increment().launch(
            ctx.stream()?,
            LaunchConfig::for_num_elems(n),
            KernelArgs::new()
                .output(&*src)
                .scalar(n as u32)
                .scalar(spin),
        )?;
        Ok(src)
    })
    .shared()
}

/// A consumer of `produced`: copies what it produced into `dst`.
fn read_into<P>(produced: &P, dst: &Buf, n: usize) -> impl DeviceOp<Output = Buf>
where
    P: DeviceOp<Output = Arc<Buf>> + Clone,
{
    let dst = dst.clone();
    produced.clone().then(move |src: Arc<Buf>| {
        from_fn(move |ctx| {
            copy().launch(
                ctx.stream()?,
                LaunchConfig::for_num_elems(n),
                KernelArgs::new()
                    .output(&*dst)
                    .input(&**src)
                    .scalar(n as u32),
            )?;
            Ok(dst)
        })
    })
}

#[test]
fn two_branches_reading_a_shared_op_in_a_captured_multi_stream_graph_read_what_it_wrote(
) -> Result<(), DeviceError> {
    let device = Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable");
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let stream = device.new_stream()?;
    let n = 1 << 16;
    let mut rng = rand::thread_rng();
    let mut want: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let src: Buf = Arc::new(DeviceBuffer::from_host(&stream, &want)?);
    let dsts: [Buf; 2] = [
        Arc::new(DeviceBuffer::zeroed(&stream, n)?),
        Arc::new(DeviceBuffer::zeroed(&stream, n)?),
    ];
    let produced = shared_increment(&src, n, 2_000_000);
    let read = |dst: &Buf| read_into(&produced, dst, n);
    let mut graph = zip!(read(&dsts[0]), read(&dsts[1])).graph_with_policy(&policy)?;
    assert!(
        graph.capture_stats().streams.len() >= 2,
        "the branches must be captured on streams of their own: {:?}",
        graph.capture_stats()
    );
    for replay in 0..5 {
        for dst in &dsts {
            dst.copy_from_host(&stream, &vec![f32::NAN; n])?;
        }
        graph.replay_and_wait()?;
        for v in &mut want {
            *v += 1.0;
        }
        for (i, dst) in dsts.iter().enumerate() {
            let got = dst.to_host_vec(graph.stream())?;
            let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            assert_eq!(
                wrong, 0,
                "replay {replay}, branch {i}: {wrong} of {n} elements are not what the producer \
                 wrote in this replay"
            );
        }
    }
    Ok(())
}

/// A `shared` op produced eagerly, its work possibly still running, then read by a consumer
/// captured on another stream: each replay reads what the eager production wrote (the
/// producer is not recorded into the graph and does not run again), never the buffer before
/// it.
#[test]
fn a_shared_op_produced_eagerly_is_read_by_a_captured_consumer() -> Result<(), DeviceError> {
    let device = Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable");
    let stream = device.new_stream()?;
    let other = device.new_stream()?;
    let n = 1 << 16;
    let mut rng = rand::thread_rng();
    let start: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let want: Vec<f32> = start.iter().map(|v| v + 1.0).collect();
    let src: Buf = Arc::new(DeviceBuffer::from_host(&stream, &start)?);
    let dsts: [Buf; 2] = [
        Arc::new(DeviceBuffer::from_host(&stream, &vec![f32::NAN; n])?),
        Arc::new(DeviceBuffer::from_host(&stream, &vec![f32::NAN; n])?),
    ];
    let produced = shared_increment(&src, n, 20_000_000);
    let read = |dst: &Buf| read_into(&produced, dst, n);
    // The eager consumer runs the producer; neither is waited for.
    let policy = cuflow_scheduler::default_policy(&device)?;
    let (eager_dst, _) = cuflow_device_op::enqueue_on(read(&dsts[0]), &stream, policy)?;
    let mut graph = read(&dsts[1]).graph_on(other.clone())?;
    for replay in 0..3 {
        dsts[1].copy_from_host(&stream, &vec![f32::NAN; n])?;
        graph.replay_and_wait()?;
        let got = dsts[1].to_host_vec(graph.stream())?;
        let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert_eq!(
            wrong, 0,
            "replay {replay}: {wrong} of {n} elements are not what the eager producer wrote"
        );
    }
    let got = eager_dst.to_host_vec(&stream)?;
    assert_eq!(got, want, "the eager consumer read what the producer wrote");
    Ok(())
}

/// A `shared` op produced inside one capture is written only by that graph's replays: a
/// consumer captured into another graph gets a capture error, at once, on every backend (and
/// the first graph still replays).
#[test]
fn a_shared_op_produced_in_one_capture_is_refused_by_another() -> Result<(), DeviceError> {
    let device = Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable");
    let stream = device.new_stream()?;
    let n = 1 << 10;
    let src: Buf = Arc::new(DeviceBuffer::from_host(&stream, &vec![1.0f32; n])?);
    let dst: Buf = Arc::new(DeviceBuffer::from_host(&stream, &vec![f32::NAN; n])?);
    let produced = shared_increment(&src, n, 1_000);
    let mut first = produced.clone().graph_on(device.new_stream()?)?;
    let consumer = read_into(&produced, &dst, n);
    let refused = consumer.graph_on(device.new_stream()?);
    assert!(
        matches!(refused, Err(DeviceError::Capture { .. })),
        "{:?}",
        refused.err()
    );
    first.replay_and_wait()?;
    assert_eq!(src.to_host_vec(&stream)?, vec![2.0; n]);
    assert!(dst.to_host_vec(&stream)?.iter().all(|v| v.is_nan()));
    Ok(())
}

/// An eagerly produced `shared` op whose work fails after it was enqueued (a host function
/// that panics): a consumer captured after the failure showed is refused at capture, on every
/// backend (the capture was `Ok`, and on CUDA, whose events carry device faults only, every
/// replay then read what the failed production never wrote).
#[test]
fn a_captured_consumer_of_a_failed_shared_production_is_refused() -> Result<(), DeviceError> {
    let device = Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable");
    let policy = StreamPoolRoundRobin::new(&device, 2)?;
    let x = buffer(0.0);
    let produced = fill(&x, 1.0)
        .then(|b| panic_on_stream().map(move |()| b))
        .shared();
    let eager = produced.clone().sync_with_policy(&policy);
    assert!(
        matches!(eager, Err(DeviceError::Panicked { .. })),
        "{eager:?}"
    );
    let captured = produced
        .then(|b| add_scalar(&b, 1.0))
        .graph_on(device.new_stream()?);
    match captured {
        Err(DeviceError::Capture { reason, .. }) => {
            assert!(reason.contains("panicked"), "{reason}")
        }
        Err(other) => panic!("expected a capture error, got {other:?}"),
        Ok(_) => panic!("a consumer of a failed production was captured"),
    }
    Ok(())
}

/// The same production failing only after the consumer was captured: every replay of the
/// graph reports the failure, on every backend.
#[test]
fn every_replay_of_a_consumer_of_a_shared_production_that_failed_later_fails(
) -> Result<(), DeviceError> {
    let device = Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable");
    let policy = StreamPoolRoundRobin::new(&device, 2)?;
    let mut gate = Gate::closed(&device)?;
    let x = buffer(0.0);
    let produced = fill_after(gate.event(), &x, 1.0)
        .then(|b| panic_on_stream().map(move |()| b))
        .shared();
    // Produced now; its work waits for the gate.
    let in_flight = produced.clone().schedule(&policy)?;
    let mut graph = produced
        .then(|b| add_scalar(&b, 1.0))
        .graph_on(device.new_stream()?)?;
    gate.open();
    drop(in_flight);
    for replay in 0..2 {
        let r = graph.replay_and_wait();
        assert!(
            matches!(r, Err(DeviceError::Panicked { .. })),
            "replay {replay}: {r:?}"
        );
    }
    // A replay inside another op: that op's execution fails.
    let r = graph.launch_op().sync_with_policy(&policy).map(drop);
    assert!(
        matches!(r, Err(DeviceError::Panicked { .. })),
        "a replay through launch_op: {r:?}"
    );
    Ok(())
}

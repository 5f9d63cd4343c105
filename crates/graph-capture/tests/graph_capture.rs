//! Record and replay on whatever `Device::auto()` gives (host in CI, CUDA under
//! `CUFLOW_DEVICE=cuda`).

use std::sync::Arc;

use cuflow_device_op::{zip, DeviceOp, DeviceOpExt, ExecutionContext};
use cuflow_graph_capture::{CudaGraph, GraphCaptureExt, RecaptureOutcome};
use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};
use cuflow_scheduler::StreamPoolRoundRobin;
use rand::Rng;

fn device() -> Device {
    Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable")
}

/// `x[i] = x[i] * a + b` over the buffer.
fn affine_kernel() -> Kernel {
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let kernel = unsafe {
        Kernel::new(
            "affine",
            r#"extern "C" __global__ void affine(float* x, float a, float b, unsigned n) {
            for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
                 i += blockDim.x * gridDim.x) {
                x[i] = x[i] * a + b;
            }
        }"#,
        )
    };
    kernel.with_host(|args| {
        let a = args.scalar::<f32>(1)?;
        let b = args.scalar::<f32>(2)?;
        for v in args.output::<f32>(0)? {
            *v = *v * a + b;
        }
        Ok(())
    })
}

/// `dst[i] = src[i]`.
fn copy_kernel() -> Kernel {
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
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

struct Affine {
    x: Arc<DeviceBuffer<f32>>,
    a: f32,
    b: f32,
}

impl DeviceOp for Affine {
    type Output = Arc<DeviceBuffer<f32>>;
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        let n = self.x.len();
        affine_kernel().launch(
            ctx.stream()?,
            LaunchConfig::for_num_elems(n),
            KernelArgs::new()
                .output(&*self.x)
                .scalar(self.a)
                .scalar(self.b)
                .scalar(n as u32),
        )?;
        Ok(self.x)
    }
}

struct Copy {
    dst: Arc<DeviceBuffer<f32>>,
    src: Arc<DeviceBuffer<f32>>,
}

impl DeviceOp for Copy {
    type Output = Arc<DeviceBuffer<f32>>;
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        let n = self.dst.len();
        copy_kernel().launch(
            ctx.stream()?,
            LaunchConfig::for_num_elems(n),
            KernelArgs::new()
                .output(&*self.dst)
                .input(&*self.src)
                .scalar(n as u32),
        )?;
        Ok(self.dst)
    }
}

/// An op that allocates while it runs.
struct Allocating;

impl DeviceOp for Allocating {
    type Output = DeviceBuffer<f32>;
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        DeviceBuffer::zeroed(ctx.stream()?, 16)
    }
}

/// An op that reads a buffer back to the host while it runs.
struct ReadsBack(Arc<DeviceBuffer<f32>>);

impl DeviceOp for ReadsBack {
    type Output = Vec<f32>;
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        self.0.to_host_vec(ctx.stream()?)
    }
}

fn random(n: usize) -> Vec<f32> {
    let mut rng = rand::thread_rng();
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs() / w.abs().max(1.0))
        .fold(0.0, f64::max)
}

#[test]
fn replay_n_times_has_n_times_the_effect() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let n = 4097;
    let init = random(n);
    let x = Arc::new(DeviceBuffer::from_host(&stream, &init)?);
    let mut graph = Affine {
        x: x.clone(),
        a: 1.0,
        b: 0.5,
    }
    .graph_on(stream.clone())?;
    // Capturing runs nothing.
    let after_capture = x.to_host_vec(&stream)?;
    assert_eq!(after_capture, init, "capture must record, not run");
    let replays = 7;
    for _ in 0..replays {
        graph.launch()?;
    }
    graph.synchronize()?;
    let want: Vec<f64> = init
        .iter()
        .map(|v| *v as f64 + 0.5 * replays as f64)
        .collect();
    let err = max_rel_err(&x.to_host_vec(&stream)?, &want);
    assert!(err < 1e-5, "relative error {err}");
    assert_eq!(graph.launch_count(), replays);
    assert!(graph.graph().node_count()? >= 1);
    Ok(())
}

#[test]
fn update_feeds_new_inputs_between_replays() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let n = 1000;
    let input = Arc::new(DeviceBuffer::from_host(&stream, &random(n))?);
    let output = Arc::new(DeviceBuffer::<f32>::zeroed(&stream, n)?);
    // step: output = input * 2 + 1
    let step = Copy {
        dst: output.clone(),
        src: input.clone(),
    }
    .then({
        let out = output.clone();
        move |_| Affine {
            x: out,
            a: 2.0,
            b: 1.0,
        }
    });
    let mut graph = step.graph_on(stream.clone())?;
    let out = graph.take_output().expect("output is taken once");
    assert!(graph.take_output().is_none());
    for _ in 0..3 {
        let token = random(n);
        let staged = Arc::new(DeviceBuffer::from_host(&stream, &token)?);
        graph.update(Copy {
            dst: input.clone(),
            src: staged,
        })?;
        graph.replay_and_wait()?;
        let want: Vec<f64> = token.iter().map(|v| *v as f64 * 2.0 + 1.0).collect();
        let err = max_rel_err(&out.to_host_vec(&stream)?, &want);
        assert!(err < 1e-5, "relative error {err}");
    }
    Ok(())
}

#[test]
fn zip_branches_on_two_streams_are_parallel_graph_branches() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let stream = device.new_stream()?;
    let a = Arc::new(DeviceBuffer::from_host(&stream, &[1.0f32; 64])?);
    let b = Arc::new(DeviceBuffer::from_host(&stream, &[2.0f32; 64])?);
    stream.synchronize()?;
    let op = zip!(
        Affine {
            x: a.clone(),
            a: 3.0,
            b: 0.0
        },
        Affine {
            x: b.clone(),
            a: 5.0,
            b: 0.0
        }
    );
    let mut graph = op.graph_with_policy(&policy)?;
    let stats = graph.capture_stats().clone();
    // The root stream plus one stream per branch (a pool of 4 hands out distinct streams).
    assert_eq!(
        stats.streams.len(),
        3,
        "root and two branch streams: {stats:?}"
    );
    let g = graph.graph();
    assert!(
        g.max_parallelism()? >= 2,
        "the two kernels must not depend on each other: nodes {}, edges {:?}",
        g.node_count()?,
        g.edges()?
    );
    graph.replay_and_wait()?;
    let s = graph.stream().clone();
    assert_eq!(a.to_host_vec(&s)?, vec![3.0; 64]);
    assert_eq!(b.to_host_vec(&s)?, vec![10.0; 64]);
    Ok(())
}

/// The buffer an op allocates while captured is the graph's output: every replay rewrites it,
/// and it stays valid after the graph is dropped.
#[test]
fn allocation_during_capture_is_the_graphs_output() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let mut graph = Allocating
        .then(|buf: DeviceBuffer<f32>| Affine {
            x: Arc::new(buf),
            a: 2.0,
            b: 3.0,
        })
        .graph_on(stream.clone())?;
    let out = graph.take_output().expect("the captured op's output");
    for _ in 0..3 {
        out.copy_from_host(&stream, &[5.0; 16])?;
        graph.replay_and_wait()?;
        // Zeroed, then 0 * 2 + 3, whatever the buffer held before the replay.
        assert_eq!(out.to_host_vec(&stream)?, vec![3.0; 16]);
    }
    drop(graph);
    assert_eq!(out.to_host_vec(&stream)?, vec![3.0; 16]);
    Ok(())
}

#[test]
fn host_sync_during_capture_is_refused_and_stream_stays_usable() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let x = Arc::new(DeviceBuffer::from_host(&stream, &[1.0f32; 5])?);
    let err = ReadsBack(x.clone()).graph_on(stream.clone()).unwrap_err();
    assert!(matches!(err, DeviceError::Capture { .. }), "{err}");
    assert!(!stream.is_capturing());
    assert_eq!(ReadsBack(x).sync_on(&stream)?, vec![1.0; 5]);
    Ok(())
}

#[test]
fn recapture_same_topology_updates_in_place() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let x = Arc::new(DeviceBuffer::from_host(&stream, &[1.0f32; 256])?);
    let mut graph: CudaGraph<_> = Affine {
        x: x.clone(),
        a: 1.0,
        b: 1.0,
    }
    .graph_on(stream.clone())?;
    graph.replay_and_wait()?;
    assert_eq!(x.to_host_vec(&stream)?, vec![2.0; 256]);
    let outcome = graph.recapture(Affine {
        x: x.clone(),
        a: 10.0,
        b: 0.0,
    })?;
    assert_eq!(outcome, RecaptureOutcome::Updated);
    graph.replay_and_wait()?;
    assert_eq!(x.to_host_vec(&stream)?, vec![20.0; 256]);
    Ok(())
}

#[test]
fn cuda_graph_is_send_and_replays_on_another_thread() -> Result<(), DeviceError> {
    fn assert_send<T: Send>(_: &T) {}
    let device = device();
    let stream: Stream = device.new_stream()?;
    let x = Arc::new(DeviceBuffer::from_host(&stream, &[0.0f32; 32])?);
    let mut graph = Affine {
        x: x.clone(),
        a: 1.0,
        b: 2.0,
    }
    .graph_on(stream.clone())?;
    assert_send(&graph);
    std::thread::spawn(move || graph.replay_and_wait())
        .join()
        .expect("replay thread")?;
    assert_eq!(x.to_host_vec(&stream)?, vec![2.0; 32]);
    Ok(())
}

//! Random programs of tensor ops over a few tensors, each op enqueued at once on one of three
//! streams and none waited for before the next: the access ordering must make every tensor
//! end as the program run in order would leave it. Tensors share buffers through clones, ops
//! write them in place (`saxpy`, `memcpy` into rows, a user kernel that writes after a spin,
//! so that a reader that does not wait for it sees the old values), and tensors are dropped
//! while work that reads them is in flight; products go through the library's GEMM. Each
//! program is held to a float64 model of its buffers, read back part-way and at its end; an
//! op the model says is invalid (a user kernel's input in the buffer it writes, a copy
//! between overlapping rows of one buffer) must fail at once with a clear error and leave the
//! buffers as they were. Three threads run programs at once on the same streams. Half the
//! programs also capture a graph that writes two of their buffers in place, and replay it on
//! any of the streams between the eager ops, which must order replays like any other access.
//!
//! A second test spreads the programs over two devices: tensors move between them
//! (`to_device`, enqueued on a stream of either), and an op enqueued on a stream of another
//! device than one of its tensors must fail at once with a device mismatch.
//! `CUFLOW_RANDOM_STREAMS=N` runs N times as many programs.

use std::sync::{Arc, OnceLock};

use cuflow_device_op::{enqueue_on, DeviceError, DeviceOp, DeviceOpExt};
use cuflow_graph_capture::{CudaGraph, GraphCaptureExt};
use cuflow_runtime::{Device, Kernel, Stream};
use cuflow_scheduler::{SchedulingPolicy, SingleStream};
use cuflow_tensor::{api, kernels, Launch, PartitionExt, Tensor, ToDeviceExt};
use cuflow_testing::{
    device::{device, new_streams, two_devices},
    kernels::host_spin_duration,
    policies::RandomPlacement,
    rng::{scale_from_env, seeded_rng},
    thread::within_a_minute,
};
use rand::rngs::StdRng;
use rand::Rng;

/// Tensors a program works on, each a `[n, n]` view of a whole buffer.
const VARS: usize = 4;

/// Cycles a slow write spins before writing: about 50 µs (the host sleeps as long).
const SPIN: u64 = 100_000;

/// `out = a * x + b` after one thread of the block spun for `cycles`: a write that lands
/// late. Its accesses are bounded by the element counts the launch appends.
fn spin_affine() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        let source = r#"extern "C" __global__ void streams_spin_affine(float* out, const float* x,
                float a, float b, unsigned long long cycles, unsigned long long n_out,
                unsigned long long n_x) {
            if (threadIdx.x == 0) {
                long long start = clock64();
                while ((unsigned long long)(clock64() - start) < cycles) { }
            }
            __syncthreads();
            unsigned long long n = n_out < n_x ? n_out : n_x;
            for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
                out[i] = a * x[i] + b;
            }
        }"#;
        // SAFETY: the kernel reads `x` and writes `out` below the element counts the launch
        // appends, one element per thread and iteration, whatever the tile, block or scalars.
        unsafe { Kernel::new("streams_spin_affine", source) }.with_host(|args| {
            let (a, b) = (args.scalar::<f32>(2)?, args.scalar::<f32>(3)?);
            std::thread::sleep(host_spin_duration(args.scalar::<u64>(4)?));
            let x = args.input::<f32>(1)?.to_vec();
            for (o, x) in args.output::<f32>(0)?.iter_mut().zip(x) {
                *o = a * x + b;
            }
            Ok(())
        })
    })
}

/// One op of a program over tensors `0..VARS`.
#[derive(Clone, Debug)]
enum Step {
    /// `t[d] = from_slice(values)`: a new buffer.
    Fresh(usize, Vec<f32>),
    /// `t[d] = t[s].clone()`: the two now share a buffer.
    Clone(usize, usize),
    /// `t[d] = scale(t[s], a)`.
    Scale(usize, usize, f32),
    /// `t[d] = add(t[a], t[b])`.
    Add(usize, usize, usize),
    /// `t[d] = matmul(t[a], t[b])`, then scaled by `c` in a `then` of the same op.
    Matmul(usize, usize, usize, f32),
    /// `t[d] = contiguous(transpose(t[s]))` (a view of `t[s]`'s buffer where `n` is 1).
    Transpose(usize, usize),
    /// `t[d] += a * t[s]` in place.
    Saxpy(usize, usize, f32),
    /// `t[d] = a * t[s] + b` in place, after a spin.
    SpinAffine(usize, usize, f32, f32),
    /// Rows `dr..dr + k` of `t[d]` = rows `sr..sr + k` of `t[s]`, in place.
    Memcpy {
        d: usize,
        dr: usize,
        s: usize,
        sr: usize,
        k: usize,
    },
    /// `t[v]` read back and checked against the model.
    Check(usize),
    /// One replay of the program's graph (see [`Graph`]), or a check where it has none.
    Replay,
    /// `t[d] = t[s].to_device(devices[to])`.
    Move(usize, usize, usize),
}

impl Step {
    /// The tensors the step reads or writes on the executing stream's device, which must be
    /// theirs.
    fn operands(&self) -> Vec<usize> {
        match *self {
            Step::Scale(_, s, _) | Step::Transpose(_, s) => vec![s],
            Step::Add(_, a, b) | Step::Matmul(_, a, b, _) => vec![a, b],
            Step::Saxpy(d, s, _) | Step::SpinAffine(d, s, ..) | Step::Memcpy { d, s, .. } => {
                vec![d, s]
            }
            Step::Fresh(..) | Step::Clone(..) | Step::Check(_) | Step::Replay | Step::Move(..) => {
                vec![]
            }
        }
    }
}

/// What the model says of a step run on a stream of a given device.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    Valid,
    /// Two arguments overlap in the buffer the step writes.
    Overlap,
    /// A tensor (or the graph) is on another device than the executing stream.
    Mismatch,
}

/// What a program's graph does, captured over the buffers of its first two tensors, `a` and
/// `b`: `a = 0.5 b + bias` after a spin, then `b -= a` (values that stay bounded however
/// often it is replayed).
#[derive(Clone, Copy, Debug)]
struct Graph {
    a: usize,
    b: usize,
    bias: f32,
}

/// The float64 model of a program: the elements of each buffer and the device it is on,
/// and which buffer each tensor is a view of.
#[derive(Clone, Debug)]
struct Model {
    n: usize,
    buffers: Vec<Vec<f64>>,
    on: Vec<usize>,
    vars: [usize; VARS],
    graph: Option<Graph>,
}

impl Model {
    fn var(&self, v: usize) -> &[f64] {
        &self.buffers[self.vars[v]]
    }

    fn fresh(&mut self, d: usize, data: Vec<f64>, device: usize) {
        self.buffers.push(data);
        self.on.push(device);
        self.vars[d] = self.buffers.len() - 1;
    }

    /// The device tensor `v` is on.
    fn device_of(&self, v: usize) -> usize {
        self.on[self.vars[v]]
    }

    fn same_buffer(&self, a: usize, b: usize) -> bool {
        self.vars[a] == self.vars[b]
    }

    /// Applies `step`, run on a stream of device `device`; an invalid step changes nothing.
    fn apply(&mut self, step: &Step, device: usize) -> Outcome {
        let n = self.n;
        let graph_elsewhere =
            matches!(step, Step::Replay) && self.graph.is_some_and(|g| self.on[g.a] != device);
        if graph_elsewhere || step.operands().iter().any(|&v| self.device_of(v) != device) {
            return Outcome::Mismatch;
        }
        match *step {
            Step::Fresh(d, ref values) => {
                self.fresh(d, values.iter().map(|&v| v.into()).collect(), device)
            }
            Step::Move(d, s, to) => {
                let data = self.var(s).to_vec();
                self.fresh(d, data, to);
            }
            Step::Clone(d, s) => self.vars[d] = self.vars[s],
            Step::Scale(d, s, a) => {
                let out = self.var(s).iter().map(|x| x * f64::from(a)).collect();
                self.fresh(d, out, device);
            }
            Step::Add(d, a, b) => {
                let out = self
                    .var(a)
                    .iter()
                    .zip(self.var(b))
                    .map(|(x, y)| x + y)
                    .collect();
                self.fresh(d, out, device);
            }
            Step::Matmul(d, a, b, c) => {
                let (x, y) = (self.var(a), self.var(b));
                let mut out = vec![0.0; n * n];
                for i in 0..n {
                    for j in 0..n {
                        let dot: f64 = (0..n).map(|k| x[i * n + k] * y[k * n + j]).sum();
                        out[i * n + j] = dot * f64::from(c);
                    }
                }
                self.fresh(d, out, device);
            }
            // The transpose of a `[1, 1]` tensor is contiguous already: `contiguous` gives
            // the view itself, on the same buffer.
            Step::Transpose(d, s) if n == 1 => self.vars[d] = self.vars[s],
            Step::Transpose(d, s) => {
                let x = self.var(s);
                let out = (0..n * n).map(|k| x[(k % n) * n + k / n]).collect();
                self.fresh(d, out, device);
            }
            Step::Saxpy(d, s, a) => {
                // An `x` in the output's buffer is read as it was before the op.
                let x = self.var(s).to_vec();
                for (o, x) in self.buffers[self.vars[d]].iter_mut().zip(x) {
                    *o += f64::from(a) * x;
                }
            }
            Step::SpinAffine(d, s, a, b) => {
                if self.same_buffer(d, s) {
                    return Outcome::Overlap;
                }
                let x = self.var(s).to_vec();
                for (o, x) in self.buffers[self.vars[d]].iter_mut().zip(x) {
                    *o = f64::from(a) * x + f64::from(b);
                }
            }
            Step::Memcpy { d, dr, s, sr, k } => {
                if self.same_buffer(d, s) && dr != sr && dr < sr + k && sr < dr + k {
                    return Outcome::Overlap;
                }
                let rows = self.var(s)[sr * n..(sr + k) * n].to_vec();
                let buffer = self.vars[d];
                self.buffers[buffer][dr * n..(dr + k) * n].copy_from_slice(&rows);
            }
            Step::Check(_) => {}
            Step::Replay => {
                if let Some(Graph { a, b, bias }) = self.graph {
                    let x = self.buffers[b].clone();
                    for (o, x) in self.buffers[a].iter_mut().zip(&x) {
                        *o = 0.5 * x + f64::from(bias);
                    }
                    let y = self.buffers[a].clone();
                    for (o, y) in self.buffers[b].iter_mut().zip(y) {
                        *o -= y;
                    }
                }
            }
        }
        Outcome::Valid
    }
}

/// Small integers, so that every op of a program but the products is exact in `f32` and a
/// stale read shows as a difference of at least one.
fn values(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n * n).map(|_| rng.gen_range(-4i8..=4).into()).collect()
}

fn draw(rng: &mut StdRng, n: usize, devices: usize) -> Step {
    let var = |rng: &mut StdRng| rng.gen_range(0..VARS);
    let factor = |rng: &mut StdRng| [-1.0, 0.5, 2.0, 3.0][rng.gen_range(0..4)];
    match rng.gen_range(0..22) {
        0 => Step::Fresh(var(rng), values(rng, n)),
        1 | 2 => Step::Clone(var(rng), var(rng)),
        3 | 4 => Step::Scale(var(rng), var(rng), factor(rng)),
        5 | 6 => Step::Add(var(rng), var(rng), var(rng)),
        7 => Step::Matmul(var(rng), var(rng), var(rng), 1.0 / n as f32),
        8 => Step::Transpose(var(rng), var(rng)),
        9..=11 => Step::Saxpy(var(rng), var(rng), factor(rng)),
        12..=14 => Step::SpinAffine(
            var(rng),
            var(rng),
            factor(rng),
            rng.gen_range(-2i8..=2).into(),
        ),
        15..=17 => {
            let k = rng.gen_range(0..=n);
            Step::Memcpy {
                d: var(rng),
                dr: rng.gen_range(0..=n - k),
                s: var(rng),
                sr: rng.gen_range(0..=n - k),
                k,
            }
        }
        18 => Step::Replay,
        19 if devices > 1 => Step::Move(var(rng), var(rng), rng.gen_range(0..devices)),
        _ => Step::Check(var(rng)),
    }
}

/// Asserts that `t` holds `want`. The products (scaled by `1 / n`) round in `f32`, so
/// elements are held to a tolerance relative to the largest element, some hundred times the
/// rounding of one op; a stale or lost write differs by far more.
fn assert_holds(what: &str, t: &Tensor<f32>, want: &[f64]) {
    let got = t.to_host_vec().expect("read a tensor back");
    assert_eq!(got.len(), want.len(), "{what}: elements read back");
    let scale = want.iter().fold(1.0f64, |a, w| a.max(w.abs()));
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(*g) - w).abs() <= 1e-5 * scale,
            "{what}: element {k} is {g}, the program run in order gives {w}"
        );
    }
}

/// Enqueues `op` on `stream` under `policy` without waiting for it.
fn enqueue<O: DeviceOp>(
    op: O,
    stream: &Stream,
    policy: &Arc<dyn SchedulingPolicy>,
) -> Result<O::Output, DeviceError> {
    enqueue_on(op, stream, policy.clone()).map(|(out, _)| out)
}

/// Runs `step` on the device, enqueued on `stream`.
fn run_step(
    step: &Step,
    t: &mut [Tensor<f32>; VARS],
    devices: &[Device],
    graph: Option<&CudaGraph<()>>,
    n: usize,
    stream: &Stream,
    policy: &Arc<dyn SchedulingPolicy>,
) -> Result<(), DeviceError> {
    match *step {
        Step::Fresh(d, ref values) => {
            t[d] = enqueue(api::from_slice(values, &[n, n]), stream, policy)?
        }
        Step::Clone(d, s) => t[d] = t[s].clone(),
        Step::Move(d, s, to) => t[d] = enqueue((&t[s]).to_device(&devices[to]), stream, policy)?,
        Step::Scale(d, s, a) => t[d] = enqueue(kernels::scale(&t[s], a), stream, policy)?,
        Step::Add(d, a, b) => t[d] = enqueue(kernels::add(&t[a], &t[b]), stream, policy)?,
        Step::Matmul(d, a, b, c) => {
            let op = kernels::matmul(&t[a], &t[b]).then(move |p| kernels::scale(p, c));
            t[d] = enqueue(op, stream, policy)?;
        }
        Step::Transpose(d, s) => {
            let view = t[s].transpose(0, 1)?;
            t[d] = enqueue(view.contiguous(), stream, policy)?;
        }
        Step::Saxpy(d, s, a) => {
            let x = t[s].clone();
            enqueue(
                kernels::saxpy((&mut t[d]).partition([n, n]), a, &x),
                stream,
                policy,
            )?;
        }
        Step::SpinAffine(d, s, a, b) => {
            let x = t[s].clone();
            let op = Launch::new(spin_affine(), (&mut t[d]).partition([n, n]))
                .block_threads(256)
                .input(&x)
                .scalar(a)
                .scalar(b)
                .scalar(SPIN);
            enqueue(op, stream, policy)?;
        }
        Step::Memcpy { d, dr, s, sr, k } => {
            let mut rows = t[d].narrow(0, dr, k)?;
            let from = t[s].narrow(0, sr, k)?;
            enqueue(api::memcpy(&mut rows, &from), stream, policy)?;
        }
        Step::Check(_) => {}
        Step::Replay => {
            if let Some(graph) = graph {
                enqueue(graph.launch_op(), stream, policy)?;
            }
        }
    }
    Ok(())
}

/// The error an invalid step must give: an overlap of its arguments in the buffer it writes
/// is an invalid shape or argument, a tensor of another device a device mismatch.
fn assert_refused(what: &str, outcome: Outcome, got: Result<(), DeviceError>) {
    match (outcome, got) {
        (_, Ok(())) => panic!("{what}: succeeded, but the model says {outcome:?}"),
        (
            Outcome::Overlap,
            Err(DeviceError::InvalidShape { .. } | DeviceError::InvalidArgument { .. }),
        )
        | (Outcome::Mismatch, Err(DeviceError::DeviceMismatch { .. })) => {}
        (_, Err(e)) => panic!("{what}: must be refused as {outcome:?}, got {e:?}"),
    }
}

/// The streams and policies of one device of a program.
struct Lane {
    streams: Vec<Stream>,
    policies: Vec<Arc<dyn SchedulingPolicy>>,
}

impl Lane {
    fn new(device: &Device, streams: &[Stream], seed: u64) -> Lane {
        Lane {
            streams: streams.to_vec(),
            policies: vec![
                Arc::new(SingleStream::new(device).expect("a stream")),
                Arc::new(RandomPlacement::new(device, 3, seed).expect("streams")),
            ],
        }
    }
}

/// Runs `count` programs of `len` steps from `seed` over `devices`, each step enqueued on one
/// of the device's `streams` at random (mostly a stream of its first tensor's device).
fn run_programs(devices: &[Device], streams: &[Vec<Stream>], seed: u64, count: usize, len: usize) {
    let mut rng = seeded_rng(seed);
    let lanes: Vec<Lane> = devices
        .iter()
        .zip(streams)
        .map(|(d, s)| Lane::new(d, s, seed))
        .collect();
    for program in 0..count {
        let n = [1, 8, 33][rng.gen_range(0..3)];
        let mut model = Model {
            n,
            buffers: Vec::new(),
            on: Vec::new(),
            vars: [0; VARS],
            graph: None,
        };
        // Every tensor starts on the first device, where the graph is captured.
        let mut t: [Tensor<f32>; VARS] = std::array::from_fn(|v| {
            let data = values(&mut rng, n);
            model.fresh(v, data.iter().map(|&x| x.into()).collect(), 0);
            api::from_slice(&data, &[n, n])
                .sync_on(&streams[0][0])
                .expect("upload a tensor")
        });
        // Half the programs capture a graph over their first two tensors' buffers, which
        // their `Replay` steps replay on any stream, ordered with the eager ops around them.
        let graph = if rng.gen_bool(0.5) {
            let g = Graph {
                a: model.vars[0],
                b: model.vars[1],
                bias: rng.gen_range(-2i8..=2).into(),
            };
            model.graph = Some(g);
            let (a, b) = (t[0].clone(), t[1].clone());
            let op = Launch::new(spin_affine(), a.clone().partition([n, n]))
                .block_threads(256)
                .input(b.clone())
                .scalar(0.5f32)
                .scalar(g.bias)
                .scalar(SPIN)
                .then(move |_| kernels::saxpy(b.partition([n, n]), -1.0, a))
                .map(|_| ());
            Some(
                op.graph_on(streams[0][0].clone())
                    .expect("capture the program's graph"),
            )
        } else {
            None
        };
        let mut steps = Vec::new();
        for _ in 0..len {
            let step = draw(&mut rng, n, devices.len());
            let device = match step.operands().first() {
                Some(&v) if rng.gen_bool(0.85) => model.device_of(v),
                _ => rng.gen_range(0..devices.len()),
            };
            steps.push((step.clone(), device));
            let what = format!("program {program} of seed {seed:#x} (n = {n}), steps {steps:?}");
            let lane = &lanes[device];
            let stream = &lane.streams[rng.gen_range(0..lane.streams.len())];
            let policy = &lane.policies[rng.gen_range(0..lane.policies.len())];
            let outcome = model.apply(&step, device);
            let got = run_step(&step, &mut t, devices, graph.as_ref(), n, stream, policy);
            match outcome {
                Outcome::Valid => {
                    if let Err(e) = got {
                        panic!("{what}: failed: {e}");
                    }
                }
                _ => assert_refused(&what, outcome, got),
            }
            if let Step::Check(v) = step {
                assert_holds(&what, &t[v], model.var(v));
            }
            // Values that grow past a few thousand are started afresh (products and sums of
            // sums grow), so that rounding stays far below one.
            if model
                .vars
                .iter()
                .any(|&b| model.buffers[b].iter().any(|x| x.abs() > 4096.0))
            {
                for (v, x) in t.iter_mut().enumerate() {
                    let data = values(&mut rng, n);
                    model.fresh(v, data.iter().map(|&x| x.into()).collect(), device);
                    *x = enqueue(api::from_slice(&data, &[n, n]), stream, policy)
                        .expect("upload a tensor");
                }
            }
        }
        for (v, x) in t.iter().enumerate() {
            let what = format!(
                "program {program} of seed {seed:#x} (n = {n}) at its end, tensor {v}, steps \
                 {steps:?}"
            );
            assert_holds(&what, x, model.var(v));
        }
    }
}

/// Runs the programs of three threads at once over `devices`, three streams each.
fn run_threads(devices: Vec<Device>, seed: u64, count: usize) {
    within_a_minute(
        "random programs of tensor ops over three streams",
        move || {
            let streams: Vec<Vec<Stream>> = devices
                .iter()
                .map(|d| new_streams(d, 3).expect("three streams"))
                .collect();
            std::thread::scope(|s| {
                for thread in 0..3u64 {
                    let (devices, streams) = (&devices, &streams);
                    s.spawn(move || run_programs(devices, streams, seed + thread, count, 24));
                }
            });
        },
    );
}

#[test]
fn tensor_ops_on_random_streams_end_as_run_in_order() {
    let count = 12 * scale_from_env("CUFLOW_RANDOM_STREAMS");
    run_threads(vec![device()], 0x5eed_7000, count);
}

#[test]
fn tensor_ops_on_two_devices_end_as_run_in_order() {
    let Some(devices) = two_devices() else {
        return;
    };
    let count = 8 * scale_from_env("CUFLOW_RANDOM_STREAMS");
    run_threads(devices.into_iter().take(2).collect(), 0x5eed_7100, count);
}

//! Random programs of tensor ops over a few tensors, each op enqueued at once on one of three
//! streams and none waited for before the next: the access ordering must make every tensor
//! end as the program run in order would leave it. Tensors share buffers through clones, ops
//! write them in place (`saxpy`, `memcpy` into rows, a user kernel that writes after a spin,
//! so that a reader that does not wait for it sees the old values), and tensors are dropped
//! while work that reads them is in flight; products go through the library's GEMM. Each
//! program is held to a float64 model of its buffers, read back part-way and at its end; an
//! op the model says is invalid (a user kernel's input in the buffer it writes, a copy
//! between overlapping rows of one buffer) must fail at once with a clear error and leave the
//! buffers as they were. Three threads run programs
//! at once on the same streams. Half the programs also capture a graph that writes two of
//! their buffers in place, and replay it on any of the streams between the eager ops, which
//! must order replays like any other access. `CUFLOW_RANDOM_STREAMS=N` runs N times as many
//! programs.

use std::sync::{Arc, OnceLock};

use cuflow_device_op::{enqueue_on, DeviceError, DeviceOp, DeviceOpExt};
use cuflow_graph_capture::{CudaGraph, GraphCaptureExt};
use cuflow_runtime::{Device, Kernel, Stream};
use cuflow_scheduler::{SchedulingPolicy, SingleStream};
use cuflow_tensor::{api, kernels, Launch, PartitionExt, Tensor};
use cuflow_testing::{
    device::{device, new_streams},
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

/// The float64 model of a program: the elements of each buffer, and which buffer each
/// tensor is a view of.
#[derive(Clone, Debug)]
struct Model {
    n: usize,
    buffers: Vec<Vec<f64>>,
    vars: [usize; VARS],
    graph: Option<Graph>,
}

impl Model {
    fn var(&self, v: usize) -> &[f64] {
        &self.buffers[self.vars[v]]
    }

    fn fresh(&mut self, d: usize, data: Vec<f64>) {
        self.buffers.push(data);
        self.vars[d] = self.buffers.len() - 1;
    }

    fn same_buffer(&self, a: usize, b: usize) -> bool {
        self.vars[a] == self.vars[b]
    }

    /// Applies `step`; `false` when the step is invalid (and changes nothing).
    fn apply(&mut self, step: &Step) -> bool {
        let n = self.n;
        match *step {
            Step::Fresh(d, ref values) => self.fresh(d, values.iter().map(|&v| v.into()).collect()),
            Step::Clone(d, s) => self.vars[d] = self.vars[s],
            Step::Scale(d, s, a) => {
                let out = self.var(s).iter().map(|x| x * f64::from(a)).collect();
                self.fresh(d, out);
            }
            Step::Add(d, a, b) => {
                let out = self
                    .var(a)
                    .iter()
                    .zip(self.var(b))
                    .map(|(x, y)| x + y)
                    .collect();
                self.fresh(d, out);
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
                self.fresh(d, out);
            }
            // The transpose of a `[1, 1]` tensor is contiguous already: `contiguous` gives
            // the view itself, on the same buffer.
            Step::Transpose(d, s) if n == 1 => self.vars[d] = self.vars[s],
            Step::Transpose(d, s) => {
                let x = self.var(s);
                let out = (0..n * n).map(|k| x[(k % n) * n + k / n]).collect();
                self.fresh(d, out);
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
                    return false;
                }
                let x = self.var(s).to_vec();
                for (o, x) in self.buffers[self.vars[d]].iter_mut().zip(x) {
                    *o = f64::from(a) * x + f64::from(b);
                }
            }
            Step::Memcpy { d, dr, s, sr, k } => {
                if self.same_buffer(d, s) && dr != sr && dr < sr + k && sr < dr + k {
                    return false;
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
        true
    }
}

/// Small integers, so that every op of a program but the products is exact in `f32` and a
/// stale read shows as a difference of at least one.
fn values(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n * n).map(|_| rng.gen_range(-4i8..=4).into()).collect()
}

fn draw(rng: &mut StdRng, n: usize) -> Step {
    let var = |rng: &mut StdRng| rng.gen_range(0..VARS);
    let factor = |rng: &mut StdRng| [-1.0, 0.5, 2.0, 3.0][rng.gen_range(0..4)];
    match rng.gen_range(0..21) {
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

/// The error an invalid step must give: its arguments overlap in the buffer it writes.
fn assert_refused(what: &str, step: &Step, got: Result<(), DeviceError>) {
    match got {
        Ok(()) => panic!("{what}: succeeded, but its arguments overlap in the buffer it writes"),
        Err(DeviceError::InvalidShape { .. } | DeviceError::InvalidArgument { .. }) => {}
        Err(e) => panic!("{what}: {step:?} must be refused as overlapping, got {e:?}"),
    }
}

/// Runs `count` programs of `len` steps from `seed`, enqueued on `streams` at random.
fn run_programs(device: &Device, streams: &[Stream], seed: u64, count: usize, len: usize) {
    let mut rng = seeded_rng(seed);
    let policies: Vec<Arc<dyn SchedulingPolicy>> = vec![
        Arc::new(SingleStream::new(device).expect("a stream")),
        Arc::new(RandomPlacement::new(device, 3, seed).expect("streams")),
    ];
    for program in 0..count {
        let n = [1, 8, 33][rng.gen_range(0..3)];
        let mut model = Model {
            n,
            buffers: Vec::new(),
            vars: [0; VARS],
            graph: None,
        };
        let mut t: [Tensor<f32>; VARS] = std::array::from_fn(|v| {
            let data = values(&mut rng, n);
            model.fresh(v, data.iter().map(|&x| x.into()).collect());
            api::from_slice(&data, &[n, n])
                .sync_on(&streams[0])
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
                op.graph_on(streams[0].clone())
                    .expect("capture the program's graph"),
            )
        } else {
            None
        };
        let mut steps = Vec::new();
        for _ in 0..len {
            let step = draw(&mut rng, n);
            steps.push(step.clone());
            let what = format!("program {program} of seed {seed:#x} (n = {n}), steps {steps:?}");
            let stream = &streams[rng.gen_range(0..streams.len())];
            let policy = &policies[rng.gen_range(0..policies.len())];
            let valid = model.apply(&step);
            let got = run_step(&step, &mut t, graph.as_ref(), n, stream, policy);
            if valid {
                if let Err(e) = got {
                    panic!("{what}: failed: {e}");
                }
            } else {
                assert_refused(&what, &step, got);
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
                    model.fresh(v, data.iter().map(|&x| x.into()).collect());
                    *x = enqueue(api::from_slice(&data, &[n, n]), stream, policy)
                        .expect("upload a tensor");
                }
            }
        }
        for (v, x) in t.iter().enumerate() {
            let what = format!("program {program} of seed {seed:#x} (n = {n}) at its end, tensor {v}, steps {steps:?}");
            assert_holds(&what, x, model.var(v));
        }
    }
}

#[test]
fn tensor_ops_on_random_streams_end_as_run_in_order() {
    let count = 12 * scale_from_env("CUFLOW_RANDOM_STREAMS");
    within_a_minute(
        "random programs of tensor ops over three streams",
        move || {
            let device = device();
            let streams = new_streams(&device, 3).expect("three streams");
            std::thread::scope(|s| {
                for thread in 0..3u64 {
                    let (device, streams) = (&device, &streams);
                    s.spawn(move || run_programs(device, streams, 0x5eed_7000 + thread, count, 24));
                }
            });
        },
    );
}

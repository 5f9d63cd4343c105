//! `graph`: record and replay. Graphs of 10, 100 and 1000 tiny kernels captured through cuflow
//! (`graph_on` over a `then`-chain) and replayed, against the same graphs captured with raw
//! cudarc, and against PyTorch CUDA-graph replay of as many tiny kernels; then the
//! inference-loop example's decoder, generating tokens eagerly and by replaying one captured
//! step, against the same model in PyTorch (eager and CUDA graphs).
//!
//! Timing: a trial replays a graph `K` times back to back and waits for the stream; its figure
//! is that wall time over `K · N` (µs per node) for the graphs, and tokens over wall time for
//! the decoder. Each figure is the median of [`TRIALS`] trials, cuflow's and raw cudarc's
//! alternating. Every graph's kernels count their executions in one float, which is checked
//! after the trials, so a replay that skipped nodes fails the benchmark.
//!
//! The PyTorch side is `graph_torch.py`, run after cuflow's measurements (see
//! [`crate::python`]); without it, cuflow's figures are reported without that baseline.

use std::sync::Arc;
use std::time::Instant;

use cuflow::prelude::*;
use cuflow_testing::model;
use serde_json::{json, Value};

use crate::error::BenchError;
use crate::kernels::inc_kernel;
use crate::raw::{EventTracking, RawKernel, RawLauncher};
use crate::report::{Goal, Results, Row};

/// Trials of each figure; odd, so the median is one of them.
const TRIALS: usize = 7;

/// Node counts of the replayed graphs.
const NODES: [usize; 3] = [10, 100, 1000];

/// Nodes run per trial (replays × nodes), so that each trial lasts tens of milliseconds.
const NODES_PER_TRIAL: usize = 100_000;

/// The goal against raw cudarc graphs: at most 5% slower per node.
const RAW_GOAL: Goal = Goal::AtMost(1.05);

/// The goal against PyTorch's graph replay: at least 1.3× faster per node.
const TORCH_GOAL: Goal = Goal::AtMost(1.0 / 1.3);

/// The goal of the decoder: graph replay at least 3× the tokens/s of eager steps.
const DECODE_EAGER_GOAL: Goal = Goal::AtLeast(3.0);

/// The goal of the decoder against PyTorch with CUDA graphs: faster.
const DECODE_TORCH_GOAL: Goal = Goal::AtLeast(1.0);

/// Tokens generated per trial of the decoder.
const TOKENS: usize = 128;

/// The decoder's weights' seed and first token (the example's).
const MODEL_SEED: u64 = 1;
const FIRST_TOKEN: u32 = 1;

/// The PyTorch baseline; its docstring gives its command line and output.
const TORCH_SCRIPT: &str = include_str!("graph_torch.py");

/// One launch of the counting kernel on a one-element buffer, as an op.
struct Inc {
    kernel: Kernel,
    x: Arc<DeviceBuffer<f32>>,
}

impl DeviceOp for Inc {
    type Output = ();
    fn execute(self, ctx: &mut ExecutionContext) -> Result<(), DeviceError> {
        self.kernel.launch(
            ctx.stream()?,
            LaunchConfig::linear(1, 1),
            KernelArgs::new().output(&*self.x),
        )
    }
}

/// `n` increments of `x`, one after another.
fn chain(kernel: &Kernel, x: &Arc<DeviceBuffer<f32>>, n: usize) -> BoxedOp<'static, ()> {
    let mut op = value(()).boxed();
    for _ in 0..n {
        let (kernel, x) = (kernel.clone(), x.clone());
        op = op.then(move |_| Inc { kernel, x }).boxed();
    }
    op
}

/// The replay figures of one node count: cuflow's and raw cudarc's µs per node per trial.
struct ReplayTrials {
    nodes: usize,
    replays: usize,
    ours: Vec<f64>,
    raw: Vec<f64>,
}

fn measure_replay(device: &Device, nodes: usize) -> Result<ReplayTrials, BenchError> {
    let stream = device.new_stream()?;
    let kernel = inc_kernel();
    kernel.compile(device)?;
    let x = Arc::new(DeviceBuffer::<f32>::zeroed(&stream, 1)?);
    let mut graph = chain(&kernel, &x, nodes).graph_on(stream.clone())?;
    let mut raw = RawLauncher::new(device, EventTracking::Off, RawKernel::Inc)?;
    let raw_graph = raw.capture_graph(nodes)?;

    let replays = (NODES_PER_TRIAL / nodes).max(1);
    let per_node = |d: std::time::Duration| d.as_secs_f64() * 1e6 / (replays * nodes) as f64;
    let mut runs = 0usize;
    // Warm up.
    for _ in 0..3 {
        graph.launch()?;
    }
    graph.synchronize()?;
    raw_graph.replay_k(3)?;
    runs += 3;

    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        let start = Instant::now();
        for _ in 0..replays {
            graph.launch()?;
        }
        graph.synchronize()?;
        ours.push(per_node(start.elapsed()));
        theirs.push(per_node(raw_graph.replay_k(replays)?));
        runs += replays;
    }

    let want = (runs * nodes) as f32;
    let got = x.to_host_vec(&stream)?.first().copied().unwrap_or(f32::NAN);
    let got_raw = raw.read_buffer()?;
    if got != want || got_raw != want {
        return Err(BenchError::Verification(format!(
            "graphs of {nodes} nodes replayed {runs} times: cuflow counted {got}, raw cudarc \
             {got_raw}, expected {want}"
        )));
    }
    Ok(ReplayTrials {
        nodes,
        replays,
        ours,
        raw: theirs,
    })
}

/// The decoder's figures: tokens/s of each trial, eager and replayed.
struct DecodeTrials {
    cfg: model::Config,
    eager: Vec<f64>,
    graph: Vec<f64>,
    nodes: usize,
}

fn measure_decode(device: &Device) -> Result<DecodeTrials, BenchError> {
    let stream = device.new_stream()?;
    let cfg = model::Config::default();
    let model = model::Model::new(&stream, cfg, MODEL_SEED)?;
    // Warm up (and compile every kernel before the capture).
    let eager_tokens = model.generate_eager(&stream, FIRST_TOKEN, TOKENS)?;
    let mut step = model.capture(&stream)?;
    let graph_tokens = step.generate(FIRST_TOKEN, TOKENS)?;
    if eager_tokens != graph_tokens {
        return Err(BenchError::Verification(
            "the decoder's eager and replayed generations differ".into(),
        ));
    }
    if eager_tokens.iter().all(|&t| t == eager_tokens[0]) {
        return Err(BenchError::Verification(format!(
            "the decoder generated token {} only",
            eager_tokens[0]
        )));
    }
    let (mut eager, mut graph) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        let start = Instant::now();
        let e = model.generate_eager(&stream, FIRST_TOKEN, TOKENS)?;
        eager.push(TOKENS as f64 / start.elapsed().as_secs_f64());
        let start = Instant::now();
        let g = step.generate(FIRST_TOKEN, TOKENS)?;
        graph.push(TOKENS as f64 / start.elapsed().as_secs_f64());
        if e != eager_tokens || g != eager_tokens {
            return Err(BenchError::Verification(
                "a timed generation differs from the first".into(),
            ));
        }
    }
    Ok(DecodeTrials {
        cfg,
        eager,
        graph,
        nodes: step.node_count()?,
    })
}

/// PyTorch's figures, or why there are none.
struct TorchRun {
    replay: Vec<Vec<f64>>,
    /// Eager and graph tokens/s per trial.
    decode: Option<(Vec<f64>, Vec<f64>)>,
    version: String,
}

fn per_trial(v: &Value) -> Option<Vec<f64>> {
    v.as_array()?
        .iter()
        .map(|t| t.as_f64().filter(|t| *t > 0.0))
        .collect::<Option<Vec<f64>>>()
        .filter(|t| t.len() == TRIALS)
}

fn run_torch(replays: &[ReplayTrials], decode: &DecodeTrials) -> Result<TorchRun, String> {
    let cfg = &decode.cfg;
    let args = json!({
        "trials": TRIALS,
        "replay": replays
            .iter()
            .map(|r| json!({"nodes": r.nodes, "replays": r.replays}))
            .collect::<Vec<_>>(),
        "model": {
            "d_model": cfg.d_model, "heads": cfg.n_heads, "layers": cfg.n_layers,
            "mlp": cfg.d_mlp, "vocab": cfg.vocab, "max_seq": cfg.max_seq,
            "tokens": TOKENS, "eps": cfg.norm_eps, "seed": MODEL_SEED, "first": FIRST_TOKEN,
        },
    });
    let reply = crate::python::run_script("graph", TORCH_SCRIPT, &args)?;
    let replay = reply["replay"]
        .as_array()
        .filter(|r| r.len() == replays.len())
        .and_then(|r| {
            r.iter()
                .map(|r| per_trial(&r["us_per_node"]))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| format!("malformed replay figures in {reply}"))?;
    let decode = per_trial(&reply["model"]["eager_tokens_per_s"])
        .zip(per_trial(&reply["model"]["graph_tokens_per_s"]));
    let text = |key: &str| reply[key].as_str().unwrap_or("unknown").to_string();
    Ok(TorchRun {
        replay,
        decode,
        version: format!(
            "PyTorch {} (CUDA {}) on {}",
            text("torch_version"),
            text("cuda_version"),
            text("device_name")
        ),
    })
}

/// Runs the benchmark (`iters` is unused: the trial sizes are fixed).
pub(crate) fn run(device: &Device, _iters: usize) -> Result<Results, BenchError> {
    let replays = NODES
        .iter()
        .map(|&n| measure_replay(device, n))
        .collect::<Result<Vec<_>, _>>()?;
    let decode = measure_decode(device)?;
    let torch = run_torch(&replays, &decode);

    let mut notes = vec![
        format!(
            "graph replay: a graph of N one-thread kernels (x[0] += 1) replayed K times back to \
             back, then a stream synchronize; µs per node = wall time / (K·N), K·N = \
             {NODES_PER_TRIAL}; median of {TRIALS} trials, cuflow and raw cudarc alternating; \
             every node's execution counted and checked"
        ),
        "cuflow: a then-chain of N launches captured with graph_on and replayed with \
         CudaGraph::launch; raw cudarc: the same kernel launched N times between \
         CudaStream::begin_capture and end_capture, replayed with CudaGraph::launch"
            .to_string(),
    ];
    match &torch {
        Ok(t) => notes.push(format!(
            "baseline: {}, x.add_(1.0) on a one-element tensor N times under torch.cuda.graph, \
             replayed with CUDAGraph.replay and timed the same way, in a separate process after \
             cuflow's measurements",
            t.version
        )),
        Err(why) => notes.push(format!("no PyTorch baseline: {why}")),
    }

    let mut rows = Vec::new();
    for (i, r) in replays.iter().enumerate() {
        let figure = format!("replay of a graph of {} tiny kernels", r.nodes);
        rows.push(
            Row::from_trials(
                &figure,
                "us/node",
                &r.ours,
                "raw cudarc graph replay",
                &r.raw,
            )
            .with_goal(RAW_GOAL),
        );
        let torch_name = "PyTorch CUDA-graph replay";
        rows.push(
            match &torch {
                Ok(t) => Row::from_trials(&figure, "us/node", &r.ours, torch_name, &t.replay[i]),
                Err(_) => Row::without_baseline(
                    &figure,
                    "us/node",
                    &r.ours,
                    format!("{torch_name} (unavailable)"),
                ),
            }
            .with_goal(TORCH_GOAL),
        );
    }
    let cfg = &decode.cfg;
    notes.push(format!(
        "decoder: the inference-loop example's model ({} layers, d_model {}, {} heads, mlp {}, \
         vocab {}, f32, batch 1), {TOKENS} tokens per trial, greedy; eager: one step op \
         enqueued per token; graph: one captured step ({} nodes) replayed per token; both fed \
         by device copies of the position and the token between steps, one host wait per \
         trial; eager and replayed tokens checked equal; PyTorch: the same architecture, sizes \
         and feeding, eager and under torch.cuda.graph",
        cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_mlp, cfg.vocab, decode.nodes
    ));
    let figure = "decoder tokens/s, graph replay";
    rows.push(
        Row::from_trials(
            figure,
            "tokens/s",
            &decode.graph,
            "cuflow eager",
            &decode.eager,
        )
        .higher_is_better()
        .with_goal(DECODE_EAGER_GOAL),
    );
    let torch_decode = torch.as_ref().ok().and_then(|t| t.decode.as_ref());
    match torch_decode {
        Some((torch_eager, torch_graph)) => {
            rows.push(
                Row::from_trials(
                    figure,
                    "tokens/s",
                    &decode.graph,
                    "PyTorch with CUDA graphs",
                    torch_graph,
                )
                .higher_is_better()
                .with_goal(DECODE_TORCH_GOAL),
            );
            rows.push(
                Row::from_trials(
                    "decoder tokens/s, eager",
                    "tokens/s",
                    &decode.eager,
                    "PyTorch eager",
                    torch_eager,
                )
                .higher_is_better(),
            );
        }
        None => rows.push(
            Row::without_baseline(
                figure,
                "tokens/s",
                &decode.graph,
                "PyTorch with CUDA graphs (unavailable)",
            )
            .higher_is_better()
            .with_goal(DECODE_TORCH_GOAL),
        ),
    }
    Ok(Results { notes, rows })
}

//! `llama_tp`: batch-1 greedy decode of the Llama 3.2 1B and Llama 3.1 8B shapes, split
//! tensor-parallel over 1, 2, 4 and 8 GPUs (as many as are visible), each rank replaying its
//! captured decode step; tokens/s at each width beside the same shape on one GPU, measured in
//! the same run.
//!
//! The ranks of a width are one process's threads (`Communicator::local`), one per GPU, all
//! running the same calls; the all-reduces after the attention output and the MLP down
//! projections are nodes of each rank's graph. The weights are the seeded synthetic ones
//! (`Llama::synthetic_tp`, and `Llama::synthetic` on one GPU). Every rank must produce the
//! same tokens, and every width the same first tokens as one GPU: bf16 sums in another order
//! may part the sequences later, so only the first [`AGREE`] are compared.
//!
//! Embeddings, norms and the LM head are replicated on every rank, so each rank reads the
//! whole head each token: that, and two all-reduces per layer, bound the scaling below the
//! width.

use std::time::Instant;

use cuflow::dist::Communicator;
use cuflow::models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow::prelude::*;

use crate::error::BenchError;
use crate::report::{Goal, Results, Row};

/// Prompt tokens before the timed decode steps: the context is `PROMPT` to `PROMPT + TOKENS`.
const PROMPT: usize = 128;
/// Decode steps per trial.
const TOKENS: usize = 128;
/// Trials per width; the figure is their median.
const TRIALS: usize = 3;
/// The seed of the synthetic weights.
const SEED: u64 = 1;
/// Leading tokens that every width must share with one GPU.
const AGREE: usize = 8;

/// A shape, and the project's goals on its speed-up at some widths.
struct Shape {
    name: &'static str,
    cfg: LlamaConfig,
    goals: &'static [(usize, f64)],
}

/// What one width measured: tokens/s per trial and the tokens of the last trial (rank 0's),
/// and the graph's nodes per step.
struct Measured {
    rates: Vec<f64>,
    tokens: Vec<u32>,
    nodes: usize,
}

/// The prompt: fixed, varied ids inside every vocabulary of the shapes.
fn prompt() -> Vec<u32> {
    (0..PROMPT).map(|i| (i * 7919 % 1000 + 1) as u32).collect()
}

/// Captures `model`'s step on `stream`, warms it up, then times `TRIALS` runs of a prefill of
/// the prompt followed by `TOKENS` replayed decode steps (the steps alone are timed).
fn decode_rank(model: &Llama, stream: &Stream) -> Result<Measured, BenchError> {
    let prompt = prompt();
    let opts = GenerateOptions::greedy().max_seq(PROMPT + TOKENS + 1);
    let mut step = model.capture(stream, opts)?;
    step.prefill(&prompt)?;
    step.decode(8)?;
    step.synchronize()?;
    let mut rates = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        step.prefill(&prompt)?;
        step.synchronize()?;
        let start = Instant::now();
        step.decode(TOKENS)?;
        step.synchronize()?;
        rates.push(TOKENS as f64 / start.elapsed().as_secs_f64());
    }
    Ok(Measured {
        rates,
        tokens: step.tokens()?,
        nodes: step.node_count()?,
    })
}

/// `cfg` split over `devices` (one rank per device, each on its own thread), decoded as
/// [`decode_rank`] does; rank 0's figures, after checking that every rank chose the same
/// tokens.
fn measure(devices: &[Device], cfg: &LlamaConfig) -> Result<Measured, BenchError> {
    if let [device] = devices {
        let model = Llama::synthetic(device, cfg.clone(), SEED)?;
        return decode_rank(&model, &device.new_stream()?);
    }
    let comms = Communicator::local(devices)?;
    let ranks = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || -> Result<Measured, BenchError> {
                    let model = Llama::synthetic_tp(c, cfg.clone(), SEED)?;
                    decode_rank(&model, c.stream())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(BenchError::Verification("a rank panicked".into())))
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    let mut ranks = ranks.into_iter();
    let first = ranks
        .next()
        .ok_or_else(|| BenchError::Verification("no rank ran".into()))?;
    for (r, other) in ranks.enumerate() {
        if other.tokens != first.tokens {
            return Err(BenchError::Verification(format!(
                "rank {} chose other tokens than rank 0 over {} GPUs",
                r + 1,
                devices.len()
            )));
        }
    }
    Ok(first)
}

/// Runs the benchmark on every visible CUDA device (at least 2), at widths 1, 2, 4 and 8 where
/// there are enough.
pub(crate) fn run(_device: &Device, _iters: usize) -> Result<Results, BenchError> {
    let visible = Device::cuda_count();
    if visible < 2 {
        return Err(BenchError::MissingDevices { needed: 2, visible });
    }
    let devices = (0..visible)
        .map(Device::cuda)
        .collect::<Result<Vec<_>, _>>()?;
    let widths: Vec<usize> = [1, 2, 4, 8].into_iter().filter(|w| *w <= visible).collect();
    let shapes = [
        Shape {
            name: "1B",
            cfg: LlamaConfig::llama_3_2_1b(),
            goals: &[],
        },
        Shape {
            name: "8B",
            cfg: LlamaConfig::llama_3_1_8b(),
            goals: &[(2, 1.7), (4, 3.0)],
        },
    ];
    let names: Vec<String> = devices.iter().map(Device::to_string).collect();
    let mut notes = vec![
        format!("devices: {}", names.join(", ")),
        format!(
            "batch 1, greedy, synthetic bf16 weights; a prefill of {PROMPT} tokens, then \
             {TOKENS} replayed decode steps timed (context {PROMPT}-{}), median of {TRIALS} \
             trials after a warm-up; one rank per GPU, threads of this process",
            PROMPT + TOKENS
        ),
        "PyTorch tensor-parallel decode is not measured beside it".into(),
    ];
    let mut rows = Vec::new();
    for shape in &shapes {
        let one = measure(&devices[..1], &shape.cfg)?;
        notes.push(format!(
            "{} on 1 GPU: {} nodes per step",
            shape.name, one.nodes
        ));
        rows.push(Row::without_baseline(
            format!("{} decode, 1 GPU", shape.name),
            "tok/s",
            &one.rates,
            "-",
        ));
        for &w in widths.iter().filter(|w| **w > 1) {
            let m = measure(&devices[..w], &shape.cfg)?;
            let agree = AGREE.min(one.tokens.len());
            if m.tokens.get(..agree) != one.tokens.get(..agree) {
                return Err(BenchError::Verification(format!(
                    "{} over {w} GPUs chose other first tokens than on one: {:?} against {:?}",
                    shape.name,
                    m.tokens.get(..agree),
                    one.tokens.get(..agree)
                )));
            }
            notes.push(format!(
                "{} over {w} GPUs: {} nodes per step per rank",
                shape.name, m.nodes
            ));
            let mut row = Row::from_trials(
                format!("{} decode, tensor parallel over {w} GPUs", shape.name),
                "tok/s",
                &m.rates,
                "the same on 1 GPU",
                &one.rates,
            )
            .higher_is_better();
            if let Some((_, goal)) = shape.goals.iter().find(|(gw, _)| *gw == w) {
                row = row.with_goal(Goal::AtLeast(*goal));
            }
            rows.push(row);
        }
    }
    Ok(Results { notes, rows })
}

//! Batch-1 decoding of a Llama-3.2-1B-shaped model: cuflow's decode step eager and replayed
//! at context 128 and 4096, beside the roofline (the bytes a step must read over the device
//! copy bandwidth measured in the same run) and PyTorch (eager, `torch.cuda.graph`,
//! `torch.compile` + `torch.cuda.graph`) on the same weights; prefill of 512 tokens; the
//! checkpoint's load speed (twice: the files just written, then again) beside pinned
//! host-to-device copies; and cuflow's logits against PyTorch's.
//!
//! The weights are synthetic (seeded) and written as a Hugging Face checkpoint into a
//! temporary folder, which cuflow loads with `Llama::load` and the PyTorch script with
//! `safetensors.torch.load_file`: both run the same `bf16` values.

use std::time::Instant;

use cuflow::models::llama::{testing, GenerateOptions, Llama, LlamaConfig};
use cuflow::prelude::*;
use cuflow::runtime::PinnedBuffer;
use serde_json::{json, Value};

use crate::error::BenchError;
use crate::report::{median, Goal, Results, Row};

const TORCH_SCRIPT: &str = include_str!("llama_torch.py");
/// Decode steps timed per context.
const TOKENS: usize = 64;
const CONTEXTS: [usize; 2] = [128, 4096];
const PREFILL: usize = 512;
/// Trials of each cuflow figure (the median is reported).
const TRIALS: usize = 5;
/// A fixed prompt whose logits cuflow and PyTorch both compute.
const LOGITS_PROMPT: [u32; 8] = [128_000, 791, 6864, 315, 9822, 374, 12366, 13];
/// Relative error of bf16 logits accepted against PyTorch.
const LOGITS_TOLERANCE: f64 = 3e-2;

/// Device-to-device copy bandwidth, bytes read plus bytes written per second.
fn copy_bandwidth(stream: &Stream) -> Result<f64, BenchError> {
    let len = 1usize << 30;
    let a = DeviceBuffer::<u8>::zeroed(stream, len)?;
    let b = DeviceBuffer::<u8>::zeroed(stream, len)?;
    b.copy_from(stream, &a)?;
    stream.synchronize()?;
    let mut trials = Vec::new();
    for _ in 0..TRIALS {
        let start = Instant::now();
        for _ in 0..4 {
            b.copy_from(stream, &a)?;
        }
        stream.synchronize()?;
        trials.push(8.0 * len as f64 / start.elapsed().as_secs_f64());
    }
    Ok(median(&trials))
}

/// Pinned host-to-device copy bandwidth (bytes per second): the ceiling of a checkpoint load.
fn host_to_device_bandwidth(stream: &Stream) -> Result<f64, BenchError> {
    let len = 256usize << 20;
    let dst = DeviceBuffer::<u8>::zeroed(stream, len)?;
    let mut pinned = PinnedBuffer::<u8>::new(stream.device(), len)?;
    pinned = pinned.copy_to_device(stream, dst.view())?.wait()?;
    let mut trials = Vec::new();
    for _ in 0..TRIALS {
        let start = Instant::now();
        for _ in 0..4 {
            pinned = pinned.copy_to_device(stream, dst.view())?.wait()?;
        }
        trials.push(4.0 * len as f64 / start.elapsed().as_secs_f64());
    }
    Ok(median(&trials))
}

fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

/// Decode tokens/s at `ctx`, replayed and eager (medians of the trials).
fn decode_rates(
    model: &Llama,
    stream: &Stream,
    ctx: usize,
) -> Result<(Vec<f64>, Vec<f64>), BenchError> {
    let opts = GenerateOptions::greedy().max_seq(ctx + TOKENS + 16);
    let mut step = model.capture(stream, opts)?;
    let prompt = random_ids(ctx, model.config().vocab_size, ctx as u64);
    let (mut replayed, mut eager) = (Vec::new(), Vec::new());
    for trial in 0..=TRIALS {
        for (eager_path, rates) in [(false, &mut replayed), (true, &mut eager)] {
            step.prefill(&prompt)?;
            step.synchronize()?;
            let start = Instant::now();
            if eager_path {
                step.decode_eager(TOKENS)?;
            } else {
                step.decode(TOKENS)?;
            }
            step.synchronize()?;
            // The first trial warms up.
            if trial > 0 {
                rates.push(TOKENS as f64 / start.elapsed().as_secs_f64());
            }
        }
    }
    let ids = step.tokens()?;
    if ids.len() != TOKENS + 1 || ids.iter().any(|&t| t as usize >= model.config().vocab_size) {
        return Err(BenchError::Verification(format!(
            "decode produced bad ids {ids:?}"
        )));
    }
    Ok((replayed, eager))
}

fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(a, b)| (f64::from(*a) - b).powi(2))
        .sum();
    let den: f64 = b.iter().map(|b| b * b).sum();
    (num / den.max(1e-30)).sqrt()
}

fn argmax(v: impl Iterator<Item = f64>) -> usize {
    v.enumerate()
        .fold((0, f64::NEG_INFINITY), |(bi, bv), (i, x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}

/// Runs the benchmark (`iters` is unused: the trial sizes are fixed).
pub(crate) fn run(device: &Device, _iters: usize) -> Result<Results, BenchError> {
    let stream = device.new_stream()?;
    let cfg = LlamaConfig::llama_3_2_1b();
    let dir = std::env::temp_dir().join(format!("cuflow-bench-llama-{}", std::process::id()));
    testing::write_tiny_checkpoint(&dir, &cfg, 1)?;
    // Loaded twice: the first load reads the files just written (from the page cache or the
    // disk, as the machine keeps them), the second the same files again.
    let mut loads = Vec::new();
    let mut model = None;
    for _ in 0..2 {
        drop(model.take());
        match Llama::load(device, &dir) {
            Ok(m) => {
                loads.extend(m.load_stats());
                model = Some(m);
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        }
    }
    let model = model.ok_or_else(|| BenchError::Verification("no model was loaded".into()))?;
    let bandwidth = copy_bandwidth(&stream)?;
    let h2d = host_to_device_bandwidth(&stream)?;
    let weight_bytes = model.weight_bytes() as f64;
    let kv_bytes =
        |ctx: usize| (cfg.num_hidden_layers * 2 * cfg.kv_heads() * ctx * cfg.head_dim() * 2) as f64;

    let mut decode = Vec::new();
    for ctx in CONTEXTS {
        decode.push((ctx, decode_rates(&model, &stream, ctx)?));
    }
    let prompt = random_ids(PREFILL, cfg.vocab_size, 99);
    let mut step = model.decoder(&stream, GenerateOptions::greedy().max_seq(PREFILL + 1))?;
    let mut prefill = Vec::new();
    for trial in 0..=TRIALS {
        step.synchronize()?;
        let start = Instant::now();
        step.prefill(&prompt)?;
        step.synchronize()?;
        if trial > 0 {
            prefill.push(PREFILL as f64 / start.elapsed().as_secs_f64());
        }
    }
    let logits = model.prefill_logits(&stream, &LOGITS_PROMPT)?;
    drop(step);

    let args = json!({
        "dir": dir.to_string_lossy(),
        "contexts": CONTEXTS,
        "tokens": TOKENS,
        "prefill_tokens": PREFILL,
        "logits_prompt": LOGITS_PROMPT,
    });
    let torch = crate::python::run_script("llama", TORCH_SCRIPT, &args);
    let _ = std::fs::remove_dir_all(&dir);

    let mut notes = vec![
        format!(
            "model: Llama-3.2-1B shape ({cfg}, tied), synthetic bf16 weights ({:.3} GB) written \
             as a safetensors checkpoint and loaded by both sides; batch 1, greedy; {TOKENS} \
             decode steps per trial after a prefill of the context, median of {TRIALS} trials",
            weight_bytes / 1e9
        ),
        format!(
            "roofline: (weight bytes + KV cache bytes read per token) / device copy bandwidth \
             {:.0} GB/s (1 GiB device-to-device copies, read + write bytes, same run)",
            bandwidth / 1e9
        ),
    ];
    for (i, l) in loads.iter().enumerate() {
        notes.push(format!(
            "load {}: {:.2} GB in {:.2} s = {:.2} GB/s from opening the folder until the weights \
             were on the device, then {:.2} s compiling the decode kernels (not counted); \
             pinned host-to-device copies: {:.1} GB/s (256 MiB copies, same run)",
            i + 1,
            l.bytes as f64 / 1e9,
            l.seconds,
            l.gb_per_s(),
            l.compile_seconds,
            h2d / 1e9
        ));
    }
    let mut rows = Vec::new();
    let torch = match torch {
        Ok(t) => {
            notes.push(format!(
                "baseline: {} in a separate process after cuflow's runs",
                t["version"].as_str().unwrap_or("PyTorch")
            ));
            Some(t)
        }
        Err(why) => {
            notes.push(format!("no PyTorch baseline: {why}"));
            None
        }
    };
    let torch_decode = |ctx: usize, key: &str| -> Option<f64> {
        torch.as_ref()?["decode"]
            .as_array()?
            .iter()
            .find(|r| r["context"].as_u64() == Some(ctx as u64))?[key]
            .as_f64()
    };
    for (ctx, (replayed, eager)) in &decode {
        let roofline = bandwidth / (weight_bytes + kv_bytes(*ctx));
        let goal = if *ctx <= 128 { 0.85 } else { 0.75 };
        let name = |what: &str| format!("decode ctx {ctx}, {what}");
        rows.push(
            Row::derived(
                name("replayed, vs roofline"),
                "tok/s",
                median(replayed),
                "roofline",
                roofline,
            )
            .higher_is_better()
            .with_goal(Goal::AtLeast(goal)),
        );
        let versus = |key: &str, label: &str, values: &[f64], goal: Option<Goal>| {
            let row = match torch_decode(*ctx, key) {
                Some(t) => Row::derived(
                    label.to_string(),
                    "tok/s",
                    median(values),
                    torch_name(key),
                    t,
                ),
                None => Row::without_baseline(label.to_string(), "tok/s", values, torch_name(key)),
            }
            .higher_is_better();
            match goal {
                Some(g) => row.with_goal(g),
                None => row,
            }
        };
        let compile_goal = (*ctx <= 128).then_some(Goal::AtLeast(1.5));
        rows.push(versus(
            "compile_graph",
            &name("replayed"),
            replayed,
            compile_goal,
        ));
        rows.push(versus("graph", &name("replayed"), replayed, None));
        rows.push(versus("eager", &name("eager"), eager, None));
        if let Some(why) = torch.as_ref().and_then(|t| {
            t["decode"]
                .as_array()?
                .iter()
                .find(|r| r["context"].as_u64() == Some(*ctx as u64))?["compile_error"]
                .as_str()
                .map(String::from)
        }) {
            notes.push(format!("torch.compile at ctx {ctx} failed: {why}"));
        }
    }
    let torch_prefill = torch.as_ref().and_then(|t| t["prefill"].as_f64());
    rows.push(
        match torch_prefill {
            Some(t) => Row::derived(
                format!("prefill {PREFILL} tokens"),
                "tok/s",
                median(&prefill),
                "PyTorch eager",
                t,
            ),
            None => Row::without_baseline(
                format!("prefill {PREFILL} tokens"),
                "tok/s",
                &prefill,
                "PyTorch eager",
            ),
        }
        .higher_is_better()
        .with_goal(Goal::AtLeast(1.0)),
    );
    for (l, what) in loads
        .iter()
        .zip(["checkpoint load, just written", "checkpoint load, again"])
    {
        rows.push(
            Row::derived(
                what,
                "GB/s",
                l.gb_per_s(),
                "pinned host-to-device copy",
                h2d / 1e9,
            )
            .higher_is_better(),
        );
    }
    match torch.as_ref().and_then(|t| t["logits"].as_array().cloned()) {
        Some(theirs) => {
            let theirs: Vec<f64> = theirs.iter().filter_map(Value::as_f64).collect();
            let err = rel_err(&logits, &theirs);
            let same =
                argmax(logits.iter().map(|&v| f64::from(v))) == argmax(theirs.iter().copied());
            notes.push(format!(
                "logits after {} prompt tokens vs PyTorch: relative error {err:.2e} (tolerance \
                 {LOGITS_TOLERANCE:.0e} for bf16), argmax {}",
                LOGITS_PROMPT.len(),
                if same { "equal" } else { "DIFFERENT" }
            ));
            rows.push(
                Row::derived(
                    "logits relative error vs PyTorch",
                    "",
                    err,
                    "bf16 tolerance",
                    LOGITS_TOLERANCE,
                )
                .with_goal(Goal::AtMost(1.0)),
            );
        }
        None => notes.push("logits not compared: no PyTorch baseline".into()),
    }
    Ok(Results { notes, rows })
}

fn torch_name(key: &str) -> &'static str {
    match key {
        "compile_graph" => "torch.compile + torch.cuda.graph",
        "graph" => "PyTorch + torch.cuda.graph",
        _ => "PyTorch eager",
    }
}

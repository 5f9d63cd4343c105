//! An inference loop: a small decoder-only transformer generating tokens one step at a time,
//! first by running the step op eagerly, then by replaying it as a captured graph.
//!
//! ```text
//! cargo run --release --example 04_inference_loop [-- --tokens N]
//! ```
//!
//! One decode step (embedding, 6 decoder layers with a key/value cache, logits, argmax) is one
//! op; the token and the position live in device tensors, so the step is captured once and
//! replayed for every position, fed by copies between replays. The program prints the
//! throughput of both loops and fails unless they generate the same tokens.
//!
//! The model lives in `cuflow_testing::model` (`crates/testing/src/model/`), where its test and
//! the benchmark program use it too.
//!
//! Runs on CUDA device 0 when one is usable, else on the host backend
//! (`CUFLOW_DEVICE=host|cuda|cuda:N` chooses explicitly).

use std::time::Instant;

use cuflow::prelude::*;
use cuflow_testing::model::{Config, Model};

/// The seed of the model's weights.
const SEED: u64 = 1;
/// The token the generation starts from.
const FIRST_TOKEN: u32 = 1;

const USAGE: &str = "usage: 04_inference_loop [--tokens N]";

/// `--tokens N` from the command line (64 when absent); `None` for `-h` / `--help`.
fn tokens_arg() -> Result<Option<usize>, DeviceError> {
    let mut args = std::env::args().skip(1);
    let mut tokens = 64;
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--tokens" => args.next(),
            _ => match arg.strip_prefix("--tokens=") {
                Some(v) => Some(v.to_string()),
                None => {
                    return Err(DeviceError::usage(format!(
                        "unknown argument {arg:?}; {USAGE}"
                    )))
                }
            },
        };
        tokens = value
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                DeviceError::usage(format!("--tokens takes a positive number; {USAGE}"))
            })?;
    }
    Ok(Some(tokens))
}

/// Prints an error with its `Display` form, which says what went wrong and how to fix it (a
/// missing driver names the host backend as the way out), and exits with status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), DeviceError> {
    let Some(tokens) = tokens_arg()? else {
        println!("{USAGE}");
        return Ok(());
    };
    let device = Device::auto()?;
    println!("device: {device}");
    let stream = device.new_stream()?;

    let cfg = Config::default();
    println!(
        "model: {} layers, d_model {}, {} heads of {}, mlp {}, vocab {}, max_seq {}",
        cfg.n_layers,
        cfg.d_model,
        cfg.n_heads,
        cfg.head_dim(),
        cfg.d_mlp,
        cfg.vocab,
        cfg.max_seq
    );
    let model = Model::new(&stream, cfg, SEED)?;

    // Eager: one step op enqueued per token. The first run compiles the kernels.
    model.generate_eager(&stream, FIRST_TOKEN, tokens)?;
    let start = Instant::now();
    let eager = model.generate_eager(&stream, FIRST_TOKEN, tokens)?;
    let eager_s = start.elapsed().as_secs_f64();

    // Captured: the same step recorded once, replayed per token.
    let mut step = model.capture(&stream)?;
    step.generate(FIRST_TOKEN, tokens)?;
    let start = Instant::now();
    let replayed = step.generate(FIRST_TOKEN, tokens)?;
    let graph_s = start.elapsed().as_secs_f64();

    let (eager_rate, graph_rate) = (tokens as f64 / eager_s, tokens as f64 / graph_s);
    println!("eager:    {tokens} tokens in {eager_s:.4} s, {eager_rate:10.1} tokens/s");
    println!(
        "graph:    {tokens} tokens in {graph_s:.4} s, {graph_rate:10.1} tokens/s ({} nodes per step)",
        step.node_count()?
    );
    println!("speedup:  {:.2}x", eager_s / graph_s);
    let shown = tokens.min(16);
    println!("first {shown} tokens: {:?}", &replayed[..shown]);

    if eager != replayed {
        let at = eager.iter().zip(&replayed).position(|(a, b)| a != b);
        return Err(DeviceError::usage(format!(
            "eager and replayed generations differ (first at position {at:?})"
        )));
    }
    if eager.iter().all(|&t| t == eager[0]) {
        return Err(DeviceError::usage(format!(
            "every generated token is {}: the model is degenerate",
            eager[0]
        )));
    }
    println!("eager and replayed tokens match");
    Ok(())
}

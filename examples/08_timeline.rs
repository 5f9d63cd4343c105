//! Seeing what ran where: records timeline traces of two workloads and writes each as
//! Chrome / Perfetto trace-event JSON (open it in <https://ui.perfetto.dev>), with the
//! execution graph as DOT.
//!
//! - `overlap`: a `join_all` of 8 single-block spin kernels under round-robin over 8 streams,
//!   as the `overlap` benchmark runs them: 8 stream lanes side by side.
//! - `inference`: one eager decode step of the `04_inference_loop` model (every kernel on its
//!   stream), and one replayed step of its captured graph (one replay).
//!
//! ```text
//! cargo run --example 08_timeline -- [OUT_DIR]      # default target/timeline
//! cargo run -p cuflow-bench -- trace-svg OUT_DIR/overlap.json overlap.svg
//! ```

use std::path::{Path, PathBuf};

use cuflow::prelude::*;
use cuflow::trace::{self, Trace};
use cuflow_testing::model::{Config, Model};
use cuflow_testing::ops::{buffers, spin_then_write};

/// About 1 ms of spinning per branch (at 2 GHz on CUDA; the host sleeps as long).
const CYCLES: u64 = 2_000_000;

/// Writes `text` to `path`, an error naming the file.
fn write_file(path: &Path, text: String) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}

fn write(dir: &Path, name: &str, trace: &Trace) -> Result<(), Box<dyn std::error::Error>> {
    write_file(&dir.join(format!("{name}.json")), trace.to_chrome_json())?;
    write_file(&dir.join(format!("{name}.dot")), trace.to_dot())?;
    println!(
        "{name}: {} entries, {} stream lanes",
        trace.entries().len(),
        trace.stream_lanes().len()
    );
    Ok(())
}

/// Prints an error with its `Display` form, which says what went wrong and how to fix it, and
/// exits with status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

const USAGE: &str = "usage: 08_timeline [OUT_DIR]   (default target/timeline)";

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = match args.as_slice() {
        [] => PathBuf::from("target/timeline"),
        [flag] if flag == "-h" || flag == "--help" => {
            println!("{USAGE}");
            return Ok(());
        }
        [flag] if flag.starts_with('-') => {
            return Err(format!("unknown option {flag:?}; {USAGE}").into())
        }
        [dir] => PathBuf::from(dir),
        _ => return Err(format!("one output folder at most, not {args:?}; {USAGE}").into()),
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot create the output folder {}: {e}", dir.display()))?;
    let device = Device::auto()?;
    println!("device: {device}");

    // 8 branches on 8 streams.
    let pool = StreamPoolRoundRobin::new(&device, 8)?;
    let bufs = buffers(&[0.0; 8]);
    let eight = || {
        join_all(
            (0..8)
                .map(|i| spin_then_write(&bufs[i], i as f32, CYCLES).named(format!("branch {i}")))
                .collect(),
        )
        .named("overlap")
    };
    write_file(&dir.join("overlap-op.dot"), eight().describe().to_dot())?;
    eight().sync_with_policy(&pool)?; // compiles the kernels outside the trace
    trace::start()?;
    eight().sync_with_policy(&pool)?;
    write(&dir, "overlap", &trace::stop()?)?;

    // One decode step, eager and replayed.
    let stream = device.new_stream()?;
    let model = Model::new(&stream, Config::default(), 1)?;
    model.generate_eager(&stream, 1, 1)?;
    let mut step = model.capture(&stream)?;
    step.generate(1, 1)?;
    trace::start()?;
    let eager = {
        let _span = trace::op_span("eager step");
        model.generate_eager(&stream, 1, 1)?
    };
    write(&dir, "inference-eager", &trace::stop()?)?;
    trace::start()?;
    let replayed = {
        let _span = trace::op_span("replayed step");
        step.generate(1, 1)?
    };
    write(&dir, "inference-replay", &trace::stop()?)?;
    if eager != replayed {
        return Err(format!("eager and replayed steps differ: {eager:?} and {replayed:?}").into());
    }
    Ok(())
}

//! Llama decoding: load a Hugging Face checkpoint (or make synthetic weights), generate
//! tokens eagerly and by replaying a captured decode step, and check that both agree.
//!
//! ```text
//! cargo run --release --example 06_llama -- --synthetic tiny --prompt-ids 1,2,3 --tokens 32
//! cargo run --release --example 06_llama -- --checkpoint path/to/Llama-3.2-1B --tokens 128
//! cargo run --release --example 06_llama -- --synthetic 1b --sample --temperature 0.8 --top-k 40
//! cargo run --release --example 06_llama -- --synthetic 1b --tp 2     # 2 ranks in this process
//! cargo run --release --example 06_llama -- --checkpoint path/to/Llama-3.2-1B --tp 2
//! torchrun --nproc-per-node 2 --no-python target/release/examples/06_llama --synthetic 1b   # 1 rank per process
//! torchrun --nproc-per-node 2 --no-python target/release/examples/06_llama --checkpoint path/to/Llama-3.2-1B
//! ```
//!
//! Prints the generated ids and the tokens per second of both loops (prefill included, the
//! first run of each excluded); with greedy decoding it fails unless the replayed ids equal
//! the eager ones. Runs on CUDA device 0 when one is usable, else on the host backend
//! (`CUFLOW_DEVICE=host|cuda|cuda:N` chooses explicitly). With `--tp N`, or under `torchrun`
//! (when `RANK` is set), the model (synthetic or loaded from the checkpoint, each rank reading
//! its slice) is split tensor-parallel over the ranks (devices `0..N` of that backend, or each
//! process's `LOCAL_RANK`), and rank 0 reports.

use std::time::Instant;

use cuflow::dist::{Communicator, DistConfig};
use cuflow::models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow::prelude::*;
use cuflow::runtime::BackendKind;

const USAGE: &str =
    "usage: 06_llama (--checkpoint DIR | --synthetic tiny|1b|8b) [--prompt-ids 1,2,3] \
                     [--tokens N] [--sample] [--temperature T] [--top-k K] [--top-p P] [--seed S] \
                     [--tp N]";

/// The command line.
#[derive(Debug)]
struct Args {
    checkpoint: Option<String>,
    synthetic: Option<String>,
    prompt: Vec<u32>,
    tokens: usize,
    /// The options of the generation, `max_seq` set to the prompt plus the tokens.
    options: GenerateOptions,
    /// Ranks of tensor parallelism in this process (1: none).
    tp: usize,
}

/// What the command line asks for: a run, or the usage.
#[derive(Debug)]
enum Command {
    Run(Args),
    Help,
}

/// Parses the arguments after the program's name.
fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<Command, DeviceError> {
    let bad = |what: String| DeviceError::usage(format!("{what}\n{USAGE}"));
    let mut args = Args {
        checkpoint: None,
        synthetic: None,
        prompt: vec![1, 2, 3],
        tokens: 32,
        options: GenerateOptions::greedy(),
        tp: 1,
    };
    let (mut sample, mut temperature, mut top_k, mut top_p, mut seed) =
        (false, 0.8f32, 0u32, 1.0f32, 0u64);
    // The sampling flags given, which mean nothing without --sample.
    let mut sampling_flags = Vec::new();
    let mut it = argv.into_iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--sample" => {
                sample = true;
                continue;
            }
            "-h" | "--help" => return Ok(Command::Help),
            "--temperature" | "--top-k" | "--top-p" | "--seed" => sampling_flags.push(flag.clone()),
            _ => {}
        }
        let value = it
            .next()
            .ok_or_else(|| bad(format!("{flag} needs a value")))?;
        let num = |what: &str| bad(format!("{flag} {value:?}: expected {what}"));
        match flag.as_str() {
            "--checkpoint" => args.checkpoint = Some(value),
            "--synthetic" => args.synthetic = Some(value),
            "--prompt-ids" => {
                args.prompt = value
                    .split(',')
                    .map(|v| v.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|_| num("comma-separated token ids"))?
            }
            "--tokens" => args.tokens = value.parse().map_err(|_| num("a count"))?,
            "--temperature" => temperature = value.parse().map_err(|_| num("a number"))?,
            "--top-k" => top_k = value.parse().map_err(|_| num("a count"))?,
            "--top-p" => top_p = value.parse().map_err(|_| num("a number"))?,
            "--seed" => seed = value.parse().map_err(|_| num("a number"))?,
            "--tp" => args.tp = value.parse().map_err(|_| num("a count of ranks"))?,
            _ => return Err(bad(format!("unknown argument {flag:?}"))),
        }
    }
    if sample {
        args.options = GenerateOptions::sampled(temperature)
            .top_k(top_k)
            .top_p(top_p)
            .seed(seed);
    } else if !sampling_flags.is_empty() {
        return Err(bad(format!(
            "{} only apply when sampling; add --sample",
            sampling_flags.join(", ")
        )));
    }
    if args.checkpoint.is_some() == args.synthetic.is_some() {
        return Err(bad(
            "give exactly one of --checkpoint and --synthetic".into()
        ));
    }
    if args.tokens == 0 {
        return Err(bad("--tokens must be positive".into()));
    }
    if args.tp == 0 {
        return Err(bad("--tp needs a positive count of ranks".into()));
    }
    let max_seq = args.prompt.len().checked_add(args.tokens).ok_or_else(|| {
        bad(format!(
            "--tokens {} after {} prompt ids needs more positions than any model holds",
            args.tokens,
            args.prompt.len()
        ))
    })?;
    args.options = args.options.max_seq(max_seq);
    Ok(Command::Run(args))
}

/// Prints an error with its `Display` form, which says what went wrong and how to fix it, and
/// exits with status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The synthetic config `name` names.
fn synthetic_config(name: &str) -> Result<LlamaConfig, DeviceError> {
    match name {
        "tiny" => Ok(LlamaConfig::tiny()),
        "1b" => Ok(LlamaConfig::llama_3_2_1b()),
        "8b" => Ok(LlamaConfig::llama_3_1_8b()),
        other => Err(DeviceError::usage(format!(
            "--synthetic {other:?}: expected tiny, 1b or 8b\n{USAGE}"
        ))),
    }
}

fn run() -> Result<(), DeviceError> {
    let args = match parse_args(std::env::args().skip(1))? {
        Command::Run(args) => args,
        Command::Help => {
            println!("{USAGE}");
            return Ok(());
        }
    };
    let auto = Device::auto()?;
    let device_of = |i: usize| match auto.kind() {
        BackendKind::Cuda => Device::cuda(i),
        _ => Ok(Device::host_numbered(i)),
    };
    if std::env::var_os("RANK").is_some() {
        // One rank of a torchrun group.
        let config = DistConfig::from_env()?;
        let comm = Communicator::connect(&device_of(config.local_rank)?, &config)?;
        let report = decode_rank(&comm, &args)?;
        if comm.rank() == 0 {
            println!(
                "rank 0 of {} (one per process)\n{report}",
                comm.world_size()
            );
        }
        return Ok(());
    }
    if args.tp > 1 {
        // Each rank is a thread with a device of its own: refuse more ranks than the model has
        // query heads to split before making any.
        let heads = model_config(&args)?.num_attention_heads;
        if args.tp > heads {
            return Err(DeviceError::usage(format!(
                "--tp {} is more ranks than the model's {heads} query heads; tensor parallelism \
                 splits the heads, so choose a number of ranks that divides {heads}",
                args.tp
            )));
        }
        let devices = (0..args.tp).map(device_of).collect::<Result<Vec<_>, _>>()?;
        let comms = Communicator::local(&devices)?;
        let reports = std::thread::scope(|s| {
            let ranks: Vec<_> = comms
                .iter()
                .map(|c| {
                    let args = &args;
                    s.spawn(move || decode_rank(c, args))
                })
                .collect();
            ranks
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(DeviceError::usage("a rank panicked")))
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        let names: Vec<String> = devices.iter().map(Device::to_string).collect();
        println!(
            "rank 0 of {}, tensor parallel over {}",
            args.tp,
            names.join(", ")
        );
        println!("{}", reports[0]);
        return Ok(());
    }
    let device = auto;
    println!("device: {device}");
    let stream = device.new_stream()?;
    let model = match (&args.checkpoint, args.synthetic.as_deref()) {
        (Some(dir), _) => {
            let model = Llama::load(&device, dir)?;
            println!("{}", load_report(&model, dir));
            model
        }
        (None, Some(name)) => Llama::synthetic(&device, synthetic_config(name)?, 1)?,
        (None, None) => return Err(DeviceError::usage(USAGE)),
    };
    println!("{}", decode(&model, &stream, &args)?);
    Ok(())
}

/// The config of the model the arguments name (a checkpoint's is read from its folder).
fn model_config(args: &Args) -> Result<LlamaConfig, DeviceError> {
    match (&args.checkpoint, args.synthetic.as_deref()) {
        (Some(dir), _) => LlamaConfig::from_file(&std::path::Path::new(dir).join("config.json")),
        (None, Some(name)) => synthetic_config(name),
        (None, None) => Err(DeviceError::usage(USAGE)),
    }
}

/// What loading `dir` took, or nothing for synthetic weights.
fn load_report(model: &Llama, dir: &str) -> String {
    match model.load_stats() {
        Some(s) => format!(
            "loaded {dir}: {:.2} GB in {:.2} s, {:.2} GB/s (then {:.2} s compiling kernels)",
            s.bytes as f64 / 1e9,
            s.seconds,
            s.gb_per_s(),
            s.compile_seconds
        ),
        None => String::new(),
    }
}

/// One rank's slice of the model the arguments name, loaded or synthetic, decoded as
/// [`decode`] does; the report says how the slice loaded.
fn decode_rank(comm: &Communicator, args: &Args) -> Result<String, DeviceError> {
    let (model, loaded) = match (&args.checkpoint, args.synthetic.as_deref()) {
        (Some(dir), _) => {
            let model = Llama::load_tp(comm, dir)?;
            let report = load_report(&model, dir);
            (model, format!("{report} (this rank's slice)\n"))
        }
        (None, Some(name)) => (
            Llama::synthetic_tp(comm, synthetic_config(name)?, 1)?,
            String::new(),
        ),
        (None, None) => return Err(DeviceError::usage(USAGE)),
    };
    Ok(loaded + &decode(&model, comm.stream(), args)?)
}

/// Generates eagerly and replayed, checks that they agree, and says how fast each ran.
fn decode(model: &Llama, stream: &Stream, args: &Args) -> Result<String, DeviceError> {
    let mut out = String::new();
    let cfg = model.config();
    out += &format!(
        "model: {cfg}, {:.2} GB of bf16 weights (on this rank)\n",
        model.weight_bytes() as f64 / 1e9
    );
    let (prompt, n, opts) = (&args.prompt, args.tokens, args.options);
    model.generate(stream, prompt, n, &opts)?;
    let start = Instant::now();
    let eager = model.generate(stream, prompt, n, &opts)?;
    let eager_s = start.elapsed().as_secs_f64();

    let mut step = model.capture(stream, opts)?;
    step.generate(prompt, n)?;
    let start = Instant::now();
    let replayed = step.generate(prompt, n)?;
    let replay_s = start.elapsed().as_secs_f64();

    out += &format!("prompt ids: {prompt:?}\ngenerated ids: {replayed:?}\n");
    out += &format!(
        "eager:    {n} tokens in {eager_s:.4} s, {:10.1} tokens/s\n",
        n as f64 / eager_s
    );
    out += &format!(
        "replayed: {n} tokens in {replay_s:.4} s, {:10.1} tokens/s ({} nodes per step)\n",
        n as f64 / replay_s,
        step.node_count()?
    );
    if eager != replayed {
        let at = eager.iter().zip(&replayed).position(|(a, b)| a != b);
        let what = format!("eager and replayed generations differ (first at {at:?})");
        if opts.is_greedy() {
            return Err(DeviceError::usage(what));
        }
        out += &what;
    } else {
        out += "eager and replayed ids match";
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{parse_args, Command};

    fn parse(line: &str) -> Result<Command, String> {
        parse_args(line.split_whitespace().map(String::from)).map_err(|e| e.to_string())
    }

    /// Every bad command line is an error saying what is wrong, with the usage; none panics.
    #[test]
    fn bad_command_lines_are_errors() {
        let max = usize::MAX;
        for (line, says) in [
            ("", "exactly one of --checkpoint and --synthetic"),
            ("--synthetic", "--synthetic needs a value"),
            ("--synthetic tiny --tokens", "--tokens needs a value"),
            ("--synthetic tiny --tokens -1", "expected a count"),
            ("--synthetic tiny --tokens 0", "--tokens must be positive"),
            (
                &format!("--synthetic tiny --tokens {max}"),
                "more positions",
            ),
            (
                &format!("--synthetic tiny --tokens {}", max - 2),
                "more positions",
            ),
            (
                "--synthetic tiny --prompt-ids 1,,2",
                "comma-separated token ids",
            ),
            ("--synthetic tiny --tp 0", "positive count of ranks"),
            ("--synthetic tiny --temperature 0.5", "add --sample"),
            (
                "--synthetic tiny --seed 3 --top-k 5",
                "--seed, --top-k only apply",
            ),
            ("--synthetic tiny --bogus 1", "unknown argument"),
        ] {
            match parse(line) {
                Ok(c) => panic!("{line:?} parsed as {c:?}"),
                Err(e) => {
                    assert!(e.contains(says), "{line:?}: {e}");
                    assert!(e.contains("usage: 06_llama"), "{line:?}: {e}");
                }
            }
        }
    }

    #[test]
    fn good_command_lines_parse() {
        assert!(matches!(parse("--help"), Ok(Command::Help)));
        assert!(matches!(parse("--synthetic tiny -h"), Ok(Command::Help)));
        let Ok(Command::Run(args)) = parse("--synthetic tiny --sample --seed 3 --tokens 4") else {
            panic!("a good command line");
        };
        assert_eq!((args.tokens, args.prompt.len()), (4, 3));
        assert!(!args.options.is_greedy());
    }
}

//! `cuflow-bench`: cuflow's benchmarks, each figure beside its baseline measured in the same
//! run (raw cudarc on the same device, in the same process, or PyTorch, which the `kernels`
//! and `graph` benchmarks run themselves), and the ratio.
//!
//! ```text
//! cuflow-bench <benchmark> [--iters N] [--json PATH]
//! cuflow-bench trace-svg IN.json OUT.svg [--title TEXT]
//! cuflow-bench --help
//! ```
//!
//! Each benchmark is one module with a `run(&Device, iters) -> Result<Results, BenchError>`
//! function and one entry in [`BENCHMARKS`]. The benchmarks measure GPU work, so they need a
//! CUDA device: without one the program says so and exits with status 2 (before any direct
//! cudarc call, which would panic where libcuda is absent), as it does when `multigpu` finds
//! fewer than two. Exit status 1 means a benchmark
//! failed; the figures are printed as a table on stdout and, with `--json`, written to `PATH`.
//! Committed results live in `docs/perf/`.
//!
//! `trace-svg` needs no device: it draws a trace written by `cuflow::trace` (or
//! `CUFLOW_TRACE`) as an SVG timeline ([`trace_svg`]).
//!
//! `unsafe` is denied everywhere but in [`raw`], the raw cudarc baseline, whose launch API needs
//! it.

#![deny(unsafe_code)]

mod collectives;
mod copies;
mod error;
mod graph;
mod kernels;
mod launch;
mod llama;
mod llama_tp;
mod multigpu;
mod ops;
mod overlap;
mod python;
mod raw;
mod report;
mod tensor_kernels;
mod trace_svg;

use std::error::Error as _;
use std::path::PathBuf;
use std::process::ExitCode;

use cuflow::prelude::Device;

use crate::error::BenchError;
use crate::report::{Environment, Report, Results};

/// One benchmark of the program.
struct Benchmark {
    /// Its name on the command line.
    name: &'static str,
    /// One line for `--help`.
    about: &'static str,
    /// What `--iters` counts, for `--help`.
    iters_meaning: &'static str,
    /// `--iters` when not given.
    default_iters: usize,
    /// Runs it on a CUDA device.
    run: fn(&Device, usize) -> Result<Results, BenchError>,
}

/// Every benchmark, in the order `--help` lists them; each is a module beside `launch.rs` and
/// an entry here.
const BENCHMARKS: &[Benchmark] = &[
    Benchmark {
        name: "launch",
        about: "empty-kernel launch cost, cuflow vs raw cudarc (event tracking off and on)",
        iters_meaning: "launches per trial",
        default_iters: 20_000,
        run: launch::run,
    },
    Benchmark {
        name: "ops",
        about: "1000-kernel then-chain vs raw cudarc launches; .await vs .sync_on",
        iters_meaning: "trials",
        default_iters: 51,
        run: ops::run,
    },
    Benchmark {
        name: "copies",
        about: "copies between pageable host memory and the device, 256 KiB-256 MiB, vs raw cudarc",
        iters_meaning: "trials per size and direction",
        default_iters: 9,
        run: copies::run,
    },
    Benchmark {
        name: "overlap",
        about: "zip! of 8 ~1 ms kernels: round-robin over 8 streams vs SingleStream",
        iters_meaning: "trials",
        default_iters: 9,
        run: overlap::run,
    },
    Benchmark {
        name: "kernels",
        about: "tensor kernels (saxpy, rms_norm, softmax, matmul, broadcast and strided add, axis \
                reductions) vs PyTorch eager, GPU time",
        iters_meaning: "launches per trial",
        default_iters: 50,
        run: tensor_kernels::run,
    },
    Benchmark {
        name: "graph",
        about: "graph replay of 10/100/1000 tiny kernels vs raw cudarc and PyTorch graphs",
        iters_meaning: "unused (fixed trial sizes)",
        default_iters: 1,
        run: graph::run,
    },
    Benchmark {
        name: "llama",
        about: "Llama-3.2-1B-shaped batch-1 decode vs roofline and PyTorch (eager, graph, compile)",
        iters_meaning: "unused (fixed trial sizes)",
        default_iters: 1,
        run: llama::run,
    },
    Benchmark {
        name: "collectives",
        about: "all-reduce bus bandwidth 8 KiB-1 GiB over every GPU vs torch.distributed (NCCL)",
        iters_meaning: "all-reduces per size (fewer for large sizes)",
        default_iters: 50,
        run: collectives::run,
    },
    Benchmark {
        name: "llama_tp",
        about: "1B and 8B Llama decode, tensor parallel over 1/2/4/8 GPUs, replayed (scaling)",
        iters_meaning: "unused (fixed trial sizes)",
        default_iters: 1,
        run: llama_tp::run,
    },
    Benchmark {
        name: "multigpu",
        about: "16 matmuls 4096^3 over 2 GPUs vs 1 (MultiDevice); 256 MiB peer vs staged copy",
        iters_meaning: "trials",
        default_iters: 5,
        run: multigpu::run,
    },
];

/// Exit status for a bad command line, or too few CUDA devices.
const EXIT_USAGE: u8 = 2;

fn usage() -> String {
    let mut s = String::from(
        "usage: cuflow-bench <benchmark> [--iters N] [--json PATH]\n\
         \x20      cuflow-bench trace-svg IN.json OUT.svg [--title TEXT]\n\
         \n\
         Runs one benchmark on CUDA device 0 and prints each figure beside its baseline\n\
         measured in the same run, and the ratio. --json PATH also writes them as JSON.\n\
         \n\
         benchmarks:\n",
    );
    let width = BENCHMARKS.iter().map(|b| b.name.len()).max().unwrap_or(0);
    for b in BENCHMARKS {
        s.push_str(&format!(
            "  {:<width$}  {}\n  {:<width$}  --iters: {} (default {})\n",
            b.name, b.about, "", b.iters_meaning, b.default_iters
        ));
    }
    s
}

/// A parsed command line.
enum Command {
    Help,
    Run {
        benchmark: &'static Benchmark,
        iters: usize,
        json: Option<PathBuf>,
    },
}

fn parse(args: &[String]) -> Result<Command, String> {
    let mut name: Option<&str> = None;
    let mut iters: Option<usize> = None;
    let mut json: Option<PathBuf> = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--iters" => {
                let value = args.next().ok_or("--iters needs a value")?;
                match value.parse::<usize>() {
                    Ok(n) if n > 0 => iters = Some(n),
                    _ => return Err(format!("--iters needs a positive integer, not {value:?}")),
                }
            }
            "--json" => json = Some(args.next().ok_or("--json needs a path")?.into()),
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag:?}")),
            benchmark if name.is_none() => name = Some(benchmark),
            extra => return Err(format!("unexpected argument {extra:?}")),
        }
    }
    let name = name.ok_or("which benchmark?")?;
    let benchmark = BENCHMARKS
        .iter()
        .find(|b| b.name == name)
        .ok_or_else(|| format!("unknown benchmark {name:?}"))?;
    Ok(Command::Run {
        benchmark,
        iters: iters.unwrap_or(benchmark.default_iters),
        json,
    })
}

/// `error` and its chain of sources, on one line.
fn error_chain(error: &BenchError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(&format!(": {e}"));
        source = e.source();
    }
    text
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("trace-svg") {
        return match trace_svg::main(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("cuflow-bench trace-svg: {message}");
                ExitCode::from(EXIT_USAGE)
            }
        };
    }
    let (benchmark, iters, json) = match parse(&args) {
        Ok(Command::Help) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run {
            benchmark,
            iters,
            json,
        }) => (benchmark, iters, json),
        Err(message) => {
            eprintln!("cuflow-bench: {message}\n\n{}", usage());
            return ExitCode::from(EXIT_USAGE);
        }
    };

    // Open the device through cuflow first: it reports a missing driver or device as an
    // error, where a direct cudarc call would panic. The collectives benchmark alone also
    // runs on host devices, as a smoke check (CUFLOW_DEVICE=host).
    let host_smoke = benchmark.name == "collectives"
        && std::env::var("CUFLOW_DEVICE").is_ok_and(|v| v.trim() == "host");
    let opened = if host_smoke {
        Ok(Device::host())
    } else {
        Device::cuda(0)
    };
    let device = match opened {
        Ok(device) => device,
        Err(e) => {
            eprintln!(
                "cuflow-bench {}: this benchmark needs a CUDA device, and CUDA device 0 could \
                 not be opened: {e}",
                benchmark.name
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };

    let results = match (benchmark.run)(&device, iters) {
        Ok(results) => results,
        Err(e @ BenchError::MissingDevices { .. }) => {
            eprintln!("cuflow-bench {}: {e}", benchmark.name);
            return ExitCode::from(EXIT_USAGE);
        }
        Err(e) => {
            eprintln!(
                "cuflow-bench {} failed: {}",
                benchmark.name,
                error_chain(&e)
            );
            return ExitCode::FAILURE;
        }
    };
    let report = Report {
        benchmark: benchmark.name,
        iters,
        environment: Environment::collect(&device),
        results,
    };
    print!("{}", report.table());

    if let Some(path) = json {
        let text = match serde_json::to_string_pretty(&report.json()) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("cuflow-bench: could not encode the results as JSON: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = std::fs::write(&path, text + "\n") {
            eprintln!("cuflow-bench: could not write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("results written to {}", path.display());
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn parses_benchmark_iters_and_json() {
        let Ok(Command::Run {
            benchmark,
            iters,
            json,
        }) = parse(&args("launch --iters 100 --json out/launch.json"))
        else {
            panic!("expected a run");
        };
        assert_eq!(benchmark.name, "launch");
        assert_eq!(iters, 100);
        assert_eq!(json, Some(PathBuf::from("out/launch.json")));
    }

    #[test]
    fn defaults_iters_per_benchmark() {
        let Ok(Command::Run { iters, json, .. }) = parse(&args("ops")) else {
            panic!("expected a run");
        };
        assert_eq!(iters, 51);
        assert_eq!(json, None);
    }

    #[test]
    fn help_wins() {
        assert!(matches!(parse(&args("launch --help")), Ok(Command::Help)));
    }

    #[test]
    fn rejects_bad_command_lines() {
        for line in [
            "",
            "nope",
            "launch --iters 0",
            "launch --iters x",
            "launch --iters",
            "launch --json",
            "launch ops",
            "launch --fast",
        ] {
            assert!(parse(&args(line)).is_err(), "{line:?} was accepted");
        }
    }

    #[test]
    fn every_benchmark_is_listed_once() {
        for b in BENCHMARKS {
            assert_eq!(BENCHMARKS.iter().filter(|o| o.name == b.name).count(), 1);
            assert!(usage().contains(b.name));
        }
    }
}

//! `cuflow-bench`: cuflow's benchmarks, each figure beside its baseline measured in the same run.
//!
//! ```text
//! cuflow-bench <launch|ops|overlap> [--iters N] [--json PATH]
//! ```
//!
//! The benchmarks need a CUDA device (they measure GPU work against raw cudarc); without one
//! they say so and exit with status 2.

mod kernels;
mod launch;
mod ops;
mod overlap;
mod raw;
mod report;

use cuflow::Device;

const BENCHMARKS: &[(&str, &str, usize)] = &[
    (
        "launch",
        "empty-kernel launch cost vs raw cudarc (tracking off and on)",
        20_000,
    ),
    (
        "ops",
        "1000-kernel then-chain vs raw launches; .await vs .sync_on",
        21,
    ),
    (
        "overlap",
        "zip! of 8 ~1 ms kernels: round-robin(8) vs SingleStream",
        9,
    ),
];

fn usage() -> String {
    let mut s =
        String::from("usage: cuflow-bench <benchmark> [--iters N] [--json PATH]\n\nbenchmarks:\n");
    for (name, what, _) in BENCHMARKS {
        s.push_str(&format!("  {name:<10} {what}\n"));
    }
    s
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut name = None;
    let mut iters = None;
    let mut json = None;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-h" | "--help" => {
                print!("{}", usage());
                return;
            }
            "--iters" => {
                iters = args.get(i + 1).and_then(|v| v.parse::<usize>().ok());
                if iters.is_none() {
                    eprintln!("--iters needs a positive number\n\n{}", usage());
                    std::process::exit(2);
                }
                i += 1;
            }
            "--json" => {
                json = args.get(i + 1).cloned();
                if json.is_none() {
                    eprintln!("--json needs a path\n\n{}", usage());
                    std::process::exit(2);
                }
                i += 1;
            }
            other if name.is_none() => name = Some(other.to_string()),
            other => {
                eprintln!("unexpected argument {other:?}\n\n{}", usage());
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let Some(name) = name else {
        eprint!("{}", usage());
        std::process::exit(2);
    };
    let Some(&(_, _, default_iters)) = BENCHMARKS.iter().find(|(n, _, _)| *n == name) else {
        eprintln!("unknown benchmark {name:?}\n\n{}", usage());
        std::process::exit(2);
    };
    let device = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cuflow-bench {name} needs a CUDA device: {e}");
            std::process::exit(2);
        }
    };
    let iters = iters.unwrap_or(default_iters).max(1);
    let result = match name.as_str() {
        "launch" => launch::run(&device, iters),
        "ops" => ops::run(&device, iters),
        _ => overlap::run(&device, iters),
    };
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cuflow-bench {name} failed: {e}");
            std::process::exit(1);
        }
    };
    print!("{}", report.table());
    if let Some(path) = json {
        let text = match serde_json::to_string_pretty(&report.json()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("could not encode the results: {e}");
                std::process::exit(1);
            }
        };
        if let Err(e) = std::fs::write(&path, text + "\n") {
            eprintln!("could not write {path}: {e}");
            std::process::exit(1);
        }
    }
}

//! Benchmark results: each figure beside its baseline measured in the same run, and the ratio,
//! printed as an aligned table and written as JSON together with the environment they were
//! measured in (device, driver, NVRTC, host CPU, build). Nothing here reads a clock: the files
//! are meant to be committed, and differ only when a figure or the environment does.
//!
//! A baseline that could not be measured in the run (an external one, such as PyTorch, that is
//! not installed) is absent rather than made up: the row keeps its figure, and its ratio and any
//! goal on the ratio are reported as unknown (`n/a` in the table, `null` in the JSON).

use std::fmt::Write as _;

use cuflow::prelude::Device;
use serde_json::json;

use crate::raw;

/// A bound that the project aims for: on `value / baseline`, or on the value itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Goal {
    /// The ratio must not exceed this (times: lower is better).
    AtMost(f64),
    /// The ratio must reach at least this (speed-ups, throughput).
    AtLeast(f64),
    /// The value itself must reach at least this, in the row's unit: an absolute target (a
    /// bandwidth, say), met or not whatever the baseline measured.
    ValueAtLeast(f64),
}

impl Goal {
    /// Whether `row` meets the goal; `None` for a goal on the ratio when the row has no
    /// baseline.
    fn met_by(self, row: &Row) -> Option<bool> {
        match self {
            Goal::AtMost(bound) => row.ratio().map(|ratio| ratio <= bound),
            Goal::AtLeast(bound) => row.ratio().map(|ratio| ratio >= bound),
            Goal::ValueAtLeast(bound) => Some(row.value >= bound),
        }
    }

    /// The goal as text, with `unit` for an absolute goal.
    fn describe(self, unit: &str) -> String {
        match self {
            Goal::AtMost(bound) => format!("<= {bound:.2}x"),
            Goal::AtLeast(bound) => format!(">= {bound:.2}x"),
            Goal::ValueAtLeast(bound) => format!(">= {bound:.2} {unit}"),
        }
    }
}

/// One measured figure and its baseline from the same run.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// What was measured.
    pub(crate) figure: String,
    /// The unit of `value` and `baseline`.
    pub(crate) unit: &'static str,
    /// The figure (the median of `trials` where there are trials).
    pub(crate) value: f64,
    /// What the figure is compared with.
    pub(crate) baseline_name: String,
    /// The baseline (the median of `baseline_trials` where there are trials); `None` when it
    /// could not be measured in this run.
    pub(crate) baseline: Option<f64>,
    /// Whether a smaller value is better (times) or a larger one (speed-ups).
    pub(crate) lower_is_better: bool,
    /// The project's goal on `value / baseline` or on `value`, if it has one.
    pub(crate) goal: Option<Goal>,
    /// Every trial of the figure, in the order measured (empty for a derived figure).
    pub(crate) trials: Vec<f64>,
    /// Every trial of the baseline, in the order measured (empty for a derived figure).
    pub(crate) baseline_trials: Vec<f64>,
}

impl Row {
    /// A figure and its baseline as the medians of their trials; lower is better.
    pub(crate) fn from_trials(
        figure: impl Into<String>,
        unit: &'static str,
        trials: &[f64],
        baseline_name: impl Into<String>,
        baseline_trials: &[f64],
    ) -> Row {
        Row {
            baseline: Some(median(baseline_trials)),
            baseline_trials: baseline_trials.to_vec(),
            ..Row::without_baseline(figure, unit, trials, baseline_name)
        }
    }

    /// A figure as the median of its trials, whose baseline (`baseline_name`) could not be
    /// measured in this run; lower is better.
    pub(crate) fn without_baseline(
        figure: impl Into<String>,
        unit: &'static str,
        trials: &[f64],
        baseline_name: impl Into<String>,
    ) -> Row {
        Row {
            figure: figure.into(),
            unit,
            value: median(trials),
            baseline_name: baseline_name.into(),
            baseline: None,
            lower_is_better: true,
            goal: None,
            trials: trials.to_vec(),
            baseline_trials: Vec::new(),
        }
    }

    /// A figure and its baseline computed from other rows; lower is better.
    pub(crate) fn derived(
        figure: impl Into<String>,
        unit: &'static str,
        value: f64,
        baseline_name: impl Into<String>,
        baseline: f64,
    ) -> Row {
        Row {
            figure: figure.into(),
            unit,
            value,
            baseline_name: baseline_name.into(),
            baseline: Some(baseline),
            lower_is_better: true,
            goal: None,
            trials: Vec::new(),
            baseline_trials: Vec::new(),
        }
    }

    /// The same row with the project's goal on its ratio or value.
    pub(crate) fn with_goal(mut self, goal: Goal) -> Row {
        self.goal = Some(goal);
        self
    }

    /// The same row, where a larger value is better.
    pub(crate) fn higher_is_better(mut self) -> Row {
        self.lower_is_better = false;
        self
    }

    /// `value / baseline`; `None` without a baseline.
    pub(crate) fn ratio(&self) -> Option<f64> {
        self.baseline.map(|baseline| self.value / baseline)
    }

    /// Whether the goal is met; `None` without a goal, or for a goal on the ratio without a
    /// baseline.
    pub(crate) fn goal_met(&self) -> Option<bool> {
        self.goal.and_then(|g| g.met_by(self))
    }

    fn goal_text(&self) -> String {
        let Some(goal) = self.goal else {
            return String::new();
        };
        let verdict = match self.goal_met() {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "no baseline",
        };
        format!("{}: {verdict}", goal.describe(self.unit))
    }
}

/// What one benchmark measured.
#[derive(Debug, Default)]
pub(crate) struct Results {
    /// How the figures were measured, one sentence each.
    pub(crate) notes: Vec<String>,
    /// The figures.
    pub(crate) rows: Vec<Row>,
}

/// Where the figures were measured.
#[derive(Debug, Clone)]
pub(crate) struct Environment {
    device: String,
    device_name: String,
    compute_capability: Option<String>,
    cuda_driver_api: Option<String>,
    nvidia_kernel_module: Option<String>,
    nvrtc: Option<String>,
    host_cpu: Option<String>,
    os: &'static str,
    arch: &'static str,
    debug_assertions: bool,
    bench_version: &'static str,
}

/// The version in `/proc/driver/nvidia/version` ("NVRM version: NVIDIA UNIX ... 580.95.05 ...").
fn nvidia_kernel_module() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().next()?;
    line.split_whitespace()
        .find(|word| {
            word.starts_with(|c: char| c.is_ascii_digit())
                && word.contains('.')
                && word.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .map(str::to_string)
}

/// The first `model name` of `/proc/cpuinfo` (launch cost is host-bound).
fn host_cpu() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, name)| name.trim().to_string())
}

impl Environment {
    /// Describes `device` and this process. A query that fails leaves its field empty (it is
    /// reported on stderr): the figures are still worth having.
    pub(crate) fn collect(device: &Device) -> Environment {
        let version = |what: &str, v: Result<(i32, i32), crate::error::BenchError>| match v {
            Ok((major, minor)) => Some(format!("{major}.{minor}")),
            Err(e) => {
                eprintln!("cuflow-bench: could not read the {what} version: {e}");
                None
            }
        };
        Environment {
            device: device.to_string(),
            device_name: device.name().to_string(),
            compute_capability: device
                .compute_capability()
                .map(|(major, minor)| format!("{major}.{minor}")),
            cuda_driver_api: version("CUDA driver", raw::cuda_driver_version(device)),
            nvidia_kernel_module: nvidia_kernel_module(),
            nvrtc: version("NVRTC", raw::nvrtc_version()),
            host_cpu: host_cpu(),
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
            debug_assertions: cfg!(debug_assertions),
            bench_version: env!("CARGO_PKG_VERSION"),
        }
    }

    fn summary(&self) -> String {
        let or_unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
        format!(
            "CUDA driver API {} (NVIDIA kernel module {}), NVRTC {}, compute capability {}\n\
             host CPU {} ({}-{}), cuflow-bench {}{}",
            or_unknown(&self.cuda_driver_api),
            or_unknown(&self.nvidia_kernel_module),
            or_unknown(&self.nvrtc),
            or_unknown(&self.compute_capability),
            or_unknown(&self.host_cpu),
            self.os,
            self.arch,
            self.bench_version,
            if self.debug_assertions {
                ", debug assertions on"
            } else {
                ""
            },
        )
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "device": self.device,
            "device_name": self.device_name,
            "compute_capability": self.compute_capability,
            "cuda_driver_api": self.cuda_driver_api,
            "nvidia_kernel_module": self.nvidia_kernel_module,
            "nvrtc": self.nvrtc,
            "host_cpu": self.host_cpu,
            "os": self.os,
            "arch": self.arch,
            "debug_assertions": self.debug_assertions,
            "cuflow_bench_version": self.bench_version,
        })
    }
}

/// One run of one benchmark: its results and where they were measured.
#[derive(Debug)]
pub(crate) struct Report {
    /// The benchmark's name on the command line.
    pub(crate) benchmark: &'static str,
    /// Launches (or trials) per measurement, as given by `--iters` or the default.
    pub(crate) iters: usize,
    /// Where it ran.
    pub(crate) environment: Environment,
    /// What it measured.
    pub(crate) results: Results,
}

impl Report {
    /// The report as aligned text: a header, the notes, and one line per row.
    pub(crate) fn table(&self) -> String {
        const HEADER: [&str; 7] = [
            "figure",
            "value",
            "unit",
            "baseline (same run)",
            "baseline",
            "ratio",
            "goal",
        ];
        let cells: Vec<[String; 7]> = self
            .results
            .rows
            .iter()
            .map(|r| {
                [
                    r.figure.clone(),
                    format!("{:.3}", r.value),
                    r.unit.to_string(),
                    r.baseline_name.clone(),
                    r.baseline
                        .map_or_else(|| "n/a".into(), |b| format!("{b:.3}")),
                    r.ratio()
                        .map_or_else(|| "n/a".into(), |q| format!("{q:.3}x")),
                    r.goal_text(),
                ]
            })
            .collect();
        let mut width = HEADER.map(|h| h.chars().count());
        for row in &cells {
            for (w, cell) in width.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        // Text columns are left-aligned, numbers right-aligned.
        let numeric = [false, true, false, false, true, true, false];
        let line = |cells: [&str; 7]| {
            let mut out = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let pad = width[i] - cell.chars().count();
                if i > 0 {
                    out.push_str("  ");
                }
                if numeric[i] {
                    out.push_str(&" ".repeat(pad));
                    out.push_str(cell);
                } else {
                    out.push_str(cell);
                    if i + 1 < cells.len() {
                        out.push_str(&" ".repeat(pad));
                    }
                }
            }
            out.trim_end().to_string()
        };

        let mut out = String::new();
        let _ = writeln!(
            out,
            "cuflow-bench {} on {}",
            self.benchmark, self.environment.device
        );
        for l in self.environment.summary().lines() {
            let _ = writeln!(out, "  {l}");
        }
        for note in &self.results.notes {
            let _ = writeln!(out, "  {note}");
        }
        let _ = writeln!(out, "{}", line(HEADER));
        for row in &cells {
            let _ = writeln!(out, "{}", line(row.each_ref().map(String::as_str)));
        }
        out
    }

    /// The report as JSON: the environment, the notes, and every row with its trials.
    pub(crate) fn json(&self) -> serde_json::Value {
        json!({
            "benchmark": self.benchmark,
            "iters": self.iters,
            "environment": self.environment.json(),
            "notes": self.results.notes,
            "rows": self.results.rows.iter().map(|r| json!({
                "figure": r.figure,
                "value": r.value,
                "unit": r.unit,
                "baseline": r.baseline_name,
                "baseline_value": r.baseline,
                "ratio": r.ratio(),
                "lower_is_better": r.lower_is_better,
                "goal": r.goal.map(|g| g.describe(r.unit)),
                "goal_met": r.goal_met(),
                "trials": r.trials,
                "baseline_trials": r.baseline_trials,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The median of `samples` (NaN when there are none).
pub(crate) fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            benchmark: "launch",
            iters: 10,
            environment: Environment {
                device: "cuda:0 (Test GPU)".into(),
                device_name: "Test GPU".into(),
                compute_capability: Some("9.0".into()),
                cuda_driver_api: Some("12.8".into()),
                nvidia_kernel_module: None,
                nvrtc: Some("12.8".into()),
                host_cpu: None,
                os: "linux",
                arch: "x86_64",
                debug_assertions: false,
                bench_version: "0.1.0",
            },
            results: Results {
                notes: vec!["a note".into()],
                rows: vec![
                    Row::from_trials("a", "us", &[3.0, 1.0, 2.0], "b", &[2.0, 2.0, 2.0])
                        .with_goal(Goal::AtMost(1.10)),
                    Row::from_trials("a longer figure", "us", &[1.0, 2.0], "c", &[4.0, 4.0])
                        .with_goal(Goal::AtMost(1.10)),
                    Row::derived("speed-up", "x", 7.5, "1.0", 1.0)
                        .higher_is_better()
                        .with_goal(Goal::AtLeast(6.0)),
                ],
            },
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn goals() {
        let r = report();
        assert_eq!(r.results.rows[0].ratio(), Some(1.0));
        assert_eq!(r.results.rows[0].goal_met(), Some(true));
        assert_eq!(r.results.rows[1].ratio(), Some(0.375));
        assert_eq!(r.results.rows[2].goal_met(), Some(true));
        let slow = Row::derived("slow", "us", 1.2, "base", 1.0).with_goal(Goal::AtMost(1.10));
        assert_eq!(slow.goal_met(), Some(false));
        assert!(slow.goal_text().contains("NOT met"));
        assert_eq!(Row::derived("x", "us", 1.0, "y", 1.0).goal_met(), None);
    }

    #[test]
    fn absolute_goals_ignore_the_baseline() {
        let fast = Row::derived("bandwidth", "TB/s", 3.2, "other", 4.0)
            .higher_is_better()
            .with_goal(Goal::ValueAtLeast(3.0));
        assert_eq!(fast.goal_met(), Some(true));
        assert_eq!(fast.goal_text(), ">= 3.00 TB/s: met");
        let slow = Row::derived("bandwidth", "TB/s", 2.9, "other", 1.0)
            .higher_is_better()
            .with_goal(Goal::ValueAtLeast(3.0));
        assert_eq!(slow.goal_met(), Some(false));
        assert_eq!(slow.goal_text(), ">= 3.00 TB/s: NOT met");
    }

    #[test]
    fn rows_without_a_baseline() {
        let row = Row::without_baseline("kernel", "TB/s", &[1.0, 3.0, 2.0], "PyTorch")
            .higher_is_better()
            .with_goal(Goal::AtLeast(1.0));
        assert_eq!(row.value, 2.0);
        assert_eq!(row.baseline, None);
        assert_eq!(row.ratio(), None);
        assert_eq!(row.goal_met(), None);
        assert_eq!(row.goal_text(), ">= 1.00x: no baseline");
        // An absolute goal is still decided.
        let row = row.with_goal(Goal::ValueAtLeast(1.5));
        assert_eq!(row.goal_met(), Some(true));

        let mut r = report();
        r.results.rows.push(
            Row::without_baseline("no baseline", "us", &[5.0], "PyTorch (unavailable)")
                .with_goal(Goal::AtMost(1.10)),
        );
        let text = r.table();
        let last = text.lines().last().unwrap();
        assert!(last.contains("PyTorch (unavailable)"), "{text}");
        assert_eq!(last.matches(" n/a").count(), 2, "{text}");
        assert!(last.ends_with("<= 1.10x: no baseline"), "{text}");
        let json = r.json();
        let row = &json["rows"][3];
        assert_eq!(row["value"], 5.0);
        assert_eq!(row["baseline_value"], serde_json::Value::Null);
        assert_eq!(row["ratio"], serde_json::Value::Null);
        assert_eq!(row["goal_met"], serde_json::Value::Null);
        assert_eq!(row["baseline_trials"], serde_json::json!([]));
    }

    #[test]
    fn table_columns_line_up() {
        let text = report().table();
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().position(|l| l.starts_with("figure")).unwrap();
        let rows = &lines[header + 1..];
        assert_eq!(rows.len(), 3);
        // Every ratio ends in the same column.
        let ends: Vec<usize> = rows.iter().map(|l| l.rfind("x  ").unwrap()).collect();
        assert!(ends.iter().all(|&e| e == ends[0]), "{text}");
        assert!(rows[0].ends_with("1.000x  <= 1.10x: met"), "{text}");
        assert!(text.contains("CUDA driver API 12.8"), "{text}");
    }

    #[test]
    fn json_has_every_row_and_the_environment() {
        let json = report().json();
        assert_eq!(json["benchmark"], "launch");
        assert_eq!(json["environment"]["device_name"], "Test GPU");
        assert_eq!(
            json["environment"]["nvidia_kernel_module"],
            serde_json::Value::Null
        );
        let rows = json["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0]["value"], 2.0);
        assert_eq!(rows[0]["baseline_value"], 2.0);
        assert_eq!(rows[0]["ratio"], 1.0);
        assert_eq!(rows[0]["goal"], "<= 1.10x");
        assert_eq!(rows[0]["goal_met"], true);
        assert_eq!(rows[0]["trials"], serde_json::json!([3.0, 1.0, 2.0]));
        assert_eq!(rows[2]["lower_is_better"], false);
    }
}

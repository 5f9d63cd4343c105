//! Benchmark rows: each figure beside its baseline from the same run, printed as a table and
//! written as JSON.

use std::fmt::Write as _;

/// One measured figure and its baseline.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
    pub(crate) baseline_name: String,
    pub(crate) baseline: f64,
    /// Whether a smaller value is better (times) or a larger one (throughput).
    pub(crate) lower_is_better: bool,
    /// The goal on `value / baseline`, e.g. `("<=", 1.10)`.
    pub(crate) goal: Option<(&'static str, f64)>,
}

impl Row {
    pub(crate) fn ratio(&self) -> f64 {
        self.value / self.baseline
    }

    pub(crate) fn goal_met(&self) -> Option<bool> {
        self.goal.map(|(op, g)| match op {
            "<=" => self.ratio() <= g,
            _ => self.ratio() >= g,
        })
    }
}

/// A benchmark's rows with the context they were measured in.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) benchmark: String,
    pub(crate) device: String,
    pub(crate) notes: Vec<String>,
    pub(crate) rows: Vec<Row>,
}

impl Report {
    pub(crate) fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "cuflow-bench {} on {}", self.benchmark, self.device);
        for n in &self.notes {
            let _ = writeln!(out, "  {n}");
        }
        let _ = writeln!(
            out,
            "{:<44} {:>12} {:<6} {:<36} {:>12} {:>8}  goal",
            "figure", "value", "unit", "baseline (same run)", "baseline", "ratio"
        );
        for r in &self.rows {
            let goal = match (r.goal, r.goal_met()) {
                (Some((op, g)), Some(met)) => {
                    format!("{op} {g:.2}: {}", if met { "met" } else { "NOT met" })
                }
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "{:<44} {:>12.3} {:<6} {:<36} {:>12.3} {:>7.3}x  {}",
                r.name,
                r.value,
                r.unit,
                r.baseline_name,
                r.baseline,
                r.ratio(),
                goal
            );
        }
        out
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "benchmark": self.benchmark,
            "device": self.device,
            "notes": self.notes,
            "rows": self.rows.iter().map(|r| serde_json::json!({
                "figure": r.name,
                "value": r.value,
                "unit": r.unit,
                "baseline": r.baseline_name,
                "baseline_value": r.baseline,
                "ratio": r.ratio(),
                "lower_is_better": r.lower_is_better,
                "goal": r.goal.map(|(op, g)| format!("{op} {g}")),
                "goal_met": r.goal_met(),
            })).collect::<Vec<_>>(),
        })
    }
}

/// The median of `samples` (which it sorts).
pub(crate) fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    match samples.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => samples[n / 2],
        n => 0.5 * (samples[n / 2 - 1] + samples[n / 2]),
    }
}

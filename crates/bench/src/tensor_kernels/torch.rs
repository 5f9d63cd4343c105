//! The PyTorch side of the kernel benchmark: [`TORCH_SCRIPT`] run on the same cases, and its
//! reply read.

use serde_json::{json, Value};

use super::{CASES, TRIALS, WARMUP};

/// The PyTorch baseline; its docstring gives its command line and output.
pub(super) const TORCH_SCRIPT: &str = include_str!("../tensor_kernels_torch.py");

/// What the PyTorch script measured.
pub(super) struct TorchRun {
    /// Per case of [`CASES`], in order: milliseconds per call of each trial, or why the case
    /// failed there.
    pub(super) cases: Vec<Result<Vec<f64>, String>>,
    /// The versions and device it ran on, and the script's own notes.
    pub(super) notes: Vec<String>,
}

/// Runs [`TORCH_SCRIPT`] on [`CASES`] with `launches` calls per trial; `Err` says why there is
/// no PyTorch baseline at all.
pub(super) fn run_torch(launches: usize) -> Result<TorchRun, String> {
    let args = json!({
        "trials": TRIALS,
        "launches": launches,
        "warmup": WARMUP,
        "cases": CASES.iter().map(|c| c.torch_json()).collect::<Vec<_>>(),
    });
    let reply = crate::python::run_script("kernels", TORCH_SCRIPT, &args)?;
    parse_torch_reply(&reply)
}

/// Reads the script's JSON output (see [`TORCH_SCRIPT`]).
fn parse_torch_reply(reply: &Value) -> Result<TorchRun, String> {
    let cases = reply["cases"]
        .as_array()
        .filter(|cases| cases.len() == CASES.len())
        .ok_or_else(|| format!("the PyTorch script's reply has no result per case: {reply}"))?
        .iter()
        .map(
            |case| match (case["ms"].as_array(), case["error"].as_str()) {
                (Some(ms), _) => ms
                    .iter()
                    .map(|v| v.as_f64().filter(|v| *v > 0.0))
                    .collect::<Option<Vec<f64>>>()
                    .filter(|ms| ms.len() == TRIALS)
                    .ok_or_else(|| format!("malformed trials {case}")),
                (None, Some(error)) => Err(error.to_string()),
                (None, None) => Err(format!("malformed result {case}")),
            },
        )
        .collect();
    let text = |key: &str| reply[key].as_str().unwrap_or("unknown").to_string();
    let mut notes = vec![format!(
        "baseline: PyTorch {} (CUDA {}) eager, in a separate process on {}, after cuflow's \
         measurements; f32 matmul with torch.backends.cuda.matmul.allow_tf32 = {}, so both \
         sides compute in full f32 (bf16: PyTorch's defaults)",
        text("torch_version"),
        text("cuda_version"),
        text("device_name"),
        if reply["allow_tf32"] == json!(false) {
            "False"
        } else {
            "True (it could not be turned off)"
        },
    )];
    if let Some(script_notes) = reply["notes"].as_array() {
        notes.extend(
            script_notes
                .iter()
                .filter_map(Value::as_str)
                .map(|n| format!("baseline: {n}")),
        );
    }
    Ok(TorchRun { cases, notes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(cases: Value) -> Value {
        json!({
            "torch_version": "2.5.1",
            "cuda_version": "12.4",
            "device_name": "Test GPU",
            "allow_tf32": false,
            "notes": ["a note"],
            "cases": cases,
        })
    }

    #[test]
    fn reads_the_torch_reply() {
        let trials = json!([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        let mut cases: Vec<Value> = CASES.iter().map(|_| json!({"ms": trials})).collect();
        cases[6] = json!({"error": "RuntimeError: no bf16"});
        let run = parse_torch_reply(&reply(Value::from(cases))).unwrap();
        assert_eq!(run.cases.len(), CASES.len());
        assert_eq!(run.cases[0].as_ref().unwrap()[6], 7.0);
        assert_eq!(run.cases[6], Err("RuntimeError: no bf16".into()));
        assert!(run.notes[0].contains("PyTorch 2.5.1 (CUDA 12.4)"));
        assert!(run.notes[0].contains("allow_tf32 = False"));
        assert_eq!(run.notes[1], "baseline: a note");
    }

    #[test]
    fn rejects_malformed_torch_replies() {
        // One result short.
        let short: Vec<Value> = CASES[1..].iter().map(|_| json!({"ms": [1.0]})).collect();
        assert!(parse_torch_reply(&reply(Value::from(short))).is_err());
        // Wrong trial counts and non-positive times are per-case errors.
        let mut cases: Vec<Value> = CASES
            .iter()
            .map(|_| json!({"ms": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}))
            .collect();
        cases[1] = json!({"ms": [1.0]});
        cases[2] = json!({"ms": [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]});
        cases[3] = json!({});
        let run = parse_torch_reply(&reply(Value::from(cases))).unwrap();
        assert!(run.cases[0].is_ok());
        assert!(run.cases[1].is_err() && run.cases[2].is_err() && run.cases[3].is_err());
    }

    #[test]
    fn the_case_list_matches_the_script() {
        for case in CASES {
            let op = case.torch_json()["op"].as_str().unwrap().to_string();
            assert!(TORCH_SCRIPT.contains(&format!("op == \"{op}\"")), "{op}");
        }
    }
}

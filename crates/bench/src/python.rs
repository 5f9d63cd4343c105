//! Running a PyTorch baseline script: the script is written to a temporary file, run with
//! `python3` (or the interpreter named by [`PYTHON_VAR`]) with one JSON argument, and its last
//! line of output is read as one JSON object.

use std::process::{Command, Stdio};

use serde_json::Value;

/// The environment variable naming the Python interpreter (default `python3`).
pub(crate) const PYTHON_VAR: &str = "CUFLOW_BENCH_PYTHON";

/// Runs `script` (a file named after `tag` while it runs) with `args`; returns its JSON reply,
/// or why there is none. A reply `{"unavailable": why}` (torch or CUDA missing there) is
/// returned as `Err(why)`.
pub(crate) fn run_script(tag: &str, script: &str, args: &Value) -> Result<Value, String> {
    let python = std::env::var(PYTHON_VAR).unwrap_or_else(|_| "python3".into());
    let path = std::env::temp_dir().join(format!("cuflow-bench-{tag}-{}.py", std::process::id()));
    std::fs::write(&path, script)
        .map_err(|e| format!("could not write {}: {e}", path.display()))?;
    let output = Command::new(&python)
        .arg(&path)
        .arg(args.to_string())
        .stdin(Stdio::null())
        .output();
    // The script is only needed while it runs.
    let _ = std::fs::remove_file(&path);
    let output = output.map_err(|e| format!("could not run {python}: {e}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        eprint!("{stderr}");
        let mut why = format!("{python} {}", output.status);
        if let Some(last) = stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            why.push_str(&format!(": {}", last.trim()));
        }
        return Err(why);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let reply: Value = serde_json::from_str(line)
        .map_err(|e| format!("the PyTorch script printed no JSON result ({e})"))?;
    if let Some(why) = reply["unavailable"].as_str() {
        return Err(why.to_string());
    }
    Ok(reply)
}

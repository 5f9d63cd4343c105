//! `CUFLOW_TRACE=path.json`: a trace starts with the first stream and is written when the
//! process exits. The test runs itself again as a child process with the variable set.

use std::process::Command;

use cuflow_runtime::{DeviceBuffer, DeviceError};
use cuflow_testing::device::device;

const CHILD: &str = "CUFLOW_TRACE_TEST_CHILD";

/// The child's work: a copy in, a memset, a copy out.
fn traced_work() -> Result<(), DeviceError> {
    let stream = device().new_stream()?;
    let buf = DeviceBuffer::from_host(&stream, &[3u32; 1024])?;
    buf.view().fill_bytes(&stream, 0)?;
    assert_eq!(buf.to_host_vec(&stream)?, vec![0u32; 1024]);
    Ok(())
}

#[test]
fn cuflow_trace_writes_the_trace_when_the_process_exits() -> Result<(), DeviceError> {
    if std::env::var_os(CHILD).is_some() {
        return traced_work();
    }
    let path = std::env::temp_dir().join(format!("cuflow-trace-env-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let exe = std::env::current_exe().expect("the test binary's path");
    let status = Command::new(exe)
        .args([
            "--exact",
            "cuflow_trace_writes_the_trace_when_the_process_exits",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("CUFLOW_TRACE", &path)
        .status()
        .expect("the child test runs");
    assert!(status.success(), "the child failed: {status}");
    let text = std::fs::read_to_string(&path).expect("the trace was written at exit");
    let _ = std::fs::remove_file(&path);
    let doc: serde_json::Value = serde_json::from_str(&text).expect("the trace is JSON");
    let events = doc["traceEvents"].as_array().expect("a traceEvents array");
    let named = |cat: &str, name: &str| {
        events
            .iter()
            .filter(|e| e["cat"] == cat && e["name"] == name && e["ph"] == "X")
            .count()
    };
    assert_eq!(named("copy", "copy_from_host"), 1, "{doc}");
    assert_eq!(named("fill", "fill_bytes"), 1, "{doc}");
    assert_eq!(named("copy", "copy_to_host"), 1, "{doc}");
    let fill = events.iter().find(|e| e["name"] == "fill_bytes").unwrap();
    assert_eq!(fill["args"]["bytes"], "4096");
    Ok(())
}

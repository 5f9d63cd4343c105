//! The trace's edges: misuse of start / stop, names that need escaping, a capture on another
//! thread while tracing, and a `CUFLOW_TRACE` file that cannot be written.

use std::process::Command;

use cuflow_runtime::{trace, DeviceBuffer, DeviceError};
use cuflow_testing::device::device;
use cuflow_testing::thread::within_a_minute;

#[test]
fn start_twice_and_stop_without_start_are_usage_errors() -> Result<(), DeviceError> {
    let _lock = trace::tests_serial();
    trace::start()?;
    let e = trace::start().unwrap_err();
    assert!(matches!(e, DeviceError::Usage { .. }), "{e}");
    assert!(e.to_string().contains("call trace::stop first"), "{e}");
    // The first trace goes on.
    assert!(trace::is_enabled());
    trace::stop()?;
    let e = trace::stop().unwrap_err();
    assert!(e.to_string().contains("call trace::start first"), "{e}");
    Ok(())
}

/// Stopping the trace inside a host function is refused at once, on every backend: it waits
/// for the traced work, which the host function is part of. The trace goes on, and stopping it
/// afterwards gives every finished piece of work its times.
#[test]
fn stopping_inside_a_host_function_is_refused_and_the_trace_goes_on() -> Result<(), DeviceError> {
    let _lock = trace::tests_serial();
    let stream = device().new_stream()?;
    let buf = DeviceBuffer::from_host(&stream, &[1u32; 16])?;
    stream.synchronize()?;
    trace::start()?;
    buf.view().fill_bytes(&stream, 0)?;
    let (tx, rx) = std::sync::mpsc::channel();
    stream.enqueue_host_fn(move || {
        let _ = tx.send(trace::stop().map(drop));
    })?;
    let inside = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the host function answered");
    assert!(
        matches!(inside, Err(DeviceError::Reentrant { .. })),
        "{inside:?}"
    );
    assert!(trace::is_enabled(), "the trace goes on");
    stream.synchronize()?;
    let t = trace::stop()?;
    let work: Vec<_> = t
        .entries()
        .iter()
        .filter(|e| e.kind.is_stream_work())
        .collect();
    assert!(!work.is_empty());
    assert!(work.iter().all(|e| e.start_us.is_some()), "{work:?}");
    Ok(())
}

#[test]
fn names_with_quotes_backslashes_and_newlines_stay_json_and_dot() -> Result<(), DeviceError> {
    let _lock = trace::tests_serial();
    let name = "say \"hi\" \\ to\nme";
    let stream = device().new_stream()?;
    let buf = DeviceBuffer::from_host(&stream, &[1u32; 16])?;
    trace::start()?;
    {
        let _span = trace::op_span(name);
        buf.view().fill_bytes(&stream, 0)?;
    }
    stream.synchronize()?;
    let t = trace::stop()?;
    let doc: serde_json::Value =
        serde_json::from_str(&t.to_chrome_json()).expect("the trace is JSON");
    let events = doc["traceEvents"].as_array().expect("a traceEvents array");
    assert!(events.iter().any(|e| e["name"] == name), "{doc}");
    let dot = t.to_dot();
    assert!(
        dot.contains(r#"say \"hi\" \\ to\nme"#),
        "the name is not escaped in:\n{dot}"
    );
    Ok(())
}

#[test]
fn a_capture_on_another_thread_while_tracing_is_not_traced_and_still_replays(
) -> Result<(), DeviceError> {
    let _lock = trace::tests_serial();
    let d = device();
    let (traced, captured) = (d.new_stream()?, d.new_stream()?);
    let a = DeviceBuffer::from_host(&captured, &[7u32; 64])?;
    let b = DeviceBuffer::from_host(&traced, &[7u32; 64])?;
    captured.synchronize()?;
    trace::start()?;
    let graph = std::thread::scope(|s| {
        let capture = s.spawn(|| -> Result<_, DeviceError> {
            captured.begin_capture()?;
            a.view().fill_bytes(&captured, 0)?;
            captured.end_capture()
        });
        b.view().fill_bytes(&traced, 0)?;
        capture.join().expect("the capturing thread panicked")
    })?;
    traced.synchronize()?;
    let t = trace::stop()?;
    let fills = t
        .entries()
        .iter()
        .filter(|e| e.name == "fill_bytes")
        .count();
    assert_eq!(fills, 1, "only the traced stream's fill is recorded:\n{t}");
    let exec = graph.instantiate()?;
    exec.launch(&captured)?;
    assert_eq!(a.to_host_vec(&captured)?, vec![0u32; 64]);
    assert_eq!(b.to_host_vec(&traced)?, vec![0u32; 64]);
    Ok(())
}

const CHILD: &str = "CUFLOW_TRACE_UNWRITABLE_CHILD";

#[test]
fn an_unwritable_cuflow_trace_path_does_not_fail_the_program() -> Result<(), DeviceError> {
    if std::env::var_os(CHILD).is_some() {
        let stream = device().new_stream()?;
        let buf = DeviceBuffer::from_host(&stream, &[1u8; 16])?;
        assert_eq!(buf.to_host_vec(&stream)?, vec![1u8; 16]);
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("cuflow-no-such-dir-{}", std::process::id()));
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args([
            "--exact",
            "an_unwritable_cuflow_trace_path_does_not_fail_the_program",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("CUFLOW_TRACE", dir.join("trace.json"))
        .output()
        .expect("the child test runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the child failed: {}\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.exists());
    Ok(())
}

/// The stream the trace took its timestamps' reference on (the first traced stream of the
/// device) is being captured when the trace stops: stopping neither waits for the capture nor
/// records into it, and the capture's graph replays as recorded.
#[test]
fn stopping_while_a_traced_stream_is_captured_returns_and_leaves_the_capture_alone(
) -> Result<(), DeviceError> {
    let _lock = trace::tests_serial();
    let stream = device().new_stream()?;
    let buf = DeviceBuffer::from_host(&stream, &[7u32; 64])?;
    trace::start()?;
    buf.view().fill_bytes(&stream, 1)?;
    stream.begin_capture()?;
    buf.view().fill_bytes(&stream, 0)?;
    let t = within_a_minute("trace::stop never returned", trace::stop)?;
    assert_eq!(
        t.entries()
            .iter()
            .filter(|e| e.name == "fill_bytes")
            .count(),
        1,
        "only the eager fill is traced:\n{t}"
    );
    let graph = stream.end_capture()?;
    assert_eq!(graph.node_count()?, 1, "{}", graph.to_dot()?);
    assert_eq!(buf.to_host_vec(&stream)?, vec![0x0101_0101u32; 64]);
    graph.instantiate()?.launch(&stream)?;
    assert_eq!(buf.to_host_vec(&stream)?, vec![0u32; 64]);
    Ok(())
}

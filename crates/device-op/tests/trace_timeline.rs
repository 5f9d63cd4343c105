//! The timeline trace of executed ops: stream lanes, op spans, the trace-event JSON and the
//! execution graph, on the device under test.

use cuflow_device_op::{zip, DeviceError, DeviceOpExt};
use cuflow_runtime::trace::{self, EntryKind, Trace, TraceEntry};
use cuflow_runtime::BackendKind;
use cuflow_scheduler::StreamPoolRoundRobin;
use cuflow_testing::{device::device, ops::*};

/// Runs `f` while a trace is recorded, and returns its result and the trace. A trace is
/// process-wide: each test holds `trace::tests_serial()` throughout, so that no other test's
/// work enters its trace.
fn traced<R>(f: impl FnOnce() -> Result<R, DeviceError>) -> Result<(R, Trace), DeviceError> {
    trace::start()?;
    let result = f();
    let trace = trace::stop()?;
    Ok((result?, trace))
}

fn kernels<'a>(t: &'a Trace, name: &str) -> Vec<&'a TraceEntry> {
    t.entries()
        .iter()
        .filter(|e| e.kind == EntryKind::Kernel && e.name == name)
        .collect()
}

fn span<'a>(t: &'a Trace, name: &str) -> &'a TraceEntry {
    t.op_spans()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no op span `{name}` in\n{t}"))
}

fn within(inner: &TraceEntry, outer: &TraceEntry) -> bool {
    let (Some(a), Some(b), Some(c), Some(d)) = (
        inner.start_us,
        inner.end_us(),
        outer.start_us,
        outer.end_us(),
    ) else {
        return false;
    };
    c <= a && b <= d
}

#[test]
fn a_zip_of_four_branches_runs_on_four_stream_lanes_inside_nested_op_spans(
) -> Result<(), DeviceError> {
    let _serial = trace::tests_serial();
    let device = device();
    // A first launch loads the kernel's module, which waits for the spins in flight.
    compile_kernels(&device)?;
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let bufs = buffers(&[0.0; 4]);
    let branch = |i: usize| spin_then_write(&bufs[i], i as f32 + 1.0, SPIN).named(format!("b{i}"));
    let (_, t) = traced(|| {
        zip!(branch(0), branch(1), branch(2), branch(3))
            .named("four")
            .sync_with_policy(&policy)
    })?;
    for (i, b) in bufs.iter().enumerate() {
        assert_all(b, i as f32 + 1.0, "branch output");
    }

    // Four spins, on four distinct stream lanes, each inside its own branch's spans.
    let spins = kernels(&t, "test_spin");
    assert_eq!(spins.len(), 4, "{t}");
    let mut lanes: Vec<_> = spins.iter().map(|s| s.lane.clone()).collect();
    lanes.dedup();
    lanes.sort();
    lanes.dedup();
    assert_eq!(lanes.len(), 4, "spins share lanes:\n{t}");
    for s in &spins {
        let path = t.op_path(s);
        assert_eq!(path.len(), 4, "{path:?}");
        assert_eq!(path[0], "sync_with_policy");
        assert_eq!(path[1], "four");
        assert!(path[2].starts_with("zip branch "), "{path:?}");
        assert!(path[3].starts_with('b'), "{path:?}");
        assert!(
            s.start_us.is_some() && s.dur_us.is_some(),
            "unresolved: {s:?}"
        );
    }

    // Op spans nest in time as they nest by parent.
    let root = span(&t, "sync_with_policy");
    assert_eq!(root.parent, None);
    for s in t.op_spans().filter(|s| s.parent.is_some()) {
        let parent = t.entry(s.parent.unwrap()).unwrap();
        assert_eq!(parent.kind, EntryKind::Op);
        assert!(within(s, parent), "{s:?} is not inside {parent:?}");
        assert_eq!(
            s.lane, parent.lane,
            "a span and its parent on different threads"
        );
    }
    // The executor's wait for the root stream is a host wait inside the execution's span.
    let wait = t
        .entries()
        .iter()
        .find(|e| e.kind == EntryKind::HostWait && e.parent == Some(root.id))
        .unwrap_or_else(|| panic!("no host wait in the sync span:\n{t}"));
    assert!(within(wait, root));

    // On CUDA the four spins ran at once. The host backend runs each stream on its own worker
    // thread but does not promise that the threads run at the same time, so there the lanes
    // are what is guaranteed.
    if device.kind() == BackendKind::Cuda {
        for a in &spins {
            for b in &spins {
                let (a0, a1, b0, b1) = (
                    a.start_us.unwrap(),
                    a.end_us().unwrap(),
                    b.start_us.unwrap(),
                    b.end_us().unwrap(),
                );
                assert!(a0 < b1 && b0 < a1, "spins did not overlap:\n{t}");
            }
        }
    }
    Ok(())
}

#[test]
fn the_trace_is_trace_event_json() -> Result<(), DeviceError> {
    let _serial = trace::tests_serial();
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 2)?;
    let (a, b) = (buffer(0.0), buffer(0.0));
    let (_, t) = traced(|| {
        zip!(fill(&a, 1.0), fill(&b, 2.0))
            .then(|(a, b)| copy(&b, &a))
            .sync_with_policy(&policy)
    })?;
    let doc: serde_json::Value =
        serde_json::from_str(&t.to_chrome_json()).expect("the trace is JSON");
    let events = doc["traceEvents"].as_array().expect("a traceEvents array");
    assert!(!events.is_empty());
    let mut spans = 0;
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        assert!(e["name"].is_string(), "{e}");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
        assert!(e["ts"].as_f64().is_some_and(|ts| ts >= 0.0), "{e}");
        match ph {
            "X" => {
                spans += 1;
                assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
                assert!(e["cat"].is_string(), "{e}");
            }
            "i" | "M" | "s" | "f" => {}
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    // The three kernels, the op spans, and the host wait at least.
    let least = 3 + 3 + 1;
    assert!(spans >= least, "{spans} spans in {doc}");
    let kernel_names: Vec<&str> = events
        .iter()
        .filter(|e| e["cat"] == "kernel")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(
        kernel_names.iter().filter(|n| **n == "test_fill").count(),
        2
    );
    assert!(kernel_names.contains(&"test_copy"));
    let fill = events
        .iter()
        .find(|e| e["name"] == "test_fill")
        .expect("a fill kernel");
    assert!(fill["args"]["grid"].is_string() && fill["args"]["block"].is_string());
    Ok(())
}

#[test]
fn the_dot_of_a_fork_and_join_has_its_kernels_and_the_join_edge() -> Result<(), DeviceError> {
    let _serial = trace::tests_serial();
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 2)?;
    let (a, b, c) = (buffer(0.0), buffer(0.0), buffer(0.0));
    let (_, t) = traced(|| {
        zip!(fill(&a, 1.0), fill(&b, 2.0))
            .then(|(a, b)| add(&c, &a, &b))
            .sync_with_policy(&policy)
    })?;
    assert_all(&c, 3.0, "the sum");
    let fills = kernels(&t, "test_fill");
    let adds = kernels(&t, "test_add");
    assert_eq!((fills.len(), adds.len()), (2, 1), "{t}");
    let add = adds[0];
    let (same, other): (Vec<&TraceEntry>, Vec<&TraceEntry>) =
        fills.iter().copied().partition(|f| f.lane == add.lane);
    assert_eq!(
        (same.len(), other.len()),
        (1, 1),
        "round-robin put a branch elsewhere:\n{t}"
    );

    let dot = t.to_dot();
    assert!(dot.starts_with("digraph"), "{dot}");
    for k in fills.iter().chain([&add]) {
        assert!(
            dot.contains(&format!("n{} [label=\"{}", k.id, k.name)),
            "{dot}"
        );
    }
    // `then` on the parent's stream: the fill there precedes the add.
    assert!(
        dot.contains(&format!("n{} -> n{};", same[0].id, add.id)),
        "{dot}"
    );
    // The join: the other branch's fill reaches the add through an event.
    let join = format!("n{} -> n{} [style=dashed", other[0].id, add.id);
    assert!(dot.contains(&join), "no `{join}` in\n{dot}");
    // Two stream clusters.
    assert_eq!(dot.matches("subgraph cluster_").count(), 2, "{dot}");
    // The text form lists the same work.
    let text = t.to_string();
    assert!(text.contains("[kernel] test_add"), "{text}");
    Ok(())
}

#[test]
fn work_outside_a_trace_is_not_recorded() -> Result<(), DeviceError> {
    let _serial = trace::tests_serial();
    let a = buffer(0.0);
    fill(&a, 1.0).sync()?;
    let (_, t) = traced(|| Ok(()))?;
    assert!(t.entries().is_empty(), "{t}");
    assert!(!trace::is_enabled());
    Ok(())
}

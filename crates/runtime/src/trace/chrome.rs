//! A trace as Chrome / Perfetto trace-event JSON: one process per device (a thread per
//! stream) and one for the host threads; spans are complete events (`"ph": "X"`), event
//! records and waits instant events joined by flow arrows (`"s"` / `"f"`).

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::entry::{EntryKind, Lane, Trace, TraceEntry};

/// The process id of the host threads.
const HOST_PID: u64 = 0;

impl Trace {
    /// The trace as a Chrome / Perfetto trace-event JSON document (open it in
    /// <https://ui.perfetto.dev> or `chrome://tracing`). Timestamps are microseconds since the
    /// trace started; entries whose time could not be resolved are left out.
    ///
    /// ```
    /// use cuflow_runtime::{trace, Device};
    /// # let _lock = trace::tests_serial();
    /// let stream = Device::host().new_stream()?;
    /// trace::start()?;
    /// let event = stream.record_event()?;
    /// event.synchronize()?;
    /// let json = trace::stop()?.to_chrome_json();
    /// let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    /// assert!(doc["traceEvents"].as_array().is_some());
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn to_chrome_json(&self) -> String {
        self.to_chrome_value().to_string()
    }

    /// The trace-event document as a [`serde_json::Value`].
    pub fn to_chrome_value(&self) -> Value {
        let mut pids: HashMap<&str, u64> = HashMap::new();
        let mut events: Vec<Value> = vec![meta("process_name", HOST_PID, None, "host threads")];
        let mut named_lanes: Vec<&Lane> = Vec::new();
        for e in &self.entries {
            let (pid, tid) = match &e.lane {
                Lane::Stream { device, stream } => {
                    let next = pids.len() as u64 + 1;
                    let pid = *pids.entry(device.as_str()).or_insert_with(|| {
                        events.push(meta(
                            "process_name",
                            next,
                            None,
                            &format!("{device} (cuflow device)"),
                        ));
                        next
                    });
                    (pid, stream.as_u64())
                }
                Lane::Thread { id, .. } => (HOST_PID, *id),
            };
            if !named_lanes.contains(&&e.lane) {
                named_lanes.push(&e.lane);
                let name = match &e.lane {
                    Lane::Stream { stream, .. } => format!("stream {stream}"),
                    Lane::Thread { id, name } => format!("thread {id} ({name})"),
                };
                events.push(meta("thread_name", pid, Some(tid), &name));
            }
            let (Some(ts), Some(dur)) = (e.start_us, e.dur_us) else {
                continue;
            };
            let mut args = Map::new();
            for (k, v) in &e.args {
                args.insert((*k).to_string(), Value::String(v.clone()));
            }
            let path = self.op_path(e);
            if !path.is_empty() {
                args.insert("op".into(), Value::String(path.join(" > ")));
            }
            match e.kind {
                EntryKind::EventRecord | EntryKind::EventWait => {
                    events.push(json!({
                        "ph": "i", "s": "t", "name": e.name, "cat": e.kind.as_str(),
                        "ts": ts, "pid": pid, "tid": tid, "args": args,
                    }));
                    if let Some(flow) = flow(e, ts, pid, tid) {
                        events.push(flow);
                    }
                }
                _ => events.push(json!({
                    "ph": "X", "name": e.name, "cat": e.kind.as_str(),
                    "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args,
                })),
            }
        }
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": { "generator": "cuflow", "time_unit": "us" },
        })
    }
}

fn meta(what: &str, pid: u64, tid: Option<u64>, name: &str) -> Value {
    json!({
        "ph": "M", "name": what, "pid": pid, "tid": tid.unwrap_or(0), "ts": 0,
        "args": { "name": name },
    })
}

/// The flow arrow from an event's record to each wait for it.
fn flow(e: &TraceEntry, ts: f64, pid: u64, tid: u64) -> Option<Value> {
    let id = e.event?;
    let ph = if e.kind == EntryKind::EventRecord {
        "s"
    } else {
        "f"
    };
    Some(json!({
        "ph": ph, "bp": "e", "id": id, "name": format!("e{id}"), "cat": "event",
        "ts": ts, "pid": pid, "tid": tid,
    }))
}

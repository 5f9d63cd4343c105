//! A trace's execution as a graph: the work each stream ran, in order, and the events that
//! joined the streams, as DOT ([`Trace::to_dot`]) and as text (`Display`).
//!
//! Nodes are the stream work (kernels, copies, memsets, GEMMs, graph replays, host
//! functions), grouped into one cluster per stream; solid edges are a stream's order (`then`
//! runs on the same stream), dashed edges an event recorded after a node on one stream and
//! waited for before a node on another (forks, joins, `shared` consumers, access ordering).

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use super::entry::{EntryKind, Lane, Trace, TraceEntry};

/// One stream's items, in order.
struct LaneItems<'a> {
    lane: &'a Lane,
    items: Vec<&'a TraceEntry>,
}

impl Trace {
    fn stream_items(&self) -> Vec<LaneItems<'_>> {
        let mut lanes: Vec<LaneItems<'_>> = Vec::new();
        for e in &self.entries {
            if !matches!(e.lane, Lane::Stream { .. }) {
                continue;
            }
            match lanes.iter_mut().find(|l| l.lane == &e.lane) {
                Some(l) => l.items.push(e),
                None => lanes.push(LaneItems {
                    lane: &e.lane,
                    items: vec![e],
                }),
            }
        }
        lanes
    }

    /// The cross-stream edges `(from work id, to work id, event number)`: from the last work
    /// on the recording stream before each record, to the first work after each wait for it.
    fn event_edges(&self) -> Vec<(u64, u64, u64)> {
        let lanes = self.stream_items();
        let mut sources: HashMap<u64, u64> = HashMap::new();
        for lane in &lanes {
            let mut last = None;
            for e in &lane.items {
                if e.kind.is_stream_work() {
                    last = Some(e.id);
                } else if e.kind == EntryKind::EventRecord {
                    if let (Some(ev), Some(w)) = (e.event, last) {
                        sources.insert(ev, w);
                    }
                }
            }
        }
        let mut edges = Vec::new();
        for lane in &lanes {
            let mut waiting: Vec<u64> = Vec::new();
            for e in &lane.items {
                if e.kind == EntryKind::EventWait {
                    if let Some(ev) = e.event {
                        waiting.push(ev);
                    }
                } else if e.kind.is_stream_work() {
                    for ev in waiting.drain(..) {
                        if let Some(&from) = sources.get(&ev) {
                            edges.push((from, e.id, ev));
                        }
                    }
                }
            }
        }
        edges
    }

    /// The execution as a Graphviz DOT graph (see the module docs for what the nodes and
    /// edges are).
    ///
    /// ```
    /// use cuflow_runtime::{trace, Device, DeviceBuffer};
    /// # let _lock = trace::tests_serial();
    /// let device = Device::host();
    /// let (a, b) = (device.new_stream()?, device.new_stream()?);
    /// let buf = DeviceBuffer::from_host(&a, &[0u8; 64])?;
    /// trace::start()?;
    /// buf.view().fill_bytes(&a, 1)?;
    /// buf.view().fill_bytes(&b, 2)?; // ordered after a's write: an event joins the streams
    /// b.synchronize()?;
    /// let dot = trace::stop()?.to_dot();
    /// assert!(dot.starts_with("digraph"));
    /// assert!(dot.contains("style=dashed"));
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn to_dot(&self) -> String {
        let mut out = String::from("digraph cuflow_execution {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n");
        let lanes = self.stream_items();
        let with_work = lanes
            .iter()
            .filter(|l| l.items.iter().any(|e| e.kind.is_stream_work()));
        for (i, lane) in with_work.enumerate() {
            let _ = writeln!(
                out,
                "  subgraph cluster_{i} {{\n    label=\"{}\";",
                escape(&lane.lane.to_string())
            );
            let mut prev: Option<u64> = None;
            for e in lane.items.iter().filter(|e| e.kind.is_stream_work()) {
                let _ = writeln!(
                    out,
                    "    n{} [label=\"{}\"];",
                    e.id,
                    escape(&self.node_label(e))
                );
                if let Some(p) = prev {
                    let _ = writeln!(out, "    n{p} -> n{};", e.id);
                }
                prev = Some(e.id);
            }
            out.push_str("  }\n");
        }
        for (from, to, ev) in self.event_edges() {
            let _ = writeln!(out, "  n{from} -> n{to} [style=dashed, label=\"e{ev}\"];");
        }
        out.push_str("}\n");
        out
    }

    fn node_label(&self, e: &TraceEntry) -> String {
        let mut label = format!("{} [{}]", e.name, e.kind.as_str());
        for (k, v) in &e.args {
            let _ = write!(label, "\n{k}={v}");
        }
        let path = self.op_path(e);
        if !path.is_empty() {
            let _ = write!(label, "\nop: {}", path.join(" > "));
        }
        label
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn time(e: &TraceEntry) -> String {
    match (e.start_us, e.dur_us) {
        (Some(s), Some(d)) if e.kind.is_stream_work() || e.kind == EntryKind::Op => {
            format!(" @{s:.1}us +{d:.1}us")
        }
        (Some(s), _) => format!(" @{s:.1}us"),
        _ => String::new(),
    }
}

/// The trace as text: each stream's work, event records and waits in order, then each host
/// thread's op spans (indented by nesting) and host waits.
impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for lane in self.stream_items() {
            writeln!(f, "{}:", lane.lane)?;
            for e in lane.items {
                let args: Vec<String> = e.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let path = self.op_path(e);
                let op = if path.is_empty() {
                    String::new()
                } else {
                    format!("  (op: {})", path.join(" > "))
                };
                writeln!(
                    f,
                    "  [{}] {} {}{}{}",
                    e.kind.as_str(),
                    e.name,
                    args.join(" "),
                    time(e),
                    op
                )?;
            }
        }
        let mut threads: Vec<&Lane> = Vec::new();
        for e in &self.entries {
            if matches!(e.lane, Lane::Thread { .. }) && !threads.contains(&&e.lane) {
                threads.push(&e.lane);
            }
        }
        for lane in threads {
            writeln!(f, "{lane}:")?;
            for e in self.entries.iter().filter(|e| &e.lane == lane) {
                let depth = self.op_path(e).len();
                writeln!(
                    f,
                    "  {}[{}] {}{}",
                    "  ".repeat(depth),
                    e.kind.as_str(),
                    e.name,
                    time(e)
                )?;
            }
        }
        Ok(())
    }
}

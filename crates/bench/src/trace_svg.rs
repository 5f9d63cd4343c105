//! `cuflow-bench trace-svg IN.json OUT.svg`: draws a Chrome / Perfetto trace-event file (as
//! `cuflow::trace` writes it) as an SVG timeline, one lane per stream and per host thread.
//!
//! Complete events (`"ph": "X"`) are boxes, coloured by category (kernel, copy, GEMM, graph
//! replay, op span, host wait); op spans nest downwards within their thread's lane; event
//! records and waits are ticks, joined by a line from each record to its waits. Lanes are
//! named after the `process_name` / `thread_name` metadata.
//!
//! Events whose time is not a finite number (a start or an end past `f64::MAX`) are left
//! out; a trace whose time range is too wide to measure is refused, and the time axis has at
//! most [`MAX_AXIS_TICKS`] ticks, so any document is drawn in bounded time and memory.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde_json::Value;

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 230.0;
const ROW: f64 = 22.0;
const TOP: f64 = 54.0;
/// The most ticks the time axis is drawn with (about ten are asked for).
const MAX_AXIS_TICKS: usize = 20;

/// A lane: device lanes before host lanes (`true` for the host), then pid, then tid.
type LaneKey = (bool, u64, u64);

struct Span<'a> {
    name: &'a str,
    cat: &'a str,
    ts: f64,
    dur: f64,
    depth: usize,
}

#[derive(Default)]
struct LaneData<'a> {
    name: String,
    spans: Vec<Span<'a>>,
    ticks: Vec<(f64, &'a str)>,
    depth: usize,
}

fn colour(cat: &str) -> &'static str {
    match cat {
        "kernel" => "#4e79a7",
        "copy" => "#f28e2b",
        "fill" => "#edc948",
        "gemm" => "#59a14f",
        "graph" => "#b07aa1",
        "host_fn" => "#9c755f",
        "op" => "#bab0ac",
        "host_wait" => "#e15759",
        _ => "#76b7b2",
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders the trace-event document `doc` as an SVG picture titled `title`.
pub(crate) fn render(doc: &Value, title: &str) -> Result<String, String> {
    let events = doc["traceEvents"]
        .as_array()
        .or_else(|| doc.as_array())
        .ok_or("not a trace-event document: no traceEvents array")?;
    let mut processes: HashMap<u64, String> = HashMap::new();
    // Lanes by (pid, tid): device processes (pid > 0) first, then the host threads.
    let mut lanes: BTreeMap<LaneKey, LaneData<'_>> = BTreeMap::new();
    let key = |e: &Value| -> LaneKey {
        let pid = e["pid"].as_u64().unwrap_or(0);
        (pid == 0, pid, e["tid"].as_u64().unwrap_or(0))
    };
    let mut flows: HashMap<u64, (LaneKey, f64)> = HashMap::new();
    let mut flow_lines: Vec<(LaneKey, f64, LaneKey, f64)> = Vec::new();
    let (mut t0, mut t1) = (f64::MAX, f64::MIN);
    for e in events {
        let ph = e["ph"].as_str().unwrap_or("");
        let name = e["name"].as_str().unwrap_or("");
        let ts = e["ts"].as_f64().unwrap_or(0.0);
        match ph {
            "M" => {
                let label = e["args"]["name"].as_str().unwrap_or("").to_string();
                if name == "process_name" {
                    processes.insert(e["pid"].as_u64().unwrap_or(0), label);
                } else if name == "thread_name" {
                    lanes.entry(key(e)).or_default().name = label;
                }
            }
            "X" => {
                let dur = e["dur"].as_f64().unwrap_or(0.0);
                if !ts.is_finite() || !(ts + dur).is_finite() {
                    continue;
                }
                t0 = t0.min(ts);
                t1 = t1.max(ts + dur);
                lanes.entry(key(e)).or_default().spans.push(Span {
                    name,
                    cat: e["cat"].as_str().unwrap_or(""),
                    ts,
                    dur,
                    depth: 0,
                });
            }
            _ if !ts.is_finite() => {}
            "i" => {
                t0 = t0.min(ts);
                t1 = t1.max(ts);
                lanes.entry(key(e)).or_default().ticks.push((ts, name));
            }
            "s" => {
                if let Some(id) = e["id"].as_u64() {
                    flows.insert(id, (key(e), ts));
                }
            }
            "f" => {
                if let Some((from, at)) = e["id"].as_u64().and_then(|id| flows.get(&id)) {
                    flow_lines.push((*from, *at, key(e), ts));
                }
            }
            _ => {}
        }
    }
    if t0 > t1 {
        return Err("the trace holds no timed events".into());
    }
    let span_us = (t1 - t0).max(1.0);
    if !span_us.is_finite() {
        return Err(format!(
            "the trace's time range, {t0} us to {t1} us, is too wide to draw"
        ));
    }
    let x = |t: f64| LEFT + (t - t0) / span_us * (WIDTH - LEFT - 20.0);

    // Nesting: within a lane, a span inside the one before it goes one row down.
    for lane in lanes.values_mut() {
        lane.spans
            .sort_by(|a, b| a.ts.total_cmp(&b.ts).then(b.dur.total_cmp(&a.dur)));
        let mut open: Vec<f64> = Vec::new();
        for s in &mut lane.spans {
            while open.last().is_some_and(|&end| end <= s.ts) {
                open.pop();
            }
            s.depth = open.len();
            lane.depth = lane.depth.max(open.len() + 1);
            open.push(s.ts + s.dur);
        }
        lane.depth = lane.depth.max(1);
    }
    let mut y = TOP;
    let mut lane_y: HashMap<LaneKey, f64> = HashMap::new();
    let mut body = String::new();
    let mut last_pid = None;
    for (k, lane) in &lanes {
        if last_pid != Some(k.1) {
            let process = processes.get(&k.1).cloned().unwrap_or_default();
            let _ = writeln!(
                body,
                r#"<text x="8" y="{:.1}" font-weight="bold">{}</text>"#,
                y + 14.0,
                escape(&process)
            );
            y += ROW;
            last_pid = Some(k.1);
        }
        let height = lane.depth as f64 * ROW;
        lane_y.insert(*k, y);
        let _ = writeln!(
            body,
            r##"<rect x="0" y="{y:.1}" width="{WIDTH}" height="{height:.1}" fill="#f6f6f6" stroke="#e0e0e0"/><text x="16" y="{:.1}">{}</text>"##,
            y + 15.0,
            escape(&lane.name)
        );
        for s in &lane.spans {
            let (sx, sy) = (x(s.ts), y + s.depth as f64 * ROW + 2.0);
            let w = (x(s.ts + s.dur) - sx).max(1.0);
            let _ = write!(
                body,
                r#"<rect x="{sx:.1}" y="{sy:.1}" width="{w:.1}" height="{:.1}" fill="{}" stroke="white" stroke-width="0.5"><title>{} ({}) {:.1} us at {:.1} us</title></rect>"#,
                ROW - 4.0,
                colour(s.cat),
                escape(s.name),
                s.cat,
                s.dur,
                s.ts - t0
            );
            // A label where it fits (about 6.5 px per character).
            let fits = ((w - 4.0) / 6.5) as usize;
            if fits >= 3 {
                let text: String = s.name.chars().take(fits).collect();
                let _ = write!(
                    body,
                    r#"<text x="{:.1}" y="{:.1}" fill="white" font-size="11">{}</text>"#,
                    sx + 2.0,
                    sy + 13.0,
                    escape(&text)
                );
            }
            body.push('\n');
        }
        for (t, name) in &lane.ticks {
            let _ = writeln!(
                body,
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="#333"><title>{3}</title></line>"##,
                x(*t),
                y,
                y + ROW,
                escape(name)
            );
        }
        y += height;
    }
    // Flows are drawn between points of the time range only (their ends are event records
    // and waits, which are in it): a point far outside it would have no finite coordinate.
    let in_range = |t: f64| (t0..=t1).contains(&t);
    for (from, at, to, ts) in flow_lines {
        if !(in_range(at) && in_range(ts)) {
            continue;
        }
        if let (Some(fy), Some(ty)) = (lane_y.get(&from), lane_y.get(&to)) {
            let _ = writeln!(
                body,
                r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#e15759" stroke-width="0.8" opacity="0.7"/>"##,
                x(at),
                fy + ROW / 2.0,
                x(ts),
                ty + ROW / 2.0
            );
        }
    }
    // Time axis: about ten ticks on a round step.
    let raw = span_us / 10.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(raw);
    if !(step.is_finite() && step > 0.0) {
        return Err(format!(
            "no time axis fits the trace's time range of {span_us} us"
        ));
    }
    let mut axis = String::new();
    let ticks = (0..=MAX_AXIS_TICKS)
        .map(|i| i as f64 * step)
        .take_while(|t| *t <= span_us);
    for t in ticks {
        let tx = x(t0 + t);
        let label = if step >= 1000.0 {
            format!("{:.0} ms", t / 1000.0)
        } else {
            format!("{t:.0} us")
        };
        let _ = writeln!(
            axis,
            r##"<line x1="{tx:.1}" x2="{tx:.1}" y1="{:.1}" y2="{y:.1}" stroke="#ccc"/><text x="{tx:.1}" y="{:.1}" font-size="10">{label}</text>"##,
            TOP - 4.0,
            TOP - 8.0
        );
    }
    let height = y + 10.0;
    Ok(format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="8" y="20" font-size="15" font-weight="bold">{}</text>
{axis}{body}</svg>
"#,
        escape(title)
    ))
}

/// `trace-svg IN.json OUT.svg [--title TEXT]`.
pub(crate) fn main(args: &[String]) -> Result<(), String> {
    let mut paths = Vec::new();
    let mut title = None;
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--title" => title = Some(args.next().ok_or("--title needs a value")?.clone()),
            _ => paths.push(a.clone()),
        }
    }
    let [input, output] = paths.as_slice() else {
        return Err("usage: cuflow-bench trace-svg IN.json OUT.svg [--title TEXT]".into());
    };
    let text = std::fs::read_to_string(input).map_err(|e| format!("{input}: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{input}: {e}"))?;
    let svg = render(&doc, title.as_deref().unwrap_or(input))?;
    std::fs::write(output, svg).map_err(|e| format!("{output}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_box_per_span_and_a_lane_per_stream() {
        let doc = serde_json::json!({"traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "host"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 3, "ts": 0, "args": {"name": "stream 3"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 4, "ts": 0, "args": {"name": "stream 4"}},
            {"ph": "X", "name": "spin", "cat": "kernel", "pid": 1, "tid": 3, "ts": 10.0, "dur": 100.0},
            {"ph": "X", "name": "spin", "cat": "kernel", "pid": 1, "tid": 4, "ts": 20.0, "dur": 100.0},
            {"ph": "X", "name": "sync", "cat": "op", "pid": 0, "tid": 1, "ts": 0.0, "dur": 130.0},
            {"ph": "X", "name": "branch", "cat": "op", "pid": 0, "tid": 1, "ts": 1.0, "dur": 5.0},
        ]});
        let svg = render(&doc, "t").unwrap();
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<title>spin (kernel)").count(), 2);
        assert!(svg.contains(">stream 3<") && svg.contains(">stream 4<"));
        // The nested op span sits one row below its parent.
        assert!(svg.contains("<title>branch (op)"));
        assert!(render(&serde_json::json!({"traceEvents": []}), "t").is_err());
    }

    /// `render(doc)` on a thread of its own, failing the test if it has not returned within
    /// ten seconds (a regression would spin forever).
    fn render_within_seconds(doc: Value) -> Result<String, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(render(&doc, "t"));
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("render returned within ten seconds")
    }

    #[test]
    fn times_past_f64_max_are_left_out_or_refused_and_never_spin() {
        // Its end overflows to infinity: the only event is left out.
        let overflowing = serde_json::json!({"traceEvents": [
            {"ph": "X", "name": "far", "cat": "kernel", "pid": 1, "tid": 1, "ts": 1e308, "dur": 1e308},
        ]});
        let e = render_within_seconds(overflowing).unwrap_err();
        assert!(e.contains("no timed events"), "{e}");
        // Beside a sane span, it is left out and the rest is drawn.
        let beside = serde_json::json!({"traceEvents": [
            {"ph": "X", "name": "far", "cat": "kernel", "pid": 1, "tid": 1, "ts": 1e308, "dur": 1e308},
            {"ph": "X", "name": "near", "cat": "kernel", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0},
            {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 1e308},
            {"ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 12.0},
        ]});
        let svg = render_within_seconds(beside).unwrap();
        assert!(svg.contains("<title>near (kernel)") && !svg.contains("far (kernel)"));
        assert!(!svg.contains("inf") && !svg.contains("NaN"), "{svg}");
        assert!(svg.len() < 10_000, "{} bytes", svg.len());
        // Finite ends whose distance overflows: refused.
        let too_wide = serde_json::json!({"traceEvents": [
            {"ph": "X", "name": "early", "cat": "op", "pid": 0, "tid": 1, "ts": -1.5e308, "dur": 1.0},
            {"ph": "X", "name": "late", "cat": "op", "pid": 0, "tid": 1, "ts": 1.5e308, "dur": 1.0},
        ]});
        let e = render_within_seconds(too_wide).unwrap_err();
        assert!(e.contains("too wide"), "{e}");
        // The widest finite range is drawn, with a bounded axis.
        let widest = serde_json::json!({"traceEvents": [
            {"ph": "i", "name": "first", "pid": 0, "tid": 1, "ts": 0.0},
            {"ph": "X", "name": "last", "cat": "op", "pid": 0, "tid": 1, "ts": 1e308, "dur": 7e307},
        ]});
        let svg = render_within_seconds(widest).unwrap();
        let ticks = svg.matches(r##"stroke="#ccc""##).count();
        assert!(
            (1..=MAX_AXIS_TICKS + 1).contains(&ticks),
            "{ticks} axis ticks"
        );
    }
}

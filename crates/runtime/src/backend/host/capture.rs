//! Host capture: recorded tasks with their dependencies, replayed in recorded order.

use std::sync::Arc;

use parking_lot::Mutex;

use super::stream::HostTask;
use crate::error::{DeviceError, Result};

/// The kind of work a recorded node does. An executable is updated only with a graph whose
/// nodes do the same kinds of work, as CUDA's exec update refuses a change of node type (or of
/// a copy's direction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostNodeKind {
    Kernel,
    Gemm,
    Collective,
    CopyHostToDevice,
    CopyDeviceToDevice,
    CopyDeviceToPinned,
    CopyPinnedToDevice,
    Memset,
    EventWait,
    Graph,
}

pub(crate) struct HostNode {
    pub(crate) task: HostTask,
    pub(crate) kind: HostNodeKind,
    pub(crate) deps: Vec<usize>,
    /// What the node does (`test_fill (kernel) grid 4x1x1 block 256x1x1`), for dumps.
    pub(crate) label: String,
}

/// The graph being recorded, shared by the streams that take part in the capture.
#[derive(Clone)]
pub(crate) struct HostCapture(Arc<Mutex<Recording>>);

#[derive(Default)]
struct Recording {
    nodes: Vec<HostNode>,
    /// Why the capture was invalidated, as CUDA invalidates a capture when one of its streams
    /// is synchronized: ending it then fails.
    invalidated: Option<DeviceError>,
}

impl HostCapture {
    pub(crate) fn new() -> HostCapture {
        HostCapture(Arc::new(Mutex::new(Recording::default())))
    }

    /// Invalidates the capture (the first reason is kept): ending it fails with `reason`.
    pub(crate) fn invalidate(&self, reason: DeviceError) {
        self.0.lock().invalidated.get_or_insert(reason);
    }
}

/// One stream's position in a capture: the nodes its next node will depend on.
pub(crate) struct CaptureCursor {
    capture: HostCapture,
    frontier: Vec<usize>,
}

impl CaptureCursor {
    pub(crate) fn new(capture: HostCapture) -> CaptureCursor {
        CaptureCursor {
            capture,
            frontier: Vec::new(),
        }
    }

    pub(crate) fn record(&mut self, task: HostTask, kind: HostNodeKind, label: String) {
        let nodes = &mut self.capture.0.lock().nodes;
        let idx = nodes.len();
        nodes.push(HostNode {
            task,
            kind,
            deps: std::mem::take(&mut self.frontier),
            label,
        });
        self.frontier.push(idx);
    }

    pub(crate) fn add_dependencies(&mut self, nodes: &[usize]) {
        for &n in nodes {
            if !self.frontier.contains(&n) {
                self.frontier.push(n);
            }
        }
    }

    pub(crate) fn frontier(&self) -> &[usize] {
        &self.frontier
    }

    /// The capture this cursor records into.
    pub(crate) fn capture(&self) -> &HostCapture {
        &self.capture
    }
}

/// A finished host capture.
#[derive(Clone)]
pub(crate) struct HostGraph {
    nodes: Arc<Vec<HostNode>>,
}

impl HostGraph {
    /// Takes the recorded nodes; every node must be joined back into the origin stream (an
    /// ancestor of its frontier), as CUDA requires.
    pub(crate) fn finish(capture: &HostCapture, origin_frontier: &[usize]) -> Result<HostGraph> {
        let Recording { nodes, invalidated } = std::mem::take(&mut *capture.0.lock());
        if let Some(err) = invalidated {
            return Err(err);
        }
        let mut reached = vec![false; nodes.len()];
        let mut stack: Vec<usize> = origin_frontier.to_vec();
        while let Some(n) = stack.pop() {
            if n < reached.len() && !reached[n] {
                reached[n] = true;
                stack.extend_from_slice(&nodes[n].deps);
            }
        }
        if let Some(lost) = reached.iter().position(|r| !r) {
            return Err(DeviceError::Capture {
                op: "Stream::end_capture".into(),
                reason: format!(
                    "captured work (node {lost}) on a joined stream was not joined back into \
                     the capturing stream; make it wait on an event of that stream"
                ),
            });
        }
        Ok(HostGraph {
            nodes: Arc::new(nodes),
        })
    }

    pub(crate) fn nodes(&self) -> Arc<Vec<HostNode>> {
        self.nodes.clone()
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The recorded work in Graphviz DOT: one node per recorded task, labelled with what it
    /// does, and the dependency edges.
    pub(crate) fn to_dot(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::from(
            "digraph cuflow_host_graph {\n  node [shape=box, fontname=\"monospace\"];\n",
        );
        for (i, n) in self.nodes.iter().enumerate() {
            let label = n.label.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(out, "  n{i} [label=\"{i}: {label}\"];");
        }
        for (from, to) in self.edges() {
            let _ = writeln!(out, "  n{from} -> n{to};");
        }
        out.push_str("}\n");
        out
    }

    pub(crate) fn edges(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for &d in &n.deps {
                out.push((d, i));
            }
        }
        out
    }

    pub(crate) fn instantiate(&self) -> HostGraphExec {
        HostGraphExec {
            graph: self.clone(),
        }
    }
}

/// An instantiated host graph.
pub(crate) struct HostGraphExec {
    graph: HostGraph,
}

impl HostGraphExec {
    pub(crate) fn launch(&self, stream: &super::HostStream) -> Result<()> {
        stream.launch_graph(&self.graph)
    }

    pub(crate) fn update(&mut self, graph: &HostGraph) -> bool {
        let same = self.graph.node_count() == graph.node_count()
            && self
                .graph
                .nodes
                .iter()
                .zip(graph.nodes.iter())
                .all(|(a, b)| a.kind == b.kind && a.deps == b.deps);
        if same {
            self.graph = graph.clone();
        }
        same
    }
}

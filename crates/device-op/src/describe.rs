//! An op's structure before it runs, as a graph ([`DagDump`]): what
//! [`DeviceOpExt::describe`](crate::DeviceOpExt::describe) returns.
//!
//! Before an op runs, its combinators are known (`then`, `zip!`, `shared`, named ops) but not
//! what its closures will enqueue nor which streams the policy will pick: a `from_fn` is one
//! node named after its closure (`ops::fill`), a `then` continuation one node that stands for
//! the op it will build. What ran, on which stream, joined by which events, is the trace of
//! an execution (`cuflow_runtime::trace`, `Trace::to_dot`).
//!
//! Ops of other crates describe themselves as one node named after their type unless they
//! implement [`DeviceOp::describe_into`].

use std::collections::HashMap;
use std::fmt::{self, Write as _};

#[cfg(doc)]
use crate::op::DeviceOp;

/// What a node of a [`DagDump`] stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeKind {
    /// Device or host work built by a closure (`from_fn`, `with_context`).
    Work,
    /// A ready value (`value`).
    Value,
    /// A `then` continuation: the op it builds is known only when the first op's output is.
    Continuation,
    /// Where a `zip!` / `join_all` forks its branches (each may get its own stream).
    Fork,
    /// Where the branches join back into the parent's stream.
    Join,
    /// A `shared` op: produced once, waited for by every consumer on another stream.
    Shared,
    /// An op of another crate that does not describe its parts.
    Opaque,
}

impl NodeKind {
    /// A short lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Work => "work",
            NodeKind::Value => "value",
            NodeKind::Continuation => "then",
            NodeKind::Fork => "fork",
            NodeKind::Join => "join",
            NodeKind::Shared => "shared",
            NodeKind::Opaque => "op",
        }
    }
}

/// What an edge of a [`DagDump`] stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EdgeKind {
    /// `then`: the next op runs after, on the same stream.
    Then,
    /// A fork into a branch (a fork event when the branch gets another stream).
    Fork,
    /// A branch joining its parent (a join event when it ran on another stream).
    Join,
    /// A `shared` op's producer to its result, which consumers wait for.
    Shared,
}

impl EdgeKind {
    /// A short lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeKind::Then => "then",
            EdgeKind::Fork => "fork",
            EdgeKind::Join => "join",
            EdgeKind::Shared => "shared",
        }
    }
}

/// A node: its kind, label, and the named op (group) it is in.
#[derive(Debug, Clone)]
pub struct DagNode {
    /// What it stands for.
    pub kind: NodeKind,
    /// Its label (`ops::fill`, `zip (4 branches)`, ...).
    pub label: String,
    /// The innermost group (named op) holding it: an index into [`DagDump::groups`].
    pub group: Option<usize>,
}

/// An edge between two nodes (indices into [`DagDump::nodes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DagEdge {
    /// The node before.
    pub from: usize,
    /// The node after.
    pub to: usize,
    /// What orders them.
    pub kind: EdgeKind,
}

/// A group of nodes: a named op ([`DeviceOpExt::named`](crate::DeviceOpExt::named)).
#[derive(Debug, Clone)]
pub struct DagGroup {
    /// The op's name.
    pub name: String,
    /// The group holding this one.
    pub parent: Option<usize>,
}

/// An op's structure as a graph. `to_dot()` renders it for Graphviz, `Display` as text.
///
/// ```
/// use cuflow_device_op::{value, zip, DeviceOpExt};
/// let op = zip!(value(1), value(2)).map(|(a, b)| a + b).named("sum");
/// let dag = op.describe();
/// assert_eq!(dag.nodes.len(), 5); // fork, two values, join, the map
/// assert!(dag.to_dot().contains("cluster"));
/// assert_eq!(op.sync()?, 3);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct DagDump {
    /// The nodes.
    pub nodes: Vec<DagNode>,
    /// The edges.
    pub edges: Vec<DagEdge>,
    /// The groups (named ops).
    pub groups: Vec<DagGroup>,
}

/// The entry and exit nodes of a described op, for its caller to connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Described {
    /// The node where the op begins.
    pub entry: usize,
    /// The node where it ends.
    pub exit: usize,
}

/// Builds a [`DagDump`]; ops add their nodes through it in
/// [`DeviceOp::describe_into`].
#[derive(Debug, Default)]
pub struct DagBuilder {
    dump: DagDump,
    groups: Vec<usize>,
    shared: HashMap<usize, Described>,
}

impl DagBuilder {
    /// An empty graph.
    pub fn new() -> DagBuilder {
        DagBuilder::default()
    }

    /// Adds a node; it is both the entry and the exit of what it describes.
    pub fn node(&mut self, kind: NodeKind, label: impl Into<String>) -> Described {
        let id = self.dump.nodes.len();
        self.dump.nodes.push(DagNode {
            kind,
            label: label.into(),
            group: self.groups.last().copied(),
        });
        Described {
            entry: id,
            exit: id,
        }
    }

    /// Adds an edge.
    pub fn edge(&mut self, from: usize, to: usize, kind: EdgeKind) {
        self.dump.edges.push(DagEdge { from, to, kind });
    }

    /// Describes `f`'s nodes inside a group named `name`.
    pub fn group<R>(&mut self, name: &str, f: impl FnOnce(&mut DagBuilder) -> R) -> R {
        let id = self.dump.groups.len();
        self.dump.groups.push(DagGroup {
            name: name.to_string(),
            parent: self.groups.last().copied(),
        });
        self.groups.push(id);
        let r = f(self);
        self.groups.pop();
        r
    }

    /// Describes a fork into `branches` joined again: a fork node, each branch, a join node.
    pub fn fork_join(
        &mut self,
        label: String,
        branches: impl IntoIterator<Item = impl FnOnce(&mut DagBuilder) -> Described>,
    ) -> Described {
        let fork = self.node(NodeKind::Fork, label).entry;
        let ends: Vec<Described> = branches.into_iter().map(|b| b(self)).collect();
        let join = self.node(NodeKind::Join, "join").entry;
        for b in ends {
            self.edge(fork, b.entry, EdgeKind::Fork);
            self.edge(b.exit, join, EdgeKind::Join);
        }
        Described {
            entry: fork,
            exit: join,
        }
    }

    /// Describes a shared op once, whatever the number of its clones in the graph: `key`
    /// identifies it, `describe` adds its producer the first time.
    pub fn shared(
        &mut self,
        key: usize,
        describe: impl FnOnce(&mut DagBuilder) -> Option<Described>,
    ) -> Described {
        self.shared_running(key, false, describe)
    }

    /// [`DagBuilder::shared`] for a shared op whose producer, when `describe` gives none, is
    /// `running` on some thread (else it already ran).
    pub(crate) fn shared_running(
        &mut self,
        key: usize,
        running: bool,
        describe: impl FnOnce(&mut DagBuilder) -> Option<Described>,
    ) -> Described {
        if let Some(d) = self.shared.get(&key) {
            return *d;
        }
        let producer = describe(self);
        let label = match producer {
            Some(_) => "shared (runs once)",
            None if running => "shared (running)",
            None => "shared (already ran)",
        };
        let node = self.node(NodeKind::Shared, label);
        if let Some(p) = producer {
            self.edge(p.exit, node.entry, EdgeKind::Shared);
        }
        self.shared.insert(key, node);
        node
    }

    /// The finished graph.
    pub fn finish(self) -> DagDump {
        self.dump
    }
}

/// `T`'s type name, short: generics and closure markers dropped, the last two path segments
/// kept (`cuflow_testing::ops::fill::{{closure}}` → `ops::fill`). A closure built in a method
/// keeps its type and method: `model::Cache<f32>::append::{{closure}}` → `Cache::append`, and
/// in a trait's method, whose name is a qualified path, the type it is implemented for:
/// `<model::Attention as model::Layer>::forward::{{closure}}` → `Attention::forward`.
pub fn short_type_name<T: ?Sized>() -> String {
    let path = without_generics(std::any::type_name::<T>());
    if is_fn_pointer(&path) {
        // No path names it, and its signature's would be cut into pieces.
        return "fn".to_string();
    }
    let segments: Vec<&str> = path
        .split("::")
        .filter(|s| !s.is_empty() && !s.starts_with("{{"))
        .collect();
    let keep = segments.len().saturating_sub(2);
    segments[keep..].join("::")
}

/// Whether `name` is a function pointer type (`fn(u8) -> u8`, `unsafe extern "C" fn()`).
fn is_fn_pointer(name: &str) -> bool {
    let name = name.strip_prefix("unsafe ").unwrap_or(name);
    name.starts_with("fn(") || name.starts_with("extern ")
}

/// `name` without its generic arguments, at every level of its path; a qualified path
/// (`<Self as Trait>::item`) is written with its self type (`Self::item`).
fn without_generics(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while let Some(c) = name[i..].chars().next() {
        if c == '<' {
            let close = closing_bracket(name, i);
            if out.is_empty() {
                // A qualified path: its self type stands for it.
                out.push_str(&without_generics(self_type(&name[i + 1..close])));
            }
            i = (close + 1).min(name.len());
        } else {
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The index of the `>` that closes the `<` at `open` (`name.len()` when none does); the `>`
/// of a function type's `->` closes nothing.
fn closing_bracket(name: &str, open: usize) -> usize {
    let bytes = name.as_bytes();
    let mut depth = 0usize;
    for (i, &b) in bytes.iter().enumerate().skip(open) {
        match b {
            b'<' => depth += 1,
            b'>' if bytes[i - 1] == b'-' => {}
            b'>' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    bytes.len()
}

/// The self type of a qualified path's `Self as Trait` (all of `inner` when it has no `as`).
fn self_type(inner: &str) -> &str {
    let bytes = inner.as_bytes();
    let mut depth = 0usize;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'<' => depth += 1,
            b'>' if i > 0 && bytes[i - 1] == b'-' => {}
            b'>' => depth = depth.saturating_sub(1),
            b' ' if depth == 0 && inner[i..].starts_with(" as ") => return &inner[..i],
            _ => {}
        }
    }
    inner
}

impl DagDump {
    /// The graph in Graphviz DOT: named ops are clusters; forks and joins are small
    /// diamonds, continuations dashed ellipses, `shared` results double octagons.
    pub fn to_dot(&self) -> String {
        let mut out = String::from(
            "digraph cuflow_op {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n",
        );
        self.write_groups(&mut out);
        for e in &self.edges {
            let style = match e.kind {
                EdgeKind::Then => "",
                EdgeKind::Fork | EdgeKind::Join => ", style=dashed",
                EdgeKind::Shared => ", style=bold",
            };
            let _ = writeln!(
                out,
                "  n{} -> n{} [label=\"{}\"{style}];",
                e.from,
                e.to,
                e.kind.as_str()
            );
        }
        out.push_str("}\n");
        out
    }

    /// Writes the nodes and the nested clusters of the named groups. Iterative, with the
    /// children of each group listed once, so that a chain of ten thousands of nested named
    /// ops neither recurses once per level nor rescans every group at each; indentation stops
    /// growing past [`MAX_INDENT`] levels.
    fn write_groups(&self, out: &mut String) {
        // Slot 0 is the top level, slot g + 1 group g. A group is drawn inside its parent only
        // when the parent comes before it (as a builder makes them), so that the clusters form
        // a tree; a node or group naming a group that is not there is drawn at the top level.
        let slot = |group: Option<usize>, before: usize| match group {
            Some(g) if g < before => g + 1,
            _ => 0,
        };
        let mut nodes_of: Vec<Vec<usize>> = vec![Vec::new(); self.groups.len() + 1];
        for (i, n) in self.nodes.iter().enumerate() {
            nodes_of[slot(n.group, self.groups.len())].push(i);
        }
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); self.groups.len() + 1];
        for (g, grp) in self.groups.iter().enumerate() {
            children[slot(grp.parent, g)].push(g);
        }
        let slot = |group: Option<usize>| slot(group, self.groups.len());
        let pad = |depth: usize| "  ".repeat(depth.min(MAX_INDENT));
        enum Step {
            /// Group `.0`'s header at depth `.1`, its nodes and children one deeper.
            Open(Option<usize>, usize),
            /// The closing brace of a cluster at depth `.0`.
            Close(usize),
        }
        let mut steps = vec![Step::Open(None, 0)];
        while let Some(step) = steps.pop() {
            let (group, depth) = match step {
                Step::Close(depth) => {
                    let _ = writeln!(out, "{}}}", pad(depth));
                    continue;
                }
                Step::Open(group, depth) => (group, depth),
            };
            if let Some(g) = group {
                let name = self.groups[g]
                    .name
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"");
                let p = pad(depth);
                let _ = writeln!(out, "{p}subgraph cluster_{g} {{\n{p}  label=\"{name}\";");
            }
            let inner = pad(depth + 1);
            for &i in &nodes_of[slot(group)] {
                let n = &self.nodes[i];
                let shape = match n.kind {
                    NodeKind::Fork | NodeKind::Join => "shape=diamond, ",
                    NodeKind::Continuation => "shape=ellipse, style=dashed, ",
                    NodeKind::Shared => "shape=doubleoctagon, ",
                    NodeKind::Value => "shape=ellipse, ",
                    NodeKind::Work | NodeKind::Opaque => "",
                };
                let label = n.label.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(out, "{inner}n{i} [{shape}label=\"{label}\"];");
            }
            for &c in children[slot(group)].iter().rev() {
                steps.push(Step::Close(depth + 1));
                steps.push(Step::Open(Some(c), depth + 1));
            }
        }
    }
}

/// The deepest indentation of [`DagDump::to_dot`]'s nested clusters.
const MAX_INDENT: usize = 32;

/// One line per node (`n3 [fork] zip (2 branches)  in: sum`), then one per edge.
impl fmt::Display for DagDump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.nodes.iter().enumerate() {
            write!(f, "n{i} [{}] {}", n.kind.as_str(), n.label)?;
            if let Some(group) = n.group.and_then(|g| self.groups.get(g)) {
                write!(f, "  in: {}", group.name)?;
            }
            writeln!(f)?;
        }
        for e in &self.edges {
            writeln!(f, "n{} -> n{} ({})", e.from, e.to, e.kind.as_str())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::without_generics;

    /// Generic arguments go at every level, a function type's `->` inside them included; a
    /// qualified path, nested or not, keeps its self type; a name cut short does not panic.
    #[test]
    fn generics_are_dropped_and_qualified_paths_keep_their_self_type() {
        let cases = [
            ("a::f::{{closure}}", "a::f::{{closure}}"),
            ("a::S<fn(u8) -> u8>::m::{{closure}}", "a::S::m::{{closure}}"),
            (
                "<a::S<u8> as a::T<u8>>::m::{{closure}}",
                "a::S::m::{{closure}}",
            ),
            ("<<a::S as a::T>::U as a::V>::m", "a::S::U::m"),
            ("a::S<u8", "a::S"),
            ("<a::S", "a::S"),
        ];
        for (name, expected) in cases {
            assert_eq!(without_generics(name), expected, "{name}");
        }
    }

    /// Function pointers are `fn`, however they are qualified; paths are not.
    #[test]
    fn function_pointers_are_told_from_paths() {
        assert_eq!(super::short_type_name::<fn(Vec<u8>) -> usize>(), "fn");
        assert_eq!(super::short_type_name::<unsafe extern "C" fn(u8)>(), "fn");
        assert_eq!(super::short_type_name::<extern "C" fn()>(), "fn");
        assert_eq!(super::short_type_name::<Vec<fn(u8)>>(), "vec::Vec");
    }
}

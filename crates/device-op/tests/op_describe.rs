//! `describe`: an op's structure before it runs, as nodes and edges, DOT and text.

use cuflow_device_op::describe::{DagDump, EdgeKind, NodeKind};
use cuflow_device_op::{from_fn, join_all, value, zip, DeviceError, DeviceOpExt, UnzipExt};
use cuflow_testing::ops::*;

fn nodes(dag: &DagDump, kind: NodeKind) -> Vec<usize> {
    (0..dag.nodes.len())
        .filter(|&i| dag.nodes[i].kind == kind)
        .collect()
}

fn has_edge(dag: &DagDump, from: usize, to: usize, kind: EdgeKind) -> bool {
    dag.edges
        .iter()
        .any(|e| e.from == from && e.to == to && e.kind == kind)
}

#[test]
fn a_fork_and_join_then_a_continuation_has_its_nodes_and_edges() -> Result<(), DeviceError> {
    let (a, b, c) = (buffer(0.0), buffer(0.0), buffer(0.0));
    let op = zip!(fill(&a, 1.0), fill(&b, 2.0))
        .then(|(a, b)| add(&c, &a, &b))
        .named("sum");
    let dag = op.describe();

    let work = nodes(&dag, NodeKind::Work);
    assert_eq!(work.len(), 2, "{dag}");
    for &w in &work {
        assert_eq!(dag.nodes[w].label, "ops::fill", "{dag}");
    }
    let (fork, join, then) = (
        nodes(&dag, NodeKind::Fork),
        nodes(&dag, NodeKind::Join),
        nodes(&dag, NodeKind::Continuation),
    );
    assert_eq!((fork.len(), join.len(), then.len()), (1, 1, 1), "{dag}");
    assert_eq!(dag.nodes[fork[0]].label, "zip (2 branches)");
    for &w in &work {
        assert!(has_edge(&dag, fork[0], w, EdgeKind::Fork), "{dag}");
        assert!(has_edge(&dag, w, join[0], EdgeKind::Join), "{dag}");
    }
    assert!(has_edge(&dag, join[0], then[0], EdgeKind::Then), "{dag}");
    assert_eq!(dag.edges.len(), 5, "{dag}");
    // Everything is inside the named op.
    assert_eq!(dag.groups.len(), 1);
    assert_eq!(dag.groups[0].name, "sum");
    assert!(dag.nodes.iter().all(|n| n.group == Some(0)), "{dag}");

    let dot = dag.to_dot();
    assert!(dot.starts_with("digraph"), "{dot}");
    assert!(
        dot.contains("subgraph cluster_0") && dot.contains("label=\"sum\""),
        "{dot}"
    );
    assert!(
        dot.contains(&format!("n{} -> n{} [label=\"then\"]", join[0], then[0])),
        "{dot}"
    );
    assert!(
        dot.contains(&format!("n{} -> n{} [label=\"fork\"", fork[0], work[0])),
        "{dot}"
    );
    let text = dag.to_string();
    assert!(text.contains("[fork] zip (2 branches)  in: sum"), "{text}");

    // Describing does not run the op: it still runs, and once.
    op.sync()?;
    assert_all(&c, 3.0, "the sum");
    Ok(())
}

#[test]
fn a_shared_op_is_one_node_whatever_its_clones() -> Result<(), DeviceError> {
    let a = buffer(0.0);
    let s = fill(&a, 4.0).shared();
    let op = join_all(vec![s.clone(), s.clone(), s.clone()]);
    let dag = op.describe();
    let shared = nodes(&dag, NodeKind::Shared);
    assert_eq!(shared.len(), 1, "{dag}");
    assert_eq!(dag.nodes[shared[0]].label, "shared (runs once)");
    let producer = nodes(&dag, NodeKind::Work);
    assert_eq!(producer.len(), 1, "{dag}");
    assert!(
        has_edge(&dag, producer[0], shared[0], EdgeKind::Shared),
        "{dag}"
    );
    let fork = nodes(&dag, NodeKind::Fork)[0];
    let forks = dag
        .edges
        .iter()
        .filter(|e| e.from == fork && e.to == shared[0])
        .count();
    assert_eq!(forks, 3, "{dag}");
    assert_eq!(dag.nodes[fork].label, "join_all (3 branches)");

    op.sync()?;
    assert!(s.is_finished());
    let after = s.describe();
    assert_eq!(after.nodes.len(), 1);
    assert_eq!(after.nodes[0].label, "shared (already ran)");
    Ok(())
}

#[test]
fn boxed_prioritized_and_mapped_ops_describe_their_parts() {
    let op = value(1)
        .map(|v| v + 1)
        .inspect(|_| {})
        .with_priority(cuflow_scheduler::PriorityLevel::High)
        .boxed();
    let dag = op.describe();
    let labels: Vec<&str> = dag.nodes.iter().map(|n| n.label.as_str()).collect();
    assert_eq!(labels.len(), 3, "{dag}");
    assert_eq!(labels[0], "value");
    assert!(labels[1].starts_with("map "), "{labels:?}");
    assert!(labels[2].starts_with("inspect "), "{labels:?}");
    assert_eq!(dag.edges.len(), 2);
}

/// A dump is plain data that a program may edit (drop the groups, regroup nodes) before
/// rendering it: a node or group naming a group that is not there, or a group named as its own
/// parent, is drawn at the top level instead of making `to_dot` or `Display` panic.
#[test]
fn a_dump_edited_by_the_program_still_renders() {
    let op = zip!(value(1), value(2)).named("outer").named("outermost");
    let mut dag = op.describe();
    let in_groups = dag.nodes.iter().filter(|n| n.group.is_some()).count();
    assert!(in_groups > 0 && dag.groups.len() == 2, "{dag}");

    let mut no_groups = dag.clone();
    no_groups.groups.clear();
    let dot = no_groups.to_dot();
    assert_eq!(dot.matches("label=\"value\"").count(), 2, "{dot}");
    assert!(!dot.contains("cluster"), "{dot}");
    assert_eq!(
        no_groups.to_string().lines().count(),
        dag.to_string().lines().count()
    );

    // Group 1 made its own parent, and group 0 given a parent that is not there.
    dag.groups[1].parent = Some(1);
    dag.groups[0].parent = Some(7);
    let dot = dag.to_dot();
    assert_eq!(dot.matches("label=\"value\"").count(), 2, "{dot}");
    assert_eq!(dot.matches("subgraph cluster_").count(), 2, "{dot}");
    assert_eq!(dot.matches('{').count(), dot.matches('}').count(), "{dot}");
}

/// Builds its ops in a trait's method, as a program's model layers do.
trait Layer {
    fn forward(&self) -> DagDump;
}

struct Attention;

impl Layer for Attention {
    fn forward(&self) -> DagDump {
        from_fn(|_| Ok(1)).map(|x| x + 1).describe()
    }
}

/// Builds its ops in a method of a generic type.
struct Cache<T>(T);

impl<T> Cache<T> {
    fn append(&self) -> DagDump {
        from_fn(|_| Ok(1)).describe()
    }
}

/// A closure is named after the type and method that built it, also where that method is a
/// trait's (its type name is a qualified path, `<Attention as Layer>::forward::{{closure}}`)
/// or a generic type's (`Cache<T>::append::{{closure}}`).
#[test]
fn closures_built_in_methods_are_named_after_their_type_and_method() {
    let dag = Attention.forward();
    let labels: Vec<&str> = dag.nodes.iter().map(|n| n.label.as_str()).collect();
    assert_eq!(
        labels,
        ["Attention::forward", "map Attention::forward"],
        "{dag}"
    );

    let dag = Cache(0u8).append();
    assert_eq!(dag.nodes[0].label, "Cache::append", "{dag}");
}

/// The parts of an unzipped op describe the op they split, once (it runs once, as a shared
/// op), and which element each takes.
#[test]
fn unzipped_parts_describe_the_op_they_split_once() -> Result<(), DeviceError> {
    let a = buffer(0.0);
    let (left, right) = zip!(fill(&a, 5.0), value(2)).unzip();
    let op = zip!(right, left);
    let dag = op.describe();
    let shared = nodes(&dag, NodeKind::Shared);
    assert_eq!(shared.len(), 1, "{dag}");
    assert_eq!(nodes(&dag, NodeKind::Work).len(), 1, "{dag}");
    assert!(
        dag.nodes
            .iter()
            .all(|n| n.kind != NodeKind::Opaque && !n.label.is_empty()),
        "{dag}"
    );
    let parts: Vec<&str> = dag
        .edges
        .iter()
        .filter(|e| e.from == shared[0] && e.kind == EdgeKind::Then)
        .map(|e| dag.nodes[e.to].label.as_str())
        .collect();
    assert_eq!(parts, ["unzip element 1", "unzip element 0"], "{dag}");

    let (n, _) = op.sync()?;
    assert_eq!(n, 2);
    Ok(())
}

/// A shared op described while another thread produces it is running, not done: it says so
/// (it said "already ran"), and says it ran once it has.
#[test]
fn a_shared_op_described_while_it_is_produced_says_it_is_running() -> Result<(), DeviceError> {
    use std::sync::mpsc::channel;
    use std::time::Duration;
    let (started, has_started) = channel::<()>();
    let (finish, may_finish) = channel::<()>();
    let shared = from_fn(move |_| {
        let _ = started.send(());
        may_finish
            .recv_timeout(Duration::from_secs(60))
            .map_err(|e| DeviceError::usage(format!("never told to finish: {e}")))
    })
    .shared();
    let producer = {
        let shared = shared.clone();
        std::thread::spawn(move || shared.sync().map(drop))
    };
    has_started
        .recv_timeout(Duration::from_secs(60))
        .expect("the production started");
    let during = shared.describe();
    let _ = finish.send(());
    producer.join().expect("the producing thread")?;
    let after = shared.describe();
    assert_eq!(during.nodes.len(), 1, "{during}");
    assert_eq!(during.nodes[0].label, "shared (running)", "{during}");
    assert_eq!(after.nodes[0].label, "shared (already ran)", "{after}");
    Ok(())
}

/// A function pointer has no path to name it by: it is `fn`, whatever the types in its
/// signature (their paths were cut into pieces: `map vec::Vec) -> usize`).
#[test]
fn a_function_pointer_is_named_fn() {
    fn total(v: Vec<u8>) -> usize {
        v.len()
    }
    let by_pointer = value(vec![1u8]).map(total as fn(Vec<u8>) -> usize);
    let dag = by_pointer.describe();
    assert_eq!(dag.nodes[1].label, "map fn", "{dag}");
    let by_item = value(vec![1u8]).map(total);
    let dag = by_item.describe();
    assert_eq!(
        dag.nodes[1].label, "map a_function_pointer_is_named_fn::total",
        "{dag}"
    );
}

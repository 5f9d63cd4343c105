//! A captured graph's dump lists its kernels and their dependencies.

use cuflow_device_op::{zip, DeviceOpExt};
use cuflow_graph_capture::GraphCaptureExt;
use cuflow_runtime::{BackendKind, DeviceError};
use cuflow_scheduler::StreamPoolRoundRobin;
use cuflow_testing::{device::device, ops::*};

#[test]
fn a_captured_fork_and_join_dumps_its_kernels() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 2)?;
    let (a, b, c) = (buffer(0.0), buffer(0.0), buffer(0.0));
    let op = zip!(fill(&a, 1.0), fill(&b, 2.0)).then(|(a, b)| add(&c, &a, &b));
    let mut graph = op.graph_with_policy(&policy)?;
    let dot = graph.to_dot()?;
    assert!(dot.contains("digraph"), "{dot}");
    assert!(dot.contains("test_fill"), "no fill kernel in\n{dot}");
    assert!(dot.contains("test_add"), "no add kernel in\n{dot}");
    if device.kind() == BackendKind::Host {
        // One node per recorded task: the two fills, the add; the add depends on both fills.
        assert_eq!(dot.matches("test_fill (kernel)").count(), 2, "{dot}");
        assert_eq!(dot.matches("test_add (kernel)").count(), 1, "{dot}");
        let node = |name: &str| -> Vec<String> {
            dot.lines()
                .filter(|l| l.contains(name))
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect()
        };
        let edges: Vec<(String, String)> = dot
            .lines()
            .filter_map(|l| {
                let (from, to) = l.trim().trim_end_matches(';').split_once(" -> ")?;
                Some((from.to_string(), to.to_string()))
            })
            .collect();
        let reaches = |from: &str, to: &str| {
            let mut stack = vec![from.to_string()];
            let mut seen = Vec::new();
            while let Some(n) = stack.pop() {
                if n == to {
                    return true;
                }
                if !seen.contains(&n) {
                    stack.extend(
                        edges
                            .iter()
                            .filter(|(f, _)| *f == n)
                            .map(|(_, t)| t.clone()),
                    );
                    seen.push(n);
                }
            }
            false
        };
        let add = &node("test_add (kernel)")[0];
        for fill in node("test_fill (kernel)") {
            assert!(reaches(&fill, add), "{fill} does not reach {add}:\n{dot}");
        }
    }
    // The dump does not disturb the graph: it replays and computes the sum.
    fill(&c, -7.0).sync()?;
    graph.replay_and_wait()?;
    assert_all(&c, 3.0, "the sum");
    Ok(())
}

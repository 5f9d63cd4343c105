//! Policies never hand out a stream that is being captured into a graph: work placed there
//! would be recorded into someone else's graph instead of running.

use cuflow_runtime::DeviceError;
use cuflow_scheduler::{LeastLoaded, Placement, Priority, SchedulingPolicy, StreamPoolRoundRobin};
use cuflow_testing::device::device;

fn never_places_the_capturing_stream(
    policy: &dyn SchedulingPolicy,
    capturing: &cuflow_runtime::Stream,
) -> Result<(), DeviceError> {
    capturing.begin_capture()?;
    let device = policy.device().clone();
    let placed: Vec<_> = (0..16)
        .map(|_| policy.place(&Placement::root(&device)))
        .collect::<Result<_, _>>()?;
    let graph = capturing.end_capture();
    assert!(
        placed.iter().all(|s| s != capturing),
        "a policy placed work on a capturing stream"
    );
    graph.map(|_| ())
}

#[test]
fn round_robin_skips_a_capturing_stream() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 3)?;
    never_places_the_capturing_stream(&policy, &policy.streams()[1].clone())
}

#[test]
fn least_loaded_skips_a_capturing_stream() -> Result<(), DeviceError> {
    let policy = LeastLoaded::new(&device(), 3)?;
    never_places_the_capturing_stream(&policy, &policy.streams()[0].clone())
}

#[test]
fn priority_skips_a_capturing_stream() -> Result<(), DeviceError> {
    let policy = Priority::new(&device(), 2, 2)?;
    never_places_the_capturing_stream(&policy, &policy.normal_streams()[0].clone())
}

//! `SingleStream`, `LeastLoaded`, `Priority`, and the executor's side of the policy contract
//! (which placements it asks for, which branches it reports with `on_enqueued`).
//!
//! Streams that must stay busy wait on a [`Gate`], so load is observed with `loads()` rather
//! than inferred from timing.

use std::sync::Arc;

use cuflow_device_op::{enqueue_on, value, zip, DeviceError, DeviceOp, DeviceOpExt};
use cuflow_runtime::{Device, Event, Stream, StreamId};
use cuflow_scheduler::{
    LeastLoaded, Placement, Priority, PriorityLevel, SchedulingPolicy, SingleStream,
    StreamPoolRoundRobin,
};
use cuflow_testing::policies::{PanicAt, Panicking};
use cuflow_testing::thread::within_a_minute;
use cuflow_testing::{device::device, ops::*};
use parking_lot::Mutex;

/// `op()` run through each entry point that takes a policy: `sync_with_policy`, `schedule`
/// (then awaited) and `enqueue_on` with `root` as its root stream (so that the policy places
/// only its branches), each entry point's name beside its outcome.
fn through_every_entry_point<O, P>(
    op: impl Fn() -> O,
    policy: &P,
    root: &Stream,
) -> [(&'static str, Result<(), DeviceError>); 3]
where
    O: DeviceOp,
    P: SchedulingPolicy + Clone + 'static,
{
    [
        ("sync_with_policy", op().sync_with_policy(policy).map(drop)),
        (
            "schedule",
            op().schedule(policy)
                .and_then(futures::executor::block_on)
                .map(drop),
        ),
        (
            "enqueue_on",
            enqueue_on(op(), root, Arc::new(policy.clone())).map(drop),
        ),
    ]
}

#[test]
fn single_stream_puts_every_branch_on_its_stream() -> Result<(), DeviceError> {
    let device = device();
    let policy = SingleStream::new(&device)?;
    let only = policy.stream().id();
    let (a, b, c, sum) = (buffer(0.0), buffer(0.0), buffer(0.0), buffer(0.0));
    let ((out, on), stats) = zip!(
        with_stream(spin_then_write(&a, 1.0, SPIN)),
        with_stream(fill(&b, 2.0)),
        with_stream(spin_then_write(&c, 4.0, SPIN))
    )
    .then({
        let sum = sum.clone();
        move |((a, sa), (b, sb), (c, sc))| {
            sum_into(&sum, vec![a, b, c]).map(move |out| (out, [sa, sb, sc]))
        }
    })
    .sync_with_policy(&policy)?;
    assert_all(&out, 7.0, "branches on one stream run in order");
    assert_eq!(on, [only; 3]);
    assert_eq!(stats.streams, vec![only], "{stats:?}");
    assert_events(&stats, 0, 0);

    // `on` wraps an existing stream, for roots and branches alike.
    let stream = device.new_stream()?;
    let on_existing = SingleStream::on(&stream);
    assert_eq!(on_existing.place(&Placement::root(&device))?, stream);
    assert_eq!(
        on_existing.place(&Placement::branch(&device, &stream, 1, 2))?,
        stream
    );
    assert_eq!(on_existing.device(), &device);
    Ok(())
}

#[test]
fn least_loaded_places_work_away_from_busy_streams() -> Result<(), DeviceError> {
    let device = device();
    let policy = LeastLoaded::new(&device, 3)?;
    let pool: Vec<StreamId> = policy.streams().iter().map(|s| s.id()).collect();
    assert_eq!(distinct(&pool), 3);
    assert_eq!(policy.loads(), vec![0, 0, 0]);
    // Ties go to the lowest index; a placement alone adds no load.
    assert_eq!(policy.place(&Placement::root(&device))?.id(), pool[0]);
    assert_eq!(policy.place(&Placement::root(&device))?.id(), pool[0]);

    let mut gate = Gate::closed(&device)?;
    let root = device.new_stream()?;
    let shared_policy: Arc<dyn SchedulingPolicy> = Arc::new(policy.clone());
    // A branch that cannot finish before the gate opens. It runs off `root`, so the executor
    // reports it to the policy when it joins it into `root`.
    let gated = |buf: &Buf| {
        let buf = buf.clone();
        let op = zip!(
            with_stream(wait_event(gate.event()).then(move |()| fill(&buf, 1.0))),
            value(())
        );
        enqueue_on(op, &root, shared_policy.clone()).map(|(((_, on), ()), _)| on)
    };
    let bufs = buffers(&[0.0; 4]);
    let mut placed = Vec::new();
    let mut loads = Vec::new();
    for buf in &bufs[..2] {
        placed.push(gated(buf)?);
        loads.push(policy.loads());
    }
    assert_eq!(placed, vec![pool[0], pool[1]]);
    assert_eq!(loads, vec![vec![1, 0, 0], vec![1, 1, 0]]);

    // A whole execution placed now goes to the idle stream and completes while the others are
    // held.
    let free = buffer(0.0);
    let ((out, on), _) = with_stream(fill(&free, 5.0)).sync_with_policy(&policy)?;
    assert_eq!(on, pool[2]);
    assert_all(&out, 5.0, "work placed on the idle stream");
    assert_eq!(
        policy.loads(),
        vec![1, 1, 0],
        "a root is not a branch: no load"
    );

    // Fewest unfinished branches first, ties to the lowest index.
    for buf in &bufs[2..] {
        placed.push(gated(buf)?);
        loads.push(policy.loads());
    }
    assert_eq!(placed[2..], [pool[2], pool[0]]);
    assert_eq!(loads[2..], [vec![1, 1, 1], vec![2, 1, 1]]);
    assert_eq!(policy.place(&Placement::root(&device))?.id(), pool[1]);

    gate.open();
    root.synchronize()?;
    assert_eq!(
        policy.loads(),
        vec![0, 0, 0],
        "finished branches leave the load"
    );
    for buf in &bufs {
        assert_all(buf, 1.0, "a gated branch after the gate opened");
    }
    Ok(())
}

#[test]
fn priority_puts_high_requests_on_its_high_priority_streams() -> Result<(), DeviceError> {
    let device = device();
    let policy = Priority::new(&device, 2, 3)?;
    let high: Vec<StreamId> = policy.high_streams().iter().map(|s| s.id()).collect();
    let normal: Vec<StreamId> = policy.normal_streams().iter().map(|s| s.id()).collect();
    assert_eq!((distinct(&high), distinct(&normal)), (2, 3));
    assert!(high.iter().all(|h| !normal.contains(h)));
    let (least, greatest) = device.stream_priority_range()?;
    assert!(policy
        .high_streams()
        .iter()
        .all(|s| s.priority() == greatest));
    assert!(policy
        .normal_streams()
        .iter()
        .all(|s| s.priority() == least));

    let urgent = Placement::root(&device).with_priority(PriorityLevel::High);
    let placed: Vec<StreamId> = (0..4)
        .map(|_| policy.place(&urgent).map(|s| s.id()))
        .collect::<Result<_, _>>()?;
    assert_eq!(placed, vec![high[0], high[1], high[0], high[1]]);
    assert!(normal.contains(&policy.place(&Placement::root(&device))?.id()));

    // Through an op: branches forked under a High request land on high-priority streams.
    let (a, b, c, d) = (buffer(0.0), buffer(0.0), buffer(0.0), buffer(0.0));
    let (((ra, sa), (rb, sb)), _) = zip!(
        with_stream(spin_then_write(&a, 1.0, SPIN)),
        with_stream(fill(&b, 2.0))
    )
    .with_priority(PriorityLevel::High)
    .sync_with_policy(&policy)?;
    assert!(
        high.contains(&sa) && high.contains(&sb),
        "{sa:?} {sb:?} not in {high:?}"
    );
    assert_ne!(sa, sb);
    assert_all(&ra, 1.0, "urgent branch a");
    assert_all(&rb, 2.0, "urgent branch b");
    let (((_, sc), (_, sd)), _) =
        zip!(with_stream(fill(&c, 3.0)), with_stream(fill(&d, 4.0))).sync_with_policy(&policy)?;
    assert!(
        normal.contains(&sc) && normal.contains(&sd),
        "{sc:?} {sd:?} not in {normal:?}"
    );
    Ok(())
}

#[test]
fn pools_of_zero_streams_are_refused() {
    let device = device();
    assert!(matches!(
        LeastLoaded::new(&device, 0),
        Err(DeviceError::Usage { .. })
    ));
    assert!(matches!(
        Priority::new(&device, 0, 1),
        Err(DeviceError::Usage { .. })
    ));
    assert!(matches!(
        Priority::new(&device, 1, 0),
        Err(DeviceError::Usage { .. })
    ));
}

/// One placement request as the policy saw it: the branch (index, count), whether it had a
/// parent stream, and the stream placed on.
type Request = (Option<(usize, usize)>, bool, StreamId);

/// A round-robin policy that records what the executor asks of it.
#[derive(Debug)]
struct Recording {
    inner: StreamPoolRoundRobin,
    placements: Mutex<Vec<Request>>,
    enqueued: Mutex<Vec<StreamId>>,
}

impl SchedulingPolicy for Recording {
    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        let stream = self.inner.place(request)?;
        self.placements
            .lock()
            .push((request.branch, request.parent.is_some(), stream.id()));
        Ok(stream)
    }

    fn on_enqueued(&self, stream: &Stream, done: &Event) {
        assert_eq!(done.stream_id(), stream.id());
        self.enqueued.lock().push(stream.id());
    }
}

#[test]
fn the_executor_asks_one_placement_per_root_and_branch_and_reports_joined_branches(
) -> Result<(), DeviceError> {
    let device = device();
    let policy = Arc::new(Recording {
        inner: StreamPoolRoundRobin::new(&device, 8)?,
        placements: Mutex::new(Vec::new()),
        enqueued: Mutex::new(Vec::new()),
    });
    let (a, b) = (buffer(0.0), buffer(0.0));
    // `Arc<P>` is a policy too.
    let (((_, sa), (_, sb), n), _) = zip!(
        with_stream(spin_then_write(&a, 1.0, SPIN)),
        with_stream(fill(&b, 2.0)),
        value(3)
    )
    .sync_with_policy(&policy)?;
    assert_eq!(n, 3);
    let placements = policy.placements.lock().clone();
    let kinds: Vec<_> = placements
        .iter()
        .map(|(branch, has_parent, _)| (*branch, *has_parent))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (None, false),
            (Some((0, 3)), true),
            (Some((1, 3)), true),
            (Some((2, 3)), true)
        ]
    );
    assert_eq!((placements[1].2, placements[2].2), (sa, sb));
    // Only the branches with device work are reported, on the streams they ran on.
    assert_eq!(*policy.enqueued.lock(), vec![sa, sb]);
    assert_all(&a, 1.0, "branch a");
    assert_all(&b, 2.0, "branch b");
    Ok(())
}

#[test]
fn a_panicking_policy_is_an_error_from_every_entry_point() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    for at in [PanicAt::Root, PanicAt::Branch, PanicAt::OnEnqueued] {
        let policy = Panicking::new(&device, 2, at)?;
        let op = || zip!(fill(&buffer(0.0), 1.0), fill(&buffer(0.0), 2.0));
        for (entry, outcome) in through_every_entry_point(op, &policy, &stream) {
            if at == PanicAt::Root && entry == "enqueue_on" {
                // enqueue_on is given its root stream: the policy places branches only.
                assert!(outcome.is_ok(), "{at:?} / {entry}: {outcome:?}");
                continue;
            }
            assert!(
                matches!(outcome, Err(DeviceError::Panicked { .. })),
                "a policy panicking at {at:?}, run through {entry}: {outcome:?}"
            );
        }
    }
    // The thread is still usable.
    assert_eq!(value(2).map(|v| v * 3).sync()?, 6);
    Ok(())
}

/// A policy that places the root of an op, or its branches, on `capturing` (a stream being
/// captured into a graph), and the rest on `eager`.
#[derive(Clone, Debug)]
struct OntoCapture {
    eager: Stream,
    capturing: Stream,
    at: &'static str,
}

impl SchedulingPolicy for OntoCapture {
    fn device(&self) -> &Device {
        self.eager.device()
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        Ok(match (self.at, request.branch) {
            ("root", None) | ("branch", Some(_)) => self.capturing.clone(),
            _ => self.eager.clone(),
        })
    }
}

#[test]
fn a_policy_placing_work_on_a_capturing_stream_is_refused_from_every_entry_point() {
    let outcome = within_a_minute(
        "an op placed on a capturing stream never completed",
        || -> Result<(), DeviceError> {
            let device = device();
            for at in ["root", "branch"] {
                // This thread captures `capturing`: work enqueued there would be recorded, never
                // run, and its events would never complete.
                let capturing = device.new_stream()?;
                let eager = device.new_stream()?;
                capturing.begin_capture()?;
                let policy = OntoCapture {
                    eager: eager.clone(),
                    capturing: capturing.clone(),
                    at,
                };
                let (a, b) = (buffer(0.0), buffer(0.0));
                let op = || zip!(fill(&a, 1.0), fill(&b, 2.0));
                for (entry, outcome) in through_every_entry_point(op, &policy, &eager) {
                    if at == "root" && entry == "enqueue_on" {
                        // enqueue_on is given its root stream: the policy places branches only.
                        assert!(outcome.is_ok(), "{at:?} / {entry}: {outcome:?}");
                        continue;
                    }
                    match outcome {
                        Err(DeviceError::Capture { op, reason }) => assert!(
                            reason.contains("scheduling policy") && reason.contains("captured"),
                            "{at} / {entry}: the error names the policy and the capture: {op}: \
                         {reason}"
                        ),
                        other => panic!("{at} / {entry}: expected a capture error, got {other:?}"),
                    }
                }
                // Nothing of the ops entered the capture, and the eager stream was not pulled in.
                assert!(
                    !eager.is_capturing(),
                    "{at}: the eager stream joined the capture"
                );
                let graph = capturing.end_capture()?;
                assert_eq!(graph.node_count()?, 0, "{at}: the ops' work was recorded");
                assert_all(&a, if at == "root" { 1.0 } else { 0.0 }, at);
            }
            Ok(())
        },
    );
    outcome.expect("the test's own setup");
}

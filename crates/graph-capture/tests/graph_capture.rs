//! Record and replay on whatever `Device::auto()` gives (host in CI, CUDA under
//! `CUFLOW_DEVICE=cuda`).

use std::sync::Arc;

use cuflow_device_op::{from_fn, value, zip, DeviceOp, DeviceOpExt};
use cuflow_graph_capture::{CudaGraph, GraphCaptureExt, RecaptureOutcome};
use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Stream};
use cuflow_scheduler::{Placement, SchedulingPolicy, StreamPoolRoundRobin};
use cuflow_testing::{
    device::{device, stream},
    kernels::launch_affine,
    measure::assert_close_elementwise,
    ops::{affine, compile_kernels, copy, Buf},
    policies::{PanicAt, Panicking},
    rng::{random_f32, rng},
};

/// An op that reads `x` back to the host while it runs.
fn reads_back(x: Buf) -> impl DeviceOp<Output = Vec<f32>> {
    from_fn(move |ctx| x.to_host_vec(ctx.stream()?))
}

#[test]
fn replay_n_times_has_n_times_the_effect() -> Result<(), DeviceError> {
    let stream = stream();
    let n = 4097;
    let init = random_f32(&mut rng(), n);
    let x = Arc::new(DeviceBuffer::from_host(&stream, &init)?);
    let mut graph = affine(&x, 1.0, 0.5).graph_on(stream.clone())?;
    // Capturing runs nothing.
    let after_capture = x.to_host_vec(&stream)?;
    assert_eq!(after_capture, init, "capture must record, not run");
    let replays = 7;
    for _ in 0..replays {
        graph.launch()?;
    }
    graph.synchronize()?;
    let want: Vec<f64> = init
        .iter()
        .map(|v| *v as f64 + 0.5 * replays as f64)
        .collect();
    assert_close_elementwise("replays", &x.to_host_vec(&stream)?, &want, 1.0, 1e-5);
    assert_eq!(graph.launch_count(), replays);
    assert!(graph.graph().node_count()? >= 1);
    Ok(())
}

#[test]
fn update_feeds_new_inputs_between_replays() -> Result<(), DeviceError> {
    let stream = stream();
    let n = 1000;
    let mut rng = rng();
    let input = Arc::new(DeviceBuffer::from_host(&stream, &random_f32(&mut rng, n))?);
    let output = Arc::new(DeviceBuffer::<f32>::zeroed(&stream, n)?);
    // step: output = input * 2 + 1
    let step = copy(&output, &input).then({
        let out = output.clone();
        move |_| affine(&out, 2.0, 1.0)
    });
    let mut graph = step.graph_on(stream.clone())?;
    let out = graph.take_output().expect("output is taken once");
    assert!(graph.take_output().is_none());
    for _ in 0..3 {
        let token = random_f32(&mut rng, n);
        let staged = Arc::new(DeviceBuffer::from_host(&stream, &token)?);
        graph.update(copy(&input, &staged))?;
        graph.replay_and_wait()?;
        let want: Vec<f64> = token.iter().map(|v| *v as f64 * 2.0 + 1.0).collect();
        assert_close_elementwise(
            "updated input",
            &out.to_host_vec(&stream)?,
            &want,
            1.0,
            1e-5,
        );
    }
    Ok(())
}

#[test]
fn zip_branches_on_two_streams_are_parallel_graph_branches() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let stream = device.new_stream()?;
    let a = Arc::new(DeviceBuffer::from_host(&stream, &[1.0f32; 64])?);
    let b = Arc::new(DeviceBuffer::from_host(&stream, &[2.0f32; 64])?);
    stream.synchronize()?;
    let op = zip!(affine(&a, 3.0, 0.0), affine(&b, 5.0, 0.0));
    let mut graph = op.graph_with_policy(&policy)?;
    let stats = graph.capture_stats().clone();
    // The root stream plus one stream per branch (a pool of 4 hands out distinct streams).
    assert_eq!(
        stats.streams.len(),
        3,
        "root and two branch streams: {stats:?}"
    );
    let g = graph.graph();
    assert!(
        g.max_parallelism()? >= 2,
        "the two kernels must not depend on each other: nodes {}, edges {:?}",
        g.node_count()?,
        g.edges()?
    );
    graph.replay_and_wait()?;
    let s = graph.stream().clone();
    assert_eq!(a.to_host_vec(&s)?, vec![3.0; 64]);
    assert_eq!(b.to_host_vec(&s)?, vec![10.0; 64]);
    Ok(())
}

/// The buffer an op allocates while captured is the graph's output: every replay rewrites it,
/// and it stays valid after the graph is dropped.
#[test]
fn allocation_during_capture_is_the_graphs_output() -> Result<(), DeviceError> {
    let stream = stream();
    let mut graph = from_fn(|ctx| DeviceBuffer::zeroed(ctx.stream()?, 16))
        .then(|buf: DeviceBuffer<f32>| affine(&Arc::new(buf), 2.0, 3.0))
        .graph_on(stream.clone())?;
    let out = graph.take_output().expect("the captured op's output");
    for _ in 0..3 {
        out.copy_from_host(&stream, &[5.0; 16])?;
        graph.replay_and_wait()?;
        // Zeroed, then 0 * 2 + 3, whatever the buffer held before the replay.
        assert_eq!(out.to_host_vec(&stream)?, vec![3.0; 16]);
    }
    drop(graph);
    assert_eq!(out.to_host_vec(&stream)?, vec![3.0; 16]);
    Ok(())
}

#[test]
fn host_sync_during_capture_is_refused_and_stream_stays_usable() -> Result<(), DeviceError> {
    let stream = stream();
    let x = Arc::new(DeviceBuffer::from_host(&stream, &[1.0f32; 5])?);
    let err = reads_back(x.clone()).graph_on(stream.clone()).unwrap_err();
    assert!(matches!(err, DeviceError::Capture { .. }), "{err}");
    assert!(!stream.is_capturing());
    assert_eq!(reads_back(x).sync_on(&stream)?, vec![1.0; 5]);
    Ok(())
}

#[test]
fn recapture_same_topology_updates_in_place() -> Result<(), DeviceError> {
    let stream = stream();
    let x = Arc::new(DeviceBuffer::from_host(&stream, &[1.0f32; 256])?);
    let mut graph: CudaGraph<_> = affine(&x, 1.0, 1.0).graph_on(stream.clone())?;
    graph.replay_and_wait()?;
    assert_eq!(x.to_host_vec(&stream)?, vec![2.0; 256]);
    let outcome = graph.recapture(affine(&x, 10.0, 0.0))?;
    assert_eq!(outcome, RecaptureOutcome::Updated);
    graph.replay_and_wait()?;
    assert_eq!(x.to_host_vec(&stream)?, vec![20.0; 256]);
    Ok(())
}

#[test]
fn cuda_graph_is_send_and_replays_on_another_thread() -> Result<(), DeviceError> {
    fn assert_send<T: Send>(_: &T) {}
    let device = device();
    let stream: Stream = device.new_stream()?;
    let x = Arc::new(DeviceBuffer::from_host(&stream, &[0.0f32; 32])?);
    let mut graph = affine(&x, 1.0, 2.0).graph_on(stream.clone())?;
    assert_send(&graph);
    std::thread::spawn(move || graph.replay_and_wait())
        .join()
        .expect("replay thread")?;
    assert_eq!(x.to_host_vec(&stream)?, vec![2.0; 32]);
    Ok(())
}

#[test]
fn a_chain_deeper_than_the_stack_captures_and_replays() -> Result<(), DeviceError> {
    // A boxed `then` chain built in a loop nests one level per link, far more levels than a
    // thread's stack holds frames; capturing it (on a small stack, too) must still work.
    const DEPTH: usize = 200_000;
    const AFFINE_EVERY: usize = 50_000;
    let run = || -> Result<(), DeviceError> {
        let stream = stream();
        let n = 257;
        let init = random_f32(&mut rng(), n);
        let x = Arc::new(DeviceBuffer::from_host(&stream, &init)?);
        let mut op = affine(&x, 1.0, 0.5).boxed();
        for i in 1..=DEPTH {
            op = if i % AFFINE_EVERY == 0 {
                op.then(|b| affine(&b, 1.0, 0.5)).boxed()
            } else {
                op.then(value).boxed()
            };
        }
        let mut graph = op.graph_on(stream.clone())?;
        let replays = 2;
        for _ in 0..replays {
            graph.launch()?;
        }
        graph.synchronize()?;
        let affines = 1 + DEPTH / AFFINE_EVERY;
        let want: Vec<f64> = init
            .iter()
            .map(|v| *v as f64 + 0.5 * (affines * replays) as f64)
            .collect();
        assert_close_elementwise(
            "deep chain replays",
            &x.to_host_vec(&stream)?,
            &want,
            1.0,
            1e-5,
        );
        Ok(())
    };
    run()?;
    cuflow_testing::thread::on_small_stack(run)
}

/// `on_stream` inside a capture records the work on a stream private to the capture, not on
/// the stream it names: that stream stays usable by everyone while the capture runs (another
/// thread's op on it was refused, the stream having joined the capture), and every replay
/// does the work.
#[test]
fn on_stream_during_a_capture_leaves_the_named_stream_to_everyone() -> Result<(), DeviceError> {
    let device = device();
    compile_kernels(&device)?;
    let public = device.new_stream()?;
    let x = Arc::new(DeviceBuffer::from_host(&public, &[1.0f32; 256])?);
    let unrelated = Arc::new(DeviceBuffer::from_host(&public, &[5.0f32; 256])?);
    public.synchronize()?;

    let op = from_fn({
        let (public, x, unrelated) = (public.clone(), x.clone(), unrelated.clone());
        move |ctx| {
            ctx.on_stream(&public, |s| {
                launch_affine(s, &*x, 2.0, 1.0)?;
                // Another thread's op on the named stream, while the capture is open.
                let named = public.clone();
                let unrelated_run = std::thread::spawn(move || {
                    affine(&unrelated, 3.0, 0.0).sync_on(&named).map(drop)
                })
                .join();
                Ok((s.is_capturing(), public.is_capturing(), unrelated_run))
            })
        }
    });
    let mut graph = op.graph_on(device.new_stream()?)?;
    let (recorded, named_captured, unrelated_run) = graph.take_output().expect("the output");
    match unrelated_run {
        Ok(result) => result?,
        Err(_) => panic!("the other thread panicked"),
    }
    assert!(recorded, "the work was not recorded");
    assert!(!named_captured, "the named stream joined the capture");
    assert_eq!(unrelated.to_host_vec(&public)?, vec![15.0; 256]);
    assert_eq!(x.to_host_vec(&public)?, vec![1.0; 256], "the capture ran");
    graph.replay_and_wait()?;
    graph.replay_and_wait()?;
    assert_eq!(x.to_host_vec(&public)?, vec![7.0; 256], "(1·2+1)·2+1");
    Ok(())
}

/// Branches of branches in a capture: a `zip!` inside a `zip!` branch places its own branches
/// before that branch has done any work (its stream joins the capture only then), and the
/// policy may put one of them on the capture's root stream. Every shape must capture and
/// replay, under pools of one to four streams.
#[test]
fn nested_zips_capture_and_replay_under_every_pool_size() -> Result<(), DeviceError> {
    let device = device();
    compile_kernels(&device)?;
    let stream = device.new_stream()?;
    for streams in 1..=4 {
        let bufs: Vec<Buf> = (0..4)
            .map(|i| DeviceBuffer::from_host(&stream, &[i as f32; 64]).map(Arc::new))
            .collect::<Result<_, _>>()?;
        stream.synchronize()?;
        let op = zip!(
            zip!(affine(&bufs[0], 2.0, 1.0), affine(&bufs[1], 2.0, 1.0)),
            zip!(
                affine(&bufs[2], 2.0, 1.0),
                zip!(affine(&bufs[3], 2.0, 1.0), value(()))
            )
        );
        let mut graph = op
            .graph_with_policy(&StreamPoolRoundRobin::new(&device, streams)?)
            .unwrap_or_else(|e| panic!("a pool of {streams} streams: {e}"));
        graph.replay_and_wait()?;
        graph.replay_and_wait()?;
        for (i, buf) in bufs.iter().enumerate() {
            let want = (i as f32 * 2.0 + 1.0) * 2.0 + 1.0;
            assert_eq!(
                buf.to_host_vec(&stream)?,
                vec![want; 64],
                "pool {streams}, buffer {i}"
            );
        }
    }
    Ok(())
}

/// `on_stream` as the first work of a `zip!` branch in a capture: the branch's stream has not
/// joined the capture yet, and the named stream must not join it either (its work is recorded
/// on a private stream, as from the capture's root).
#[test]
fn on_stream_first_in_a_captured_branch_leaves_the_named_stream_to_everyone(
) -> Result<(), DeviceError> {
    let device = device();
    compile_kernels(&device)?;
    let public = device.new_stream()?;
    let x = Arc::new(DeviceBuffer::from_host(&public, &[1.0f32; 256])?);
    public.synchronize()?;
    let branch = from_fn({
        let (public, x) = (public.clone(), x.clone());
        move |ctx| {
            ctx.on_stream(&public, |s| {
                launch_affine(s, &*x, 2.0, 1.0)?;
                Ok((s.is_capturing(), public.is_capturing()))
            })
        }
    });
    let op = zip!(branch, value(()));
    let mut graph = op.graph_with_policy(&StreamPoolRoundRobin::new(&device, 2)?)?;
    let ((recorded, named_captured), ()) = graph.take_output().expect("the output");
    assert!(recorded, "the work was not recorded");
    assert!(!named_captured, "the named stream joined the capture");
    assert_eq!(x.to_host_vec(&public)?, vec![1.0; 256], "the capture ran");
    graph.replay_and_wait()?;
    assert_eq!(x.to_host_vec(&public)?, vec![3.0; 256]);
    Ok(())
}

/// A policy that keeps the first level of branches on their parent's stream and puts the
/// deeper ones on a second stream.
#[derive(Clone, Debug)]
struct ParentThenOther {
    device: Device,
    root: Stream,
    other: Stream,
}

impl SchedulingPolicy for ParentThenOther {
    fn device(&self) -> &Device {
        &self.device
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        Ok(match request.parent {
            None => self.root.clone(),
            Some(parent) if request.depth <= 1 => parent.clone(),
            Some(_) => self.other.clone(),
        })
    }
}

/// A branch forked from a branch that has done no work yet, onto a stream of its own: in a
/// capture it must still join the capture (be recorded, not run), though eagerly it would
/// have nothing to wait for. Capturing runs nothing; every replay does all the work.
#[test]
fn a_branch_of_an_idle_branch_is_recorded_not_run() -> Result<(), DeviceError> {
    let device = device();
    compile_kernels(&device)?;
    let stream = device.new_stream()?;
    let (a, b) = (
        Arc::new(DeviceBuffer::from_host(&stream, &[1.0f32; 64])?),
        Arc::new(DeviceBuffer::from_host(&stream, &[1.0f32; 64])?),
    );
    stream.synchronize()?;
    let policy = ParentThenOther {
        device: device.clone(),
        root: device.new_stream()?,
        other: device.new_stream()?,
    };
    let op = zip!(zip!(affine(&a, 2.0, 0.0), affine(&b, 3.0, 0.0)), value(()));
    let mut graph = op.graph_with_policy(&policy)?;
    assert_eq!(
        a.to_host_vec(&stream)?,
        vec![1.0; 64],
        "capturing ran the work"
    );
    assert_eq!(
        b.to_host_vec(&stream)?,
        vec![1.0; 64],
        "capturing ran the work"
    );
    graph.replay_and_wait()?;
    graph.replay_and_wait()?;
    assert_eq!(a.to_host_vec(&stream)?, vec![4.0; 64]);
    assert_eq!(b.to_host_vec(&stream)?, vec![9.0; 64]);
    Ok(())
}

/// An op that fails while captured gives its own error, the one it gives eagerly, not one
/// that hides it in a message: a refused launch stays `InvalidLaunch`, and the stream the
/// capture ran on stays usable.
#[test]
fn an_op_failing_while_captured_gives_its_own_error() -> Result<(), DeviceError> {
    let stream = stream();
    let buf = cuflow_testing::ops::buffer(1.0);
    let eager = cuflow_testing::ops::bad_launch(&buf)
        .sync_on(&stream)
        .expect_err("a launch of zero blocks is refused");
    let captured = match cuflow_testing::ops::bad_launch(&buf).graph_on(stream.clone()) {
        Ok(_) => panic!("a launch of zero blocks was captured"),
        Err(e) => e,
    };
    assert!(
        matches!(captured, DeviceError::InvalidLaunch { .. }),
        "captured: {captured:?}"
    );
    assert_eq!(captured.to_string(), eager.to_string());
    let mut graph = affine(&buf, 2.0, 0.0).graph_on(stream.clone())?;
    graph.replay_and_wait()?;
    assert_eq!(buf.to_host_vec(&stream)?, vec![2.0; buf.len()]);
    Ok(())
}

/// A capture under a policy that panics (naming its device, placing the root or a branch) is
/// an error naming the panic, never a panic out of `graph_with_policy`. A policy that panics
/// hearing of work is not asked: the capture's streams are private, not the policy's.
#[test]
fn a_capture_under_a_panicking_policy_is_an_error() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let a = Arc::new(DeviceBuffer::from_host(&stream, &[1.0f32; 64])?);
    let b = Arc::new(DeviceBuffer::from_host(&stream, &[2.0f32; 64])?);
    stream.synchronize()?;
    for at in PanicAt::ALL {
        let policy = Panicking::new(&device, 4, at)?;
        let op = zip!(affine(&a, 3.0, 0.0), affine(&b, 5.0, 0.0));
        let captured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            op.graph_with_policy(&policy).map(|_| ())
        }));
        match captured {
            Err(_) => panic!("{at:?}: the policy's panic crossed graph_with_policy"),
            Ok(Ok(())) => assert_eq!(
                at,
                PanicAt::OnEnqueued,
                "a capture under a panicking policy"
            ),
            Ok(Err(e)) => assert!(e.to_string().contains("the policy panics"), "{at:?}: {e}"),
        }
    }
    Ok(())
}

/// A policy that keeps the parent a placement names: during a capture that is one of the
/// capture's private streams.
#[derive(Clone, Debug)]
struct KeepsParent {
    device: Device,
    kept: Arc<parking_lot::Mutex<Option<Stream>>>,
}

impl SchedulingPolicy for KeepsParent {
    fn device(&self) -> &Device {
        &self.device
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        let mut kept = self.kept.lock();
        if let Some(parent) = request.parent {
            kept.get_or_insert_with(|| parent.clone());
        }
        match &*kept {
            Some(s) => Ok(s.clone()),
            None => self.device.new_stream(),
        }
    }
}

/// A policy that places roots on `root` and branches on `branches`.
#[derive(Clone, Debug)]
struct Places {
    root: Stream,
    branches: Stream,
}

impl SchedulingPolicy for Places {
    fn device(&self) -> &Device {
        self.root.device()
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        Ok(match request.branch {
            Some(_) => self.branches.clone(),
            None => self.root.clone(),
        })
    }
}

/// Whether `r` is the error of eager work placed on a stream made for captures.
fn names_the_capture_stream<T>(r: &Result<T, DeviceError>) -> bool {
    matches!(r, Err(DeviceError::Capture { reason, .. }) if reason.contains("a stream of graph captures"))
}

/// Eager work placed on a stream of graph captures gets the same error whether or not a
/// capture holds the stream at that moment (in general another thread's, which the caller
/// cannot see): the error names what the policy or caller did wrong, not the capture that
/// happens to be running there.
#[test]
fn a_capture_stream_is_refused_the_same_way_while_a_capture_holds_it() -> Result<(), DeviceError> {
    let device = device();
    let held = device.new_stream_for_captures(0)?;
    held.begin_capture()?;
    assert!(held.is_capturing() && held.is_for_captures());
    let on_root = Places {
        root: held.clone(),
        branches: held.clone(),
    };
    let r = zip!(value(1), value(2)).sync_with_policy(&on_root);
    assert!(names_the_capture_stream(&r), "root: {r:?}");
    let on_branches = Places {
        root: device.new_stream()?,
        branches: held.clone(),
    };
    let r = zip!(value(1), value(2)).sync_with_policy(&on_branches);
    assert!(names_the_capture_stream(&r), "branch: {r:?}");
    let r = zip!(value(1), value(2)).sync_on(&held);
    assert!(names_the_capture_stream(&r), "sync_on: {r:?}");
    let named = |s: &Stream| {
        let s = s.clone();
        from_fn(move |ctx| ctx.on_stream(&s, |_| Ok(())))
    };
    let r = named(&held).sync();
    assert!(names_the_capture_stream(&r), "on_stream: {r:?}");
    held.end_capture()?;
    // And while no capture holds it.
    let r = named(&held).sync();
    assert!(names_the_capture_stream(&r), "on_stream: {r:?}");
    // A stream made with `Device::new_stream` and captured by hand is refused as capturing.
    let own = device.new_stream()?;
    own.begin_capture()?;
    let r = zip!(value(1), value(2)).sync_on(&own);
    assert!(
        matches!(&r, Err(DeviceError::Capture { reason, .. }) if reason.contains("is being captured")),
        "{r:?}"
    );
    own.end_capture()?;
    Ok(())
}

/// A policy that keeps a stream a capture handed it and places eager work on it afterwards
/// gets a clear error at once, rather than work that another capture taking the stream would
/// refuse part-way.
#[test]
fn eager_work_on_a_stream_a_capture_handed_to_the_policy_is_refused() -> Result<(), DeviceError> {
    let device = device();
    let policy = KeepsParent {
        device: device.clone(),
        kept: Arc::new(parking_lot::Mutex::new(None)),
    };
    let graph = zip!(value(1), value(2))
        .map(|(a, b)| a + b)
        .graph_with_policy(&policy)?;
    drop(graph);
    let kept = policy
        .kept
        .lock()
        .clone()
        .expect("the capture placed a branch");
    assert!(kept.is_for_captures());
    let r = zip!(value(1), value(2)).sync_with_policy(&policy);
    assert!(
        matches!(&r, Err(DeviceError::Capture { reason, .. }) if reason.contains("streams a capture hands it")),
        "{r:?}"
    );
    // The same stream given to `sync_on` directly.
    let r = zip!(value(1), value(2)).sync_on(&kept);
    assert!(
        matches!(&r, Err(DeviceError::Capture { reason, .. }) if reason.contains("a stream of graph captures")),
        "{r:?}"
    );
    Ok(())
}

//! Capture and replay: work recorded from one or more streams into a graph, replayed, and
//! updated in place; operations that cannot be recorded are refused and leave the streams
//! usable.

use cuflow_runtime::{DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};
use cuflow_testing::{
    device::{device, device_pair, stream},
    kernels::{add, launch_add_one, prefix_mut},
    rng::{random_f32, rng},
};

/// `v` plus 1.0 added `times` times in f32, as the kernel does it.
fn plus_ones(v: &[f32], times: usize) -> Vec<f32> {
    v.iter()
        .map(|x| (0..times).fold(*x, |acc, _| acc + 1.0))
        .collect()
}

#[track_caller]
fn assert_capture_error<T: std::fmt::Debug>(r: Result<T, DeviceError>, what: &str) {
    assert!(
        matches!(r, Err(DeviceError::Capture { .. })),
        "{what}: expected a capture error, got {r:?}"
    );
}

/// Checks that `s` runs ordinary work again.
fn assert_usable(s: &Stream) -> Result<(), DeviceError> {
    assert!(!s.is_capturing());
    let y = DeviceBuffer::from_host(s, &[1.0f32, 2.0, 3.0])?;
    launch_add_one(s, &y)?;
    s.synchronize()?;
    assert_eq!(y.to_host_vec(s)?, vec![2.0, 3.0, 4.0]);
    Ok(())
}

/// A capture that recorded nothing is an empty graph on every backend: its node count and
/// edges are queried (the CUDA driver refused the node query of an empty graph), and it
/// instantiates and replays as a no-op.
#[test]
fn an_empty_capture_is_an_empty_graph_that_replays() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::from_host(&s, &[1.0f32, 2.0])?;
    s.begin_capture()?;
    let graph = s.end_capture()?;
    assert_eq!(graph.node_count()?, 0);
    assert_eq!(graph.edges()?, Vec::<(usize, usize)>::new());
    let exec = graph.instantiate()?;
    exec.launch(&s)?;
    launch_add_one(&s, &x)?;
    assert_eq!(x.to_host_vec(&s)?, vec![2.0, 3.0]);
    Ok(())
}

#[test]
fn replaying_a_capture_n_times_has_n_times_its_effect() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let n = 1001;
    let x0 = random_f32(&mut rng(), n);
    let x = DeviceBuffer::from_host(&s, &x0)?;
    s.synchronize()?;

    s.begin_capture()?;
    assert!(s.is_capturing());
    launch_add_one(&s, &x)?;
    let graph = s.end_capture()?;
    assert!(!s.is_capturing());
    assert_eq!(graph.device(), &device);
    assert_eq!(graph.node_count()?, 1);
    assert_eq!(x.to_host_vec(&s)?, x0, "capturing must not run the work");

    let exec = graph.instantiate()?;
    assert_eq!(exec.device(), &device);
    for _ in 0..5 {
        exec.launch(&s)?;
    }
    assert_eq!(x.to_host_vec(&s)?, plus_ones(&x0, 5));

    // Replays on another stream are ordered before a later read on the first.
    let other = device.new_stream()?;
    exec.launch(&other)?;
    exec.launch(&other)?;
    assert_eq!(x.to_host_vec(&s)?, plus_ones(&x0, 7));
    Ok(())
}

#[test]
fn a_multi_stream_capture_records_two_parallel_branches() -> Result<(), DeviceError> {
    let device = device();
    let origin = device.new_stream()?;
    let side = device.new_stream()?;
    let n = 513;
    let mut rng = rng();
    let (a0, b0) = (random_f32(&mut rng, n), random_f32(&mut rng, n));
    let a = DeviceBuffer::from_host(&origin, &a0)?;
    let b = DeviceBuffer::from_host(&origin, &b0)?;
    let c = DeviceBuffer::<f32>::zeroed(&origin, n)?;
    origin.synchronize()?;

    origin.begin_capture()?;
    side.wait_event(&origin.record_event()?)?;
    assert!(
        side.is_capturing(),
        "waiting on a capture's event joins the capture"
    );
    launch_add_one(&origin, &a)?;
    launch_add_one(&side, &b)?;
    origin.wait_event(&side.record_event()?)?;
    add().launch(
        &origin,
        LaunchConfig::linear(2, 128),
        KernelArgs::new()
            .output(&c)
            .input(&a)
            .input(&b)
            .scalar(n as u32),
    )?;
    let graph = origin.end_capture()?;
    assert!(
        !side.is_capturing(),
        "ending the capture releases the joined stream"
    );

    // Two roots (one per branch), both feeding the join.
    let edges = graph.edges()?;
    assert_eq!(graph.node_count()?, 3, "edges {edges:?}");
    assert_eq!(graph.root_count()?, 2, "edges {edges:?}");
    assert!(graph.max_parallelism()? >= 2, "edges {edges:?}");
    assert_eq!(edges.len(), 2, "edges {edges:?}");
    let join = edges[0].1;
    assert!(edges.iter().all(|(_, to)| *to == join), "edges {edges:?}");
    assert_ne!(edges[0].0, edges[1].0, "edges {edges:?}");

    let exec = graph.instantiate()?;
    exec.launch(&origin)?;
    exec.launch(&origin)?;
    let (a2, b2) = (plus_ones(&a0, 2), plus_ones(&b0, 2));
    let c2: Vec<f32> = a2.iter().zip(&b2).map(|(x, y)| x + y).collect();
    assert_eq!(a.to_host_vec(&origin)?, a2);
    assert_eq!(b.to_host_vec(&origin)?, b2);
    assert_eq!(c.to_host_vec(&origin)?, c2);
    Ok(())
}

#[test]
fn captured_copies_and_fills_replay_in_order() -> Result<(), DeviceError> {
    let s = stream();
    let n = 777;
    let s0 = random_f32(&mut rng(), n);
    let src = DeviceBuffer::from_host(&s, &s0)?;
    let dst = DeviceBuffer::<f32>::zeroed(&s, n)?;
    let scratch = DeviceBuffer::from_host(&s, &s0)?;
    s.synchronize()?;

    s.begin_capture()?;
    dst.copy_from(&s, &src)?;
    launch_add_one(&s, &src)?;
    scratch.view().fill_bytes(&s, 0)?;
    launch_add_one(&s, &scratch)?;
    let graph = s.end_capture()?;
    assert_eq!(graph.node_count()?, 4);
    assert_eq!(graph.max_parallelism()?, 1, "one stream records a chain");

    let exec = graph.instantiate()?;
    for _ in 0..3 {
        exec.launch(&s)?;
    }
    assert_eq!(src.to_host_vec(&s)?, plus_ones(&s0, 3));
    assert_eq!(
        dst.to_host_vec(&s)?,
        plus_ones(&s0, 2),
        "the copy runs before the add"
    );
    assert_eq!(
        scratch.to_host_vec(&s)?,
        vec![1.0; n],
        "the fill runs on every replay"
    );
    Ok(())
}

#[test]
fn a_joined_stream_that_is_not_joined_back_fails_the_capture() -> Result<(), DeviceError> {
    let device = device();
    let origin = device.new_stream()?;
    let side = device.new_stream()?;
    let x0 = random_f32(&mut rng(), 16);
    let x = DeviceBuffer::from_host(&origin, &x0)?;
    origin.synchronize()?;

    origin.begin_capture()?;
    side.wait_event(&origin.record_event()?)?;
    launch_add_one(&side, &x)?;
    assert_capture_error(origin.end_capture(), "an unjoined branch");
    assert!(!origin.is_capturing() && !side.is_capturing());
    assert_usable(&origin)?;
    assert_usable(&side)?;
    assert_eq!(
        x.to_host_vec(&origin)?,
        x0,
        "the failed capture ran its work"
    );
    Ok(())
}

#[test]
fn host_waits_during_a_capture_are_refused() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::<f32>::zeroed(&s, 8)?;
    s.synchronize()?;

    type Op<'a> = (
        &'a str,
        Box<dyn Fn(&Stream) -> Result<(), DeviceError> + 'a>,
    );
    let ops: Vec<Op<'_>> = vec![
        ("Stream::synchronize", Box::new(|s| s.synchronize())),
        (
            "copy_from_host",
            Box::new(|s| x.copy_from_host(s, &[1.0; 8])),
        ),
        ("to_host_vec", Box::new(|s| x.to_host_vec(s).map(drop))),
        ("enqueue_host_fn", Box::new(|s| s.enqueue_host_fn(|| {}))),
    ];
    for (what, op) in &ops {
        s.begin_capture()?;
        launch_add_one(&s, &x)?;
        assert_capture_error(op(&s), what);
        assert_capture_error(s.end_capture(), &format!("end_capture after {what}"));
        assert_usable(&s)?;
    }
    assert_eq!(
        x.to_host_vec(&s)?,
        vec![0.0; 8],
        "a refused capture ran its work"
    );
    Ok(())
}

/// A buffer allocated during a capture and dropped before it ends belongs to the graph: each
/// replay zeroes it, adds one and copies it out, and memory allocated and written between
/// replays (which would reuse a freed allocation) is never overwritten by them.
#[test]
fn an_allocation_during_a_capture_stays_valid_for_every_replay() -> Result<(), DeviceError> {
    let s = stream();
    let n = 1000;
    let x = DeviceBuffer::<f32>::zeroed(&s, n)?;
    s.synchronize()?;

    s.begin_capture()?;
    let scratch = DeviceBuffer::<f32>::zeroed(&s, n)?;
    launch_add_one(&s, &scratch)?;
    launch_add_one(&s, &scratch)?;
    x.copy_from(&s, &scratch)?;
    drop(scratch);
    let graph = s.end_capture()?;
    let exec = graph.instantiate()?;
    drop(graph);

    let mut others = Vec::new();
    for replay in 0..3 {
        x.copy_from_host(&s, &vec![-1.0; n])?;
        exec.launch(&s)?;
        // Fresh allocations filled with 7 while the replay may still run.
        let other = DeviceBuffer::<f32>::alloc(&s, n)?;
        other.copy_from_host(&s, &vec![7.0; n])?;
        others.push(other);
        s.synchronize()?;
        assert_eq!(x.to_host_vec(&s)?, vec![2.0; n], "replay {replay}");
    }
    exec.launch(&s)?;
    s.synchronize()?;
    for other in &others {
        assert_eq!(
            other.to_host_vec(&s)?,
            vec![7.0; n],
            "a replay wrote freed memory"
        );
    }
    Ok(())
}

#[test]
fn updating_with_a_graph_of_the_same_topology_swaps_its_work() -> Result<(), DeviceError> {
    let s = stream();
    let n = 300;
    let mut rng = rng();
    let (x0, y0) = (random_f32(&mut rng, n), random_f32(&mut rng, n));
    let x = DeviceBuffer::from_host(&s, &x0)?;
    let y = DeviceBuffer::from_host(&s, &y0)?;
    s.synchronize()?;

    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    let on_x = s.end_capture()?;
    s.begin_capture()?;
    launch_add_one(&s, &y)?;
    let on_y = s.end_capture()?;
    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    launch_add_one(&s, &x)?;
    let twice_on_x = s.end_capture()?;

    let mut exec = on_x.instantiate()?;
    exec.launch(&s)?;
    assert!(exec.update(&on_y)?, "same topology must update in place");
    drop(on_y);
    exec.launch(&s)?;
    assert_eq!(x.to_host_vec(&s)?, plus_ones(&x0, 1));
    assert_eq!(y.to_host_vec(&s)?, plus_ones(&y0, 1));

    assert!(
        !exec.update(&twice_on_x)?,
        "another topology must not update"
    );
    exec.launch(&s)?;
    assert_eq!(
        x.to_host_vec(&s)?,
        plus_ones(&x0, 1),
        "a refused update changed the work"
    );
    assert_eq!(y.to_host_vec(&s)?, plus_ones(&y0, 2));
    Ok(())
}

/// An update with a graph of the same shape whose nodes do other kinds of work (a copy or a
/// memset where a kernel was) is refused, as CUDA's exec update refuses a change of node
/// type, and the executable keeps its work.
#[test]
fn updating_with_a_graph_whose_nodes_differ_in_kind_is_refused() -> Result<(), DeviceError> {
    let s = stream();
    let n = 64;
    let mut rng = rng();
    let (x0, y0) = (random_f32(&mut rng, n), random_f32(&mut rng, n));
    let x = DeviceBuffer::from_host(&s, &x0)?;
    let y = DeviceBuffer::from_host(&s, &y0)?;
    s.synchronize()?;

    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    let kernel = s.end_capture()?;
    s.begin_capture()?;
    x.copy_from(&s, &y)?;
    let copy = s.end_capture()?;
    s.begin_capture()?;
    x.view().fill_bytes(&s, 0)?;
    let memset = s.end_capture()?;
    assert_eq!(
        (
            kernel.node_count()?,
            copy.node_count()?,
            memset.node_count()?
        ),
        (1, 1, 1)
    );

    let mut exec = kernel.instantiate()?;
    for (what, other) in [("a copy", &copy), ("a memset", &memset)] {
        assert!(
            !exec.update(other)?,
            "an update putting {what} where a kernel was must be refused"
        );
    }
    exec.launch(&s)?;
    assert_eq!(
        x.to_host_vec(&s)?,
        plus_ones(&x0, 1),
        "a refused update changed the work"
    );
    let mut exec = copy.instantiate()?;
    assert!(
        !exec.update(&memset)?,
        "an update putting a memset where a copy was must be refused"
    );
    Ok(())
}

/// An executable is updated only with a graph of its own device: one recorded on another
/// device is refused with a device mismatch (the driver refuses graphs of another context), and
/// the executable keeps its work, so that a launch never runs another device's work on a stream
/// of this one.
#[test]
fn updating_with_a_graph_of_another_device_is_a_device_mismatch() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    let n = 128;
    let mut rng = rng();
    let (x0, y0) = (random_f32(&mut rng, n), random_f32(&mut rng, n));
    let x = DeviceBuffer::from_host(&sa, &x0)?;
    let y = DeviceBuffer::from_host(&sb, &y0)?;
    sa.synchronize()?;
    sb.synchronize()?;

    sa.begin_capture()?;
    launch_add_one(&sa, &x)?;
    let on_a = sa.end_capture()?;
    sb.begin_capture()?;
    launch_add_one(&sb, &y)?;
    let on_b = sb.end_capture()?;

    let mut exec = on_a.instantiate()?;
    match exec.update(&on_b) {
        Err(DeviceError::DeviceMismatch {
            expected, found, ..
        }) => {
            assert_eq!((expected, found), (a.id(), b.id()));
        }
        other => panic!("an update with another device's graph gave {other:?}"),
    }
    exec.launch(&sa)?;
    assert_eq!(
        x.to_host_vec(&sa)?,
        plus_ones(&x0, 1),
        "the executable lost its work"
    );
    assert_eq!(y.to_host_vec(&sb)?, y0, "another device's work ran");
    Ok(())
}

#[test]
fn capture_misuse_is_a_capture_error() -> Result<(), DeviceError> {
    let device = device();
    let origin = device.new_stream()?;
    let side = device.new_stream()?;
    let x = DeviceBuffer::<f32>::zeroed(&origin, 4)?;
    let y = DeviceBuffer::<f32>::zeroed(&origin, 4)?;
    origin.synchronize()?;

    assert_capture_error(origin.end_capture(), "end_capture without begin_capture");

    origin.begin_capture()?;
    assert_capture_error(origin.begin_capture(), "a second begin_capture");
    side.wait_event(&origin.record_event()?)?;
    launch_add_one(&origin, &x)?;
    launch_add_one(&side, &y)?;
    let in_capture = side.record_event()?;
    assert_capture_error(
        in_capture.synchronize(),
        "Event::synchronize of a captured event",
    );
    // Its work runs only when the graph is launched: a query answering "not yet" for ever
    // would hang a program that polls it.
    assert_capture_error(
        in_capture.is_complete(),
        "Event::is_complete of a captured event",
    );
    origin.wait_event(&in_capture)?;
    assert_capture_error(side.end_capture(), "end_capture on a joined stream");
    assert!(origin.is_capturing() && side.is_capturing());
    let graph = origin.end_capture()?;
    assert_eq!(graph.node_count()?, 2);

    // The capture's events order nothing once it has ended.
    assert_capture_error(
        side.wait_event(&in_capture),
        "waiting on an ended capture's event",
    );
    assert_capture_error(
        in_capture.is_complete(),
        "Event::is_complete of an ended capture's event",
    );
    assert_usable(&origin)?;
    assert_usable(&side)?;
    graph.instantiate()?.launch(&side)?;
    assert_eq!(x.to_host_vec(&origin)?, vec![1.0; 4]);
    assert_eq!(y.to_host_vec(&origin)?, vec![1.0; 4]);
    Ok(())
}

/// Only the thread that began a capture ends it: another thread's `end_capture` is a capture
/// error and leaves the capture open, so the capturing thread's later work still enters the
/// graph, and its own `end_capture` returns all of it.
#[test]
fn ending_a_capture_from_another_thread_is_a_capture_error() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    s.synchronize()?;
    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    let ended = std::thread::scope(|scope| {
        scope
            .spawn(|| s.end_capture())
            .join()
            .expect("the other thread")
    });
    assert_capture_error(ended, "end_capture from another thread");
    assert!(s.is_capturing());
    launch_add_one(&s, &x)?;
    let graph = s.end_capture()?;
    assert_eq!(graph.node_count()?, 2);
    assert_eq!(x.to_host_vec(&s)?, vec![0.0; 4]);
    graph.instantiate()?.launch(&s)?;
    assert_eq!(x.to_host_vec(&s)?, vec![2.0; 4]);
    Ok(())
}

#[test]
fn a_kernel_first_launched_during_a_capture_is_built_and_replayed() -> Result<(), DeviceError> {
    let s = stream();
    // A kernel of its own, so that no other test has built it yet.
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let triple = unsafe {
        Kernel::new(
            "rt_triple_in_capture",
            r#"extern "C" __global__ void rt_triple_in_capture(float* x, unsigned n) {
            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) x[i] *= 3.0f;
        }"#,
        )
    }
    .with_host(|args| {
        let n = args.scalar::<u32>(1)? as usize;
        for v in prefix_mut("rt_triple_in_capture", args.output::<f32>(0)?, n)? {
            *v *= 3.0;
        }
        Ok(())
    });
    let n = 100;
    let x0 = random_f32(&mut rng(), n);
    let x = DeviceBuffer::from_host(&s, &x0)?;
    s.synchronize()?;
    s.begin_capture()?;
    triple.launch(
        &s,
        LaunchConfig::for_num_elems(n),
        KernelArgs::new().output(&x).scalar(n as u32),
    )?;
    let exec = s.end_capture()?.instantiate()?;
    exec.launch(&s)?;
    exec.launch(&s)?;
    let want: Vec<f32> = x0.iter().map(|v| v * 3.0 * 3.0).collect();
    assert_eq!(x.to_host_vec(&s)?, want);
    Ok(())
}

/// A capturing stream waiting for an event of eager work (recorded outside the capture, its
/// work possibly still running) is ordered, not refused: the graph keeps the event, and every
/// launch of it waits for that work first. (The driver refuses such a wait inside a capture;
/// the host backend took it. Both now answer alike.)
#[test]
fn a_captured_wait_for_eager_work_orders_every_replay_after_it() -> Result<(), DeviceError> {
    use cuflow_testing::kernels::{copy, launch_spin_write};
    let device = device();
    let (eager, capturing, replaying) = (
        device.new_stream()?,
        device.new_stream()?,
        device.new_stream()?,
    );
    let x = DeviceBuffer::from_host(&eager, &[0.0f32])?;
    let y = DeviceBuffer::from_host(&eager, &[f32::NAN])?;
    eager.synchronize()?;
    launch_spin_write(&eager, &x, 7.0, 50_000_000)?;
    let done = eager.record_event()?;
    capturing.begin_capture()?;
    let waited = capturing.wait_event(&done);
    let copied = waited.and_then(|()| {
        copy().launch(
            &capturing,
            LaunchConfig::linear(1, 1),
            KernelArgs::new().output(&y).input(&x).scalar(1u32),
        )
    });
    let graph = capturing.end_capture();
    copied?;
    let exec = graph?.instantiate()?;
    exec.launch(&replaying)?;
    assert_eq!(y.to_host_vec(&replaying)?, vec![7.0]);
    assert!(
        done.is_complete()?,
        "the replay ran after the work it waited for"
    );
    Ok(())
}

/// Replaying a graph on a stream being captured is refused on every backend (the driver
/// cannot record a replay): a capture error that fails that capture, not a driver error, and
/// both streams and the inner graph stay usable.
#[test]
fn replaying_a_graph_during_a_capture_is_a_capture_error() -> Result<(), DeviceError> {
    let device = device();
    let (s, t) = (device.new_stream()?, device.new_stream()?);
    let n = 300;
    let x0 = random_f32(&mut rng(), n);
    let x = DeviceBuffer::from_host(&s, &x0)?;
    s.synchronize()?;
    s.begin_capture()?;
    let added = launch_add_one(&s, &x);
    let inner = s.end_capture();
    added?;
    let inner = inner?.instantiate()?;
    t.begin_capture()?;
    assert_capture_error(inner.launch(&t), "a replay inside a capture");
    assert_capture_error(t.end_capture(), "end_capture after a refused replay");
    assert_usable(&t)?;
    inner.launch(&s)?;
    assert_eq!(
        x.to_host_vec(&s)?,
        plus_ones(&x0, 1),
        "the graph still replays"
    );
    Ok(())
}

/// One graph and one executable shared by several threads, which instantiate, describe and
/// launch them at once: the driver does not synchronize graph objects, so each call on one is
/// made alone, and every replay lands.
#[test]
fn one_graph_shared_by_threads_is_instantiated_described_and_replayed_at_once(
) -> Result<(), DeviceError> {
    let device = device();
    let (origin, side) = (device.new_stream()?, device.new_stream()?);
    let n = 257;
    let mut rng = rng();
    let (a0, b0) = (random_f32(&mut rng, n), random_f32(&mut rng, n));
    let a = DeviceBuffer::from_host(&origin, &a0)?;
    let b = DeviceBuffer::from_host(&origin, &b0)?;
    origin.synchronize()?;
    origin.begin_capture()?;
    side.wait_event(&origin.record_event()?)?;
    let captured = launch_add_one(&origin, &a).and_then(|()| launch_add_one(&side, &b));
    let joined = side.record_event().and_then(|e| origin.wait_event(&e));
    let graph = origin.end_capture();
    captured?;
    joined?;
    let graph = graph?;
    let shared_exec = graph.instantiate()?;
    let (threads, rounds) = (8, 12);
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<(), DeviceError> {
                    let s = device.new_stream()?;
                    for _ in 0..rounds {
                        let own = graph.instantiate()?;
                        assert_eq!(graph.node_count()?, 2);
                        assert_eq!(graph.edges()?.len(), 0);
                        assert!(graph.to_dot().is_ok_and(|d| d.contains("digraph")));
                        own.launch(&s)?;
                        shared_exec.launch(&s)?;
                    }
                    s.synchronize()
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a worker panicked")?;
        }
        Ok(())
    })?;
    let replays = threads * rounds * 2;
    assert_eq!(a.to_host_vec(&origin)?, plus_ones(&a0, replays));
    assert_eq!(b.to_host_vec(&origin)?, plus_ones(&b0, replays));
    Ok(())
}

/// A buffer last used eagerly on a stream and dropped while another thread begins, records and
/// ends captures on that stream: its free is made before the capture or after it, never
/// recorded into the graph (which holds exactly the captured launch every time).
#[test]
fn a_buffer_dropped_while_its_stream_begins_a_capture_is_never_freed_inside_it(
) -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let n = 64;
    let x0 = random_f32(&mut rng(), n);
    let x = DeviceBuffer::from_host(&s, &x0)?;
    s.synchronize()?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let dropped = std::sync::atomic::AtomicUsize::new(0);
    // At least this many rounds, and more (up to a bound) until the other thread has made and
    // dropped a buffer beside them, however the threads are scheduled.
    let (min_rounds, max_rounds) = (200, 200_000);
    let mut rounds = 0;
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        let dropper = scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Refused while the other thread captures on `s`; dropped right away otherwise.
                if let Ok(y) = DeviceBuffer::<f32>::zeroed(&s, 1024) {
                    drop(y);
                    dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        let captured = (|| -> Result<(), DeviceError> {
            while rounds < min_rounds
                || (dropped.load(std::sync::atomic::Ordering::Relaxed) == 0 && rounds < max_rounds)
            {
                let round = rounds;
                rounds += 1;
                s.begin_capture()?;
                let added = launch_add_one(&s, &x);
                let graph = s.end_capture();
                added?;
                let graph = graph?;
                assert_eq!(graph.node_count()?, 1, "round {round}: {}", graph.to_dot()?);
                graph.instantiate()?.launch(&s)?;
            }
            Ok(())
        })();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        dropper.join().expect("the dropping thread panicked");
        captured?;
        assert!(
            dropped.load(std::sync::atomic::Ordering::Relaxed) > 0,
            "no buffer was made and dropped beside {rounds} captures"
        );
        Ok(())
    })?;
    assert_eq!(x.to_host_vec(&s)?, plus_ones(&x0, rounds));
    Ok(())
}

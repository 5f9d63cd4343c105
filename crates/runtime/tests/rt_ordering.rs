//! Automatic ordering of buffer accesses across streams: no event, no `join`, no
//! synchronization between the streams in these tests, only work on shared buffers. Each test
//! puts a long spin before the first access, so that without ordering the second access would
//! run first, on every backend.

use std::sync::mpsc;
use std::time::Duration;

use cuflow_runtime::{DeviceBuffer, DeviceError};
use cuflow_testing::{
    device::{device, new_streams, stream},
    kernels::{launch_add_one, launch_spin_write, LONG_SPIN},
    rng::{random_f32, rng},
    POISON,
};

#[test]
fn a_read_on_another_stream_waits_for_the_last_write() -> Result<(), DeviceError> {
    let device = device();
    let (a, b) = (device.new_stream()?, device.new_stream()?);
    let x = DeviceBuffer::from_host(&a, &[1.0f32])?;
    let y = DeviceBuffer::<f32>::alloc(&b, 1)?;
    y.view().fill_bytes(&b, POISON)?;
    a.synchronize()?;
    b.synchronize()?;

    launch_spin_write(&a, &x, 7.0, LONG_SPIN)?;
    y.copy_from(&b, &x)?; // reads x on b
    assert_eq!(y.to_host_vec(&b)?, vec![7.0]);
    Ok(())
}

#[test]
fn two_writers_on_two_streams_do_not_lose_updates() -> Result<(), DeviceError> {
    let device = device();
    let (a, b) = (device.new_stream()?, device.new_stream()?);
    let x = DeviceBuffer::from_host(&a, &[0.0f32])?;
    a.synchronize()?;

    launch_spin_write(&a, &x, 5.0, LONG_SPIN)?;
    launch_add_one(&b, &x)?;
    // Ordered: 5 then + 1. Unordered: + 1 first, then overwritten by 5.
    assert_eq!(x.to_host_vec(&b)?, vec![6.0]);
    Ok(())
}

#[test]
fn a_write_waits_for_reads_on_other_streams() -> Result<(), DeviceError> {
    let device = device();
    let mut rng = rng();
    let (a, b) = (device.new_stream()?, device.new_stream()?);
    let data = random_f32(&mut rng, 4097);
    let x = DeviceBuffer::from_host(&a, &data)?;
    let y = DeviceBuffer::<f32>::alloc(&a, data.len())?;
    let gate = DeviceBuffer::<f32>::alloc(&a, 1)?;
    y.view().fill_bytes(&a, POISON)?;
    a.synchronize()?;

    // On a: a long spin (on another buffer), then a read of x.
    launch_spin_write(&a, &gate, 1.0, LONG_SPIN)?;
    y.copy_from(&a, &x)?;
    // On b: a write of x, which must wait for that read.
    x.view().fill_bytes(&b, 0)?;
    assert_eq!(y.to_host_vec(&a)?, data);
    assert_eq!(x.to_host_vec(&b)?, vec![0.0; data.len()]);
    Ok(())
}

#[test]
fn a_memset_and_a_copy_from_the_host_are_ordered_like_kernels() -> Result<(), DeviceError> {
    let device = device();
    let (a, b, c) = (
        device.new_stream()?,
        device.new_stream()?,
        device.new_stream()?,
    );
    let x = DeviceBuffer::from_host(&a, &[1.0f32, 1.0])?;
    a.synchronize()?;
    launch_spin_write(&a, &x, 3.0, LONG_SPIN)?; // x[0] = 3 at the end of the spin
    x.copy_from_host(&b, &[4.0, 4.0])?; // must come after: x = [4, 4]
    launch_add_one(&c, &x)?; // then + 1
    assert_eq!(x.to_host_vec(&a)?, vec![5.0, 5.0]);
    Ok(())
}

#[test]
fn reads_on_several_streams_all_see_the_write() -> Result<(), DeviceError> {
    let device = device();
    let streams = new_streams(&device, 4)?;
    let x = DeviceBuffer::from_host(&streams[0], &[0.0f32])?;
    let outs: Vec<DeviceBuffer<f32>> = streams
        .iter()
        .map(|s| DeviceBuffer::<f32>::alloc(s, 1))
        .collect::<Result<_, _>>()?;
    for (o, s) in outs.iter().zip(&streams) {
        o.view().fill_bytes(s, POISON)?;
        s.synchronize()?;
    }
    launch_spin_write(&streams[0], &x, 9.0, LONG_SPIN)?;
    for (o, s) in outs.iter().zip(&streams[1..]) {
        o.copy_from(s, &x)?;
    }
    for (o, s) in outs.iter().zip(&streams[1..]) {
        assert_eq!(o.to_host_vec(s)?, vec![9.0]);
    }
    Ok(())
}

#[test]
fn a_graph_replay_is_ordered_with_eager_work() -> Result<(), DeviceError> {
    let device = device();
    let (g, b) = (device.new_stream()?, device.new_stream()?);
    let x = DeviceBuffer::from_host(&g, &[0.0f32])?;
    let y = DeviceBuffer::<f32>::alloc(&b, 1)?;
    g.synchronize()?;
    g.begin_capture()?;
    launch_spin_write(&g, &x, 2.0, LONG_SPIN)?;
    let graph = g.end_capture()?;
    let exec = graph.instantiate()?;
    exec.launch(&g)?;
    y.copy_from(&b, &x)?; // reads the replay's output on another stream
    assert_eq!(y.to_host_vec(&b)?, vec![2.0]);

    // And a replay that writes waits for an eager read of another stream.
    let gate = DeviceBuffer::<f32>::alloc(&b, 1)?;
    x.copy_from_host(&b, &[11.0])?;
    launch_spin_write(&b, &gate, 0.0, LONG_SPIN)?;
    y.copy_from(&b, &x)?; // read of x on b, after a long spin
    exec.launch(&g)?; // writes x = 2: must wait for that read
    assert_eq!(y.to_host_vec(&b)?, vec![11.0]);
    assert_eq!(x.to_host_vec(&g)?, vec![2.0]);
    Ok(())
}

#[test]
fn another_threads_work_never_enters_a_capture() -> Result<(), DeviceError> {
    let s = stream();
    let x = DeviceBuffer::from_host(&s, &[0.0f32])?;
    let other = DeviceBuffer::from_host(&s, &[0.0f32])?;
    s.synchronize()?;
    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // Every way of putting work on the capturing stream is refused at once.
            let launch = launch_add_one(&s, &other);
            let copy = other.copy_from_host(&s, &[5.0]);
            let record = s.record_event().map(|_| ());
            let host_fn = s.enqueue_host_fn(|| {});
            let sync = s.synchronize();
            let _ = tx.send((launch, copy, record, host_fn, sync));
        });
    });
    let (launch, copy, record, host_fn, sync) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the other thread finished");
    for (what, r) in [
        ("launch", launch),
        ("copy", copy),
        ("record", record),
        ("host fn", host_fn),
        ("synchronize", sync),
    ] {
        match r {
            Err(DeviceError::Capture { reason, .. }) => {
                assert!(reason.contains("another thread"), "{what}: {reason}")
            }
            other => panic!("{what} from another thread on a capturing stream: {other:?}"),
        }
    }
    // The capture is intact and holds exactly the capturing thread's work.
    let graph = s.end_capture()?;
    assert_eq!(graph.node_count()?, 1);
    let exec = graph.instantiate()?;
    exec.launch(&s)?;
    exec.launch(&s)?;
    assert_eq!(x.to_host_vec(&s)?, vec![2.0]);
    assert_eq!(other.to_host_vec(&s)?, vec![0.0]);
    Ok(())
}

#[test]
fn eager_work_on_a_buffer_a_capture_wrote_is_not_pulled_into_the_capture() -> Result<(), DeviceError>
{
    let device = device();
    let (s, t) = (device.new_stream()?, device.new_stream()?);
    let x = DeviceBuffer::from_host(&s, &[1.0f32])?;
    let y = DeviceBuffer::<f32>::alloc(&t, 1)?;
    launch_spin_write(&s, &x, 4.0, LONG_SPIN)?; // eager, before the capture
    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    // Another thread reads x eagerly while s captures: it waits for s's eager work (the
    // spin), not for the captured kernel, and stays out of the capture.
    let read = std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<Vec<f32>, DeviceError> {
                y.copy_from(&t, &x)?;
                y.to_host_vec(&t)
            })
            .join()
            .expect("reader thread")
    })?;
    assert_eq!(read, vec![4.0]);
    let graph = s.end_capture()?;
    assert_eq!(graph.node_count()?, 1);
    graph.instantiate()?.launch(&s)?;
    assert_eq!(x.to_host_vec(&t)?, vec![5.0]);
    Ok(())
}

/// As above, for a stream that joined the capture (by waiting on an event recorded in it)
/// after its eager write: eager work of other streams on the buffer, on the capturing thread
/// and on another, is ordered after that write (the stream's work before it joined), reads
/// what it wrote, and is neither refused nor pulled into the capture.
#[test]
fn eager_work_on_a_buffer_a_joined_stream_wrote_before_joining_waits_for_that_write(
) -> Result<(), DeviceError> {
    let device = device();
    let (s, t, u) = (
        device.new_stream()?,
        device.new_stream()?,
        device.new_stream()?,
    );
    let x = DeviceBuffer::from_host(&s, &[1.0f32])?;
    let y = DeviceBuffer::from_host(&t, &[1.0f32])?;
    let z = DeviceBuffer::from_host(&u, &[1.0f32])?;
    s.synchronize()?;
    t.synchronize()?;
    u.synchronize()?;
    launch_spin_write(&t, &y, 4.0, LONG_SPIN)?; // eager, before t joins the capture
    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    t.wait_event(&s.record_event()?)?; // t joins the capture
    launch_add_one(&t, &x)?;
    // On this thread: a read back, and a kernel writing y, on a stream outside the capture.
    assert_eq!(
        y.to_host_vec(&u)?,
        vec![4.0],
        "the read back on this thread"
    );
    launch_add_one(&u, &y)?;
    // On another thread: a copy reading y.
    let copied = std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<Vec<f32>, DeviceError> {
                let v = device.new_stream()?;
                z.copy_from(&v, &y)?;
                z.to_host_vec(&v)
            })
            .join()
            .expect("reader thread")
    })?;
    assert_eq!(copied, vec![5.0], "the copy on another thread");
    s.join(&t)?;
    let graph = s.end_capture()?;
    assert_eq!(graph.node_count()?, 2, "only the two captured launches");
    graph.instantiate()?.launch(&s)?;
    assert_eq!(x.to_host_vec(&u)?, vec![3.0]);
    assert_eq!(y.to_host_vec(&t)?, vec![5.0]);
    Ok(())
}

#[test]
fn no_launch_accepted_from_another_thread_is_lost_into_a_capture() -> Result<(), DeviceError> {
    let s = stream();
    let mine = DeviceBuffer::from_host(&s, &[0.0f32])?;
    let theirs = DeviceBuffer::from_host(&s, &[0.0f32])?;
    s.synchronize()?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let accepted = std::thread::scope(|scope| -> Result<u32, DeviceError> {
        let other = scope.spawn(|| -> Result<u32, DeviceError> {
            let mut accepted = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                match launch_add_one(&s, &theirs) {
                    Ok(()) => accepted += 1,
                    Err(DeviceError::Capture { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(accepted)
        });
        for _ in 0..200 {
            s.begin_capture()?;
            launch_add_one(&s, &mine)?;
            let graph = s.end_capture()?;
            assert_eq!(
                graph.node_count()?,
                1,
                "a capture recorded another thread's work"
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
        other.join().expect("the other thread")
    })?;
    // Every launch the other thread was told succeeded ran; the captures' never did.
    assert_eq!(theirs.to_host_vec(&s)?, vec![accepted as f32]);
    assert_eq!(mine.to_host_vec(&s)?, vec![0.0]);
    Ok(())
}

/// Runs [`CAPTURES`] captures of one kernel on `s` while another thread calls `sync` in a loop, and
/// checks that every capture ended with exactly its own kernel; returns what the other
/// thread's calls answered.
const CAPTURES: usize = 20_000;

fn captures_beside(
    s: &cuflow_runtime::Stream,
    sync: impl Fn() -> Result<(), DeviceError> + Send + Sync,
) -> Result<Vec<Result<(), DeviceError>>, DeviceError> {
    let x = DeviceBuffer::from_host(s, &[0.0f32])?;
    s.synchronize()?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                answers.push(sync());
            }
            answers
        });
        let mut captures = Ok(());
        for _ in 0..CAPTURES {
            let one = s.begin_capture().and_then(|()| {
                launch_add_one(s, &x)?;
                let graph = s.end_capture()?;
                assert_eq!(graph.node_count()?, 1);
                Ok(())
            });
            if one.is_err() {
                captures = one;
                break;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
        let answers = other.join().expect("the synchronizing thread");
        captures.map(|()| answers)
    })
}

/// A stream's synchronization from another thread, racing with captures beginning on it,
/// either waits for the stream's eager work or is refused as another thread's: it never
/// waits on the capturing stream (which spoils the capture on CUDA).
#[test]
fn a_synchronize_racing_a_capture_from_another_thread_never_spoils_it() {
    cuflow_testing::thread::within_a_minute("a synchronize beside captures hung", || {
        let s = stream();
        let answers = captures_beside(&s, || s.synchronize()).expect("every capture succeeded");
        for answer in answers {
            match answer {
                Ok(()) => {}
                Err(DeviceError::Capture { reason, .. }) => {
                    assert!(reason.contains("another thread"), "{reason}")
                }
                Err(e) => panic!("synchronize beside a capture: {e}"),
            }
        }
    });
}

/// `Device::synchronize` skips the streams being captured, also those whose capture another
/// thread begins while it runs: it answers `Ok` and spoils no capture.
#[test]
fn a_device_synchronize_racing_a_capture_skips_the_capturing_stream() {
    cuflow_testing::thread::within_a_minute("a device synchronize beside captures hung", || {
        let s = stream();
        let device = s.device().clone();
        let answers =
            captures_beside(&s, || device.synchronize()).expect("every capture succeeded");
        for answer in answers {
            if let Err(e) = answer {
                panic!("Device::synchronize beside a capture: {e}");
            }
        }
    });
}

/// Events that another thread records on a stream while captures begin and end beside it
/// (the stream joins each capture and is joined back): each is either refused, or recorded in
/// the capture (and says so), or an eager event that completes once the stream's work has
/// run, never one that stands for captured work and so never completes, whose wait would
/// hang.
#[test]
fn events_recorded_while_a_joined_stream_leaves_its_capture_are_eager_or_captured() {
    cuflow_testing::thread::within_a_minute("captures beside event records hung", || {
        let device = device();
        let (s, t) = (
            device.new_stream().expect("a stream"),
            device.new_stream().expect("a stream"),
        );
        let stop = std::sync::atomic::AtomicBool::new(false);
        let eager = std::thread::scope(|scope| {
            let recorder = scope.spawn(|| {
                // The latest eager events, a bounded number (a GPU records far more of them
                // than a host stream in the time the captures take).
                let mut eager = std::collections::VecDeque::new();
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    // Refused while `t` takes part in a capture of the other thread.
                    if let Ok(event) = t.record_event() {
                        if !event.is_captured() {
                            if eager.len() == 50_000 {
                                eager.pop_front();
                            }
                            eager.push_back(event);
                        }
                    }
                }
                eager
            });
            for _ in 0..CAPTURES {
                s.begin_capture().expect("begin");
                let joined = s
                    .record_event()
                    .and_then(|e| t.wait_event(&e))
                    .and_then(|()| s.join(&t));
                let graph = s.end_capture();
                joined.expect("t joins the capture and is joined back");
                graph.expect("the capture ends");
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
            recorder.join().expect("the recording thread")
        });
        t.synchronize().expect("t's eager work");
        let pending = eager
            .iter()
            .filter(|e| !matches!(e.is_complete(), Ok(true)))
            .count();
        assert_eq!(
            pending,
            0,
            "{pending} of {} eager events of t never complete after its synchronization",
            eager.len()
        );
    });
}

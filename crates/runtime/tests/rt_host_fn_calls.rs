//! What a host function may do with cuflow. A wait inside one (it would wait for itself) is
//! refused at once with `DeviceError::Reentrant` on every backend; on CUDA, whose driver
//! refuses every call on the thread of host functions, so is anything else that reaches the
//! device (a launch, an event), before it takes a lock of the runtime: never a hang, never the
//! driver's bare `CUDA_ERROR_NOT_PERMITTED`. What a host function drops last is released
//! after it, and fails no later, unrelated call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use cuflow_runtime::{
    BackendKind, DeviceBuffer, DeviceCopy, DeviceError, Kernel, KernelArgs, LaunchConfig,
    PinnedBuffer, Stream,
};
use cuflow_testing::{
    device::stream,
    kernels::{assert_stream_usable, launch_add_one},
};

/// The tests of this file one at a time: they block host functions on purpose, and on CUDA a
/// device's host functions run one after another on a thread of the driver's, so one test's
/// waiting host function held up the others' (seen with the harness's threads: tests whose
/// host functions never wait failed their deadlines). It also keeps other tests from
/// allocating between the two readings of the pool's reserved bytes that some tests make. A
/// test that failed holding it leaves it poisoned; the next takes it all the same.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `f` in a host function on `s` and returns what it returned.
fn inside_a_host_function<T: Send + 'static>(
    s: &Stream,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    s.enqueue_host_fn(move || {
        let _ = tx.send(f());
    })
    .expect("enqueue the host function");
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the host function ran and answered")
}

/// `r` is the refusal of a call made inside a host function: `Reentrant`, on every backend.
fn assert_refused(r: Result<(), DeviceError>, kind: BackendKind, what: &str) {
    assert!(
        matches!(r, Err(DeviceError::Reentrant { .. })),
        "{what} inside a host function on {kind:?}: {r:?}"
    );
}

/// `launched`, a launch that adds `added` to `x` (1.0 before it), made inside a host function on
/// a stream of `x`'s device: on the host backend it runs after the host function, whose
/// streams are threads of its own; on CUDA the driver would refuse it, and cuflow refuses it
/// first, leaving `x` as it was.
fn assert_launched_after_or_refused(
    launched: Result<(), DeviceError>,
    other: &Stream,
    x: &DeviceBuffer<f32>,
    added: f32,
    what: &str,
) -> Result<(), DeviceError> {
    match other.device().kind() {
        BackendKind::Host => {
            launched?;
            assert_eq!(x.to_host_vec(other)?, vec![1.0 + added], "{what}");
        }
        kind => {
            assert_refused(launched, kind, what);
            assert_eq!(x.to_host_vec(other)?, vec![1.0], "{what}");
        }
    }
    Ok(())
}

#[test]
fn waiting_inside_a_host_function_is_refused_at_once() -> Result<(), DeviceError> {
    let _one = one_at_a_time();
    let s = stream();
    let other = s.device().new_stream()?;
    let (own, another, event) = inside_a_host_function(&s, {
        let (s, other) = (s.clone(), other.clone());
        move || {
            let event = other.record_event();
            (
                s.synchronize(),
                other.synchronize(),
                event.and_then(|e| e.synchronize()),
            )
        }
    });
    let kind = s.device().kind();
    assert_refused(own, kind, "synchronizing its own stream");
    assert_refused(another, kind, "synchronizing another stream");
    assert_refused(event, kind, "waiting for an event");
    s.synchronize()?;
    assert_stream_usable(&s)?;
    assert_stream_usable(&other)
}

/// Beginning or ending a capture inside a host function is refused at once with `Reentrant`,
/// on every backend. A capture belongs to the thread that began it, and only that thread may
/// end it or enqueue into it: begun on the thread that runs a stream's work, nothing could
/// ever end it, and the stream would refuse every other thread's work from then on.
#[test]
fn capturing_inside_a_host_function_is_refused_at_once() -> Result<(), DeviceError> {
    let _one = one_at_a_time();
    let s = stream();
    let other = s.device().new_stream()?;
    let (own, another) = inside_a_host_function(&s, {
        let (s, other) = (s.clone(), other.clone());
        move || (s.begin_capture(), other.begin_capture())
    });
    let kind = s.device().kind();
    assert_refused(own, kind, "beginning a capture of its own stream");
    assert_refused(another, kind, "beginning a capture of another stream");
    assert!(!s.is_capturing() && !other.is_capturing());
    // A capture this thread began is ended by this thread, not by a host function.
    other.begin_capture()?;
    let ended = inside_a_host_function(&s, {
        let other = other.clone();
        move || other.end_capture().map(drop)
    });
    assert_refused(ended, kind, "ending a capture");
    assert!(other.is_capturing());
    drop(other.end_capture()?);
    s.synchronize()?;
    assert_stream_usable(&s)?;
    assert_stream_usable(&other)
}

/// The results of the waits a host kernel implementation tried, in the order it tried them.
type WaitResults = Vec<(&'static str, Result<(), DeviceError>)>;

/// A host kernel implementation runs on its stream's worker, as a host function does: every
/// wait it tries (its own stream, another stream, the device, an event, a read back, a pinned
/// transfer) is refused at once with `Reentrant`, never a hang, and the launch still writes its
/// output. On CUDA the kernel's CUDA C runs instead, and the implementation never does.
#[test]
fn waiting_inside_a_host_kernel_implementation_is_refused_at_once() -> Result<(), DeviceError> {
    let _one = one_at_a_time();
    let s = stream();
    let device = s.device().clone();
    let other = device.new_stream()?;
    let y = std::sync::Arc::new(DeviceBuffer::from_host(&other, &[5.0f32])?);
    let tried: std::sync::Arc<Mutex<Option<WaitResults>>> = Default::default();
    let source = r#"extern "C" __global__ void rt_waits_in_host_kernel(float* x) { x[0] = 2.0f; }"#;
    // SAFETY: the kernel writes element 0 of its one buffer, which every launch passes.
    let kernel = unsafe { Kernel::new("rt_waits_in_host_kernel", source) }.with_host({
        let (s, other, device, y, tried) = (
            s.clone(),
            other.clone(),
            device.clone(),
            y.clone(),
            tried.clone(),
        );
        move |args| {
            let pinned = PinnedBuffer::<f32>::new(&device, 1)?;
            let results: WaitResults = vec![
                ("synchronizing its own stream", s.synchronize()),
                ("synchronizing another stream", other.synchronize()),
                ("synchronizing the device", device.synchronize()),
                (
                    "waiting for an event",
                    other.record_event().and_then(|e| e.synchronize()),
                ),
                ("reading a buffer back", y.to_host_vec(&other).map(drop)),
                (
                    "waiting for a pinned transfer",
                    pinned
                        .copy_from_device(&other, y.view())
                        .and_then(|t| t.wait())
                        .map(drop),
                ),
            ];
            *tried.lock().expect("the results") = Some(results);
            args.output::<f32>(0)?[0] = 2.0;
            Ok(())
        }
    });
    let x = DeviceBuffer::from_host(&s, &[0.0f32])?;
    let launched = cuflow_testing::thread::within_a_minute("a wait inside a host kernel hung", {
        let s = s.clone();
        move || {
            kernel.launch(&s, LaunchConfig::linear(1, 1), KernelArgs::new().output(&x))?;
            s.synchronize()?;
            x.to_host_vec(&s)
        }
    });
    assert_eq!(launched?, vec![2.0], "the launch wrote its output");
    let tried = tried.lock().expect("the results").take();
    match device.kind() {
        BackendKind::Host => {
            let tried = tried.expect("the host implementation ran");
            for (what, result) in tried {
                assert_refused(result, BackendKind::Host, what);
            }
        }
        kind => assert!(tried.is_none(), "the host implementation ran on {kind:?}"),
    }
    assert_stream_usable(&s)?;
    assert_stream_usable(&other)
}

#[test]
fn work_enqueued_inside_a_host_function_runs_or_is_refused() -> Result<(), DeviceError> {
    let _one = one_at_a_time();
    let s = stream();
    let other = s.device().new_stream()?;
    let x = std::sync::Arc::new(DeviceBuffer::from_host(&other, &[1.0f32])?);
    other.synchronize()?;
    let launched = inside_a_host_function(&s, {
        let (other, x) = (other.clone(), x.clone());
        move || launch_add_one(&other, &*x)
    });
    assert_launched_after_or_refused(launched, &other, &x, 1.0, "a launch")?;
    s.synchronize()?;
    assert_stream_usable(&s)
}

/// A read back that waits for a host function, which meanwhile enqueues a write of the same
/// buffer on another stream (on the host backend; refused on CUDA), returns: the read does not
/// keep the buffer's ordering to itself while it waits. The read sees the buffer from before
/// the write or after it, as the two were ordered.
#[test]
fn a_read_back_waiting_for_a_host_function_that_writes_its_buffer_returns() {
    let _one = one_at_a_time();
    cuflow_testing::thread::within_a_minute("the read back or the host function hung", || {
        let s = stream();
        let other = s.device().new_stream().expect("a second stream");
        let x = std::sync::Arc::new(DeviceBuffer::from_host(&other, &[1.0f32]).expect("x"));
        other.synchronize().expect("x is written");
        let (release, released) = mpsc::channel::<()>();
        let wrote = std::sync::Arc::new(Mutex::new(None));
        s.enqueue_host_fn({
            let (other, x, wrote) = (other.clone(), x.clone(), wrote.clone());
            move || {
                let _ = released.recv_timeout(Duration::from_secs(20));
                let filled = x.view().fill_bytes(&other, 0);
                *wrote.lock().expect("the result") = Some(filled);
            }
        })
        .expect("enqueue the host function");
        let read = std::thread::scope(|scope| {
            let read = scope.spawn(|| x.to_host_vec(&s));
            // Lets the read start waiting first (either order must finish).
            std::thread::sleep(Duration::from_millis(100));
            let _ = release.send(());
            read.join().expect("the reading thread")
        })
        .expect("the read back");
        s.synchronize().expect("the host function ran");
        let wrote = wrote.lock().expect("the result").take().expect("it ran");
        match s.device().kind() {
            BackendKind::Host => {
                wrote.expect("the write inside the host function");
                assert!(read == [1.0] || read == [0.0], "{read:?}");
                assert_eq!(x.to_host_vec(&other).expect("x"), vec![0.0]);
            }
            kind => {
                assert_refused(wrote, kind, "a fill");
                assert_eq!(read, vec![1.0]);
            }
        }
    });
}

/// Enqueues on `s` a host function that waits up to 20 s for a message on the returned
/// sender; the flag says, once it ran, whether the message came in time.
fn a_host_function_waiting_for_a_message(
    s: &Stream,
) -> (mpsc::Sender<()>, std::sync::Arc<AtomicBool>) {
    let (tx, rx) = mpsc::channel::<()>();
    let came = std::sync::Arc::new(AtomicBool::new(false));
    s.enqueue_host_fn({
        let came = came.clone();
        move || {
            let seen = rx.recv_timeout(Duration::from_secs(20)).is_ok();
            came.store(seen, Ordering::SeqCst);
        }
    })
    .expect("enqueue the host function");
    (tx, came)
}

/// Runs `op` on a thread of its own while a host function queued on `s` before it waits for
/// this thread to write `x` (filling its bytes with `fill` on the stream `other`), and gives
/// `op`'s result. Asserts that the host function saw the write: the write did not wait for
/// `op`, which waits for the host function (a hang broken by the host function's 20 s).
fn behind_a_host_function_waiting_for_a_write<T: DeviceCopy, R: Send>(
    (s, other): (&Stream, &Stream),
    x: &DeviceBuffer<T>,
    fill: u8,
    op: impl FnOnce() -> Result<R, DeviceError> + Send,
) -> R {
    let (wrote, saw_the_write) = a_host_function_waiting_for_a_message(s);
    let result = std::thread::scope(|scope| {
        let op = scope.spawn(op);
        // Lets the op start waiting first (either order must finish).
        std::thread::sleep(Duration::from_millis(100));
        let filled = x.view().fill_bytes(other, fill);
        let _ = wrote.send(());
        filled.expect("the write");
        op.join().expect("the op's thread")
    })
    .expect("the op");
    s.synchronize().expect("the host function ran");
    assert!(
        saw_the_write.load(Ordering::SeqCst),
        "the write waited for the op, which waited for the host function"
    );
    result
}

/// A read back that waits for a host function, which waits in turn for another thread to
/// write the same buffer on another stream, returns on every backend, and the host function
/// sees the write: the read holds the buffer's ordering only while it enqueues its copy, not
/// while it waits for the stream (before, on CUDA, the write waited for the read, and the host
/// function gave up after its 20 s). The read sees the buffer from before the write or after
/// it, as the two were ordered.
#[test]
fn a_read_back_waiting_for_a_host_function_that_waits_for_another_thread_s_write_returns() {
    let _one = one_at_a_time();
    read_back_behind_a_host_function_waiting_for_another_thread_s_write();
}

/// A read back of two elements behind a host function that waits for another thread to
/// write them (zeros) on another stream: it sees them from before the write or after it, and
/// the buffer ends with the write.
fn read_back_behind_a_host_function_waiting_for_another_thread_s_write() {
    cuflow_testing::thread::within_a_minute("the read back or the write hung", || {
        let s = stream();
        let other = s.device().new_stream().expect("a second stream");
        let x = DeviceBuffer::from_host(&other, &[1.0f32, 2.0]).expect("x");
        other.synchronize().expect("x is written");
        let read =
            behind_a_host_function_waiting_for_a_write((&s, &other), &x, 0, || x.to_host_vec(&s));
        assert!(read == [1.0, 2.0] || read == [0.0, 0.0], "{read:?}");
        assert_eq!(x.to_host_vec(&other).expect("x"), vec![0.0, 0.0]);
    });
}

/// The same with a read back of 12 MiB, staged on CUDA through a page-locked buffer that no
/// read back of this process made before (the others here read a few kilobytes), so that the
/// read allocates it while its stream waits for the host function.
#[test]
fn a_large_read_back_waiting_for_a_host_function_that_waits_for_another_thread_s_write_returns() {
    let _one = one_at_a_time();
    large_read_back_behind_a_host_function_waiting_for_another_thread_s_write(3 << 20);
}

/// The same with 64 MiB, staged on CUDA through several page-locked buffers (before, a read
/// back of more than 16 MiB went straight into pageable memory and was waited for with the
/// buffer's ordering held).
#[test]
fn a_64_mib_read_back_waiting_for_a_host_function_that_waits_for_another_thread_s_write_returns() {
    let _one = one_at_a_time();
    large_read_back_behind_a_host_function_waiting_for_another_thread_s_write(16 << 20);
}

/// A read back of `n` zeros behind a host function that waits for another thread to fill
/// them with ones on another stream: it sees the buffer from before the write or after it,
/// and the buffer ends with the write.
fn large_read_back_behind_a_host_function_waiting_for_another_thread_s_write(n: usize) {
    cuflow_testing::thread::within_a_minute("the read back or the write hung", move || {
        let s = stream();
        let other = s.device().new_stream().expect("a second stream");
        let x = DeviceBuffer::<u32>::zeroed(&other, n).expect("x");
        other.synchronize().expect("x is zeroed");
        let read = behind_a_host_function_waiting_for_a_write((&s, &other), &x, 0xff, || {
            x.to_host_vec(&s)
        });
        assert!(
            read.iter().all(|&v| v == 0) || read.iter().all(|&v| v == u32::MAX),
            "neither before nor after the write"
        );
        assert!(x
            .to_host_vec(&other)
            .expect("x")
            .iter()
            .all(|&v| v == u32::MAX));
    });
}

/// A copy from the host of `n` elements behind a host function that waits for another thread
/// to write the same buffer on another stream returns, and the host function sees the write.
/// The buffer ends with the later of the two writes.
fn write_behind_a_host_function_waiting_for_another_thread_s_write(n: usize) {
    cuflow_testing::thread::within_a_minute(
        "the copy from the host or the write hung",
        move || {
            let s = stream();
            let other = s.device().new_stream().expect("a second stream");
            let x = DeviceBuffer::<u32>::zeroed(&other, n).expect("x");
            other.synchronize().expect("x is zeroed");
            let data: Vec<u32> = (1..=n as u32).collect();
            behind_a_host_function_waiting_for_a_write((&s, &other), &x, 0xff, || {
                x.view().copy_from_host(&s, &data)
            });
            let back = x.to_host_vec(&other).expect("x");
            assert!(
                back == data || back.iter().all(|&v| v == u32::MAX),
                "{n} elements: neither the copy's data nor the fill"
            );
        },
    );
}

/// A small copy from the host (16 KiB) does not wait for the work before it, on any backend.
#[test]
fn a_small_write_from_the_host_behind_a_host_function_waiting_for_another_thread_returns() {
    let _one = one_at_a_time();
    write_behind_a_host_function_waiting_for_another_thread_s_write(4 << 10);
}

/// Enqueues `copies` copies from the host of 1 MiB each (into one buffer) behind a host
/// function on `s` that waits for this thread until they are all enqueued, then checks that
/// the host function saw them enqueued (no copy waited for it) and that the buffer holds what
/// was copied. The data may be reused as soon as a copy returns: each copy's bytes are
/// rewritten for the next. On CUDA the copies are staged through page-locked memory of the
/// device's, which they leave behind for later copies.
fn copies_behind_a_waiting_host_function(s: &Stream, copies: usize) {
    let n = 256 << 10;
    let x = DeviceBuffer::<u32>::zeroed(s, n * copies).expect("x");
    let expected = |k: usize| (k as u32).rotate_left(7) ^ 0x5a5a_5a5a;
    let (go, released) = a_host_function_waiting_for_a_message(s);
    let mut data = vec![0u32; n];
    for i in 0..copies {
        for (j, v) in data.iter_mut().enumerate() {
            *v = expected(i * n + j);
        }
        x.slice(i * n..(i + 1) * n)
            .expect("a slice")
            .copy_from_host(s, &data)
            .expect("a copy from the host");
    }
    let _ = go.send(());
    let back = x.to_host_vec(s).expect("x");
    assert!(
        released.load(Ordering::SeqCst),
        "a copy from the host waited for the host function before it"
    );
    let wrong = back
        .iter()
        .enumerate()
        .filter(|&(k, &v)| v != expected(k))
        .count();
    assert_eq!(wrong, 0, "elements differing from what was copied");
}

/// Copies from the host of 1 MiB each, 96 MiB of them in all, enqueued behind a host
/// function that waits for this thread, never wait for it: on CUDA they are staged through
/// page-locked memory of the device's (from pageable memory the driver stages copies only so
/// far, then waits for the stream's earlier work; seen on an H200).
#[test]
fn copies_from_the_host_behind_a_waiting_host_function_do_not_wait_for_it() {
    let _one = one_at_a_time();
    cuflow_testing::thread::within_a_minute("a copy from the host hung", || {
        copies_behind_a_waiting_host_function(&stream(), 96);
    });
}

/// After 96 MiB of staged copies, a small copy from the host, and a small read back, each
/// behind a host function that waits for another thread's write of the same buffer, return.
/// The staging buffers the copies leave are kept, not freed: freeing page-locked memory
/// waits for the device's work in flight, the host function included, and meanwhile blocks
/// the other thread's calls to the driver (a staging that freed what earlier copies left,
/// when it took a buffer, hung here on an H200: the write waited 20 s for the free).
#[test]
fn a_small_write_and_read_back_after_many_staged_copies_return() {
    let _one = one_at_a_time();
    copies_behind_a_waiting_host_function(&stream(), 96);
    write_behind_a_host_function_waiting_for_another_thread_s_write(4 << 10);
    copies_behind_a_waiting_host_function(&stream(), 96);
    read_back_behind_a_host_function_waiting_for_another_thread_s_write();
}

/// A large copy from the host (64 MiB) does not wait for the work before it either: on CUDA
/// it is staged through several page-locked buffers of the device's (before, a copy of more
/// than 16 MiB went through the driver's staging, which waited for the stream with the
/// buffer's ordering held, and this test failed on an H100). The read back that checks it is
/// staged the same way, and compares every element.
#[test]
fn a_large_write_from_the_host_behind_a_host_function_waiting_for_another_thread_returns() {
    let _one = one_at_a_time();
    write_behind_a_host_function_waiting_for_another_thread_s_write(16 << 20);
}

/// The last handles of a buffer, a pinned buffer, a stream, a kernel, a graph and its
/// executable, dropped by a host function: every later call, on any thread, answers for
/// itself.
#[test]
fn handles_dropped_inside_a_host_function_fail_no_later_call() -> Result<(), DeviceError> {
    let _one = one_at_a_time();
    let s = stream();
    let device = s.device().clone();
    let buffer = DeviceBuffer::from_host(&s, &[3.0f32; 4096])?;
    let pinned = PinnedBuffer::<f32>::new(&device, 4096)?;
    let doomed_stream = device.new_stream()?;
    let source = r#"extern "C" __global__ void rt_dropped_in_host_fn(float* x) { x[0] = 1.0f; }"#;
    // SAFETY: the kernel writes element 0 of its one buffer, which every launch passes.
    let kernel = unsafe { Kernel::new("rt_dropped_in_host_fn", source) }.with_host(|args| {
        args.output::<f32>(0)?[0] = 1.0;
        Ok(())
    });
    let target = DeviceBuffer::<f32>::alloc(&s, 1)?;
    kernel.launch(
        &s,
        LaunchConfig::linear(1, 1),
        KernelArgs::new().output(&target),
    )?;
    s.begin_capture()?;
    launch_add_one(&s, &target)?;
    let graph = s.end_capture()?;
    let exec = graph.instantiate()?;
    s.synchronize()?;

    inside_a_host_function(&s, move || {
        drop((buffer, pinned, doomed_stream, kernel, target, graph, exec));
    });
    s.synchronize()?;

    // Unrelated work after the drops, on this thread and on a fresh one.
    assert_stream_usable(&s)?;
    let fresh = device.new_stream()?;
    assert_stream_usable(&fresh)?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| assert_stream_usable(&device.new_stream()?))
            .join()
            .expect("another thread")
    })
}

/// Drops 256 MiB of device memory inside a host function on a fresh stream, then waits twice
/// with `wait` (`how` names it): afterwards the pool can give the memory back. On CUDA, where
/// the driver refuses the free inside the host function, the first wait after it frees the
/// memory in stream order, and the second has waited for the free.
///
/// With `busy`, `busy` other threads drop page-locked buffers inside host functions of
/// streams of their own and synchronize those streams, the whole time: each of their waits may
/// be the one that takes this thread's drop with theirs, and release theirs first (freeing
/// page-locked memory waits for the whole device), and the two waits of this thread must still
/// see its free done.
fn assert_freed_after_host_function_drop(
    how: &str,
    busy: usize,
    wait: impl Fn(&Stream) -> Result<(), DeviceError>,
) -> Result<(), DeviceError> {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let others: Vec<_> = (0..busy)
            .map(|_| {
                scope.spawn(|| -> Result<usize, DeviceError> {
                    let own = stream();
                    let mut waits = 0;
                    while !done.load(Ordering::Acquire) {
                        let pinned = PinnedBuffer::<u8>::new(own.device(), 4096)?;
                        inside_a_host_function(&own, move || drop(pinned));
                        own.synchronize()?;
                        waits += 1;
                    }
                    Ok(waits)
                })
            })
            .collect();
        let checked = {
            // Set however the check ends, a failed assertion included: the scope waits for
            // the other threads, which stop only then.
            let _stop = SetOnDrop(&done);
            freed_after_host_function_drop(how, &wait)
        };
        for other in others {
            other.join().expect("a synchronizing thread")?;
        }
        checked
    })
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn freed_after_host_function_drop(
    how: &str,
    wait: &impl Fn(&Stream) -> Result<(), DeviceError>,
) -> Result<(), DeviceError> {
    const BYTES: usize = 256 << 20;
    let s = stream();
    let pool = s.device().memory_pool();
    let buffer = DeviceBuffer::<u8>::alloc(&s, BYTES)?;
    s.synchronize()?;
    let holding = pool.stats()?.reserved;
    assert!(
        holding >= BYTES,
        "the pool holds the buffer: {holding} bytes reserved"
    );
    inside_a_host_function(&s, move || drop(buffer));
    wait(&s)?;
    wait(&s)?;
    pool.trim_to(0)?;
    let after = pool.stats()?.reserved;
    // The other tests of this binary hold a few KiB at most while this one holds the lock.
    assert!(
        after + BYTES / 2 <= holding,
        "{BYTES} bytes dropped inside a host function were not freed by two {how}: {after} \
         bytes reserved after them, {holding} with the buffer"
    );
    assert_stream_usable(&s)
}

/// Device memory whose last handle a host function drops is given back at the next
/// synchronization of the stream.
#[test]
fn memory_dropped_inside_a_host_function_is_freed_after_it() -> Result<(), DeviceError> {
    let _one = one_at_a_time();
    assert_freed_after_host_function_drop("stream synchronizations", 0, Stream::synchronize)
}

/// The same, where the program waits on an event rather than on the stream: an event's wait
/// releases what host functions dropped too.
#[test]
fn memory_dropped_inside_a_host_function_is_freed_after_an_event_wait() -> Result<(), DeviceError> {
    let _one = one_at_a_time();
    assert_freed_after_host_function_drop("event waits", 0, |s| s.record_event()?.synchronize())
}

/// The same while other threads drop page-locked memory in host functions and synchronize
/// all the time: the drop may be taken up by another thread's wait, and this thread's waits
/// still return only once its free is enqueued, so that the second of them has waited for it.
#[test]
fn memory_dropped_inside_a_host_function_is_freed_after_it_while_other_threads_wait(
) -> Result<(), DeviceError> {
    let _one = one_at_a_time();
    for _ in 0..8 {
        assert_freed_after_host_function_drop(
            "stream synchronizations beside three threads dropping page-locked memory",
            3,
            Stream::synchronize,
        )?;
    }
    Ok(())
}

/// A launch inside a host function of a kernel whose module another thread is loading. Loading
/// a module waits for the device's work in flight, and so for the host function: had the launch
/// waited for that load (it used to, on the kernel's compile cache), neither would ever finish.
/// It is refused at once instead, and the load finishes after the host function.
#[test]
fn a_launch_inside_a_host_function_never_waits_for_a_module_being_loaded() -> Result<(), DeviceError>
{
    let _one = one_at_a_time();
    let s = stream();
    let other = s.device().new_stream()?;
    let device = s.device().clone();
    // A kernel of its own, so that no other test has compiled it.
    let source =
        r#"extern "C" __global__ void rt_loaded_while_host_fn(float* x) { x[0] += 2.0f; }"#;
    // SAFETY: the kernel writes element 0 of its one buffer, which every launch passes.
    let kernel = unsafe { Kernel::new("rt_loaded_while_host_fn", source) }.with_host(|args| {
        args.output::<f32>(0)?[0] += 2.0;
        Ok(())
    });
    let x = std::sync::Arc::new(DeviceBuffer::from_host(&other, &[1.0f32])?);
    other.synchronize()?;

    let (loading_tx, loading_rx) = mpsc::channel();
    let loader = {
        let kernel = kernel.clone();
        std::thread::spawn(move || {
            let _ = loading_rx.recv_timeout(Duration::from_secs(30));
            kernel.compile(&device)
        })
    };
    let launched = inside_a_host_function(&s, {
        let (other, x, kernel) = (other.clone(), x.clone(), kernel.clone());
        move || {
            // The loader begins while this host function holds the device's work back, and
            // is given time to take the kernel's compile slot.
            let _ = loading_tx.send(());
            std::thread::sleep(Duration::from_millis(200));
            kernel.launch(
                &other,
                LaunchConfig::linear(1, 1),
                KernelArgs::new().output(&*x),
            )
        }
    });
    loader.join().expect("the loading thread")?;
    assert_launched_after_or_refused(launched, &other, &x, 2.0, "a launch while its module loads")?;
    s.synchronize()?;
    assert_stream_usable(&s)
}

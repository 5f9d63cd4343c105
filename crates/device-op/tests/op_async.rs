//! `.await` and `DeviceFuture`: many concurrent ops on a multi-thread runtime, futures that
//! move between threads while their work runs, pending until the work completes.
//!
//! Work that must still be running when a future is polled waits on a [`Gate`], so "pending"
//! is certain, not a matter of timing. The watchdog only turns a lost wake-up into a failure
//! instead of a hang; no test depends on how long anything takes.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use cuflow_device_op::{value, DeviceError, DeviceFuture, DeviceOpExt};
use cuflow_scheduler::{SingleStream, StreamPoolRoundRobin};
use cuflow_testing::{device::device, ops::*};
use rand::{Rng, SeedableRng};

/// Generous bound on a test's wait for a future that should complete.
const WATCHDOG: Duration = Duration::from_secs(60);

/// Wakes a thread blocked on the receiving end.
struct ChannelWaker(mpsc::Sender<()>);

impl std::task::Wake for ChannelWaker {
    fn wake(self: Arc<Self>) {
        let _ = self.0.send(());
    }
}

fn poll_once<T: Send>(future: &mut DeviceFuture<T>) -> Poll<Result<T, DeviceError>> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

/// Runs `task(i, bufs[i])` for every buffer as a task of a multi-thread tokio runtime (four
/// workers); their outputs, in order. Fails the test if a task never completes or panics.
fn spawn_per_buffer<F, Fut>(bufs: &[Buf], task: F) -> Result<Vec<Buf>, DeviceError>
where
    F: Fn(usize, Buf) -> Fut,
    Fut: Future<Output = Result<Buf, DeviceError>> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let tasks: Vec<_> = bufs
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, buf)| tokio::spawn(task(i, buf)))
            .collect();
        join_tasks(tasks).await
    })
}

/// A fill of a new buffer with `value`, scheduled behind a closed gate: in flight, and sure to
/// stay so, until the gate opens.
fn gated_fill(value: f32) -> Result<(Gate, DeviceFuture<Buf>), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let gate = Gate::closed(&device)?;
    let future = fill_after(gate.event(), &buffer(0.0), value).schedule(&policy)?;
    Ok((gate, future))
}

/// The outputs of `tasks`, in order; fails the test if one never completes or panics.
async fn join_tasks<T>(
    tasks: Vec<tokio::task::JoinHandle<Result<T, DeviceError>>>,
) -> Result<Vec<T>, DeviceError> {
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        let joined = tokio::time::timeout(WATCHDOG, task)
            .await
            .expect("an awaited op never completed");
        outputs.push(joined.expect("the task panicked")?);
    }
    Ok(outputs)
}

#[test]
fn a_thousand_concurrent_awaits_on_a_multi_thread_runtime() -> Result<(), DeviceError> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x00c0_ffee);
    let starts: Vec<f32> = (0..1000)
        .map(|_| rng.gen_range(-1000.0f32..1000.0))
        .collect();
    let bufs = buffers(&starts);
    // Each task owns a 'static op on its own buffer.
    let outputs = spawn_per_buffer(&bufs, |i, buf| async move {
        add_scalar(&buf, i as f32)
            .then(|b| mul_scalar(&b, 2.0))
            .await
    })?;
    assert_eq!(outputs.len(), 1000);
    for (i, (out, start)) in outputs.iter().zip(&starts).enumerate() {
        assert!(Arc::ptr_eq(out, &bufs[i]));
        assert_all(out, (start + i as f32) * 2.0, &format!("op {i}"));
    }
    Ok(())
}

#[test]
fn a_future_moved_to_another_thread_mid_flight_is_woken_there() -> Result<(), DeviceError> {
    let (mut gate, mut future) = gated_fill(11.0)?;
    assert!(poll_once(&mut future).is_pending(), "the gate is closed");

    // Polled next on another thread, with that thread's waker, still before the gate opens;
    // from then on it is polled only when woken. The wake-up must go to that waker, not to the
    // first one.
    let (first_poll, polled) = mpsc::channel();
    let finisher = std::thread::spawn(move || {
        let (woken, wakes) = mpsc::channel();
        let waker = Waker::from(Arc::new(ChannelWaker(woken)));
        let mut cx = Context::from_waker(&waker);
        let first = Pin::new(&mut future).poll(&mut cx);
        let _ = first_poll.send(first.is_pending());
        if let Poll::Ready(r) = first {
            return Some(r);
        }
        loop {
            wakes.recv_timeout(WATCHDOG).ok()?;
            if let Poll::Ready(r) = Pin::new(&mut future).poll(&mut cx) {
                return Some(r);
            }
        }
    });
    assert_eq!(
        polled.recv().ok(),
        Some(true),
        "pending on the other thread too"
    );
    gate.open();
    let out = finisher
        .join()
        .expect("the other thread panicked")
        .expect("the moved future was never woken")?;
    assert_all(&out, 11.0, "the moved future's output");
    Ok(())
}

#[test]
fn futures_hop_between_tokio_tasks_and_workers_mid_flight() -> Result<(), DeviceError> {
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let bufs = buffers(&[0.0; 64]);
    let outputs = spawn_per_buffer(&bufs, |i, buf| {
        let policy = policy.clone();
        async move {
            let mut future = spin_then_write(&buf, i as f32, SPIN / 100)
                .then(|b| add_scalar(&b, 0.5))
                .schedule(&policy)?;
            // Polled here, then handed to another task that may run on any worker.
            if let Poll::Ready(r) = poll_once(&mut future) {
                return r;
            }
            tokio::task::yield_now().await;
            tokio::spawn(future)
                .await
                .expect("the awaiting task panicked")
        }
    })?;
    for (i, out) in outputs.iter().enumerate() {
        assert_all(out, i as f32 + 0.5, &format!("op {i}"));
    }
    Ok(())
}

#[test]
fn a_future_stays_pending_until_its_work_completes() -> Result<(), DeviceError> {
    // Enqueueing does not wait for the work, even work that cannot start yet.
    let (mut gate, mut future) = gated_fill(2.0)?;
    for _ in 0..3 {
        assert!(poll_once(&mut future).is_pending(), "the gate is closed");
    }
    gate.open();
    let out = futures::executor::block_on(future)?;
    assert_all(&out, 2.0, "after the gate opened");

    // No device work: ready at the first poll.
    let policy = StreamPoolRoundRobin::new(&device(), 4)?;
    let mut ready = value(7).map(|v| v * 6).schedule(&policy)?;
    assert!(matches!(poll_once(&mut ready), Poll::Ready(Ok(42))));
    let mut lazy = value(8).into_future();
    assert!(matches!(poll_once(&mut lazy), Poll::Ready(Ok(8))));
    Ok(())
}

#[test]
fn a_lazy_future_dropped_before_its_first_poll_runs_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let buf = buffer(1.0);
    let lazy = counted(&runs, fill(&buf, 5.0)).into_future();
    assert!(format!("{lazy:?}").contains("lazy"), "{lazy:?}");
    drop(lazy);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_all(&buf, 1.0, "a dropped lazy future");
}

/// Records that it was woken, then panics.
struct PanickingWaker(Arc<std::sync::atomic::AtomicBool>);

impl std::task::Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
        panic!("a waker that panics");
    }
}

#[test]
fn a_waker_that_panics_leaves_later_futures_completing() -> Result<(), DeviceError> {
    // The process's one completion thread wakes the parked waker when the work completes: the
    // waker's panic must not end that thread, or every later future would stay pending.
    let (mut gate, mut future) = gated_fill(2.0)?;
    let woken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waker = Waker::from(Arc::new(PanickingWaker(woken.clone())));
    let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
    assert!(polled.is_pending(), "the gate is closed");
    gate.open();
    let waited = std::time::Instant::now();
    while !woken.load(Ordering::SeqCst) {
        assert!(
            waited.elapsed() < WATCHDOG,
            "the parked waker was never woken"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // A later future, parked with the completion thread after that panic, completes.
    let (mut gate, mut later) = gated_fill(3.0)?;
    let (tx, rx) = mpsc::channel();
    let waker = Waker::from(Arc::new(ChannelWaker(tx)));
    assert!(Pin::new(&mut later)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    gate.open();
    rx.recv_timeout(WATCHDOG)
        .expect("a future parked after a waker panicked was never woken");
    let out = futures::executor::block_on(later)?;
    assert_all(&out, 3.0, "the later future's output");
    let out = futures::executor::block_on(future)?;
    assert_all(&out, 2.0, "the first future's output");
    Ok(())
}

/// Waiting for a future inside a host function, whose op's work sits behind that host function
/// on its stream, would wait for ever: it is refused with `Reentrant` at once, on every backend,
/// and so is scheduling an op there.
#[test]
fn a_future_waited_for_inside_a_host_function_is_refused_at_once() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let policy = SingleStream::on(&s);
    let (send_future, take_future) = mpsc::channel::<DeviceFuture<_>>();
    let (answer, answered) = mpsc::channel();
    let inner_policy = policy.clone();
    let late = buffer(0.0);
    // Everything the main thread does below is made once first: while the host function
    // blocks, CUDA's driver stalls the calls that wait for the device's work in flight (a
    // kernel module's first load among them), which would keep the future from being sent.
    let buf = buffer(0.0);
    fill(&buf, 0.5).sync_on(&s)?;
    s.enqueue_host_fn(move || {
        let waited = take_future
            .recv_timeout(Duration::from_secs(30))
            .map_err(|e| DeviceError::usage(format!("no future to wait for: {e}")))
            .and_then(futures::executor::block_on)
            .map(drop);
        let scheduled = fill(&late, 2.0).schedule(&inner_policy).map(drop);
        let _ = answer.send((waited, scheduled));
    })?;
    // Enqueued after the host function, on its stream: its work runs after the host function.
    send_future
        .send(fill(&buf, 1.0).schedule(&policy)?)
        .expect("the host function is waiting for the future");
    let (waited, scheduled) = answered
        .recv_timeout(Duration::from_secs(30))
        .expect("the host function returned instead of waiting for ever");
    for (what, r) in [
        ("waiting for a future", &waited),
        ("scheduling an op", &scheduled),
    ] {
        assert!(
            matches!(r, Err(DeviceError::Reentrant { .. })),
            "{what} inside a host function: {r:?}"
        );
    }
    s.synchronize()?;
    Ok(())
}

//! Tracing while several threads enqueue on one stream: the spans of an in-order stream follow
//! one another, and the trace lists them in the order the stream runs them.

use std::sync::Barrier;

use cuflow_runtime::trace::{self, EntryKind, TraceEntry};
use cuflow_runtime::{DeviceBuffer, DeviceError};
use cuflow_testing::device::device;

/// Counts, over consecutive spans of one lane, those that begin before the previous one ends
/// (overlaps) and those that begin before the previous one begins (out of order).
fn overlaps_and_out_of_order(spans: &[&TraceEntry]) -> (usize, usize) {
    let (mut overlaps, mut out_of_order) = (0, 0);
    for w in spans.windows(2) {
        let (a, b) = (w[0], w[1]);
        let (a0, a1) = (a.start_us.unwrap(), a.end_us().unwrap());
        let b0 = b.start_us.unwrap();
        if b0 < a0 {
            out_of_order += 1;
        }
        if b0 < a1 {
            overlaps += 1;
        }
    }
    (overlaps, out_of_order)
}

/// Traces `work(thread, i)` for `i` in `0..per_thread` on each of `threads` threads at once, all
/// enqueuing on `stream`; then checks that the trace lists `threads * per_thread` entries of
/// `kind`, one after the other in stream order (`what` names them in the failure message).
fn assert_traced_in_stream_order(
    stream: &cuflow_runtime::Stream,
    kind: EntryKind,
    (threads, per_thread): (usize, usize),
    work: impl Fn(usize, usize) -> Result<(), DeviceError> + Sync,
    what: &str,
) -> Result<(), DeviceError> {
    trace::start()?;
    let barrier = Barrier::new(threads);
    let enqueued = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    (0..per_thread).try_for_each(|i| work(t, i))
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("an enqueuing thread panicked"))
    });
    let synced = stream.synchronize();
    let t = trace::stop()?;
    enqueued?;
    synced?;
    let spans: Vec<&TraceEntry> = t.entries().iter().filter(|e| e.kind == kind).collect();
    assert_eq!(spans.len(), threads * per_thread);
    let (overlaps, out_of_order) = overlaps_and_out_of_order(&spans);
    assert!(
        overlaps == 0 && out_of_order == 0,
        "{overlaps} {what} on one in-order stream overlap the next one recorded, and \
         {out_of_order} begin before the previous entry of their lane"
    );
    Ok(())
}

#[test]
fn spans_of_one_stream_do_not_overlap_when_four_threads_enqueue() -> Result<(), DeviceError> {
    let _lock = trace::tests_serial();
    let stream = device().new_stream()?;
    assert_traced_in_stream_order(
        &stream,
        EntryKind::HostFn,
        (4, 20_000),
        |_, _| stream.enqueue_host_fn(|| std::hint::black_box(())),
        "host functions",
    )
}

#[test]
fn fills_of_four_threads_on_one_stream_are_listed_in_stream_order() -> Result<(), DeviceError> {
    const THREADS: usize = 4;
    let _lock = trace::tests_serial();
    let stream = device().new_stream()?;
    // One buffer per thread: the accesses never conflict, so nothing else orders the threads.
    let buffers = (0..THREADS)
        .map(|_| DeviceBuffer::from_host(&stream, &[1u32; 16]))
        .collect::<Result<Vec<_>, _>>()?;
    stream.synchronize()?;
    assert_traced_in_stream_order(
        &stream,
        EntryKind::Fill,
        (THREADS, 5_000),
        |t, i| buffers[t].view().fill_bytes(&stream, i as u8),
        "fills",
    )
}

//! A buffer does not keep alive every stream that ever used it: once it remembers 64, it
//! forgets those whose work has all finished, and never one whose work may still be running.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuflow_runtime::{DeviceBuffer, DeviceError, KernelArgs, LaunchConfig, Stream};
use cuflow_testing::{
    device::device,
    kernels::{copy, spin, SHORT_SPIN},
    rng::{random_f32, rng},
};

/// The tests of this file count the device's streams: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `dst = src` by a kernel on `s`: a read of `src`.
fn copy_on(
    s: &Stream,
    dst: &DeviceBuffer<f32>,
    src: &DeviceBuffer<f32>,
) -> Result<(), DeviceError> {
    let n = src.len();
    copy().launch(
        s,
        LaunchConfig::for_num_elems(n),
        KernelArgs::new().output(dst).input(src).scalar(n as u32),
    )
}

/// Random data written to a new buffer on `setup`, and finished: `(data, buffer)`.
fn written(setup: &Stream) -> Result<(Vec<f32>, DeviceBuffer<f32>), DeviceError> {
    let data = random_f32(&mut rng(), 4096);
    let buffer = DeviceBuffer::from_host(setup, &data)?;
    setup.synchronize()?;
    Ok((data, buffer))
}

/// A new buffer of `n` NaNs on `s`.
fn poisoned(s: &Stream, n: usize) -> Result<DeviceBuffer<f32>, DeviceError> {
    DeviceBuffer::from_host(s, &vec![f32::NAN; n])
}

/// A stream per request over long-lived weights: each request reads the weights by a kernel
/// on its own new stream, reads its result back, and drops its stream. The weights keep a
/// bounded number of those streams alive, not all of them, and stay correct to read.
#[test]
fn weights_read_from_a_new_stream_per_request_keep_few_of_them_alive() -> Result<(), DeviceError> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = device();
    let setup = device.new_stream()?;
    let (data, weights) = written(&setup)?;
    let before = device.stream_count();
    let requests = 200;
    for _ in 0..requests {
        let s = device.new_stream()?;
        let out = poisoned(&s, data.len())?;
        copy_on(&s, &out, &weights)?;
        assert_eq!(out.to_host_vec(&s)?, data);
    }
    let kept = device.stream_count().saturating_sub(before);
    assert!(
        kept <= 65,
        "{kept} of {requests} finished request streams are still alive"
    );
    // The weights still order a write after their reads, and are freed.
    weights.view().fill_bytes(&setup, 0)?;
    assert_eq!(weights.to_host_vec(&setup)?, vec![0.0; data.len()]);
    drop(weights);
    device.synchronize()?;
    Ok(())
}

/// Reads still to run on many streams are never forgotten: a write of the buffer enqueued
/// while each reading stream still spins before its read waits for every one, and each read
/// sees the data from before the write.
#[test]
fn a_write_after_reads_on_many_busy_streams_waits_for_every_one() -> Result<(), DeviceError> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = device();
    let setup = device.new_stream()?;
    let (data, x) = written(&setup)?;
    // More readers than a buffer remembers before it looks for idle ones.
    let readers = 100;
    let mut reads = Vec::new();
    for i in 0..readers {
        let s = device.new_stream()?;
        let out = poisoned(&s, data.len())?;
        // The earlier a reader, the longer it spins: a write that waited only for the latest
        // readers would run before the first ones read.
        let cycles = SHORT_SPIN / 4 * (readers - i) as u64;
        spin().launch(
            &s,
            LaunchConfig::linear(1, 1),
            KernelArgs::new().scalar(cycles),
        )?;
        copy_on(&s, &out, &x)?;
        reads.push((s, out));
    }
    let writer = device.new_stream()?;
    x.view().fill_bytes(&writer, 0)?;
    for (s, out) in &reads {
        assert_eq!(out.to_host_vec(s)?, data, "a read ran after the write");
    }
    assert_eq!(x.to_host_vec(&writer)?, vec![0.0; data.len()]);
    Ok(())
}

/// A new stream of `device` that runs a host function sleeping `ms` and then setting the flag
/// returned, dropped at once: its work is still queued.
fn dropped_with_slow_work(
    device: &cuflow_runtime::Device,
    ms: u64,
) -> Result<Arc<AtomicBool>, DeviceError> {
    let s = device.new_stream()?;
    let ran = Arc::new(AtomicBool::new(false));
    s.enqueue_host_fn({
        let ran = ran.clone();
        move || {
            std::thread::sleep(Duration::from_millis(ms));
            ran.store(true, Ordering::SeqCst);
        }
    })?;
    drop(s);
    Ok(ran)
}

/// `Device::synchronize` waits for the work of every stream of the device, also of a stream
/// whose last handle was dropped while its work was queued, and reports that work's failure
/// (once): dropping a stream neither cancels its work nor loses its error.
#[test]
fn device_synchronize_waits_for_dropped_streams_and_reports_their_failures(
) -> Result<(), DeviceError> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = device();
    device.synchronize()?;
    // Work still queued when its stream is dropped.
    let ran = dropped_with_slow_work(&device, 300)?;
    device.synchronize()?;
    assert!(
        ran.load(Ordering::SeqCst),
        "Device::synchronize returned before a dropped stream's work ran"
    );
    // A failure of such work, reported by the next device synchronization only.
    let s = device.new_stream()?;
    s.enqueue_host_fn(|| {
        std::thread::sleep(Duration::from_millis(100));
        panic!("a dropped stream's host function fails");
    })?;
    drop(s);
    let r = device.synchronize();
    assert!(
        matches!(&r, Err(DeviceError::Panicked { message, .. }) if message.contains("dropped stream")),
        "{r:?}"
    );
    device.synchronize()?;
    // The failure of work that had finished before its stream was dropped, too.
    let s = device.new_stream()?;
    let done = Arc::new(AtomicBool::new(false));
    s.enqueue_host_fn(|| panic!("a finished host function of a dropped stream fails"))?;
    s.enqueue_host_fn({
        let done = done.clone();
        move || done.store(true, Ordering::SeqCst)
    })?;
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Time for the stream to finish its bookkeeping, so that it is idle when dropped (its
    // failure is reported either way).
    std::thread::sleep(Duration::from_millis(50));
    drop(s);
    let r = device.synchronize();
    assert!(
        matches!(&r, Err(DeviceError::Panicked { message, .. }) if message.contains("finished host function")),
        "{r:?}"
    );
    device.synchronize()
}

/// Two threads synchronizing the device at once both return only after a dropped stream's
/// work has run (its failure, if any, goes to one of them).
#[test]
fn concurrent_device_synchronizations_both_wait_for_dropped_streams() -> Result<(), DeviceError> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = device();
    device.synchronize()?;
    let ran = dropped_with_slow_work(&device, 400)?;
    let first = std::thread::spawn({
        let device = device.clone();
        let ran = ran.clone();
        move || device.synchronize().map(|()| ran.load(Ordering::SeqCst))
    });
    std::thread::sleep(Duration::from_millis(100));
    device.synchronize()?;
    assert!(
        ran.load(Ordering::SeqCst),
        "a second Device::synchronize returned before a dropped stream's work ran"
    );
    assert!(
        first.join().expect("the first thread")?,
        "the first returned early"
    );
    Ok(())
}

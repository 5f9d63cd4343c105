//! Eager work on the capturing thread that reads what its open capture wrote.
//!
//! Captured work is recorded, not run: until the graph is replayed, a buffer the capture wrote
//! still holds what it held before. On the thread that captures, program order says the
//! captured write came first, so an eager read of that buffer on another stream (a read-back,
//! a copy, a kernel reading it) would return `Ok` with data the write it follows never wrote.
//! Such a read is refused with a capture error; other threads, unordered with the capture, read
//! the data as it was before it, and after the capture every stream reads as usual.

use cuflow_runtime::{DeviceBuffer, DeviceError, KernelArgs, LaunchConfig};
use cuflow_testing::{
    device::device,
    kernels::{copy, launch_add_one},
    rng::{random_f32, rng},
};

#[track_caller]
fn assert_capture_error<T: std::fmt::Debug>(r: Result<T, DeviceError>, what: &str) {
    assert!(
        matches!(r, Err(DeviceError::Capture { .. })),
        "{what}: expected a capture error, got {r:?}"
    );
}

fn plus_one(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| x + 1.0).collect()
}

#[test]
fn reads_on_other_streams_of_what_the_open_capture_wrote_are_refused() -> Result<(), DeviceError> {
    let device = device();
    let (s, other) = (device.new_stream()?, device.new_stream()?);
    let x0 = random_f32(&mut rng(), 300);
    let x = DeviceBuffer::from_host(&s, &x0)?;
    let y = DeviceBuffer::from_host(&s, &vec![-7.0f32; 300])?;
    s.synchronize()?;

    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    let read_back = x.to_host_vec(&other);
    let device_copy = y.copy_from(&other, &x);
    let kernel_read = copy().launch(
        &other,
        LaunchConfig::for_num_elems(300),
        KernelArgs::new().output(&y).input(&x).scalar(300u32),
    );
    let graph = s.end_capture()?;

    assert_capture_error(read_back, "a read-back of the captured write");
    assert_capture_error(device_copy, "a device copy from it");
    assert_capture_error(kernel_read, "a kernel reading it");
    // Nothing was enqueued by the refused work, and the capture holds its one launch.
    assert_eq!(graph.node_count()?, 1);
    assert_eq!(y.to_host_vec(&other)?, vec![-7.0f32; 300]);
    // After the capture, the buffer reads as it was; after a replay, as the graph wrote it.
    assert_eq!(x.to_host_vec(&other)?, x0);
    graph.instantiate()?.launch(&s)?;
    assert_eq!(x.to_host_vec(&other)?, plus_one(&x0));
    Ok(())
}

#[test]
fn reads_of_what_the_open_capture_only_read_stay_allowed() -> Result<(), DeviceError> {
    let device = device();
    let (s, other) = (device.new_stream()?, device.new_stream()?);
    let x0 = random_f32(&mut rng(), 64);
    let x = DeviceBuffer::from_host(&s, &x0)?;
    let y = DeviceBuffer::from_host(&s, &vec![0.0f32; 64])?;
    s.synchronize()?;

    s.begin_capture()?;
    // The capture reads `x` and writes `y`; `x` is still what the program last wrote.
    copy().launch(
        &s,
        LaunchConfig::for_num_elems(64),
        KernelArgs::new().output(&y).input(&x).scalar(64u32),
    )?;
    let read = x.to_host_vec(&other);
    s.end_capture()?;
    assert_eq!(read?, x0);
    Ok(())
}

#[test]
fn other_threads_read_the_data_from_before_the_capture() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let x0 = random_f32(&mut rng(), 128);
    let x = DeviceBuffer::from_host(&s, &x0)?;
    s.synchronize()?;

    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    let read = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let other = device.new_stream()?;
                x.to_host_vec(&other)
            })
            .join()
    });
    s.end_capture()?;
    let read = read.map_err(|_| DeviceError::usage("the reading thread panicked"))?;
    assert_eq!(read?, x0);
    Ok(())
}

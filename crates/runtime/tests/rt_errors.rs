//! Errors are values: impossible allocations, lengths and ranges that do not fit, objects of
//! another device and failing host implementations all come back as `DeviceError`, and the
//! device keeps working afterwards. Errors of kernels and their launches are in
//! `rt_kernel_errors.rs`.
//!
//! Tests of host implementations (what they read, how they fail) run on `Device::host()`
//! whatever the device under test is: only the host backend runs them. Device faults are not
//! provoked on CUDA, where one would poison the context of the whole test process.

use cuflow_runtime::{
    BackendKind, Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig, PinnedBuffer,
};
use cuflow_testing::{
    device::{device, stream},
    kernels::{add_one, assert_stream_usable, launch_spin_write, SHORT_SPIN},
    thread::within_a_minute,
    POISON,
};

#[test]
fn an_impossible_allocation_is_out_of_memory_and_the_device_keeps_working(
) -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let before = device.bytes_in_use();
    // 2^50 bytes: a pebibyte.
    match DeviceBuffer::<f32>::alloc(&s, 1 << 48) {
        Err(DeviceError::OutOfMemory {
            bytes,
            device: name,
        }) => {
            assert_eq!(bytes, 1 << 50);
            assert!(!name.is_empty());
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert!(matches!(
        DeviceBuffer::<u8>::zeroed(&s, 1 << 50),
        Err(DeviceError::OutOfMemory { .. })
    ));
    // A size that does not fit in the address space at all.
    assert!(matches!(
        DeviceBuffer::<f64>::alloc(&s, usize::MAX / 4),
        Err(DeviceError::InvalidShape { .. })
    ));
    assert!(
        device.bytes_in_use() <= before + (1 << 30),
        "failed allocations were counted as in use"
    );
    assert_stream_usable(&s)
}

#[test]
fn lengths_and_ranges_are_checked() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let a = DeviceBuffer::<u32>::zeroed(&s, 10)?;
    let b = DeviceBuffer::<u32>::zeroed(&s, 11)?;
    assert!(matches!(
        a.copy_from_host(&s, &[1, 2, 3]),
        Err(DeviceError::LengthMismatch {
            expected: 10,
            found: 3,
            ..
        })
    ));
    assert!(matches!(
        a.copy_from(&s, &b),
        Err(DeviceError::LengthMismatch { .. })
    ));
    let mut out = [0u32; 9];
    assert!(matches!(
        a.view().copy_to_host(&s, &mut out),
        Err(DeviceError::LengthMismatch { .. })
    ));
    assert!(matches!(
        a.slice(5..11),
        Err(DeviceError::InvalidShape { .. })
    ));
    assert!(matches!(
        a.slice(11..),
        Err(DeviceError::InvalidShape { .. })
    ));
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = a.slice(6..5);
    assert!(matches!(backwards, Err(DeviceError::InvalidShape { .. })));
    assert!(matches!(
        a.slice(2..8)?.slice(..7),
        Err(DeviceError::InvalidShape { .. })
    ));
    let pinned = PinnedBuffer::<u32>::new(&device, 3)?;
    assert!(matches!(
        pinned.copy_to_device(&s, a.view()),
        Err(DeviceError::LengthMismatch { .. })
    ));
    assert_eq!(a.to_host_vec(&s)?, vec![0; 10]);
    assert_stream_usable(&s)
}

/// Uses objects of `a` on a stream of `b` and checks that each use is a device mismatch.
fn assert_device_mismatches(a: &Device, b: &Device) -> Result<(), DeviceError> {
    let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    let on_a = DeviceBuffer::from_host(&sa, &[1.0f32, 2.0, 3.0, 4.0])?;
    let on_b = DeviceBuffer::from_host(&sb, &[5.0f32, 6.0, 7.0, 8.0])?;
    sa.synchronize()?;
    sb.synchronize()?;
    let mismatch = |what: &str, r: Result<(), DeviceError>| {
        assert!(
            matches!(r, Err(DeviceError::DeviceMismatch { .. })),
            "{what} with objects of {a} on {b}: {r:?}"
        );
    };
    mismatch(
        "Kernel::launch",
        add_one().launch(
            &sb,
            LaunchConfig::linear(1, 4),
            KernelArgs::new().output(&on_a).scalar(4u32),
        ),
    );
    mismatch("copy_from (source)", on_b.copy_from(&sb, &on_a));
    mismatch("copy_from (stream)", on_a.copy_from(&sb, &on_a));
    mismatch("copy_from_host", on_a.copy_from_host(&sb, &[0.0; 4]));
    mismatch("to_host_vec", on_a.to_host_vec(&sb).map(drop));
    mismatch("fill_bytes", on_a.view().fill_bytes(&sb, POISON));
    // Waiting for another device's event is not a mismatch: streams of different devices
    // (and backends) may order themselves after each other.
    sb.wait_event(&sa.record_event()?)?;
    // Page-locked memory serves every device of its backend; another backend's is a mismatch.
    if a.kind() != b.kind() {
        let pinned = PinnedBuffer::<f32>::new(a, 4)?;
        mismatch(
            "PinnedBuffer::copy_to_device",
            pinned.copy_to_device(&sb, on_b.view()).map(drop),
        );
    }
    sa.begin_capture()?;
    add_one().launch(
        &sa,
        LaunchConfig::linear(1, 4),
        KernelArgs::new().output(&on_a).scalar(4u32),
    )?;
    let exec = sa.end_capture()?.instantiate()?;
    mismatch("GraphExec::launch", exec.launch(&sb));
    // Nothing ran, and both devices still work.
    assert_eq!(on_a.to_host_vec(&sa)?, vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(on_b.to_host_vec(&sb)?, vec![5.0, 6.0, 7.0, 8.0]);
    assert_stream_usable(&sa)?;
    assert_stream_usable(&sb)
}

#[test]
fn objects_of_another_device_are_a_device_mismatch() -> Result<(), DeviceError> {
    let device = device();
    match device.kind() {
        BackendKind::Cuda => {
            let host = Device::host();
            assert_device_mismatches(&host, &device)?;
            assert_device_mismatches(&device, &host)
        }
        _ => match Device::cuda(0) {
            Ok(gpu) => {
                assert_device_mismatches(&gpu, &device)?;
                assert_device_mismatches(&device, &gpu)
            }
            // Without a GPU, a second host device is the other device.
            Err(_) => {
                let other = Device::host_numbered(1);
                assert_ne!(other, device);
                assert_device_mismatches(&other, &device)?;
                assert_device_mismatches(&device, &other)
            }
        },
    }
}

#[test]
fn a_failing_host_impl_reports_from_synchronize_and_the_stream_stays_usable(
) -> Result<(), DeviceError> {
    let s = Device::host().new_stream()?;
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let failing = unsafe {
        Kernel::new(
            "rt_failing",
            r#"extern "C" __global__ void rt_failing() {}"#,
        )
    }
    .with_host(|args| {
        Err(DeviceError::HostKernel {
            kernel: args.kernel_name().to_string(),
            reason: "deliberate failure".into(),
        })
    });
    failing.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new())?;
    let after = s.record_event()?;
    match s.synchronize() {
        Err(DeviceError::HostKernel { kernel, reason }) => {
            assert_eq!(kernel, "rt_failing");
            assert_eq!(reason, "deliberate failure");
        }
        other => panic!("expected the host kernel's error, got {other:?}"),
    }
    // An event recorded after the failure reports it.
    assert!(matches!(
        after.is_complete(),
        Err(DeviceError::HostKernel { .. })
    ));
    assert!(matches!(
        after.synchronize(),
        Err(DeviceError::HostKernel { .. })
    ));
    // The error was reported once; the stream runs new work.
    s.synchronize()?;
    assert_stream_usable(&s)?;

    // A stream that waits on the failed work fails too, rather than hanging or going on.
    let waiter = Device::host().new_stream()?;
    failing.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new())?;
    waiter.wait_event(&s.record_event()?)?;
    assert!(matches!(
        waiter.synchronize(),
        Err(DeviceError::HostKernel { .. })
    ));
    assert!(matches!(
        s.synchronize(),
        Err(DeviceError::HostKernel { .. })
    ));
    assert_stream_usable(&waiter)?;
    assert_stream_usable(&s)
}

#[test]
fn a_panicking_host_impl_reports_from_synchronize_and_the_stream_stays_usable(
) -> Result<(), DeviceError> {
    let s = Device::host().new_stream()?;
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let panicking = unsafe {
        Kernel::new(
            "rt_panicking",
            r#"extern "C" __global__ void rt_panicking() {}"#,
        )
    }
    .with_host(|_| panic!("deliberate panic in a host kernel"));
    // Work before and after the panic still runs in order.
    let flag = DeviceBuffer::<f32>::zeroed(&s, 1)?;
    launch_spin_write(&s, &flag, 5.0, SHORT_SPIN)?;
    panicking.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new())?;
    match s.synchronize() {
        Err(DeviceError::Panicked { message, .. }) => {
            assert!(message.contains("deliberate panic"), "{message}")
        }
        other => panic!("expected Panicked, got {other:?}"),
    }
    assert_eq!(flag.to_host_vec(&s)?, vec![5.0]);
    assert_stream_usable(&s)?;

    // A host function that panics is reported the same way.
    s.enqueue_host_fn(|| panic!("deliberate panic in a host function"))?;
    assert!(matches!(s.synchronize(), Err(DeviceError::Panicked { .. })));
    assert_stream_usable(&s)
}

#[test]
fn a_panicking_host_function_is_reported_by_the_next_synchronization() -> Result<(), DeviceError> {
    let stream = stream();
    stream.enqueue_host_fn(|| panic!("a host function panics"))?;
    match stream.synchronize() {
        Err(DeviceError::Panicked { .. }) => {}
        other => panic!("a panicking host function was swallowed: {other:?}"),
    }
    // Reported once; the stream goes on.
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    stream.enqueue_host_fn(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))?;
    stream.synchronize()?;
    assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
    Ok(())
}

/// A value whose drop panics: what a panic may carry, or a host implementation may own.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("deliberate panic in a drop");
    }
}

/// Synchronizes `s`, expecting the panic of a drop, then checks that the stream runs new work.
fn assert_drop_panic_reported(
    s: &cuflow_runtime::Stream,
    what: &str,
    message_has: &str,
) -> Result<(), DeviceError> {
    let after = s.record_event()?;
    let stream = s.clone();
    match within_a_minute("the stream never finished its work", move || {
        stream.synchronize()
    }) {
        Err(DeviceError::Panicked { message, .. }) => {
            assert!(message.contains(message_has), "{what}: {message}")
        }
        other => panic!("{what}: expected Panicked, got {other:?}"),
    }
    // The event recorded after it completes (with the failure it follows).
    assert!(
        within_a_minute("the stream never finished its work", move || after
            .synchronize())
        .is_err(),
        "{what}: the event after the panic"
    );
    assert_stream_usable(s)
}

#[test]
fn a_panic_while_dropping_a_panic_or_a_host_implementation_is_reported_and_the_stream_goes_on(
) -> Result<(), DeviceError> {
    let s = Device::host().new_stream()?;

    // A host function whose panic carries a value that panics when dropped.
    s.enqueue_host_fn(|| std::panic::panic_any(PanicsWhenDropped))?;
    assert_drop_panic_reported(&s, "a host function's panic payload", "non-string")?;

    // A host kernel that panics the same way.
    let source = r#"extern "C" __global__ void rt_payload() {}"#;
    // SAFETY: the kernel's source touches no memory and has no data race of its own.
    let payload = unsafe { Kernel::new("rt_payload", source) }
        .with_host(|_| std::panic::panic_any(PanicsWhenDropped));
    payload.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new())?;
    assert_drop_panic_reported(&s, "a host kernel's panic payload", "non-string")?;

    // A host kernel that succeeds, owning a value that panics when dropped: the launch in the
    // queue holds the last reference to it (the stream is held until the kernel is dropped),
    // so the stream's worker drops it.
    let (release, gate) = std::sync::mpsc::channel::<()>();
    s.enqueue_host_fn(move || {
        let _ = gate.recv();
    })?;
    let owned = PanicsWhenDropped;
    let source = r#"extern "C" __global__ void rt_owner() {}"#;
    // SAFETY: the kernel's source touches no memory and has no data race of its own.
    let owner = unsafe { Kernel::new("rt_owner", source) }.with_host(move |_| {
        let _ = &owned;
        Ok(())
    });
    owner.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new())?;
    drop(owner);
    release.send(()).expect("the host function waits");
    assert_drop_panic_reported(&s, "a host kernel's implementation", "deliberate panic")?;

    // The same kernel captured into a graph whose replay holds the last reference to it.
    let owned = PanicsWhenDropped;
    let source = r#"extern "C" __global__ void rt_captured_owner() {}"#;
    // SAFETY: the kernel's source touches no memory and has no data race of its own.
    let owner = unsafe { Kernel::new("rt_captured_owner", source) }.with_host(move |_| {
        let _ = &owned;
        Ok(())
    });
    s.begin_capture()?;
    owner.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new())?;
    let graph = s.end_capture()?;
    let exec = graph.instantiate()?;
    let (release, gate) = std::sync::mpsc::channel::<()>();
    s.enqueue_host_fn(move || {
        let _ = gate.recv();
    })?;
    exec.launch(&s)?;
    drop((owner, graph, exec));
    release.send(()).expect("the host function waits");
    assert_drop_panic_reported(&s, "a replayed graph's kernel", "deliberate panic")
}

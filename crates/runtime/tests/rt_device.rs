//! Devices and streams: identity, selection, limits, memory figures, priorities and per-device
//! extension state. Nothing here changes `CUFLOW_DEVICE` (see `rt_auto_selector.rs`).

use std::sync::Arc;

use cuflow_runtime::{
    BackendKind, Device, DeviceBuffer, DeviceError, Event, Graph, GraphExec, Kernel, PinnedBuffer,
    Stream,
};
use cuflow_testing::device::device;

#[test]
fn the_host_device_is_one_per_process() {
    let (a, b) = (Device::host(), Device::host());
    assert_eq!(a, b);
    assert_eq!(a.id(), b.id());
    assert_eq!(a.kind(), BackendKind::Host);
    assert_eq!(a.ordinal(), None);
    assert_eq!(a.compute_capability(), None);
    assert_eq!(a.to_string(), "host");
    assert!(a.name().starts_with("host"), "{}", a.name());
    let from_thread = std::thread::spawn(Device::host)
        .join()
        .expect("thread panicked");
    assert_eq!(from_thread, a, "the host device is shared by every thread");
}

#[test]
fn auto_gives_the_device_cuflow_device_names() {
    let device = device();
    match std::env::var("CUFLOW_DEVICE")
        .ok()
        .as_deref()
        .map(str::trim)
    {
        Some("host") | Some("cpu") => assert_eq!(device.kind(), BackendKind::Host),
        Some(sel) if sel.starts_with("cuda") || sel == "gpu" => {
            assert_eq!(device.kind(), BackendKind::Cuda, "CUFLOW_DEVICE={sel}");
            let want = sel
                .strip_prefix("cuda:")
                .map(|n| n.parse::<usize>().expect("a numeric ordinal"))
                .unwrap_or(0);
            assert_eq!(device.ordinal(), Some(want));
        }
        Some(other) => panic!("Device::auto() accepted CUFLOW_DEVICE={other:?}"),
        // Unset: CUDA device 0 when it can be opened, else the host.
        None => match Device::cuda(0) {
            Ok(gpu) => assert_eq!(device, gpu),
            Err(_) => assert_eq!(device, Device::host()),
        },
    }
    assert_eq!(Device::auto().expect("auto"), device, "auto is stable");
}

#[test]
fn selectors_name_devices_or_are_refused() {
    for sel in ["host", "cpu", " host "] {
        assert_eq!(
            Device::from_selector(sel).expect("host selector"),
            Device::host(),
            "{sel:?}"
        );
    }
    // Host devices by number, as they print themselves.
    for n in [0, 1, 7] {
        let d = Device::host_numbered(n);
        assert_eq!(
            Device::from_selector(&format!("host:{n}")).expect("host:N"),
            d
        );
        assert_eq!(Device::from_selector(&d.to_string()).expect("printed"), d);
    }
    for sel in [
        "bogus", "", "cuda:", "cuda:x", "cuda:-1", "host:", "host:x", "host:-1", "cpu:1", "CUDA0",
    ] {
        match Device::from_selector(sel) {
            Err(DeviceError::BadDeviceSelector { value }) => {
                assert_eq!(value, sel);
                let msg = DeviceError::BadDeviceSelector { value }.to_string();
                assert!(
                    msg.contains("CUFLOW_DEVICE")
                        && msg.contains("cuda:N")
                        && msg.contains("host:N"),
                    "{msg}"
                );
            }
            other => panic!("{sel:?}: expected BadDeviceSelector, got {other:?}"),
        }
    }
    // A well-formed selector of a device that is not there is that device's error, not a
    // fallback.
    assert!(matches!(
        Device::from_selector("cuda:4096"),
        Err(DeviceError::NoDriver { .. } | DeviceError::NoDevice { .. })
    ));
    if let Ok(gpu) = Device::cuda(0) {
        assert_eq!(Device::from_selector("cuda").expect("cuda"), gpu);
        assert_eq!(Device::from_selector("cuda:0").expect("cuda:0"), gpu);
    }
}

#[test]
fn limits_and_memory_figures_are_sane() -> Result<(), DeviceError> {
    let device = device();
    let l = device.limits();
    assert!(l.max_threads_per_block >= 32);
    assert!(l.max_block_dim.iter().all(|d| *d >= 1));
    assert!(l.max_block_dim[0] <= l.max_threads_per_block);
    assert!(l.max_grid_dim.iter().all(|d| *d >= 1));
    assert!(l.max_shared_mem_per_block <= l.max_shared_mem_per_block_optin);
    assert!(l.multiprocessor_count >= 1);
    assert_eq!(l.warp_size, 32);
    let info = device.memory_info()?;
    assert!(info.total > 0, "{info:?}");
    assert!(info.free <= info.total, "{info:?}");
    if device.kind() == BackendKind::Cuda {
        assert!(device.ordinal().is_some());
        assert!(device
            .compute_capability()
            .is_some_and(|(major, _)| major >= 5));
        assert!(device.to_string().starts_with("cuda:"));
    }
    Ok(())
}

#[test]
fn streams_belong_to_their_device_and_have_distinct_ids() -> Result<(), DeviceError> {
    let device = device();
    let streams: Vec<Stream> = (0..4)
        .map(|_| device.new_stream())
        .collect::<Result<_, _>>()?;
    for (i, s) in streams.iter().enumerate() {
        assert_eq!(s.device(), &device);
        assert!(!s.is_capturing());
        for (j, t) in streams.iter().enumerate() {
            assert_eq!(i == j, s.id() == t.id());
            assert_eq!(i == j, s == t);
            assert_eq!(i == j, s.same(t));
        }
    }
    let clone = streams[0].clone();
    assert!(clone.same(&streams[0]), "clones share the queue");
    let buf = DeviceBuffer::from_host(&clone, &[9u16, 8, 7])?;
    assert_eq!(buf.device(), &device);
    assert_eq!(buf.to_host_vec(&streams[0])?, vec![9, 8, 7]);
    Ok(())
}

#[test]
fn stream_priorities_are_clamped_to_the_devices_range() -> Result<(), DeviceError> {
    let device = device();
    let (least, greatest) = device.stream_priority_range()?;
    assert!(greatest <= least, "greatest priority is numerically lowest");
    assert_eq!(device.new_stream()?.priority(), 0);
    let (lo, hi) = (greatest, least);
    for p in [least, greatest, (least + greatest) / 2] {
        assert_eq!(device.new_stream_with_priority(p)?.priority(), p);
    }
    assert_eq!(
        device.new_stream_with_priority(greatest - 100)?.priority(),
        lo
    );
    assert_eq!(device.new_stream_with_priority(least + 100)?.priority(), hi);
    // A high-priority stream runs work like any other.
    let s = device.new_stream_with_priority(greatest)?;
    let buf = DeviceBuffer::from_host(&s, &[1.0f64, -2.0])?;
    assert_eq!(buf.to_host_vec(&s)?, vec![1.0, -2.0]);
    Ok(())
}

#[test]
fn extensions_hold_one_value_per_type_per_device() {
    struct Counter(std::sync::atomic::AtomicUsize);
    let device = device();
    let a = device.extension(|| Counter(std::sync::atomic::AtomicUsize::new(0)));
    let b = device.extension::<Counter>(|| panic!("initialized twice"));
    assert!(Arc::ptr_eq(&a, &b));
    a.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(b.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    let other = device.extension(|| String::from("a second type"));
    assert_eq!(other.as_str(), "a second type");
}

#[test]
fn an_extension_whose_init_asks_for_another_extension_is_made() {
    #[derive(Debug, PartialEq)]
    struct Outer(u32);
    #[derive(Debug, PartialEq)]
    struct Inner(u32);
    let device = device();
    let outer = cuflow_testing::thread::within_a_minute(
        "an extension's init asking for another extension of its device hung",
        move || {
            let inner_device = device.clone();
            device.extension(move || Outer(inner_device.extension(|| Inner(7)).0 + 1))
        },
    );
    assert_eq!(*outer, Outer(8));
}

#[test]
fn runtime_handles_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<Stream>();
    send_sync::<Event>();
    send_sync::<DeviceBuffer<f32>>();
    send_sync::<PinnedBuffer<f32>>();
    send_sync::<Kernel>();
    send_sync::<Graph>();
    send_sync::<GraphExec>();
    send_sync::<DeviceError>();

    // A stream made on one thread runs work enqueued from another.
    let device = device();
    let s = device.new_stream().expect("stream");
    let moved = s.clone();
    let buf = std::thread::spawn(move || DeviceBuffer::from_host(&moved, &[3i32, 1, 4]))
        .join()
        .expect("thread panicked")
        .expect("copy");
    assert_eq!(buf.to_host_vec(&s).expect("read"), vec![3, 1, 4]);
}

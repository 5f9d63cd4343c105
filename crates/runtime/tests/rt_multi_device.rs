//! Several devices: copies between them (peer, staged, host <-> CUDA), their ordering after
//! pending work, frees after copies, event waits across devices, and the errors of mixing them.
//!
//! The devices are those of `Device::auto()`'s backend: every visible CUDA device under CUDA,
//! and two host devices (`Device::host()` and `Device::host_numbered(1)`) on the host backend.
//! Tests that need two devices skip with a message when fewer are visible, or fail when
//! `CUFLOW_MIN_DEVICES` asks for more than are visible.

use cuflow_runtime::{BackendKind, BufferView, Device, DeviceBuffer, DeviceError, Stream};
use cuflow_testing::device::device_pair;
use cuflow_testing::device::pairs;
use cuflow_testing::{
    device::{device, devices, two_devices},
    kernels::{host_spin_duration, launch_spin_write, LONG_SPIN},
    rng::{random_f32, rng},
    ODD_SIZES, POISON, POISON_U32,
};
use rand::Rng;

/// Copies `src` into `dst` (of `stream`'s device) from another device: staged through host
/// memory, or directly (peer to peer where the devices allow it).
fn copy_across(
    dst: BufferView<'_, f32>,
    stream: &Stream,
    src: BufferView<'_, f32>,
    staged: bool,
) -> Result<(), DeviceError> {
    if staged {
        dst.copy_from_device_staged(stream, src)
    } else {
        dst.copy_from_device(stream, src)
    }
}

/// Polls until `later` completes, checking that `earlier` had completed by then: `later` was
/// recorded after a wait on `earlier`, on another stream.
fn assert_ordered(
    earlier: &cuflow_runtime::Event,
    later: &cuflow_runtime::Event,
    what: &str,
) -> Result<(), DeviceError> {
    // `later` first: once it is complete, `earlier` must be too.
    while !later.is_complete()? {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(earlier.is_complete()?, "{what}: the wait did not hold");
    Ok(())
}

#[test]
fn host_devices_are_distinct_and_stable() {
    let (a, b) = (Device::host(), Device::host_numbered(1));
    assert_ne!(a, b);
    assert_ne!(a.id(), b.id());
    assert_eq!(Device::host_numbered(0), a);
    assert_eq!(Device::host_numbered(1), b);
    assert_eq!(b.kind(), BackendKind::Host);
    assert_eq!(
        (a.to_string(), b.to_string()),
        ("host".into(), "host:1".into())
    );
    assert!(b.name().starts_with("host:1"), "{}", b.name());
}

#[test]
fn peer_access_is_reported() -> Result<(), DeviceError> {
    for d in devices() {
        assert!(d.can_access_peer(&d)?, "{d} must reach its own memory");
    }
    assert!(Device::host().can_access_peer(&Device::host_numbered(1))?);
    if let Some(devices) = two_devices() {
        for (a, b) in pairs(&devices) {
            eprintln!("{a} reads {b} directly: {}", a.can_access_peer(&b)?);
        }
    }
    Ok(())
}

#[test]
fn copies_between_devices_of_odd_sizes_are_exact() -> Result<(), DeviceError> {
    let Some(devices) = two_devices() else {
        return Ok(());
    };
    let mut rng = rng();
    for (a, b) in pairs(&devices) {
        let (sa, sb) = (a.new_stream()?, b.new_stream()?);
        for n in ODD_SIZES {
            let values = random_f32(&mut rng, n);
            let src = DeviceBuffer::from_host(&sa, &values)?;
            let direct = DeviceBuffer::<f32>::alloc(&sb, n)?;
            let staged = DeviceBuffer::<f32>::alloc(&sb, n)?;
            direct.view().fill_bytes(&sb, POISON)?;
            staged.view().fill_bytes(&sb, POISON)?;
            direct.copy_from_device(&sb, &src)?;
            staged.copy_from_device_staged(&sb, &src)?;
            assert!(
                direct.to_host_vec(&sb)? == values,
                "{n} floats copied from {a} to {b} differ"
            );
            assert!(
                staged.to_host_vec(&sb)? == values,
                "{n} floats copied from {a} to {b} through host memory differ"
            );
        }
    }
    Ok(())
}

#[test]
fn copies_between_views_of_two_devices_touch_only_the_view() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    let mut rng = rng();
    // Larger than one staging buffer, with offsets that are not multiples of anything.
    let n = (20 << 20) / 4 + 13;
    let values = random_f32(&mut rng, n);
    let src = DeviceBuffer::from_host(&sa, &values)?;
    for staged in [false, true] {
        let dst = DeviceBuffer::<f32>::alloc(&sb, n + 10)?;
        dst.view().fill_bytes(&sb, POISON)?;
        let (from, to) = (src.slice(3..n - 4)?, dst.slice(7..n)?);
        copy_across(to, &sb, from, staged)?;
        let got = dst.to_host_vec(&sb)?;
        assert!(got[..7].iter().all(|v| v.to_bits() == POISON_U32));
        assert!(got[n..].iter().all(|v| v.to_bits() == POISON_U32));
        assert!(got[7..n] == values[3..n - 4], "staged: {staged}");
    }
    Ok(())
}

#[test]
fn a_copy_waits_for_pending_work_on_its_source() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let mut rng = rng();
    for staged in [false, true] {
        let (sa, sb) = (a.new_stream()?, b.new_stream()?);
        let value: f32 = rng.gen_range(1.0..2.0);
        let values = random_f32(&mut rng, 4097);
        let src = DeviceBuffer::<f32>::alloc(&sa, 4097)?;
        let flag = DeviceBuffer::<f32>::alloc(&sa, 1)?;
        src.view().fill_bytes(&sa, POISON)?;
        flag.view().fill_bytes(&sa, POISON)?;
        let dst = DeviceBuffer::<f32>::alloc(&sb, 4098)?;
        sa.synchronize()?;
        sb.synchronize()?;

        // A long kernel, then the data: a copy that did not wait would read the poison.
        launch_spin_write(&sa, &flag, value, LONG_SPIN)?;
        src.copy_from_host(&sa, &values)?;
        let (data, tail) = (dst.slice(..4097)?, dst.slice(4097..)?);
        copy_across(data, &sb, src.view(), staged)?;
        copy_across(tail, &sb, flag.view(), staged)?;
        let got = dst.to_host_vec(&sb)?;
        assert!(
            got[..4097] == values[..],
            "the copy to {b} read the source before {a} wrote it (staged: {staged})"
        );
        assert_eq!(
            got[4097], value,
            "the copy ran before the long kernel ended"
        );
    }
    Ok(())
}

#[test]
fn a_copy_waits_for_earlier_reads_of_its_destination() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let (sa, sb, sb2) = (a.new_stream()?, b.new_stream()?, b.new_stream()?);
    let mut rng = rng();
    let (old, new) = (random_f32(&mut rng, 1000), random_f32(&mut rng, 1000));
    let dst = DeviceBuffer::from_host(&sb, &old)?;
    let snapshot = DeviceBuffer::<f32>::alloc(&sb2, 1000)?;
    let src = DeviceBuffer::from_host(&sa, &new)?;
    sa.synchronize()?;
    sb.synchronize()?;
    // sb2 reads `dst` after a long host function; the copy into `dst` must not overtake it.
    sb2.wait_event(&sb.record_event()?)?;
    sb2.enqueue_host_fn(|| std::thread::sleep(host_spin_duration(LONG_SPIN)))?;
    snapshot.copy_from(&sb2, &dst)?;
    dst.copy_from_device(&sb, &src)?;
    assert!(
        snapshot.to_host_vec(&sb2)? == old,
        "the copy overwrote data still being read"
    );
    assert!(dst.to_host_vec(&sb)? == new);
    Ok(())
}

#[test]
fn dropping_both_buffers_after_a_copy_is_safe() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    a.synchronize()?;
    b.synchronize()?;
    let mut rng = rng();
    let values = random_f32(&mut rng, (1 << 20) + 3);
    let keep = DeviceBuffer::<f32>::alloc(&sb, values.len())?;
    for staged in [false, true] {
        let src = DeviceBuffer::from_host(&sa, &values)?;
        let mid = DeviceBuffer::<f32>::alloc(&sb, values.len())?;
        copy_across(mid.view(), &sb, src.view(), staged)?;
        drop(src);
        keep.copy_from(&sb, &mid)?;
        drop(mid);
        assert!(keep.to_host_vec(&sb)? == values, "staged: {staged}");
    }
    drop(keep);
    a.synchronize()?;
    b.synchronize()?;
    Ok(())
}

#[test]
fn streams_wait_for_events_of_other_devices() -> Result<(), DeviceError> {
    let Some(devices) = two_devices() else {
        return Ok(());
    };
    for (a, b) in pairs(&devices) {
        let (sa, sb) = (a.new_stream()?, b.new_stream()?);
        let value = 7.5f32;
        let flag = DeviceBuffer::<f32>::zeroed(&sa, 1)?;
        let out = DeviceBuffer::<f32>::zeroed(&sb, 1)?;
        sa.synchronize()?;
        sb.synchronize()?;
        launch_spin_write(&sa, &flag, value, LONG_SPIN)?;
        let written = sa.record_event()?;
        sb.wait_event(&written)?;
        assert_ordered(
            &written,
            &sb.record_event()?,
            &format!("{b} waiting on {a}"),
        )?;
        out.copy_from_device(&sb, &flag)?;
        assert_eq!(out.to_host_vec(&sb)?, vec![value]);
    }
    Ok(())
}

#[test]
fn mixing_devices_is_a_clear_error() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    let on_a = DeviceBuffer::from_host(&sa, &[1.0f32, 2.0])?;
    let on_b = DeviceBuffer::<f32>::alloc(&sb, 2)?;
    // The stream must be of the destination's device.
    match on_b.copy_from_device(&sa, &on_a) {
        Err(DeviceError::DeviceMismatch {
            op,
            what,
            expected,
            found,
            expected_name,
            found_name,
        }) => {
            assert_eq!((op, what.as_str()), ("copy_from_device", "the destination"));
            assert_eq!((expected, found), (a.id(), b.id()));
            assert_eq!((expected_name, found_name), (a.to_string(), b.to_string()));
        }
        other => panic!("a stream of the source's device was accepted: {other:?}"),
    }
    // Same-device copies refuse another device's buffer, and say how to move it.
    let err = on_b
        .copy_from(&sb, &on_a)
        .expect_err("a copy across devices");
    let text = err.to_string();
    assert!(matches!(err, DeviceError::DeviceMismatch { .. }), "{err}");
    assert!(
        text.contains(&a.to_string()) && text.contains(&b.to_string()),
        "{text}"
    );
    assert!(text.contains("to_device"), "{text}");
    // Lengths must agree.
    let short = DeviceBuffer::<f32>::alloc(&sb, 1)?;
    assert!(matches!(
        short.copy_from_device(&sb, &on_a),
        Err(DeviceError::LengthMismatch {
            expected: 1,
            found: 2,
            ..
        })
    ));
    Ok(())
}

#[test]
fn a_capture_refuses_copies_between_devices() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    let src = DeviceBuffer::from_host(&sa, &[1.0f32; 8])?;
    let dst = DeviceBuffer::<f32>::zeroed(&sb, 8)?;
    sa.synchronize()?;
    sb.synchronize()?;
    sb.begin_capture()?;
    let result = dst.copy_from_device(&sb, &src);
    let ended = sb.end_capture();
    assert!(
        matches!(result, Err(DeviceError::Capture { .. })),
        "{result:?}"
    );
    assert!(ended.is_err(), "the refused copy must fail the capture");
    // The stream is usable afterwards.
    dst.copy_from_device(&sb, &src)?;
    assert_eq!(dst.to_host_vec(&sb)?, vec![1.0; 8]);
    Ok(())
}

#[test]
fn copies_between_host_and_cuda_devices() -> Result<(), DeviceError> {
    if device().kind() != BackendKind::Cuda {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: needs a CUDA device (run with CUFLOW_DEVICE=cuda)"
        );
        return Ok(());
    }
    let host = Device::host();
    let mut rng = rng();
    for gpu in devices() {
        let (sh, sg) = (host.new_stream()?, gpu.new_stream()?);
        assert!(!gpu.can_access_peer(&host)? && !host.can_access_peer(&gpu)?);
        for n in ODD_SIZES {
            let values = random_f32(&mut rng, n);
            // Host work still pending on the source must land before the copy reads it.
            let on_host = DeviceBuffer::<f32>::alloc(&sh, n)?;
            sh.enqueue_host_fn(|| std::thread::sleep(host_spin_duration(LONG_SPIN / 10)))?;
            on_host.copy_from_host(&sh, &values)?;
            let on_gpu = DeviceBuffer::<f32>::alloc(&sg, n)?;
            on_gpu.copy_from_device(&sg, &on_host)?;
            let back = DeviceBuffer::<f32>::alloc(&sh, n)?;
            back.copy_from_device(&sh, &on_gpu)?;
            assert!(
                on_gpu.to_host_vec(&sg)? == values,
                "{n} floats host -> {gpu}"
            );
            assert!(back.to_host_vec(&sh)? == values, "{n} floats {gpu} -> host");
        }
        // Event waits across the two backends.
        let flag = DeviceBuffer::<f32>::zeroed(&sg, 1)?;
        launch_spin_write(&sg, &flag, 3.0, LONG_SPIN)?;
        let done = sg.record_event()?;
        sh.wait_event(&done)?;
        assert_ordered(&done, &sh.record_event()?, "the host waiting on a GPU")?;
        sh.enqueue_host_fn(|| std::thread::sleep(host_spin_duration(LONG_SPIN)))?;
        let slept = sh.record_event()?;
        sg.wait_event(&slept)?;
        assert_ordered(&slept, &sg.record_event()?, "a GPU waiting on the host")?;
    }
    Ok(())
}

/// The time between events of two devices is refused with a device mismatch on every
/// backend (CUDA's `cuEventElapsedTime` refuses events of different contexts); events of one
/// device, also of two of its streams, are timed.
#[test]
fn elapsed_time_between_events_of_two_devices_is_a_device_mismatch() -> Result<(), DeviceError> {
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    let start = sa.record_timed_event()?;
    let end = sb.record_timed_event()?;
    start.synchronize()?;
    end.synchronize()?;
    for (from, to, found) in [(&start, &end, &b), (&end, &start, &a)] {
        match from.elapsed_ms(to) {
            Err(DeviceError::DeviceMismatch { op, found: got, .. }) => {
                assert_eq!(op, "Event::elapsed_ms");
                assert_eq!(got, found.id());
            }
            other => panic!("elapsed time across devices: {other:?}"),
        }
    }
    let sa2 = a.new_stream()?;
    let later = sa2.record_timed_event()?;
    later.synchronize()?;
    assert!(start.elapsed_ms(&later)?.is_finite());
    Ok(())
}

//! Copies: host to device and back, sub-views, device to device, fills and pinned buffers, on
//! the device that `Device::auto()` gives.

use cuflow_runtime::{DeviceBuffer, DeviceCopy, DeviceError, PinnedBuffer, Stream};
use cuflow_testing::{
    device::{device, stream},
    rng::{random_f32, random_vec, rng},
    ODD_SIZES, POISON, POISON_U32,
};
use rand::distributions::{Distribution, Standard};
use rand::rngs::StdRng;
use rand::Rng;

fn round_trip<T>(stream: &Stream, rng: &mut StdRng, n: usize) -> Result<(), DeviceError>
where
    T: DeviceCopy + PartialEq + std::fmt::Debug,
    Standard: Distribution<T>,
{
    let data: Vec<T> = random_vec(rng, n);
    let buf = DeviceBuffer::from_host(stream, &data)?;
    assert_eq!(buf.len(), n);
    let back = buf.to_host_vec(stream)?;
    assert!(
        back == data,
        "{n} elements of {} did not round-trip",
        std::any::type_name::<T>()
    );
    // Overwriting with fresh data replaces every element.
    let fresh: Vec<T> = random_vec(rng, n);
    buf.copy_from_host(stream, &fresh)?;
    let mut out = vec![T::zeroed(); n];
    buf.view().copy_to_host(stream, &mut out)?;
    assert!(
        out == fresh,
        "{n} elements of {} were not overwritten",
        std::any::type_name::<T>()
    );
    Ok(())
}

#[test]
fn random_data_of_odd_sizes_round_trips() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = rng();
    for n in ODD_SIZES {
        round_trip::<f32>(&stream, &mut rng, n)?;
        round_trip::<u8>(&stream, &mut rng, n)?;
        round_trip::<f64>(&stream, &mut rng, n)?;
        round_trip::<i64>(&stream, &mut rng, n)?;
    }
    Ok(())
}

/// Copies to and from the host on both sides of the sizes where CUDA's staging changes (page-
/// locked buffers of the device's of at least 64 KiB and at most 16 MiB each, several for a
/// larger copy), and read-backs from several threads at once sharing the buffers, land every
/// byte, into destinations poisoned before.
#[test]
fn copies_on_both_sides_of_every_read_back_size_class_land_every_byte() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = rng();
    let mib = 1 << 20;
    for bytes in [
        4,
        16 << 10,
        (16 << 10) + 4,
        (64 << 10) + 4,
        16 * mib - 4,
        16 * mib,
        16 * mib + 4,
        40 * mib + 12,
    ] {
        let data: Vec<u32> = random_vec(&mut rng, bytes / 4);
        let buf = DeviceBuffer::from_host(&stream, &data)?;
        let mut back = vec![POISON_U32; data.len()];
        buf.view().copy_to_host(&stream, &mut back)?;
        assert!(back == data, "a round trip of {bytes} bytes");
        // A sub-view at an odd offset reads and writes its own range.
        let view = buf.slice(1..data.len())?;
        let mut back = vec![POISON_U32; data.len() - 1];
        view.copy_to_host(&stream, &mut back)?;
        assert!(
            back == data[1..],
            "a read-back of {} bytes at offset 4",
            bytes - 4
        );
        let fresh: Vec<u32> = random_vec(&mut rng, data.len() - 1);
        view.copy_from_host(&stream, &fresh)?;
        let all = buf.to_host_vec(&stream)?;
        assert!(
            all[0] == data[0] && all[1..] == fresh[..],
            "a write of {} bytes at offset 4",
            bytes - 4
        );
    }
    let buffers: Vec<(Vec<u32>, DeviceBuffer<u32>)> = (0..8)
        .map(|i| {
            let data: Vec<u32> = random_vec(&mut rng, 1000 + 997 * i);
            let buf = DeviceBuffer::from_host(&stream, &data)?;
            Ok((data, buf))
        })
        .collect::<Result<_, DeviceError>>()?;
    stream.synchronize()?;
    std::thread::scope(|s| {
        for (data, buf) in &buffers {
            s.spawn(move || {
                let own = buf.device().new_stream().expect("a stream");
                for _ in 0..20 {
                    assert!(buf.to_host_vec(&own).expect("read back") == *data);
                }
            });
        }
    });
    Ok(())
}

#[test]
fn empty_buffers_and_views_copy_nothing() -> Result<(), DeviceError> {
    let stream = stream();
    let empty = DeviceBuffer::<f32>::from_host(&stream, &[])?;
    assert!(empty.is_empty());
    assert_eq!(empty.to_host_vec(&stream)?, Vec::<f32>::new());
    let buf = DeviceBuffer::from_host(&stream, &[1.5f32, 2.5, 3.5])?;
    let none = buf.slice(1..1)?;
    assert!(none.is_empty());
    none.copy_from_host(&stream, &[])?;
    none.fill_bytes(&stream, POISON)?;
    assert_eq!(buf.to_host_vec(&stream)?, vec![1.5, 2.5, 3.5]);
    Ok(())
}

/// Checks every element of `got`: `inside` where `range` is, the poison elsewhere.
#[track_caller]
fn assert_patched(got: &[u32], range: std::ops::Range<usize>, inside: &[u32]) {
    for (i, v) in got.iter().enumerate() {
        if range.contains(&i) {
            assert_eq!(*v, inside[i - range.start], "element {i} inside {range:?}");
        } else {
            assert_eq!(*v, POISON_U32, "element {i} outside {range:?} was touched");
        }
    }
}

#[test]
fn sub_view_copies_land_at_their_offset_and_leave_the_rest_untouched() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = rng();
    let n = 4097;
    let buf = DeviceBuffer::<u32>::alloc(&stream, n)?;
    for _ in 0..8 {
        let start = rng.gen_range(0..n);
        let len = rng.gen_range(0..=n - start);
        buf.view().fill_bytes(&stream, POISON)?;
        let patch: Vec<u32> = random_vec(&mut rng, len);
        let view = buf.slice(start..start + len)?;
        assert_eq!((view.offset(), view.len()), (start, len));
        view.copy_from_host(&stream, &patch)?;
        assert_patched(&buf.to_host_vec(&stream)?, start..start + len, &patch);
        // Reading the view gives exactly its range.
        assert_eq!(view.to_host_vec(&stream)?, patch);
    }

    // A view of a view offsets from the inner view's start.
    buf.view().fill_bytes(&stream, POISON)?;
    let outer = buf.slice(1000..3000)?;
    let inner = outer.slice(17..=33)?;
    assert_eq!((inner.offset(), inner.len()), (1017, 17));
    let patch: Vec<u32> = random_vec(&mut rng, 17);
    inner.copy_from_host(&stream, &patch)?;
    assert_patched(&buf.to_host_vec(&stream)?, 1017..1034, &patch);
    assert_eq!(outer.slice(17..34)?.to_host_vec(&stream)?, patch);

    // Byte buffers at odd offsets.
    let bytes = DeviceBuffer::<u8>::alloc(&stream, 1001)?;
    bytes.view().fill_bytes(&stream, POISON)?;
    let patch: Vec<u8> = random_vec(&mut rng, 333);
    bytes.slice(3..336)?.copy_from_host(&stream, &patch)?;
    let got = bytes.to_host_vec(&stream)?;
    assert!(got[..3].iter().all(|b| *b == POISON));
    assert_eq!(&got[3..336], &patch[..]);
    assert!(got[336..].iter().all(|b| *b == POISON));
    Ok(())
}

#[test]
fn device_to_device_copies_copy_exactly_their_range() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = rng();
    for n in ODD_SIZES {
        let data: Vec<i64> = random_vec(&mut rng, n);
        let src = DeviceBuffer::from_host(&stream, &data)?;
        let dst = DeviceBuffer::<i64>::alloc(&stream, n)?;
        dst.view().fill_bytes(&stream, POISON)?;
        dst.copy_from(&stream, &src)?;
        assert!(dst.to_host_vec(&stream)? == data, "{n} elements");
        assert!(src.to_host_vec(&stream)? == data, "the source changed");
    }

    // Between sub-views of two buffers.
    let n = 1000;
    let data: Vec<u32> = random_vec(&mut rng, n);
    let src = DeviceBuffer::from_host(&stream, &data)?;
    let dst = DeviceBuffer::<u32>::alloc(&stream, n)?;
    dst.view().fill_bytes(&stream, POISON)?;
    dst.slice(500..700)?
        .copy_from(&stream, src.slice(123..323)?)?;
    assert_patched(&dst.to_host_vec(&stream)?, 500..700, &data[123..323]);

    // Between disjoint ranges of one buffer.
    let buf = DeviceBuffer::from_host(&stream, &data)?;
    buf.slice(600..900)?
        .copy_from(&stream, buf.slice(7..307)?)?;
    let got = buf.to_host_vec(&stream)?;
    assert_eq!(&got[..600], &data[..600]);
    assert_eq!(&got[600..900], &data[7..307]);
    assert_eq!(&got[900..], &data[900..]);
    Ok(())
}

#[test]
fn fill_bytes_sets_every_byte_of_its_view() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = rng();
    let n = 4097;
    let data: Vec<u32> = random_vec(&mut rng, n);
    let buf = DeviceBuffer::from_host(&stream, &data)?;
    buf.slice(10..4000)?.fill_bytes(&stream, 0x5A)?;
    let got = buf.to_host_vec(&stream)?;
    assert_eq!(&got[..10], &data[..10]);
    assert!(got[10..4000].iter().all(|v| *v == 0x5A5A_5A5A));
    assert_eq!(&got[4000..], &data[4000..]);
    buf.view().fill_bytes(&stream, 0)?;
    assert_eq!(buf.to_host_vec(&stream)?, vec![0u32; n]);
    Ok(())
}

#[test]
fn zeroed_buffers_are_zero_even_over_reused_memory() -> Result<(), DeviceError> {
    let stream = stream();
    for n in ODD_SIZES {
        // Leave poison behind for the allocator to hand out again.
        let dirty = DeviceBuffer::<u8>::alloc(&stream, n)?;
        dirty.view().fill_bytes(&stream, POISON)?;
        drop(dirty);
        let zeroed = DeviceBuffer::<u8>::zeroed(&stream, n)?;
        assert!(
            zeroed.to_host_vec(&stream)?.iter().all(|b| *b == 0),
            "{n} bytes"
        );
    }
    Ok(())
}

#[test]
fn pinned_buffers_round_trip_through_the_device() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let mut rng = rng();
    for n in [1usize, 4097, (1 << 20) + 3] {
        let data = random_f32(&mut rng, n);
        let mut pinned = PinnedBuffer::<f32>::new(&device, n)?;
        assert_eq!(pinned.len(), n);
        pinned.as_mut_slice().copy_from_slice(&data);

        let dev = DeviceBuffer::<f32>::alloc(&stream, n)?;
        dev.view().fill_bytes(&stream, POISON)?;
        let pinned = pinned.copy_to_device(&stream, dev.view())?.wait()?;
        assert_eq!(&*pinned.as_slice(), &data[..], "the source changed");
        assert_eq!(
            dev.to_host_vec(&stream)?,
            data,
            "{n} elements to the device"
        );

        let mut back = PinnedBuffer::<f32>::new(&device, n)?;
        back.as_mut_slice().fill(f32::from_bits(POISON_U32));
        let transfer = back.copy_from_device(&stream, dev.view())?;
        let back = transfer.wait()?;
        assert_eq!(&*back.as_slice(), &data[..], "{n} elements from the device");
    }

    // To and from sub-views.
    let n = 1000;
    let data = random_f32(&mut rng, 300);
    let dev = DeviceBuffer::<f32>::alloc(&stream, n)?;
    dev.view().fill_bytes(&stream, POISON)?;
    let mut pinned = PinnedBuffer::<f32>::new(&device, 300)?;
    pinned.as_mut_slice().copy_from_slice(&data);
    let pinned = pinned
        .copy_to_device(&stream, dev.slice(401..701)?)?
        .wait()?;
    let got = dev.to_host_vec(&stream)?;
    let poison = f32::from_bits(POISON_U32).to_bits();
    assert!(got[..401].iter().all(|v| v.to_bits() == poison));
    assert_eq!(&got[401..701], &data[..]);
    assert!(got[701..].iter().all(|v| v.to_bits() == poison));
    let mut pinned = pinned;
    pinned.as_mut_slice().fill(0.0);
    let pinned = pinned
        .copy_from_device(&stream, dev.slice(401..701)?)?
        .wait()?;
    assert_eq!(&*pinned.as_slice(), &data[..]);

    // A transfer that is dropped without a wait still finishes before the buffer goes.
    let transfer = pinned.copy_from_device(&stream, dev.slice(0..300)?)?;
    drop(transfer);
    stream.synchronize()?;
    Ok(())
}

#[test]
fn pinned_transfers_of_the_wrong_length_are_refused() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let dev = DeviceBuffer::<u32>::zeroed(&stream, 10)?;
    let pinned = PinnedBuffer::<u32>::new(&device, 11)?;
    assert!(matches!(
        pinned.copy_to_device(&stream, dev.view()),
        Err(DeviceError::LengthMismatch { .. })
    ));
    let pinned = PinnedBuffer::<u32>::new(&device, 9)?;
    assert!(matches!(
        pinned.copy_from_device(&stream, dev.view()),
        Err(DeviceError::LengthMismatch { .. })
    ));
    assert_eq!(dev.to_host_vec(&stream)?, vec![0; 10]);
    Ok(())
}

/// A pinned buffer's prefix lands in a shorter view (inside a poisoned buffer, whose other
/// elements stay poisoned), the buffer coming back whole; a view as long as the buffer takes
/// all of it; a view longer than the buffer is refused with the two lengths, before anything
/// is enqueued.
#[test]
fn a_prefix_of_a_pinned_buffer_lands_in_a_shorter_view() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let mut rng = rng();
    for (len, prefix) in [
        (1usize, 1usize),
        (300, 299),
        (4097, 1),
        ((1 << 20) + 3, 4097),
    ] {
        let data = random_f32(&mut rng, len);
        let mut pinned = PinnedBuffer::<f32>::new(&device, len)?;
        pinned.as_mut_slice().copy_from_slice(&data);
        let dev = DeviceBuffer::<f32>::alloc(&stream, prefix + 10)?;
        dev.view().fill_bytes(&stream, POISON)?;
        let pinned = pinned
            .copy_prefix_to_device(&stream, dev.slice(5..5 + prefix)?)?
            .wait()?;
        assert_eq!(pinned.len(), len);
        assert_eq!(&*pinned.as_slice(), &data[..], "the source changed");
        let got = dev.to_host_vec(&stream)?;
        let poison = f32::from_bits(POISON_U32).to_bits();
        let what = format!("{prefix} of {len} elements");
        assert!(
            got[..5].iter().all(|v| v.to_bits() == poison),
            "{what}: before"
        );
        assert_eq!(&got[5..5 + prefix], &data[..prefix], "{what}");
        assert!(
            got[5 + prefix..].iter().all(|v| v.to_bits() == poison),
            "{what}: after"
        );
    }
    let data: Vec<u32> = random_vec(&mut rng, 9);
    let mut pinned = PinnedBuffer::<u32>::new(&device, 9)?;
    pinned.as_mut_slice().copy_from_slice(&data);
    let dev = DeviceBuffer::<u32>::zeroed(&stream, 10)?;
    let pinned = pinned
        .copy_prefix_to_device(&stream, dev.slice(1..10)?)?
        .wait()?;
    match pinned.copy_prefix_to_device(&stream, dev.view()) {
        Err(DeviceError::LengthMismatch {
            op,
            expected: 9,
            found: 10,
        }) => assert_eq!(op, "PinnedBuffer::copy_prefix_to_device"),
        other => panic!("a view longer than the buffer: {:?}", other.map(|_| ())),
    }
    let mut want = vec![0];
    want.extend(&data);
    assert_eq!(dev.to_host_vec(&stream)?, want);
    Ok(())
}

/// A copy between overlapping ranges of one allocation (through one buffer, or two buffers
/// sharing it by `reinterpret`) is refused before anything is enqueued: its result would
/// depend on the order the driver copies in. A copy of a range onto itself changes nothing.
#[test]
fn copies_between_overlapping_ranges_of_one_allocation_are_refused() -> Result<(), DeviceError> {
    let stream = stream();
    let mut rng = rng();
    let data: Vec<u32> = random_vec(&mut rng, 64);
    let buf = DeviceBuffer::from_host(&stream, &data)?;
    let twin = buf.reinterpret::<u32>()?;
    let bytes = buf.reinterpret::<u8>()?;
    for (what, result) in [
        (
            "one buffer",
            buf.slice(8..24)?.copy_from(&stream, buf.slice(0..16)?),
        ),
        (
            "a reinterpreted twin",
            buf.slice(0..16)?.copy_from(&stream, twin.slice(15..31)?),
        ),
        (
            "bytes of one element",
            bytes.slice(1..5)?.copy_from(&stream, bytes.slice(2..6)?),
        ),
    ] {
        let err = result.expect_err(what);
        assert!(
            matches!(
                err,
                DeviceError::InvalidShape {
                    op: "copy_from",
                    ..
                }
            ),
            "{what}: {err}"
        );
        assert!(err.to_string().contains("overlap"), "{what}: {err}");
    }
    buf.slice(4..20)?.copy_from(&stream, twin.slice(4..20)?)?;
    assert!(buf.to_host_vec(&stream)? == data, "the data changed");
    Ok(())
}

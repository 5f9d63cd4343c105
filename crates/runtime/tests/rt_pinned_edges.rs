//! Pinned buffers at the edges of their element types, on the device that `Device::auto()`
//! gives: an empty buffer of any type is read and written as an empty slice (on CUDA, a
//! zero-length pinned buffer has no allocation), element types aligned to more than 8 bytes
//! are refused when the buffer is made (no backend aligns its storage further), types
//! aligned to 8 bytes round-trip through the device, and so do large buffers (which the CUDA
//! backend maps in huge pages and registers with the driver) of sizes that are not whole huge
//! pages, made and dropped repeatedly.

use cuflow_runtime::{DeviceBuffer, DeviceCopy, DeviceError, PinnedBuffer};
use cuflow_testing::device::{device, stream};

/// Reads and writes an empty pinned buffer of `T`, failing the test (rather than panicking
/// the harness) if either access panics.
fn empty_buffer_reads_and_writes_as_empty<T: DeviceCopy>() -> Result<(), DeviceError> {
    let mut pinned = PinnedBuffer::<T>::new(&device(), 0)?;
    let name = std::any::type_name::<T>();
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pinned.as_slice().len()));
    assert!(
        matches!(read, Ok(0)),
        "PinnedBuffer::<{name}>::as_slice on an empty buffer gave {read:?}"
    );
    let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut slice = pinned.as_mut_slice();
        slice.fill(T::zeroed());
        slice.len()
    }));
    assert!(
        matches!(written, Ok(0)),
        "PinnedBuffer::<{name}>::as_mut_slice on an empty buffer gave {written:?}"
    );
    assert!(pinned.is_empty());
    Ok(())
}

#[test]
fn empty_pinned_buffers_of_every_supported_alignment_can_be_read_and_written(
) -> Result<(), DeviceError> {
    empty_buffer_reads_and_writes_as_empty::<u8>()?;
    empty_buffer_reads_and_writes_as_empty::<u16>()?;
    empty_buffer_reads_and_writes_as_empty::<f32>()?;
    empty_buffer_reads_and_writes_as_empty::<f64>()?;
    empty_buffer_reads_and_writes_as_empty::<[u64; 3]>()?;
    Ok(())
}

/// Asserts that a pinned buffer of `len` elements of `T` (aligned to more than 8 bytes) is
/// refused at `new` with an error naming the type and its alignment, and is never handed out
/// to be read (which could not be done in place).
fn refused_for_its_alignment<T: DeviceCopy>(len: usize) {
    let name = std::any::type_name::<T>();
    let made = PinnedBuffer::<T>::new(&device(), len);
    let read = made.as_ref().ok().map(|p| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.as_slice().len()))
            .map_err(|_| "as_slice panicked")
    });
    match made {
        Err(DeviceError::InvalidShape { op, reason }) => {
            assert_eq!(op, "PinnedBuffer::new");
            let align = std::mem::align_of::<T>();
            assert!(
                reason.contains(name) && reason.contains(&format!("{align}-byte alignment")),
                "the error should name {name} and its alignment: {reason}"
            );
        }
        other => panic!(
            "PinnedBuffer::<{name}>::new(_, {len}) should be refused for its alignment, \
             got {other:?} (reading it: {read:?})"
        ),
    }
}

#[test]
fn pinned_buffers_of_types_aligned_above_8_bytes_are_refused_at_new() {
    for len in [0, 1, 7, 1000] {
        refused_for_its_alignment::<u128>(len);
        refused_for_its_alignment::<i128>(len);
        refused_for_its_alignment::<[u128; 2]>(len);
    }
}

#[test]
fn pinned_buffers_of_8_byte_aligned_types_round_trip() -> Result<(), DeviceError> {
    let device = device();
    let stream = stream();
    for n in [1usize, 3, 17, 1000] {
        let data: Vec<[u64; 3]> = (0..n as u64)
            .map(|i| [i, i.wrapping_mul(0x9e37_79b9_7f4a_7c15), !i])
            .collect();
        let mut pinned = PinnedBuffer::<[u64; 3]>::new(&device, n)?;
        assert_eq!(pinned.as_slice().len(), n);
        pinned.as_mut_slice().copy_from_slice(&data);
        let dev = DeviceBuffer::<[u64; 3]>::zeroed(&stream, n)?;
        let pinned = pinned.copy_to_device(&stream, dev.view())?.wait()?;
        assert_eq!(&*pinned.as_slice(), &data[..], "the source changed");
        assert_eq!(
            dev.to_host_vec(&stream)?,
            data,
            "{n} elements to the device"
        );
        let mut back = PinnedBuffer::<[u64; 3]>::new(&device, n)?;
        back.as_mut_slice().fill([0; 3]);
        let back = back.copy_from_device(&stream, dev.view())?.wait()?;
        assert_eq!(&*back.as_slice(), &data[..], "{n} elements from the device");
    }
    Ok(())
}

#[test]
fn empty_pinned_buffers_copy_to_and_from_an_empty_device_buffer() -> Result<(), DeviceError> {
    let device = device();
    let stream = stream();
    let dev = DeviceBuffer::<f32>::zeroed(&stream, 0)?;
    let pinned = PinnedBuffer::<f32>::new(&device, 0)?;
    let pinned = pinned.copy_to_device(&stream, dev.view())?.wait()?;
    let pinned = pinned.copy_from_device(&stream, dev.view())?.wait()?;
    assert_eq!(pinned.as_slice().len(), 0);
    assert!(dev.to_host_vec(&stream)?.is_empty());
    Ok(())
}

/// A pinned buffer of a zero-sized element type either is refused at `new`, or reads and
/// writes as slices of its length: never as an empty slice beside a non-zero `len`.
#[test]
fn a_pinned_buffer_of_a_zero_sized_type_is_refused_or_has_its_length() {
    for len in [1, 10, 1 << 40] {
        match PinnedBuffer::<()>::new(&device(), len) {
            Ok(mut pinned) => {
                assert_eq!(pinned.len(), len);
                assert_eq!(pinned.as_slice().len(), len, "as_slice of {len} elements");
                assert_eq!(pinned.as_mut_slice().len(), len, "as_mut_slice of {len}");
            }
            Err(DeviceError::InvalidShape { op, reason }) => {
                assert_eq!(op, "PinnedBuffer::new");
                assert!(reason.contains("zero-sized"), "{reason}");
                assert!(
                    !reason.contains("  "),
                    "the reason reads as one sentence, without a run of spaces: {reason:?}"
                );
            }
            Err(e) => panic!("{len} zero-sized elements: {e}"),
        }
    }
    // An empty one is an empty buffer like any other.
    assert!(PinnedBuffer::<()>::new(&device(), 0).is_ok_and(|p| p.as_slice().is_empty()));
}

/// Buffers around the size from which the CUDA backend maps and registers pinned memory
/// itself (4 MiB), of lengths that are not whole 2 MiB pages: each reads as zeros when made,
/// keeps what is written into it, and round-trips through the device whole and as a prefix.
/// Made and dropped in a loop, so a buffer that is not given back (or given back twice) shows.
#[test]
fn large_pinned_buffers_start_zeroed_and_round_trip() -> Result<(), DeviceError> {
    let device = device();
    let stream = stream();
    let words = |bytes: usize| bytes / 4;
    let sizes = [
        words(4 << 20) - 1,
        words(4 << 20),
        words(5 << 20) + 3,
        words(16 << 20) + 1,
    ];
    for round in 0..3u32 {
        for (i, &n) in sizes.iter().enumerate() {
            let mut pinned = PinnedBuffer::<u32>::new(&device, n)?;
            assert_eq!(pinned.len(), n);
            let nonzero = pinned.as_slice().iter().position(|&w| w != 0);
            assert_eq!(nonzero, None, "a fresh buffer of {n} words is not zeroed");
            let seed = round * 16 + i as u32;
            let pattern = |k: usize| (k as u32).wrapping_mul(0x9e37_79b9) ^ seed;
            for (k, w) in pinned.as_mut_slice().iter_mut().enumerate() {
                *w = pattern(k);
            }
            let dev = DeviceBuffer::<u32>::zeroed(&stream, n)?;
            let pinned = pinned.copy_to_device(&stream, dev.view())?.wait()?;
            let on_device = dev.to_host_vec(&stream)?;
            let wrong = (0..n).find(|&k| on_device[k] != pattern(k));
            assert_eq!(wrong, None, "{n} words to the device, round {round}");
            // The first half again, from a buffer filled with something else.
            let mut other = PinnedBuffer::<u32>::new(&device, n)?;
            other.as_mut_slice().fill(!seed);
            let half = n / 2;
            let other = other
                .copy_prefix_to_device(&stream, dev.slice(0..half)?)?
                .wait()?;
            drop(other);
            let mut back = PinnedBuffer::<u32>::new(&device, n)?;
            back.as_mut_slice().fill(7);
            let back = back.copy_from_device(&stream, dev.view())?.wait()?;
            let expected = |k: usize| if k < half { !seed } else { pattern(k) };
            let wrong = (0..n).find(|&k| back.as_slice()[k] != expected(k));
            assert_eq!(wrong, None, "{n} words from the device, round {round}");
            assert_eq!(
                pinned.as_slice()[n - 1],
                pattern(n - 1),
                "the source changed"
            );
        }
    }
    Ok(())
}

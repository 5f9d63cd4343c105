//! A copy staged between two devices (`copy_from_device_staged`), ordered against a write of its
//! source made on another stream while the copy is being enqueued.
//!
//! Gates hold the copy back at chosen points, so the outcome does not depend on timing: the
//! copy waits for the lock of its destination (held by a read of it that waits for a gate), and
//! its device-to-host chunks wait for the staging buffer that an earlier staged copy into the
//! same device still reads (after another gate). The test is alone in its binary: no other
//! staged copy may use the destination device's staging buffers meanwhile.
//!
//! Under CUDA it needs two devices (see `cuflow_testing::device`); on the host backend the copy
//! between two host devices is direct, and the same outcome is asserted.

use std::time::{Duration, Instant};

use cuflow_runtime::{DeviceBuffer, DeviceError};
use cuflow_testing::{
    device::device_pair,
    ops::Gate,
    rng::{random_f32, rng},
};

/// How long a write that nothing holds back may take to complete.
const UNHELD: Duration = Duration::from_millis(500);

/// How long a thread is given to reach the point where it blocks.
const SETTLE: Duration = Duration::from_millis(100);

#[test]
fn a_staged_copy_is_ordered_with_writes_of_its_source_on_other_streams() -> Result<(), DeviceError>
{
    let Some((a, b)) = device_pair() else {
        return Ok(());
    };
    let n = 4096;
    let old = random_f32(&mut rng(), n);
    let (sa, writer) = (a.new_stream()?, a.new_stream()?);
    let (sb, reader, held) = (b.new_stream()?, b.new_stream()?, b.new_stream()?);
    let src = DeviceBuffer::from_host(&sa, &old)?;
    let other_src = DeviceBuffer::from_host(&sa, &old)?;
    let dst = DeviceBuffer::<f32>::alloc(&sb, n)?;
    let other_dst = DeviceBuffer::<f32>::alloc(&sb, n)?;
    dst.view().fill_bytes(&sb, 0)?;
    // Allocates the staging buffers of `b` before any gate closes.
    other_dst.copy_from_device_staged(&held, &other_src)?;
    for s in [&sa, &writer, &sb, &reader, &held] {
        s.synchronize()?;
    }

    let (mut reads_done, mut staging_free) = (Gate::closed(&b)?, Gate::closed(&b)?);
    // A staged copy into `b` whose host-to-device half waits for `staging_free`: the next
    // staged copy into `b` reads its source into the same staging buffer only after it.
    held.wait_event(staging_free.event())?;
    other_dst.copy_from_device_staged(&held, &other_src)?;
    reader.wait_event(reads_done.event())?;

    let new1 = f32::from_bits(0x1111_1111);
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        // Holds the lock of `dst` until `reads_done` opens.
        let read = scope.spawn(|| dst.to_host_vec(&reader).map(drop));
        std::thread::sleep(SETTLE);
        let copy = scope.spawn(|| dst.copy_from_device_staged(&sb, &src));
        std::thread::sleep(SETTLE);
        // While the copy is being enqueued: it reads either the old data or this write's,
        // never a mix.
        let write = scope.spawn(|| src.view().fill_bytes(&writer, 0x11));
        std::thread::sleep(SETTLE);
        reads_done.open();
        read.join().expect("the read does not panic")?;
        copy.join().expect("the copy does not panic")?;
        write.join().expect("the write does not panic")
    })?;

    // Enqueued after the copy: the copy must not read it. Its stream may rightly wait for the
    // copy, which waits for `staging_free`: it is given a while, then the gate opens.
    src.view().fill_bytes(&writer, 0x22)?;
    let written = writer.record_event()?;
    let start = Instant::now();
    while !written.is_complete()? && start.elapsed() < UNHELD {
        std::thread::sleep(Duration::from_millis(1));
    }
    staging_free.open();

    let got = dst.to_host_vec(&sb)?;
    assert!(
        got == old || got.iter().all(|v| *v == new1),
        "the copy from {a} to {b} read a write of its source enqueued after it, or a mix \
         (first value {:#x}, old {:#x})",
        got[0].to_bits(),
        old[0].to_bits()
    );
    Ok(())
}

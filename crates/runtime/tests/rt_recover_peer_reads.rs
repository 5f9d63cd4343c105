//! `Device::recover` frees all of the device's memory, so it must not run while a copy
//! enqueued on another device's stream still reads that memory (a peer copy, which no stream
//! of the recovered device orders): the reset waits a few seconds for such copies, and is
//! refused with [`DeviceError::Usage`] while one is still pending; once it has finished, the
//! device recovers (or the driver says the process must restart). On the host backend
//! devices never fault, so recovering returns the device as it is, and the copy completes.
//!
//! Where the driver stops the reader's device too when the source faults (two H200 with
//! driver 580 do: a trap on one GPU stopped its peer), the copy never runs and the reset goes
//! ahead; the refusal then cannot be shown, and the test checks that it is not made.
//!
//! One test in its own binary: a fault ends the state of the whole device, so nothing else
//! may run on it meanwhile. It needs two devices (two host devices on the host backend).

use std::sync::mpsc;
use std::time::Duration;

use cuflow_runtime::{BackendKind, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig};
use cuflow_testing::device::{device_pair, skip};

fn trap() -> Kernel {
    // SAFETY: the kernel touches no memory; it stops the device on purpose.
    let kernel = unsafe {
        Kernel::new(
            "rt_recover_trap",
            r#"extern "C" __global__ void rt_recover_trap() { __trap(); }"#,
        )
    };
    kernel.with_host(|args| {
        Err(DeviceError::HostKernel {
            kernel: args.kernel_name().to_string(),
            reason: "the kernel stops on purpose".into(),
        })
    })
}

#[test]
fn recover_waits_for_copies_of_other_devices_reading_its_memory() -> Result<(), DeviceError> {
    let Some((source, reader)) = device_pair() else {
        return Ok(());
    };
    let (on_source, on_reader) = (source.new_stream()?, reader.new_stream()?);
    let data: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let src = DeviceBuffer::from_host(&on_source, &data)?;
    let dst = DeviceBuffer::<f32>::zeroed(&on_reader, data.len())?;
    // Peer access is set up by a first copy, before the reader's stream is held.
    dst.copy_from_device(&on_reader, &src)?;
    on_reader.synchronize()?;
    let trap = trap();
    trap.compile(&source)?;

    // The reader's stream is held by a host function (for a bounded time: a failing test
    // does not hang), so the copy enqueued after it is still pending.
    let (release, held) = mpsc::channel::<()>();
    on_reader.enqueue_host_fn(move || {
        let _ = held.recv_timeout(Duration::from_secs(120));
    })?;
    let dst2 = DeviceBuffer::<f32>::zeroed(&on_reader, data.len())?;
    dst2.copy_from_device(&on_reader, &src)?;

    let r = trap.launch(&on_source, LaunchConfig::linear(1, 1), &KernelArgs::new());
    let r = r.and_then(|()| on_source.synchronize());
    if source.kind() == BackendKind::Host {
        assert!(matches!(r, Err(DeviceError::HostKernel { .. })), "{r:?}");
        assert!(!source.is_faulted());
        assert_eq!(
            source.recover()?,
            source,
            "a healthy device recovers as itself"
        );
        let _ = release.send(());
        assert_eq!(dst2.to_host_vec(&on_reader)?, data);
        return Ok(());
    }

    assert!(
        matches!(r, Err(DeviceError::DeviceFaulted { .. })),
        "the synchronization after the trap: {r:?}"
    );
    let direct = reader.can_access_peer(&source)?;
    let first = source.recover();
    if reader.is_faulted() {
        // The driver stopped the reader's device with the source (with peer access enabled, a
        // trap on one GPU may stop its peers too: so it did on two H200 with driver 580): the
        // copy never runs, so the reset has nothing to wait for and must not be refused.
        eprintln!("the reader's device faulted with the source; recover: {first:?}");
        let _ = release.send(());
        return match first {
            Ok(recovered) => {
                assert!(!recovered.is_faulted());
                Ok(())
            }
            Err(DeviceError::DeviceFaulted { cause, .. }) => {
                assert!(cause.contains("restart the process"), "{cause}");
                Ok(())
            }
            Err(other) => panic!("recover once the reader's device faulted too: {other:?}"),
        };
    }
    if direct {
        // The copy reads the faulted device's memory from the reader's stream: the reset,
        // which would free that memory, is refused while the copy is pending.
        match &first {
            Err(DeviceError::Usage { what }) => {
                assert!(what.contains("still read its memory"), "{what}");
                eprintln!("recover refused while a peer copy is pending: {what}");
            }
            other => panic!("recover with a peer copy pending: expected Usage, got {other:?}"),
        }
    } else {
        skip("no peer access between the two devices: the copy is staged on the source");
    }
    let _ = release.send(());
    // The copy read a faulted device's memory: what it got, or whether it failed, is the
    // driver's; it does not hang.
    let copied = on_reader.synchronize();
    eprintln!("the reader's stream after the copy: {copied:?}");
    drop(src);

    let recovered = match first {
        Ok(recovered) if !direct => Ok(recovered),
        _ => source.recover(),
    };
    match recovered {
        Ok(recovered) => {
            assert!(!recovered.is_faulted());
            let stream = recovered.new_stream()?;
            let again = DeviceBuffer::from_host(&stream, &data)?;
            assert_eq!(again.to_host_vec(&stream)?, data);
        }
        Err(DeviceError::DeviceFaulted { cause, .. }) => {
            assert!(cause.contains("restart the process"), "{cause}");
            eprintln!("the driver does not give the device back after a fault: {cause}");
        }
        Err(other) => panic!("recover after the copy finished: {other:?}"),
    }
    Ok(())
}

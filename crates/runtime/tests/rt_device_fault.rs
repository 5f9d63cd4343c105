//! A device fault does not crash or hang the process: after a kernel traps, every call on the
//! device fails at once with `DeviceFaulted` (pending work included), handles of the faulted
//! state stay safe to use and drop, and `Device::recover` either gives a device that computes
//! correctly again or, where the driver keeps the device from the process after a fault, says
//! that the process must be restarted. On the host backend, the failing kernel is an ordinary
//! error and the device never faults.
//!
//! One test in its own binary: a fault ends the state of the whole device, so nothing else
//! may run on it meanwhile.

use cuflow_runtime::{
    BackendKind, Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig, PinnedBuffer,
};
use cuflow_testing::{
    device::device,
    kernels::{launch_spin_write, saxpy, SHORT_SPIN},
    measure::assert_close_in_norm,
    rng::{random_vec, rng},
};

fn trap() -> Kernel {
    // SAFETY: the kernel touches no memory; it stops the device on purpose.
    let kernel = unsafe {
        Kernel::new(
            "rt_trap",
            r#"extern "C" __global__ void rt_trap() { __trap(); }"#,
        )
    };
    kernel.with_host(|args| {
        Err(DeviceError::HostKernel {
            kernel: args.kernel_name().to_string(),
            reason: "the kernel stops on purpose".into(),
        })
    })
}

fn faulted<T: std::fmt::Debug>(what: &str, r: Result<T, DeviceError>) {
    assert!(
        matches!(r, Err(DeviceError::DeviceFaulted { .. })),
        "{what}: expected DeviceFaulted, got {r:?}"
    );
}

/// `y = 2 x + y` on fresh random data, checked against a float64 reference.
fn saxpy_is_correct(device: &Device) -> Result<(), DeviceError> {
    let stream = device.new_stream()?;
    let mut rng = rng();
    let n = 4099;
    let x: Vec<f32> = random_vec(&mut rng, n);
    let y: Vec<f32> = random_vec(&mut rng, n);
    let dx = DeviceBuffer::from_host(&stream, &x)?;
    let dy = DeviceBuffer::from_host(&stream, &y)?;
    saxpy().launch(
        &stream,
        LaunchConfig::for_num_elems(n),
        KernelArgs::new()
            .output(&dy)
            .input(&dx)
            .scalar(2.0f32)
            .scalar(n as u32),
    )?;
    let want: Vec<f64> = x
        .iter()
        .zip(&y)
        .map(|(&x, &y)| 2.0 * x as f64 + y as f64)
        .collect();
    assert_close_in_norm("saxpy", &dy.to_host_vec(&stream)?, &want, 1e-6);
    Ok(())
}

#[test]
fn a_fault_fails_every_later_call_at_once_and_recover_resets_or_says_to_restart(
) -> Result<(), DeviceError> {
    let device = device();
    saxpy_is_correct(&device)?;
    let stream = device.new_stream()?;
    let side = device.new_stream()?;
    let buf = DeviceBuffer::<f32>::zeroed(&stream, 64)?;
    let pinned = PinnedBuffer::<f32>::new(&device, 64)?;
    let trap = trap();

    // Work in flight on another stream when the fault happens.
    launch_spin_write(&side, &buf, 1.0, SHORT_SPIN)?;
    let pending = side.record_event()?;
    trap.launch(&stream, LaunchConfig::linear(1, 1), &KernelArgs::new())?;
    let r = stream.synchronize();

    if device.kind() == BackendKind::Host {
        assert!(
            matches!(r, Err(DeviceError::HostKernel { .. })),
            "host: {r:?}"
        );
        assert!(!device.is_faulted());
        pending.synchronize()?;
        assert_eq!(
            device.recover()?,
            device,
            "a healthy device recovers as itself"
        );
        stream.synchronize()?;
        return saxpy_is_correct(&device);
    }

    faulted("the synchronization after the trap", r);
    assert!(device.is_faulted());
    // Everything fails at once: no driver call reaches the dead context, nothing hangs.
    faulted("a pending event", pending.synchronize());
    faulted("a pending event's query", pending.is_complete());
    faulted("a new stream", device.new_stream());
    faulted("an allocation", DeviceBuffer::<f32>::zeroed(&stream, 4));
    faulted("a read-back", buf.to_host_vec(&stream));
    faulted(
        "a launch",
        trap.launch(&stream, LaunchConfig::linear(1, 1), &KernelArgs::new()),
    );

    // Page-locked memory goes away with the context: recovering is refused while it lives.
    let r = device.recover();
    assert!(matches!(r, Err(DeviceError::Usage { .. })), "{r:?}");
    drop(pinned);
    let recovered = device.recover();

    // Whatever the driver allows next, the old handles stay safe: their calls fail at once,
    // their drops free nothing twice.
    assert!(device.is_faulted());
    faulted("a read-back from the old state", buf.to_host_vec(&stream));
    faulted("a stream of the old state", stream.synchronize());
    drop((buf, stream, side, pending));

    let recovered = match recovered {
        Ok(recovered) => recovered,
        Err(DeviceError::DeviceFaulted { cause, .. }) => {
            // This driver keeps the device from the process after a fault: recovering says so
            // (and what to do), and the device keeps failing fast.
            assert!(cause.contains("restart the process"), "{cause}");
            eprintln!("the driver does not give the device back after a fault: {cause}");
            faulted("a device the driver keeps", device.new_stream());
            faulted("recovering again", device.recover());
            return Ok(());
        }
        Err(other) => panic!("recover: {other:?}"),
    };
    assert!(!recovered.is_faulted());
    assert_ne!(recovered.id(), device.id());
    assert_eq!(
        Device::auto()?,
        recovered,
        "Device::auto gives the recovered device"
    );
    assert_eq!(
        device.recover()?,
        recovered,
        "recovering again gives the same device"
    );

    // The recovered device computes correctly, kernels declared before the fault included.
    saxpy_is_correct(&recovered)?;
    let stream = recovered.new_stream()?;
    let out = DeviceBuffer::<f32>::zeroed(&stream, 1)?;
    launch_spin_write(&stream, &out, 7.0, 1000u64)?;
    assert_eq!(out.to_host_vec(&stream)?, vec![7.0]);
    let _pinned = PinnedBuffer::<f32>::new(&recovered, 64)?;
    Ok(())
}

//! `MultiDevice` placements: roots on the home device, outermost branches spread over the
//! devices, nested branches and kernel inputs kept on their parent's device, least-loaded
//! spreading, and the errors of building one.
//!
//! Placement is the same on every backend, so these run on two host devices
//! (`Device::host()` and `Device::host_numbered(1)`, `host_numbered(2)`), and on the device
//! under test alone.

use cuflow_runtime::{Device, DeviceError};
use cuflow_scheduler::{DeviceSpread, MultiDevice, Placement, SchedulingPolicy};

fn host_devices(n: usize) -> Vec<Device> {
    (0..n).map(Device::host_numbered).collect()
}

#[test]
fn roots_run_on_the_home_device_and_branches_round_robin() -> Result<(), DeviceError> {
    let devices = host_devices(3);
    let policy = MultiDevice::new(&devices, 2)?;
    assert_eq!(policy.device(), &devices[0]);
    assert_eq!(policy.spread(), DeviceSpread::RoundRobin);
    let root = policy.place(&Placement::root(policy.device()))?;
    assert_eq!(root.device(), &devices[0]);
    for count in [1, 2, 3, 7] {
        for index in 0..count {
            let branch = policy.place(&Placement::branch(&devices[0], &root, index, count))?;
            assert_eq!(
                branch.device(),
                &devices[index % 3],
                "branch {index} of {count}"
            );
            let pool = policy.pool(branch.device()).expect("a pool per device");
            assert!(pool.streams().contains(&branch));
        }
    }
    Ok(())
}

#[test]
fn nested_branches_and_kernel_inputs_stay_on_their_parents_device() -> Result<(), DeviceError> {
    let devices = host_devices(2);
    for policy in [
        MultiDevice::new(&devices, 2)?,
        MultiDevice::least_loaded(&devices, 2)?,
    ] {
        let root = policy.place(&Placement::root(policy.device()))?;
        let outer = policy.place(&Placement::branch(&devices[0], &root, 1, 2))?;
        assert_eq!(outer.device(), &devices[1]);
        for index in 0..4 {
            let nested = Placement::branch(&devices[1], &outer, index, 4).at_depth(2);
            assert_eq!(policy.place(&nested)?.device(), &devices[1]);
            let input = Placement::branch(&devices[0], &root, index, 4).on_same_device(true);
            assert_eq!(policy.place(&input)?.device(), &devices[0]);
        }
    }
    Ok(())
}

#[test]
fn least_loaded_spreads_the_branches_of_one_zip() -> Result<(), DeviceError> {
    let devices = host_devices(2);
    let policy = MultiDevice::least_loaded(&devices, 4)?;
    assert_eq!(policy.spread(), DeviceSpread::LeastLoaded);
    let root = policy.place(&Placement::root(policy.device()))?;
    let mut on = Vec::new();
    for index in 0..4 {
        let s = policy.place(&Placement::branch(&devices[0], &root, index, 4))?;
        on.push(s);
    }
    let per_device: Vec<usize> = devices
        .iter()
        .map(|d| on.iter().filter(|s| s.device() == d).count())
        .collect();
    assert_eq!(per_device, vec![2, 2], "{on:?}");
    assert_eq!(policy.loads(), vec![2, 2]);

    // Reported branches count until they finish.
    let busy = &on[0];
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    busy.enqueue_host_fn(move || {
        let _ = rx.recv();
    })?;
    let done = busy.record_event()?;
    policy.on_enqueued(busy, &done);
    // A new zip: device 0 has one branch running, so both new branches go elsewhere first.
    let first = policy.place(&Placement::branch(&devices[0], &root, 0, 2))?;
    assert_eq!(first.device(), &devices[1]);
    drop(tx);
    busy.synchronize()?;
    assert_eq!(policy.loads()[0], 0, "a finished branch still counts");
    Ok(())
}

#[test]
fn one_device_behaves_like_a_stream_pool() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    let policy = MultiDevice::new(std::slice::from_ref(&device), 3)?;
    let root = policy.place(&Placement::root(&device))?;
    let mut seen = Vec::new();
    for index in 0..6 {
        let s = policy.place(&Placement::branch(&device, &root, index, 6))?;
        assert_eq!(s.device(), &device);
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    assert_eq!(seen.len(), 3, "every stream of the pool is used");
    Ok(())
}

#[test]
fn bad_device_lists_are_refused_with_a_reason() {
    let none: [Device; 0] = [];
    let err = MultiDevice::new(&none, 2).expect_err("no devices");
    assert!(err.to_string().contains("at least one device"), "{err}");
    let twice = [Device::host(), Device::host()];
    let err = MultiDevice::new(&twice, 2).expect_err("a device twice");
    assert!(err.to_string().contains("twice"), "{err}");
    let err = MultiDevice::new(&host_devices(2), 0).expect_err("no streams");
    assert!(err.to_string().contains("n >= 1"), "{err}");
    if let Ok(gpu) = Device::cuda(0) {
        let err = MultiDevice::new(&[Device::host(), gpu], 1).expect_err("two backends");
        assert!(err.to_string().contains("one backend"), "{err}");
    }
}

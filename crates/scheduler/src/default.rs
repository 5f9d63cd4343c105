//! The per-device default policy: process-wide, created on first use as a
//! [`StreamPoolRoundRobin`] of four streams, replaceable at any time.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError};
use parking_lot::RwLock;

use crate::{SchedulingPolicy, StreamPoolRoundRobin};

/// The number of streams in a device's default round-robin pool.
pub const DEFAULT_POOL_SIZE: usize = 4;

#[derive(Default)]
struct DefaultPolicySlot(RwLock<Option<Arc<dyn SchedulingPolicy>>>);

/// The default policy of `device` (created on first use).
///
/// # Errors
///
/// A [`DeviceError`] when the default pool's streams cannot be created.
pub fn default_policy(device: &Device) -> Result<Arc<dyn SchedulingPolicy>, DeviceError> {
    let slot = device.extension(DefaultPolicySlot::default);
    if let Some(p) = slot.0.read().as_ref() {
        return Ok(p.clone());
    }
    let mut w = slot.0.write();
    if let Some(p) = w.as_ref() {
        return Ok(p.clone());
    }
    let p: Arc<dyn SchedulingPolicy> =
        Arc::new(StreamPoolRoundRobin::new(device, DEFAULT_POOL_SIZE)?);
    *w = Some(p.clone());
    Ok(p)
}

/// Replaces the default policy of `device`, for every thread.
///
/// # Errors
///
/// [`DeviceError::DeviceMismatch`] when the policy places work on another device;
/// [`DeviceError::Panicked`] when the policy panics naming its device (the default is then
/// left as it was).
pub fn set_default_policy(
    device: &Device,
    policy: Arc<dyn SchedulingPolicy>,
) -> Result<(), DeviceError> {
    // The policy is the program's code: its panic is an error, as when an op is placed.
    let policy_device = catch_unwind(AssertUnwindSafe(|| policy.device().clone()))
        .map_err(|payload| DeviceError::from_panic_payload("the scheduling policy", payload))?;
    if policy_device != *device {
        return Err(DeviceError::device_mismatch(
            "set_default_policy",
            "the scheduling policy",
            device,
            &policy_device,
        ));
    }
    *device.extension(DefaultPolicySlot::default).0.write() = Some(policy);
    Ok(())
}

/// Default-policy access as methods of [`Device`].
pub trait DevicePolicyExt {
    /// The device's default policy; see [`default_policy`].
    ///
    /// # Errors
    ///
    /// As [`default_policy`].
    fn default_policy(&self) -> Result<Arc<dyn SchedulingPolicy>, DeviceError>;

    /// Replaces the device's default policy; see [`set_default_policy`].
    ///
    /// # Errors
    ///
    /// As [`set_default_policy`].
    fn set_default_policy(&self, policy: Arc<dyn SchedulingPolicy>) -> Result<(), DeviceError>;
}

impl DevicePolicyExt for Device {
    fn default_policy(&self) -> Result<Arc<dyn SchedulingPolicy>, DeviceError> {
        default_policy(self)
    }

    fn set_default_policy(&self, policy: Arc<dyn SchedulingPolicy>) -> Result<(), DeviceError> {
        set_default_policy(self, policy)
    }
}

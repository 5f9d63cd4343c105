//! `Priority`: a high-priority and a normal pool, chosen by the request's priority.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError, Stream};

use super::{make_pool, skip_capturing};
use crate::{Placement, PriorityLevel, SchedulingPolicy};

/// Two round-robin pools on stream priorities: requests with [`PriorityLevel::High`] go to
/// streams of the device's greatest priority, the rest to normal-priority streams. On the host
/// backend the priorities are recorded but all streams are served alike. Clones share the
/// pools.
#[derive(Debug, Clone)]
pub struct Priority {
    device: Device,
    high: Arc<[Stream]>,
    normal: Arc<[Stream]>,
    next_high: Arc<AtomicUsize>,
    next_normal: Arc<AtomicUsize>,
}

impl Priority {
    /// `high` high-priority and `normal` normal-priority streams on `device`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] when a pool size is 0, or the error of creating a stream.
    pub fn new(device: &Device, high: usize, normal: usize) -> Result<Self, DeviceError> {
        let (least, greatest) = device.stream_priority_range()?;
        Ok(Priority {
            device: device.clone(),
            high: make_pool(device, high, Some(greatest))?.into(),
            normal: make_pool(device, normal, Some(least))?.into(),
            next_high: Arc::new(AtomicUsize::new(0)),
            next_normal: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The high-priority streams.
    pub fn high_streams(&self) -> &[Stream] {
        &self.high
    }

    /// The normal-priority streams.
    pub fn normal_streams(&self) -> &[Stream] {
        &self.normal
    }
}

impl SchedulingPolicy for Priority {
    fn device(&self) -> &Device {
        &self.device
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        let (pool, next) = match request.priority {
            PriorityLevel::High => (&self.high, &self.next_high),
            PriorityLevel::Normal => (&self.normal, &self.next_normal),
        };
        let i = next.fetch_add(1, Ordering::Relaxed);
        skip_capturing(pool, i)
            .cloned()
            .ok_or_else(|| DeviceError::usage("Priority has an empty pool"))
    }
}

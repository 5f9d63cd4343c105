//! `StreamPoolRoundRobin`: each placement takes the next stream of a fixed pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError, Stream};

use super::{make_pool, skip_capturing};
use crate::{Placement, SchedulingPolicy};

/// Round-robin over a pool of `n` streams: consecutive placements (roots and `zip!` branches)
/// get consecutive streams, so up to `n` branches overlap. The default policy, with `n = 4`.
///
/// # Examples
///
/// ```
/// use cuflow_runtime::Device;
/// use cuflow_scheduler::{Placement, SchedulingPolicy, StreamPoolRoundRobin};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let device = Device::host();
/// let policy = StreamPoolRoundRobin::new(&device, 2)?;
/// let a = policy.place(&Placement::root(&device))?;
/// let b = policy.place(&Placement::root(&device))?;
/// let c = policy.place(&Placement::root(&device))?;
/// assert!(a != b && a == c);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct StreamPoolRoundRobin {
    device: Device,
    streams: Arc<[Stream]>,
    next: Arc<AtomicUsize>,
}

impl StreamPoolRoundRobin {
    /// A pool of `n` new streams on `device`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for `n == 0`, or the error of creating a stream.
    pub fn new(device: &Device, n: usize) -> Result<Self, DeviceError> {
        Ok(StreamPoolRoundRobin {
            device: device.clone(),
            streams: make_pool(device, n, None)?.into(),
            next: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The pool's streams.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }
}

impl SchedulingPolicy for StreamPoolRoundRobin {
    fn device(&self) -> &Device {
        &self.device
    }

    fn place(&self, _request: &Placement<'_>) -> Result<Stream, DeviceError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        skip_capturing(&self.streams, i)
            .cloned()
            .ok_or_else(|| DeviceError::usage("StreamPoolRoundRobin has no streams"))
    }
}

//! `LeastLoaded`: the stream of a pool with the fewest branches still in flight.

use std::collections::VecDeque;
use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError, Event, Stream};
use parking_lot::Mutex;

use super::make_pool;
use crate::{Placement, SchedulingPolicy};

/// Places each request on the pool stream with the fewest unfinished branches, tracked by the
/// completion events the executor reports through
/// [`SchedulingPolicy::on_enqueued`]. Ties go to the lowest index. Clones share the pool and
/// its load counts.
#[derive(Debug, Clone)]
pub struct LeastLoaded {
    device: Device,
    streams: Arc<[Stream]>,
    in_flight: Arc<Mutex<Vec<VecDeque<Event>>>>,
}

impl LeastLoaded {
    /// A pool of `n` new streams on `device`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for `n == 0`, or the error of creating a stream.
    pub fn new(device: &Device, n: usize) -> Result<Self, DeviceError> {
        Ok(LeastLoaded {
            device: device.clone(),
            streams: make_pool(device, n, None)?.into(),
            in_flight: Arc::new(Mutex::new((0..n).map(|_| VecDeque::new()).collect())),
        })
    }

    /// Unfinished branches per pool stream, after dropping the finished ones.
    pub fn loads(&self) -> Vec<usize> {
        let mut q = self.in_flight.lock();
        q.iter_mut()
            .map(|events| {
                // Events of one stream complete in order: drop finished ones from the front.
                while events
                    .front()
                    .is_some_and(|e| e.is_complete().unwrap_or(true))
                {
                    events.pop_front();
                }
                events.len()
            })
            .collect()
    }

    /// The pool's streams.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }
}

impl SchedulingPolicy for LeastLoaded {
    fn device(&self) -> &Device {
        &self.device
    }

    fn place(&self, _request: &Placement<'_>) -> Result<Stream, DeviceError> {
        let loads = self.loads();
        let (best, _) = loads
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.streams[*i].is_capturing())
            .min_by_key(|(_, l)| **l)
            .or_else(|| loads.iter().enumerate().next())
            .ok_or_else(|| DeviceError::usage("LeastLoaded has no streams"))?;
        Ok(self.streams[best].clone())
    }

    fn on_enqueued(&self, stream: &Stream, done: &Event) {
        if let Some(i) = self.streams.iter().position(|s| s == stream) {
            self.in_flight.lock()[i].push_back(done.clone());
        }
    }
}

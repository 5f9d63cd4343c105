//! An event's backend half.

use super::{cuda, foreign, host};
use crate::error::{BackendKind, Result};

/// An event's backend half.
pub(crate) enum EventBackend {
    Host(host::HostEvent),
    Cuda(cuda::CudaEventHandle),
}

impl EventBackend {
    pub(crate) fn is_complete(&self) -> Result<bool> {
        match self {
            EventBackend::Host(e) => e.is_complete(),
            EventBackend::Cuda(e) => e.is_complete(),
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            EventBackend::Host(e) => e.synchronize(),
            EventBackend::Cuda(e) => e.synchronize_and_release(),
        }
    }

    /// Milliseconds from this event to `end`, a timed event of the same backend.
    pub(crate) fn elapsed_ms(&self, end: &EventBackend) -> Result<f32> {
        match (self, end) {
            (EventBackend::Host(a), EventBackend::Host(b)) => a.elapsed_ms(b),
            (EventBackend::Cuda(a), EventBackend::Cuda(b)) => a.elapsed_ms(b),
            (EventBackend::Host(_), _) => Err(foreign("an event", BackendKind::Host)),
            (EventBackend::Cuda(_), _) => Err(foreign("an event", BackendKind::Cuda)),
        }
    }
}

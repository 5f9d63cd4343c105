//! `SingleStream`: everything on one stream, in order.

use cuflow_runtime::{Device, DeviceError, Stream};

use crate::{Placement, SchedulingPolicy};

/// Places all work on one stream: `zip!` branches run one after another. Useful as a
/// baseline and for debugging ordering problems.
#[derive(Debug, Clone)]
pub struct SingleStream {
    stream: Stream,
}

impl SingleStream {
    /// A policy over a new stream of `device`.
    ///
    /// # Errors
    ///
    /// The error of creating the stream.
    pub fn new(device: &Device) -> Result<Self, DeviceError> {
        Ok(SingleStream {
            stream: device.new_stream()?,
        })
    }

    /// A policy over an existing stream.
    pub fn on(stream: &Stream) -> Self {
        SingleStream {
            stream: stream.clone(),
        }
    }

    /// The policy's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}

impl SchedulingPolicy for SingleStream {
    fn device(&self) -> &Device {
        self.stream.device()
    }

    fn place(&self, _request: &Placement<'_>) -> Result<Stream, DeviceError> {
        Ok(self.stream.clone())
    }
}

//! The backend halves of capture: a capture in progress, the graph it records, and the
//! executables instantiated from it.

use std::sync::Arc;

use super::{cuda, foreign, host, StreamBackend};
use crate::error::{DeviceError, Result};

/// A capture's backend half: the host backend records tasks into a shared node list; CUDA
/// keeps the capture in the driver, and the events recorded during it here.
pub(crate) enum CaptureBackend {
    Host(host::HostCapture),
    Cuda(Arc<cuda::CapturedEvents>),
}

/// A captured graph's backend half.
pub(crate) enum GraphBackend {
    Host(host::HostGraph),
    Cuda(cuda::CudaGraphHandle),
}

impl GraphBackend {
    pub(crate) fn to_dot(&self) -> Result<String> {
        match self {
            GraphBackend::Host(g) => Ok(g.to_dot()),
            GraphBackend::Cuda(g) => g.debug_dot(),
        }
    }

    pub(crate) fn node_count(&self) -> Result<usize> {
        match self {
            GraphBackend::Host(g) => Ok(g.node_count()),
            GraphBackend::Cuda(g) => g.node_count(),
        }
    }

    pub(crate) fn edges(&self) -> Result<Vec<(usize, usize)>> {
        match self {
            GraphBackend::Host(g) => Ok(g.edges()),
            GraphBackend::Cuda(g) => g.edges(),
        }
    }

    pub(crate) fn instantiate(&self) -> Result<GraphExecBackend> {
        match self {
            GraphBackend::Host(g) => Ok(GraphExecBackend::Host(g.instantiate())),
            GraphBackend::Cuda(g) => Ok(GraphExecBackend::Cuda(g.instantiate()?)),
        }
    }
}

/// An executable graph's backend half.
pub(crate) enum GraphExecBackend {
    Host(host::HostGraphExec),
    Cuda(cuda::CudaGraphExecHandle),
}

impl GraphExecBackend {
    /// Enqueues one replay on `stream`, a stream of the executable's device.
    pub(crate) fn launch(&self, stream: &StreamBackend) -> Result<()> {
        match (self, stream) {
            (GraphExecBackend::Host(g), StreamBackend::Host(s)) => g.launch(s),
            (GraphExecBackend::Cuda(g), StreamBackend::Cuda(s)) => g.launch(s),
            _ => Err(foreign("a graph", stream.kind())),
        }
    }

    /// Updates the executable in place from `graph` when their topologies match.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for a graph of the other backend.
    pub(crate) fn update(&mut self, graph: &GraphBackend) -> Result<bool> {
        match (self, graph) {
            (GraphExecBackend::Host(e), GraphBackend::Host(g)) => Ok(e.update(g)),
            (GraphExecBackend::Cuda(e), GraphBackend::Cuda(g)) => e.update(g),
            _ => Err(DeviceError::usage(
                "graph and executable of different backends",
            )),
        }
    }
}

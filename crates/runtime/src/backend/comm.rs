//! A communicator's backend half: what moves a collective's data on each backend.

use std::sync::Arc;

use super::{cuda, host, StreamBackend};
use crate::collective::{CollectiveCall, HostTransport};
use crate::device::Device;
use crate::error::{BackendKind, DeviceError, Result};

/// A communicator's backend half.
pub(crate) enum CommBackend {
    Host(Arc<host::HostComm>),
    Cuda(cuda::NcclComm),
}

impl CommBackend {
    /// The host backend's communicator: `device` must be a host device.
    pub(crate) fn host(device: &Device, transport: Arc<dyn HostTransport>) -> Result<CommBackend> {
        if device.kind() != BackendKind::Host {
            return Err(DeviceError::usage(format!(
                "Comm::host needs a host device, got {device}; use Comm::nccl for CUDA devices"
            )));
        }
        Ok(CommBackend::Host(Arc::new(host::HostComm::new(transport))))
    }

    /// The CUDA backend's communicator: an NCCL communicator on `device`.
    pub(crate) fn nccl(
        device: &Device,
        unique_id: &[u8],
        rank: usize,
        world_size: usize,
    ) -> Result<CommBackend> {
        let Some(cuda) = device.backend().cuda() else {
            return Err(DeviceError::usage(format!(
                "Comm::nccl needs a CUDA device, got {device}; use Comm::host for host devices"
            )));
        };
        Ok(CommBackend::Cuda(cuda::NcclComm::new(
            cuda.shared(),
            unique_id,
            rank,
            world_size,
        )?))
    }

    /// One NCCL communicator per device of `devices`, all in this process.
    pub(crate) fn nccl_local(devices: &[Device]) -> Result<Vec<CommBackend>> {
        let mut shared = Vec::with_capacity(devices.len());
        for device in devices {
            match device.backend().cuda() {
                Some(d) => shared.push(d.shared().clone()),
                None => {
                    return Err(DeviceError::usage(format!(
                        "Comm::nccl_local needs CUDA devices, got {device}"
                    )))
                }
            }
        }
        Ok(cuda::NcclComm::init_all(&shared)?
            .into_iter()
            .map(CommBackend::Cuda)
            .collect())
    }

    /// A fresh NCCL unique id.
    pub(crate) fn nccl_unique_id() -> Result<Vec<u8>> {
        cuda::nccl_unique_id()
    }

    /// Whether a call that moves no element is enqueued at all. The host transport exchanges
    /// a header for every call, so a rank's empty call against another rank's full one fails
    /// both instead of pairing with the next call; NCCL moves nothing for an empty call, so it
    /// is left out there.
    pub(crate) fn keeps_empty_calls(&self) -> bool {
        match self {
            CommBackend::Host(_) => true,
            CommBackend::Cuda(_) => false,
        }
    }
}

impl StreamBackend {
    /// Enqueues the group `calls` (validated; empty ones only where
    /// [`CommBackend::keeps_empty_calls`]) of rank `rank` of `comm`.
    pub(crate) fn collective(
        &self,
        comm: &CommBackend,
        rank: usize,
        calls: &[&CollectiveCall<'_>],
        capturing: bool,
    ) -> Result<()> {
        match (self, comm) {
            (StreamBackend::Host(s), CommBackend::Host(t)) => {
                host::enqueue_collective(s, Arc::clone(t), rank, calls)
            }
            (StreamBackend::Cuda(s), CommBackend::Cuda(c)) => c.enqueue(s, calls, capturing),
            _ => Err(super::foreign("a communicator", self.kind())),
        }
    }
}

//! A communicator's backend half: what moves a collective's data on each backend.

use std::sync::Arc;

use super::{cuda, host, StreamBackend};
use crate::collective::{CollectiveCall, HostTransport};
use crate::device::Device;
use crate::error::{BackendKind, DeviceError, Result};
use crate::memory::{DeviceBuffer, Memory};

/// One zeroed one-shot area per device of `devices`, complete when this returns.
fn oneshot_areas(devices: &[Device]) -> Result<Vec<Arc<Memory>>> {
    devices
        .iter()
        .map(|d| {
            let stream = d.new_stream()?;
            let area = DeviceBuffer::<u8>::zeroed(&stream, cuda::ONESHOT_AREA_BYTES)?;
            stream.synchronize()?;
            Ok(area.mem.clone())
        })
        .collect()
}

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

    /// The CUDA backend's communicator: an NCCL communicator on `device`, whose calls may stay
    /// unfinished for `timeout` before it is aborted.
    pub(crate) fn nccl(
        device: &Device,
        unique_id: &[u8],
        rank: usize,
        world_size: usize,
        timeout: std::time::Duration,
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
            timeout,
        )?))
    }

    /// One NCCL communicator per device of `devices`, all in this process; their one-shot
    /// all-reduces wait for each other up to `deadline`, and their NCCL calls stay unfinished at
    /// most that long before the communicator is aborted.
    pub(crate) fn nccl_local(
        devices: &[Device],
        deadline: std::time::Duration,
    ) -> Result<Vec<CommBackend>> {
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
        let comms = cuda::NcclComm::init_all(&shared, deadline)?;
        if comms.len() > 1 && cuda::NcclComm::oneshot_enabled() {
            // The one-shot all-reduce's areas, zeroed before any rank can signal into them.
            // Where it cannot be set up, every all-reduce goes through NCCL.
            let attached = oneshot_areas(devices)
                .and_then(|areas| cuda::NcclComm::attach_oneshot(&comms, areas, deadline));
            if let Err(e) = attached {
                tracing::debug!(error = %e, "no one-shot all-reduce for this communicator");
            }
        }
        Ok(comms.into_iter().map(CommBackend::Cuda).collect())
    }

    /// The buffer a run of `calls` writes besides their receive buffers (see
    /// `cuda::NcclComm::oneshot_area`), for the access tracker.
    pub(crate) fn extra_write(&self, calls: &[&CollectiveCall<'_>]) -> Option<&Arc<Memory>> {
        match self {
            CommBackend::Host(_) => None,
            CommBackend::Cuda(c) => c.oneshot_area(calls),
        }
    }

    /// A fresh NCCL unique id.
    pub(crate) fn nccl_unique_id() -> Result<Vec<u8>> {
        cuda::nccl_unique_id()
    }

    /// See [`Comm::abandon_call`](crate::Comm::abandon_call): on the host backend, the peers
    /// are told once the work enqueued so far on `last`, the stream of the rank's last
    /// collective, has run (at once when there was none, or it is being captured); NCCL has
    /// no way to tell them.
    pub(crate) fn abandon(
        &self,
        last: Option<&crate::Stream>,
        op: &'static str,
        rank: usize,
        why: &DeviceError,
    ) {
        let CommBackend::Host(comm) = self else {
            return;
        };
        let failure = DeviceError::Collective {
            op,
            rank,
            reason: format!("rank {rank} gave up this call before enqueueing it: {why}"),
        };
        if let Some(stream) = last.filter(|s| !s.is_capturing()) {
            let (comm, failure) = (Arc::clone(comm), failure.clone());
            if stream
                .enqueue_host_fn(move || comm.abandon(failure))
                .is_ok()
            {
                return;
            }
        }
        comm.abandon(failure);
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
    /// [`CommBackend::keeps_empty_calls`]) of rank `rank` of `comm` on this backend of
    /// `stream`, whose enqueue gate the caller holds.
    pub(crate) fn collective(
        &self,
        stream: &crate::Stream,
        comm: &CommBackend,
        rank: usize,
        calls: &[&CollectiveCall<'_>],
        capturing: bool,
    ) -> Result<()> {
        match (self, comm) {
            (StreamBackend::Host(s), CommBackend::Host(t)) => {
                host::enqueue_collective(s, Arc::clone(t), rank, calls)
            }
            (StreamBackend::Cuda(s), CommBackend::Cuda(c)) => {
                c.enqueue(stream, s, calls, capturing)
            }
            _ => Err(super::foreign("a communicator", self.kind())),
        }
    }
}

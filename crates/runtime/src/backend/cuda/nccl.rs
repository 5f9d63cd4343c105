//! Collectives on CUDA devices: NCCL is not driven yet. Every request for a CUDA communicator
//! is refused with [`DeviceError::Unsupported`], saying so, before anything is enqueued; the
//! host backend runs every collective.

use super::CudaStreamHandle;
use crate::collective::CollectiveCall;
use crate::device::Device;
use crate::error::{BackendKind, DeviceError, Result};

/// An NCCL communicator (none can be made yet).
pub(crate) enum NcclComm {}

fn not_yet() -> DeviceError {
    DeviceError::Unsupported {
        what: "collectives through NCCL (not built into this version of cuflow; collectives \
               run between host devices)"
            .into(),
        backend: BackendKind::Cuda,
    }
}

impl NcclComm {
    pub(crate) fn new(_: &Device, _: usize, _: &[u8], _: usize, _: usize) -> Result<NcclComm> {
        Err(not_yet())
    }

    pub(crate) fn init_all(_: &[Device], _: &[usize]) -> Result<Vec<NcclComm>> {
        Err(not_yet())
    }

    pub(crate) fn enqueue(&self, _: &CudaStreamHandle, _: &[&CollectiveCall<'_>]) -> Result<()> {
        match *self {}
    }
}

pub(crate) fn nccl_unique_id() -> Result<Vec<u8>> {
    Err(not_yet())
}

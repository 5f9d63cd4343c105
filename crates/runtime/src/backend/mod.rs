//! The two backends, and the one interface through which the backend-neutral runtime reaches
//! them.
//!
//! Each backend lives in its own folder (`cuda/`, `host/`, with files named alike). The neutral
//! types (`Device`, `Stream`, `Event`, `Memory`, `PinnedBuffer`, `Graph`, `GraphExec`, `Kernel`)
//! each hold one of the enums defined here and call only the methods defined here: outside
//! this folder no code names a backend's variants or pairs objects by backend by hand (where a
//! program may mix backends, it compares the devices' [`BackendKind`]s).
//!
//! Work is dispatched once, on the object that runs it: the stream for everything enqueued, the
//! device for what needs no stream. The other objects an operation uses (buffers, pinned
//! buffers, events, graphs, compiled kernels) are resolved against that backend here, by one
//! function or match arm each (e.g. [`MemoryBackend::cuda`]), so backend code never receives an
//! object of the other backend. The neutral runtime checks devices before it dispatches, so
//! such a resolution fails only when an invariant broke ([`DeviceError::Internal`]). Where a
//! program itself can bring objects of two backends together, the error is the documented one:
//! the neutral code refuses a pinned buffer of the other backend and the end event of a timing
//! on the other backend with [`DeviceError::DeviceMismatch`] before dispatching, and
//! [`GraphExecBackend::update`] refuses a graph of the other backend. The pairs that mean
//! something across backends (a stream waiting for an event of the other backend, peer access
//! between devices, copies between a host and a CUDA device) are answered here, or in
//! `memory/copy.rs` for the copies.
//!
//! One file per concept, as in the runtime: `device.rs`, `stream.rs`, `event.rs`, `memory.rs`
//! (allocations and pinned buffers) and `capture.rs` (captures, graphs, executables), `comm.rs` (communicators).

mod capture;
mod comm;
pub(crate) mod cuda;
mod device;
mod event;
pub(crate) mod host;
mod memory;
mod stream;

pub(crate) use capture::{CaptureBackend, GraphBackend, GraphExecBackend};
pub(crate) use comm::CommBackend;
/// Profiling-tool hooks; NVTX is a CUDA tool, but its ranges are per process.
pub(crate) use cuda::{at_exit, nvtx_end, nvtx_start, refuse_in_host_function};
pub(crate) use device::{CompileCache, CompiledFor, DeviceBackend, KernelCode};
pub(crate) use event::EventBackend;
pub(crate) use memory::{DeferredFree, MemoryBackend, PinnedBackend, PinnedBytes, PinnedBytesMut};
pub(crate) use stream::{Retired, StreamBackend, SyncWait};

use crate::error::{BackendKind, DeviceError, Result};

/// The error of an object that reached the code of the other backend.
fn foreign(what: &str, backend: BackendKind) -> DeviceError {
    DeviceError::internal(format!(
        "{what} of another backend reached the {backend} backend"
    ))
}

/// How many CUDA devices are visible.
pub(crate) fn cuda_device_count() -> Result<usize> {
    cuda::device_count()
}

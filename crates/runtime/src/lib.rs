//! cuflow's device runtime: devices, streams, events, buffers, kernels and capture, on two
//! backends with the same semantics.
//!
//! - **cuda**: NVIDIA GPUs through cudarc, with libcuda and libnvrtc loaded at run time, so
//!   this crate builds on machines without the CUDA toolkit and reports a missing driver as
//!   [`DeviceError::NoDriver`] instead of panicking.
//! - **host**: CPU threads; every stream is an in-order queue with events, waits, capture and
//!   replay as on CUDA. It is the default where no GPU is present and the reference that GPU
//!   results are checked against.
//!
//! Besides kernels, the runtime provides one library primitive, [`gemm`]: a stream-ordered,
//! capturable matrix multiply (cuBLAS on CUDA, loaded at run time like the driver; a blocked CPU
//! GEMM on the host). [`collective`](fn@collective) enqueues collectives between the ranks of a [`Comm`] the
//! same way (NCCL on CUDA, point-to-point messages between host devices).
//!
//! [`Device::auto`] picks the device from `$CUFLOW_DEVICE` (`host`, `cuda`, `cuda:N`), else
//! CUDA device 0 when usable, else the host.
//!
//! ```
//! use cuflow_runtime::{Device, DeviceBuffer};
//! # fn main() -> Result<(), cuflow_runtime::DeviceError> {
//! let device = Device::host();
//! let (a, b) = (device.new_stream()?, device.new_stream()?);
//! let buf = DeviceBuffer::from_host(&a, &[1u32, 2, 3])?;
//! let copy = DeviceBuffer::<u32>::alloc(&b, 3)?;
//! // b reads what a wrote: the copy orders itself after a's write (no event to manage).
//! copy.copy_from(&b, &buf)?;
//! assert_eq!(copy.to_host_vec(&b)?, vec![1, 2, 3]);
//! # Ok(()) }
//! ```
//!
//! Ordering across streams is automatic for every access to a buffer (see the `access`
//! module's rules: a write after the reads and writes before it, a read after the last write);
//! events ([`Stream::record_event`], [`Stream::wait_event`]) order anything else.

mod access;
mod backend;
mod blas;
mod capture;
mod collective;
mod device;
mod error;
mod event;
mod kernel;
mod memory;
mod pool;
pub mod scope;
mod stream;
pub mod sync;
pub mod trace;

#[cfg(all(test, loom))]
mod loom_tests;

pub use blas::{gemm, GemmConfig, GemmDtype, GemmElem, GemmOutput};
pub use capture::{Graph, GraphExec};
pub use collective::{
    collective, CollectiveCall, CollectiveDtype, CollectiveElem, Comm, HostTransport, ReduceOp,
};
pub use device::{Device, DeviceId, DeviceLimits, MemoryInfo};
pub use error::{BackendKind, DeviceError, DriverError, Result};
pub use event::Event;
pub use kernel::{HostKernelArgs, HostKernelFn, Kernel, KernelArgs, LaunchConfig};
pub use memory::{
    BufferView, DeviceBuffer, DeviceCopy, PinnedBuffer, PinnedMut, PinnedRef, PinnedTransfer,
};
pub use pool::{MemoryPool, PoolStats};
pub use scope::{EnteredScope, ErrorScope};
pub use stream::{in_host_function, Stream, StreamId};

//! The host backend: CPU threads with CUDA's stream semantics.
//!
//! Each stream is an in-order queue served by one worker thread. Events complete when the
//! worker reaches them; a wait enqueues a task that blocks the worker until the event is done.
//! Memory is a word vector behind a reader-writer lock; every task that touches several
//! allocations locks them in address order, so concurrent streams never deadlock. Capture
//! records tasks (which are re-runnable `Fn`s) with their dependencies instead of running them;
//! a replay runs the nodes in recorded (topological) order on the launching stream.
//!
//! Host kernels and host functions run on worker threads; they may not block on a stream
//! (that would deadlock a worker), which is reported as [`DeviceError::Reentrant`](crate::DeviceError::Reentrant).

mod blas;
mod capture;
mod collective;
mod kernel;
mod memory;
mod stream;

pub(crate) use blas::{gemm, GemmOperand};
pub(crate) use capture::{HostCapture, HostGraph, HostGraphExec, HostNodeKind};
pub(crate) use collective::{enqueue_collective, HostComm};
pub(crate) use kernel::launch_host_kernel;
pub(crate) use memory::{HostMemory, HostPinned};
pub(crate) use stream::{on_worker_thread, HostCopyToHost, HostEvent, HostStream, HostSyncWait};

use crate::device::MemoryInfo;
use crate::error::Result;
use crate::stream::StreamId;

/// Stream priorities of the host backend as `(least, greatest)`, CUDA's usual range. Host
/// streams do not schedule by priority, but they keep the value within this range as CUDA does.
pub(crate) const PRIORITY_RANGE: (i32, i32) = (0, -5);

/// The host device's state: its number among the process's host devices (see
/// [`Device::host_numbered`](crate::Device::host_numbered)).
pub(crate) struct HostDevice {
    index: usize,
}

impl HostDevice {
    pub(crate) fn new(index: usize) -> Self {
        HostDevice { index }
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn new_stream(&self, id: StreamId) -> Result<HostStream> {
        HostStream::spawn(id)
    }

    pub(crate) fn memory_info(&self) -> MemoryInfo {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |name: &str| -> Option<usize> {
            meminfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<usize>().ok())
                .map(|kb| kb * 1024)
        };
        let total = field("MemTotal:").unwrap_or(0);
        MemoryInfo {
            free: field("MemAvailable:").unwrap_or(total),
            total,
        }
    }
}

//! Each device's memory pool: its configuration (the release threshold) and statistics (bytes
//! in use, bytes reserved, their high-water marks).
//!
//! Buffers are allocated stream-ordered from the device's pool: on CUDA, the device's default
//! memory pool through `cuMemAllocAsync` / `cuMemFreeAsync`; on the host backend, host memory
//! per allocation. A freed allocation goes back to the pool; the pool returns memory to the
//! driver, at the next synchronization, only above its **release threshold** (cuflow sets it to
//! "keep everything" when it opens a device, so steady-state loops never reach the driver's
//! allocator). [`MemoryPool`] reads and sets it, reports the pool's statistics, resets their
//! peaks, and trims the pool.
//!
//! The host backend keeps the same counters: its "reserved" bytes are the bytes of its live
//! allocations (host memory goes back to the system when freed), and its release threshold is
//! recorded and reported but changes nothing.
//!
//! **Capture.** cuflow never records allocation nodes into a graph: a buffer allocated while
//! its stream is capturing is allocated at once, from the same pool, outside the graph, and
//! the graph keeps it (its replays find it at the same address); so do the cuBLAS workspaces
//! of captured GEMMs. Such memory counts as in use (and reserved) for as long as the graph
//! lives, and neither the release threshold nor [`MemoryPool::trim_to`] can release it; it
//! goes back to the pool when the graph is dropped and its last replay has finished. Frees of
//! buffers that a capturing stream used are held until the capture ends.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::device::Device;
use crate::error::Result;

/// The neutral half of a device's pool state: the high-water mark of the bytes in use, and the
/// release threshold as last set (what the host backend reports).
#[derive(Debug)]
pub(crate) struct PoolCounters {
    peak_in_use: AtomicUsize,
    release_threshold: AtomicU64,
}

impl PoolCounters {
    pub(crate) fn new() -> Self {
        PoolCounters {
            peak_in_use: AtomicUsize::new(0),
            release_threshold: AtomicU64::new(u64::MAX),
        }
    }

    /// Records that the bytes in use reached `in_use`.
    pub(crate) fn note_in_use(&self, in_use: usize) {
        self.peak_in_use.fetch_max(in_use, Ordering::AcqRel);
    }
}

/// A device's memory statistics, in bytes (see [`MemoryPool::stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Bytes in live cuflow buffers on the device ([`Device::bytes_in_use`]).
    pub in_use: usize,
    /// The most bytes in use at once since the device was opened or the peaks were reset.
    pub peak_in_use: usize,
    /// Bytes the pool holds from the driver: in use, or freed and kept for reuse (CUDA's
    /// `RESERVED_MEM_CURRENT`; on the host, the bytes of live allocations). It includes memory
    /// the runtime allocates for itself (cuBLAS workspaces).
    pub reserved: usize,
    /// The most bytes reserved at once since the device was opened or the peaks were reset.
    pub peak_reserved: usize,
}

/// A device's memory pool: configuration and statistics. From [`Device::memory_pool`].
///
/// # Examples
///
/// ```
/// use cuflow_runtime::{Device, DeviceBuffer};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let device = Device::host();
/// let pool = device.memory_pool();
/// pool.set_release_threshold(64 << 20)?; // keep up to 64 MiB of freed memory
/// assert_eq!(pool.release_threshold()?, 64 << 20);
/// let stream = device.new_stream()?;
/// pool.reset_peak()?;
/// let before = pool.stats()?;
/// let buf = DeviceBuffer::<f32>::alloc(&stream, 1 << 20)?;
/// let during = pool.stats()?;
/// assert!(during.in_use >= before.in_use + (4 << 20));
/// drop(buf);
/// stream.synchronize()?;
/// assert!(pool.stats()?.peak_in_use >= before.in_use + (4 << 20));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryPool {
    device: Device,
}

impl MemoryPool {
    /// The device whose pool this is.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The bytes of freed memory the pool keeps rather than return to the driver at a
    /// synchronization (`u64::MAX`, keep everything, unless set).
    ///
    /// # Errors
    ///
    /// A driver error, or [`DeviceError::DeviceFaulted`](crate::DeviceError::DeviceFaulted).
    pub fn release_threshold(&self) -> Result<u64> {
        let recorded = &self.device.inner.pool.release_threshold;
        Ok(self
            .device
            .inner
            .backend
            .pool_release_threshold()?
            .unwrap_or_else(|| recorded.load(Ordering::Acquire)))
    }

    /// Sets the release threshold: at each synchronization the pool returns freed memory to
    /// the driver until it holds at most `bytes` beyond what is in use. 0 releases everything
    /// freed; `u64::MAX` keeps everything (the default). Applies to the whole device, every
    /// stream and thread; a recovered device starts again from the default.
    ///
    /// # Errors
    ///
    /// A driver error, or [`DeviceError::DeviceFaulted`](crate::DeviceError::DeviceFaulted).
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.device
            .inner
            .backend
            .set_pool_release_threshold(bytes)?;
        self.device
            .inner
            .pool
            .release_threshold
            .store(bytes, Ordering::Release);
        Ok(())
    }

    /// The pool's statistics now. Allocations and frees are stream-ordered: a dropped buffer
    /// leaves `in_use` when its free is enqueued, and the pool's `reserved` bytes change when
    /// the free runs and at synchronizations.
    ///
    /// # Errors
    ///
    /// A driver error, or [`DeviceError::DeviceFaulted`](crate::DeviceError::DeviceFaulted).
    pub fn stats(&self) -> Result<PoolStats> {
        let inner = &self.device.inner;
        let in_use = inner.bytes_in_use.load(Ordering::Acquire);
        let peak_in_use = inner.pool.peak_in_use.load(Ordering::Acquire).max(in_use);
        let (reserved, peak_reserved) = match inner.backend.pool_reserved()? {
            Some(reserved) => reserved,
            None => (in_use, peak_in_use),
        };
        Ok(PoolStats {
            in_use,
            peak_in_use,
            reserved,
            peak_reserved,
        })
    }

    /// Resets the high-water marks (`peak_in_use`, `peak_reserved`) to the current values.
    ///
    /// # Errors
    ///
    /// A driver error, or [`DeviceError::DeviceFaulted`](crate::DeviceError::DeviceFaulted).
    pub fn reset_peak(&self) -> Result<()> {
        let inner = &self.device.inner;
        inner.backend.reset_pool_peaks()?;
        let counters = &inner.pool;
        counters.peak_in_use.store(
            inner.bytes_in_use.load(Ordering::Acquire),
            Ordering::Release,
        );
        // An allocation between the two lines above must not leave the peak below it.
        counters.note_in_use(inner.bytes_in_use.load(Ordering::Acquire));
        Ok(())
    }

    /// Returns freed memory to the driver until the pool holds at most `keep_bytes` beyond
    /// what is in use (memory in use, and memory graphs keep, stays). The host backend holds
    /// no freed memory: nothing to do there.
    ///
    /// # Errors
    ///
    /// A driver error, or [`DeviceError::DeviceFaulted`](crate::DeviceError::DeviceFaulted).
    pub fn trim_to(&self, keep_bytes: usize) -> Result<()> {
        self.device.inner.backend.trim_pool(keep_bytes)
    }
}

impl Device {
    /// The device's memory pool: its release threshold and statistics (see [`MemoryPool`]).
    pub fn memory_pool(&self) -> MemoryPool {
        MemoryPool {
            device: self.clone(),
        }
    }
}

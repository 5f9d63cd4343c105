//! Page-locked staging for copies between pageable host memory and a device.
//!
//! The driver returns from a copy of device memory into pageable memory only once the copy has
//! landed, and a large copy out of pageable memory waits for the stream to reach it once the
//! driver's own staging is full. Either way the caller waits for the stream's earlier work
//! while it holds the buffer's access state (and the stream's capture gate), so a host function
//! before the copy that waits for another thread to write that buffer hangs both; and on two
//! H200 a read-back spinning in the driver while other threads instantiated and destroyed
//! graphs hung whole processes. So copies go through page-locked buffers kept by the device:
//!
//! - **Read-backs**: the device copies into a staging buffer and an event follows; the caller
//!   lets the locks go, waits for the event, and copies into its slice
//!   (`CudaCopyToHost::finish`).
//! - **Writes**: the caller's bytes are copied into staging buffers at once, the device copies
//!   from them, and an event follows each; the caller never waits. A buffer whose copy is in
//!   flight is reclaimed once its event has completed, at a later staging request.
//!
//! A device keeps up to [`KEPT`] bytes of idle buffers for later copies (buffers of at most
//! [`CHUNK`] bytes); larger or further ones are freed at the next synchronization of one of
//! its streams or the end of a read-back, where no lock of the runtime is held (freeing
//! page-locked memory may wait for the device). So a read-back larger than that, or the writes
//! made between two synchronizations, hold page-locked memory of their size for a while. A
//! buffer whose copy may still be in flight is never reused or freed: when whether it landed
//! cannot be known (a wait failed on a device that did not fault), it is leaked.

use cudarc::driver::{result, sys};

use super::{driver_err, CudaDeviceShared, RawEvent};
use crate::error::{DeviceError, Result};

/// The largest buffer the pool keeps, and the size of each piece of a write.
pub(crate) const CHUNK: usize = 16 << 20;
/// The most bytes of idle buffers a device keeps.
const KEPT: usize = 32 << 20;
/// The smallest buffer allocated.
const MIN: usize = 64 << 10;

/// Page-locked host memory allocated with `cuMemHostAlloc`, lent to one copy at a time. It
/// holds no handle of the device's state, so the state can keep it without a cycle; whoever
/// holds it frees it with [`HostStaging::free`] or leaks it (dropping it frees nothing).
pub(crate) struct HostStaging {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: plain host memory owned uniquely by this value; access goes through `&self` /
// `&mut self`, so Rust's borrow rules order it across threads.
unsafe impl Send for HostStaging {}

impl HostStaging {
    /// `bytes` (> 0) of page-locked memory of `shared`'s context, zeroed.
    fn alloc(shared: &CudaDeviceShared, bytes: usize) -> Result<HostStaging> {
        let _bound = shared.bind()?;
        // SAFETY: allocates fresh page-locked memory, owned by the returned value.
        let p = unsafe { result::malloc_host(bytes, 0) }.map_err(|e| match e.0 {
            sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => DeviceError::OutOfMemory {
                bytes,
                device: "pinned host memory".into(),
            },
            _ => driver_err("cuMemHostAlloc", e),
        })? as *mut u8;
        // SAFETY: `p` points to `bytes` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(p, 0, bytes) };
        Ok(HostStaging { ptr: p, bytes })
    }

    /// Its size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Its first `len` bytes (at most its size).
    pub(crate) fn head(&self, len: usize) -> &[u8] {
        // SAFETY: `ptr` points to `bytes` initialized bytes owned by `self`; no copy writes
        // them while the host can borrow them (a read-back waits for its copy before it reads
        // them).
        unsafe { std::slice::from_raw_parts(self.ptr, len.min(self.bytes)) }
    }

    /// Its first `len` bytes (at most its size), mutably.
    pub(crate) fn head_mut(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: as in `head`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len.min(self.bytes)) }
    }

    /// Frees it, unless `shared` (the state it was allocated in) was reset, which freed it
    /// already. No copy may still use it.
    pub(crate) fn free(self, shared: &CudaDeviceShared) {
        let ptr = self.ptr;
        let ctx = &shared.ctx;
        shared.life.release(|| {
            ctx.record_err(ctx.bind_to_thread());
            // SAFETY: `ptr` came from cuMemHostAlloc in this state of the context (not reset:
            // Life), is freed once (`self` is consumed) and no copy uses it (the caller's
            // promise).
            if let Err(e) = unsafe { result::free_host(ptr as *mut std::ffi::c_void) } {
                tracing::warn!(
                    "freeing pinned memory failed: {}",
                    driver_err("cuMemFreeHost", e)
                );
            }
        });
    }
}

/// A device's staging buffers: idle ones, and those the copies of writes still read.
#[derive(Default)]
pub(crate) struct StagingPool {
    idle: Vec<HostStaging>,
    /// Each with the event recorded after the copy that reads it.
    in_flight: Vec<(HostStaging, RawEvent)>,
}

impl CudaDeviceShared {
    /// A staging buffer of at least `len` bytes: an idle one when one is large enough (after
    /// reclaiming the buffers whose writes have landed), or a new one.
    pub(crate) fn take_staging(&self, len: usize) -> Result<HostStaging> {
        let mut pool = self.host_staging.lock();
        self.reclaim(&mut pool);
        if let Some(i) = pool.idle.iter().position(|s| s.bytes() >= len) {
            return Ok(pool.idle.swap_remove(i));
        }
        drop(pool);
        let bytes = if len <= CHUNK {
            len.max(MIN).next_power_of_two()
        } else {
            len.div_ceil(MIN).saturating_mul(MIN)
        };
        HostStaging::alloc(self, bytes)
    }

    /// Takes back a staging buffer that no copy uses any more, as an idle one ([`trim_staging`]
    /// frees the idle ones beyond what the pool keeps).
    ///
    /// [`trim_staging`]: CudaDeviceShared::trim_staging
    pub(crate) fn give_back_staging(&self, staging: HostStaging) {
        self.host_staging.lock().idle.push(staging);
    }

    /// Frees the idle buffers beyond what the pool keeps: any larger than [`CHUNK`], and the
    /// largest while they total more than [`KEPT`] bytes. Called only where the caller holds
    /// no lock of the runtime (a stream's synchronization, the end of a read-back): freeing
    /// page-locked memory may wait for the device.
    pub(crate) fn trim_staging(&self) {
        let mut freed = Vec::new();
        {
            let mut pool = self.host_staging.lock();
            self.reclaim(&mut pool);
            pool.idle.sort_by_key(HostStaging::bytes);
            let mut total: usize = pool.idle.iter().map(HostStaging::bytes).sum();
            while let Some(largest) = pool.idle.last() {
                if largest.bytes() <= CHUNK && total <= KEPT {
                    break;
                }
                total -= largest.bytes();
                freed.extend(pool.idle.pop());
            }
        }
        for staging in freed {
            staging.free(self);
        }
    }

    /// Copies `data` into staging buffers and enqueues copies from them into `dst` (a device
    /// address with room for `data.len()` bytes) on `stream`, an event after each; returns
    /// without waiting for them. The buffers go back to the pool once their events complete.
    pub(crate) fn stage_write(&self, stream: sys::CUstream, dst: u64, data: &[u8]) -> Result<()> {
        for (i, piece) in data.chunks(CHUNK).enumerate() {
            let mut staging = self.take_staging(piece.len())?;
            staging.head_mut(piece.len()).copy_from_slice(piece);
            let event = match self.take_event() {
                Ok(e) => e,
                Err(e) => {
                    self.give_back_staging(staging);
                    return Err(e);
                }
            };
            let at = dst + (i * CHUNK) as u64;
            let enqueued = self.bind().and_then(|_bound| {
                // SAFETY: the staging buffer holds `piece.len()` initialized page-locked bytes
                // and is kept in `in_flight` below, neither reused nor freed, until the event
                // recorded after this copy has completed; `dst` has room for all of `data`
                // (the caller's bounds check) and stays allocated until the copy ran (the
                // access tracker orders its free after it); the stream is alive.
                unsafe {
                    result::memcpy_htod_async(at, staging.head(piece.len()), stream)
                        .map_err(|e| driver_err("cuMemcpyHtoDAsync", e))?;
                }
                // SAFETY: the event comes from this context's pool and the stream is alive.
                unsafe { result::event::record(event.0, stream) }
                    .map_err(|e| driver_err("cuEventRecord", e))
            });
            match enqueued {
                Ok(()) => self.host_staging.lock().in_flight.push((staging, event)),
                Err(e) => {
                    // The copy may have been enqueued with no event after it: the stream,
                    // waited for, says when it ran; when that fails too, the buffer is freed
                    // if the device runs no more work and leaked otherwise.
                    self.return_event(event);
                    let waited = self.bind().and_then(|_bound| {
                        // SAFETY: the stream is alive (the caller's).
                        unsafe { result::stream::synchronize(stream) }
                            .map_err(|e| driver_err("cuStreamSynchronize", e))
                    });
                    match waited {
                        Ok(()) => self.give_back_staging(staging),
                        Err(_) if self.life.check().is_err() => staging.free(self),
                        Err(_) => leak(staging),
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Moves the buffers whose copies have landed from `in_flight` to the idle ones (or frees
    /// them); a buffer whose event failed is freed once the device faulted (its work runs no
    /// more).
    fn reclaim(&self, pool: &mut StagingPool) {
        if pool.in_flight.is_empty() {
            return;
        }
        let Ok(_bound) = self.bind() else {
            if self.life.check().is_err() {
                // A faulted or reset device: its copies run no more.
                for (staging, event) in std::mem::take(&mut pool.in_flight) {
                    self.return_event(event);
                    staging.free(self);
                }
            }
            return;
        };
        let mut i = 0;
        while i < pool.in_flight.len() {
            // SAFETY: the event is alive, owned by the pool, of this context (bound above).
            let done = unsafe { result::event::query(pool.in_flight[i].1 .0) };
            match done {
                Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => i += 1,
                Ok(()) => {
                    let (staging, event) = pool.in_flight.swap_remove(i);
                    self.return_event(event);
                    pool.idle.push(staging);
                }
                Err(_) => {
                    let (staging, event) = pool.in_flight.swap_remove(i);
                    self.return_event(event);
                    if self.life.check().is_err() {
                        staging.free(self);
                    } else {
                        leak(staging);
                    }
                }
            }
        }
    }

    /// Releases the pool when the device's state is dropped: waits for the copies still
    /// reading its buffers, then frees them.
    pub(crate) fn release_staging(&mut self) {
        let pool = std::mem::take(self.host_staging.get_mut());
        for (staging, event) in pool.in_flight {
            // Unless the state was reset (which ended its copies and freed its memory), the
            // copy is waited for; a wait that fails leaves a faulted context, whose copies run
            // no more.
            self.life.release(|| {
                let ctx = &self.ctx;
                ctx.record_err(ctx.bind_to_thread());
                // SAFETY: the event is alive and of this context, bound just above.
                ctx.record_err(unsafe { result::event::synchronize(event.0) });
            });
            self.return_event(event);
            staging.free(self);
        }
        for staging in pool.idle {
            staging.free(self);
        }
    }
}

/// Leaves a staging buffer allocated for good: whether a copy still uses it is unknown.
fn leak(staging: HostStaging) {
    tracing::warn!(
        "a staging buffer of {} bytes of pinned memory is leaked: whether its copy landed is \
         unknown",
        staging.bytes()
    );
}

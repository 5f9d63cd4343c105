//! Copies between two CUDA devices: direct peer copies where the driver allows them (enabled
//! here, enqueued by `CudaStreamHandle::copy_device`), else staged through page-locked host
//! memory.
//!
//! Peer access is enabled lazily, once per (reading context, peer) pair, and the answer is
//! cached in the reading device's shared state. Device memory comes from the devices' default
//! stream-ordered pools, whose visibility to other devices is governed by the pool rather than
//! by the context, so enabling a pair also grants the reading device access to the peer's
//! default pool.
//!
//! A staged copy runs chunk by chunk through a ring of portable page-locked buffers owned by
//! the destination device: each chunk is copied device-to-host on a stream of the source
//! device, then host-to-device on the destination stream after an event of the first copy.
//! A buffer of the ring is reused only after an event of the host-to-device copy that last
//! read it, so the whole copy is stream-ordered and the calling thread never waits.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::memory::{CudaMemory, CudaPinned};
use super::stream::{CudaEventHandle, CudaStreamHandle};
use super::{driver_err, CudaDeviceShared};
use crate::error::{DeviceError, Result};

/// Bytes per staging buffer; two of them form a destination device's ring.
pub(crate) const STAGING_CHUNK: usize = 8 << 20;

/// The number of staging buffers in a ring.
const STAGING_SLOTS: usize = 2;

/// Whether `dev` can read `peer`'s memory directly (`cuDeviceCanAccessPeer`).
pub(super) fn can_access_peer(dev: &CudaDeviceShared, peer: &CudaDeviceShared) -> Result<bool> {
    if dev.ordinal == peer.ordinal {
        return Ok(true);
    }
    let mut can: std::ffi::c_int = 0;
    // SAFETY: both device handles come from live contexts (Context), and `can` is a valid
    // out-pointer for the duration of the call.
    unsafe {
        sys::cuDeviceCanAccessPeer(&mut can, dev.ctx.cu_device(), peer.ctx.cu_device()).result()
    }
    .map_err(|e| driver_err("cuDeviceCanAccessPeer", e))?;
    Ok(can != 0)
}

/// Enables direct access from `dev`'s context to `peer`'s memory where the driver allows it,
/// once per pair; returns whether copies from `peer` into `dev` can go directly.
pub(super) fn enable_peer_access(dev: &CudaDeviceShared, peer: &CudaDeviceShared) -> Result<bool> {
    if dev.ordinal == peer.ordinal {
        return Ok(true);
    }
    let mut peers = dev.peers.lock();
    if let Some(&enabled) = peers.get(&peer.ordinal) {
        return Ok(enabled);
    }
    if !can_access_peer(dev, peer)? {
        peers.insert(peer.ordinal, false);
        return Ok(false);
    }
    let _bound = dev.bind()?;
    // SAFETY: the peer context is alive (its shared state holds it) and the calling thread has
    // `dev`'s context bound, which is the context being granted access; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0).result() } {
        Ok(()) => {}
        Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
        // The topology allows it but the driver will not set it up (e.g. too many peers):
        // copies between the two are staged instead.
        Err(e)
            if e.0 == sys::cudaError_enum::CUDA_ERROR_TOO_MANY_PEERS
                || e.0 == sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED =>
        {
            peers.insert(peer.ordinal, false);
            return Ok(false);
        }
        Err(e) => return Err(driver_err("cuCtxEnablePeerAccess", e)),
    }
    // SAFETY: the device handle comes from the peer's live context.
    let pool = unsafe { result::device::get_default_mem_pool(peer.ctx.cu_device()) }
        .map_err(|e| driver_err("cuDeviceGetDefaultMemPool", e))?;
    let access = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev.ordinal as std::ffi::c_int,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `pool` is the peer's default pool, `access` is one valid descriptor naming
    // another device than the pool's own, and it lives until the call returns.
    unsafe { sys::cuMemPoolSetAccess(pool, &access, 1).result() }
        .map_err(|e| driver_err("cuMemPoolSetAccess", e))?;
    peers.insert(peer.ordinal, true);
    Ok(true)
}

impl CudaStreamHandle {
    /// Whether this stream's device reads `src`'s device's memory directly, enabling the
    /// access at the first call for the pair; `false` means copies from it must be staged.
    pub(crate) fn peer_access(&self, src: &CudaMemory) -> Result<bool> {
        enable_peer_access(&self.shared, src.shared())
    }
}

/// One buffer of a staging ring, with the event after which it may be written again.
struct StagingSlot {
    buffer: CudaPinned,
    reusable_after: Option<CudaEventHandle>,
}

impl Drop for StagingSlot {
    fn drop(&mut self) {
        // The buffer is freed right after this: wait for the copy that still reads it.
        if let Some(event) = self.reusable_after.take() {
            if let Err(e) = event.synchronize() {
                tracing::warn!("a staged copy failed while its staging buffer was freed: {e}");
            }
        }
    }
}

/// The staging ring of one destination device.
pub(crate) struct StagingRing {
    slots: Vec<StagingSlot>,
}

impl StagingRing {
    fn new(shared: &Arc<CudaDeviceShared>) -> Result<StagingRing> {
        let slots = (0..STAGING_SLOTS)
            .map(|_| {
                Ok(StagingSlot {
                    buffer: CudaPinned::alloc_portable(shared, STAGING_CHUNK)?,
                    reusable_after: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(StagingRing { slots })
    }
}

/// Copies `len` bytes from `src` into `dst` through the destination device's staging ring:
/// device-to-host on `src_stream` (a stream of `src`'s device), host-to-device on
/// `dst_stream` (a stream of `dst`'s device). Stream-ordered on both streams; does not wait.
pub(crate) fn copy_staged(
    src_stream: &CudaStreamHandle,
    src: &CudaMemory,
    src_offset: usize,
    dst_stream: &CudaStreamHandle,
    dst: &CudaMemory,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // Held for the whole copy: concurrent staged copies into one device take turns.
    let mut guard = dst_stream.shared.staging.lock();
    let ring = match &mut *guard {
        Some(ring) => ring,
        empty => empty.insert(StagingRing::new(&dst_stream.shared)?),
    };
    let mut done = 0;
    let mut chunk = 0;
    while done < len {
        let n = (len - done).min(STAGING_CHUNK);
        let slot = &mut ring.slots[chunk % STAGING_SLOTS];
        let staged = stage_chunk(
            slot,
            (src_stream, src, src_offset + done),
            (dst_stream, dst, dst_offset + done),
            n,
        );
        if let Err(ChunkFailed { error, unfenced }) = staged {
            if let Some(stream) = unfenced {
                // A faulted device runs none of its work again: its copies will not touch the
                // slot. Otherwise the slot may still be written or read by the chunk's copies,
                // and no event says when they end: the ring is neither reused nor freed (the
                // next staged copy makes a new one).
                if let Err(wait) = stream.synchronize() {
                    if stream.shared.life.check().is_ok() {
                        tracing::warn!(
                            "a staging ring is leaked: a staged copy failed ({error}) and \
                             waiting for its copies failed too ({wait})"
                        );
                        std::mem::forget(guard.take());
                    }
                }
            }
            return Err(error);
        }
        done += n;
        chunk += 1;
    }
    Ok(())
}

/// A chunk of a staged copy that failed, and the stream (if any) whose enqueued copies may
/// still touch the chunk's slot without the slot's `reusable_after` covering them.
struct ChunkFailed<'s> {
    error: DeviceError,
    unfenced: Option<&'s CudaStreamHandle>,
}

/// Copies `n` bytes through `slot`: device-to-host from `src` on `src_stream`, then
/// host-to-device into `dst` on `dst_stream` (each with its byte offset), and leaves in
/// `reusable_after` an event after which the slot may be written again.
///
/// On an error, `reusable_after` still covers every copy that touches the slot, or the error
/// names the stream to wait for before the slot is used again: once the device-to-host copy
/// is enqueued, the slot's writer is that copy, not the reader the old event covers.
fn stage_chunk<'s>(
    slot: &mut StagingSlot,
    (src_stream, src, src_offset): (&'s CudaStreamHandle, &CudaMemory, usize),
    (dst_stream, dst, dst_offset): (&'s CudaStreamHandle, &CudaMemory, usize),
    n: usize,
) -> std::result::Result<(), ChunkFailed<'s>> {
    let fenced = |error| ChunkFailed {
        error,
        unfenced: None,
    };
    if let Some(event) = &slot.reusable_after {
        src_stream.wait_event(event).map_err(fenced)?;
    }
    src_stream
        .enqueue_bytes("cuMemcpyDtoHAsync", n, |stream| {
            let host = &mut slot.buffer.raw_bytes_mut()[..n];
            // SAFETY: `host` is portable page-locked memory owned by the ring, which lives as
            // long as the destination device and is rewritten only after the event of the copy
            // that last touched it (waited on above; on an error, `copy_staged` waits for the
            // copies no event covers, or leaks the ring); the source range was bounds-checked
            // and its free is ordered after `src_stream`'s work.
            unsafe { result::memcpy_dtoh_async(host, src.ptr() + src_offset as u64, stream) }
        })
        .map_err(fenced)?;
    // The copy into the slot is enqueued: the old `reusable_after` no longer covers the slot.
    let staged = src_stream
        .record_event(false)
        .map_err(|error| ChunkFailed {
            error,
            unfenced: Some(src_stream),
        })?;
    // `staged` covers the write into the slot, and (`src_stream` waited for it) the old reader.
    let read = dst_stream.wait_event(&staged).and_then(|()| {
        dst_stream.enqueue_bytes("cuMemcpyHtoDAsync", n, |stream| {
            let host = &slot.buffer.raw_bytes()[..n];
            // SAFETY: the destination range was bounds-checked and its free is ordered after
            // `dst_stream`'s work; `host` stays allocated and unwritten until the event
            // recorded below completes (or, that failing, `dst_stream` was waited for), and
            // this copy starts after the device-to-host copy filling it.
            unsafe { result::memcpy_htod_async(dst.ptr() + dst_offset as u64, host, stream) }
        })
    });
    if let Err(error) = read {
        // Nothing on `dst_stream` reads the slot: `staged` covers every copy touching it.
        slot.reusable_after = Some(staged);
        return Err(fenced(error));
    }
    match dst_stream.record_event(false) {
        Ok(read) => {
            slot.reusable_after = Some(read);
            Ok(())
        }
        Err(error) => {
            // The copy out of the slot is enqueued on `dst_stream` after `staged`: waiting for
            // that stream covers both copies.
            slot.reusable_after = Some(staged);
            Err(ChunkFailed {
                error,
                unfenced: Some(dst_stream),
            })
        }
    }
}

//! CUDA allocations: stream-ordered device memory from the device's default pool, and
//! page-locked host memory.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use super::stream::CudaStreamHandle;
use super::{driver_err, CudaDeviceShared};
use crate::error::{DeviceError, Result};
use crate::stream::Stream;

/// Keeps freed memory in the default pool rather than returning it to the driver at every
/// synchronization, so that steady-state loops never call into the allocator's slow path.
pub(super) fn keep_pool_memory(ctx: &Arc<CudaContext>) -> Result<()> {
    ctx.bind_to_thread()
        .map_err(|e| driver_err("cuCtxSetCurrent", e))?;
    // SAFETY: the device handle comes from a live context.
    let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }
        .map_err(|e| driver_err("cuDeviceGetDefaultMemPool", e))?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the pool is the device's default pool; RELEASE_THRESHOLD takes a u64.
    unsafe {
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut std::ffi::c_void,
        )
    }
    .map_err(|e| driver_err("cuMemPoolSetAttribute", e))
}

/// A device allocation. Freed by [`CudaMemory::free_on`] (stream-ordered); the runtime's
/// `Memory` decides on which stream, after its last use.
pub(crate) struct CudaMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    shared: Arc<CudaDeviceShared>,
}

impl CudaMemory {
    pub(crate) fn alloc(stream: &CudaStreamHandle, bytes: usize) -> Result<CudaMemory> {
        // SAFETY: the stream is alive (held by `stream`).
        unsafe { Self::alloc_on(stream.raw(), &stream.shared, bytes) }
    }

    /// Allocates for a capture in progress on `stream`: the allocation is made on the device's
    /// allocation stream, which never captures, and is complete when this returns, so the
    /// captured work may use it and every replay finds it at the same address. It comes from
    /// the same pool as [`CudaMemory::alloc`] and is freed the same way.
    pub(crate) fn alloc_outside_capture(
        stream: &CudaStreamHandle,
        bytes: usize,
    ) -> Result<CudaMemory> {
        if bytes == 0 {
            return Ok(CudaMemory {
                ptr: 0,
                bytes,
                shared: stream.shared.clone(),
            });
        }
        let side = stream.shared.alloc_stream()?;
        // SAFETY: the allocation stream is alive (held by `side`) and is not capturing (the
        // runtime never captures it).
        let mem = unsafe { Self::alloc_on(side.cu_stream(), &stream.shared, bytes) }?;
        // SAFETY: the stream is alive and not capturing; relaxed capture mode (the only mode
        // the runtime begins captures in) allows waiting for a stream outside the capture.
        unsafe { result::stream::synchronize(side.cu_stream()) }
            .map_err(|e| driver_err("cuStreamSynchronize", e))?;
        Ok(mem)
    }

    /// `bytes` of stream-ordered memory from the device's pool, allocated on `raw`.
    ///
    /// # Safety
    ///
    /// `raw` must be a live stream of `shared`'s context.
    unsafe fn alloc_on(
        raw: sys::CUstream,
        shared: &Arc<CudaDeviceShared>,
        bytes: usize,
    ) -> Result<CudaMemory> {
        let shared = shared.clone();
        if bytes == 0 {
            return Ok(CudaMemory {
                ptr: 0,
                bytes,
                shared,
            });
        }
        let ptr = {
            let _bound = shared.bind()?;
            // SAFETY: `raw` is a live stream of this context (the caller's contract); the
            // returned memory is owned by this `CudaMemory` alone and freed once (Handles).
            unsafe { result::malloc_async(raw, bytes) }.map_err(|e| match e.0 {
                sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY
                | sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE => DeviceError::OutOfMemory {
                    bytes,
                    device: format!("cuda:{}", shared.ordinal),
                },
                _ => driver_err("cuMemAllocAsync", e),
            })?
        };
        Ok(CudaMemory { ptr, bytes, shared })
    }

    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The state of the device the allocation belongs to.
    pub(crate) fn shared(&self) -> &Arc<CudaDeviceShared> {
        &self.shared
    }

    /// Moves the allocation out, leaving an empty one behind (used to defer a free).
    pub(crate) fn take(&mut self) -> CudaMemory {
        CudaMemory {
            ptr: std::mem::replace(&mut self.ptr, 0),
            bytes: std::mem::replace(&mut self.bytes, 0),
            shared: self.shared.clone(),
        }
    }

    /// Frees the allocation on `stream`, after the work already enqueued there.
    pub(crate) fn free_on(&mut self, stream: &CudaStreamHandle) {
        let ptr = std::mem::replace(&mut self.ptr, 0);
        if ptr == 0 {
            return;
        }
        let _bound = match self.shared.bind() {
            Ok(bound) => bound,
            // A faulted device's memory goes with its reset; a retired state's went already.
            Err(e) => {
                tracing::debug!("not freeing {} bytes of device memory: {e}", self.bytes);
                return;
            }
        };
        // SAFETY: `ptr` came from cuMemAllocAsync in this context and is freed exactly once
        // (it was swapped out above); `stream` has been ordered after every use (Ordering).
        if let Err(e) = unsafe { result::free_async(ptr, stream.raw()) } {
            tracing::warn!(
                "freeing {} bytes of device memory failed: {}",
                self.bytes,
                driver_err("cuMemFreeAsync", e)
            );
        }
    }

    pub(crate) fn leak_warning(&mut self, why: &str) {
        if self.ptr != 0 {
            tracing::warn!("leaking {} bytes of device memory ({why})", self.bytes);
            self.ptr = 0;
        }
    }

    /// Frees the allocation on the most recent of `uses` that belongs to its device, after
    /// making it wait for every other one (those of other devices included: copies between
    /// devices record a use on both buffers).
    pub(crate) fn free_after_uses(&mut self, uses: &[Stream]) {
        let ordinal = self.shared.ordinal;
        let own_device = |s: &Stream| s.backend().cuda().map(|c| c.shared.ordinal) == Some(ordinal);
        let Some(pos) = uses.iter().rposition(own_device) else {
            self.leak_warning("no stream of its device recorded");
            return;
        };
        let last = &uses[pos];
        let mut ordered = Ok(());
        for (i, other) in uses.iter().enumerate() {
            if i != pos {
                if let Err(e) = last.join(other) {
                    ordered = Err(e);
                }
            }
        }
        match (ordered, last.backend().cuda()) {
            (Ok(()), Some(s)) => self.free_on(s),
            (Err(e), _) => self.leak_warning(&e.to_string()),
            (Ok(()), None) => self.leak_warning("host stream"),
        }
    }
}

/// Page-locked host memory: allocated with `cuMemHostAlloc`, or for large buffers on Linux
/// mapped by the runtime and registered with `cuMemHostRegister` (see [`mapped`]).
pub(crate) struct CudaPinned {
    ptr: *mut u8,
    bytes: usize,
    /// How the memory was obtained, and so how it is given back.
    kind: PinnedKind,
    shared: Arc<CudaDeviceShared>,
    /// Handed to a user (counted by the device's `Life`, which refuses a reset meanwhile).
    for_user: bool,
}

/// How a [`CudaPinned`]'s memory was obtained.
#[derive(Clone, Copy)]
enum PinnedKind {
    /// `cuMemHostAlloc`: freed with `cuMemFreeHost`.
    Driver,
    /// A mapping of `len` bytes made by [`mapped::alloc`]: unregistered, then unmapped.
    #[cfg(target_os = "linux")]
    Mapped { len: usize },
}

// SAFETY: the pinned allocation is plain host memory owned uniquely by this value; access goes
// through `&self`/`&mut self`, so Rust's borrow rules order it across threads.
unsafe impl Send for CudaPinned {}
// SAFETY: shared access only produces `&[u8]` (see `raw_bytes`).
unsafe impl Sync for CudaPinned {}

impl CudaPinned {
    /// Page-locked memory for a user's buffer: while it lives, the device is not reset (its
    /// host memory would go with the context).
    pub(crate) fn alloc_for_user(
        shared: &Arc<CudaDeviceShared>,
        bytes: usize,
    ) -> Result<CudaPinned> {
        let mut pinned = Self::alloc_with_flags(shared, bytes, 0)?;
        pinned.for_user = true;
        shared.life.pinned_created();
        Ok(pinned)
    }

    /// Page-locked memory that every context of the process treats as pinned
    /// (`CU_MEMHOSTALLOC_PORTABLE`), for copies between devices.
    pub(crate) fn alloc_portable(
        shared: &Arc<CudaDeviceShared>,
        bytes: usize,
    ) -> Result<CudaPinned> {
        Self::alloc_with_flags(shared, bytes, sys::CU_MEMHOSTALLOC_PORTABLE)
    }

    fn alloc_with_flags(
        shared: &Arc<CudaDeviceShared>,
        bytes: usize,
        flags: std::ffi::c_uint,
    ) -> Result<CudaPinned> {
        let _bound = shared.bind()?;
        #[cfg(target_os = "linux")]
        if bytes >= mapped::MIN_BYTES {
            if let Some((ptr, len)) = mapped::alloc(bytes, flags) {
                return Ok(CudaPinned {
                    ptr,
                    bytes,
                    kind: PinnedKind::Mapped { len },
                    shared: shared.clone(),
                    for_user: false,
                });
            }
        }
        let ptr = if bytes == 0 {
            std::ptr::null_mut()
        } else {
            // SAFETY: allocates fresh page-locked memory, owned by the returned value.
            let p = unsafe { result::malloc_host(bytes, flags) }.map_err(|e| match e.0 {
                sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => DeviceError::OutOfMemory {
                    bytes,
                    device: "pinned host memory".into(),
                },
                _ => driver_err("cuMemHostAlloc", e),
            })? as *mut u8;
            // SAFETY: `p` points to `bytes` writable bytes just allocated.
            unsafe { std::ptr::write_bytes(p, 0, bytes) };
            p
        };
        Ok(CudaPinned {
            ptr,
            bytes,
            kind: PinnedKind::Driver,
            shared: shared.clone(),
            for_user: false,
        })
    }

    pub(crate) fn raw_bytes(&self) -> &[u8] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: `ptr` points to `bytes` initialized bytes owned by `self`; no device copy is
        // in flight while the host can borrow it (transfers own the buffer until they finish).
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    pub(crate) fn raw_bytes_mut(&mut self) -> &mut [u8] {
        if self.ptr.is_null() {
            return &mut [];
        }
        // SAFETY: as in `raw_bytes`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for CudaPinned {
    fn drop(&mut self) {
        if !self.ptr.is_null() && super::in_host_function() {
            // The driver refuses the free here: it is made at the next synchronization, by a
            // handle that takes over the memory (and the count of the user's buffers).
            let moved = CudaPinned {
                ptr: std::mem::replace(&mut self.ptr, std::ptr::null_mut()),
                bytes: self.bytes,
                kind: self.kind,
                shared: self.shared.clone(),
                for_user: std::mem::replace(&mut self.for_user, false),
            };
            self.shared.defer_host_fn_handle(moved);
            return;
        }
        if self.for_user {
            self.shared.life.pinned_dropped();
        }
        if self.ptr.is_null() {
            return;
        }
        let ptr = self.ptr;
        let ctx = &self.shared.ctx;
        match self.kind {
            PinnedKind::Driver => {
                self.shared.life.release(|| {
                    ctx.record_err(ctx.bind_to_thread());
                    // SAFETY: `ptr` came from cuMemHostAlloc in this state of the context (not
                    // reset: Life) and is freed once; transfers wait for their copies before
                    // giving the buffer back, so no copy uses it now.
                    if let Err(e) = unsafe { result::free_host(ptr as *mut std::ffi::c_void) } {
                        tracing::warn!(
                            "freeing pinned memory failed: {}",
                            driver_err("cuMemFreeHost", e)
                        );
                    }
                });
            }
            #[cfg(target_os = "linux")]
            PinnedKind::Mapped { len } => {
                self.shared.life.release(|| {
                    ctx.record_err(ctx.bind_to_thread());
                    // SAFETY: `ptr` was registered by `mapped::alloc` in this state of the
                    // context (not reset: Life, and a reset unregisters it itself) and is
                    // unregistered once; no copy uses it now (as above).
                    if let Err(e) = unsafe { sys::cuMemHostUnregister(ptr.cast()) }.result() {
                        tracing::warn!(
                            "unregistering pinned memory failed: {}",
                            driver_err("cuMemHostUnregister", e)
                        );
                    }
                });
                // SAFETY: the mapping `mapped::alloc` made and this value owned, no longer
                // registered with the driver (above, or by a reset of the context) and used
                // by nothing: unmapped once, whatever became of the context.
                unsafe { mapped::unmap(ptr, len) };
            }
        }
    }
}

/// Large page-locked buffers mapped by the runtime and registered with the driver, on Linux.
///
/// `cuMemHostAlloc` faults a buffer in one 4 KiB page at a time, which on the cloud virtual
/// machines measured (`docs/perf/pinned-alloc/`) costs some 2.5 µs a page: about 10 ms for
/// each 16 MiB staging buffer of a checkpoint load, together a quarter of loading a
/// 1B-parameter model (`docs/perf/llama-profile.md`). A private anonymous mapping of whole
/// 2 MiB pages, with transparent huge pages asked for, is faulted in 2 MiB at a time where
/// the kernel allows it (and 4 KiB at a time, as before, where it does not), then registered
/// with `cuMemHostRegister`, which pins it as `cuMemHostAlloc` would. The mapping is kept
/// out of child processes (`MADV_DONTFORK`): after a `fork` the parent's writes would
/// otherwise copy its pages away from the pinned ones. The kernel zeroes fresh anonymous
/// pages, so the memory is initialized.
#[cfg(target_os = "linux")]
mod mapped {
    use std::ffi::c_void;

    use cudarc::driver::sys;

    /// The size of a huge page, and the granule of a mapping.
    const HUGE: usize = 2 << 20;

    /// Buffers from this size on are mapped; smaller ones are allocated by the driver
    /// (rounding them up to whole huge pages would waste more than it saves).
    pub(super) const MIN_BYTES: usize = 4 << 20;

    /// `bytes` (rounded up to whole huge pages, the returned length) of zeroed memory,
    /// aligned to a huge page, registered with the bound context. `flags` are those of
    /// `cuMemHostAlloc`: 0, or `CU_MEMHOSTALLOC_PORTABLE`, which has the value of
    /// `CU_MEMHOSTREGISTER_PORTABLE`; any other flag means something else to the
    /// registration, and gives `None`. `None` also when the system refuses the mapping or the
    /// driver the registration: the caller allocates with `cuMemHostAlloc` instead, which
    /// reports what it refuses.
    pub(super) fn alloc(bytes: usize, flags: std::ffi::c_uint) -> Option<(*mut u8, usize)> {
        if flags & !sys::CU_MEMHOSTREGISTER_PORTABLE != 0 {
            return None;
        }
        let len = bytes.checked_next_multiple_of(HUGE)?;
        let span = len.checked_add(HUGE)?;
        // SAFETY: asks for a fresh private anonymous mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let base = start.next_multiple_of(HUGE);
        let (head, tail) = (base - start, start + span - (base + len));
        // SAFETY: the head and the tail lie in the mapping just made, outside the aligned
        // `len` bytes kept, and nothing refers to them.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((base + len) as *mut c_void, tail);
            }
        }
        let ptr = base as *mut c_void;
        // SAFETY: advice on the mapping owned here. Each is a request: huge pages are not
        // needed for correctness; a failed DONTFORK only matters to a process that forks
        // while the buffer lives, as with any pinned memory.
        unsafe {
            libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
            libc::madvise(ptr, len, libc::MADV_DONTFORK);
        }
        // SAFETY: `ptr` is `len` bytes of readable, writable memory mapped here, owned by the
        // caller from now on, which keeps it mapped until it has unregistered it.
        let registered = unsafe { sys::cuMemHostRegister_v2(ptr, len, flags) }.result();
        if registered.is_err() {
            // SAFETY: the mapping made above, not registered and used by nothing.
            unsafe { unmap(ptr.cast(), len) };
            return None;
        }
        Some((ptr.cast(), len))
    }

    /// Unmaps `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` and `len` are a mapping made by [`alloc`], not registered with the driver, that
    /// nothing refers to any more.
    pub(super) unsafe fn unmap(ptr: *mut u8, len: usize) {
        // SAFETY: the caller's promise.
        if unsafe { libc::munmap(ptr.cast(), len) } != 0 {
            tracing::warn!(
                "unmapping {len} bytes of pinned memory failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Page-locked host memory that read-backs from this device and copies into it are
/// staged through (see `CudaCopyToHost` and `StagedUpload`): kept by the device's state
/// between copies and lent to one copy at a time.
/// It holds no handle of the state, so the state can keep it without a cycle; whoever holds it
/// frees it with [`HostStaging::free`] or leaks it (dropping it frees nothing).
pub(crate) struct HostStaging {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: plain host memory owned uniquely by this value; access goes through `&self` /
// `&mut self`, so Rust's borrow rules order it across threads.
unsafe impl Send for HostStaging {}

impl HostStaging {
    /// `bytes` (> 0) of page-locked memory of `shared`'s context, zeroed.
    pub(crate) fn alloc(shared: &CudaDeviceShared, bytes: usize) -> Result<HostStaging> {
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
        // them while the host can borrow them (the read-back lending it waits for its copy
        // before it reads them).
        unsafe { std::slice::from_raw_parts(self.ptr, len.min(self.bytes)) }
    }

    /// Its first `len` bytes (at most its size), for the copy that fills them.
    pub(crate) fn head_mut(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: as in `head`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len.min(self.bytes)) }
    }

    /// Frees it, unless `shared` (the state it was allocated in) was reset, which freed it
    /// already. No copy may still be writing it.
    pub(crate) fn free(self, shared: &CudaDeviceShared) {
        let ptr = self.ptr;
        let ctx = &shared.ctx;
        shared.life.release(|| {
            ctx.record_err(ctx.bind_to_thread());
            // SAFETY: `ptr` came from cuMemHostAlloc in this state of the context (not reset:
            // Life), is freed once (`self` is consumed) and no copy writes it (the caller's
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

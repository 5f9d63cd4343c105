//! The device's default memory pool (the one `cuMemAllocAsync` allocates from): its release
//! threshold, its reserved bytes and their high-water mark, trimming.

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use super::{driver_err, CudaDevice};
use crate::error::Result;

use sys::CUmemPool_attribute as Attr;

impl CudaDevice {
    /// Runs `f` with the device's default pool, its context bound to this thread.
    fn with_pool<R>(&self, f: impl FnOnce(sys::CUmemoryPool) -> Result<R>) -> Result<R> {
        let _bound = self.shared.bind()?;
        // SAFETY: the device handle comes from this device's live context (bound above).
        let pool = unsafe { result::device::get_default_mem_pool(self.shared.ctx.cu_device()) }
            .map_err(|e| driver_err("cuDeviceGetDefaultMemPool", e))?;
        f(pool)
    }

    /// A `cuuint64_t` attribute of the default pool.
    fn pool_u64(&self, attr: Attr) -> Result<u64> {
        self.with_pool(|pool| {
            let mut value: u64 = 0;
            // SAFETY: `pool` is the device's default pool, valid while its context lives
            // (bound); every attribute read here is a `cuuint64_t`, which `value` is.
            unsafe {
                result::mem_pool::get_attribute(pool, attr, &mut value as *mut u64 as *mut c_void)
            }
            .map_err(|e| driver_err("cuMemPoolGetAttribute", e))?;
            Ok(value)
        })
    }

    /// Sets a `cuuint64_t` attribute of the default pool.
    fn set_pool_u64(&self, attr: Attr, mut value: u64) -> Result<()> {
        self.with_pool(|pool| {
            // SAFETY: as in `pool_u64`; the attributes set here (the release threshold, and
            // the high-water marks, reset with 0) take a `cuuint64_t`.
            unsafe {
                result::mem_pool::set_attribute(pool, attr, &mut value as *mut u64 as *mut c_void)
            }
            .map_err(|e| driver_err("cuMemPoolSetAttribute", e))
        })
    }

    pub(crate) fn pool_release_threshold(&self) -> Result<u64> {
        self.pool_u64(Attr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    }

    pub(crate) fn set_pool_release_threshold(&self, bytes: u64) -> Result<()> {
        self.set_pool_u64(Attr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes)
    }

    /// The pool's reserved bytes and their high-water mark.
    pub(crate) fn pool_reserved(&self) -> Result<(usize, usize)> {
        let current = self.pool_u64(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        let high = self.pool_u64(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?;
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Ok((size(current), size(high)))
    }

    /// Resets the pool's high-water marks to their current values (the driver's meaning of
    /// setting them to 0).
    pub(crate) fn reset_pool_peaks(&self) -> Result<()> {
        self.set_pool_u64(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0)?;
        self.set_pool_u64(Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)
    }

    /// Releases freed memory until the pool holds at most `keep_bytes` beyond what is in use.
    pub(crate) fn trim_pool(&self, keep_bytes: usize) -> Result<()> {
        self.with_pool(|pool| {
            // SAFETY: `pool` is the device's default pool (as in `pool_u64`); trimming only
            // releases memory no allocation holds.
            unsafe { result::mem_pool::trim_to(pool, keep_bytes) }
                .map_err(|e| driver_err("cuMemPoolTrimTo", e))
        })
    }
}

//! A device's backend half: what a device answers without a stream (its properties, new
//! streams, pinned memory, and what runs a kernel on it).

use std::sync::Arc;

use smallvec::SmallVec;

use super::{cuda, host, PinnedBackend, StreamBackend};
use crate::device::{DeviceId, DeviceLimits, MemoryInfo};
use crate::error::{BackendKind, DeviceError, Result};
use crate::kernel::{HostKernelFn, KernelInner};
use crate::stream::StreamId;

/// A device's backend half.
pub(crate) enum DeviceBackend {
    Host(host::HostDevice),
    Cuda(cuda::CudaDevice),
}

impl DeviceBackend {
    /// Host device number `index`.
    pub(crate) fn host(index: usize) -> DeviceBackend {
        DeviceBackend::Host(host::HostDevice::new(index))
    }

    /// CUDA device `ordinal`, with its name and launch limits.
    pub(crate) fn open_cuda(ordinal: usize) -> Result<(DeviceBackend, String, DeviceLimits)> {
        let (device, name, limits) = cuda::CudaDevice::open(ordinal)?;
        Ok((DeviceBackend::Cuda(device), name, limits))
    }

    pub(crate) fn kind(&self) -> BackendKind {
        match self {
            DeviceBackend::Host(_) => BackendKind::Host,
            DeviceBackend::Cuda(_) => BackendKind::Cuda,
        }
    }

    /// The CUDA device; `None` on the host.
    pub(crate) fn cuda(&self) -> Option<&cuda::CudaDevice> {
        match self {
            DeviceBackend::Host(_) => None,
            DeviceBackend::Cuda(d) => Some(d),
        }
    }

    /// The CUDA ordinal; `None` on the host.
    pub(crate) fn ordinal(&self) -> Option<usize> {
        match self {
            DeviceBackend::Host(_) => None,
            DeviceBackend::Cuda(c) => Some(c.ordinal()),
        }
    }

    /// The host device's number; `None` on CUDA.
    pub(crate) fn host_index(&self) -> Option<usize> {
        match self {
            DeviceBackend::Host(h) => Some(h.index()),
            DeviceBackend::Cuda(_) => None,
        }
    }

    pub(crate) fn compute_capability(&self) -> Option<(u32, u32)> {
        match self {
            DeviceBackend::Host(_) => None,
            DeviceBackend::Cuda(c) => Some(c.compute_capability()),
        }
    }

    pub(crate) fn memory_info(&self) -> Result<MemoryInfo> {
        match self {
            DeviceBackend::Host(h) => Ok(h.memory_info()),
            DeviceBackend::Cuda(c) => c.memory_info(),
        }
    }

    /// The pool's release threshold; `None` on the host (which only records it).
    pub(crate) fn pool_release_threshold(&self) -> Result<Option<u64>> {
        match self {
            DeviceBackend::Host(_) => Ok(None),
            DeviceBackend::Cuda(c) => c.pool_release_threshold().map(Some),
        }
    }

    /// Sets the pool's release threshold (the host backend has no pool to set).
    pub(crate) fn set_pool_release_threshold(&self, bytes: u64) -> Result<()> {
        match self {
            DeviceBackend::Host(_) => Ok(()),
            DeviceBackend::Cuda(c) => c.set_pool_release_threshold(bytes),
        }
    }

    /// The pool's reserved bytes and their high-water mark; `None` on the host (where they are
    /// the bytes in use).
    pub(crate) fn pool_reserved(&self) -> Result<Option<(usize, usize)>> {
        match self {
            DeviceBackend::Host(_) => Ok(None),
            DeviceBackend::Cuda(c) => c.pool_reserved().map(Some),
        }
    }

    /// Resets the pool's own high-water marks.
    pub(crate) fn reset_pool_peaks(&self) -> Result<()> {
        match self {
            DeviceBackend::Host(_) => Ok(()),
            DeviceBackend::Cuda(c) => c.reset_pool_peaks(),
        }
    }

    /// Returns the pool's freed memory to the driver down to `keep_bytes`.
    pub(crate) fn trim_pool(&self, keep_bytes: usize) -> Result<()> {
        match self {
            DeviceBackend::Host(_) => Ok(()),
            DeviceBackend::Cuda(c) => c.trim_pool(keep_bytes),
        }
    }

    /// Stream priorities as `(least, greatest)`.
    pub(crate) fn priority_range(&self) -> Result<(i32, i32)> {
        match self {
            DeviceBackend::Host(_) => Ok(host::PRIORITY_RANGE),
            DeviceBackend::Cuda(c) => c.priority_range(),
        }
    }

    /// Whether the device faulted (see [`crate::Device::is_faulted`]); host devices never do.
    pub(crate) fn is_faulted(&self) -> bool {
        match self {
            DeviceBackend::Host(_) => false,
            DeviceBackend::Cuda(c) => c.is_faulted(),
        }
    }

    /// Resets a faulted CUDA device's context (see `cuda::CudaDevice::reset`); nothing to do
    /// on the host.
    pub(crate) fn reset(&self) -> Result<()> {
        match self {
            DeviceBackend::Host(_) => Ok(()),
            DeviceBackend::Cuda(c) => c.reset(),
        }
    }

    /// Forgets the peer access set up towards device `ordinal` (which was reset).
    pub(crate) fn forget_peer(&self, ordinal: usize) {
        if let DeviceBackend::Cuda(c) = self {
            c.forget_peer(ordinal);
        }
    }

    /// Whether this device reads `peer`'s memory directly: host devices share one address
    /// space, CUDA devices ask the driver, a host and a CUDA device never do.
    pub(crate) fn can_access_peer(&self, peer: &DeviceBackend) -> Result<bool> {
        match (self, peer) {
            (DeviceBackend::Host(_), DeviceBackend::Host(_)) => Ok(true),
            (DeviceBackend::Cuda(a), DeviceBackend::Cuda(b)) => a.can_access_peer(b),
            _ => Ok(false),
        }
    }

    /// A new stream, with the priority it got (clamped to the device's range).
    pub(crate) fn new_stream(
        &self,
        id: StreamId,
        priority: Option<i32>,
    ) -> Result<(StreamBackend, i32)> {
        match self {
            DeviceBackend::Host(h) => {
                // Clamped to the advertised range, as the CUDA backend does.
                let (least, greatest) = host::PRIORITY_RANGE;
                Ok((
                    StreamBackend::Host(h.new_stream(id)?),
                    priority.map_or(0, |p| p.clamp(greatest, least)),
                ))
            }
            DeviceBackend::Cuda(c) => {
                let (s, p) = c.new_stream(priority)?;
                Ok((StreamBackend::Cuda(s), p))
            }
        }
    }

    /// Page-locked host memory usable with this device.
    pub(crate) fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBackend> {
        match self {
            DeviceBackend::Host(_) => Ok(PinnedBackend::Host(host::HostPinned::new(bytes)?)),
            DeviceBackend::Cuda(c) => Ok(PinnedBackend::Cuda(c.alloc_pinned(bytes)?)),
        }
    }

    /// Builds `kernel` for this device ahead of its first launch: compiles and loads it on
    /// CUDA (device `id`); nothing on the host, which has no compiler.
    pub(crate) fn compile_kernel(&self, kernel: &KernelInner, id: DeviceId) -> Result<()> {
        match self {
            DeviceBackend::Host(_) => Ok(()),
            DeviceBackend::Cuda(c) => compiled_for(kernel, id, c).map(drop),
        }
    }

    /// What runs `kernel` on this device (device `id`): its host implementation, or its module
    /// compiled for this GPU (compiled now at the first launch, then cached).
    ///
    /// # Errors
    ///
    /// [`DeviceError::HostKernel`] on the host when the kernel has no host implementation; a
    /// compile error on CUDA.
    #[inline]
    pub(crate) fn kernel_code<'k>(
        &self,
        kernel: &'k KernelInner,
        id: DeviceId,
    ) -> Result<KernelCode<'k>> {
        match self {
            DeviceBackend::Host(_) => match &kernel.host {
                Some(f) => Ok(KernelCode::Host(f)),
                None => Err(DeviceError::HostKernel {
                    kernel: kernel.name.to_string(),
                    reason: "it has no host implementation; add one with Kernel::with_host, \
                             or run it on a CUDA device"
                        .into(),
                }),
            },
            DeviceBackend::Cuda(c) => Ok(KernelCode::Cuda(compiled_for(kernel, id, c)?)),
        }
    }
}

/// A kernel's function compiled for one CUDA device.
pub(crate) type CompiledFor = (DeviceId, Arc<cuda::CompiledKernel>);

/// Compiled functions of one kernel, one per device it ran on (after the first).
pub(crate) type CompileCache = SmallVec<[CompiledFor; 2]>;

/// `kernel` compiled for CUDA device `device` (whose id is `id`): from the kernel's own cache
/// (its first device's slot, read without a lock or a reference count, then the others), else
/// from the device's module cache or the compiler, then kept in the kernel's cache.
fn compiled_for<'k>(
    kernel: &'k KernelInner,
    id: DeviceId,
    device: &cuda::CudaDevice,
) -> Result<Compiled<'k>> {
    if let Some((d, k)) = kernel.compiled_first.get() {
        if *d == id {
            return Ok(Compiled::First(k));
        }
    }
    {
        let cache = kernel.compiled.lock();
        if let Some((_, k)) = cache.iter().find(|(d, _)| *d == id) {
            return Ok(Compiled::Other(k.clone()));
        }
    }
    let compiled = device.compile(
        &kernel.name,
        &kernel.source,
        &kernel.options,
        &kernel.source_layout(),
    )?;
    let (first, _) = kernel.compiled_first.get_or_init(|| (id, compiled.clone()));
    if *first == id {
        return Ok(Compiled::Other(compiled));
    }
    let mut cache = kernel.compiled.lock();
    if let Some((_, k)) = cache.iter().find(|(d, _)| *d == id) {
        return Ok(Compiled::Other(k.clone()));
    }
    cache.push((id, compiled.clone()));
    Ok(Compiled::Other(compiled))
}

/// A kernel's compiled function: borrowed from its first device's slot, or shared.
pub(crate) enum Compiled<'k> {
    First(&'k cuda::CompiledKernel),
    Other(Arc<cuda::CompiledKernel>),
}

impl std::ops::Deref for Compiled<'_> {
    type Target = cuda::CompiledKernel;

    fn deref(&self) -> &cuda::CompiledKernel {
        match self {
            Compiled::First(k) => k,
            Compiled::Other(k) => k,
        }
    }
}

/// What runs a kernel on one device (see [`DeviceBackend::kernel_code`]).
pub(crate) enum KernelCode<'k> {
    Host(&'k Arc<HostKernelFn>),
    Cuda(Compiled<'k>),
}

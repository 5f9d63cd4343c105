//! cuBLAS: the library, a pool of handles per device, and GEMM on a stream.
//!
//! - **Library**: libcublas is loaded by `library.rs` (CUDA 11, 12 or 13, on the loader's path
//!   or in the toolkit's directories), never through cudarc's panicking loader; a missing
//!   library is [`DeviceError::NoBlas`].
//! - **Handles**: each device keeps a pool of handles, created in its primary context, in
//!   default math mode (no TF32) and host pointer mode. A call takes a handle for itself, sets
//!   its stream and then its workspace (`cublasSetStream` resets the workspace), enqueues the
//!   GEMM and gives the handle back: handles are never used by two threads at once, and any
//!   number of streams and threads can run GEMMs concurrently.
//! - **Workspace**: never cuBLAS's own default workspace, which cuBLAS 12.2+ allocates
//!   stream-ordered at first use (inside a capture that would record an allocation into the
//!   graph). Outside captures each stream has its own workspace, allocated on the stream at its
//!   first GEMM and freed on it when the stream is dropped: one stream's GEMMs run in order, so
//!   they never use it concurrently. A captured GEMM uses the workspace that the capture gave
//!   its stream before the stream began capturing (`crate::blas::capture_workspace`), which the
//!   graph keeps alive, or none at all.

mod library;

use std::ffi::{c_int, c_longlong, c_void};
use std::sync::atomic::Ordering;

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::sys::CUdeviceptr;

use self::library::{cublas, Cublas, Handle};
use super::memory::CudaMemory;
use super::stream::CudaStreamHandle;
use super::CudaDeviceShared;
use crate::blas::{GemmConfig, GemmDtype};
use crate::error::{BackendKind, DeviceError, Result};

/// A cuBLAS handle, owned by its device's pool or by one [`HandleLease`].
pub(crate) struct RawBlasHandle(Handle);

// SAFETY: a cuBLAS handle may be used from any host thread; ownership is unique (the pool or
// one lease), so it is never used by two threads at once.
unsafe impl Send for RawBlasHandle {}

/// Destroys a handle of the device whose context is `shared` (errors are reported, not raised).
pub(crate) fn destroy_handle(shared: &CudaDeviceShared, handle: RawBlasHandle) {
    let Ok(lib) = cublas() else {
        // A handle exists only if the library was loaded, so this does not happen.
        return;
    };
    shared.life.release(|| {
        shared.ctx.record_err(shared.ctx.bind_to_thread());
        // SAFETY: the handle was created by `cublasCreate_v2` in this state of the context
        // (not reset: Life) and is destroyed once: it was moved out of its pool or lease.
        if let Err(e) = lib.check("cublasDestroy_v2", unsafe { (lib.destroy)(handle.0) }) {
            tracing::warn!("{e}");
        }
    });
}

/// A handle taken from the device's pool for one call; given back on drop.
struct HandleLease<'a> {
    shared: &'a CudaDeviceShared,
    handle: Option<RawBlasHandle>,
}

impl HandleLease<'_> {
    fn raw(&self) -> Handle {
        self.handle.as_ref().map_or(std::ptr::null_mut(), |h| h.0)
    }
}

impl Drop for HandleLease<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.shared.blas_handles.lock().push(h);
        }
    }
}

/// The workspace cuBLAS recommends: 32 MiB from Hopper on, 4 MiB before.
fn workspace_bytes(cc: (u32, u32)) -> usize {
    if cc.0 >= 9 {
        32 << 20
    } else {
        4 << 20
    }
}

impl CudaDeviceShared {
    /// A handle for one call: an idle one from the pool, else a new one.
    fn blas_handle(&self, lib: &Cublas) -> Result<HandleLease<'_>> {
        if let Some(h) = self.blas_handles.lock().pop() {
            return Ok(HandleLease {
                shared: self,
                handle: Some(h),
            });
        }
        let _bound = self.bind()?;
        let mut raw: Handle = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the device's primary context is current on this
        // thread, so the handle belongs to this device.
        lib.check("cublasCreate_v2", unsafe { (lib.create)(&mut raw) })?;
        let handle = RawBlasHandle(raw);
        // SAFETY: `raw` is a live handle that no one else holds yet.
        let math =
            unsafe { (lib.set_math_mode)(raw, cublas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH) };
        let configured = lib.check("cublasSetMathMode", math).and_then(|()| {
            let mode = cublas_sys::cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST;
            // SAFETY: as above.
            let status = unsafe { (lib.set_pointer_mode)(raw, mode) };
            lib.check("cublasSetPointerMode_v2", status)
        });
        if let Err(e) = configured {
            destroy_handle(self, handle);
            return Err(e);
        }
        self.blas_ready.store(true, Ordering::Release);
        Ok(HandleLease {
            shared: self,
            handle: Some(handle),
        })
    }
}

/// Which workspace a GEMM runs with.
pub(crate) enum BlasWorkspace {
    /// The stream's own, allocated on it at its first GEMM (never during a capture).
    Stream,
    /// Memory the caller keeps alive for as long as the enqueued work may run (a capture's
    /// workspace for this stream, kept by the graph).
    Borrowed {
        /// Its device address (256-byte aligned, as every allocation is).
        ptr: CUdeviceptr,
        /// Its size.
        bytes: usize,
    },
    /// None: cuBLAS uses algorithms that need no workspace.
    None,
}

/// A GEMM's arguments in cuBLAS's column-major terms.
///
/// Row-major `C = op(A) · op(B)` (m×n) is column-major `Cᵀ = op(B)ᵀ · op(A)ᵀ` (n×m) over the
/// same memory: a row-major `r×c` matrix is a column-major `c×r` one with leading dimension `c`.
/// So cuBLAS gets `m' = n`, `n' = m`, `B` as its first operand (transposed iff `trans_b`, leading
/// dimension `k` if so, else `n`) and `A` as its second (transposed iff `trans_a`, leading
/// dimension `m` if so, else `k`), and `ldc = n`. Leading dimensions are at least 1, as cuBLAS
/// requires even for empty matrices.
struct GemmCall {
    op_first: cublas_sys::cublasOperation_t,
    op_second: cublas_sys::cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    ld_first: c_int,
    ld_second: c_int,
    ldc: c_int,
    stride_first: c_longlong,
    stride_second: c_longlong,
    stride_c: c_longlong,
    batch: c_int,
    /// The element type of `A` and `B`.
    data_type: cublas_sys::cudaDataType,
    /// The element type of `C`.
    c_type: cublas_sys::cudaDataType,
    compute: cublas_sys::cublasComputeType_t,
    scalars: Scalars,
}

/// `alpha` and `beta` in the scale type cuBLAS reads for the compute type.
enum Scalars {
    F32([f32; 2]),
    F64([f64; 2]),
}

fn too_large(what: &str, value: usize) -> DeviceError {
    DeviceError::Unsupported {
        what: format!(
            "gemm with {what} = {value} (cuBLAS addresses at most {})",
            i32::MAX
        ),
        backend: BackendKind::Cuda,
    }
}

fn int(what: &str, value: usize) -> Result<c_int> {
    c_int::try_from(value).map_err(|_| too_large(what, value))
}

fn long(what: &str, value: usize) -> Result<c_longlong> {
    c_longlong::try_from(value).map_err(|_| too_large(what, value))
}

impl GemmCall {
    fn new((input, output): (GemmDtype, GemmDtype), cfg: &GemmConfig) -> Result<GemmCall> {
        use cublas_sys::cublasComputeType_t as Compute;
        use cublas_sys::cublasOperation_t as Op;
        use cublas_sys::cudaDataType as Data;
        let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
        let data = |dtype: GemmDtype| match dtype {
            GemmDtype::F16 => Data::CUDA_R_16F,
            GemmDtype::BF16 => Data::CUDA_R_16BF,
            GemmDtype::F32 => Data::CUDA_R_32F,
            GemmDtype::F64 => Data::CUDA_R_64F,
        };
        // Half and f32 inputs compute in f32 (scale type f32), f64 in f64; a half GEMM may
        // store its f32 accumulation as f32 (cuBLAS's GemmEx supports A/B 16F or 16BF with
        // C 32F under CUBLAS_COMPUTE_32F).
        let (compute, scalars) = match (input, output) {
            (GemmDtype::F64, GemmDtype::F64) => (
                Compute::CUBLAS_COMPUTE_64F,
                Scalars::F64([cfg.alpha as f64, cfg.beta as f64]),
            ),
            (i, o) if i == o || (o == GemmDtype::F32 && i != GemmDtype::F64) => (
                Compute::CUBLAS_COMPUTE_32F,
                Scalars::F32([cfg.alpha, cfg.beta]),
            ),
            (i, o) => {
                return Err(DeviceError::Unsupported {
                    what: format!("gemm from {i:?} inputs to a {o:?} output"),
                    backend: BackendKind::Cuda,
                })
            }
        };
        let (data_type, c_type) = (data(input), data(output));
        let ld_first = if cfg.trans_b { cfg.k } else { cfg.n };
        let ld_second = if cfg.trans_a { cfg.m } else { cfg.k };
        Ok(GemmCall {
            op_first: op(cfg.trans_b),
            op_second: op(cfg.trans_a),
            m: int("n", cfg.n)?,
            n: int("m", cfg.m)?,
            k: int("k", cfg.k)?,
            ld_first: int("the leading dimension of B", ld_first.max(1))?,
            ld_second: int("the leading dimension of A", ld_second.max(1))?,
            ldc: int("n", cfg.n.max(1))?,
            stride_first: long("stride_b", cfg.stride_b)?,
            stride_second: long("stride_a", cfg.stride_a)?,
            stride_c: long("stride_c", cfg.stride_c)?,
            batch: int("batch", cfg.batch)?,
            data_type,
            c_type,
            compute,
            scalars,
        })
    }
}

impl CudaStreamHandle {
    /// The size of the workspace a capture should give this stream, or `None` while no GEMM
    /// ran on the device (cuBLAS may not even be installed).
    pub(crate) fn blas_capture_workspace_bytes(&self) -> Option<usize> {
        self.shared
            .blas_ready
            .load(Ordering::Acquire)
            .then(|| workspace_bytes(self.shared.cc))
    }

    /// This stream's own workspace, allocated on it at the first call.
    fn stream_workspace(&self) -> Result<(CUdeviceptr, usize)> {
        let bytes = workspace_bytes(self.shared.cc);
        let mut slot = self.blas_workspace.lock();
        let mem = match &mut *slot {
            Some(mem) => mem,
            empty => empty.insert(CudaMemory::alloc(self, bytes)?),
        };
        Ok((mem.ptr(), bytes))
    }

    /// Enqueues `C = alpha · op(A) · op(B) + beta · C` (row-major, `cfg` validated against the
    /// views of `a`, `b` and `c`, which are device addresses of live allocations).
    pub(crate) fn gemm(
        &self,
        dtype: (GemmDtype, GemmDtype),
        cfg: &GemmConfig,
        a: CUdeviceptr,
        b: CUdeviceptr,
        c: CUdeviceptr,
        workspace: BlasWorkspace,
    ) -> Result<()> {
        let call = GemmCall::new(dtype, cfg)?;
        let lib = cublas()?;
        let (ws_ptr, ws_bytes) = match workspace {
            BlasWorkspace::Stream => self.stream_workspace()?,
            BlasWorkspace::Borrowed { ptr, bytes } => (ptr, bytes),
            BlasWorkspace::None => (0, 0),
        };
        let lease = self.shared.blas_handle(lib)?;
        let handle = lease.raw();
        let _bound = self.shared.bind()?;
        // SAFETY: the handle is leased to this call alone and was created in this device's
        // context, which is current; the stream is alive (owned by `self`). cuBLAS's
        // `cudaStream_t` is the driver's `CUstream`.
        lib.check("cublasSetStream_v2", unsafe {
            (lib.set_stream)(handle, self.raw() as cublas_sys::cudaStream_t)
        })?;
        // After cublasSetStream, which resets the workspace to cuBLAS's default pool.
        // SAFETY: the handle is leased to this call alone; `ws_ptr` is null with size 0, or
        // device memory of `ws_bytes` bytes that outlives the work enqueued with it (the
        // stream's own, freed on this stream after its work when the stream is dropped; or a
        // capture's, kept alive by the graph and freed after its last replay).
        lib.check("cublasSetWorkspace_v2", unsafe {
            (lib.set_workspace)(handle, ws_ptr as *mut c_void, ws_bytes)
        })?;
        let scalars: (*const c_void, *const c_void) = match &call.scalars {
            Scalars::F32([alpha, beta]) => (
                alpha as *const f32 as *const c_void,
                beta as *const f32 as *const c_void,
            ),
            Scalars::F64([alpha, beta]) => (
                alpha as *const f64 as *const c_void,
                beta as *const f64 as *const c_void,
            ),
        };
        let (first, second) = (b as *const c_void, a as *const c_void);
        let out = c as *mut c_void;
        let algo = cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT;
        if call.batch == 1 {
            // SAFETY: the handle is leased and bound to this stream; the three pointers address
            // allocations of this device that hold the matrices `cfg` describes (the runtime
            // checked each view's length against the shapes, and the leading dimensions and
            // transposes here describe exactly those row-major matrices); the allocations stay
            // alive until this stream's work is done (frees are stream-ordered after their last
            // use; captures keep them); `C` overlaps neither input (checked); `alpha` and `beta`
            // are host values of the compute type's scale type, read during this call (host
            // pointer mode).
            lib.check("cublasGemmEx", unsafe {
                (lib.gemm_ex)(
                    handle,
                    call.op_first,
                    call.op_second,
                    call.m,
                    call.n,
                    call.k,
                    scalars.0,
                    first,
                    call.data_type,
                    call.ld_first,
                    second,
                    call.data_type,
                    call.ld_second,
                    scalars.1,
                    out,
                    call.c_type,
                    call.ldc,
                    call.compute,
                    algo,
                )
            })
        } else {
            // SAFETY: as for `cublasGemmEx` above, for each matrix of the batch: the runtime
            // checked that every view holds `(batch - 1) · stride + rows · cols` elements and
            // that the output matrices (stride_c ≥ m·n) do not overlap.
            lib.check("cublasGemmStridedBatchedEx", unsafe {
                (lib.gemm_strided_batched_ex)(
                    handle,
                    call.op_first,
                    call.op_second,
                    call.m,
                    call.n,
                    call.k,
                    scalars.0,
                    first,
                    call.data_type,
                    call.ld_first,
                    call.stride_first,
                    second,
                    call.data_type,
                    call.ld_second,
                    call.stride_second,
                    scalars.1,
                    out,
                    call.c_type,
                    call.ldc,
                    call.stride_c,
                    call.batch,
                    call.compute,
                    algo,
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_maps_to_swapped_column_major_arguments() -> Result<()> {
        let cfg = GemmConfig::new(3, 5, 7).transpose(true, false).batched(2);
        let call = GemmCall::new((GemmDtype::BF16, GemmDtype::BF16), &cfg)?;
        assert_eq!((call.m, call.n, call.k), (5, 3, 7));
        assert_eq!(call.op_first, cublas_sys::cublasOperation_t::CUBLAS_OP_N);
        assert_eq!(call.op_second, cublas_sys::cublasOperation_t::CUBLAS_OP_T);
        // B stored 7×5 row-major: leading dimension 5; A stored 7×3: leading dimension 3.
        assert_eq!((call.ld_first, call.ld_second, call.ldc), (5, 3, 5));
        assert_eq!(
            (call.stride_first, call.stride_second, call.stride_c),
            (35, 21, 15)
        );
        let t = GemmCall::new(
            (GemmDtype::F32, GemmDtype::F32),
            &GemmConfig::new(3, 5, 7).transpose(false, true),
        )?;
        // B stored 5×7: leading dimension 7; A stored 3×7: leading dimension 7.
        assert_eq!(t.op_first, cublas_sys::cublasOperation_t::CUBLAS_OP_T);
        assert_eq!((t.ld_first, t.ld_second), (7, 7));
        let empty = GemmCall::new((GemmDtype::F64, GemmDtype::F64), &GemmConfig::new(4, 0, 0))?;
        assert_eq!((empty.ld_first, empty.ld_second, empty.ldc), (1, 1, 1));
        Ok(())
    }

    #[test]
    fn half_inputs_may_store_an_f32_output() -> Result<()> {
        use cublas_sys::cudaDataType as Data;
        let cfg = GemmConfig::new(2, 3, 4);
        let mixed = GemmCall::new((GemmDtype::BF16, GemmDtype::F32), &cfg)?;
        assert_eq!(
            (mixed.data_type, mixed.c_type),
            (Data::CUDA_R_16BF, Data::CUDA_R_32F)
        );
        assert_eq!(
            mixed.compute,
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        );
        assert!(matches!(mixed.scalars, Scalars::F32(_)));
        let half = GemmCall::new((GemmDtype::F16, GemmDtype::F32), &cfg)?;
        assert_eq!(
            (half.data_type, half.c_type),
            (Data::CUDA_R_16F, Data::CUDA_R_32F)
        );
        assert!(GemmCall::new((GemmDtype::F64, GemmDtype::F32), &cfg).is_err());
        assert!(GemmCall::new((GemmDtype::F32, GemmDtype::F16), &cfg).is_err());
        Ok(())
    }
}

//! libcublas, loaded here rather than through cudarc's `cublas::sys` functions, which look only
//! for the library names of the CUDA version cudarc was built for (no `libcublas.so.13` among
//! them), search only the dynamic loader's path, and panic when the library or one of its
//! symbols is missing.
//!
//! [`cublas`] tries `libcublas.so.13`, `.12`, `.11` and `libcublas.so`, first on the loader's
//! path (`LD_LIBRARY_PATH`, `ld.so.cache`, system directories), then in the toolkit's
//! directories (`$CUDA_PATH`, `$CUDA_HOME`, `$CUDA_ROOT`, `/usr/local/cuda`, `/opt/cuda`; under
//! each `lib64`, `lib`, `targets/x86_64-linux/lib`), where the `libcublasLt` of the same version
//! is loaded first so that libcublas finds it by its soname. Every entry point is resolved once,
//! as the function type of its declaration in `cublas_api.h` (the same in CUDA 11, 12 and 13;
//! statuses are read as plain `int`s). A library that cannot be loaded or lacks an entry point
//! is [`DeviceError::NoBlas`]. cudarc's `cublas::sys` supplies the types only.

use std::ffi::{c_char, c_int, c_longlong, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::cublas::sys as cublas_sys;
use libloading::Library;

use crate::backend::cuda::dylib::{not_found, not_loaded, symbol};
use crate::error::{DeviceError, Result};

pub(super) type Handle = cublas_sys::cublasHandle_t;
/// A `cublasStatus_t`, read as the `int` it is in C (a status this binding does not know must
/// not become an invalid Rust enum value).
type Status = c_int;

type CreateFn = unsafe extern "C" fn(*mut Handle) -> Status;
type DestroyFn = unsafe extern "C" fn(Handle) -> Status;
type SetStreamFn = unsafe extern "C" fn(Handle, cublas_sys::cudaStream_t) -> Status;
type SetWorkspaceFn = unsafe extern "C" fn(Handle, *mut c_void, usize) -> Status;
type SetMathModeFn = unsafe extern "C" fn(Handle, cublas_sys::cublasMath_t) -> Status;
type SetPointerModeFn = unsafe extern "C" fn(Handle, cublas_sys::cublasPointerMode_t) -> Status;
type StatusTextFn = unsafe extern "C" fn(Status) -> *const c_char;
type GemmExFn = unsafe extern "C" fn(
    Handle,
    cublas_sys::cublasOperation_t,
    cublas_sys::cublasOperation_t,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    cublas_sys::cudaDataType,
    c_int,
    *const c_void,
    cublas_sys::cudaDataType,
    c_int,
    *const c_void,
    *mut c_void,
    cublas_sys::cudaDataType,
    c_int,
    cublas_sys::cublasComputeType_t,
    cublas_sys::cublasGemmAlgo_t,
) -> Status;
type GemmStridedBatchedExFn = unsafe extern "C" fn(
    Handle,
    cublas_sys::cublasOperation_t,
    cublas_sys::cublasOperation_t,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    cublas_sys::cudaDataType,
    c_int,
    c_longlong,
    *const c_void,
    cublas_sys::cudaDataType,
    c_int,
    c_longlong,
    *const c_void,
    *mut c_void,
    cublas_sys::cudaDataType,
    c_int,
    c_longlong,
    c_int,
    cublas_sys::cublasComputeType_t,
    cublas_sys::cublasGemmAlgo_t,
) -> Status;

/// The entry points of a loaded libcublas.
pub(crate) struct Cublas {
    pub(super) create: CreateFn,
    pub(super) destroy: DestroyFn,
    pub(super) set_stream: SetStreamFn,
    pub(super) set_workspace: SetWorkspaceFn,
    pub(super) set_math_mode: SetMathModeFn,
    pub(super) set_pointer_mode: SetPointerModeFn,
    pub(super) gemm_ex: GemmExFn,
    pub(super) gemm_strided_batched_ex: GemmStridedBatchedExFn,
    status_name: Option<StatusTextFn>,
    status_string: Option<StatusTextFn>,
    /// Where the library was found.
    pub(super) path: String,
    // The function pointers above point into these: they stay loaded for the process's
    // lifetime (this value lives in a static).
    _lib: Library,
    _lt: Option<Library>,
}

impl std::fmt::Debug for Cublas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cublas").field("path", &self.path).finish()
    }
}

/// The library versions tried, newest first.
const SUFFIXES: [&str; 4] = [".so.13", ".so.12", ".so.11", ".so"];

/// libcublas, loaded on first use (see the module docs for where it is looked for).
///
/// # Errors
///
/// [`DeviceError::NoBlas`] naming what was tried, when no usable library was found.
pub(crate) fn cublas() -> Result<&'static Cublas> {
    static LIB: OnceLock<std::result::Result<Cublas, DeviceError>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Opens a shared library.
fn open(path: &str) -> std::result::Result<Library, String> {
    // SAFETY: loading libcublas / libcublasLt runs their initializers, which only set up the
    // libraries' own state; nothing else in the process depends on the order they run in.
    unsafe { Library::new(path) }.map_err(|e| e.to_string())
}

/// The toolkit library directories that exist, in search order, without repeats.
fn toolkit_lib_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .collect();
    roots.push("/usr/local/cuda".into());
    roots.push("/opt/cuda".into());
    let mut dirs: Vec<PathBuf> = Vec::new();
    for root in roots {
        for sub in ["lib64", "lib", "targets/x86_64-linux/lib"] {
            let dir = root.join(sub);
            if dir.is_dir() && !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

fn load() -> std::result::Result<Cublas, DeviceError> {
    let mut failures: Vec<String> = Vec::new();
    // The loader's own search path first: what the user or the system configured wins.
    for suffix in SUFFIXES {
        let name = format!("libcublas{suffix}");
        match open(&name) {
            Ok(lib) => match Cublas::bind(lib, None, name) {
                Ok(cublas) => return Ok(cublas),
                Err(e) => failures.push(e),
            },
            Err(e) if not_found(&e) => {}
            Err(e) => failures.push(e),
        }
    }
    // Then the toolkit's directories, which are often not on the loader's path.
    let dirs = toolkit_lib_dirs();
    for dir in &dirs {
        for suffix in SUFFIXES {
            let path = dir.join(format!("libcublas{suffix}"));
            let Some(path) = path.to_str().filter(|_| path.exists()) else {
                continue;
            };
            let lt_path = dir.join(format!("libcublasLt{suffix}"));
            let lt = match lt_path.to_str().filter(|_| lt_path.exists()) {
                Some(p) => match open(p) {
                    Ok(lib) => Some(lib),
                    Err(e) => {
                        failures.push(e);
                        None
                    }
                },
                None => None,
            };
            match open(path) {
                Ok(lib) => match Cublas::bind(lib, lt, path.to_string()) {
                    Ok(cublas) => return Ok(cublas),
                    Err(e) => failures.push(e),
                },
                Err(e) => failures.push(e),
            }
        }
    }
    let names = SUFFIXES.map(|s| format!("libcublas{s}")).join(", ");
    let reason = not_loaded(
        &format!("none of {names} is on the dynamic loader's search path"),
        &dirs,
        "no CUDA toolkit directory exists ($CUDA_PATH, $CUDA_HOME, $CUDA_ROOT, /usr/local/cuda, \
         /opt/cuda)",
        &failures,
    );
    Err(DeviceError::NoBlas { reason })
}

impl Cublas {
    fn bind(
        lib: Library,
        lt: Option<Library>,
        path: String,
    ) -> std::result::Result<Cublas, String> {
        let p = path.as_str();
        // SAFETY: each type above is the C declaration of its symbol in cublas_api.h, which is
        // the same in CUDA 11, 12 and 13 (enums are `int`-sized, handles and streams pointers).
        unsafe {
            Ok(Cublas {
                create: symbol(&lib, "cublasCreate_v2", p)?,
                destroy: symbol(&lib, "cublasDestroy_v2", p)?,
                set_stream: symbol(&lib, "cublasSetStream_v2", p)?,
                set_workspace: symbol(&lib, "cublasSetWorkspace_v2", p)?,
                set_math_mode: symbol(&lib, "cublasSetMathMode", p)?,
                set_pointer_mode: symbol(&lib, "cublasSetPointerMode_v2", p)?,
                gemm_ex: symbol(&lib, "cublasGemmEx", p)?,
                gemm_strided_batched_ex: symbol(&lib, "cublasGemmStridedBatchedEx", p)?,
                status_name: symbol(&lib, "cublasGetStatusName", p).ok(),
                status_string: symbol(&lib, "cublasGetStatusString", p).ok(),
                path,
                _lib: lib,
                _lt: lt,
            })
        }
    }

    /// `Ok` for `CUBLAS_STATUS_SUCCESS`, else [`DeviceError::Blas`] naming `call`.
    pub(super) fn check(&self, call: &'static str, status: Status) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        let text = |f: Option<StatusTextFn>| -> Option<String> {
            let f = f?;
            // SAFETY: cublasGetStatusName / cublasGetStatusString take any status value and
            // return a pointer to a static NUL-terminated string, or null.
            let p = unsafe { f(status) };
            if p.is_null() {
                return None;
            }
            // SAFETY: `p` is a non-null static NUL-terminated string (above).
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        Err(DeviceError::Blas {
            call,
            status,
            name: text(self.status_name).unwrap_or_else(|| format!("cublasStatus_t {status}")),
            message: text(self.status_string).unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where cuBLAS is absent the answer is an error that says what was tried and how to fix
    /// it, never a panic; where it is present, it loads.
    #[test]
    fn loading_cublas_never_panics() {
        match cublas() {
            Ok(lib) => assert!(lib.path.contains("libcublas"), "{lib:?}"),
            Err(e) => {
                assert!(matches!(e, DeviceError::NoBlas { .. }), "{e:?}");
                let msg = e.to_string();
                for needle in ["libcublas.so.13", "LD_LIBRARY_PATH", "CUDA_HOME"] {
                    assert!(msg.contains(needle), "{msg}");
                }
            }
        }
    }
}

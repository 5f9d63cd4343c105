//! libnccl, loaded at run time by this crate (as libcublas is): cudarc's `nccl::sys` looks only
//! on the dynamic loader's path and panics when the library is missing.
//!
//! [`nccl`] tries, in order: the file `$CUFLOW_NCCL_LIB` names; `libnccl.so.2` and
//! `libnccl.so` on the loader's path (`LD_LIBRARY_PATH`, `ld.so.cache`, system directories,
//! where the `libnccl2` package puts it); then the `nvidia-nccl-cu12` / `-cu13` wheels'
//! `nvidia/nccl/lib/libnccl.so.2` under the Python environments it can see (`$VIRTUAL_ENV`,
//! `$CONDA_PREFIX`, `~/.local`, `/usr/local`, `/usr`; each `lib/python3.*/{site,dist}-packages`),
//! and `$CONDA_PREFIX/lib`. Every entry point is resolved once, as the function type of its
//! declaration in `nccl.h` (the same since NCCL 2.7; results are read as plain `int`s). A
//! library that cannot be loaded or lacks an entry point is [`DeviceError::NoNccl`].

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

use libloading::Library;

use crate::backend::cuda::dylib::{not_found, not_loaded, symbol};
use crate::error::{DeviceError, Result};

/// An `ncclComm_t`.
pub(super) type RawComm = *mut c_void;
/// An `ncclResult_t`, read as the `int` it is in C.
type Status = c_int;
/// A `cudaStream_t`: the driver's `CUstream`.
type RawStream = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct UniqueId {
    pub(super) internal: [c_char; UNIQUE_ID_BYTES],
}

/// The size of an `ncclUniqueId` (`NCCL_UNIQUE_ID_BYTES`).
pub(super) const UNIQUE_ID_BYTES: usize = 128;

type GetUniqueIdFn = unsafe extern "C" fn(*mut UniqueId) -> Status;
type CommInitRankFn = unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> Status;
type CommInitAllFn = unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> Status;
type CommDestroyFn = unsafe extern "C" fn(RawComm) -> Status;
type GroupFn = unsafe extern "C" fn() -> Status;
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> Status;
type AllGatherFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, RawStream) -> Status;
type ReduceScatterFn = AllReduceFn;
type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> Status;
type SendFn =
    unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, RawStream) -> Status;
type RecvFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, RawStream) -> Status;
type ErrorStringFn = unsafe extern "C" fn(Status) -> *const c_char;
type LastErrorFn = unsafe extern "C" fn(RawComm) -> *const c_char;

/// The entry points of a loaded libnccl.
pub(crate) struct Nccl {
    pub(super) get_unique_id: GetUniqueIdFn,
    pub(super) comm_init_rank: CommInitRankFn,
    pub(super) comm_init_all: CommInitAllFn,
    pub(super) comm_destroy: CommDestroyFn,
    /// `ncclCommAbort`: frees a communicator and makes its kernels in flight return.
    pub(super) comm_abort: CommDestroyFn,
    pub(super) group_start: GroupFn,
    pub(super) group_end: GroupFn,
    pub(super) all_reduce: AllReduceFn,
    pub(super) all_gather: AllGatherFn,
    pub(super) reduce_scatter: ReduceScatterFn,
    pub(super) broadcast: BroadcastFn,
    pub(super) send: SendFn,
    pub(super) recv: RecvFn,
    error_string: Option<ErrorStringFn>,
    last_error: Option<LastErrorFn>,
    /// Where the library was found.
    pub(super) path: String,
    // The function pointers above point into this library: it stays loaded for the process's
    // lifetime (this value lives in a static).
    _lib: Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("path", &self.path).finish()
    }
}

/// The environment variable that names the library file.
pub(crate) const NCCL_LIB_VAR: &str = "CUFLOW_NCCL_LIB";

/// libnccl, loaded on first use (see the module docs for where it is looked for).
///
/// # Errors
///
/// [`DeviceError::NoNccl`] naming what was tried, when no usable library was found.
pub(crate) fn nccl() -> Result<&'static Nccl> {
    static LIB: OnceLock<std::result::Result<Nccl, DeviceError>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn open(path: &str) -> std::result::Result<Library, String> {
    // SAFETY: loading libnccl runs its initializers, which only set up the library's own state
    // (NCCL reads its environment and the CUDA driver lazily, at its first call).
    unsafe { Library::new(path) }.map_err(|e| match std::error::Error::source(&e) {
        Some(detail) => format!("{e}: {detail}"),
        None => e.to_string(),
    })
}

/// The `nvidia/nccl/lib` directories of the Python environments in sight, and conda's `lib`.
fn wheel_dirs() -> Vec<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let mut prefixes: Vec<PathBuf> = Vec::new();
    prefixes.extend(env("VIRTUAL_ENV"));
    prefixes.extend(env("CONDA_PREFIX"));
    prefixes.extend(env("HOME").map(|h| h.join(".local")));
    prefixes.push("/usr/local".into());
    prefixes.push("/usr".into());
    let mut dirs = Vec::new();
    for prefix in &prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let dir = python.join(packages).join("nvidia/nccl/lib");
                if dir.is_dir() && !dirs.contains(&dir) {
                    dirs.push(dir);
                }
            }
        }
    }
    if let Some(conda) = env("CONDA_PREFIX") {
        let dir = conda.join("lib");
        if dir.join("libnccl.so.2").exists() && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

fn load() -> std::result::Result<Nccl, DeviceError> {
    if let Some(path) = std::env::var_os(NCCL_LIB_VAR).filter(|v| !v.is_empty()) {
        let path = path.to_string_lossy().into_owned();
        return open(&path)
            .and_then(|lib| Nccl::bind(lib, path.clone()))
            .map_err(|e| DeviceError::NoNccl {
                reason: format!("{NCCL_LIB_VAR}={path} cannot be used: {e}"),
            });
    }
    let mut failures: Vec<String> = Vec::new();
    for name in ["libnccl.so.2", "libnccl.so"] {
        match open(name) {
            Ok(lib) => match Nccl::bind(lib, name.to_string()) {
                Ok(nccl) => return Ok(nccl),
                Err(e) => failures.push(e),
            },
            Err(e) if not_found(&e) => {}
            Err(e) => failures.push(e),
        }
    }
    let dirs = wheel_dirs();
    for dir in &dirs {
        let path = dir.join("libnccl.so.2");
        let Some(path) = path.to_str().filter(|_| path.exists()) else {
            continue;
        };
        match open(path).and_then(|lib| Nccl::bind(lib, path.to_string())) {
            Ok(nccl) => return Ok(nccl),
            Err(e) => failures.push(e),
        }
    }
    let reason = not_loaded(
        "neither libnccl.so.2 nor libnccl.so is on the dynamic loader's search path",
        &dirs,
        "and no Python environment in sight has the nvidia-nccl wheel",
        &failures,
    );
    Err(DeviceError::NoNccl { reason })
}

impl Nccl {
    fn bind(lib: Library, path: String) -> std::result::Result<Nccl, String> {
        let p = path.as_str();
        // SAFETY: each type above is the C declaration of its symbol in nccl.h (enums are
        // `int`-sized, communicators and streams pointers, `ncclUniqueId` 128 bytes by value).
        unsafe {
            Ok(Nccl {
                get_unique_id: symbol(&lib, "ncclGetUniqueId", p)?,
                comm_init_rank: symbol(&lib, "ncclCommInitRank", p)?,
                comm_init_all: symbol(&lib, "ncclCommInitAll", p)?,
                comm_destroy: symbol(&lib, "ncclCommDestroy", p)?,
                comm_abort: symbol(&lib, "ncclCommAbort", p)?,
                group_start: symbol(&lib, "ncclGroupStart", p)?,
                group_end: symbol(&lib, "ncclGroupEnd", p)?,
                all_reduce: symbol(&lib, "ncclAllReduce", p)?,
                all_gather: symbol(&lib, "ncclAllGather", p)?,
                reduce_scatter: symbol(&lib, "ncclReduceScatter", p)?,
                broadcast: symbol(&lib, "ncclBroadcast", p)?,
                send: symbol(&lib, "ncclSend", p)?,
                recv: symbol(&lib, "ncclRecv", p)?,
                error_string: symbol(&lib, "ncclGetErrorString", p).ok(),
                last_error: symbol(&lib, "ncclGetLastError", p).ok(),
                path,
                _lib: lib,
            })
        }
    }

    /// `Ok` for `ncclSuccess`, else [`DeviceError::Nccl`] naming `call`.
    pub(super) fn check(&self, call: &'static str, status: Status) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        let text = |p: *const c_char| -> Option<String> {
            if p.is_null() {
                return None;
            }
            // SAFETY: NCCL returns null or a pointer to a NUL-terminated string it keeps (a
            // static for error strings, its thread-local last error).
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        // SAFETY: ncclGetErrorString takes any result value; ncclGetLastError ignores its
        // argument (null is documented as allowed).
        let name = self.error_string.and_then(|f| text(unsafe { f(status) }));
        // SAFETY: as above.
        let message = self
            .last_error
            .and_then(|f| text(unsafe { f(std::ptr::null_mut()) }));
        Err(DeviceError::Nccl {
            call,
            code: status,
            name: name.unwrap_or_else(|| format!("ncclResult_t {status}")),
            message: message.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where NCCL is absent the answer is an error that says what was tried and how to fix
    /// it, never a panic; where it is present, it loads.
    #[test]
    fn loading_nccl_never_panics() {
        match nccl() {
            Ok(lib) => assert!(lib.path.contains("libnccl"), "{lib:?}"),
            Err(e) => {
                assert!(matches!(e, DeviceError::NoNccl { .. }), "{e:?}");
                let msg = e.to_string();
                for needle in [
                    "libnccl.so.2",
                    "LD_LIBRARY_PATH",
                    NCCL_LIB_VAR,
                    "nvidia-nccl",
                ] {
                    assert!(msg.contains(needle), "{msg}");
                }
            }
        }
    }
}

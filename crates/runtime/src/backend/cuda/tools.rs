//! Hooks for profiling tools: NVTX ranges (Nsight Systems shows cuflow's op spans) through a
//! small run-time loader of `libnvToolsExt`, and the process-exit hook that writes a
//! `CUFLOW_TRACE` trace.
//!
//! Invariants: the NVTX library is loaded once, on the first range, and never unloaded (the
//! `Library` lives in a `static`), so the function pointers taken from it stay valid for the
//! life of the process. A missing library makes every range a no-op. Ranges are start/end
//! ranges (`nvtxRangeStartA` / `nvtxRangeEnd`), which may end on another thread than the one
//! that started them, as an op span moved across threads does.

use std::ffi::{c_char, c_int, CString};
use std::sync::OnceLock;

type StartFn = unsafe extern "C" fn(*const c_char) -> u64;
type EndFn = unsafe extern "C" fn(u64);

struct Nvtx {
    start: StartFn,
    end: EndFn,
    /// Keeps the library loaded for as long as the pointers above are used (forever).
    _lib: libloading::Library,
}

const CANDIDATES: &[&str] = &[
    "libnvToolsExt.so.1",
    "libnvToolsExt.so",
    "nvToolsExt64_1.dll",
];

fn nvtx() -> Option<&'static Nvtx> {
    static NVTX: OnceLock<Option<Nvtx>> = OnceLock::new();
    NVTX.get_or_init(|| {
        for name in CANDIDATES {
            // SAFETY: loading libnvToolsExt runs its initializers, which only set up NVTX's
            // own state (no injection happens until a tool sets NVTX_INJECTION64_PATH, which
            // is the point).
            let Ok(lib) = (unsafe { libloading::Library::new(*name) }) else {
                continue;
            };
            // SAFETY: the symbols have these C signatures in every NVTX release
            // (`nvtxRangeId_t nvtxRangeStartA(const char*)`, `void nvtxRangeEnd(nvtxRangeId_t)`,
            // `nvtxRangeId_t` being `uint64_t`); the pointers are used only while `lib` is
            // alive, which is forever (module docs).
            let fns = unsafe {
                let start = lib.get::<StartFn>(b"nvtxRangeStartA\0").map(|s| *s);
                let end = lib.get::<EndFn>(b"nvtxRangeEnd\0").map(|s| *s);
                start.and_then(|start| end.map(|end| (start, end)))
            };
            if let Ok((start, end)) = fns {
                tracing::debug!("NVTX ranges through {name}");
                return Some(Nvtx {
                    start,
                    end,
                    _lib: lib,
                });
            }
        }
        None
    })
    .as_ref()
}

/// Starts an NVTX range named `name`; its id, or `None` (nothing started) when NVTX is not
/// available.
pub(crate) fn nvtx_start(name: &str) -> Option<u64> {
    let nvtx = nvtx()?;
    let message = CString::new(name.replace('\0', " ")).ok()?;
    // SAFETY: `message` is a NUL-terminated string alive for the call (NVTX copies it); the
    // pointer is valid (module invariants).
    Some(unsafe { (nvtx.start)(message.as_ptr()) })
}

/// Ends the NVTX range `id` that [`nvtx_start`] returned, from any thread.
pub(crate) fn nvtx_end(id: u64) {
    if let Some(nvtx) = nvtx() {
        // SAFETY: `id` came from `nvtxRangeStartA` of this library (the op span keeps it and
        // ends it once); the pointer is valid (module invariants).
        unsafe { (nvtx.end)(id) };
    }
}

extern "C" {
    fn atexit(callback: extern "C" fn()) -> c_int;
}

/// Runs `callback` when the process exits normally (returning from `main` or
/// `std::process::exit`).
pub(crate) fn at_exit(callback: extern "C" fn()) {
    // SAFETY: `atexit` only stores the pointer; `callback` is a plain `extern "C" fn` that
    // catches nothing across the boundary (it logs its errors and never panics).
    let status = unsafe { atexit(callback) };
    if status != 0 {
        tracing::warn!("atexit failed ({status}): the trace will be written by trace::stop only");
    }
}

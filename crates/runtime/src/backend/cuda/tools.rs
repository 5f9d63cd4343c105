//! Hooks for profiling tools: NVTX ranges (Nsight Systems shows cuflow's op spans) through a
//! small run-time loader of `libnvToolsExt`, and the process-exit hook that writes a
//! `CUFLOW_TRACE` trace.
//!
//! Invariants: the NVTX library is loaded once, on the first range, and never unloaded (the
//! `Library` lives in a `static`), so the function pointers taken from it stay valid for the
//! life of the process. A missing library makes every range a no-op. Ranges are pushed and
//! popped on the same thread (the op span guard that pushes is dropped on it).

use std::ffi::{c_char, c_int, CString};
use std::sync::OnceLock;

type PushFn = unsafe extern "C" fn(*const c_char) -> c_int;
type PopFn = unsafe extern "C" fn() -> c_int;

struct Nvtx {
    push: PushFn,
    pop: PopFn,
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
            // (`int nvtxRangePushA(const char*)`, `int nvtxRangePop(void)`); the pointers are
            // used only while `lib` is alive, which is forever (module docs).
            let fns = unsafe {
                let push = lib.get::<PushFn>(b"nvtxRangePushA\0").map(|s| *s);
                let pop = lib.get::<PopFn>(b"nvtxRangePop\0").map(|s| *s);
                push.and_then(|push| pop.map(|pop| (push, pop)))
            };
            if let Ok((push, pop)) = fns {
                tracing::debug!("NVTX ranges through {name}");
                return Some(Nvtx {
                    push,
                    pop,
                    _lib: lib,
                });
            }
        }
        None
    })
    .as_ref()
}

/// Pushes an NVTX range named `name` on this thread; false (nothing pushed) when NVTX is not
/// available.
pub(crate) fn nvtx_push(name: &str) -> bool {
    let Some(nvtx) = nvtx() else {
        return false;
    };
    let Ok(message) = CString::new(name.replace('\0', " ")) else {
        return false;
    };
    // SAFETY: `message` is a NUL-terminated string alive for the call (NVTX copies it); the
    // pointer is valid (module invariants).
    unsafe { (nvtx.push)(message.as_ptr()) };
    true
}

/// Pops the NVTX range this thread pushed last.
pub(crate) fn nvtx_pop() {
    if let Some(nvtx) = nvtx() {
        // SAFETY: called only after a successful `nvtx_push` on this thread (the op span
        // remembers it); the pointer is valid (module invariants).
        unsafe { (nvtx.pop)() };
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

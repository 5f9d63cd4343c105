//! The op type returned by constructors and kernels, and the per-dtype kernel cache.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cuflow_runtime::Kernel;

/// A lazy tensor operation: a constructor or a kernel launch that runs when executed, on the
/// stream its context gives. Returned by every function of [`api`](crate::api) and
/// [`kernels`](crate::kernels); combine it like any other [`DeviceOp`](cuflow_device_op::DeviceOp).
/// It is the device-op crate's one op primitive, [`from_fn`](cuflow_device_op::from_fn).
pub type TensorOp<F> = cuflow_device_op::FromFn<F>;

/// One of the tensor crate's own kernels, from CUDA C `source` written in this crate.
#[allow(unsafe_code)]
pub(crate) fn builtin_kernel(name: impl Into<String>, source: impl Into<String>) -> Kernel {
    // SAFETY: the tensor crate's kernels are the library's own responsibility: each is
    // reviewed to read and write only the elements its launch passes it (its counts come from
    // the tensors' shapes, checked by `numel`), to write only its outputs, and to be free of
    // races between its threads; each is tested against a float64 reference on both backends
    // and run under compute-sanitizer's memcheck and racecheck on a GPU.
    unsafe { Kernel::new(name, source) }
}

/// The kernel `name` for dtype `dtype`, declared once per process by `make`. Declaring it once
/// keeps launches from hashing kernel sources.
pub(crate) fn cached_kernel(
    name: &'static str,
    dtype: &'static str,
    make: impl FnOnce() -> Kernel,
) -> Kernel {
    cached_kernel2(name, dtype, "", make)
}

/// [`cached_kernel`] for kernels over two dtypes.
pub(crate) fn cached_kernel2(
    name: &'static str,
    dtype: &'static str,
    dtype2: &'static str,
    make: impl FnOnce() -> Kernel,
) -> Kernel {
    type Key = (&'static str, &'static str, &'static str);
    static CACHE: OnceLock<Mutex<HashMap<Key, Kernel>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = match cache.lock() {
        Ok(m) => m,
        Err(poisoned) => poisoned.into_inner(),
    };
    map.entry((name, dtype, dtype2))
        .or_insert_with(make)
        .clone()
}

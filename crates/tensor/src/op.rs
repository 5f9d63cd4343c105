//! The op type returned by constructors and kernels, the preamble every kernel op shares, and
//! the per-dtype kernel cache.
//!
//! A kernel op runs its lazy inputs, takes the executing stream and checks that every input
//! tensor lives on that stream's device before it launches ([`kernel_op`], [`kernel_op2`],
//! [`kernel_op3`]). These also copy every input that is not contiguous (a strided view) to a
//! dense tensor first, on the executing stream, so the kernels behind them read packed rows;
//! kernels that index strided inputs themselves use [`strided_op`], [`strided_op2`] and
//! [`strided_op3`], which pass the inputs as they are. Inputs of a kernel that reads several run with their forks kept on the
//! context's device, since the kernel reads them together there.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cuflow_device_op::op::zip::{Zip2, Zip3};
use cuflow_device_op::{from_fn, DeviceOp, ExecutionContext};
use cuflow_runtime::{DeviceError, Kernel, Stream};

use crate::dtype::DType;
use crate::kernels::{check_device, dense};
use crate::tensor::{Tensor, TensorInput, TensorRef};

/// A lazy tensor operation: a constructor or a kernel launch that runs when executed, on the
/// stream its context gives. Returned by every function of [`api`](crate::api) and
/// [`kernels`](crate::kernels); combine it like any other [`DeviceOp`](cuflow_device_op::DeviceOp).
/// It is the device-op crate's one op primitive, [`from_fn`](cuflow_device_op::from_fn).
pub type TensorOp<F> = cuflow_device_op::FromFn<F>;

/// The op of kernel `name` over one input: runs `x`, then `launch` with the executing stream
/// and the tensor, once it is known to be on the stream's device (a
/// [`DeviceError::DeviceMismatch`] naming `name` otherwise).
pub(crate) fn kernel_op<T: DType, X: TensorInput<T>, R: Send>(
    name: &'static str,
    x: X,
    launch: impl FnOnce(&Stream, &Tensor<T>) -> Result<R, DeviceError> + Send,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<R, DeviceError> + Send> {
    strided_op(name, x, move |stream, x| {
        launch(stream, &*dense(name, stream, x)?)
    })
}

/// [`kernel_op`] without the copy of strided inputs: `launch` gets the input as it is.
pub(crate) fn strided_op<T: DType, X: TensorInput<T>, R: Send>(
    name: &'static str,
    x: X,
    launch: impl FnOnce(&Stream, &Tensor<T>) -> Result<R, DeviceError> + Send,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<R, DeviceError> + Send> {
    let x = x.into_op();
    from_fn(move |ctx: &mut ExecutionContext| {
        let x = x.execute(ctx)?;
        let stream = ctx.stream()?;
        check_device(name, stream, x.tensor())?;
        launch(stream, x.tensor())
    })
}

/// [`kernel_op`] over two inputs, run together on the context's device.
pub(crate) fn kernel_op2<T: DType, U: DType, X: TensorInput<T>, Y: TensorInput<U>, R: Send>(
    name: &'static str,
    (x, y): (X, Y),
    launch: impl FnOnce(&Stream, &Tensor<T>, &Tensor<U>) -> Result<R, DeviceError> + Send,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<R, DeviceError> + Send> {
    strided_op2(name, (x, y), move |stream, x, y| {
        launch(stream, &*dense(name, stream, x)?, &*dense(name, stream, y)?)
    })
}

/// [`kernel_op2`] without the copy of strided inputs.
pub(crate) fn strided_op2<T: DType, U: DType, X: TensorInput<T>, Y: TensorInput<U>, R: Send>(
    name: &'static str,
    (x, y): (X, Y),
    launch: impl FnOnce(&Stream, &Tensor<T>, &Tensor<U>) -> Result<R, DeviceError> + Send,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<R, DeviceError> + Send> {
    let both = Zip2::new(x.into_op(), y.into_op());
    from_fn(move |ctx: &mut ExecutionContext| {
        let (x, y) = ctx.with_same_device(|ctx| both.execute(ctx))?;
        let stream = ctx.stream()?;
        check_device(name, stream, x.tensor())?;
        check_device(name, stream, y.tensor())?;
        launch(stream, x.tensor(), y.tensor())
    })
}

/// [`kernel_op`] over three inputs of one dtype, run together on the context's device.
pub(crate) fn kernel_op3<
    T: DType,
    X: TensorInput<T>,
    Y: TensorInput<T>,
    Z: TensorInput<T>,
    R: Send,
>(
    name: &'static str,
    (x, y, z): (X, Y, Z),
    launch: impl FnOnce(&Stream, [&Tensor<T>; 3]) -> Result<R, DeviceError> + Send,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<R, DeviceError> + Send> {
    let all = Zip3::new(x.into_op(), y.into_op(), z.into_op());
    from_fn(move |ctx: &mut ExecutionContext| {
        let (x, y, z) = ctx.with_same_device(|ctx| all.execute(ctx))?;
        let stream = ctx.stream()?;
        for t in [x.tensor(), y.tensor(), z.tensor()] {
            check_device(name, stream, t)?;
        }
        let (x, y, z) = (
            dense(name, stream, x.tensor())?,
            dense(name, stream, y.tensor())?,
            dense(name, stream, z.tensor())?,
        );
        launch(stream, [&x, &y, &z])
    })
}

/// Three inputs of any dtypes, run together on the context's device and passed to `launch` as
/// they are (strided inputs are not copied).
#[allow(clippy::type_complexity)]
pub(crate) fn strided_op3<
    T: DType,
    U: DType,
    V: DType,
    X: TensorInput<T>,
    Y: TensorInput<U>,
    Z: TensorInput<V>,
    R: Send,
>(
    name: &'static str,
    (x, y, z): (X, Y, Z),
    launch: impl FnOnce(&Stream, &Tensor<T>, &Tensor<U>, &Tensor<V>) -> Result<R, DeviceError> + Send,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<R, DeviceError> + Send> {
    let all = Zip3::new(x.into_op(), y.into_op(), z.into_op());
    from_fn(move |ctx: &mut ExecutionContext| {
        let (x, y, z) = ctx.with_same_device(|ctx| all.execute(ctx))?;
        let stream = ctx.stream()?;
        check_device(name, stream, x.tensor())?;
        check_device(name, stream, y.tensor())?;
        check_device(name, stream, z.tensor())?;
        launch(stream, x.tensor(), y.tensor(), z.tensor())
    })
}

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

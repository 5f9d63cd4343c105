//! Small `f32` kernels shared by the test suites, each with CUDA C source and a host
//! implementation over the same arguments, declared once per process.
//!
//! Every kernel takes its element count `n` as its last `unsigned` argument (the spins take
//! none) and touches only elements below it; the host implementations fail with
//! [`DeviceError::HostKernel`] when a buffer is shorter than `n`. The elementwise kernels
//! loop with a grid stride, so any grid covers any `n`, except [`add_one`], which gives one
//! element to each thread.

use std::sync::OnceLock;
use std::time::Duration;

use cuflow_runtime::{
    BufferView, DeviceBuffer, DeviceError, HostKernelArgs, Kernel, KernelArgs, LaunchConfig, Stream,
};

/// Cycles of a long spin: about 100 ms at 2 GHz on CUDA, a sleep of the same length on the
/// host.
pub const LONG_SPIN: u64 = 200_000_000;

/// Cycles of a short spin: about 10 ms.
pub const SHORT_SPIN: u64 = 20_000_000;

/// A kernel from CUDA C `source` written in this crate.
#[allow(unsafe_code)]
pub(crate) fn reviewed_kernel(name: &str, source: &str) -> Kernel {
    // SAFETY: every source passed here is written in this crate (this module and the example
    // model) and reviewed to read and write only the elements of the buffers it is given,
    // below the counts it is given, with no data race between its threads. Those that trust a
    // count passed as a scalar are test kernels: the tests that launch them pass the true
    // lengths; those launched through the tensor `Launch` bound every access by the element
    // counts the launch appends.
    unsafe { Kernel::new(name, source) }
}

/// The first `n` elements of `s`, or a host-kernel error naming `kernel` if it is shorter.
pub fn prefix<'a, T>(kernel: &str, s: &'a [T], n: usize) -> Result<&'a [T], DeviceError> {
    s.get(..n).ok_or_else(|| too_short(kernel, n, s.len()))
}

/// The first `n` elements of `s`, or a host-kernel error naming `kernel` if it is shorter.
pub fn prefix_mut<'a, T>(
    kernel: &str,
    s: &'a mut [T],
    n: usize,
) -> Result<&'a mut [T], DeviceError> {
    let len = s.len();
    s.get_mut(..n).ok_or_else(|| too_short(kernel, n, len))
}

fn too_short(kernel: &str, n: usize, len: usize) -> DeviceError {
    DeviceError::HostKernel {
        kernel: kernel.to_string(),
        reason: format!("n = {n} exceeds the buffer's {len} elements"),
    }
}

/// How long the host implementation of a spin of `cycles` sleeps (at 2 GHz).
pub fn host_spin_duration(cycles: u64) -> Duration {
    Duration::from_nanos(cycles / 2)
}

/// `name(params, unsigned n)`: `body` for every `i < n`, with a grid-stride loop.
fn grid_stride(
    name: &'static str,
    params: &str,
    body: &str,
    host: impl Fn(&mut HostKernelArgs<'_>) -> Result<(), DeviceError> + Send + Sync + 'static,
) -> Kernel {
    let source = format!(
        r#"extern "C" __global__ void {name}({params}, unsigned n) {{
            for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
                 i += blockDim.x * gridDim.x) {{
                {body}
            }}
        }}"#
    );
    reviewed_kernel(name, &source).with_host(host)
}

/// `name(float* x, float value, unsigned n)`: `x[i] = f(x[i], value)`.
fn with_scalar(name: &'static str, body: &str, f: fn(f32, f32) -> f32) -> Kernel {
    grid_stride(name, "float* x, float value", body, move |args| {
        let value = args.scalar::<f32>(1)?;
        let n = args.scalar::<u32>(2)? as usize;
        for x in prefix_mut(name, args.output::<f32>(0)?, n)? {
            *x = f(*x, value);
        }
        Ok(())
    })
}

/// `name(float* dst, const float* src, unsigned n)`: `dst[i] = f(dst[i], src[i])`.
fn from_source(name: &'static str, body: &str, f: fn(f32, f32) -> f32) -> Kernel {
    grid_stride(name, "float* dst, const float* src", body, move |args| {
        let n = args.scalar::<u32>(2)? as usize;
        let src = prefix(name, args.input::<f32>(1)?, n)?;
        for (d, s) in prefix_mut(name, args.output::<f32>(0)?, n)?
            .iter_mut()
            .zip(src)
        {
            *d = f(*d, *s);
        }
        Ok(())
    })
}

/// `dst[i] = src[i]` for every `i` below both element counts, as a kernel of the tensor
/// `Launch` (which appends them): `(float* dst, const float* src, u64 n_dst, u64 n_src)`.
pub fn launch_copy() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        reviewed_kernel(
            "test_launch_copy",
            r#"extern "C" __global__ void test_launch_copy(float* dst, const float* src,
                                                          unsigned long long n_dst,
                                                          unsigned long long n_src) {
                const unsigned long long n = n_dst < n_src ? n_dst : n_src;
                for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x
                         + threadIdx.x; i < n; i += (unsigned long long)blockDim.x * gridDim.x) {
                    dst[i] = src[i];
                }
            }"#,
        )
        .with_host(|args| {
            let src = args.input::<f32>(1)?;
            for (d, s) in args.output::<f32>(0)?.iter_mut().zip(src) {
                *d = *s;
            }
            Ok(())
        })
    })
}

/// `x[i] = value` for `i < n`: `(float* x, float value, unsigned n)`.
pub fn fill() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| with_scalar("test_fill", "x[i] = value;", |_, v| v))
}

/// `x[i] += value` for `i < n`: `(float* x, float value, unsigned n)`.
pub fn add_scalar() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| with_scalar("test_add_scalar", "x[i] += value;", |x, v| x + v))
}

/// `x[i] *= value` for `i < n`: `(float* x, float value, unsigned n)`.
pub fn mul_scalar() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| with_scalar("test_mul_scalar", "x[i] *= value;", |x, v| x * v))
}

/// `dst[i] = src[i]` for `i < n`: `(float* dst, const float* src, unsigned n)`.
pub fn copy() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| from_source("test_copy", "dst[i] = src[i];", |_, s| s))
}

/// `dst[i] += src[i]` for `i < n`: `(float* dst, const float* src, unsigned n)`.
pub fn accumulate() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| from_source("test_accumulate", "dst[i] += src[i];", |d, s| d + s))
}

/// `out[i] = x[i] + y[i]` for `i < n`: `(float* out, const float* x, const float* y,
/// unsigned n)`.
pub fn add() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        let params = "float* out, const float* x, const float* y";
        grid_stride("test_add", params, "out[i] = x[i] + y[i];", |args| {
            let n = args.scalar::<u32>(3)? as usize;
            let x = prefix("test_add", args.input::<f32>(1)?, n)?;
            let y = prefix("test_add", args.input::<f32>(2)?, n)?;
            let out = prefix_mut("test_add", args.output::<f32>(0)?, n)?;
            for ((o, x), y) in out.iter_mut().zip(x).zip(y) {
                *o = x + y;
            }
            Ok(())
        })
    })
}

/// `y[i] = a * x[i] + y[i]` for `i < n`: `(float* y, const float* x, float a, unsigned n)`.
pub fn saxpy() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        let params = "float* y, const float* x, float a";
        grid_stride("test_saxpy", params, "y[i] = a * x[i] + y[i];", |args| {
            let a = args.scalar::<f32>(2)?;
            let n = args.scalar::<u32>(3)? as usize;
            let x = prefix("test_saxpy", args.input::<f32>(1)?, n)?;
            for (y, x) in prefix_mut("test_saxpy", args.output::<f32>(0)?, n)?
                .iter_mut()
                .zip(x)
            {
                *y += a * x;
            }
            Ok(())
        })
    })
}

/// `x[i] = x[i] * a + b` for `i < n`: `(float* x, float a, float b, unsigned n)`.
pub fn affine() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        grid_stride(
            "test_affine",
            "float* x, float a, float b",
            "x[i] = x[i] * a + b;",
            |args| {
                let (a, b) = (args.scalar::<f32>(1)?, args.scalar::<f32>(2)?);
                let n = args.scalar::<u32>(3)? as usize;
                for x in prefix_mut("test_affine", args.output::<f32>(0)?, n)? {
                    *x = *x * a + b;
                }
                Ok(())
            },
        )
    })
}

/// `x[i] += 1` for `i < n`, one thread per element: `(float* x, unsigned n)`.
pub fn add_one() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        let source = r#"extern "C" __global__ void test_add_one(float* x, unsigned n) {
            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) x[i] += 1.0f;
        }"#;
        reviewed_kernel("test_add_one", source).with_host(|args| {
            let n = args.scalar::<u32>(1)? as usize;
            for v in prefix_mut("test_add_one", args.output::<f32>(0)?, n)? {
                *v += 1.0;
            }
            Ok(())
        })
    })
}

/// One thread spins for `cycles` clock cycles (a dependent loop of `clock64()` reads); the host
/// implementation sleeps for [`host_spin_duration`]: `(unsigned long long cycles)`. It touches
/// no buffer.
pub fn spin() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        let source = r#"extern "C" __global__ void test_spin(unsigned long long cycles) {
            long long start = clock64();
            while ((unsigned long long)(clock64() - start) < cycles) { }
        }"#;
        reviewed_kernel("test_spin", source).with_host(|args| {
            std::thread::sleep(host_spin_duration(args.scalar::<u64>(0)?));
            Ok(())
        })
    })
}

/// One thread spins for `cycles` clock cycles (the host sleeps as long), then writes `value`
/// into `out[0]`: a long kernel whose only effect comes at its end. `(float* out, float value,
/// unsigned long long cycles)`.
pub fn spin_write() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        let source = r#"extern "C" __global__ void test_spin_write(float* out, float value,
                                                         unsigned long long cycles) {
            long long start = clock64();
            while ((unsigned long long)(clock64() - start) < cycles) { }
            out[0] = value;
        }"#;
        reviewed_kernel("test_spin_write", source).with_host(|args| {
            let value = args.scalar::<f32>(1)?;
            std::thread::sleep(host_spin_duration(args.scalar::<u64>(2)?));
            prefix_mut("test_spin_write", args.output::<f32>(0)?, 1)?[0] = value;
            Ok(())
        })
    })
}

/// Launches [`add_one`] over every element of `x` on `stream`.
pub fn launch_add_one<'a>(
    stream: &Stream,
    x: impl Into<BufferView<'a, f32>>,
) -> Result<(), DeviceError> {
    let x = x.into();
    let n = x.len();
    add_one().launch(
        stream,
        LaunchConfig::for_num_elems(n),
        KernelArgs::new().output(x).scalar(n as u32),
    )
}

/// Launches [`affine`] over every element of `x` on `stream`: `x = x * a + b`.
pub fn launch_affine<'a>(
    stream: &Stream,
    x: impl Into<BufferView<'a, f32>>,
    a: f32,
    b: f32,
) -> Result<(), DeviceError> {
    let x = x.into();
    let n = x.len();
    affine().launch(
        stream,
        LaunchConfig::for_num_elems(n),
        KernelArgs::new()
            .output(x)
            .scalar(a)
            .scalar(b)
            .scalar(n as u32),
    )
}

/// Launches [`spin_write`] on `stream`: spins for `cycles`, then writes `value` into `out[0]`.
pub fn launch_spin_write<'a>(
    stream: &Stream,
    out: impl Into<BufferView<'a, f32>>,
    value: f32,
    cycles: u64,
) -> Result<(), DeviceError> {
    spin_write().launch(
        stream,
        LaunchConfig::linear(1, 1),
        KernelArgs::new().output(out).scalar(value).scalar(cycles),
    )
}

/// Checks that `s` still runs kernels and copies correctly: [`add_one`] over random data, read
/// back, then a synchronization.
pub fn assert_stream_usable(s: &Stream) -> Result<(), DeviceError> {
    let x0 = crate::rng::random_f32(&mut crate::rng::rng(), 37);
    let x = DeviceBuffer::from_host(s, &x0)?;
    launch_add_one(s, &x)?;
    let want: Vec<f32> = x0.iter().map(|v| v + 1.0).collect();
    assert_eq!(x.to_host_vec(s)?, want, "a kernel after the error");
    s.synchronize()
}

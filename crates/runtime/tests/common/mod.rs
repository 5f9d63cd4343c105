//! Shared pieces of the runtime's conformance suite.
//!
//! - [`device`]: the device under test, from `Device::auto()`: the host backend where no GPU is
//!   present, CUDA under `CUFLOW_DEVICE=cuda`, where a device that cannot be had fails the test
//!   instead of skipping it.
//! - Random data from a fresh seed ([`rng`]), printed so that a failure can be replayed with
//!   `CUFLOW_TEST_SEED=<seed>`.
//! - [`rel_err`] / [`assert_close`]: comparison with a float64 reference by relative error.
//! - Kernels used by several test files, each with CUDA C source and a host implementation over
//!   the same arguments, compiled once per process.
//!
//! Each test binary uses a part of this module.
#![allow(dead_code, unreachable_pub)]

pub mod devices;

use std::sync::OnceLock;
use std::time::Duration;

use cuflow_runtime::{Device, DeviceError, Kernel};
use rand::distributions::{Distribution, Standard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A byte pattern written over outputs before a test, so that an element that was not written
/// shows (as `0xABABABAB` integers, or a tiny negative float).
pub const POISON: u8 = 0xAB;

/// The `u32` made of four [`POISON`] bytes.
pub const POISON_U32: u32 = 0xABAB_ABAB;

/// Element counts that are not multiples of any block or word size.
pub const ODD_SIZES: [usize; 5] = [1, 7, 1000, 4097, (1 << 20) + 3];

/// Cycles of a long spin: about 100 ms at 2 GHz on CUDA, a sleep of the same length on the
/// host.
pub const LONG_SPIN: u64 = 200_000_000;

/// Cycles of a short spin: about 10 ms.
pub const SHORT_SPIN: u64 = 20_000_000;

/// The device under test.
pub fn device() -> Device {
    Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable")
}

/// A random generator with a fresh seed (or `$CUFLOW_TEST_SEED`), which it prints.
pub fn rng() -> StdRng {
    let seed = std::env::var("CUFLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("random seed: {seed} (replay with CUFLOW_TEST_SEED={seed})");
    StdRng::seed_from_u64(seed)
}

/// `n` random values over the whole range of `T` (floats: `[0, 1)`).
pub fn random_vec<T>(rng: &mut StdRng, n: usize) -> Vec<T>
where
    Standard: Distribution<T>,
{
    (0..n).map(|_| rng.gen()).collect()
}

/// `n` random floats in `[-1, 1)`, never all zero.
pub fn random_f32(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Relative error of `got` against the reference `want`, in the 2-norm. NaN in `got` gives NaN,
/// which fails every `<=` check.
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Asserts that `got` matches `want` within relative error `tol`.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    let err = rel_err(got, want);
    assert!(
        err <= tol,
        "{what}: relative error {err:e} exceeds {tol:e} (first elements: got {:?}, want {:?})",
        &got[..got.len().min(4)],
        &want[..want.len().min(4)]
    );
}

/// The first `n` elements of `s`, or a kernel error if it is shorter.
pub fn prefix_mut<'a, T>(
    kernel: &str,
    s: &'a mut [T],
    n: usize,
) -> Result<&'a mut [T], DeviceError> {
    let len = s.len();
    s.get_mut(..n).ok_or_else(|| DeviceError::HostKernel {
        kernel: kernel.to_string(),
        reason: format!("n = {n} exceeds the buffer's {len} elements"),
    })
}

/// The first `n` elements of `s`, or a kernel error if it is shorter.
pub fn prefix<'a, T>(kernel: &str, s: &'a [T], n: usize) -> Result<&'a [T], DeviceError> {
    s.get(..n).ok_or_else(|| DeviceError::HostKernel {
        kernel: kernel.to_string(),
        reason: format!("n = {n} exceeds the buffer's {} elements", s.len()),
    })
}

/// `x[i] += 1` for `i < n` (one thread per element).
pub fn add_one() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
        // given, below the counts it is given, and has no data race of its own.
        let kernel = unsafe {
            Kernel::new(
                "rt_add_one",
                r#"extern "C" __global__ void rt_add_one(float* x, unsigned n) {
                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) x[i] += 1.0f;
            }"#,
            )
        };
        kernel.with_host(|args| {
            let n = args.scalar::<u32>(1)? as usize;
            for v in prefix_mut("rt_add_one", args.output::<f32>(0)?, n)? {
                *v += 1.0;
            }
            Ok(())
        })
    })
}

/// `out[i] = x[i] + y[i]` for `i < n`, with a grid-stride loop.
pub fn add() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
        // given, below the counts it is given, and has no data race of its own.
        let kernel = unsafe {
            Kernel::new(
                "rt_add",
                r#"extern "C" __global__ void rt_add(float* out, const float* x, const float* y,
                                                unsigned n) {
                for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
                     i += blockDim.x * gridDim.x) {
                    out[i] = x[i] + y[i];
                }
            }"#,
            )
        };
        kernel.with_host(|args| {
            let n = args.scalar::<u32>(3)? as usize;
            let x = prefix("rt_add", args.input::<f32>(1)?, n)?;
            let y = prefix("rt_add", args.input::<f32>(2)?, n)?;
            let out = prefix_mut("rt_add", args.output::<f32>(0)?, n)?;
            for ((o, x), y) in out.iter_mut().zip(x).zip(y) {
                *o = x + y;
            }
            Ok(())
        })
    })
}

/// `y[i] = a * x[i] + y[i]` for `i < n`, with a grid-stride loop (any grid covers any `n`).
pub fn saxpy() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
        // given, below the counts it is given, and has no data race of its own.
        let kernel = unsafe { Kernel::new(
            "rt_saxpy",
            r#"extern "C" __global__ void rt_saxpy(float* y, const float* x, float a, unsigned n) {
                for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
                     i += blockDim.x * gridDim.x) {
                    y[i] = a * x[i] + y[i];
                }
            }"#,
        ) };
        kernel
        .with_host(|args| {
            let a = args.scalar::<f32>(2)?;
            let n = args.scalar::<u32>(3)? as usize;
            let x = prefix("rt_saxpy", args.input::<f32>(1)?, n)?;
            let y = prefix_mut("rt_saxpy", args.output::<f32>(0)?, n)?;
            for (y, x) in y.iter_mut().zip(x) {
                *y += a * x;
            }
            Ok(())
        })
    })
}

/// How long the host implementation of [`spin_write`] sleeps for `cycles` (at 2 GHz).
pub fn host_spin_duration(cycles: u64) -> Duration {
    Duration::from_nanos(cycles / 2)
}

/// One thread spins for `cycles` clock cycles (the host sleeps as long), then writes `value`
/// into `out[0]`: a long kernel whose only effect comes at its end.
pub fn spin_write() -> &'static Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    K.get_or_init(|| {
        // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
        // given, below the counts it is given, and has no data race of its own.
        let kernel = unsafe {
            Kernel::new(
                "rt_spin_write",
                r#"extern "C" __global__ void rt_spin_write(float* out, float value,
                                                       unsigned long long cycles) {
                long long start = clock64();
                while ((unsigned long long)(clock64() - start) < cycles) { }
                out[0] = value;
            }"#,
            )
        };
        kernel.with_host(|args| {
            let value = args.scalar::<f32>(1)?;
            let cycles = args.scalar::<u64>(2)?;
            std::thread::sleep(host_spin_duration(cycles));
            match args.output::<f32>(0)?.first_mut() {
                Some(out) => *out = value,
                None => {
                    return Err(DeviceError::HostKernel {
                        kernel: "rt_spin_write".into(),
                        reason: "the output is empty".into(),
                    })
                }
            }
            Ok(())
        })
    })
}

//! Constructors and copies. Each returns an op; nothing runs until it is executed, and the
//! new tensor lives on the device of the stream it runs on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cuflow_device_op::{from_fn, DeviceOp, ExecutionContext};
use cuflow_runtime::{DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};

use crate::dtype::{cuda_defs, cuda_from_double, cuda_prelude, DType, FloatDType};
use crate::kernels::{alloc, check_device};
use crate::op::{cached_kernel, cached_kernel2, kernel_op, strided_op, TensorOp};
use crate::tensor::{check_numel, Shape, Tensor, TensorInput};

pub use crate::constructors::{fill, full_like, ones_like, zeros_like};

/// The result of a constructor op.
pub type TensorResult<T> = Result<Tensor<T>, DeviceError>;

/// A tensor of `shape` filled with zeros.
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::{api, TensorOpExt};
/// assert_eq!(api::zeros::<f32>(&[2, 3]).to_host_vec()?, vec![0.0; 6]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn zeros<T: DType>(
    shape: &[usize],
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    let shape: Shape = shape.into();
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        let out = alloc::<T>("zeros", stream, &shape)?;
        out.buffer().view().fill_bytes(stream, 0)?;
        Ok(out)
    })
}

/// A tensor of `shape` filled with ones.
pub fn ones<T: DType>(
    shape: &[usize],
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    crate::kernels::fill("ones", shape, T::from_f64(1.0))
}

/// A tensor of `shape` filled with `value`.
pub fn full<T: DType>(
    shape: &[usize],
    value: T,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    crate::kernels::fill("full", shape, value)
}

fn iota_kernel<T: DType>() -> Kernel {
    cached_kernel("iota", T::NAME, || {
        let name = format!("iota_{}", T::NAME);
        let source = format!(
            r#"{prelude}{from_double}
extern "C" __global__ void {name}(T* out, double a0, double d, unsigned long long n,
                                  unsigned long long eye_cols, double last, int pin_last,
                                  double scale) {{
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)blockDim.x * gridDim.x) {{
    // Rounded multiply and add (no contraction into a fused multiply-add), as on the host;
    // the first value is a0 itself, and scaling by a power of two is exact.
    double v = eye_cols ? ((i / eye_cols == i % eye_cols) ? 1.0 : 0.0)
             : (pin_last && i == n - 1) ? last
             : __dmul_rn(i == 0 ? a0 : __dadd_rn(a0, __dmul_rn((double)i, d)), scale);
    out[i] = st(from_double_{t}(v));
  }}
}}
"#,
            prelude = cuda_prelude::<T>(),
            from_double = cuda_from_double::<T>(),
            t = T::NAME,
        );
        crate::op::builtin_kernel(name, source).with_host(|args| {
            let a0 = args.scalar::<f64>(1)?;
            let d = args.scalar::<f64>(2)?;
            let n = args.scalar::<u64>(3)?;
            let eye = args.scalar::<u64>(4)?;
            let last = args.scalar::<f64>(5)?;
            let pin_last = args.scalar::<i32>(6)? != 0;
            let scale = args.scalar::<f64>(7)?;
            for (i, o) in args.output::<T>(0)?.iter_mut().enumerate() {
                let i = i as u64;
                let v = match i.checked_div(eye) {
                    Some(row) if row == i % eye => 1.0,
                    Some(_) => 0.0,
                    None if pin_last && i + 1 == n => last,
                    None if i == 0 => a0 * scale,
                    None => (a0 + i as f64 * d) * scale,
                };
                *o = T::from_f64(v);
            }
            Ok(())
        })
    })
}

fn grid_for(stream: &Stream, n: usize) -> LaunchConfig {
    let sms = crate::kernels::multiprocessors(stream);
    LaunchConfig::linear(n.div_ceil(256).clamp(1, sms * 32) as u32, 256)
}

/// `(a0 + i·d) · scale` (or the identity, for `eye_cols > 0`), with the last element `last`
/// where given. The first element is `a0 · scale`; `scale` is 1, or 2 where the values span
/// more than `f64` holds and `a0` and `d` are halved.
fn iota<T: DType>(
    op: &'static str,
    shape: Shape,
    (a0, d, scale): (f64, f64, f64),
    eye_cols: u64,
    last: Option<f64>,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        let out = alloc::<T>(op, stream, &shape)?;
        if !out.is_empty() {
            iota_kernel::<T>().launch(
                stream,
                grid_for(stream, out.len()),
                KernelArgs::new()
                    .output(&**out.buffer())
                    .scalar(a0)
                    .scalar(d)
                    .scalar(out.len() as u64)
                    .scalar(eye_cols)
                    .scalar(last.unwrap_or(0.0))
                    .scalar(i32::from(last.is_some()))
                    .scalar(scale),
            )?;
        }
        Ok(out)
    })
}

/// The 1-D tensor `start, start + step, ...` of the values below `end` (above it for a
/// negative step), computed in `f64` and rounded to `T` (an integer `T` truncates toward zero
/// and saturates at its bounds, as [`cast`] does).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] (when run) for a zero or non-finite step, a bound that is
/// not finite, or more values than a tensor can hold.
pub fn arange<T: DType>(
    start: f64,
    end: f64,
    step: f64,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    let invalid = |reason: String| DeviceError::InvalidShape {
        op: "arange",
        reason,
    };
    // Where `end - start` overflows, the values are computed halved and doubled back, as
    // `linspace` does: the halves of finite values are exact, and `i · step / 2` stays finite
    // where `i · step` would not (doubling is exact, so the values are those of the plain
    // formula wherever it does not overflow).
    let halved = (end - start).is_infinite();
    let (a0, d, scale) = if halved {
        (start / 2.0, step / 2.0, 2.0)
    } else {
        (start, step, 1.0)
    };
    let count = if halved {
        ((end / 2.0 - a0) / d).ceil().max(0.0)
    } else {
        ((end - start) / step).ceil().max(0.0)
    };
    let n = if !start.is_finite() || !end.is_finite() {
        Err(invalid(format!(
            "the start and the end must be finite, got start {start} and end {end}"
        )))
    } else if step == 0.0 || !step.is_finite() {
        Err(invalid(format!(
            "the step must be finite and non-zero, got {step} (from {start} to {end})"
        )))
    } else if count >= usize::MAX as f64 {
        Err(invalid(format!(
            "from {start:e} to {end:e} by {step:e} is {count:e} values, more than a tensor \
             can hold"
        )))
    } else {
        Ok(arange_count((a0, d, scale), end, count as usize))
    };
    let inner = iota::<T>(
        "arange",
        Shape::from_slice(&[n.as_ref().copied().unwrap_or(0)]),
        (a0, d, scale),
        0,
        None,
    );
    from_fn(move |ctx: &mut ExecutionContext| {
        n?;
        inner.execute(ctx)
    })
}

/// The number of values of `arange`: the first `i` whose value `(a0 + i · d) · scale`,
/// rounded as the iota kernel rounds it, is not below `end` (not above it for a negative
/// step). The quotient `estimate` = ⌈(end - start) / step⌉ is off where the division or the
/// values round (`1 + 3 · 0.1` is `1.3` itself); the values grow monotonically with `i`, so
/// the count is bisected from it.
fn arange_count((a0, d, scale): (f64, f64, f64), end: f64, estimate: usize) -> usize {
    let value = |i: usize| {
        if i == 0 {
            a0 * scale
        } else {
            (a0 + i as f64 * d) * scale
        }
    };
    let inside = |i: usize| {
        let v = value(i);
        if d > 0.0 {
            v < end
        } else {
            v > end
        }
    };
    if !inside(0) {
        return 0;
    }
    // Index `lo` is inside and `hi` is not: the count lies in `lo + 1..=hi`.
    let mut hi = estimate.saturating_add(2);
    while inside(hi) && hi < usize::MAX {
        hi = hi.saturating_mul(2);
    }
    let mut lo = 0;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if inside(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// `steps` values evenly spaced from `start` to `end` inclusive (one value: `start`), computed
/// in `f64` as `start + i · (end - start) / (steps - 1)` and rounded to `T` (for an integer `T`
/// as in [`arange`]). The first and the last value are `start` and `end` exactly (rounded to
/// `T`). Bounds as far apart as `f64` allows (`-f64::MAX` to `f64::MAX`) give finite values.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `linspace` (when run) for a bound that is not finite.
pub fn linspace<T: DType>(
    start: f64,
    end: f64,
    steps: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    let finite = start.is_finite() && end.is_finite();
    let intervals = steps.saturating_sub(1).max(1) as f64;
    // Where `end - start` overflows, the values are computed halved and doubled back: the
    // halves of finite values are exact (so large), their difference finite, and every value
    // lies between the bounds, so it is finite too.
    let (a0, d, scale) = if !finite || steps <= 1 {
        (start, 0.0, 1.0)
    } else if (end - start).is_finite() {
        (start, (end - start) / intervals, 1.0)
    } else {
        (start / 2.0, (end / 2.0 - start / 2.0) / intervals, 2.0)
    };
    let inner = iota::<T>(
        "linspace",
        Shape::from_slice(&[if finite { steps } else { 0 }]),
        (a0, d, scale),
        0,
        (steps > 1).then_some(end),
    );
    from_fn(move |ctx: &mut ExecutionContext| {
        if !finite {
            return Err(DeviceError::InvalidShape {
                op: "linspace",
                reason: format!(
                    "the start and the end must be finite, got start {start} and end {end}"
                ),
            });
        }
        inner.execute(ctx)
    })
}

/// The `n × n` identity matrix.
pub fn eye<T: DType>(
    n: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    iota::<T>(
        "eye",
        Shape::from_slice(&[n, n]),
        (0.0, 0.0, 1.0),
        n.max(1) as u64,
        None,
    )
}

/// The `rows × cols` matrix with ones on its main diagonal (`i == j`) and zeros elsewhere.
///
/// ```
/// use cuflow_tensor::{api, TensorOpExt};
/// assert_eq!(api::eye_rect::<i32>(2, 3).to_host_vec()?, vec![1, 0, 0, 0, 1, 0]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn eye_rect<T: DType>(
    rows: usize,
    cols: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    iota::<T>(
        "eye_rect",
        Shape::from_slice(&[rows, cols]),
        (0.0, 0.0, 1.0),
        cols.max(1) as u64,
        None,
    )
}

static NEXT_SEED: AtomicU64 = AtomicU64::new(0x5eed_c0ff_ee00_0001);

/// Sets the seed that [`rand`] and [`randn`] draw their seeds from (each call takes the next
/// one), so a program that calls them in the same order gets the same tensors.
pub fn manual_seed(seed: u64) {
    NEXT_SEED.store(seed, Ordering::SeqCst);
}

fn next_seed() -> u64 {
    NEXT_SEED.fetch_add(1, Ordering::SeqCst)
}

/// The random-number kernel: Philox4x32-10 on the element index keyed by the seed, the same
/// counter-based generator on both backends. Uniform values take the top 24 bits of the first
/// output word; normal values use the Box–Muller transform of the first two words, in `f64`.
fn random_kernel<T: DType>() -> Kernel {
    cached_kernel("random", T::NAME, || {
        let name = format!("random_{}", T::NAME);
        let source = format!(
            r#"{prelude}{from_double}
__device__ __forceinline__ void philox(unsigned c[4], unsigned k0, unsigned k1) {{
  for (int r = 0; r < 10; ++r) {{
    unsigned long long p0 = (unsigned long long)0xD2511F53u * c[0];
    unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c[2];
    unsigned hi0 = (unsigned)(p0 >> 32), lo0 = (unsigned)p0;
    unsigned hi1 = (unsigned)(p1 >> 32), lo1 = (unsigned)p1;
    unsigned n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }}
}}
extern "C" __global__ void {name}(T* out, unsigned long long n, unsigned long long seed,
                                  double a, double b, int normal) {{
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)blockDim.x * gridDim.x) {{
    unsigned c[4] = {{(unsigned)i, (unsigned)(i >> 32), 0u, 0u}};
    philox(c, (unsigned)seed, (unsigned)(seed >> 32));
    double v;
    if (normal) {{
      double u1 = ((double)(c[0] >> 8) + 0.5) * (1.0 / 16777216.0);
      double u2 = (double)(c[1] >> 8) * (1.0 / 16777216.0);
      v = a + b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    }} else {{
      v = a + (b - a) * ((double)(c[0] >> 8) * (1.0 / 16777216.0));
      if (b > a && (double)ld(st(from_double_{t}(v))) >= b) {{
        // Rounding to T reached b: bisect for the largest value that rounds below it.
        double lo = a, hi = v;
        for (int k = 0; k < 64; ++k) {{
          double m = 0.5 * (lo + hi);
          if ((double)ld(st(from_double_{t}(m))) < b) lo = m; else hi = m;
        }}
        v = lo;
      }}
    }}
    out[i] = st(from_double_{t}(v));
  }}
}}
"#,
            prelude = cuda_prelude::<T>(),
            from_double = cuda_from_double::<T>(),
            t = T::NAME,
        );
        crate::op::builtin_kernel(name, source).with_host(|args| {
            let seed = args.scalar::<u64>(2)?;
            let a = args.scalar::<f64>(3)?;
            let b = args.scalar::<f64>(4)?;
            let normal = args.scalar::<i32>(5)? != 0;
            for (i, o) in args.output::<T>(0)?.iter_mut().enumerate() {
                let c = philox(i as u64, seed);
                *o = if normal {
                    let u1 = ((c[0] >> 8) as f64 + 0.5) / 16_777_216.0;
                    let u2 = (c[1] >> 8) as f64 / 16_777_216.0;
                    T::from_f64(
                        a + b * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos(),
                    )
                } else {
                    round_below(a + (b - a) * ((c[0] >> 8) as f64 / 16_777_216.0), a, b)
                };
            }
            Ok(())
        })
    })
}

/// `v` (in `[a, b)`) rounded to `T`, or, where the rounding reaches `b`, the largest value that
/// rounds below `b` (bisected, as the CUDA kernel does), so uniform values stay below `b`.
fn round_below<T: DType>(v: f64, a: f64, b: f64) -> T {
    let r = T::from_f64(v);
    if b <= a || r.to_f64() < b {
        return r;
    }
    let (mut lo, mut hi) = (a, v);
    for _ in 0..64 {
        let m = 0.5 * (lo + hi);
        if T::from_f64(m).to_f64() < b {
            lo = m;
        } else {
            hi = m;
        }
    }
    T::from_f64(lo)
}

/// Philox4x32-10 of counter `(i, 0)` under key `seed`.
fn philox(i: u64, seed: u64) -> [u32; 4] {
    let mut c = [i as u32, (i >> 32) as u32, 0, 0];
    let (mut k0, mut k1) = (seed as u32, (seed >> 32) as u32);
    for _ in 0..10 {
        let p0 = 0xD251_1F53u64 * c[0] as u64;
        let p1 = 0xCD9E_8D57u64 * c[2] as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0];
        k0 = k0.wrapping_add(0x9E37_79B9);
        k1 = k1.wrapping_add(0xBB67_AE85);
    }
    c
}

/// How many standard deviations from the mean the normal values reach at most: the
/// Box–Muller radius `√(-2 ln u1)` of the smallest `u1` the generator draws, 2^-25.
const NORMAL_REACH: f64 = 5.887_050_112_577_373;

/// Whether some value of `T` lies in `[a, b)` (`a < b`, both finite): the value `T` rounds
/// [`rounds_from`] to, if any, lies below `b`.
fn holds_a_value<T: DType>(a: f64, b: f64) -> bool {
    rounds_from::<T>(a, b).is_some_and(|m| T::from_f64(m).to_f64() < b)
}

/// The least `f64` in `[a, b]` that rounds in `T` to a value not below `a` (`a < b`, both
/// finite): `a` itself unless `T` rounds it down; else the point past which values round up
/// to the next value of `T`, found by bisection (`None` when `b` still rounds down). Uniform
/// values drawn from it on round to `[a, ..)`; drawn from `a`, the lowest would round below it.
fn rounds_from<T: DType>(a: f64, b: f64) -> Option<f64> {
    let near = T::from_f64(a).to_f64();
    if near >= a {
        return Some(a);
    }
    // `lo` rounds to `near`; `hi` rounds above it.
    let (mut lo, mut hi) = (a, b);
    if T::from_f64(hi).to_f64() <= near {
        return None;
    }
    // Down to neighbouring doubles (at most about 2100 halvings over the range of `f64`).
    for _ in 0..2200 {
        let m = lo + 0.5 * (hi - lo);
        if m <= lo || m >= hi {
            break;
        }
        if T::from_f64(m).to_f64() > near {
            hi = m;
        } else {
            lo = m;
        }
    }
    Some(hi)
}

/// Checks the parameters of a distribution: `[a, b)` for a uniform one (finite, `a <= b`, its
/// width finite, holding a value of `T` unless empty), mean `a` and standard deviation `b` for
/// a normal one (both finite, `b >= 0`, every value it reaches finite in `T`).
fn check_distribution<T: DType>(a: f64, b: f64, normal: bool) -> Result<(), DeviceError> {
    let (op, reason) = if normal {
        let ok = a.is_finite() && b.is_finite() && b >= 0.0;
        // As `rand`'s low bound: a mean past `T`'s finite values would make every value near
        // it infinite.
        let mean_t = T::from_f64(a).to_f64();
        let reason = if !ok {
            Some(format!(
                "a normal distribution needs a finite mean and a finite, non-negative \
                 standard deviation, got mean {a} and standard deviation {b}"
            ))
        } else if !mean_t.is_finite() {
            Some(format!(
                "the mean {a} lies past the finite values of {}, where it rounds to {mean_t}: \
                 the values near it would be infinite; give a mean that {} holds",
                T::NAME,
                T::NAME
            ))
        } else if ![a - b * NORMAL_REACH, a + b * NORMAL_REACH]
            .iter()
            .all(|v| T::from_f64(*v).to_f64().is_finite())
        {
            Some(format!(
                "with mean {a} and standard deviation {b} the values reach {NORMAL_REACH:.3} \
                 deviations from the mean, {} to {}, past the finite values of {}, where they \
                 would be infinite; give a deviation that keeps them inside",
                a - b * NORMAL_REACH,
                a + b * NORMAL_REACH,
                T::NAME
            ))
        } else {
            None
        };
        ("randn", reason)
    } else {
        let ok = a.is_finite() && b.is_finite() && a <= b && (b - a).is_finite();
        // The values near `low` round to it in `T`: one past `T`'s finite values would give
        // infinities (a high bound past them is fine: values round below it).
        let low_t = T::from_f64(a).to_f64();
        let reason = if !ok {
            Some(format!(
                "a uniform distribution over [{a}, {b}) needs finite bounds, the low one not \
                 above the high one, and a width no wider than f64 spans"
            ))
        } else if !low_t.is_finite() {
            Some(format!(
                "the low bound {a} of [{a}, {b}) lies past the finite values of {}, where it \
                 rounds to {low_t}: the values near it would be infinite; give a low bound \
                 that {} holds",
                T::NAME,
                T::NAME
            ))
        } else if a < b && !holds_a_value::<T>(a, b) {
            Some(format!(
                "no value of {} lies in [{a}, {b}), whose bounds both lie between two \
                 neighbouring values of {} (the nearest to the low bound is {low_t}); give a \
                 range that holds one",
                T::NAME,
                T::NAME
            ))
        } else {
            None
        };
        ("rand", reason)
    };
    match reason {
        Some(reason) => Err(DeviceError::InvalidShape { op, reason }),
        None => Ok(()),
    }
}

fn random<T: FloatDType>(
    shape: &[usize],
    seed: u64,
    a: f64,
    b: f64,
    normal: bool,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    let shape: Shape = shape.into();
    from_fn(move |ctx: &mut ExecutionContext| {
        check_distribution::<T>(a, b, normal)?;
        // Uniform values are drawn from where they round to `a` or above.
        let a = if normal || a == b {
            a
        } else {
            rounds_from::<T>(a, b).unwrap_or(a)
        };
        let stream = ctx.stream()?;
        let out = alloc::<T>(if normal { "randn" } else { "rand" }, stream, &shape)?;
        if !out.is_empty() {
            random_kernel::<T>().launch(
                stream,
                grid_for(stream, out.len()),
                KernelArgs::new()
                    .output(&**out.buffer())
                    .scalar(out.len() as u64)
                    .scalar(seed)
                    .scalar(a)
                    .scalar(b)
                    .scalar(i32::from(normal)),
            )?;
        }
        Ok(out)
    })
}

/// Uniform random values in `[low, high)`, seeded from the sequence [`manual_seed`] sets.
/// Where rounding to `T` would give `high`, the value is the largest below it; where `T`
/// rounds `low` down, the values are drawn from where they round up to it or above; `low ==
/// high` gives `low` everywhere.
///
/// Both backends use the counter-based Philox4x32-10 generator, so a seed gives the same
/// values on host and CUDA up to the final rounding.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `rand` (when run) for bounds that are not finite,
/// `low > high`, a range wider than `f64` spans, a `low` past the finite values of `T`, or a
/// range `low < high` that holds no value of `T`.
pub fn rand<T: FloatDType>(
    low: f64,
    high: f64,
    shape: &[usize],
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    random::<T>(shape, next_seed(), low, high, false)
}

/// [`rand`] with an explicit seed.
///
/// # Errors
///
/// As [`rand`].
pub fn rand_seeded<T: FloatDType>(
    low: f64,
    high: f64,
    shape: &[usize],
    seed: u64,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    random::<T>(shape, seed, low, high, false)
}

/// Normal random values with `mean` and standard deviation `std`, seeded from the sequence
/// [`manual_seed`] sets (Philox4x32-10 and Box–Muller on both backends).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `randn` (when run) for a mean or a deviation that is
/// not finite, a negative deviation, a mean past the finite values of `T`, or a deviation
/// whose values (up to about 5.9 deviations from the mean) would lie past them.
pub fn randn<T: FloatDType>(
    mean: f64,
    std: f64,
    shape: &[usize],
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    random::<T>(shape, next_seed(), mean, std, true)
}

/// [`randn`] with an explicit seed.
///
/// # Errors
///
/// As [`randn`].
pub fn randn_seeded<T: FloatDType>(
    mean: f64,
    std: f64,
    shape: &[usize],
    seed: u64,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    random::<T>(shape, seed, mean, std, true)
}

/// A tensor of `shape` holding `data` (copied to the device when the op runs).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] (when run) when `data` does not have `shape`'s element count.
pub fn from_vec<T: DType>(
    data: Vec<T>,
    shape: &[usize],
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    let shape: Shape = shape.into();
    from_fn(move |ctx: &mut ExecutionContext| upload(ctx, &data, &shape))
}

/// A tensor of `shape` holding a copy of `data`.
///
/// # Errors
///
/// As [`from_vec`].
pub fn from_slice<'a, T: DType>(
    data: &'a [T],
    shape: &[usize],
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send + 'a> {
    let shape: Shape = shape.into();
    from_fn(move |ctx: &mut ExecutionContext| upload(ctx, data, &shape))
}

fn upload<T: DType>(ctx: &mut ExecutionContext, data: &[T], shape: &[usize]) -> TensorResult<T> {
    check_numel("from_vec", shape, data.len(), |n| {
        format!(
            "shape {shape:?} has {n} elements but {} were given",
            data.len()
        )
    })?;
    let stream = ctx.stream()?;
    Tensor::from_buffer(Arc::new(DeviceBuffer::from_host(stream, data)?), shape)
}

/// A copy of `x` in new memory: dense and row-major, whatever view `x` is.
pub fn dup<T: DType, X: TensorInput<T>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    strided_op("dup", x, move |stream, x| {
        if !x.is_contiguous() {
            return crate::kernels::gather_copy("dup", stream, x);
        }
        let out = alloc::<T>("dup", stream, x.shape())?;
        out.view("dup")?.copy_from(stream, x.range("dup")?)?;
        Ok(out)
    })
}

/// Copies `src` into `dst` (same shape) on the executing stream. It never allocates (unless
/// `src` is a strided view, which is first copied to a dense tensor), so it is graph-safe: use
/// it to feed new inputs to a captured graph between replays. `dst` may be a contiguous view,
/// such as rows of a larger tensor.
///
/// # Errors
///
/// [`DeviceError::ShapeMismatch`] (when run) when the shapes differ;
/// [`DeviceError::InvalidShape`] when `dst` is not contiguous, or when `dst` and `src` are
/// different but overlapping ranges of one buffer.
pub fn memcpy<'a, T: DType, S: TensorInput<T> + 'a>(
    dst: &'a mut Tensor<T>,
    src: S,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    strided_op("memcpy", src, move |stream, src| {
        check_device("memcpy", stream, dst)?;
        if dst.shape() != src.shape() {
            return Err(DeviceError::shape_mismatch(
                "memcpy",
                "the destination and the source must have the same shape",
                dst.shape(),
                src.shape(),
            ));
        }
        let src = if src.is_contiguous() {
            std::borrow::Cow::Borrowed(src)
        } else {
            std::borrow::Cow::Owned(crate::kernels::gather_copy("memcpy", stream, src)?)
        };
        if !dst.is_contiguous() {
            return Err(DeviceError::InvalidShape {
                op: "memcpy",
                reason: format!(
                    "the destination must be contiguous: a view of shape {:?} with strides \
                     {:?} is not (its elements are scattered, or repeated), and a copy of it \
                     would not be the tensor written",
                    dst.shape(),
                    dst.strides()
                ),
            });
        }
        let (d, s) = (dst.range("memcpy")?, src.range("memcpy")?);
        let (d0, s0, n) = (d.offset(), s.offset(), d.len());
        if dst.buffer().same_memory(src.buffer()) && d0 != s0 && d0 < s0 + n && s0 < d0 + n {
            return Err(DeviceError::InvalidShape {
                op: "memcpy",
                reason: format!(
                    "the destination (elements {d0}..{}) and the source (elements {s0}..{}) \
                     overlap in one buffer; copy the source first with `api::dup`",
                    d0 + n,
                    s0 + n
                ),
            });
        }
        d.copy_from(stream, s)
    })
}

fn cast_kernel<I: DType, O: DType>() -> Kernel {
    cached_kernel2("cast", I::NAME, O::NAME, || {
        let name = format!("cast_{}_{}", I::NAME, O::NAME);
        let defs = if I::NAME == O::NAME {
            cuda_defs::<I>()
        } else {
            format!("{}{}", cuda_defs::<I>(), cuda_defs::<O>())
        };
        let (i, o) = (I::NAME, O::NAME);
        // Rounded once from the integer: through `float` it would round twice.
        let int_to_bf16 = !I::IS_FLOAT && O::NAME == "bf16";
        // From `double` to `f16`/`bf16`: rounded once, not through `(float)`.
        let from_double = I::CUDA_ACC == "double" && crate::dtype::stores_float_rounded::<O>();
        let helper = if int_to_bf16 {
            crate::dtype::BF16_FROM_INT_CUDA.to_string()
        } else if from_double {
            cuda_from_double::<O>()
        } else {
            String::new()
        };
        let convert = if I::IS_FLOAT && !O::IS_FLOAT {
            // C leaves out-of-range conversions undefined: saturate and map NaN to 0 by hand.
            let (min, max) = (O::from_f64(f64::NEG_INFINITY), O::from_f64(f64::INFINITY));
            let min_literal = if min.to_f64() == 0.0 {
                "0".to_string()
            } else {
                format!("(-{max:?}LL - 1)")
            };
            format!(
                "double v = (double)ld_{i}(x[k]);\n    \
                 out[k] = v != v ? (T_{o})0 : v <= {min_f:?} ? (T_{o}){min_literal} \
                 : v >= {max_f:?} ? (T_{o}){max:?}ULL : (T_{o})v;",
                min_f = min.to_f64(),
                max_f = max.to_f64(),
            )
        } else if int_to_bf16 {
            "out[k] = bf16_from_int_ll((long long)x[k]);".to_string()
        } else if from_double {
            format!("out[k] = st_{o}(from_double_{o}(ld_{i}(x[k])));")
        } else {
            format!("out[k] = st_{o}((A_{o})ld_{i}(x[k]));")
        };
        let source = format!(
            r#"{defs}{helper}
extern "C" __global__ void {name}(T_{o}* out, const T_{i}* x, unsigned long long n) {{
  for (unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
       k += (unsigned long long)blockDim.x * gridDim.x) {{
    {convert}
  }}
}}
"#
        );
        crate::op::builtin_kernel(name, source).with_host(|args| {
            let x = args.input::<I>(1)?;
            for (o, v) in args.output::<O>(0)?.iter_mut().zip(x) {
                *o = match v.to_i128() {
                    Some(int) => O::from_i128(int),
                    None => O::from_f64(v.to_f64()),
                };
            }
            Ok(())
        })
    })
}

/// `x` converted to `O` elementwise: floats to integers truncate toward zero and saturate
/// (NaN becomes 0); integers to narrower integers keep the low bits (as Rust's `as` does);
/// integers to floats round to nearest.
pub fn cast<I: DType, O: DType, X: TensorInput<I>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<O> + Send> {
    kernel_op("cast", x, move |stream, x| {
        let out = alloc::<O>("cast", stream, x.shape())?;
        if !out.is_empty() {
            cast_kernel::<I, O>().launch(
                stream,
                grid_for(stream, out.len()),
                KernelArgs::new()
                    .output(out.view("cast")?)
                    .input(x.view("cast")?)
                    .scalar(out.len() as u64),
            )?;
        }
        Ok(out)
    })
}

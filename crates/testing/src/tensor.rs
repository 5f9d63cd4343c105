//! Test support over tensors: uploading and reading back, random inputs rounded to the element
//! type under test, float64 references, per-type tolerances ([`Float`]) and integer reference
//! arithmetic ([`Int`], written with the standard library's operations, independently of the
//! crate under test).
//!
//! Random inputs are rounded to the element type before the reference is computed from them, so
//! the reference holds the exact result of the operation on what the kernel actually read.

use cuflow_device_op::{DeviceOp, DeviceOpExt};
use cuflow_runtime::{DeviceError, Stream};
use cuflow_tensor::{api, bf16, f16, DType, FloatDType, Tensor};
use rand::rngs::StdRng;
use rand::Rng;

use crate::measure::assert_close_elementwise;

/// The number of elements of `shape`.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A tensor of `shape` holding `data`, on `stream`'s device.
pub fn upload<T: DType>(stream: &Stream, data: &[T], shape: &[usize]) -> Tensor<T> {
    api::from_slice(data, shape)
        .sync_on(stream)
        .expect("upload a test tensor")
}

/// The elements of `t`, after all work that used it.
pub fn read<T: DType>(t: &Tensor<T>) -> Vec<T> {
    t.to_host_vec().expect("read a test tensor back")
}

/// Runs `op` on `stream` and reads its tensor back.
pub fn eval<T: DType>(
    stream: &Stream,
    op: impl DeviceOp<Output = Tensor<T>>,
) -> Result<Vec<T>, DeviceError> {
    let out = op.sync_on(stream)?;
    out.to_host_vec()
}

/// Runs `op` on `stream`, checks its output's shape, and reads it back.
pub fn make<T: DType>(
    stream: &Stream,
    shape: &[usize],
    op: impl DeviceOp<Output = Tensor<T>>,
) -> Result<Vec<T>, DeviceError> {
    let t = op.sync_on(stream)?;
    assert_eq!(t.shape(), shape, "shape");
    assert_eq!(t.len(), numel(shape), "element count");
    assert_eq!(t.device(), stream.device(), "device");
    t.to_host_vec()
}

/// `n` values uniform in `[-1, 1)`, rounded to `T`.
pub fn random<T: DType>(rng: &mut StdRng, n: usize) -> Vec<T> {
    uniform(rng, n, -1.0, 1.0)
}

/// `n` values uniform in `[lo, hi)`, rounded to `T`.
pub fn uniform<T: DType>(rng: &mut StdRng, n: usize, lo: f64, hi: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.gen_range(lo..hi))).collect()
}

/// `n` values of magnitude uniform in `[lo, hi)` (with `0 < lo`) and a random sign, rounded
/// to `T`: factors and denominators kept away from zero.
pub fn signed<T: DType>(rng: &mut StdRng, n: usize, lo: f64, hi: f64) -> Vec<T> {
    (0..n)
        .map(|_| {
            let m = rng.gen_range(lo..hi);
            T::from_f64(if rng.gen::<bool>() { m } else { -m })
        })
        .collect()
}

/// `n` values drawn from 0, 1, 2 and 3: few distinct values, so that comparisons meet equal
/// pairs.
pub fn few_values<T: DType>(rng: &mut StdRng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| T::from_f64(rng.gen_range(0..4) as f64))
        .collect()
}

/// The values of `v` as `f64`.
pub fn f64s<T: DType>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// `f(x[i])` for every element.
pub fn map_ref<T: DType>(x: &[T], f: impl Fn(f64) -> f64) -> Vec<f64> {
    x.iter().map(|a| f(a.to_f64())).collect()
}

/// `f(x[i], y[i])` for every element.
pub fn zip_ref<T: DType>(x: &[T], y: &[T], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    assert_eq!(x.len(), y.len());
    x.iter()
        .zip(y)
        .map(|(a, b)| f(a.to_f64(), b.to_f64()))
        .collect()
}

/// `f(x[i], row[i % row.len()])`: `row` broadcast over the rows of `x`.
pub fn row_ref<T: DType>(x: &[T], row: &[T], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    x.iter()
        .enumerate()
        .map(|(i, a)| f(a.to_f64(), row[i % row.len()].to_f64()))
        .collect()
}

/// A floating-point element type with the tolerances its kernels are held to.
pub trait Float: FloatDType + Into<f64> + std::fmt::Debug {
    /// Relative tolerance of `+ - * /` and saxpy.
    const ARITH_TOL: f64;
    /// Relative tolerance of `exp`, `tanh` and `silu`.
    const TRANS_TOL: f64;
    /// Relative tolerance of `gelu`.
    const GELU_TOL: f64;
    /// The smallest positive normal value.
    const MIN_NORMAL: f64;
}

impl Float for f32 {
    const ARITH_TOL: f64 = 1e-6;
    const TRANS_TOL: f64 = 1e-5;
    const GELU_TOL: f64 = 1e-5;
    const MIN_NORMAL: f64 = f32::MIN_POSITIVE as f64;
}

impl Float for f64 {
    const ARITH_TOL: f64 = 1e-12;
    const TRANS_TOL: f64 = 1e-12;
    // The host backend's erf is a Chebyshev fit with a fractional error below 1.2e-7.
    const GELU_TOL: f64 = 1e-6;
    const MIN_NORMAL: f64 = f64::MIN_POSITIVE;
}

impl Float for f16 {
    const ARITH_TOL: f64 = 1e-3;
    const TRANS_TOL: f64 = 1e-3;
    const GELU_TOL: f64 = 1e-3;
    // 2^-14.
    const MIN_NORMAL: f64 = 6.103_515_625e-5;
}

impl Float for bf16 {
    const ARITH_TOL: f64 = 8e-3;
    const TRANS_TOL: f64 = 8e-3;
    const GELU_TOL: f64 = 8e-3;
    const MIN_NORMAL: f64 = f32::MIN_POSITIVE as f64;
}

/// Asserts that `got` matches the `f64` reference `want` elementwise within relative error
/// `tol` ([`assert_close_elementwise`]), with the floor at `T`'s smallest normal value: a
/// result in the subnormal range is judged by its absolute error (half a subnormal step at
/// most for a correct rounding).
#[track_caller]
pub fn assert_dtype_close<T: Float>(got: &[T], want: &[f64], tol: f64, what: &str) {
    assert_close_elementwise(
        &format!("{what} ({})", T::NAME),
        got,
        want,
        T::MIN_NORMAL,
        tol,
    );
}

/// Asserts that `got` equals `want` element by element.
#[track_caller]
pub fn assert_exact<T: DType>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what} ({}): length", T::NAME);
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what} ({}): element {i} of {} is {:?}, expected {:?}",
            T::NAME,
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// An integer element type with its reference arithmetic.
pub trait Int: DType {
    /// A random value of the whole range (without the minimum of a signed type, whose
    /// quotient by -1 overflows).
    fn random(rng: &mut StdRng) -> Self;
    /// Wrapping `self + rhs`.
    fn ref_add(self, rhs: Self) -> Self;
    /// Wrapping `self - rhs`.
    fn ref_sub(self, rhs: Self) -> Self;
    /// Wrapping `self * rhs`.
    fn ref_mul(self, rhs: Self) -> Self;
    /// `self / rhs` truncated toward zero, 0 for a zero divisor, `MIN / -1` wrapped to `MIN`.
    fn ref_div(self, rhs: Self) -> Self;
    /// Zero.
    const ZERO: Self;
}

macro_rules! int {
    ($t:ty, $lo:expr) => {
        impl Int for $t {
            fn random(rng: &mut StdRng) -> Self {
                rng.gen_range($lo..=<$t>::MAX)
            }
            fn ref_add(self, rhs: Self) -> Self {
                self.wrapping_add(rhs)
            }
            fn ref_sub(self, rhs: Self) -> Self {
                self.wrapping_sub(rhs)
            }
            fn ref_mul(self, rhs: Self) -> Self {
                self.wrapping_mul(rhs)
            }
            fn ref_div(self, rhs: Self) -> Self {
                if rhs == 0 {
                    0
                } else {
                    self.wrapping_div(rhs)
                }
            }
            const ZERO: Self = 0;
        }
    };
}

int!(i32, i32::MIN + 1);
int!(i64, i64::MIN + 1);
int!(u32, 0);
int!(u8, 0);

/// `n` random integers of the whole range.
pub fn ints<T: Int>(rng: &mut StdRng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::random(rng)).collect()
}

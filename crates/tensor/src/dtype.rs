//! Element types of tensors and how kernels see them.

use std::fmt;

use cuflow_runtime::DeviceCopy;
use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
}

/// An element type of [`Tensor`](crate::Tensor): `f32`, `f64`, `f16`, `bf16`, `i32`, `u32`,
/// `i64`, `u8`. Sealed: kernels are generated for exactly these.
///
/// Kernels compute floating-point types in `float` (`f16`, `bf16`, `f32`) or `double`
/// (`f64`), rounding once on store, and integers in their own type with wrapping arithmetic.
pub trait DType:
    DeviceCopy + Copy + PartialEq + PartialOrd + Default + fmt::Debug + sealed::Sealed
{
    /// The short name used in kernel names and errors (`"f32"`, `"bf16"`, ...).
    const NAME: &'static str;
    /// Whether this is a floating-point type.
    const IS_FLOAT: bool;
    /// The CUDA C storage type.
    #[doc(hidden)]
    const CUDA_STORAGE: &'static str;
    /// The CUDA C type kernels compute in.
    #[doc(hidden)]
    const CUDA_ACC: &'static str;
    /// The CUDA C body converting storage `x` to the compute type.
    #[doc(hidden)]
    const CUDA_LD: &'static str;
    /// The CUDA C body converting compute-type `x` to storage, rounding once.
    #[doc(hidden)]
    const CUDA_ST: &'static str;

    /// The value as `f64` (exact for every type but `i64`/`u64` beyond 2^53).
    fn to_f64(self) -> f64;
    /// The nearest value of this type (saturating for integers; NaN becomes 0).
    fn from_f64(v: f64) -> Self;
    /// `self + rhs` as kernels compute it.
    fn add(self, rhs: Self) -> Self;
    /// `self - rhs` as kernels compute it.
    fn sub(self, rhs: Self) -> Self;
    /// `self * rhs` as kernels compute it.
    fn mul(self, rhs: Self) -> Self;
    /// `self / rhs` as kernels compute it (integer division by zero gives zero).
    fn div(self, rhs: Self) -> Self;
    /// `self * a + b` as CUDA computes `s * a + o` in the compute type: fused, rounded once
    /// to it, for floats (in `float` for `f16`/`bf16`, then rounded again on store); wrapping
    /// for integers.
    #[doc(hidden)]
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// The value of an integer type, exactly; `None` for floating-point types.
    #[doc(hidden)]
    fn to_i128(self) -> Option<i128>;
    /// The integer `v` converted as the kernels convert it: integer types wrap (keep the low
    /// bits), floating-point types round to nearest once (`f16` through `float`, which holds
    /// every integer in its range exactly).
    #[doc(hidden)]
    fn from_i128(v: i128) -> Self;
}

macro_rules! float_dtype {
    ($t:ty, $name:literal, $storage:literal, $acc:literal, $ld:literal, $st:literal, |$x:ident| $to:expr, |$v:ident| $from:expr, |$i:ident| $from_int:expr, |$s:ident, $a:ident, $b:ident| $fma:expr) => {
        impl sealed::Sealed for $t {}
        impl DType for $t {
            const NAME: &'static str = $name;
            const IS_FLOAT: bool = true;
            const CUDA_STORAGE: &'static str = $storage;
            const CUDA_ACC: &'static str = $acc;
            const CUDA_LD: &'static str = $ld;
            const CUDA_ST: &'static str = $st;
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            fn from_f64($v: f64) -> Self {
                $from
            }
            fn add(self, rhs: Self) -> Self {
                Self::from_f64(self.to_f64() + rhs.to_f64())
            }
            fn sub(self, rhs: Self) -> Self {
                Self::from_f64(self.to_f64() - rhs.to_f64())
            }
            fn mul(self, rhs: Self) -> Self {
                Self::from_f64(self.to_f64() * rhs.to_f64())
            }
            fn div(self, rhs: Self) -> Self {
                Self::from_f64(self.to_f64() / rhs.to_f64())
            }
            fn mul_add(self, $a: Self, $b: Self) -> Self {
                let $s = self;
                $fma
            }
            fn to_i128(self) -> Option<i128> {
                None
            }
            fn from_i128($i: i128) -> Self {
                $from_int
            }
        }
    };
}

float_dtype!(
    f32,
    "f32",
    "float",
    "float",
    "return x;",
    "return x;",
    |x| x as f64,
    |v| v as f32,
    |i| i as f32,
    |s, a, b| s.mul_add(a, b)
);
float_dtype!(
    f64,
    "f64",
    "double",
    "double",
    "return x;",
    "return x;",
    |x| x,
    |v| v,
    |i| i as f64,
    |s, a, b| s.mul_add(a, b)
);
float_dtype!(
    f16,
    "f16",
    "unsigned short",
    "float",
    "float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(x)); return f;",
    "unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x)); return h;",
    |x| x.to_f64(),
    |v| f16::from_f32(f32_round_to_odd(v)),
    |i| f16::from_f32(i as f32),
    |s, a, b| f16::from_f32(s.to_f32().mul_add(a.to_f32(), b.to_f32()))
);
float_dtype!(
    bf16,
    "bf16",
    "unsigned short",
    "float",
    "return __uint_as_float(((unsigned)x) << 16);",
    "unsigned u = __float_as_uint(x); \
     if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0; \
     return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);",
    |x| x.to_f64(),
    |v| bf16::from_f32(f32_round_to_odd(v)),
    |i| bf16_from_int(i),
    |s, a, b| bf16::from_f32(s.to_f32().mul_add(a.to_f32(), b.to_f32()))
);

/// `v` as `f32` rounded to odd: toward zero, with the lowest significand bit set where that
/// dropped anything (NaN and infinities are kept, beyond `f32`'s range is its largest value).
/// `f32` keeps more than two bits beyond `f16` and `bf16` (also among subnormals, where its
/// step is finer), so rounding the result to nearest gives the half type nearest to `v`: one
/// correct rounding, where rounding to nearest twice may land on a midpoint and tie the wrong
/// way. (`half`'s own `from_f64` drops the low 32 bits of the `f64` first, and with them the
/// bits that break such ties.) The CUDA C of [`cuda_from_double`] does the same.
fn f32_round_to_odd(v: f64) -> f32 {
    let nearest = v as f32;
    if v.is_nan() || f64::from(nearest) == v {
        return nearest;
    }
    // Inexact: step back toward zero if rounding went away from it (an infinity steps back to
    // the largest finite value), then mark the dropped bits in the lowest bit.
    let bits = nearest.to_bits();
    let toward_zero = if f64::from(nearest).abs() > v.abs() {
        bits - 1
    } else {
        bits
    };
    f32::from_bits(toward_zero | 1)
}

/// Whether `T` is stored narrower than the `float` its kernels compute in (`f16`, `bf16`), so
/// that its `st` rounds a `float` a second time.
pub(crate) fn stores_float_rounded<T: DType>() -> bool {
    T::IS_FLOAT && T::CUDA_ACC == "float" && T::CUDA_STORAGE != "float"
}

/// CUDA C of `from_double_<T>(double)`: the compute-type value (`A_<T>`) that `st_<T>` rounds
/// to the `T` the host's [`DType::from_f64`] gives for the `double`, rounding once. `(A)v`
/// for `f32` and `f64`; for `f16` and `bf16`, whose `st` rounds a `float`, the `float` rounded
/// to odd as the host does: `(float)v` would round to nearest first, and the second rounding
/// could then tie the wrong way. For integers the value truncated toward zero and saturated
/// at the type's bounds, NaN giving 0 (as Rust's `as`): C leaves the conversion of a value
/// out of the type's range undefined, so the bounds are checked first. Needs
/// [`cuda_defs`]`::<T>()` before it.
pub(crate) fn cuda_from_double<T: DType>() -> String {
    let n = T::NAME;
    let body = if stores_float_rounded::<T>() {
        "float f = __double2float_rz(v); \
         if (f == f && (double)f != v) f = __uint_as_float(__float_as_uint(f) | 1u); \
         return f;"
            .to_string()
    } else if T::IS_FLOAT {
        format!("return (A_{n})v;")
    } else {
        let (min, max) = (T::from_f64(f64::NEG_INFINITY), T::from_f64(f64::INFINITY));
        let min_literal = if min.to_f64() == 0.0 {
            "0".to_string()
        } else {
            format!("(-{max:?}LL - 1)")
        };
        format!(
            "if (v != v) return (A_{n})0; \
             if (v <= {min_f:?}) return (A_{n}){min_literal}; \
             if (v >= {max_f:?}) return (A_{n}){max:?}ULL; \
             return (A_{n})v;",
            min_f = min.to_f64(),
            max_f = max.to_f64(),
        )
    };
    format!("__device__ __forceinline__ A_{n} from_double_{n}(double v) {{ {body} }}\n")
}

/// The bf16 nearest to the integer `v` (ties to the even mantissa), rounded once: through
/// `f32` (or `f64`) it would round twice above 2^24. The same steps as the CUDA C of
/// [`BF16_FROM_INT_CUDA`], on the magnitude.
fn bf16_from_int(v: i128) -> bf16 {
    let sign: u16 = if v < 0 { 0x8000 } else { 0 };
    let m = v.unsigned_abs();
    if m == 0 {
        return bf16::from_bits(sign);
    }
    // The leading bit, and the 8 significant bits a bf16 keeps (with its hidden bit).
    let mut lead = 127 - m.leading_zeros();
    let mut man = if lead > 7 {
        let shift = lead - 7;
        let kept = m >> shift;
        let rest = m & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        if rest > half || (rest == half && kept & 1 == 1) {
            kept + 1
        } else {
            kept
        }
    } else {
        m << (7 - lead)
    };
    if man == 256 {
        man = 128;
        lead += 1;
    }
    // `lead` is at most 128 (an i128's magnitude rounded up), below bf16's largest exponent.
    let exponent = (lead + 127) as u16;
    bf16::from_bits(sign | (exponent << 7) | (man as u16 & 0x7f))
}

/// CUDA C of `bf16_from_int_ll(long long)`: [`bf16_from_int`] for the integers a kernel holds.
pub(crate) const BF16_FROM_INT_CUDA: &str = r#"
__device__ __forceinline__ unsigned short bf16_from_int_ll(long long v) {
  unsigned short sign = v < 0 ? (unsigned short)0x8000 : (unsigned short)0;
  unsigned long long m = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
  if (m == 0ull) return sign;
  int lead = 63 - __clzll((long long)m);
  unsigned long long man;
  if (lead > 7) {
    int shift = lead - 7;
    unsigned long long kept = m >> shift;
    unsigned long long rest = m & ((1ull << shift) - 1ull);
    unsigned long long half = 1ull << (shift - 1);
    man = (rest > half || (rest == half && (kept & 1ull))) ? kept + 1ull : kept;
  } else {
    man = m << (7 - lead);
  }
  if (man == 256ull) { man = 128ull; lead += 1; }
  return (unsigned short)(sign | (unsigned short)((lead + 127) << 7) | (unsigned short)(man & 0x7full));
}
"#;

macro_rules! int_dtype {
    ($t:ty, $name:literal, $ctype:literal) => {
        impl sealed::Sealed for $t {}
        impl DType for $t {
            const NAME: &'static str = $name;
            const IS_FLOAT: bool = false;
            const CUDA_STORAGE: &'static str = $ctype;
            const CUDA_ACC: &'static str = $ctype;
            const CUDA_LD: &'static str = "return x;";
            const CUDA_ST: &'static str = "return x;";
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn add(self, rhs: Self) -> Self {
                self.wrapping_add(rhs)
            }
            fn sub(self, rhs: Self) -> Self {
                self.wrapping_sub(rhs)
            }
            fn mul(self, rhs: Self) -> Self {
                self.wrapping_mul(rhs)
            }
            fn div(self, rhs: Self) -> Self {
                if rhs == 0 {
                    0
                } else {
                    self.wrapping_div(rhs)
                }
            }
            fn mul_add(self, a: Self, b: Self) -> Self {
                self.wrapping_mul(a).wrapping_add(b)
            }
            fn to_i128(self) -> Option<i128> {
                Some(i128::from(self))
            }
            fn from_i128(v: i128) -> Self {
                v as $t
            }
        }
    };
}

int_dtype!(i32, "i32", "int");
int_dtype!(u32, "u32", "unsigned int");
int_dtype!(i64, "i64", "long long");
int_dtype!(u8, "u8", "unsigned char");

/// The CUDA C definitions of `T`'s types and conversions, suffixed with its name:
/// `T_f32`, `A_f32`, `ld_f32`, `st_f32`.
pub(crate) fn cuda_defs<T: DType>() -> String {
    let n = T::NAME;
    format!(
        "typedef {s} T_{n}; typedef {a} A_{n};\n\
         __device__ __forceinline__ A_{n} ld_{n}(T_{n} x) {{ {ld} }}\n\
         __device__ __forceinline__ T_{n} st_{n}(A_{n} x) {{ {st} }}\n",
        s = T::CUDA_STORAGE,
        a = T::CUDA_ACC,
        ld = T::CUDA_LD,
        st = T::CUDA_ST,
    )
}

/// [`cuda_defs`] plus the unsuffixed names `T`, `A`, `ld`, `st` for one-type kernels.
pub(crate) fn cuda_prelude<T: DType>() -> String {
    let n = T::NAME;
    format!(
        "{}typedef T_{n} T; typedef A_{n} A;\n#define ld ld_{n}\n#define st st_{n}\n",
        cuda_defs::<T>()
    )
}

/// The floating-point element types (`f32`, `f64`, `f16`, `bf16`), which transcendental
/// kernels (`exp`, `gelu`, `softmax`, ...) accept.
pub trait FloatDType: DType {}

impl FloatDType for f32 {}
impl FloatDType for f64 {}
impl FloatDType for f16 {}
impl FloatDType for bf16 {}

#[cfg(test)]
mod tests {
    use super::cuda_from_double;

    /// The integer conversions check the type's bounds (and NaN) before the C conversion,
    /// which is undefined outside them.
    #[test]
    fn integer_conversions_from_double_saturate_before_converting() {
        assert_eq!(
            cuda_from_double::<u8>(),
            "__device__ __forceinline__ A_u8 from_double_u8(double v) { \
             if (v != v) return (A_u8)0; if (v <= 0.0) return (A_u8)0; \
             if (v >= 255.0) return (A_u8)255ULL; return (A_u8)v; }\n"
        );
        assert_eq!(
            cuda_from_double::<i64>(),
            "__device__ __forceinline__ A_i64 from_double_i64(double v) { \
             if (v != v) return (A_i64)0; \
             if (v <= -9.223372036854776e18) return (A_i64)(-9223372036854775807LL - 1); \
             if (v >= 9.223372036854776e18) return (A_i64)9223372036854775807ULL; \
             return (A_i64)v; }\n"
        );
        assert!(cuda_from_double::<f32>().contains("return (A_f32)v;"));
    }
}

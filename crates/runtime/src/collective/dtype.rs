//! The element types and reductions collectives support.

use crate::memory::DeviceCopy;

/// How an all-reduce or reduce-scatter combines the ranks' values, element by element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// The sum.
    #[default]
    Sum,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
    /// The mean: the sum divided by the world size (integers divide truncating toward zero).
    Avg,
}

/// The element types of collectives, as the backends name them (NCCL's `ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CollectiveDtype {
    /// `u8`.
    U8,
    /// `i32`.
    I32,
    /// `u32`.
    U32,
    /// `i64`.
    I64,
    /// `half::f16`.
    F16,
    /// `half::bf16`.
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl CollectiveDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            CollectiveDtype::U8 => 1,
            CollectiveDtype::F16 | CollectiveDtype::BF16 => 2,
            CollectiveDtype::I32 | CollectiveDtype::U32 | CollectiveDtype::F32 => 4,
            CollectiveDtype::I64 | CollectiveDtype::F64 => 8,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Element types collectives move and reduce: `u8`, `i32`, `u32`, `i64`, `half::f16`,
/// `half::bf16`, `f32` and `f64`. Sealed.
pub trait CollectiveElem: DeviceCopy + sealed::Sealed {
    /// The type's tag.
    const DTYPE: CollectiveDtype;
}

macro_rules! elem {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl CollectiveElem for $t {
            const DTYPE: CollectiveDtype = CollectiveDtype::$d;
        }
    )*};
}

elem!(
    u8 => U8,
    i32 => I32,
    u32 => U32,
    i64 => I64,
    half::f16 => F16,
    half::bf16 => BF16,
    f32 => F32,
    f64 => F64,
);

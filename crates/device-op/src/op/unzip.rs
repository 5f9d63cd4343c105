//! `unzip`: split an op yielding a tuple into one op per element (`shared` + `map`).

use std::sync::Arc;

use super::map::Map;
use super::shared::Shared;
use super::{DeviceOp, DeviceOpExt};

/// The two ops from unzipping a pair.
pub type Unzip2<O, A, B> = (
    Map<Shared<O>, fn(Arc<(A, B)>) -> A>,
    Map<Shared<O>, fn(Arc<(A, B)>) -> B>,
);

/// The three ops from unzipping a triple.
pub type Unzip3<O, A, B, C> = (
    Map<Shared<O>, fn(Arc<(A, B, C)>) -> A>,
    Map<Shared<O>, fn(Arc<(A, B, C)>) -> B>,
    Map<Shared<O>, fn(Arc<(A, B, C)>) -> C>,
);

/// Splits an op whose output is a tuple into one op per element. The original op runs once,
/// when the first part executes; each part yields a clone of its element.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::{value, zip, DeviceOpExt, UnzipExt};
/// let (a, b) = value((1, String::from("b"))).unzip();
/// assert_eq!(zip!(b, a).sync()?, (String::from("b"), 1));
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub trait UnzipExt<T> {
    /// One op per tuple element.
    type Parts;
    /// Splits the op.
    fn unzip(self) -> Self::Parts;
}

impl<O, A, B> UnzipExt<(A, B)> for O
where
    O: DeviceOp<Output = (A, B)>,
    A: Clone + Send + Sync,
    B: Clone + Send + Sync,
{
    type Parts = Unzip2<O, A, B>;

    fn unzip(self) -> Self::Parts {
        fn first<A: Clone, B>(p: Arc<(A, B)>) -> A {
            p.0.clone()
        }
        fn second<A, B: Clone>(p: Arc<(A, B)>) -> B {
            p.1.clone()
        }
        let s = self.shared();
        (
            s.clone().map(first as fn(Arc<(A, B)>) -> A),
            s.map(second as fn(Arc<(A, B)>) -> B),
        )
    }
}

impl<O, A, B, C> UnzipExt<(A, B, C)> for O
where
    O: DeviceOp<Output = (A, B, C)>,
    A: Clone + Send + Sync,
    B: Clone + Send + Sync,
    C: Clone + Send + Sync,
{
    type Parts = Unzip3<O, A, B, C>;

    fn unzip(self) -> Self::Parts {
        fn first<A: Clone, B, C>(p: Arc<(A, B, C)>) -> A {
            p.0.clone()
        }
        fn second<A, B: Clone, C>(p: Arc<(A, B, C)>) -> B {
            p.1.clone()
        }
        fn third<A, B, C: Clone>(p: Arc<(A, B, C)>) -> C {
            p.2.clone()
        }
        let s = self.shared();
        (
            s.clone().map(first as fn(Arc<(A, B, C)>) -> A),
            s.clone().map(second as fn(Arc<(A, B, C)>) -> B),
            s.map(third as fn(Arc<(A, B, C)>) -> C),
        )
    }
}

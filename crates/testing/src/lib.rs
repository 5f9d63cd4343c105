//! cuflow's test support: what the test suites of several crates share, in one place.
//!
//! - [`device`]: the device under test, from `Device::auto()` (the host backend where no GPU is
//!   present, CUDA under `CUFLOW_DEVICE=cuda`), and the devices of multi-device tests, checked
//!   against `CUFLOW_MIN_DEVICES`. A test that must reach a GPU and cannot fails; only a test
//!   that needs more devices than are visible, and is not required to have them, skips.
//! - [`rng`]: random data from a printed seed (replayed with `CUFLOW_TEST_SEED`) or a fixed
//!   one.
//! - [`measure`]: comparison with a float64 reference, by relative error in the 2-norm or by the
//!   largest elementwise relative error.
//! - [`kernels`]: small kernels used by several test files, each with CUDA C source and a host
//!   implementation over the same arguments, compiled once per process.
//! - [`ops`]: test ops made with `from_fn` over those kernels, on shared `f32` buffers, and
//!   [`ops::Gate`], a stream held back until the test lets it go.
//! - `tensor` (feature `tensor`): tolerances per element type, integer reference arithmetic,
//!   and uploading and reading back tensors.
//! - `model` (feature `model`): the small decoder-only transformer of the `04_inference_loop`
//!   example, shared by the example, its test and the benchmark program.
//! - [`dags`]: random DAGs of those ops, each with a model of its value.
//! - [`policies`]: scheduling policies that misbehave on purpose ([`policies::Panicking`]).
//! - [`thread`]: running test code on a thread with a small stack.
//! - [`test_cases!`]: one `#[test]` per line, for tests that differ only in their arguments or
//!   type parameters.
//!
//! This crate is a dev-dependency of the integration tests and examples (and a dependency of
//! the benchmark program, which is no library); no library depends on it, and no unit test
//! inside a crate's `src/` uses it. Its one `unsafe` use is the private
//! `kernels::reviewed_kernel`, which constructs the kernels above from CUDA C written in this
//! crate.

#![deny(unsafe_code)]

/// The error type of the tests that [`test_cases!`] writes.
pub use cuflow_runtime::DeviceError;

pub mod dags;
pub mod device;
pub mod kernels;
pub mod measure;
#[cfg(feature = "model")]
pub mod model;
pub mod ops;
pub mod policies;
pub mod rng;
#[cfg(feature = "tensor")]
pub mod tensor;
pub mod thread;

/// A byte pattern written over outputs before a test, so that an element that was not written
/// shows (as `0xABABABAB` integers, or a tiny negative float).
pub const POISON: u8 = 0xAB;

/// The `u32` made of four [`POISON`] bytes.
pub const POISON_U32: u32 = 0xABAB_ABAB;

/// Element counts that are not multiples of any block or word size.
pub const ODD_SIZES: [usize; 5] = [1, 7, 1000, 4097, (1 << 20) + 3];

/// One `#[test]` per case: `name => expression` becomes a test function `name` returning
/// `Result<(), DeviceError>` from the expression. Attributes and doc comments before a case go
/// on its function. For tests that differ only in their arguments or type parameters, so that
/// each case stays one line and keeps its own name in the test list.
///
/// ```
/// use cuflow_testing::{test_cases, DeviceError};
///
/// fn sums_to(n: u32, want: u32) -> Result<(), DeviceError> {
///     assert_eq!((1..=n).sum::<u32>(), want);
///     Ok(())
/// }
///
/// test_cases! {
///     /// The first triangular numbers.
///     sum_to_three => sums_to(3, 6),
///     sum_to_four => sums_to(4, 10),
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! test_cases {
    ($($(#[$attr:meta])* $name:ident => $body:expr),* $(,)?) => {$(
        $(#[$attr])*
        #[test]
        fn $name() -> ::std::result::Result<(), $crate::DeviceError> {
            $body
        }
    )*};
}

//! Comparison of a result with a float64 reference, by relative error. Two measures, for two
//! kinds of check:
//!
//! - [`rel_err_in_norm`] / [`assert_close_in_norm`]: `‖got - want‖₂ / ‖want‖₂`, the error of the
//!   result as a whole. Right for sums and products (GEMM, reductions), where single elements
//!   near zero carry large relative errors that say nothing about the kernel.
//! - [`max_rel_err`] / [`assert_close_elementwise`]: the largest `|got - want| / max(|want|,
//!   floor)` over the elements, and where it is: every element must be right on its own. The
//!   floor judges elements near zero by their absolute error.
//!
//! A NaN in the result fails both.

use std::fmt::Debug;

/// Relative error of `got` against the reference `want`, in the 2-norm. NaN in `got` gives NaN,
/// which fails every `<=` check. Panics when the lengths differ.
pub fn rel_err_in_norm<T: Copy + Into<f64>>(got: &[T], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| ((*g).into() - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Asserts that `got` matches `want` within relative error `tol` in the 2-norm
/// ([`rel_err_in_norm`]).
#[track_caller]
pub fn assert_close_in_norm<T: Copy + Into<f64> + Debug>(
    what: &str,
    got: &[T],
    want: &[f64],
    tol: f64,
) {
    let err = rel_err_in_norm(got, want);
    assert!(
        err <= tol,
        "{what}: relative error {err:e} exceeds {tol:e} (first elements: got {:?}, want {:?})",
        &got[..got.len().min(4)],
        &want[..want.len().min(4)]
    );
}

/// Asserts that `got` matches `want` within `tol` times the 2-norm of `magnitude`, the sizes of
/// the terms each element sums (`|a·x| + |y|` for `a·x + y`). Rounding errs relative to the
/// terms, not to their sum: where they cancel, the sum is small and its relative error large
/// (one element of `x·s + b` near 0 is wrong by 1e-6 of itself after two roundings), so a
/// check relative to `want` fails on correct results for some random inputs.
#[track_caller]
pub fn assert_close_to_magnitude<T: Copy + Into<f64> + Debug>(
    what: &str,
    got: &[T],
    want: &[f64],
    magnitude: &[f64],
    tol: f64,
) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| ((*g).into() - w).powi(2))
        .sum::<f64>()
        .sqrt();
    let scale = magnitude.iter().map(|m| m * m).sum::<f64>().sqrt();
    let rel = if err == 0.0 {
        0.0
    } else {
        err / scale.max(f64::MIN_POSITIVE)
    };
    assert!(
        rel <= tol,
        "{what}: error {err:e} is {rel:e} of the terms' size, above {tol:e} (first elements: got \
         {:?}, want {:?})",
        &got[..got.len().min(4)],
        &want[..want.len().min(4)]
    );
}

/// The largest elementwise relative error `|got - want| / max(|want|, floor)`, and the element
/// where it is. An element equal to its reference has no error (infinities included); a NaN
/// counts as an infinite error. Panics when the lengths differ.
pub fn max_rel_err<T: Copy + Into<f64>>(got: &[T], want: &[f64], floor: f64) -> (f64, usize) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g: f64 = (*g).into();
        let err = if g == *w {
            0.0
        } else {
            (g - w).abs() / w.abs().max(floor)
        };
        let err = if err.is_nan() { f64::INFINITY } else { err };
        if err > worst.0 {
            worst = (err, i);
        }
    }
    worst
}

/// Asserts that every element of `got` matches `want` within relative error `tol`, relative to
/// `max(|want|, floor)` ([`max_rel_err`]).
#[track_caller]
pub fn assert_close_elementwise<T: Copy + Into<f64> + Debug>(
    what: &str,
    got: &[T],
    want: &[f64],
    floor: f64,
    tol: f64,
) {
    let (err, i) = max_rel_err(got, want, floor);
    assert!(
        err <= tol,
        "{what}: relative error {err:.3e} at element {i} of {} (got {:?}, expected {}) exceeds \
         {tol:e}",
        got.len(),
        got[i],
        want[i],
    );
}

//! Random test data, reproducible: a test draws from a fixed seed, or from a fresh one that it
//! prints so that a failure can be replayed with `CUFLOW_TEST_SEED=<seed>`.
//!
//! Inputs are random, never zeros only: a kernel that writes nothing, or reads the wrong
//! element, then gives a wrong value.

use rand::distributions::{Distribution, Standard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A fresh seed (or `$CUFLOW_TEST_SEED`), printed with the way to replay it.
pub fn fresh_seed() -> u64 {
    let seed = std::env::var("CUFLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("random seed: {seed} (replay with CUFLOW_TEST_SEED={seed})");
    seed
}

/// A random generator from a [`fresh_seed`].
pub fn rng() -> StdRng {
    seeded_rng(fresh_seed())
}

/// A random generator from `seed`: the same values on every run.
pub fn seeded_rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// How many times more random cases a test runs than it does by default: the number in the
/// environment variable `var` (the random tests name theirs, `CUFLOW_RANDOM_PROGRAMS` and the
/// like), 1 when it is unset. Panics, naming the variable, when it is not a number.
///
/// # Examples
///
/// ```
/// let programs = 100 * cuflow_testing::rng::scale_from_env("CUFLOW_NO_SUCH_VARIABLE");
/// assert_eq!(programs, 100);
/// ```
pub fn scale_from_env(var: &str) -> usize {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var} must be a number, not {v:?}"))
        })
        .unwrap_or(1)
}

/// `n` random values over the whole range of `T` (floats: `[0, 1)`).
pub fn random_vec<T>(rng: &mut StdRng, n: usize) -> Vec<T>
where
    Standard: Distribution<T>,
{
    (0..n).map(|_| rng.gen()).collect()
}

/// `n` random floats in `[-1, 1)`.
pub fn random_f32(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

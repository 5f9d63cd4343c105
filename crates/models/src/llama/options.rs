//! How tokens are chosen and how long a sequence a decoder holds.

use cuflow_runtime::DeviceError;
use cuflow_tensor::kernels::decode::SampleParams;

/// Options of a generation: greedy or sampled (temperature, top-k, top-p, seed), and the
/// positions the key/value caches hold.
///
/// # Examples
///
/// ```
/// use cuflow_models::llama::GenerateOptions;
/// let greedy = GenerateOptions::greedy().max_seq(2048);
/// assert!(greedy.is_greedy());
/// let sampled = GenerateOptions::sampled(0.8).top_k(40).top_p(0.95).seed(7);
/// assert!(!sampled.is_greedy());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GenerateOptions {
    pub(crate) sample: SampleParams,
    pub(crate) seed: u64,
    pub(crate) max_seq: Option<usize>,
}

impl GenerateOptions {
    /// Always the most likely token (ties to the lowest id).
    pub fn greedy() -> Self {
        GenerateOptions {
            sample: SampleParams::GREEDY,
            seed: 0,
            max_seq: None,
        }
    }

    /// Sampling from the softmax at `temperature` over the whole vocabulary (seed 0); narrow
    /// it with [`top_k`](Self::top_k) and [`top_p`](Self::top_p).
    pub fn sampled(temperature: f32) -> Self {
        GenerateOptions {
            sample: SampleParams {
                temperature,
                top_k: 0,
                top_p: 1.0,
            },
            seed: 0,
            max_seq: None,
        }
    }

    /// The softmax temperature (`0` or below is greedy, `+inf` uniform over the kept tokens;
    /// NaN is refused).
    pub fn temperature(mut self, t: f32) -> Self {
        self.sample.temperature = t;
        self
    }

    /// Keep only the `k` most likely tokens (`0`: all; `1`: greedy).
    pub fn top_k(mut self, k: u32) -> Self {
        self.sample.top_k = k;
        self
    }

    /// Then keep the smallest set of most likely tokens holding probability `p`, in `(0, 1]`.
    pub fn top_p(mut self, p: f32) -> Self {
        self.sample.top_p = p;
        self
    }

    /// The seed of the device's random generator; a generation with the same seed, prompt
    /// and options on the same device gives the same tokens.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Positions the key/value caches hold (at least 1): the prompt and the generated tokens
    /// must fit, and the caches in the device's memory beside the weights.
    /// Unset, a generation sizes its caches to fit exactly, and a capture to the model's
    /// `max_position_embeddings` capped at 4096.
    pub fn max_seq(mut self, n: usize) -> Self {
        self.max_seq = Some(n);
        self
    }

    /// Whether the options choose the argmax.
    pub fn is_greedy(&self) -> bool {
        self.sample.is_greedy()
    }

    /// Refuses options no decoder runs: a NaN temperature, a `top_p` outside `(0, 1]`, a
    /// `max_seq` of zero. Every constructor of a decoder checks them, so that the call given
    /// them fails, not a later `prefill`.
    pub(crate) fn check(&self) -> Result<(), DeviceError> {
        let SampleParams {
            temperature, top_p, ..
        } = self.sample;
        if temperature.is_nan() {
            return Err(DeviceError::usage(
                "GenerateOptions::temperature is NaN; use 0 (or below) for the argmax, or a \
                 positive temperature to sample",
            ));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(DeviceError::usage(format!(
                "GenerateOptions::top_p {top_p:?} must be in (0, 1] (1 keeps every token)"
            )));
        }
        if self.max_seq == Some(0) {
            return Err(DeviceError::usage(
                "GenerateOptions::max_seq 0 holds no position; max_seq must be positive, at \
                 least the prompt's tokens and the generated ones",
            ));
        }
        Ok(())
    }
}

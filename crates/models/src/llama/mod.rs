//! Llama 2 / Llama 3 decoder-only models: RMSNorm, rotary embeddings with `rope_theta` and
//! Llama 3 `rope_scaling`, grouped-query attention over a key/value cache, SwiGLU MLP, tied
//! or untied embeddings.
//!
//! - [`Llama::load`] reads a Hugging Face checkpoint folder (`config.json` +
//!   `*.safetensors`, `f32`/`f16`/`bf16`), [`Llama::synthetic`] makes seeded random weights
//!   of any [`LlamaConfig`]. Weights live on the device as `bf16`.
//! - [`Llama::load_tp`] and [`Llama::synthetic_tp`] make one rank's slice of either, split
//!   tensor-parallel (Megatron-style) over the ranks of a `Communicator`.
//! - [`Llama::generate`] runs eagerly: the prompt is prefilled with matrix products (one
//!   GEMM per projection over all prompt rows), then one decode step op per token.
//! - [`Llama::capture`] records the decode step once into a graph; [`LlamaStep::generate`]
//!   prefills and replays it once per token. The token, the position and the random
//!   generator's counter live on the device and the step advances them itself, so replays
//!   need no copy from the host; generated tokens collect in a device buffer read once at the
//!   end. Replayed ids equal eager ids: both run the same kernels in the same order.
//!
//! Invariants: every intermediate of a decode step lives in a workspace allocated once per
//! [`LlamaStep`] (the step allocates nothing, so it can be captured); a step writes the
//! key and value of its position before attention reads positions `0..=pos`, so a new
//! generation never reads what an earlier one left in the caches; a [`LlamaStep`]'s eager
//! and replayed paths share that state, and each call waits for its work before returning.
//!
//! ```
//! use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
//! use cuflow_runtime::Device;
//! # fn main() -> Result<(), cuflow_runtime::DeviceError> {
//! let device = Device::host();
//! let stream = device.new_stream()?;
//! let model = Llama::synthetic(&device, LlamaConfig::tiny(), 3)?;
//! let prompt = [5, 17, 42];
//! let eager = model.generate(&stream, &prompt, 8, &GenerateOptions::greedy())?;
//! let mut step = model.capture(&stream, GenerateOptions::greedy().max_seq(64))?;
//! assert_eq!(step.generate(&prompt, 8)?, eager);
//! # Ok(()) }
//! ```

mod checkpoint;
mod config;
mod config_json;
mod files;
mod loader;
mod model;
mod options;
mod step;
mod tensor_parallel;
pub mod testing;
mod weights;

pub use config::{LlamaConfig, RopeScaling};
pub use model::{Llama, LoadStats};
pub use options::GenerateOptions;
pub use step::LlamaStep;

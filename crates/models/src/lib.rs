//! Real models on cuflow's public API.
//!
//! [`llama`] runs the Llama 2 / Llama 3 family from Hugging Face checkpoints
//! (`config.json` + `*.safetensors`) or from synthetic weights: prefill with matrix products,
//! a batch-1 decode step built from the memory-bound kernels of
//! [`cuflow_tensor::kernels::decode`], greedy or sampled on the device, eagerly or replayed
//! as one captured graph per token.
//!
//! ```
//! use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
//! use cuflow_runtime::Device;
//! # fn main() -> Result<(), cuflow_runtime::DeviceError> {
//! let device = Device::host();
//! let stream = device.new_stream()?;
//! let model = Llama::synthetic(&device, LlamaConfig::tiny(), 1)?;
//! let ids = model.generate(&stream, &[1, 2, 3], 4, &GenerateOptions::greedy())?;
//! assert_eq!(ids.len(), 4);
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod llama;

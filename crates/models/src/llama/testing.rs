//! Writing checkpoints in the Hugging Face layout (`config.json` + `model.safetensors`), so
//! tests, examples and benchmarks exercise the real loader with weights they make
//! themselves.
//!
//! The synthetic tensors are the ones [`Llama::synthetic`](super::Llama::synthetic) uses for
//! the same config and seed, so a checkpoint written here loads into the same model.

use std::collections::HashMap;
use std::path::Path;

use cuflow_runtime::DeviceError;
use cuflow_tensor::f16;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::config::LlamaConfig;
use super::weights::{hf_tensors, synthetic_values};

/// The element type of a checkpoint tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDtype {
    /// `F32`.
    F32,
    /// `F16`.
    F16,
    /// `BF16`.
    Bf16,
    /// `I32`, which the loader refuses (for testing its errors).
    I32,
}

impl WeightDtype {
    pub(crate) fn safetensors(self) -> Dtype {
        match self {
            WeightDtype::F32 => Dtype::F32,
            WeightDtype::F16 => Dtype::F16,
            WeightDtype::Bf16 => Dtype::BF16,
            WeightDtype::I32 => Dtype::I32,
        }
    }
}

/// One tensor of a checkpoint: its name, dtype, shape and little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointTensor {
    /// The Hugging Face parameter name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// The element type of `data`.
    pub dtype: WeightDtype,
    /// The shape.
    pub shape: Vec<usize>,
    /// The elements, little-endian.
    pub data: Vec<u8>,
}

/// The synthetic weights of `cfg` and `seed`, stored as `dtype` (`bf16` values, converted;
/// `I32` stores each value's bits). Tensors are drawn on several threads (each from its own
/// generator, so the values do not depend on the threads): an 8B-shaped model has 16 GB of
/// them.
///
/// # Errors
///
/// [`DeviceError::Usage`] for a config [`LlamaConfig::validate`] refuses, or one with more
/// tensors than a checkpoint's header holds; [`DeviceError::OutOfMemory`] when the tensors
/// are larger than the host's memory (before any is made).
pub fn synthetic_tensors(
    cfg: &LlamaConfig,
    seed: u64,
    dtype: WeightDtype,
) -> Result<Vec<CheckpointTensor>, DeviceError> {
    cfg.validate()?;
    ensure_header_fits(cfg)?;
    let stored = cfg
        .bf16_weight_bytes()?
        .checked_div(2)
        .and_then(|n| n.checked_mul(dtype.safetensors().bitsize() / 8))
        .unwrap_or(usize::MAX);
    super::model::ensure_fits(&cuflow_runtime::Device::host(), 0, stored)?;
    let specs: Vec<(String, Vec<usize>)> = hf_tensors(cfg).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 16);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        let mut mine = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some((name, shape)) = specs.get(i) else {
                return mine;
            };
            mine.push((i, synthetic_tensor(name, shape, seed, dtype)));
        }
    };
    let mut made: Vec<(usize, CheckpointTensor)> = std::thread::scope(|s| {
        // Helpers where the system gives them; this thread works too, so a refused thread
        // only means fewer hands.
        let helpers: Vec<_> = (1..threads)
            .filter_map(|_| std::thread::Builder::new().spawn_scoped(s, work).ok())
            .collect();
        let mut all = work();
        for h in helpers {
            all.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        all
    });
    made.sort_by_key(|(i, _)| *i);
    Ok(made.into_iter().map(|(_, t)| t).collect())
}

/// Refuses a config with more tensors than the header of a checkpoint holds
/// ([`MAX_HEADER_BYTES`](super::checkpoint::MAX_HEADER_BYTES), at 64 bytes or more a tensor):
/// its checkpoint could not be loaded, and listing its tensors would take as long as the
/// layers are many.
fn ensure_header_fits(cfg: &LlamaConfig) -> Result<(), DeviceError> {
    let tensors = cfg.num_hidden_layers.saturating_mul(9).saturating_add(3);
    let most = super::checkpoint::MAX_HEADER_BYTES / 64;
    if u64::try_from(tensors).map_or(true, |n| n > most) {
        return Err(DeviceError::usage(format!(
            "a config of {} layers has {tensors} tensors, more than the {most} a checkpoint's \
             {} MiB header holds",
            cfg.num_hidden_layers,
            super::checkpoint::MAX_HEADER_BYTES >> 20
        )));
    }
    Ok(())
}

/// One synthetic tensor, stored as `dtype`.
fn synthetic_tensor(
    name: &str,
    shape: &[usize],
    seed: u64,
    dtype: WeightDtype,
) -> CheckpointTensor {
    let values = synthetic_values(name, shape, seed);
    let data: Vec<u8> = match dtype {
        WeightDtype::Bf16 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        WeightDtype::F32 => values
            .iter()
            .flat_map(|v| v.to_f32().to_le_bytes())
            .collect(),
        WeightDtype::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(v.to_f32()).to_le_bytes())
            .collect(),
        WeightDtype::I32 => values
            .iter()
            .flat_map(|v| i32::from(v.to_bits()).to_le_bytes())
            .collect(),
    };
    CheckpointTensor {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

/// The synthetic tensors of `cfg` and `seed` by name, as `bf16`.
pub(crate) fn synthetic_map(
    cfg: &LlamaConfig,
    seed: u64,
) -> Result<HashMap<String, CheckpointTensor>, DeviceError> {
    Ok(synthetic_tensors(cfg, seed, WeightDtype::Bf16)?
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect())
}

/// The error of a file of a checkpoint that could not be written.
fn write_err(path: &Path, e: impl std::fmt::Display) -> DeviceError {
    DeviceError::usage(format!("cannot write {}: {e}", path.display()))
}

/// Creates `dir` if needed and writes `cfg` into it as `config.json`.
fn write_config(dir: &Path, cfg: &LlamaConfig) -> Result<(), DeviceError> {
    std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
    let path = dir.join("config.json");
    let json = serde_json::to_string_pretty(cfg).map_err(|e| write_err(&path, e))?;
    std::fs::write(&path, json).map_err(|e| write_err(&path, e))
}

/// Writes `cfg` as `dir/config.json` and `tensors` as `dir/model.safetensors`, creating
/// `dir` if needed.
///
/// # Errors
///
/// [`DeviceError::Usage`] naming the file that could not be written, the tensor whose bytes
/// do not match its shape and dtype, or a tensor given twice.
pub fn write_checkpoint(
    dir: &Path,
    cfg: &LlamaConfig,
    tensors: &[CheckpointTensor],
) -> Result<(), DeviceError> {
    // Checked here, before the `safetensors` crate sees them: it multiplies a shape out
    // unchecked, and indexes its table by position (a name given twice panics in it).
    let mut names = std::collections::HashSet::new();
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            return Err(DeviceError::usage(format!(
                "tensor `{}` is given twice; a checkpoint holds each tensor once",
                t.name
            )));
        }
        let bytes = t
            .shape
            .iter()
            .try_fold(t.dtype.safetensors().bitsize() / 8, |n, &d| {
                n.checked_mul(d)
            });
        if bytes != Some(t.data.len()) {
            return Err(DeviceError::usage(format!(
                "tensor `{}`: {} bytes do not hold {:?} of {:?}{}",
                t.name,
                t.data.len(),
                t.shape,
                t.dtype,
                if bytes.is_none() {
                    " (more bytes than this machine can address)"
                } else {
                    ""
                }
            )));
        }
    }
    write_config(dir, cfg)?;
    let views = tensors
        .iter()
        .map(|t| {
            TensorView::new(t.dtype.safetensors(), t.shape.clone(), &t.data)
                .map(|v| (t.name.clone(), v))
                .map_err(|e| {
                    DeviceError::usage(format!(
                        "tensor `{}`: {} bytes do not hold {:?} of {:?}: {e}",
                        t.name,
                        t.data.len(),
                        t.shape,
                        t.dtype
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path).map_err(|e| write_err(&path, e))
}

/// Writes the synthetic weights of `cfg` and `seed` as a `bf16` checkpoint in `dir`: the
/// same weights as `Llama::synthetic(device, cfg, seed)`.
///
/// # Errors
///
/// As [`synthetic_tensors`] (before anything is written) and [`write_checkpoint`].
///
/// # Examples
///
/// ```
/// use cuflow_models::llama::{testing, Llama, LlamaConfig};
/// use cuflow_runtime::Device;
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let dir = std::env::temp_dir().join(format!("cuflow-doc-tiny-{}", std::process::id()));
/// testing::write_tiny_checkpoint(&dir, &LlamaConfig::tiny(), 7)?;
/// let model = Llama::load(&Device::host(), &dir)?;
/// assert_eq!(model.config(), &LlamaConfig::tiny());
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
pub fn write_tiny_checkpoint(dir: &Path, cfg: &LlamaConfig, seed: u64) -> Result<(), DeviceError> {
    write_checkpoint(dir, cfg, &synthetic_tensors(cfg, seed, WeightDtype::Bf16)?)
}

/// Writes `cfg` as `dir/config.json` and a sparse `dir/model.safetensors` whose `bf16`
/// tensors are all zeros that take no disk space (the file's length is set, nothing is
/// written past the header): a checkpoint of any size, for tests of what a load refuses.
/// Returns the bytes of the tensors.
///
/// # Errors
///
/// [`DeviceError::Usage`] for a config [`LlamaConfig::validate`] refuses, or with more
/// tensors than a checkpoint's header holds, or naming the file that could not be written.
///
/// # Examples
///
/// ```
/// use cuflow_models::llama::{testing, Llama, LlamaConfig};
/// use cuflow_runtime::Device;
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let dir = std::env::temp_dir().join(format!("cuflow-doc-sparse-{}", std::process::id()));
/// let bytes = testing::write_sparse_checkpoint(&dir, &LlamaConfig::tiny())?;
/// let model = Llama::load(&Device::host(), &dir)?;
/// assert_eq!(model.weight_bytes(), bytes);
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
pub fn write_sparse_checkpoint(dir: &Path, cfg: &LlamaConfig) -> Result<usize, DeviceError> {
    cfg.validate()?;
    ensure_header_fits(cfg)?;
    write_config(dir, cfg)?;
    let path = dir.join("model.safetensors");
    // `validate` bounds every tensor's bytes and their sum.
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in hf_tensors(cfg) {
        let end = offset + shape.iter().product::<usize>() * 2;
        header.insert(
            name,
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let header = serde_json::to_vec(&header).map_err(|e| write_err(&path, e))?;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    std::fs::write(&path, &bytes).map_err(|e| write_err(&path, e))?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|file| file.set_len((bytes.len() + offset) as u64))
        .map_err(|e| write_err(&path, e))?;
    Ok(offset)
}

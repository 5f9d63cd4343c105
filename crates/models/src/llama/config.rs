//! The model's hyperparameters, read from a Hugging Face `config.json` or taken from a
//! preset, and the rotary frequencies they imply.

use std::fmt;
use std::path::Path;

use cuflow_runtime::DeviceError;
use serde::{Deserialize, Serialize};

use super::config_json::parse_config;
use super::files::read_config;

/// Llama 3 frequency scaling of rotary embeddings (`rope_scaling` in `config.json`).
///
/// Parsed as transformers reads it: the type is `rope_type` or its older spelling `type` (both,
/// when they agree, as a re-saved config has them); `"llama3"` scaling needs all four of its
/// numbers, `"linear"` scaling its `factor` (the Llama 3 fields then keep the values of
/// [`LlamaConfig::tiny`]'s, which linear scaling does not read).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RopeScalingFields")]
pub struct RopeScaling {
    /// `"llama3"` (wavelength-dependent scaling), `"linear"` (every frequency divided by
    /// `factor`) or `"default"` (no scaling).
    pub rope_type: String,
    /// How much longer the context is than the one the model was trained on.
    pub factor: f64,
    /// Wavelengths longer than `original_max_position_embeddings / low_freq_factor` are
    /// scaled fully (Llama 3 only).
    pub low_freq_factor: f64,
    /// Wavelengths shorter than `original_max_position_embeddings / high_freq_factor` are
    /// kept (Llama 3 only).
    pub high_freq_factor: f64,
    /// The training context of the unscaled model (Llama 3 only).
    pub original_max_position_embeddings: usize,
}

impl RopeScaling {
    /// The largest `factor` accepted: a context 1024 times the trained one.
    const MAX_FACTOR: f64 = 1024.0;

    /// Checks the numbers its type reads: why not, if they are out of range.
    fn validate(&self) -> Result<(), String> {
        match self.rope_type.as_str() {
            "llama3" | "linear" => {}
            // No scaling: the numbers are not read.
            "default" => return Ok(()),
            other => {
                return Err(format!(
                    "rope_scaling type {other:?}: only \"llama3\", \"linear\" and \
                     \"default\" are supported"
                ))
            }
        }
        if !(1.0..=Self::MAX_FACTOR).contains(&self.factor) {
            return Err(format!(
                "rope_scaling factor {:?} must be from 1 to {} (a factor below 1 shortens the \
                 context)",
                self.factor,
                Self::MAX_FACTOR
            ));
        }
        let (low, high) = (self.low_freq_factor, self.high_freq_factor);
        let finite_positive = |v: f64| v.is_finite() && v > 0.0;
        if self.rope_type == "llama3"
            && !(finite_positive(low) && finite_positive(high) && high > low)
        {
            return Err(format!(
                "rope_scaling needs finite low_freq_factor ({low:?}) and high_freq_factor \
                 ({high:?}) with 0 < low_freq_factor < high_freq_factor"
            ));
        }
        if self.rope_type == "llama3" && self.original_max_position_embeddings == 0 {
            return Err("rope_scaling original_max_position_embeddings must be positive".into());
        }
        Ok(())
    }
}

/// A `rope_scaling` block as written, every field optional: [`RopeScaling`]'s `TryFrom` says
/// which ones its type needs.
#[derive(Deserialize)]
struct RopeScalingFields {
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    rope_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
}

impl TryFrom<RopeScalingFields> for RopeScaling {
    type Error = String;

    fn try_from(raw: RopeScalingFields) -> Result<RopeScaling, String> {
        let rope_type = match (raw.rope_type, raw.legacy_type) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "rope_scaling has rope_type {a:?} and type {b:?}; they name the same thing \
                     and must agree"
                ))
            }
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => {
                return Err("rope_scaling needs rope_type (\"llama3\", \"linear\" or \
                            \"default\")"
                    .into())
            }
        };
        let needs = |field: &str| {
            format!("rope_scaling of rope_type {rope_type:?} needs {field} (none is assumed)")
        };
        let preset = RopeScaling::llama3(8192);
        let scaling = match rope_type.as_str() {
            "llama3" => RopeScaling {
                factor: raw.factor.ok_or_else(|| needs("factor"))?,
                low_freq_factor: raw
                    .low_freq_factor
                    .ok_or_else(|| needs("low_freq_factor"))?,
                high_freq_factor: raw
                    .high_freq_factor
                    .ok_or_else(|| needs("high_freq_factor"))?,
                original_max_position_embeddings: raw
                    .original_max_position_embeddings
                    .ok_or_else(|| needs("original_max_position_embeddings"))?,
                rope_type,
            },
            "linear" => RopeScaling {
                factor: raw.factor.ok_or_else(|| needs("factor"))?,
                rope_type,
                ..preset
            },
            // Unscaled (or a type `validate` refuses, by name): the numbers are not read.
            _ => RopeScaling {
                factor: raw.factor.unwrap_or(1.0),
                rope_type,
                ..preset
            },
        };
        Ok(scaling)
    }
}

fn default_theta() -> f64 {
    10_000.0
}
fn default_eps() -> f64 {
    1e-5
}
fn default_max_pos() -> usize {
    4096
}

/// The sizes and constants of a Llama model, with the field names of Hugging Face's
/// `config.json`. Other fields are ignored when parsing, but [`LlamaConfig::from_file`]
/// refuses the ones that describe another model (`model_type` other than `"llama"`,
/// `attention_bias` or `mlp_bias` true, `hidden_act` other than `"silu"`).
///
/// # Examples
///
/// ```
/// use cuflow_models::llama::LlamaConfig;
/// let cfg: LlamaConfig = serde_json::from_str(
///     r#"{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
///         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}"#,
/// ).unwrap();
/// assert_eq!(cfg.head_dim(), 16);
/// assert_eq!(cfg.rope_theta, 10000.0);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); `num_attention_heads` when absent.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Width of a head; `hidden_size / num_attention_heads` when absent.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Tokens of the vocabulary.
    pub vocab_size: usize,
    /// The `eps` of every RMS norm.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Base of the rotary frequencies.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Frequency scaling of the rotary embedding, if any.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// Whether the logits projection is the embedding table (no `lm_head.weight`).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// The longest context the model was made for (the default `max_seq` of a capture is
    /// this, capped at 4096).
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
}

impl RopeScaling {
    /// The Llama 3 scaling of the presets, as Llama 3.2 sets it (factor 32, low and high
    /// frequency factors 1 and 4), over a training context of `original_max_position_embeddings`.
    fn llama3(original_max_position_embeddings: usize) -> RopeScaling {
        RopeScaling {
            rope_type: "llama3".into(),
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings,
        }
    }
}

/// The shape in one line: `16 layers, hidden 2048, 32 heads / 8 kv heads of 64, mlp 8192,
/// vocab 128256`.
impl fmt::Display for LlamaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} layers, hidden {}, {} heads / {} kv heads of {}, mlp {}, vocab {}",
            self.num_hidden_layers,
            self.hidden_size,
            self.num_attention_heads,
            self.kv_heads(),
            self.head_dim(),
            self.intermediate_size,
            self.vocab_size,
        )
    }
}

impl LlamaConfig {
    /// A tiny model for tests and the host backend: 2 layers, hidden 64, 4 query heads and
    /// 2 key/value heads of 16, MLP 128, vocabulary 256, Llama 3 rope scaling, untied.
    pub fn tiny() -> LlamaConfig {
        LlamaConfig {
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: Some(2),
            head_dim: None,
            vocab_size: 256,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: Some(RopeScaling::llama3(64)),
            tie_word_embeddings: false,
            max_position_embeddings: 512,
        }
    }

    /// The shape of Llama 3.2 1B: 16 layers, hidden 2048, 32 query heads and 8 key/value
    /// heads of 64, MLP 8192, vocabulary 128256, tied embeddings, Llama 3 rope scaling
    /// (2.47 GB of `bf16` weights).
    pub fn llama_3_2_1b() -> LlamaConfig {
        LlamaConfig {
            hidden_size: 2048,
            intermediate_size: 8192,
            num_hidden_layers: 16,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: Some(64),
            vocab_size: 128_256,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: Some(RopeScaling::llama3(8192)),
            tie_word_embeddings: true,
            max_position_embeddings: 131_072,
        }
    }

    /// The shape of Llama 3.1 8B: 32 layers, hidden 4096, 32 query heads and 8 key/value
    /// heads of 128, MLP 14336, vocabulary 128256, untied embeddings, Llama 3 rope scaling
    /// (16.06 GB of `bf16` weights).
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_models::llama::LlamaConfig;
    /// let cfg = LlamaConfig::llama_3_1_8b();
    /// assert_eq!((cfg.head_dim(), cfg.kv_heads()), (128, 8));
    /// ```
    pub fn llama_3_1_8b() -> LlamaConfig {
        LlamaConfig {
            hidden_size: 4096,
            intermediate_size: 14_336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: Some(128),
            vocab_size: 128_256,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: Some(RopeScaling::llama3(8192)),
            tie_word_embeddings: false,
            max_position_embeddings: 131_072,
        }
    }

    /// Reads `config.json` from a checkpoint folder.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] naming the file when it is not a regular file, is larger than
    /// 16 MiB or cannot be read, is not valid JSON with the fields above (naming the field
    /// whose value is of another type, or quoting the text that is not JSON), is the config of
    /// another architecture (`model_type`, `attention_bias`, `mlp_bias`, `hidden_act`), or
    /// describes an unsupported model.
    pub fn from_file(path: &Path) -> Result<LlamaConfig, DeviceError> {
        let bytes = read_config(path).map_err(|e| {
            DeviceError::usage(format!(
                "{e}; a checkpoint folder holds config.json beside its *.safetensors files"
            ))
        })?;
        let cfg = parse_config(path, &bytes)?;
        cfg.validate()
            .map_err(|e| DeviceError::usage(format!("{}: {e}", path.display())))?;
        Ok(cfg)
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of a head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Rows of the fused query/key/value projection (`usize::MAX` for a config whose sizes
    /// overflow, which [`validate`](Self::validate) refuses).
    pub fn qkv_rows(&self) -> usize {
        self.checked_qkv_rows().unwrap_or(usize::MAX)
    }

    fn checked_qkv_rows(&self) -> Option<usize> {
        self.kv_heads()
            .checked_mul(2)?
            .checked_add(self.num_attention_heads)?
            .checked_mul(self.head_dim())
    }

    /// Elements of every weight, as the model stores them (`usize::MAX` for a config whose
    /// sizes overflow, which [`validate`](Self::validate) refuses).
    pub fn parameter_count(&self) -> usize {
        self.checked_sizes().unwrap_or(usize::MAX)
    }

    /// Bytes of the weights stored as `bf16`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] when the sizes overflow, as [`Self::validate`].
    pub(crate) fn bf16_weight_bytes(&self) -> Result<usize, DeviceError> {
        self.checked_sizes()
            .map(|n| n * 2)
            .map_err(|what| DeviceError::usage(format!("unsupported Llama config: {what}")))
    }

    /// Elements of every weight, each product checked: the error names the fields whose
    /// product overflows.
    fn checked_sizes(&self) -> Result<usize, String> {
        let (d, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let hd = self.head_dim();
        let product = |what: &str, a: usize, b: usize| {
            a.checked_mul(b)
                .ok_or_else(|| format!("{what} ({a} × {b}) overflows the size of a weight"))
        };
        let embed = product("vocab_size × hidden_size", v, d)?;
        let q = product(
            "num_attention_heads × head_dim",
            self.num_attention_heads,
            hd,
        )?;
        let rows = self.checked_qkv_rows().ok_or_else(|| {
            format!(
                "(num_attention_heads + 2 × num_key_value_heads) × head_dim ({} + 2 × {}) × \
                 {hd} overflows the size of a weight",
                self.num_attention_heads,
                self.kv_heads()
            )
        })?;
        let qkv = product("the query/key/value rows × hidden_size", rows, d)?;
        let out = product("hidden_size × num_attention_heads × head_dim", d, q)?;
        let mlp = product("intermediate_size × hidden_size", i, d)?;
        let overflow = |what: &str| format!("{what} overflows the size of the weights");
        let layer = mlp
            .checked_mul(3)
            .and_then(|m| {
                m.checked_add(qkv)?
                    .checked_add(out)?
                    .checked_add(d)?
                    .checked_add(d)
            })
            .ok_or_else(|| overflow("a layer (hidden_size, intermediate_size, heads)"))?;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        let total = layer
            .checked_mul(self.num_hidden_layers)
            .and_then(|layers| layers.checked_add(embed)?.checked_add(head)?.checked_add(d))
            .ok_or_else(|| overflow("num_hidden_layers × a layer"))?;
        // The weights are stored as 2-byte `bf16`, in allocations of at most `isize::MAX` bytes.
        if total > isize::MAX as usize / 2 {
            return Err(overflow(&format!("{total} parameters in bf16")));
        }
        Ok(total)
    }

    /// Checks that the model is one the kernels run.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] saying which field is out of range and why.
    pub fn validate(&self) -> Result<(), DeviceError> {
        let bad = |what: String| {
            Err(DeviceError::usage(format!(
                "unsupported Llama config: {what}"
            )))
        };
        let sizes = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("vocab_size", self.vocab_size),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} must be positive"));
        }
        if !self.num_attention_heads.is_multiple_of(self.kv_heads())
            || self.num_attention_heads / self.kv_heads() > 8
        {
            return bad(format!(
                "num_attention_heads {} must be a multiple of num_key_value_heads {}, at most 8 \
                 times it",
                self.num_attention_heads,
                self.kv_heads()
            ));
        }
        let hd = self.head_dim();
        if !(16..=256).contains(&hd) || !hd.is_power_of_two() {
            return bad(format!(
                "head_dim {hd} must be a power of two from 16 to 256"
            ));
        }
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
        ] {
            if v % 8 != 0 {
                return bad(format!("{name} {v} must be a multiple of 8"));
            }
        }
        if let Err(what) = self.checked_sizes() {
            return bad(what);
        }
        if self.vocab_size > u32::MAX as usize / 2 {
            return bad(format!(
                "vocab_size {} does not fit u32 ids",
                self.vocab_size
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad(format!(
                "rope_theta {:?} must be finite and greater than 1",
                self.rope_theta
            ));
        }
        // The kernels use eps as f32: it must be positive and finite there too.
        let eps = self.rms_norm_eps as f32;
        if !(eps > 0.0 && eps <= 1.0) {
            return bad(format!(
                "rms_norm_eps {:?} must be positive and at most 1 (and positive in f32)",
                self.rms_norm_eps
            ));
        }
        if let Some(Err(what)) = self.rope_scaling.as_ref().map(RopeScaling::validate) {
            return bad(what);
        }
        Ok(())
    }

    /// The `head_dim / 2` rotary frequencies, `1 / rope_theta^(2i / head_dim)`, with the
    /// config's scaling applied exactly as Hugging Face transformers applies it.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for a config [`validate`](Self::validate) refuses.
    pub fn inv_freq(&self) -> Result<Vec<f64>, DeviceError> {
        self.validate()?;
        let hd = self.head_dim();
        let base: Vec<f64> = (0..hd / 2)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / hd as f64))
            .collect();
        let Some(s) = &self.rope_scaling else {
            return Ok(base);
        };
        let scaled = match s.rope_type.as_str() {
            "linear" => base.iter().map(|f| f / s.factor).collect(),
            "llama3" => {
                let old = s.original_max_position_embeddings as f64;
                let (low_wavelen, high_wavelen) =
                    (old / s.low_freq_factor, old / s.high_freq_factor);
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / s.factor
                        } else {
                            let smooth = (old / wavelen - s.low_freq_factor)
                                / (s.high_freq_factor - s.low_freq_factor);
                            (1.0 - smooth) * f / s.factor + smooth * f
                        }
                    })
                    .collect()
            }
            _ => base,
        };
        Ok(scaled)
    }
}

#[cfg(test)]
mod tests {
    use super::LlamaConfig;

    /// The presets hold as many weights as the published models: 1,235,814,400 for Llama 3.2
    /// 1B (tied embeddings), 8,030,261,248 for Llama 3.1 8B.
    #[test]
    fn the_presets_have_the_published_parameter_counts() {
        let bytes = |cfg: LlamaConfig| cfg.bf16_weight_bytes().expect("a valid preset");
        assert_eq!(bytes(LlamaConfig::llama_3_2_1b()), 2 * 1_235_814_400);
        assert_eq!(bytes(LlamaConfig::llama_3_1_8b()), 2 * 8_030_261_248);
    }
}

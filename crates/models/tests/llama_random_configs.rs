//! Random `config.json` files: the tiny model's config with random fields changed (extreme
//! and fractional numbers, values of another JSON type, missing, unknown and repeated keys,
//! odd `rope_scaling` blocks, head counts that do not divide, whole random small shapes),
//! each loaded from a folder of its own over the weights of the original or of the edited
//! config. Whatever the file holds, a load is `Ok` or an error naming the field (or the
//! file), never a panic or a hang, and a refused load has allocated no device memory; a valid
//! config over the weights it describes loads, and a model that loads generates from a
//! prompt of its vocabulary and refuses an id outside it.
//!
//! The seeds are fixed: `CUFLOW_RANDOM_CHECKPOINTS=N` runs N times as many cases. A failing
//! case is reported with its number and its edits, to be written down as a test of its own.

mod random_checkpoint;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use cuflow_models::llama::LlamaConfig;
use cuflow_runtime::{Device, DeviceError};
use cuflow_testing::rng::{scale_from_env, seeded_rng};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use random_checkpoint::*;
use serde_json::{json, Value};

/// The fields of a Llama `config.json` the cases edit.
const CONFIG_KEYS: [&str; 18] = [
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "tie_word_embeddings",
    "max_position_embeddings",
    "model_type",
    "attention_bias",
    "mlp_bias",
    "hidden_act",
    "torch_dtype",
    "architectures",
];

/// The fields of a `rope_scaling` block.
const SCALING_KEYS: [&str; 6] = [
    "rope_type",
    "type",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
];

/// The `config.json` of `base` as Hugging Face transformers writes it, with the fields this
/// model does not read.
fn base_config_json(base: Base) -> Value {
    let mut json = serde_json::to_value(base.config()).expect("a config is JSON");
    let extras = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": true,
        "transformers_version": "4.45.0",
    });
    for (k, v) in extras.as_object().expect("an object") {
        json[k] = v.clone();
    }
    json
}

/// An edit of a `config.json`.
#[derive(Clone, Debug)]
enum ConfigEdit {
    /// A top-level field set.
    Set(&'static str, Value),
    /// A field of the `rope_scaling` block set (the block made an object first if it is not).
    SetScaling(&'static str, Value),
    /// A top-level field removed.
    Remove(&'static str),
    /// A field no config has added.
    Unknown(String, Value),
    /// A second `key: value` pair for a field, written before the first.
    Duplicate(&'static str, Value),
    /// A field's value written as a bare token JSON does not have (`NaN`, `Infinity`), as
    /// Python's `json` module writes floats that are not finite.
    Bare(&'static str, &'static str),
}

impl fmt::Display for ConfigEdit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigEdit::Set(k, v) => write!(f, "{k} = {v}"),
            ConfigEdit::SetScaling(k, v) => write!(f, "rope_scaling.{k} = {v}"),
            ConfigEdit::Remove(k) => write!(f, "no {k}"),
            ConfigEdit::Unknown(k, v) => write!(f, "unknown {k} = {v}"),
            ConfigEdit::Duplicate(k, v) => write!(f, "{k} = {v} written twice"),
            ConfigEdit::Bare(k, token) => write!(f, "{k} = bare {token}"),
        }
    }
}

/// The fields that say which architecture a config describes, read before the others.
const ARCHITECTURE_KEYS: [&str; 4] = ["model_type", "attention_bias", "mlp_bias", "hidden_act"];

/// The fields a config must have.
const REQUIRED_KEYS: [&str; 5] = [
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
];

/// Whether the top-level field `key` takes the JSON value `value` (its type, not its range);
/// `None` for a field the loader does not read.
fn takes(key: &str, value: &Value) -> Option<bool> {
    let takes = match key {
        "hidden_size"
        | "intermediate_size"
        | "num_hidden_layers"
        | "num_attention_heads"
        | "vocab_size"
        | "max_position_embeddings" => value.is_u64(),
        "num_key_value_heads" | "head_dim" => value.is_u64() || value.is_null(),
        "rms_norm_eps" | "rope_theta" => value.is_number(),
        "tie_word_embeddings" => value.is_boolean(),
        "attention_bias" | "mlp_bias" => value.is_boolean() || value.is_null(),
        "model_type" | "hidden_act" => value.is_string() || value.is_null(),
        "rope_scaling" => value.is_object() || value.is_null(),
        _ => return None,
    };
    Some(takes)
}

impl ConfigEdit {
    /// What the error of a config refused for this edit alone must name, where the edit is
    /// to blame for it: a field of the wrong type, a constant or `rope_scaling` block out of
    /// range, a required field missing, a field written twice, the text that is not JSON.
    fn named_by_a_refusal(&self) -> Option<String> {
        match self {
            ConfigEdit::Set(k, v) if takes(k, v) == Some(false) => Some(format!("`{k}`")),
            ConfigEdit::Set(k @ ("rope_scaling" | "rms_norm_eps" | "rope_theta"), _) => {
                Some(k.to_string())
            }
            ConfigEdit::SetScaling(..) => Some("rope_scaling".into()),
            ConfigEdit::Remove(k) if REQUIRED_KEYS.contains(k) => Some(format!("`{k}`")),
            // Serde's "duplicate field", or what is wrong with the first of the two.
            ConfigEdit::Duplicate(k, _) if takes(k, &Value::Null).is_some() => Some(k.to_string()),
            ConfigEdit::Bare(k, token) => Some(format!("\"{k}\":{token}")),
            _ => None,
        }
    }
}

/// A value a config could hold for `key`: a size, a constant, a flag or a name of the kind
/// the field takes (many of them valid, some out of range).
fn plausible(rng: &mut StdRng, key: &str) -> Value {
    match key {
        "head_dim" | "num_key_value_heads" if rng.gen_bool(0.2) => Value::Null,
        "rms_norm_eps" => pick(rng, "[1e-6, 1e-5, 1e-3, 1.0]"),
        "rope_theta" | "factor" | "low_freq_factor" | "high_freq_factor" => pick(
            rng,
            "[0.5, 1.0, 2.0, 4.0, 32.0, 1024.0, 1025.0, 10000.0, 500000.0]",
        ),
        "tie_word_embeddings" | "attention_bias" | "mlp_bias" => json!(rng.gen_bool(0.5)),
        "model_type" => pick(rng, r#"["llama", "mistral", "LLaMA"]"#),
        "hidden_act" => pick(rng, r#"["silu", "gelu", "swish"]"#),
        "torch_dtype" => pick(rng, r#"["bfloat16", "float16", "float32", "int8"]"#),
        "architectures" => pick(rng, r#"[["LlamaForCausalLM"], ["MistralForCausalLM"], []]"#),
        "rope_type" | "type" => pick(
            rng,
            r#"["llama3", "linear", "default", "dynamic", "yarn", "LLAMA3", ""]"#,
        ),
        "rope_scaling" => scaling_block(rng),
        _ => pick(
            rng,
            "[1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 4096]",
        ),
    }
}

/// A value for `key`: plausible, extreme, or of the wrong type.
fn value_for(rng: &mut StdRng, key: &str) -> Value {
    match rng.gen_range(0..3) {
        0 => plausible(rng, key),
        1 => extreme_number(rng),
        _ => wrong_type(rng),
    }
}

/// A `rope_scaling` block: Llama 3 scaling with odd numbers or a field missing, linear
/// scaling, types this model does not compute, both type keys disagreeing, no type at all.
fn scaling_block(rng: &mut StdRng) -> Value {
    let llama3 = json!({
        "rope_type": "llama3",
        "factor": pick(rng, "[0.5, 1.0, 2.0, 8.0, 32.0, 1024.0, 1025.0, 1e300]"),
        "low_freq_factor": pick(rng, "[0.0, 0.5, 1.0, 4.0, -1.0]"),
        "high_freq_factor": pick(rng, "[0.5, 1.0, 4.0, 8.0]"),
        "original_max_position_embeddings": pick(rng, "[0, 1, 64, 8192, 9223372036854775808]"),
    });
    match rng.gen_range(0..8) {
        0 | 1 => llama3,
        2 => json!({"type": "linear", "factor": llama3["factor"]}),
        3 => {
            let ty = pick(
                rng,
                r#"["dynamic", "yarn", "longrope", "su", "LLAMA3", ""]"#,
            );
            json!({"rope_type": ty, "factor": 2.0})
        }
        4 => json!({"rope_type": "default"}),
        5 => json!({"type": "llama3", "rope_type": "linear", "factor": 8.0}),
        6 => {
            let mut block = llama3;
            let field = SCALING_KEYS[2..].choose(rng).expect("fields");
            block.as_object_mut().expect("an object").remove(*field);
            block
        }
        _ => pick(rng, r#"[{}, {"factor": 8.0}, null]"#),
    }
}

/// A random edit of a config: a field set to a random value, removed, added, written twice
/// or as a bare non-finite token; a `rope_scaling` block or one of its fields replaced; a
/// head count or width that does not fit the others.
fn draw_config_edit(rng: &mut StdRng) -> ConfigEdit {
    let key = *CONFIG_KEYS.choose(rng).expect("keys");
    match rng.gen_range(0..12) {
        0..=4 => ConfigEdit::Set(key, value_for(rng, key)),
        5 => {
            let field = *SCALING_KEYS.choose(rng).expect("fields");
            ConfigEdit::SetScaling(field, value_for(rng, field))
        }
        6 => ConfigEdit::Set("rope_scaling", scaling_block(rng)),
        7 => ConfigEdit::Remove(key),
        8 => {
            let names = r#"["rope_type", "sliding_window", "Hidden_Size", "", "hidden_size "]"#;
            let name = pick(rng, names).as_str().expect("a name").to_string();
            ConfigEdit::Unknown(name, value_for(rng, "hidden_size"))
        }
        9 => ConfigEdit::Duplicate(key, plausible(rng, key)),
        10 => {
            let token = ["NaN", "Infinity", "-Infinity", "1e999"]
                .choose(rng)
                .expect("tokens");
            ConfigEdit::Bare(key, token)
        }
        // Two fields made to disagree: head counts that do not divide, a head width that is
        // not the hidden size over the heads.
        _ => {
            let (k, v) = [
                ("num_attention_heads", json!(3)),
                ("num_key_value_heads", json!(3)),
                ("num_key_value_heads", json!(8)),
                ("head_dim", json!(32)),
                ("head_dim", json!(64)),
                ("head_dim", json!(8)),
                ("vocab_size", json!(0)),
            ]
            .choose(rng)
            .expect("pairs")
            .clone();
            ConfigEdit::Set(k, v)
        }
    }
}

/// The edits that give a config another valid small shape: one to eight query heads, key/value
/// heads that divide them, head widths from 16 to 256 that need not be the hidden size over
/// the heads, hidden and MLP widths of any multiple of 8, one to three layers, a vocabulary of
/// one token or more, tied or not, a context of one position or more.
fn random_shape(rng: &mut StdRng) -> Vec<ConfigEdit> {
    let heads = *[1, 2, 4, 8].choose(rng).expect("heads");
    let kv = *[1, 2, 4, 8]
        .iter()
        .filter(|&&kv| heads % kv == 0)
        .collect::<Vec<_>>()
        .choose(rng)
        .expect("kv heads");
    let head_dim = *[16, 16, 32, 64, 128, 256].choose(rng).expect("head widths");
    let vocab = *[1, 2, 3, 17, 256, 300].choose(rng).expect("vocabularies");
    let context = *[1, 2, 3, 8, 512].choose(rng).expect("contexts");
    [
        ("hidden_size", json!(8 * rng.gen_range(1..=12))),
        ("intermediate_size", json!(8 * rng.gen_range(1..=20))),
        ("num_hidden_layers", json!(rng.gen_range(1..=3))),
        ("num_attention_heads", json!(heads)),
        ("num_key_value_heads", json!(kv)),
        ("head_dim", json!(head_dim)),
        ("vocab_size", json!(vocab)),
        ("tie_word_embeddings", json!(rng.gen_bool(0.5))),
        ("max_position_embeddings", json!(context)),
    ]
    .into_iter()
    .map(|(k, v)| ConfigEdit::Set(k, v))
    .collect()
}

/// The text of `json` with `edits` applied.
fn config_text(mut json: Value, edits: &[ConfigEdit]) -> String {
    let mut duplicates = Vec::new();
    let mut bare = Vec::new();
    for edit in edits {
        match edit {
            ConfigEdit::Set(k, v) => json[*k] = v.clone(),
            ConfigEdit::SetScaling(k, v) => {
                if !json["rope_scaling"].is_object() {
                    json["rope_scaling"] = json!({});
                }
                json["rope_scaling"][*k] = v.clone();
            }
            ConfigEdit::Remove(k) => {
                json.as_object_mut().expect("an object").remove(*k);
            }
            ConfigEdit::Unknown(k, v) => json[k.as_str()] = v.clone(),
            ConfigEdit::Duplicate(k, v) => duplicates.push(format!("{}:{v}", json!(k))),
            ConfigEdit::Bare(k, token) => {
                let mark = format!("@bare-{}@", bare.len());
                json[*k] = json!(mark);
                bare.push((json!(mark).to_string(), *token));
            }
        }
    }
    let mut text = json.to_string();
    for (mark, token) in bare {
        text = text.replace(&mark, token);
    }
    if !duplicates.is_empty() {
        let rest = &text[1..];
        let comma = if rest == "}" { "" } else { "," };
        text = format!("{{{}{comma}{rest}", duplicates.join(","));
    }
    text
}

/// Whether the architecture fields of `json` are ones this model computes (absent, `null`,
/// or the Llama values).
fn architecture_is_llama(json: &Value) -> bool {
    [
        ("model_type", json!("llama")),
        ("attention_bias", json!(false)),
        ("mlp_bias", json!(false)),
        ("hidden_act", json!("silu")),
    ]
    .iter()
    .all(|(k, llama)| json.get(k).is_none_or(|v| v.is_null() || v == llama))
}

/// A case of [`random_configs_load_or_name_what_is_wrong`].
#[derive(Debug)]
struct ConfigCase {
    base: Base,
    edits: Vec<ConfigEdit>,
    /// Whether the weights are written for the edited config where it is valid and small.
    weights_of_edited: bool,
}

impl fmt::Display for ConfigCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let edits: Vec<String> = self.edits.iter().map(ToString::to_string).collect();
        write!(
            f,
            "[{}] over the tiny config (tied: {}, {:?}), weights of the {} config",
            edits.join("; "),
            self.base.tied,
            self.base.dtype,
            if self.weights_of_edited {
                "edited (where valid)"
            } else {
                "original"
            }
        )
    }
}

impl ConfigCase {
    /// One to three random edits, or a random valid shape and at most one edit more.
    fn draw(rng: &mut StdRng) -> ConfigCase {
        let reshaped = rng.gen_bool(0.2);
        let mut edits = if reshaped {
            random_shape(rng)
        } else {
            Vec::new()
        };
        let more = if reshaped { [0, 0, 1] } else { [1, 2, 3] };
        let count = *[more[0], more[0], more[0], more[1], more[2]]
            .choose(rng)
            .expect("counts");
        edits.extend((0..count).map(|_| draw_config_edit(rng)));
        ConfigCase {
            base: *Base::ALL.choose(rng).expect("bases"),
            edits,
            weights_of_edited: rng.gen_bool(if reshaped { 0.9 } else { 0.6 }),
        }
    }

    /// Writes the case's checkpoint into `dir`, loads it and checks the outcome.
    fn check(
        &self,
        device: &Device,
        dir: &Path,
        bases: &Bases,
        rng: &mut StdRng,
    ) -> Result<(), DeviceError> {
        let text = config_text(base_config_json(self.base), &self.edits);
        let parsed = serde_json::from_str::<LlamaConfig>(&text).ok();
        let valid = parsed
            .clone()
            .filter(|c| c.validate().is_ok() && c.parameter_count() <= MAX_PARAMETERS);
        let weights = match &valid {
            Some(cfg) if self.weights_of_edited => cfg.clone(),
            _ => self.base.config(),
        };
        if weights == self.base.config() {
            bases.write(dir, self.base)?;
        } else {
            self.base.write(dir, &weights)?;
        }
        std::fs::write(dir.join("config.json"), &text).map_err(io)?;
        let json = serde_json::from_str::<Value>(&text).ok();
        let llama = json.as_ref().is_some_and(architecture_is_llama);
        // Serde reads `LlamaConfig`'s fields in a pass of their own: these are written twice
        // only where the text has them twice.
        let twice = ARCHITECTURE_KEYS
            .iter()
            .any(|k| text.matches(&format!("\"{k}\":")).count() > 1);
        let named = match &self.edits[..] {
            [edit] => edit.named_by_a_refusal(),
            _ => None,
        };
        let expect = Expect {
            // A config serde cannot read does not load; a valid Llama config over its own
            // weights does.
            loads: match &parsed {
                None => Some(false),
                Some(_) if twice => Some(false),
                Some(_) if llama && valid.as_ref() == Some(&weights) => Some(true),
                Some(_) => None,
            },
            same_model: parsed.as_ref() == Some(&weights) && weights == self.base.config(),
            naming: match named {
                Some(name) => vec![name],
                None => vec![
                    "config.json".into(),
                    "`model.".into(),
                    "`lm_head.weight`".into(),
                ],
            },
        };
        let reference = &bases.get(self.base).logits;
        if let Ok(model) = load_and_check(device, dir, &expect, reference, rng)? {
            // What loaded is what serde reads.
            assert_eq!(Some(model.config()), parsed.as_ref());
        }
        Ok(())
    }
}

/// Configs with random fields changed to random values (sizes of 0, 1, -1 and 2^63, huge and
/// fractional numbers, strings, arrays, nulls and objects, missing, unknown and repeated
/// keys, bare `NaN`, odd `rope_scaling` blocks, heads that do not divide, a tie that the files
/// do not have, whole other shapes), over the weights of the original config or of the edited
/// one: each loads or is an error naming `config.json` or a tensor, and the field where one
/// edit of it is to blame; a valid config over its own weights loads, and generates.
#[test]
fn random_configs_load_or_name_what_is_wrong() -> Result<(), DeviceError> {
    let _turn = device_turn();
    let device = cuflow_testing::device::device();
    let bases = Arc::new(Bases::new(&device)?);
    let mut rng = seeded_rng(0x00c0_f1a5);
    let cases = CASES * scale_from_env(SCALE);
    for i in 0..cases {
        let case = ConfigCase::draw(&mut rng);
        let seed: u64 = rng.gen();
        let what = format!("config case {i}: {case}");
        let (device, bases) = (device.clone(), bases.clone());
        run_case(&what, move || {
            let TempDir(dir) = &TempDir::new(&format!("config-{i}"));
            case.check(&device, dir, &bases, &mut seeded_rng(seed))
        });
    }
    Ok(())
}

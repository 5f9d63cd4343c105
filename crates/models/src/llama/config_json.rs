//! Reading a `config.json` into a [`LlamaConfig`]: the fields that say which architecture it
//! describes are checked first, then the config is read. Where serde cannot read the file, the
//! error names the field to blame (a size written as a string, a flag as a number: serde's
//! own message gives only a line and column, which in a config written on one line point
//! nowhere useful), or quotes the text that is not JSON (`NaN` and `Infinity`, as Python's
//! `json` module writes floats that are not finite).

use std::path::Path;

use cuflow_runtime::DeviceError;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::config::LlamaConfig;

/// The most characters of a field's value, or of the text around an error, that a message
/// quotes.
const QUOTED: usize = 60;

/// The config of the `config.json` at `path`, whose text is `bytes` (not yet validated).
///
/// # Errors
///
/// [`DeviceError::Usage`] naming the file when serde cannot read it (naming the field, or
/// quoting the text, to blame) or it is the config of another architecture.
pub(super) fn parse_config(path: &Path, bytes: &[u8]) -> Result<LlamaConfig, DeviceError> {
    let architecture: ArchitectureFields = read(path, bytes, || Ok(Value::Object(Map::new())))?;
    if let Some(why) = architecture.unsupported() {
        return Err(DeviceError::usage(format!("{}: {why}", path.display())));
    }
    read(path, bytes, || serde_json::to_value(LlamaConfig::tiny()))
}

/// `bytes` read as a `T`. When serde cannot read it, the error names the field of the file
/// that `T` cannot read: each field of the file in turn is set in `readable()` (a document
/// that `T` reads), and the first that makes it unreadable is named, with serde's reason. A
/// file that is not a JSON object is quoted where the error is.
fn read<T: DeserializeOwned>(
    path: &Path,
    bytes: &[u8],
    readable: impl FnOnce() -> serde_json::Result<Value>,
) -> Result<T, DeviceError> {
    let e = match serde_json::from_slice(bytes) {
        Ok(t) => return Ok(t),
        Err(e) => e,
    };
    let field = serde_json::from_slice::<Map<String, Value>>(bytes)
        .ok()
        .zip(readable().ok())
        .and_then(|(fields, readable)| misread_field::<T>(&fields, readable));
    let why = match field {
        Some(why) => why,
        None if e.to_string().starts_with("missing field") => format!(
            "{e}; it needs hidden_size, intermediate_size, num_hidden_layers, \
             num_attention_heads and vocab_size"
        ),
        None => format!("{e}{}", near(bytes, &e)),
    };
    Err(DeviceError::usage(format!(
        "{} is not a Llama config.json: {why}",
        path.display()
    )))
}

/// The first field of `fields` that makes `readable` unreadable as a `T` when set in it:
/// `field `name` = value: reason`.
fn misread_field<T: DeserializeOwned>(
    fields: &Map<String, Value>,
    readable: Value,
) -> Option<String> {
    fields.iter().find_map(|(name, value)| {
        let mut doc = readable.clone();
        doc[name.as_str()] = value.clone();
        let e = serde_json::from_value::<T>(doc).err()?;
        Some(format!(
            "field `{name}` = {}: {e}",
            quoted(&value.to_string())
        ))
    })
}

/// The text of `bytes` around the line and column of `e`, when it has one: ` near `…``.
fn near(bytes: &[u8], e: &serde_json::Error) -> String {
    let Some(line) = e.line().checked_sub(1) else {
        return String::new();
    };
    let Some(text) = bytes.split(|&b| b == b'\n').nth(line) else {
        return String::new();
    };
    let at = e.column().min(text.len());
    let from = at.saturating_sub(QUOTED * 2 / 3);
    let to = (at + QUOTED / 3).min(text.len());
    let excerpt = String::from_utf8_lossy(&text[from..to]);
    match excerpt.trim() {
        "" => String::new(),
        excerpt => format!(" near `{excerpt}`"),
    }
}

/// `text`, cut to [`QUOTED`] characters.
fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// The `config.json` fields that say which architecture a checkpoint is, or turn on Llama
/// features this model does not compute: [`LlamaConfig::from_file`] refuses a checkpoint whose
/// weights it would read only in part.
#[derive(Deserialize)]
struct ArchitectureFields {
    model_type: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
}

impl ArchitectureFields {
    /// Why a checkpoint with these fields is not one this model computes, if it is not.
    fn unsupported(&self) -> Option<String> {
        if let Some(t) = self.model_type.as_deref().filter(|t| *t != "llama") {
            return Some(format!(
                "model_type {t:?} is not \"llama\"; only Llama checkpoints load (other \
                 architectures have biases, norms or activations this model does not compute)"
            ));
        }
        for (field, on) in [
            ("attention_bias", self.attention_bias),
            ("mlp_bias", self.mlp_bias),
        ] {
            if on == Some(true) {
                return Some(format!(
                    "{field} is true; this model has no bias terms, and would ignore the \
                     checkpoint's"
                ));
            }
        }
        if let Some(act) = self.hidden_act.as_deref().filter(|a| *a != "silu") {
            return Some(format!(
                "hidden_act {act:?} is not \"silu\"; the MLP computes SwiGLU only"
            ));
        }
        None
    }
}

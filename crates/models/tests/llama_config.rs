//! `config.json` as Hugging Face writes it: `rope_scaling` blocks re-saved with both spellings
//! of their type, Llama 3 scaling without its required fields, constants that are not finite
//! or out of range, and values of the wrong JSON type are errors naming the field; helpers
//! given an unsupported config return its error instead of panicking.

use std::path::PathBuf;

use cuflow_models::llama::testing::{synthetic_tensors, write_tiny_checkpoint, WeightDtype};
use cuflow_models::llama::{Llama, LlamaConfig, RopeScaling};
use cuflow_runtime::DeviceError;

/// The tiny config's JSON with its `rope_scaling` block replaced by `scaling`.
fn with_scaling(scaling: serde_json::Value) -> String {
    let mut json = serde_json::to_value(LlamaConfig::tiny()).expect("json");
    json["rope_scaling"] = scaling;
    json.to_string()
}

fn parse(text: &str) -> Result<LlamaConfig, String> {
    serde_json::from_str::<LlamaConfig>(text).map_err(|e| e.to_string())
}

/// transformers writes both `type` and `rope_type` when it re-saves a config: the block
/// parses when they agree, and is an error naming both when they differ.
#[test]
fn rope_scaling_with_both_type_keys_parses_when_they_agree() {
    let block = |ty: &str, rope_type: &str| {
        serde_json::json!({
            "type": ty, "rope_type": rope_type, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64
        })
    };
    let cfg = parse(&with_scaling(block("llama3", "llama3"))).expect("both keys agree");
    assert_eq!(cfg, LlamaConfig::tiny());

    let err = parse(&with_scaling(block("linear", "llama3"))).expect_err("they differ");
    assert!(
        err.contains("\"linear\"") && err.contains("\"llama3\"") && err.contains("rope_type"),
        "{err}"
    );
}

/// Llama 3 scaling needs `factor`, `low_freq_factor`, `high_freq_factor` and
/// `original_max_position_embeddings` (as transformers requires): a block without one is an
/// error naming it, not a default.
#[test]
fn llama3_rope_scaling_needs_every_field() {
    let full = serde_json::json!({
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64
    });
    for field in [
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ] {
        let mut block = full.clone();
        block
            .as_object_mut()
            .expect("an object")
            .remove(field)
            .expect("the field");
        let err = parse(&with_scaling(block)).expect_err(field);
        assert!(err.contains(field) && err.contains("llama3"), "{err}");
    }
    // Linear scaling needs only its factor.
    let linear = serde_json::json!({"type": "linear", "factor": 2.0});
    let cfg = parse(&with_scaling(linear)).expect("linear scaling");
    assert_eq!(cfg.rope_scaling.map(|s| s.factor), Some(2.0));
}

/// Constants that are not finite, or out of the range a model can have (a `factor` below 1, an
/// `rms_norm_eps` that is zero or not finite in `f32`), are errors naming the field.
#[test]
fn constants_out_of_range_are_errors_naming_the_field() {
    let tiny = LlamaConfig::tiny();
    let scaled = |factor: f64| LlamaConfig {
        rope_scaling: tiny
            .rope_scaling
            .clone()
            .map(|s| RopeScaling { factor, ..s }),
        ..tiny.clone()
    };
    let cases = [
        (
            "rope_theta",
            LlamaConfig {
                rope_theta: f64::INFINITY,
                ..tiny.clone()
            },
        ),
        (
            "rope_theta",
            LlamaConfig {
                rope_theta: f64::NAN,
                ..tiny.clone()
            },
        ),
        (
            "rope_theta",
            LlamaConfig {
                rope_theta: 0.0,
                ..tiny.clone()
            },
        ),
        (
            "rms_norm_eps",
            LlamaConfig {
                rms_norm_eps: f64::NAN,
                ..tiny.clone()
            },
        ),
        (
            "rms_norm_eps",
            LlamaConfig {
                rms_norm_eps: 0.0,
                ..tiny.clone()
            },
        ),
        // Finite in f64, infinite in the f32 the kernels use.
        (
            "rms_norm_eps",
            LlamaConfig {
                rms_norm_eps: 1e300,
                ..tiny.clone()
            },
        ),
        // Positive in f64, zero in f32.
        (
            "rms_norm_eps",
            LlamaConfig {
                rms_norm_eps: 1e-300,
                ..tiny.clone()
            },
        ),
        ("factor", scaled(0.5)),
        ("factor", scaled(f64::INFINITY)),
        ("factor", scaled(f64::NAN)),
        ("factor", scaled(1e300)),
    ];
    for (field, cfg) in cases {
        let err = cfg.validate().expect_err(field).to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
}

/// Fields whose JSON value is of a type the field cannot take (a size written as a string, an
/// array or a float, a flag as a number, a `rope_scaling` block as a string), or a value JSON
/// does not have (`NaN` and `Infinity`, as Python's `json` module writes them), are errors
/// naming the field, whatever the layout of the file.
#[test]
fn fields_of_the_wrong_type_are_errors_naming_them() -> Result<(), DeviceError> {
    let tiny = serde_json::to_value(LlamaConfig::tiny()).expect("json");
    let cases = [
        ("hidden_size", serde_json::json!("64")),
        ("vocab_size", serde_json::json!([256])),
        ("num_hidden_layers", serde_json::json!(2.0)),
        ("head_dim", serde_json::json!({"value": 16})),
        ("rope_theta", serde_json::json!("NaN")),
        ("tie_word_embeddings", serde_json::json!(0)),
        ("attention_bias", serde_json::json!("no")),
        ("hidden_act", serde_json::json!(1)),
        ("rope_scaling", serde_json::json!("llama3")),
    ];
    let dir = temp_dir("wrong-type");
    write_tiny_checkpoint(&dir, &LlamaConfig::tiny(), 1)?;
    let config = dir.join("config.json");
    let device = cuflow_runtime::Device::auto()?;
    for (field, value) in cases {
        let mut json = tiny.clone();
        json[field] = value.clone();
        for text in [
            json.to_string(),
            serde_json::to_string_pretty(&json).expect("json"),
        ] {
            std::fs::write(&config, text).map_err(|e| DeviceError::usage(e.to_string()))?;
            let err = Llama::load(&device, &dir).expect_err(field).to_string();
            assert!(
                err.contains(&format!("`{field}`")) && err.contains("config.json"),
                "{field} = {value}: {err}"
            );
        }
    }
    for token in ["NaN", "Infinity", "-Infinity"] {
        let text = tiny.to_string().replace("500000.0", token);
        std::fs::write(&config, text).map_err(|e| DeviceError::usage(e.to_string()))?;
        let err = Llama::load(&device, &dir).expect_err(token).to_string();
        assert!(
            err.contains("rope_theta") && err.contains(token),
            "rope_theta = {token}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cuflow-config-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The rotary frequencies and the synthetic tensors of a config whose sizes overflow are its
/// validation error, not an arithmetic panic or an absurd allocation.
#[test]
fn helpers_refuse_unsupported_configs() {
    let huge = LlamaConfig {
        num_attention_heads: 1 << 60,
        num_key_value_heads: Some(1 << 60),
        head_dim: Some(64),
        ..LlamaConfig::tiny()
    };
    let wide_heads = LlamaConfig {
        head_dim: Some(1 << 62),
        ..LlamaConfig::tiny()
    };
    for cfg in [huge, wide_heads] {
        let want = cfg.validate().expect_err("unsupported").to_string();
        let err = cfg.inv_freq().expect_err("inv_freq").to_string();
        assert_eq!(err, want);
        let err = synthetic_tensors(&cfg, 1, WeightDtype::Bf16)
            .expect_err("synthetic_tensors")
            .to_string();
        assert_eq!(err, want);
        let dir = temp_dir("helpers");
        let err: DeviceError = write_tiny_checkpoint(&dir, &cfg, 1).expect_err("write");
        assert_eq!(err.to_string(), want);
        assert!(
            !dir.exists(),
            "nothing is written for an unsupported config"
        );
    }
}

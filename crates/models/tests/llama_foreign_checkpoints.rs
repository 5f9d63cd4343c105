//! Checkpoints that are not plain Llama ones are refused, never loaded into a model that
//! silently ignores part of them: configs of other architectures or with features the model
//! does not compute (biases, another activation), and tensors the model never reads (biases,
//! extra norms, adapter files), whole or split over ranks.

use std::path::{Path, PathBuf};

use cuflow_dist::Communicator;
use cuflow_models::llama::testing::{
    synthetic_tensors, write_checkpoint, CheckpointTensor, WeightDtype,
};
use cuflow_models::llama::{Llama, LlamaConfig};
use cuflow_runtime::{Device, DeviceError};
use cuflow_testing::device::rank_devices;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cuflow-foreign-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn io(e: std::io::Error) -> DeviceError {
    DeviceError::usage(e.to_string())
}

/// Sets `key` of `dir/config.json` to `value`.
fn set_config_field(dir: &Path, key: &str, value: serde_json::Value) -> Result<(), DeviceError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(io)?;
    let mut json: serde_json::Value = serde_json::from_str(&text).expect("the written config");
    json[key] = value;
    std::fs::write(&path, json.to_string()).map_err(io)
}

/// `config.json` fields of Hugging Face architectures other than Llama, or of Llama features
/// the model does not compute, are errors naming the field and its value; the values a Llama
/// checkpoint carries load.
#[test]
fn configs_of_other_models_are_refused() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    let cfg = LlamaConfig::tiny();
    let dir = temp_dir("config");
    write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?)?;
    let refused = [
        ("model_type", serde_json::json!("qwen2"), "\"qwen2\""),
        ("attention_bias", serde_json::json!(true), "attention_bias"),
        ("mlp_bias", serde_json::json!(true), "mlp_bias"),
        ("hidden_act", serde_json::json!("gelu"), "\"gelu\""),
    ];
    for (key, value, named) in refused {
        write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?)?;
        set_config_field(&dir, key, value)?;
        let err = Llama::load(&device, &dir).expect_err(key).to_string();
        assert!(
            err.contains("config.json") && err.contains(key) && err.contains(named),
            "{err}"
        );
    }
    write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?)?;
    for (key, value) in [
        ("model_type", serde_json::json!("llama")),
        ("attention_bias", serde_json::json!(false)),
        ("mlp_bias", serde_json::json!(false)),
        ("hidden_act", serde_json::json!("silu")),
    ] {
        set_config_field(&dir, key, value)?;
    }
    assert_eq!(Llama::load(&device, &dir)?.config(), &cfg);
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

fn extra(name: &str, shape: &[usize], dtype: WeightDtype) -> CheckpointTensor {
    let size = if dtype == WeightDtype::F32 { 4 } else { 2 };
    CheckpointTensor {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        data: vec![0; shape.iter().product::<usize>() * size],
    }
}

/// Writes the tiny checkpoint of `cfg` with `more` tensors added and loads it.
fn load_with(
    name: &str,
    cfg: &LlamaConfig,
    more: Vec<CheckpointTensor>,
) -> Result<Result<Llama, DeviceError>, DeviceError> {
    let mut tensors = synthetic_tensors(cfg, 1, WeightDtype::Bf16)?;
    tensors.extend(more);
    let dir = temp_dir(name);
    write_checkpoint(&dir, cfg, &tensors)?;
    let result = Llama::load(&Device::auto()?, &dir);
    std::fs::remove_dir_all(&dir).ok();
    Ok(result)
}

/// Tensors the model does not read (Qwen2's attention biases, Qwen3's query/key norms) are an
/// error naming them; the rotary tables some older checkpoints carry are not.
#[test]
fn tensors_the_model_does_not_read_are_refused() -> Result<(), DeviceError> {
    let cfg = LlamaConfig::tiny();
    let bias = "model.layers.0.self_attn.q_proj.bias";
    let q_norm = "model.layers.1.self_attn.q_norm.weight";
    let more = vec![
        extra(bias, &[64], WeightDtype::Bf16),
        extra(q_norm, &[16], WeightDtype::Bf16),
    ];
    let err = load_with("unread", &cfg, more)?
        .expect_err("biases and q_norm are not read")
        .to_string();
    assert!(
        err.contains(bias) && err.contains(q_norm) && err.contains("does not read"),
        "{err}"
    );

    let inv_freq = "model.layers.0.self_attn.rotary_emb.inv_freq";
    load_with(
        "inv-freq",
        &cfg,
        vec![extra(inv_freq, &[8], WeightDtype::F32)],
    )??;
    Ok(())
}

/// A second `*.safetensors` file of other tensors in the folder (a LoRA adapter saved beside
/// the model) is an error naming its tensors, not a file quietly skipped.
#[test]
fn an_adapter_file_in_the_folder_is_refused() -> Result<(), DeviceError> {
    let cfg = LlamaConfig::tiny();
    let dir = temp_dir("adapter");
    write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?)?;
    let adapter = temp_dir("adapter-file");
    let lora = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    write_checkpoint(&adapter, &cfg, &[extra(lora, &[8, 64], WeightDtype::Bf16)])?;
    std::fs::copy(
        adapter.join("model.safetensors"),
        dir.join("adapter_model.safetensors"),
    )
    .map_err(io)?;
    let err = Llama::load(&Device::auto()?, &dir)
        .expect_err("an adapter is not part of the model")
        .to_string();
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&adapter).ok();
    assert!(
        err.contains(lora) && err.contains("adapter_model.safetensors"),
        "{err}"
    );
    Ok(())
}

/// A checkpoint whose config ties the embeddings may carry `lm_head.weight` when it is the
/// embedding table (as re-saved tied checkpoints do); another head is an error, not a head
/// quietly replaced by the embeddings.
#[test]
fn a_tied_config_refuses_a_head_other_than_the_embeddings() -> Result<(), DeviceError> {
    let cfg = LlamaConfig {
        tie_word_embeddings: true,
        ..LlamaConfig::tiny()
    };
    let tensors = synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?;
    let embed = tensors
        .iter()
        .find(|t| t.name == "model.embed_tokens.weight")
        .expect("the embeddings")
        .clone();
    let same = CheckpointTensor {
        name: "lm_head.weight".into(),
        ..embed.clone()
    };
    let loaded = load_with("tied-same", &cfg, vec![same.clone()])??;
    assert_eq!(loaded.config(), &cfg);

    let mut other = same;
    other.data[10] ^= 1;
    let err = load_with("tied-other", &cfg, vec![other])?
        .expect_err("another head under tied embeddings")
        .to_string();
    assert!(
        err.contains("lm_head.weight") && err.contains("tie_word_embeddings"),
        "{err}"
    );
    Ok(())
}

/// Under tensor parallelism every rank refuses a tensor the model never reads, though each
/// rank reads only slices of the tensors it does.
#[test]
fn split_loads_refuse_tensors_the_model_does_not_read() -> Result<(), DeviceError> {
    let Some(devices) = rank_devices(2) else {
        return Ok(());
    };
    let comms = Communicator::local(&devices)?;
    let cfg = LlamaConfig::tiny();
    let bias = "model.layers.1.self_attn.k_proj.bias";
    let mut tensors = synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?;
    tensors.push(extra(bias, &[32], WeightDtype::Bf16));
    let dir = temp_dir("split");
    write_checkpoint(&dir, &cfg, &tensors)?;
    // Every rank loads at once, each on its own thread, as load_tp asks.
    let results = cuflow_testing::thread::on_each(&comms, |comm| Llama::load_tp(comm, &dir));
    for r in results {
        let err = r.expect_err("a bias is not read").to_string();
        assert!(err.contains(bias), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

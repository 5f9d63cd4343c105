//! Loading Hugging Face checkpoints written by `testing`: the same model as the synthetic
//! weights, and errors that name the tensor or the file.

use std::path::PathBuf;

use cuflow_models::llama::testing::{synthetic_tensors, write_checkpoint, WeightDtype};
use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::{Device, DeviceError};

const PROMPT: [u32; 4] = [7, 99, 1, 250];

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cuflow-llama-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn loaded_checkpoints_equal_synthetic_weights() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    let stream = device.new_stream()?;
    let cfg = LlamaConfig::tiny();
    let synthetic = Llama::synthetic(&device, cfg.clone(), 21)?;
    let want = synthetic.prefill_logits(&stream, &PROMPT)?;
    let want_ids = synthetic.generate(&stream, &PROMPT, 6, &GenerateOptions::greedy())?;
    // bf16 and f32 files hold the same values exactly; f16 ones round some small values.
    for dtype in [WeightDtype::Bf16, WeightDtype::F32, WeightDtype::F16] {
        let dir = temp_dir(&format!("{dtype:?}"));
        write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 21, dtype))?;
        let loaded = Llama::load(&device, &dir)?;
        assert_eq!(loaded.config(), &cfg);
        let stats = loaded.load_stats().expect("a loaded model has load stats");
        assert!(stats.bytes > 0 && stats.gb_per_s() > 0.0);
        let got = loaded.prefill_logits(&stream, &PROMPT)?;
        if dtype == WeightDtype::F16 {
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(diff < 5e-2, "f16 checkpoint: logits differ by {diff}");
        } else {
            assert_eq!(got, want, "{dtype:?} checkpoint");
            assert_eq!(
                loaded.generate(&stream, &PROMPT, 6, &GenerateOptions::greedy())?,
                want_ids
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
    Ok(())
}

/// Writes the tiny checkpoint with `edit` applied to its tensors and loads it.
fn load_edited(
    name: &str,
    edit: impl FnOnce(&mut Vec<cuflow_models::llama::testing::CheckpointTensor>),
) -> Result<String, DeviceError> {
    let cfg = LlamaConfig::tiny();
    let mut tensors = synthetic_tensors(&cfg, 1, WeightDtype::Bf16);
    edit(&mut tensors);
    let dir = temp_dir(name);
    write_checkpoint(&dir, &cfg, &tensors)?;
    let result = Llama::load(&Device::auto()?, &dir);
    std::fs::remove_dir_all(&dir).ok();
    Ok(result
        .expect_err("the edited checkpoint must not load")
        .to_string())
}

#[test]
fn checkpoint_errors_name_the_tensor() -> Result<(), DeviceError> {
    let name = "model.layers.1.self_attn.k_proj.weight";
    let missing = load_edited("missing", |t| t.retain(|t| t.name != name))?;
    assert!(
        missing.contains(name) && missing.contains("missing"),
        "{missing}"
    );

    let shape = load_edited("shape", |t| {
        let t = t.iter_mut().find(|t| t.name == name).expect("k_proj");
        t.shape = vec![t.shape[1], t.shape[0]];
    })?;
    assert!(
        shape.contains(name) && shape.contains("shape [64, 32]"),
        "{shape}"
    );

    let dtype = load_edited("dtype", |t| {
        let t = t
            .iter_mut()
            .find(|t| t.name == "model.norm.weight")
            .expect("norm");
        t.dtype = WeightDtype::I32;
        t.data = t.data.iter().flat_map(|&b| [b, b]).collect();
    })?;
    assert!(
        dtype.contains("model.norm.weight") && dtype.contains("I32"),
        "{dtype}"
    );
    Ok(())
}

#[test]
fn bad_configs_and_folders_are_errors() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    let cfg = LlamaConfig::tiny();
    let dir = temp_dir("config");
    write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 1, WeightDtype::Bf16))?;
    let config = dir.join("config.json");

    std::fs::write(&config, "{ not json").map_err(|e| DeviceError::usage(e.to_string()))?;
    let err = Llama::load(&device, &dir).unwrap_err().to_string();
    assert!(
        err.contains("config.json") && err.contains("not a Llama config.json"),
        "{err}"
    );

    let odd = LlamaConfig {
        num_key_value_heads: Some(3),
        ..cfg.clone()
    };
    std::fs::write(&config, serde_json::to_string(&odd).expect("json"))
        .map_err(|e| DeviceError::usage(e.to_string()))?;
    let err = Llama::load(&device, &dir).unwrap_err().to_string();
    assert!(err.contains("num_key_value_heads 3"), "{err}");

    std::fs::remove_file(dir.join("model.safetensors")).ok();
    std::fs::write(&config, serde_json::to_string(&cfg).expect("json"))
        .map_err(|e| DeviceError::usage(e.to_string()))?;
    let err = Llama::load(&device, &dir).unwrap_err().to_string();
    assert!(err.contains("no *.safetensors"), "{err}");
    std::fs::remove_dir_all(&dir).ok();

    let err = Llama::load(&device, temp_dir("absent"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("config.json"), "{err}");
    Ok(())
}

//! Loading Hugging Face checkpoints written by `testing`: the same model as the synthetic
//! weights, and errors that name the tensor or the file.

use std::path::{Path, PathBuf};

use cuflow_models::llama::testing::{
    synthetic_tensors, write_checkpoint, write_sparse_checkpoint, WeightDtype,
};
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
        write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 21, dtype)?)?;
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

/// Writes the tiny checkpoint with `edit` applied to its tensors and loads it; the load must
/// fail (not panic), and its message is returned.
fn load_edited(
    name: &str,
    edit: impl FnOnce(&mut Vec<cuflow_models::llama::testing::CheckpointTensor>),
) -> Result<String, DeviceError> {
    load_changed(name, edit, |_| ())
}

/// Writes the tiny checkpoint, its tensors changed by `tensors` before and its files by
/// `files` after, into a folder of its own and loads it; the load must fail (not panic), and
/// its message is returned.
fn load_changed(
    name: &str,
    tensors: impl FnOnce(&mut Vec<cuflow_models::llama::testing::CheckpointTensor>),
    files: impl FnOnce(&Path),
) -> Result<String, DeviceError> {
    let cfg = LlamaConfig::tiny();
    let mut written = synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?;
    tensors(&mut written);
    let dir = temp_dir(name);
    write_checkpoint(&dir, &cfg, &written)?;
    files(&dir);
    let result = Llama::load(&Device::auto()?, &dir);
    std::fs::remove_dir_all(&dir).ok();
    Ok(result
        .expect_err("the changed checkpoint must not load")
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
    write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?)?;
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

/// Rewrites the header of `dir/model.safetensors` with `edit` applied to its JSON table (the
/// data offsets count from the end of the header, so the tensors' bytes stay valid).
fn edit_header(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).expect("the written checkpoint");
    let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let mut table: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + len]).expect("a JSON header");
    edit(&mut table);
    let header = serde_json::to_vec(&table).expect("JSON");
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&bytes[8 + len..]);
    std::fs::write(&path, out).expect("rewrite the checkpoint");
}

/// [`load_changed`] with the header edited by `edit`.
fn load_with_header(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> Result<String, DeviceError> {
    load_changed(name, |_| (), |dir| edit_header(dir, edit))
}

/// The header's byte ranges are checked before any tensor is read: a range past every
/// address (which overflows the file offset) and a range shorter than the tensor's shape and
/// dtype imply (which would read the bytes of the tensors after it) are errors naming the
/// tensor and the bytes.
#[test]
fn corrupt_byte_ranges_are_errors_naming_the_tensor() -> Result<(), DeviceError> {
    let norm = "model.norm.weight";
    let err = load_with_header("offsets-overflow", |t| {
        t[norm]["data_offsets"] = serde_json::json!([0u64, u64::MAX]);
    })?;
    assert!(
        err.contains(norm) && err.contains(&u64::MAX.to_string()),
        "{err}"
    );

    // Reversed, the range ends before it begins: named so, not as past the end.
    let err = load_with_header("offsets-reversed", |t| {
        let range = t[norm]["data_offsets"].clone();
        t[norm]["data_offsets"] = serde_json::json!([range[1], range[0]]);
    })?;
    assert!(
        err.contains(norm) && err.contains("before") && !err.contains("past the end"),
        "{err}"
    );

    // The embedding table is [256, 64] of bf16: 32768 bytes; its header claims 16.
    let embed = "model.embed_tokens.weight";
    let err = load_with_header("short-range", |t| {
        let begin = t[embed]["data_offsets"][0].as_u64().expect("an offset");
        t[embed]["data_offsets"] = serde_json::json!([begin, begin + 16]);
    })?;
    assert!(
        err.contains(embed) && err.contains("16 bytes") && err.contains("32768"),
        "{err}"
    );
    Ok(())
}

/// Two tensors whose byte ranges overlap (a header edited to point the final norm at the first
/// layer's norm, which has its shape and dtype) are an error naming both, not two tensors read
/// from the same bytes.
#[test]
fn overlapping_byte_ranges_are_errors_naming_both_tensors() -> Result<(), DeviceError> {
    let (norm, first) = ("model.norm.weight", "model.layers.0.input_layernorm.weight");
    let err = load_with_header("overlap", |t| {
        t[norm]["data_offsets"] = t[first]["data_offsets"].clone();
    })?;
    assert!(
        err.contains(norm) && err.contains(first) && err.contains("overlap"),
        "{err}"
    );

    // A range that starts inside another and runs past it overlaps too.
    let err = load_with_header("overlap-partial", |t| {
        let begin = t[first]["data_offsets"][0].as_u64().expect("an offset");
        t[norm]["data_offsets"] = serde_json::json!([begin + 64, begin + 192]);
    })?;
    assert!(
        err.contains(norm) && err.contains(first) && err.contains("overlap"),
        "{err}"
    );
    Ok(())
}

/// The header text of `dir/model.safetensors` (with the spaces that pad it) and the bytes
/// after it.
fn read_raw(dir: &Path) -> (String, Vec<u8>) {
    let bytes = std::fs::read(dir.join("model.safetensors")).expect("the written checkpoint");
    let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = String::from_utf8(bytes[8..8 + len].to_vec()).expect("a JSON header");
    (header, bytes[8 + len..].to_vec())
}

/// Writes `dir/model.safetensors` as the header length `len`, the text `header` as it is
/// (names may repeat in it) and `data`.
fn write_raw(dir: &Path, len: u64, header: &str, data: &[u8]) {
    let mut out = len.to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(dir.join("model.safetensors"), out).expect("rewrite the checkpoint");
}

/// [`load_changed`] with `model.safetensors` rewritten by `edit` (of its header text and data,
/// returning the header length to write).
fn load_raw(
    name: &str,
    edit: impl FnOnce(&mut String, &mut Vec<u8>) -> u64,
) -> Result<String, DeviceError> {
    load_changed(
        name,
        |_| (),
        |dir| {
            let (mut header, mut data) = read_raw(dir);
            let len = edit(&mut header, &mut data);
            write_raw(dir, len, &header, &data);
        },
    )
}

/// A header that lists a tensor twice (JSON leaves repeated keys to the reader) is an error
/// naming it, not a load of whichever entry the reader keeps: here the second entry of the
/// final norm points at zeros appended to the data.
#[test]
fn a_tensor_listed_twice_in_one_header_is_an_error() -> Result<(), DeviceError> {
    let norm = "model.norm.weight";
    let err = load_raw("listed-twice", |header, data| {
        let begin = data.len();
        data.resize(begin + 128, 0);
        let json = header.trim_end().strip_suffix('}').expect("a JSON object");
        let entry = serde_json::json!({
            "dtype": "BF16", "shape": [64], "data_offsets": [begin, begin + 128]
        });
        *header = format!("{json},\"{norm}\":{entry}}}");
        header.len() as u64
    })?;
    assert!(
        err.contains(norm) && err.contains("model.safetensors") && err.contains("twice"),
        "{err}"
    );
    Ok(())
}

/// Every byte of a safetensors file's data belongs to one tensor, as the format requires: a
/// header length that ends inside the spaces padding the header (which shifts every tensor
/// by a byte), bytes after the last tensor, and bytes no tensor holds between two are errors
/// naming the file, not a model read from the wrong bytes.
#[test]
fn bytes_no_tensor_holds_are_an_error() -> Result<(), DeviceError> {
    let file = "model.safetensors";
    let shifted = load_raw("shifted", |header, _| {
        header.push_str("   ");
        header.len() as u64 - 1
    })?;
    assert!(
        shifted.contains(file) && shifted.contains("no tensor"),
        "{shifted}"
    );

    let appended = load_raw("appended", |header, data| {
        data.extend_from_slice(&[0; 7]);
        header.len() as u64
    })?;
    assert!(
        appended.contains(file) && appended.contains("no tensor"),
        "{appended}"
    );

    // The final norm moved to bytes after the others: its old bytes are held by none.
    let norm = "model.norm.weight";
    let hole = load_raw("hole", |header, data| {
        let mut table: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(header).expect("a JSON header");
        let begin = data.len();
        data.resize(begin + 128, 0);
        table[norm]["data_offsets"] = serde_json::json!([begin, begin + 128]);
        *header = serde_json::to_string(&table).expect("JSON");
        header.len() as u64
    })?;
    assert!(
        hole.contains(file) && hole.contains("no tensor") && hole.contains(norm),
        "{hole}"
    );
    Ok(())
}

/// A tensor found in two files of one folder (a stale shard beside a new download) is an
/// error naming it and both files, not whichever file sorts last.
#[test]
fn a_tensor_in_two_files_is_an_error() -> Result<(), DeviceError> {
    let cfg = LlamaConfig::tiny();
    let dir = temp_dir("twice");
    write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?)?;
    let other = temp_dir("twice-other");
    write_checkpoint(
        &other,
        &cfg,
        &synthetic_tensors(&cfg, 2, WeightDtype::Bf16)?,
    )?;
    std::fs::copy(
        other.join("model.safetensors"),
        dir.join("model-00002-of-00002.safetensors"),
    )
    .map_err(|e| DeviceError::usage(e.to_string()))?;
    let err = Llama::load(&Device::auto()?, &dir)
        .expect_err("a tensor held twice must not load")
        .to_string();
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&other).ok();
    assert!(
        err.contains("model.safetensors")
            && err.contains("model-00002-of-00002.safetensors")
            && err.contains(".weight` is in both"),
        "{err}"
    );
    Ok(())
}

/// A config that does not describe the checkpoint is found out before any weight is
/// allocated: a config whose MLP is 32768 times wider than the files' asks for gigabytes,
/// and gets an error naming the tensor. (On a host device of its own, so that its memory
/// pool's high-water mark counts this load only.)
#[test]
fn a_config_larger_than_its_checkpoint_allocates_nothing() -> Result<(), DeviceError> {
    let cfg = LlamaConfig::tiny();
    let dir = temp_dir("wide");
    write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?)?;
    let wide = LlamaConfig {
        intermediate_size: 128 << 15,
        ..cfg
    };
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string(&wide).expect("json"),
    )
    .map_err(|e| DeviceError::usage(e.to_string()))?;
    let device = Device::host_numbered(23);
    let err = Llama::load(&device, &dir)
        .expect_err("the config does not match")
        .to_string();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        err.contains("model.layers.0.mlp.gate_proj.weight") && err.contains("[4194304, 64]"),
        "{err}"
    );
    let stats = device.memory_pool().stats()?;
    assert_eq!(
        stats.peak_in_use, 0,
        "the load allocated device memory before checking the checkpoint: {stats:?}"
    );
    Ok(())
}

/// Sizes whose products overflow (heads times head width, vocabulary times hidden size) are
/// errors naming the fields, from `validate`, `synthetic` and `load` alike, never a panic.
#[test]
fn configs_whose_sizes_overflow_are_errors() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    let tiny = LlamaConfig::tiny();
    let cases = [
        (
            "num_attention_heads",
            LlamaConfig {
                num_attention_heads: 1 << 60,
                num_key_value_heads: Some(1 << 60),
                head_dim: Some(64),
                ..tiny.clone()
            },
        ),
        (
            "hidden_size",
            LlamaConfig {
                hidden_size: 1 << 61,
                num_attention_heads: 1 << 56,
                num_key_value_heads: Some(1 << 56),
                vocab_size: 1 << 20,
                ..tiny.clone()
            },
        ),
        (
            "intermediate_size",
            LlamaConfig {
                intermediate_size: 1 << 60,
                ..tiny.clone()
            },
        ),
    ];
    let dir = temp_dir("overflow");
    write_checkpoint(
        &dir,
        &tiny,
        &synthetic_tensors(&tiny, 1, WeightDtype::Bf16)?,
    )?;
    for (field, cfg) in cases {
        let err = cfg.validate().expect_err(field).to_string();
        assert!(err.contains(field) && err.contains("overflow"), "{err}");
        let err = Llama::synthetic(&device, cfg.clone(), 1)
            .expect_err(field)
            .to_string();
        assert!(err.contains(field), "{err}");
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_string(&cfg).expect("json"),
        )
        .map_err(|e| DeviceError::usage(e.to_string()))?;
        let err = Llama::load(&device, &dir).expect_err(field).to_string();
        assert!(err.contains(field) && err.contains("config.json"), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// A config of absurdly many layers over a two-layer checkpoint is an error naming the first
/// missing tensor, found without listing (or allocating for) the layers it does not have.
#[test]
fn a_config_of_more_layers_than_its_checkpoint_names_the_first_missing_one(
) -> Result<(), DeviceError> {
    let cfg = LlamaConfig::tiny();
    let dir = temp_dir("deep");
    write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, 1, WeightDtype::Bf16)?)?;
    let deep = LlamaConfig {
        num_hidden_layers: 1 << 40,
        ..cfg
    };
    deep.validate()?;
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string(&deep).expect("json"),
    )
    .map_err(|e| DeviceError::usage(e.to_string()))?;
    let device = Device::host_numbered(24);
    let err = Llama::load(&device, &dir)
        .expect_err("two layers of 2^40")
        .to_string();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        err.contains("model.layers.2.input_layernorm.weight") && err.contains("missing"),
        "{err}"
    );
    assert_eq!(device.memory_pool().stats()?.peak_in_use, 0);
    Ok(())
}

/// A synthetic model whose weights fit `usize` but not the device (nor the host memory that
/// stages them) is an `OutOfMemory` error before anything is allocated, never an aborted
/// process: 24 layers of hidden size 2^16 are some 2.6 · 10^12 bf16 weights, 5 TB.
#[test]
fn a_synthetic_model_larger_than_the_device_is_an_error() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    let cfg = LlamaConfig {
        hidden_size: 1 << 16,
        intermediate_size: 1 << 18,
        num_hidden_layers: 24,
        num_attention_heads: 1 << 10,
        num_key_value_heads: Some(1 << 8),
        head_dim: Some(64),
        ..LlamaConfig::tiny()
    };
    cfg.validate()?;
    let before = device.bytes_in_use();
    let err = Llama::synthetic(&device, cfg, 1).expect_err("5 TB of weights");
    assert!(
        matches!(err, DeviceError::OutOfMemory { bytes, .. } if bytes > 1 << 40),
        "{err}"
    );
    assert_eq!(device.bytes_in_use(), before, "nothing stays allocated");
    Ok(())
}

/// A checkpoint whose weights (their shapes and byte ranges all consistent with its config)
/// are larger than the device's memory is an `OutOfMemory` error before anything is
/// allocated, not a load that fills memory until an allocation fails or, on the host backend,
/// until the process is killed. The file is sparse: 128 layers of hidden size 2^14 and MLP
/// 2^16 are some 4.9 · 10^11 bf16 weights, 0.98 TB that take no disk space.
#[test]
fn a_checkpoint_larger_than_the_device_is_an_error() -> Result<(), DeviceError> {
    let device = cuflow_testing::device::device();
    let cfg = LlamaConfig {
        hidden_size: 1 << 14,
        intermediate_size: 1 << 16,
        num_hidden_layers: 128,
        num_attention_heads: 128,
        num_key_value_heads: Some(16),
        head_dim: Some(128),
        ..LlamaConfig::tiny()
    };
    cfg.validate()?;
    let dir = temp_dir("larger-than-device");
    write_sparse_checkpoint(&dir, &cfg)?;
    let err = Llama::load(&device, &dir).expect_err("0.98 TB of weights");
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        matches!(err, DeviceError::OutOfMemory { bytes, .. } if bytes > 900 << 30),
        "{err}"
    );
    Ok(())
}

/// The checkpoint writer refuses tensors it cannot write, naming them, before it writes
/// anything: a name given twice, and shapes whose byte count does not match the data or
/// overflows (which would be multiplied out unchecked, and wrap, past it).
#[test]
fn the_checkpoint_writer_refuses_tensors_it_cannot_write() {
    use cuflow_models::llama::testing::CheckpointTensor;
    let dir = temp_dir("writer-refusals");
    let one = CheckpointTensor {
        name: "y".into(),
        dtype: WeightDtype::F32,
        shape: vec![1],
        data: 1f32.to_le_bytes().to_vec(),
    };
    let cases = [
        (vec![one.clone(), one.clone()], "given twice"),
        (
            vec![CheckpointTensor {
                shape: vec![usize::MAX, 2],
                data: vec![],
                ..one.clone()
            }],
            "more bytes than this machine can address",
        ),
        (
            vec![CheckpointTensor {
                shape: vec![1 << 62, 4],
                data: vec![],
                ..one.clone()
            }],
            "more bytes than this machine can address",
        ),
        (
            vec![CheckpointTensor {
                shape: vec![2],
                ..one.clone()
            }],
            "4 bytes do not hold [2]",
        ),
    ];
    for (tensors, why) in cases {
        let e = write_checkpoint(&dir, &LlamaConfig::tiny(), &tensors)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("`y`") && e.contains(why), "{why}: {e}");
        assert!(!dir.exists(), "{why}: nothing is written");
    }
}

/// The synthetic-checkpoint helpers refuse configs they cannot make, before they make
/// anything: weights larger than the host's memory (which `LlamaConfig::validate` allows),
/// and more layers than a checkpoint's header can list.
#[test]
fn the_synthetic_checkpoint_helpers_refuse_configs_they_cannot_make() {
    let mut huge = LlamaConfig::tiny();
    // Some 1.1 TB of weights, more than any host here holds.
    huge.vocab_size = 1 << 30;
    huge.intermediate_size = 1 << 30;
    let e = synthetic_tensors(&huge, 1, WeightDtype::Bf16).expect_err("refused");
    assert!(matches!(e, DeviceError::OutOfMemory { .. }), "{e}");
    let mut many_layers = LlamaConfig::tiny();
    many_layers.num_hidden_layers = 1 << 36;
    let dir = temp_dir("too-many-layers");
    for e in [
        synthetic_tensors(&many_layers, 1, WeightDtype::Bf16).expect_err("refused"),
        write_sparse_checkpoint(&dir, &many_layers).expect_err("refused"),
    ] {
        assert!(
            matches!(&e, DeviceError::Usage { .. }) && e.to_string().contains("header"),
            "{e}"
        );
    }
    assert!(!dir.exists(), "nothing is written");
}

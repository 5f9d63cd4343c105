//! Tensor-parallel loading of checkpoints written by `testing`: each rank's slice of a `bf16`
//! or `f32` checkpoint is the one `synthetic_tp` makes of the same weights, and the ranks
//! together generate the tokens of the whole checkpoint on one device.

use cuflow_testing::thread::on_each;

use std::path::{Path, PathBuf};

use cuflow_dist::Communicator;
use cuflow_models::llama::testing::{
    synthetic_tensors, write_checkpoint, write_sparse_checkpoint, WeightDtype,
};
use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::{DeviceError, Stream};
use cuflow_testing::device::{device, rank_devices};

const SEED: u64 = 13;
const PROMPT: [u32; 5] = [8, 201, 33, 4, 97];
const TOKENS: usize = 6;

/// The tiny model with as many key/value heads as query heads, so that 4 ranks split both.
fn config() -> LlamaConfig {
    let mut cfg = LlamaConfig::tiny();
    cfg.num_key_value_heads = Some(cfg.num_attention_heads);
    cfg
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cuflow-load-tp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// What one rank computes: greedy tokens, prefill logits and the logits of one decode step.
type RankResult = (Vec<u32>, Vec<f32>, Vec<f32>);

fn run(model: &Llama, stream: &Stream) -> Result<RankResult, DeviceError> {
    let tokens = model.generate(stream, &PROMPT, TOKENS, &GenerateOptions::greedy())?;
    let prefill = model.prefill_logits(stream, &PROMPT)?;
    let step = model.decode_logits(stream, &PROMPT[..1])?;
    Ok((tokens, prefill, step))
}

/// `load_tp` of `dir` and `synthetic_tp` of the same weights over `tp` ranks: each rank's
/// results, both ways.
fn loaded_and_synthetic(dir: &Path, tp: usize) -> Option<Vec<(RankResult, RankResult)>> {
    // Bound for the whole run: under CUDA the devices hold this group's turn.
    let devices = rank_devices(tp)?;
    let comms = Communicator::local(&devices).unwrap();
    let results: Vec<Result<_, DeviceError>> = on_each(&comms, |c| {
        let loaded = Llama::load_tp(c, dir)?;
        assert_eq!(loaded.config(), &config());
        let stats = loaded.load_stats().expect("a loaded slice has load stats");
        assert!(stats.bytes > 0 && stats.seconds >= 0.0);
        let synthetic = Llama::synthetic_tp(c, config(), SEED)?;
        assert_eq!(loaded.weight_bytes(), synthetic.weight_bytes());
        Ok((run(&loaded, c.stream())?, run(&synthetic, c.stream())?))
    });
    Some(results.into_iter().map(Result::unwrap).collect())
}

#[test]
fn loaded_slices_equal_synthetic_slices_and_the_whole_model() -> Result<(), DeviceError> {
    let cfg = config();
    let whole_device = device();
    let stream = whole_device.new_stream()?;
    // bf16 and f32 files hold the same (bf16) values, so both load into the same weights.
    for dtype in [WeightDtype::Bf16, WeightDtype::F32] {
        let dir = temp_dir(&format!("{dtype:?}"));
        write_checkpoint(&dir, &cfg, &synthetic_tensors(&cfg, SEED, dtype)?)?;
        let whole = Llama::load(&whole_device, &dir)?;
        let want = whole.generate(&stream, &PROMPT, TOKENS, &GenerateOptions::greedy())?;
        let whole_bytes = whole.load_stats().expect("load stats").bytes;
        for tp in [1, 2, 4] {
            let Some(results) = loaded_and_synthetic(&dir, tp) else {
                continue;
            };
            for (rank, (loaded, synthetic)) in results.into_iter().enumerate() {
                let what = format!("{dtype:?} checkpoint, rank {rank} of {tp}");
                assert_eq!(loaded.0, want, "{what}: tokens of the whole model");
                // The same weights through the same kernels: the same bits.
                assert_eq!(loaded.0, synthetic.0, "{what}: tokens of synthetic_tp");
                assert_eq!(loaded.1, synthetic.1, "{what}: prefill logits");
                assert_eq!(loaded.2, synthetic.2, "{what}: decode logits");
            }
        }
        // One rank reads exactly what `load` reads.
        let devices = rank_devices(1).expect("one device");
        let comms = Communicator::local(&devices)?;
        let single = Llama::load_tp(&comms[0], &dir)?;
        assert_eq!(single.load_stats().expect("load stats").bytes, whole_bytes);
        std::fs::remove_dir_all(&dir).ok();
    }
    Ok(())
}

/// Ranks given two checkpoints of the same config but other weights: each rank's slice is of
/// another model, and the sums of their partial results would be no model's. Every rank is
/// refused, naming the rank that differs, before any has a model.
#[test]
fn ranks_loading_checkpoints_of_one_config_with_other_weights_are_refused(
) -> Result<(), DeviceError> {
    let Some(devices) = rank_devices(2) else {
        return Ok(());
    };
    let dirs = [temp_dir("weights-a"), temp_dir("weights-b")];
    for (dir, seed) in dirs.iter().zip([SEED, SEED + 1]) {
        write_checkpoint(
            dir,
            &config(),
            &synthetic_tensors(&config(), seed, WeightDtype::Bf16)?,
        )?;
    }
    let comms = Communicator::local(&devices)?;
    for r in on_each(&comms, |c| Llama::load_tp(c, &dirs[c.rank()])) {
        let e = r.expect_err("slices of two models are refused").to_string();
        assert!(e.contains("rank 1") && e.contains("differs"), "{e}");
    }
    for dir in &dirs {
        std::fs::remove_dir_all(dir).ok();
    }
    Ok(())
}

#[test]
fn a_split_that_does_not_divide_the_checkpoint_is_an_error() -> Result<(), DeviceError> {
    let dir = temp_dir("split");
    // The tiny model has 4 query heads and 2 key/value heads.
    let cfg = LlamaConfig::tiny();
    write_checkpoint(
        &dir,
        &cfg,
        &synthetic_tensors(&cfg, SEED, WeightDtype::Bf16)?,
    )?;
    for (tp, what) in [
        (3, "num_attention_heads (4)"),
        (4, "num_key_value_heads (2)"),
    ] {
        let Some(devices) = rank_devices(tp) else {
            continue;
        };
        let comms = Communicator::local(&devices)?;
        // Every rank loads at once, as load_tp asks: the ranks agree before any has a model.
        for r in on_each(&comms, |c| Llama::load_tp(c, &dir)) {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains(what) && e.contains(&format!("{tp} ranks")),
                "{e}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

#[test]
fn checkpoint_errors_name_the_tensor_under_a_split() -> Result<(), DeviceError> {
    let Some(devices) = rank_devices(2) else {
        return Ok(());
    };
    let comms = Communicator::local(&devices)?;
    let cfg = LlamaConfig::tiny();
    let name = "model.layers.1.self_attn.o_proj.weight";
    let load_edited = |what: &str, edit: &dyn Fn(&mut Vec<_>)| -> Result<String, DeviceError> {
        let mut tensors = synthetic_tensors(&cfg, SEED, WeightDtype::Bf16)?;
        edit(&mut tensors);
        let dir = temp_dir(what);
        write_checkpoint(&dir, &cfg, &tensors)?;
        // Every rank loads at once, as load_tp asks; rank 1's own error is looked at.
        let mut results = on_each(&comms, |c| Llama::load_tp(c, &dir));
        std::fs::remove_dir_all(&dir).ok();
        let e = results
            .swap_remove(1)
            .expect_err("an edited checkpoint must not load");
        Ok(e.to_string())
    };
    let missing = load_edited("missing", &|t| t.retain(|t| t.name != name))?;
    assert!(
        missing.contains(name) && missing.contains("missing"),
        "{missing}"
    );
    let shape = load_edited("shape", &|t| {
        let t = t.iter_mut().find(|t| t.name == name).expect("o_proj");
        t.shape = vec![t.shape[1] / 2, t.shape[0] * 2];
    })?;
    // The whole tensor's shape, not the slice's, is what the file is checked against.
    assert!(
        shape.contains(name) && shape.contains("[32, 128]") && shape.contains("[64, 64]"),
        "{shape}"
    );
    let dtype = load_edited("dtype", &|t| {
        let t = t.iter_mut().find(|t| t.name == name).expect("o_proj");
        t.dtype = WeightDtype::I32;
        t.data = t.data.iter().flat_map(|&b| [b, b]).collect();
    })?;
    assert!(dtype.contains(name) && dtype.contains("I32"), "{dtype}");
    Ok(())
}

/// Host ranks share the host's memory: a checkpoint whose slices each fit it but together do
/// not is an `OutOfMemory` error on every rank before anything is allocated, not ranks that
/// fill the memory between them until the process is killed. The checkpoint is sparse, and
/// half as large again as the host's memory. (On CUDA each rank has a device of its own, which
/// `a_checkpoint_larger_than_the_device_is_an_error` covers.)
#[test]
fn host_ranks_refuse_slices_that_fit_the_host_only_one_at_a_time() -> Result<(), DeviceError> {
    let Some(devices) = rank_devices(2) else {
        return Ok(());
    };
    let total = devices[0].memory_info()?.total;
    if devices[0].kind() != cuflow_runtime::BackendKind::Host || total == 0 {
        return Ok(());
    }
    let layer = LlamaConfig {
        hidden_size: 1 << 12,
        intermediate_size: 1 << 14,
        num_hidden_layers: 1,
        num_attention_heads: 32,
        num_key_value_heads: Some(32),
        head_dim: Some(128),
        ..LlamaConfig::tiny()
    };
    let cfg = LlamaConfig {
        num_hidden_layers: (total / 2 * 3).div_ceil(layer.parameter_count() * 2),
        ..layer
    };
    let dir = temp_dir("shared-host");
    let bytes = write_sparse_checkpoint(&dir, &cfg)?;
    let comms = Communicator::local(&devices)?;
    let results = on_each(&comms, |c| Llama::load_tp(c, &dir));
    std::fs::remove_dir_all(&dir).ok();
    for result in results {
        let err = result.expect_err("slices larger than the host between them");
        assert!(
            matches!(err, DeviceError::OutOfMemory { bytes: b, .. } if b >= bytes),
            "{err}"
        );
    }
    Ok(())
}

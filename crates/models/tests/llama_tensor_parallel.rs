//! Tensor-parallel decoding: the tiny synthetic model split over 2 and 4 ranks gives the
//! tokens and (within rounding) the logits of the whole model on one device, eagerly and
//! replayed.

use cuflow_testing::thread::on_each;

use std::sync::{Mutex, MutexGuard, PoisonError};

use cuflow_dist::Communicator;
use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::{BackendKind, Device, DeviceError};
use cuflow_testing::device::{device, rank_devices};
use cuflow_testing::measure::assert_close_in_norm;

const SEED: u64 = 11;
const PROMPT: [u32; 5] = [3, 141, 59, 26, 5];
const TOKENS: usize = 6;

/// Held by the tests that use the first CUDA devices: one of them compares a device's bytes in
/// use before and after, which counts the buffers of every test on that device (on the host
/// backend that test has devices of its own).
static CUDA_DEVICES: Mutex<()> = Mutex::new(());

/// Takes [`CUDA_DEVICES`]; a test that panicked holding it leaves nothing the others rely on.
fn cuda_devices() -> MutexGuard<'static, ()> {
    CUDA_DEVICES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The tiny model with as many key/value heads as query heads, so that 4 ranks split both.
fn config() -> LlamaConfig {
    let mut cfg = LlamaConfig::tiny();
    cfg.num_key_value_heads = Some(cfg.num_attention_heads);
    cfg
}

/// What one rank computes: eager tokens, replayed tokens, prefill logits, decode logits after
/// the prompt, and decode logits of one step from an empty cache.
type RankResult = (Vec<u32>, Vec<u32>, Vec<f32>, Vec<f32>, Vec<f32>);

fn run(model: &Llama, stream: &cuflow_runtime::Stream) -> Result<RankResult, DeviceError> {
    let greedy = GenerateOptions::greedy();
    let eager = model.generate(stream, &PROMPT, TOKENS, &greedy)?;
    let mut step = model.capture(stream, greedy.max_seq(32))?;
    let replayed = step.generate(&PROMPT, TOKENS)?;
    let prefill = model.prefill_logits(stream, &PROMPT)?;
    let decode = model.decode_logits(stream, &PROMPT)?;
    let first_step = model.decode_logits(stream, &PROMPT[..1])?;
    Ok((eager, replayed, prefill, decode, first_step))
}

#[test]
fn split_models_decode_like_the_whole_model() {
    let _devices = cuda_devices();
    let cfg = config();
    let whole_device = device();
    let whole = Llama::synthetic(&whole_device, cfg.clone(), SEED).unwrap();
    let (tokens, replayed, prefill, decode, first_step) =
        run(&whole, &whole_device.new_stream().unwrap()).unwrap();
    assert_eq!(tokens, replayed);
    let as_f64 = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    for tp in [2, 4] {
        let Some(devices) = rank_devices(tp) else {
            continue;
        };
        let comms = Communicator::local(&devices).unwrap();
        let results: Vec<RankResult> = on_each(&comms, |c| {
            let model = Llama::synthetic_tp(c, cfg.clone(), SEED)?;
            assert_eq!(model.config(), &config());
            run(&model, c.stream())
        })
        .into_iter()
        .map(Result::unwrap)
        .collect();
        for (rank, (eager, replayed_tp, prefill_tp, decode_tp, first_tp)) in
            results.into_iter().enumerate()
        {
            let what = |x: &str| format!("{x}, rank {rank} of {tp}");
            assert_eq!(eager, tokens, "{}", what("eager tokens"));
            assert_eq!(replayed_tp, tokens, "{}", what("replayed tokens"));
            // Prefill's matrix products round their outputs to bf16, each rank's partial
            // product apart: bf16's tolerance, also for the decode step that reads the caches
            // prefill wrote. A decode step alone adds in f32 (only the order of the sums
            // differs).
            assert_close_in_norm(
                &what("prefill logits"),
                &prefill_tp,
                &as_f64(&prefill),
                3e-2,
            );
            assert_close_in_norm(&what("decode logits"), &decode_tp, &as_f64(&decode), 3e-2);
            let first = as_f64(&first_step);
            assert_close_in_norm(&what("one decode step"), &first_tp, &first, 1e-5);
        }
    }
}

#[test]
fn a_split_that_does_not_divide_the_heads_is_an_error() {
    let _devices = cuda_devices();
    let Some(devices) = rank_devices(4) else {
        return;
    };
    let comms = Communicator::local(&devices).unwrap();
    // The tiny model has 2 key/value heads: 4 ranks cannot split them. Every rank makes its
    // slice at once, as synthetic_tp asks: the ranks agree before any has a model.
    for r in on_each(&comms, |c| {
        Llama::synthetic_tp(c, LlamaConfig::tiny(), SEED)
    }) {
        let e = r.unwrap_err();
        assert!(e.to_string().contains("num_key_value_heads (2)"), "{e}");
    }
}

/// A split model larger than memory is an `OutOfMemory` error before anything is made, as
/// for `synthetic`: every rank makes the whole model's weights in host memory before taking
/// its slice (each of the host's ranks at once), and a vocabulary of 2^30 by a hidden size of
/// 2^16 is an embedding table alone of 2^47 bf16 weights, 256 TB.
#[test]
fn a_split_model_larger_than_memory_is_an_error() {
    let _devices = cuda_devices();
    let Some(devices) = rank_devices(2) else {
        return;
    };
    // `bytes_in_use` counts the buffers of every test on a device, and the other tests of this
    // binary run at once on host devices 0..4: on the host backend, devices of this test's own.
    let devices = match devices[0].kind() {
        BackendKind::Host => vec![Device::host_numbered(16), Device::host_numbered(17)],
        _ => devices.to_vec(),
    };
    let comms = Communicator::local(&devices).unwrap();
    let cfg = LlamaConfig {
        hidden_size: 1 << 16,
        intermediate_size: 1 << 18,
        num_hidden_layers: 24,
        num_attention_heads: 1 << 10,
        num_key_value_heads: Some(1 << 8),
        head_dim: Some(64),
        vocab_size: 1 << 30,
        ..LlamaConfig::tiny()
    };
    cfg.validate().unwrap();
    let before = comms[0].device().bytes_in_use();
    let mut results = on_each(&comms, |c| Llama::synthetic_tp(c, cfg.clone(), SEED));
    let err = results.swap_remove(0).expect_err("256 TB of weights");

    assert!(
        matches!(err, cuflow_runtime::DeviceError::OutOfMemory { bytes, .. } if bytes > 1 << 47),
        "{err}"
    );
    assert_eq!(
        comms[0].device().bytes_in_use(),
        before,
        "nothing stays allocated"
    );
}

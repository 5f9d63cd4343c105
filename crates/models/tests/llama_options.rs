//! `GenerateOptions` a decoder cannot run are refused by the call that is given them (the
//! constructor of a decoder, a capture or a generation), with an error naming the option:
//! sampling parameters out of range, a `max_seq` of zero, and caches larger than the device.

use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::DeviceError;
use cuflow_testing::device::device;

const PROMPT: [u32; 3] = [3, 141, 59];

/// Every way of running `options` on `model`: an eager decoder, a capture, and a generation.
fn refusals(model: &Llama, options: GenerateOptions) -> Result<Vec<String>, DeviceError> {
    let stream = model.device().new_stream()?;
    let err = |r: Result<(), DeviceError>, call: &str| match r {
        Ok(()) => panic!("{call} accepted {options:?}"),
        Err(e) => e.to_string(),
    };
    Ok(vec![
        err(model.decoder(&stream, options).map(drop), "decoder"),
        err(model.capture(&stream, options).map(drop), "capture"),
        err(
            model.generate(&stream, &PROMPT, 2, &options).map(drop),
            "generate",
        ),
    ])
}

/// A NaN temperature and a `top_p` outside `(0, 1]` are refused by `decoder` as by
/// `capture` and `generate`, not accepted there and refused by the first `prefill`.
#[test]
fn sampling_options_out_of_range_are_refused_by_every_constructor() -> Result<(), DeviceError> {
    let device = device();
    let model = Llama::synthetic(&device, LlamaConfig::tiny(), 5)?;
    let sampled = GenerateOptions::sampled(1.0).max_seq(16);
    for (options, field) in [
        (sampled.temperature(f32::NAN), "temperature"),
        (sampled.top_p(0.0), "top_p"),
        (sampled.top_p(-0.5), "top_p"),
        (sampled.top_p(1.5), "top_p"),
        (sampled.top_p(f32::NAN), "top_p"),
        (sampled.top_p(f32::INFINITY), "top_p"),
    ] {
        for message in refusals(&model, options)? {
            assert!(message.contains(field), "{options:?}: {message}");
            assert!(
                message.contains("GenerateOptions"),
                "{options:?}: {message}"
            );
        }
    }
    // The edges of the ranges run.
    let stream = device.new_stream()?;
    let edges = GenerateOptions::sampled(f32::INFINITY)
        .top_p(1.0)
        .top_k(u32::MAX);
    let ids = model
        .decoder(&stream, edges.max_seq(8))?
        .generate(&PROMPT, 3)?;
    assert!(ids.iter().all(|&id| id < 256), "{ids:?}");
    Ok(())
}

/// A `max_seq` of zero holds no position: it is an error saying so, not caches of one
/// position and a later error about `max_seq = 1`.
#[test]
fn a_max_seq_of_zero_is_an_error() -> Result<(), DeviceError> {
    let model = Llama::synthetic(&device(), LlamaConfig::tiny(), 5)?;
    for message in refusals(&model, GenerateOptions::greedy().max_seq(0))? {
        assert!(message.contains("max_seq 0"), "{message}");
        assert!(message.contains("positive"), "{message}");
    }
    Ok(())
}

/// Caches of more bytes than the device holds are refused before anything is allocated, with
/// an error naming `max_seq` and the bytes, not an allocation failure (or, where every
/// layer's cache fits alone but not all of them, an aborted process). Eight key/value heads
/// of 256 over two layers are 16 KiB a position: 2^31 - 2 positions are 35 TB.
#[test]
fn caches_larger_than_the_device_are_refused_naming_max_seq() -> Result<(), DeviceError> {
    let cfg = LlamaConfig {
        num_attention_heads: 8,
        num_key_value_heads: Some(8),
        head_dim: Some(256),
        ..LlamaConfig::tiny()
    };
    let model = Llama::synthetic(&device(), cfg, 5)?;
    let max_seq = (1 << 31) - 2;
    for message in refusals(&model, GenerateOptions::greedy().max_seq(max_seq))? {
        assert!(message.contains(&format!("max_seq {max_seq}")), "{message}");
        assert!(message.contains("lower"), "{message}");
    }
    // A generation that sizes its caches itself says which positions it needed.
    let stream = model.device().new_stream()?;
    let err = model
        .generate(
            &stream,
            &PROMPT,
            max_seq - PROMPT.len(),
            &GenerateOptions::greedy(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("max_seq {max_seq}")), "{err}");
    // The model still runs with caches that fit.
    let ids = model.generate(&stream, &PROMPT, 2, &GenerateOptions::greedy())?;
    assert_eq!(ids.len(), 2);
    Ok(())
}

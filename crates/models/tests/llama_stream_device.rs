//! A model runs on the streams of its own device: every call given a stream of another device
//! refuses it at once, naming both devices, before it allocates caches there or enqueues
//! anything.

use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::DeviceError;
use cuflow_testing::device::device_pair;

const PROMPT: [u32; 3] = [3, 141, 59];

#[test]
fn a_stream_of_another_device_is_refused_by_every_call() -> Result<(), DeviceError> {
    let Some((mine, other)) = device_pair() else {
        return Ok(());
    };
    let model = Llama::synthetic(&mine, LlamaConfig::tiny(), 5)?;
    let stream = other.new_stream()?;
    let options = GenerateOptions::greedy().max_seq(16);
    let errors = [
        ("decoder", model.decoder(&stream, options).map(drop)),
        ("capture", model.capture(&stream, options).map(drop)),
        (
            "generate",
            model.generate(&stream, &PROMPT, 2, &options).map(drop),
        ),
        (
            "prefill_logits",
            model.prefill_logits(&stream, &PROMPT).map(drop),
        ),
        (
            "decode_logits",
            model.decode_logits(&stream, &PROMPT).map(drop),
        ),
    ];
    for (call, result) in errors {
        match result {
            Err(DeviceError::DeviceMismatch { op, .. }) => {
                assert!(op.contains("Llama"), "{call}: {op}");
            }
            other => panic!("{call} on a stream of {other:?}: expected a device mismatch"),
        }
    }
    // Its own device's streams still work.
    let ids = model.generate(&mine.new_stream()?, &PROMPT, 2, &options)?;
    assert_eq!(ids.len(), 2);
    Ok(())
}

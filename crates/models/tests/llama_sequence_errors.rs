//! A decoder's sequence owns the failures of its work: decode steps whose work fails after it
//! was enqueued (here the all-reduces of a tensor-parallel rank whose peer prefilled with it
//! but never decodes) make the decoder's `synchronize` and `tokens` errors, never `Ok` over
//! tokens that work did not write. On host devices the all-reduce times out; on CUDA devices
//! the one-shot sum of the tiny model's activations traps once the communicator's timeout
//! passed, which faults the device (see `cuflow_runtime::collective`).

use std::sync::Barrier;
use std::time::Duration;

use cuflow_dist::Communicator;
use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::{BackendKind, DeviceError};
use cuflow_testing::device::rank_devices;
use cuflow_testing::thread::on_each;

/// Short, so that the lone rank's all-reduce fails soon; a hang fails the test at this bound.
const TIMEOUT: Duration = Duration::from_secs(2);

#[test]
fn tokens_after_steps_whose_all_reduce_failed_are_an_error() {
    let Some(devices) = rank_devices(2) else {
        return;
    };
    let comms = Communicator::local_with_timeout(&devices, TIMEOUT).expect("communicators");
    // Rank 1 stays until rank 0 is done: its communicator dropped would fail rank 0's
    // all-reduces at once instead of by their deadline.
    let done = Barrier::new(2);
    let results = on_each(&comms, |c| -> Result<(String, String), DeviceError> {
        let model = Llama::synthetic_tp(c, LlamaConfig::tiny(), 3)?;
        let options = GenerateOptions::greedy().max_seq(16);
        let mut step = model.decoder(c.stream(), options)?;
        // Both ranks prefill (they agree on the prompt first); only rank 0 decodes, so its
        // steps' all-reduces wait for rank 1 in vain.
        let prefilled = step
            .prefill(&[3, 141, 59])
            .and_then(|()| step.synchronize());
        let out = match (c.rank(), prefilled) {
            (0, Ok(())) => step.decode(4).map(|()| {
                let synced = format!("{:?}", step.synchronize());
                let tokens = format!("{:?}", step.tokens());
                (synced, tokens)
            }),
            (_, prefilled) => prefilled.map(|()| (String::new(), String::new())),
        };
        done.wait();
        out
    });
    let (synced, tokens) = results[0].as_ref().expect("rank 0 enqueued its steps");
    let expected = match devices[0].kind() {
        BackendKind::Cuda => "Err(DeviceFaulted",
        _ => "Err(Timeout",
    };
    assert!(synced.starts_with(expected), "synchronize: {synced}");
    assert!(tokens.starts_with(expected), "tokens: {tokens}");
}

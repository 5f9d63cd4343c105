//! Decoders on several threads: a `LlamaStep` moved to another thread, and steps of one model
//! run from two threads at once (on streams of their own, or on one stream, while the other
//! thread captures on it), each give the ids they give alone.

use std::sync::Arc;

use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::{DeviceError, Stream};
use cuflow_testing::device::device;

const PROMPT: [u32; 5] = [3, 141, 59, 26, 200];
const TOKENS: usize = 12;

/// The two generations the threads run: greedy after the whole prompt, sampled after part of it.
fn jobs() -> [(GenerateOptions, &'static [u32]); 2] {
    [
        (GenerateOptions::greedy(), &PROMPT),
        (
            GenerateOptions::sampled(0.9).top_k(20).seed(4),
            &PROMPT[..3],
        ),
    ]
}

fn join<T>(handle: std::thread::JoinHandle<Result<T, DeviceError>>) -> Result<T, DeviceError> {
    handle
        .join()
        .unwrap_or_else(|_| Err(DeviceError::usage("a generating thread panicked")))
}

#[test]
fn a_step_moved_to_another_thread_generates_the_same_ids() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let model = Llama::synthetic(&device, LlamaConfig::tiny(), 5)?;
    let want = model.generate(&stream, &PROMPT, TOKENS, &GenerateOptions::greedy())?;
    let mut step = model.capture(&stream, GenerateOptions::greedy().max_seq(32))?;
    let got = join(std::thread::spawn(move || step.generate(&PROMPT, TOKENS)))?;
    assert_eq!(got, want);
    Ok(())
}

/// Runs the two jobs at once, each on its thread, on the stream `stream_of` gives it; each
/// captures a step, then alternates replayed, eager-step and `Llama::generate` generations.
fn run_both(
    model: &Arc<Llama>,
    stream_of: impl Fn(usize) -> Result<Stream, DeviceError>,
) -> Result<(), DeviceError> {
    let stream = stream_of(0)?;
    let want: Vec<Vec<u32>> = jobs()
        .iter()
        .map(|(opts, prompt)| model.generate(&stream, prompt, TOKENS, opts))
        .collect::<Result<_, _>>()?;
    let handles: Vec<_> = jobs()
        .into_iter()
        .enumerate()
        .map(|(i, (opts, prompt))| {
            let (model, stream) = (model.clone(), stream_of(i));
            std::thread::spawn(move || -> Result<Vec<Vec<u32>>, DeviceError> {
                let stream = stream?;
                let mut step = model.capture(&stream, opts.max_seq(32))?;
                let mut out = Vec::new();
                for _ in 0..3 {
                    out.push(step.generate(prompt, TOKENS)?);
                    out.push(step.generate_eager(prompt, TOKENS)?);
                    out.push(model.generate(&stream, prompt, TOKENS, &opts)?);
                }
                Ok(out)
            })
        })
        .collect();
    for (i, handle) in handles.into_iter().enumerate() {
        let got = join(handle)?;
        assert!(got.iter().all(|ids| *ids == want[i]), "job {i}: {got:?}");
    }
    Ok(())
}

#[test]
fn two_threads_on_their_own_streams_generate_the_ids_of_each_alone() -> Result<(), DeviceError> {
    let device = device();
    let model = Arc::new(Llama::synthetic(&device, LlamaConfig::tiny(), 5)?);
    run_both(&model, |_| device.new_stream())
}

#[test]
fn two_threads_on_one_stream_generate_the_ids_of_each_alone() -> Result<(), DeviceError> {
    let device = device();
    let model = Arc::new(Llama::synthetic(&device, LlamaConfig::tiny(), 5)?);
    let stream = device.new_stream()?;
    run_both(&model, |_| Ok(stream.clone()))
}

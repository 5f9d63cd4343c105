//! Generation: eager and replayed ids agree, sampling is seeded and reproducible, and bad
//! requests are errors.

use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::{Device, DeviceError};

const PROMPT: [u32; 5] = [3, 141, 59, 26, 200];

fn model() -> Result<(Device, Llama), DeviceError> {
    let device = Device::auto()?;
    let model = Llama::synthetic(&device, LlamaConfig::tiny(), 5)?;
    Ok((device, model))
}

#[test]
fn replayed_greedy_ids_equal_eager_ids() -> Result<(), DeviceError> {
    let (device, model) = model()?;
    let stream = device.new_stream()?;
    let eager = model.generate(&stream, &PROMPT, 12, &GenerateOptions::greedy())?;
    assert_eq!(eager.len(), 12);
    assert!(
        eager.iter().any(|&t| t != eager[0]),
        "degenerate generation {eager:?}"
    );
    let mut step = model.capture(&stream, GenerateOptions::greedy().max_seq(32))?;
    assert!(step.is_captured());
    assert_eq!(step.generate(&PROMPT, 12)?, eager);
    // Again on the same state, and eagerly over the captured step's state.
    assert_eq!(step.generate(&PROMPT, 12)?, eager);
    assert_eq!(step.generate_eager(&PROMPT, 12)?, eager);
    // A shorter prompt is a new sequence: its own prefix of a generation.
    let short = model.generate(&stream, &PROMPT[..2], 4, &GenerateOptions::greedy())?;
    assert_eq!(step.generate(&PROMPT[..2], 4)?, short);
    Ok(())
}

#[test]
fn sampling_is_seeded_and_top_k_1_is_greedy() -> Result<(), DeviceError> {
    let (device, model) = model()?;
    let stream = device.new_stream()?;
    let greedy = model.generate(&stream, &PROMPT, 10, &GenerateOptions::greedy())?;
    let sampled = GenerateOptions::sampled(1.0).top_k(50).top_p(0.9).seed(42);
    let a = model.generate(&stream, &PROMPT, 10, &sampled)?;
    let b = model.generate(&stream, &PROMPT, 10, &sampled)?;
    assert_eq!(a, b, "the same seed gives the same tokens");
    let c = model.generate(&stream, &PROMPT, 10, &sampled.seed(43))?;
    assert_ne!(a, c, "another seed gives other tokens");
    let mut step = model.capture(&stream, sampled.max_seq(32))?;
    assert_eq!(
        step.generate(&PROMPT, 10)?,
        a,
        "replayed sampling matches eager"
    );
    let top1 = GenerateOptions::sampled(1.0).top_k(1).seed(9);
    assert_eq!(model.generate(&stream, &PROMPT, 10, &top1)?, greedy);
    // A nucleus narrower than the best token's probability keeps only the best token.
    let narrow = GenerateOptions::sampled(0.7).top_p(1e-6).seed(3);
    assert_eq!(model.generate(&stream, &PROMPT, 10, &narrow)?, greedy);
    Ok(())
}

#[test]
fn bad_requests_are_errors() -> Result<(), DeviceError> {
    let (device, model) = model()?;
    let stream = device.new_stream()?;
    let opts = GenerateOptions::greedy().max_seq(8);
    let too_long = model.generate(&stream, &PROMPT, 4, &opts).unwrap_err();
    assert!(too_long.to_string().contains("max_seq"), "{too_long}");
    let mut step = model.capture(&stream, opts)?;
    let err = step.generate(&[1; 9], 1).unwrap_err();
    assert!(err.to_string().contains("max_seq = 8"), "{err}");
    let err = step.generate(&[], 1).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let err = step.generate(&[256], 1).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert!(step.decode(1).is_err(), "decode before prefill");
    // The step still works after refused requests.
    assert_eq!(step.generate(&PROMPT, 3)?.len(), 3);
    Ok(())
}

/// Token counts whose sums overflow are refused like any count past `max_seq`, on every entry
/// point, never by an overflow.
#[test]
fn token_counts_past_every_position_are_errors() -> Result<(), DeviceError> {
    let (device, model) = model()?;
    let stream = device.new_stream()?;
    let err = model
        .generate(&stream, &PROMPT, usize::MAX, &GenerateOptions::greedy())
        .unwrap_err();
    assert!(err.to_string().contains("max_seq"), "{err}");
    let mut step = model.capture(&stream, GenerateOptions::greedy().max_seq(16))?;
    let err = step.generate(&PROMPT, usize::MAX).unwrap_err();
    assert!(err.to_string().contains("max_seq = 16"), "{err}");
    step.prefill(&PROMPT)?;
    for n in [usize::MAX, usize::MAX - PROMPT.len()] {
        let err = step.decode(n).unwrap_err();
        assert!(err.to_string().contains("max_seq = 16"), "{err}");
        let err = step.decode_eager(n).unwrap_err();
        assert!(err.to_string().contains("max_seq = 16"), "{err}");
    }
    // The refused requests changed nothing.
    step.decode(2)?;
    let tokens = step.tokens()?;
    assert_eq!(tokens.len(), 3);
    assert_eq!(
        tokens,
        model.generate(&stream, &PROMPT, 3, &GenerateOptions::greedy())?
    );
    Ok(())
}

/// A NaN temperature is refused (the host and the GPU would otherwise each make their own
/// choice), eagerly and when capturing.
#[test]
fn a_nan_temperature_is_an_error() -> Result<(), DeviceError> {
    let (device, model) = model()?;
    let stream = device.new_stream()?;
    let nan = GenerateOptions::sampled(f32::NAN).seed(1);
    let err = model.generate(&stream, &PROMPT, 4, &nan).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
    let err = model.capture(&stream, nan.max_seq(16)).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
    // Infinite and negative temperatures are defined: uniform over the kept tokens, and greedy.
    let greedy = model.generate(&stream, &PROMPT, 4, &GenerateOptions::greedy())?;
    let cold = GenerateOptions::sampled(-1.0).seed(1);
    assert_eq!(model.generate(&stream, &PROMPT, 4, &cold)?, greedy);
    let hot = GenerateOptions::sampled(f32::INFINITY).seed(1);
    let ids = model.generate(&stream, &PROMPT, 4, &hot)?;
    assert!(ids.iter().all(|&id| id < 256), "{ids:?}");
    Ok(())
}

/// Replayed and eager steps interleaved on one sequence, sampled or greedy, give the ids of
/// either alone; a second prefill starts the sequence (and the sampling seed) over.
#[test]
fn interleaved_replayed_and_eager_steps_give_the_same_ids() -> Result<(), DeviceError> {
    let (device, model) = model()?;
    let stream = device.new_stream()?;
    for options in [
        GenerateOptions::greedy(),
        GenerateOptions::sampled(1.2).top_k(30).top_p(0.95).seed(11),
    ] {
        let want = model.generate(&stream, &PROMPT, 9, &options)?;
        let mut step = model.capture(&stream, options.max_seq(16))?;
        assert_eq!(
            step.tokens()?,
            Vec::<u32>::new(),
            "no tokens before a prefill"
        );
        step.prefill(&PROMPT[..2])?;
        step.decode(3)?;
        step.prefill(&PROMPT)?;
        step.decode(2)?;
        step.decode_eager(3)?;
        step.decode(1)?;
        step.decode_eager(2)?;
        assert_eq!(step.tokens()?, want, "{options:?}");
    }
    Ok(())
}

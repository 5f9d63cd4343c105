//! The greedy choice of the decode sampler (two stages: block argmaxes, then their best)
//! against a reference argmax on ragged vocabularies, with ties and NaNs; on whatever
//! `Device::auto()` gives.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{DeviceError, Stream};
use cuflow_tensor::kernels::decode::{self, SampleParams};
use cuflow_testing::device::stream;
use cuflow_testing::rng::seeded_rng as rng;
use cuflow_testing::tensor::{read, upload};
use rand::rngs::StdRng;
use rand::Rng;

/// Vocabularies: one token, fewer than a block's threads, not a multiple of the first
/// stage's slices, and more than its 128 blocks of 256 threads cover in one pass.
const VOCABS: &[usize] = &[1, 5, 255, 1000, 32_769, 128_257];

/// The lowest index of the largest logit that is not NaN (`0` when all are NaN).
fn argmax_ref(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f64)> = None;
    for (i, &v) in logits.iter().enumerate() {
        let v = f64::from(v);
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// Logits with repeated values (ties), NaNs and signed zeros among random ones.
fn logits(rng: &mut StdRng, vocab: usize) -> Vec<f32> {
    (0..vocab)
        .map(|_| match rng.gen_range(0..20) {
            0 => f32::NAN,
            1 => 4.0,
            2 => -0.0,
            3 => 0.0,
            _ => rng.gen_range(-8.0..4.0f32),
        })
        .collect()
}

/// Runs one greedy step at position `p` and checks what it feeds the next step.
fn check(s: &Stream, scratch: &mut cuflow_tensor::Tensor<u32>, logits_h: &[f32], p: u32) {
    let vocab = logits_h.len();
    let logits = upload(s, logits_h, &[vocab]);
    let gen_len = 16;
    let mut token = upload(s, &[u32::MAX], &[1]);
    let mut generated = upload(s, &vec![u32::MAX; gen_len], &[gen_len]);
    let mut pos = upload(s, &[p], &[1]);
    let mut rng_state = upload(s, &[7u32, 9, 41], &[3]);
    decode::sample(
        &mut token,
        &mut generated,
        &mut pos,
        &mut rng_state,
        scratch,
        &logits,
        SampleParams::GREEDY,
    )
    .sync_on(s)
    .expect("the greedy sampler runs");
    let want = argmax_ref(logits_h);
    assert_eq!(
        read(&token),
        vec![want],
        "token over a vocabulary of {vocab}"
    );
    let gen = read(&generated);
    for (i, &g) in gen.iter().enumerate() {
        let expect = if i == p as usize + 1 { want } else { u32::MAX };
        assert_eq!(
            g, expect,
            "generated[{i}] at position {p}, vocabulary {vocab}"
        );
    }
    assert_eq!(read(&pos), vec![p + 1]);
    assert_eq!(read(&rng_state), vec![7, 9, 42]);
}

#[test]
fn greedy_sample_matches_reference_argmax() {
    let s = stream();
    let mut rng = rng(21);
    // Poisoned scratch: the first stage overwrites every key the second reads.
    let mut scratch = upload(
        &s,
        &vec![u32::MAX; decode::SAMPLE_SCRATCH_LEN],
        &[decode::SAMPLE_SCRATCH_LEN],
    );
    for &vocab in VOCABS {
        for p in [0, 3] {
            let l = logits(&mut rng, vocab);
            check(&s, &mut scratch, &l, p);
        }
    }
    // The maximum in the last slot, a tie broken towards the lowest index across slices, a
    // negative zero tying a positive one, and no number at all.
    let mut last = vec![-1.0f32; 128_257];
    last[128_256] = 2.0;
    check(&s, &mut scratch, &last, 1);
    let mut tie = vec![-1.0f32; 100_000];
    tie[99_000] = 3.0;
    tie[1_500] = 3.0;
    check(&s, &mut scratch, &tie, 1);
    let mut zeros = vec![f32::NAN; 4_000];
    zeros[3_000] = -0.0;
    zeros[3_500] = 0.0;
    check(&s, &mut scratch, &zeros, 1);
    check(&s, &mut scratch, &[f32::NAN; 300], 1);
}

#[test]
fn sample_rejects_short_scratch() {
    let s = stream();
    let logits = upload(&s, &[1.0f32, 2.0], &[2]);
    let mut token = upload(&s, &[0u32], &[1]);
    let mut generated = upload(&s, &[0u32; 4], &[4]);
    let mut pos = upload(&s, &[0u32], &[1]);
    let mut rng_state = upload(&s, &[0u32; 3], &[3]);
    let mut scratch = upload(&s, &[0u32; 2], &[2]);
    let err = decode::sample(
        &mut token,
        &mut generated,
        &mut pos,
        &mut rng_state,
        &mut scratch,
        &logits,
        SampleParams::GREEDY,
    )
    .sync_on(&s)
    .expect_err("a scratch of two elements is refused");
    assert!(err.to_string().contains("scratch"), "{err}");
}

/// A NaN temperature has no distribution to sample: it is refused naming it (as a `top_p`
/// outside `(0, 1]` is), instead of sampling from NaN probabilities, and nothing is written.
#[test]
fn sample_rejects_a_nan_temperature() {
    let s = stream();
    let logits = upload(&s, &[1.0f32, 2.0, 0.5], &[3]);
    let mut token = upload(&s, &[9u32], &[1]);
    let mut generated = upload(&s, &[9u32; 4], &[4]);
    let mut pos = upload(&s, &[0u32], &[1]);
    let mut rng_state = upload(&s, &[0u32; 3], &[3]);
    let mut scratch = upload(
        &s,
        &[0u32; decode::SAMPLE_SCRATCH_LEN],
        &[decode::SAMPLE_SCRATCH_LEN],
    );
    let params = SampleParams {
        temperature: f32::NAN,
        top_k: 0,
        top_p: 1.0,
    };
    let err = decode::sample(
        &mut token,
        &mut generated,
        &mut pos,
        &mut rng_state,
        &mut scratch,
        &logits,
        params,
    )
    .sync_on(&s)
    .expect_err("a NaN temperature is refused");
    assert!(
        matches!(err, DeviceError::InvalidShape { op: "sample", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("temperature"), "{err}");
    assert_eq!(read(&token), vec![9]);
    assert_eq!(read(&pos), vec![0]);
    assert_eq!(read(&generated), vec![9; 4]);
}

#[test]
fn the_last_position_records_nothing_and_wraps() {
    // At position u32::MAX the next position does not exist: the pick is the token, nothing
    // is recorded in `generated` (a 32-bit `pos + 1` would wrap to slot 0), and the position
    // wraps to 0. Greedy and sampled choices record through different code.
    let s = stream();
    let logits_h = [0.5f32, 3.0, -1.0, 2.5];
    let logits = upload(&s, &logits_h, &[4]);
    let mut scratch = upload(
        &s,
        &[0u32; decode::SAMPLE_SCRATCH_LEN],
        &[decode::SAMPLE_SCRATCH_LEN],
    );
    let sampled = SampleParams {
        temperature: 1e-3,
        top_k: 0,
        top_p: 1.0,
    };
    for params in [SampleParams::GREEDY, sampled] {
        let mut token = upload(&s, &[u32::MAX], &[1]);
        let mut generated = upload(&s, &[u32::MAX; 4], &[4]);
        let mut pos = upload(&s, &[u32::MAX], &[1]);
        let mut rng_state = upload(&s, &[7u32, 9, 41], &[3]);
        decode::sample(
            &mut token,
            &mut generated,
            &mut pos,
            &mut rng_state,
            &mut scratch,
            &logits,
            params,
        )
        .sync_on(&s)
        .expect("the sampler runs at the last position");
        // A temperature of 1e-3 keeps only the largest logit (3.0 at index 1).
        assert_eq!(read(&token), vec![1], "{params:?}");
        assert_eq!(read(&generated), vec![u32::MAX; 4], "{params:?}");
        assert_eq!(read(&pos), vec![0], "{params:?}");
    }
}

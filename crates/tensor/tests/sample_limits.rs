//! The sampler's top-k and top-p sets at any temperature: at a huge or infinite temperature
//! (where the weights are all but, or exactly, uniform) no token outside them is drawn, and at
//! an infinite one every kept token is drawn alike; `-inf` logits are never drawn, `+inf`
//! ones take all the mass; ordinary temperatures keep their distribution. On whatever
//! `Device::auto()` gives.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::Stream;
use cuflow_tensor::kernels::decode::{self, SampleParams};
use cuflow_tensor::Tensor;
use cuflow_testing::device::stream;
use cuflow_testing::tensor::{read, upload};

/// Temperatures where the weights are ordinary, all but uniform, and exactly uniform.
const TEMPERATURES: [f32; 4] = [1.0, 1e7, f32::MAX, f32::INFINITY];

/// A sampler with its own scratch and generator state (seed `seed`, counter `0`).
struct Sampler {
    stream: Stream,
    scratch: Tensor<u32>,
    rng_state: Tensor<u32>,
}

impl Sampler {
    fn new(seed: u32) -> Self {
        let stream = stream();
        let scratch = upload(
            &stream,
            &[0u32; decode::SAMPLE_SCRATCH_LEN],
            &[decode::SAMPLE_SCRATCH_LEN],
        );
        let rng_state = upload(&stream, &[seed, 0, 0], &[3]);
        Sampler {
            stream,
            scratch,
            rng_state,
        }
    }

    /// `n` draws from `logits`, each advancing the generator's counter.
    fn draws(&mut self, logits_h: &[f32], params: SampleParams, n: usize) -> Vec<u32> {
        let s = &self.stream;
        let logits = upload(s, logits_h, &[logits_h.len()]);
        let mut token = upload(s, &[u32::MAX], &[1]);
        let mut generated = upload(s, &[0u32; 4], &[4]);
        let mut pos = upload(s, &[0u32], &[1]);
        (0..n)
            .map(|_| {
                decode::sample(
                    &mut token,
                    &mut generated,
                    &mut pos,
                    &mut self.rng_state,
                    &mut self.scratch,
                    &logits,
                    params,
                )
                .sync_on(s)
                .expect("the sampler runs");
                read(&token)[0]
            })
            .collect()
    }
}

/// How often each token was drawn.
fn histogram(draws: &[u32], vocab: usize) -> Vec<usize> {
    let mut h = vec![0; vocab];
    for &t in draws {
        h[t as usize] += 1;
    }
    h
}

/// `logits` with `head` at its start and `0` after.
fn headed(head: &[f32], vocab: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; vocab];
    v[..head.len()].copy_from_slice(head);
    v
}

/// Checks that every draw of `params` from `logits` lies in `allowed`, at every temperature
/// of [`TEMPERATURES`], and collects what went wrong.
fn only_from(logits: &[f32], top_k: u32, top_p: f32, allowed: &[u32], failures: &mut Vec<String>) {
    for temperature in TEMPERATURES {
        let params = SampleParams {
            temperature,
            top_k,
            top_p,
        };
        let mut outside = Vec::new();
        for seed in 0..64u32 {
            let t = Sampler::new(seed).draws(logits, params, 1)[0];
            if !allowed.contains(&t) {
                outside.push(t);
            }
        }
        if !outside.is_empty() {
            failures.push(format!(
                "{params:?}: {} of 64 draws outside {allowed:?}: {:?}",
                outside.len(),
                &outside[..outside.len().min(8)]
            ));
        }
    }
}

#[test]
fn top_k_keeps_only_the_k_best_tokens_at_any_temperature() {
    let mut failures = Vec::new();
    only_from(&headed(&[10.0, 9.0], 100), 2, 1.0, &[0, 1], &mut failures);
    // A masked logit far below stretches the range of the logits, not the cut's precision.
    let masked = headed(&[10.0, 9.0, -1e30, f32::MIN, f32::NEG_INFINITY], 100);
    only_from(&masked, 2, 1.0, &[0, 1], &mut failures);
    // Close logits: the cut falls between 10 and its next float down.
    let close = headed(
        &[10.0, 10.0f32.next_down(), 10.0f32.next_down().next_down()],
        100,
    );
    only_from(&close, 2, 1.0, &[0, 1], &mut failures);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Top-p keeps the smallest set of the most likely tokens whose probability reaches `p`. At a
/// huge or infinite temperature the probabilities are (all but) uniform, so that set is the
/// smallest prefix of the sorted tokens whose share of the count reaches `p`: here the two
/// best of 100 tokens at `p = 0.015`, and the two best of the top-4 at `p = 0.4`. (At
/// temperature 1 it is the best token alone, also inside.)
#[test]
fn top_p_keeps_only_the_nucleus_at_any_temperature() {
    let mut failures = Vec::new();
    only_from(&headed(&[10.0, 9.0], 100), 0, 0.015, &[0, 1], &mut failures);
    let four = headed(&[10.0, 9.0, 8.0, 7.0], 100);
    only_from(&four, 4, 0.4, &[0, 1], &mut failures);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// At an infinite temperature every kept token is equally likely: each of 1000 draws from two
/// kept tokens lands on either about as often (within 5 standard deviations of 500), from
/// either the top-k or the top-p set, and a uniform draw over all finite logits spreads too.
#[test]
fn an_infinite_temperature_draws_the_kept_tokens_uniformly() {
    let hot = |top_k, top_p| SampleParams {
        temperature: f32::INFINITY,
        top_k,
        top_p,
    };
    let mut sampler = Sampler::new(5);
    let head = headed(&[10.0, 9.0], 100);
    let four = headed(&[10.0, 9.0, 8.0, 7.0], 100);
    for (logits, params) in [
        (&head, hot(2, 1.0)),
        (&head, hot(0, 0.015)),
        (&four, hot(4, 0.4)),
    ] {
        let h = histogram(&sampler.draws(logits, params, 1000), 100);
        assert_eq!(h[0] + h[1], 1000, "{params:?}: {h:?}");
        assert!(h[0].abs_diff(500) <= 80, "{params:?}: {:?}", &h[..2]);
    }
    // Every finite logit is kept, with the same weight; -inf and NaN never are.
    let mut logits = headed(&[f32::MAX, f32::MIN, f32::NEG_INFINITY, f32::NAN], 8);
    logits[4] = 1e30;
    let h = histogram(&sampler.draws(&logits, hot(0, 1.0), 1600), 8);
    assert_eq!(h[2] + h[3], 0, "{h:?}");
    for t in [0, 1, 4, 5, 6, 7] {
        assert!(h[t].abs_diff(267) <= 75, "token {t}: {h:?}");
    }
}

/// `+inf` logits take all the mass at any temperature (uniformly among them); when every
/// number is `-inf`, one of them is drawn; neither yields a NaN choice.
#[test]
fn infinite_logits_are_handled() {
    let mut sampler = Sampler::new(11);
    let logits = [1.0, f32::INFINITY, 3.0, f32::INFINITY, f32::NAN];
    for temperature in TEMPERATURES {
        for (top_k, top_p) in [(0, 1.0), (1, 1.0), (3, 1.0), (0, 0.3)] {
            let params = SampleParams {
                temperature,
                top_k,
                top_p,
            };
            let h = histogram(&sampler.draws(&logits, params, 200), 5);
            assert_eq!(h[1] + h[3], 200, "{params:?}: {h:?}");
            if top_k != 1 {
                assert!(h[1] > 40 && h[3] > 40, "{params:?}: {h:?}");
            }
        }
    }
    let masked = [f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NAN];
    for temperature in TEMPERATURES {
        let params = SampleParams {
            temperature,
            top_k: 0,
            top_p: 0.5,
        };
        let h = histogram(&sampler.draws(&masked, params, 50), 3);
        assert_eq!(h[2], 0, "{params:?}: {h:?}");
    }
}

/// At ordinary temperatures the draws follow the softmax of the kept logits: 4000 draws per
/// case, every frequency within 5 standard deviations of its probability.
#[test]
fn ordinary_temperatures_follow_the_softmax_of_the_kept_tokens() {
    let logits = [2.0f32, 1.0, 0.0, -1.0, 0.5];
    let softmax = |t: f64, kept: &[usize]| {
        let w: Vec<f64> = (0..logits.len())
            .map(|i| {
                if kept.contains(&i) {
                    (f64::from(logits[i]) / t).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        w.into_iter().map(|x| x / total).collect::<Vec<f64>>()
    };
    let mut sampler = Sampler::new(3);
    let n = 4000;
    for (temperature, top_k, top_p, kept) in [
        (1.0f32, 0, 1.0f32, &[0, 1, 2, 3, 4][..]),
        (0.7, 3, 1.0, &[0, 1, 4][..]),
        // Probabilities .56, .21, .08, .03, .13: 0.7 is reached by the best two.
        (1.0, 0, 0.7, &[0, 1][..]),
        // The top 4 at temperature 2: .41, .25, .15, -, .19: 0.8 is reached by three.
        (2.0, 4, 0.8, &[0, 1, 4][..]),
    ] {
        let params = SampleParams {
            temperature,
            top_k,
            top_p,
        };
        let want = softmax(f64::from(temperature), kept);
        let h = histogram(&sampler.draws(&logits, params, n), logits.len());
        for (i, (&got, &p)) in h.iter().zip(&want).enumerate() {
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            let diff = (got as f64 - n as f64 * p).abs();
            assert!(
                diff <= 5.0 * sd + 0.5,
                "{params:?}: token {i} drawn {got} times, expected {:.0}: {h:?}",
                n as f64 * p
            );
        }
    }
}

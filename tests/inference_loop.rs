//! The inference-loop example's model (`cuflow_testing::model`) on the device
//! under test: eager and graph-replayed generation agree, and the decode step matches a
//! float64 forward pass computed on the host from the same weights.
//!
//! The device comes from `Device::auto()`: the host backend in CI, CUDA under
//! `CUFLOW_DEVICE=cuda`, where a device that cannot be had fails the tests.

use cuflow::prelude::*;
use cuflow_testing::{
    device::stream,
    model::{Config, Model},
};

/// Two layers of width 64, four heads of 16.
fn small() -> Config {
    Config {
        d_model: 64,
        n_heads: 4,
        n_layers: 2,
        d_mlp: 256,
        vocab: 128,
        max_seq: 32,
        norm_eps: 1e-5,
    }
}

#[test]
fn eager_and_replayed_generations_match() {
    let stream = stream();
    let model = Model::new(&stream, small(), 7).expect("the model");
    let eager = model
        .generate_eager(&stream, 3, 12)
        .expect("eager generation");
    assert_eq!(eager.len(), 12);
    assert!(eager.iter().all(|&t| (t as usize) < small().vocab));

    let mut step = model.capture(&stream).expect("the captured step");
    let replayed = step.generate(3, 12).expect("replayed generation");
    assert_eq!(eager, replayed, "eager and replayed tokens differ");
    // Caches left behind by longer runs are never read: shorter runs repeat the same tokens.
    assert_eq!(step.generate(3, 5).expect("a shorter replay"), eager[..5]);
    assert_eq!(
        model.generate_eager(&stream, 3, 12).expect("eager again"),
        eager
    );

    assert!(
        model.generate_eager(&stream, 3, 33).is_err(),
        "past max_seq"
    );
    assert!(
        step.generate(128, 4).is_err(),
        "a token outside the vocabulary"
    );
}

/// The weights of one layer, in `f64`.
struct HostLayer {
    attn_norm: Vec<f64>,
    wqkv: Vec<f64>,
    wo: Vec<f64>,
    mlp_norm: Vec<f64>,
    w_up: Vec<f64>,
    w_down: Vec<f64>,
}

fn host(t: &Tensor<f32>) -> Vec<f64> {
    t.to_host_vec()
        .expect("reading a weight back")
        .into_iter()
        .map(f64::from)
        .collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let r = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * r * w).collect()
}

/// `x · wᵀ` for `w` stored `[out, in]`.
fn linear(x: &[f64], w: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(w, x)| w * x).sum())
        .collect()
}

fn add(x: &[f64], y: &[f64]) -> Vec<f64> {
    x.iter().zip(y).map(|(a, b)| a + b).collect()
}

/// The error function (Abramowitz and Stegun 7.1.26, absolute error below 1.5e-7).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let y = 1.0 - poly * (-x * x).exp();
    y.copysign(x)
}

fn gelu(x: &[f64]) -> Vec<f64> {
    x.iter()
        .map(|v| 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2)))
        .collect()
}

/// A float64 decoder with its own key/value caches.
struct Reference {
    cfg: Config,
    embed: Vec<f64>,
    layers: Vec<HostLayer>,
    final_norm: Vec<f64>,
    lm_head: Vec<f64>,
    /// Per layer, the key and value rows of every position so far.
    keys: Vec<Vec<Vec<f64>>>,
    values: Vec<Vec<Vec<f64>>>,
}

impl Reference {
    fn new(model: &Model) -> Reference {
        let w = model.weights();
        let cfg = *model.config();
        Reference {
            cfg,
            embed: host(&w.embed),
            layers: w
                .layers
                .iter()
                .map(|l| HostLayer {
                    attn_norm: host(&l.attn_norm),
                    wqkv: host(&l.wqkv),
                    wo: host(&l.wo),
                    mlp_norm: host(&l.mlp_norm),
                    w_up: host(&l.w_up),
                    w_down: host(&l.w_down),
                })
                .collect(),
            final_norm: host(&w.final_norm),
            lm_head: host(&w.lm_head),
            keys: vec![Vec::new(); cfg.n_layers],
            values: vec![Vec::new(); cfg.n_layers],
        }
    }

    /// The logits of the next position for `token`.
    fn step(&mut self, token: u32) -> Vec<f64> {
        let (d, hd) = (self.cfg.d_model, self.cfg.head_dim());
        let eps = f64::from(self.cfg.norm_eps);
        let t = token as usize;
        let mut x = self.embed[t * d..(t + 1) * d].to_vec();
        for (i, l) in self.layers.iter().enumerate() {
            let qkv = linear(&rms_norm(&x, &l.attn_norm, eps), &l.wqkv);
            self.keys[i].push(qkv[d..2 * d].to_vec());
            self.values[i].push(qkv[2 * d..].to_vec());
            let mut att = vec![0.0; d];
            for h in 0..self.cfg.n_heads {
                let cols = h * hd..(h + 1) * hd;
                let q = &qkv[cols.clone()];
                let scores: Vec<f64> = self.keys[i]
                    .iter()
                    .map(|k| {
                        q.iter()
                            .zip(&k[cols.clone()])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (c, out) in att[cols.clone()].iter_mut().enumerate() {
                    *out = e
                        .iter()
                        .zip(&self.values[i])
                        .map(|(e, v)| e * v[h * hd + c])
                        .sum::<f64>()
                        / sum;
                }
            }
            x = add(&x, &linear(&att, &l.wo));
            let up = gelu(&linear(&rms_norm(&x, &l.mlp_norm, eps), &l.w_up));
            x = add(&x, &linear(&up, &l.w_down));
        }
        linear(&rms_norm(&x, &self.final_norm, eps), &self.lm_head)
    }
}

fn argmax(v: &[f64]) -> usize {
    (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
}

/// Runs `steps` decode steps on the device and on the float64 reference, feeding both the
/// reference's greedy tokens, and compares the logits and the step's next token.
fn check_against_reference(cfg: Config, seed: u64, steps: usize) {
    let stream = stream();
    let model = Model::new(&stream, cfg, seed).expect("the model");
    let mut reference = Reference::new(&model);
    let mut token = 5u32;
    for p in 0..steps {
        let ids = api::from_vec(vec![token], &[1])
            .sync_on(&stream)
            .expect("ids");
        let pos = api::from_vec(vec![p as u32], &[1])
            .sync_on(&stream)
            .expect("pos");
        let logits = model
            .logits(&ids, &pos)
            .sync_on(&stream)
            .expect("the logits")
            .to_host_vec()
            .expect("reading the logits");
        assert_eq!(logits.len(), cfg.vocab);
        let want = reference.step(token);
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let err = logits.iter().zip(&want).fold(0.0f64, |m, (got, want)| {
            m.max((f64::from(*got) - want).abs())
        }) / scale;
        assert!(
            err < 1e-4,
            "{cfg:?}, position {p}: logits differ from the float64 reference by {err:.2e} \
             (relative to the largest logit)"
        );

        // The step (logits then argmax, over the caches as they stand) picks the same token
        // unless the reference's top two are closer than the tolerance.
        let best = argmax(&want);
        let runner_up = want
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != best)
            .fold(f64::NEG_INFINITY, |m, (_, v)| m.max(*v));
        let next = model
            .step(&ids, &pos)
            .sync_on(&stream)
            .expect("the step")
            .to_host_vec()
            .expect("reading the token");
        if want[best] - runner_up > 1e-3 * scale {
            assert_eq!(next, vec![best as u32], "{cfg:?}, position {p}");
        }
        token = best as u32;
    }
}

#[test]
fn step_matches_a_float64_reference() {
    check_against_reference(small(), 11, 4);
}

#[test]
fn step_matches_a_float64_reference_at_awkward_sizes() {
    // Heads of 50 (two row groups of the 128-thread attention block, 28 threads idle), an odd
    // cache length, and one head of 160 (wider than the block).
    let awkward = Config {
        d_model: 150,
        n_heads: 3,
        n_layers: 1,
        d_mlp: 70,
        vocab: 97,
        max_seq: 37,
        norm_eps: 1e-5,
    };
    check_against_reference(awkward, 3, 5);
    let wide = Config {
        d_model: 160,
        n_heads: 1,
        ..awkward
    };
    check_against_reference(wide, 4, 3);
}

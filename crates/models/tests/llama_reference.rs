//! The tiny model's logits against a float64 reference of the same architecture, written
//! here independently from the weights' checkpoint tensors.
//!
//! The device computes with `bf16` weights (the reference uses the same `bf16` values
//! exactly), `f32` activations and a `bf16` key/value cache; prefill also rounds the inputs
//! and outputs of its matrix products to `bf16`. Measured on the host backend: relative
//! error (‖device − reference‖₂ / ‖reference‖₂) 4.4e-3 and 5.8e-3 (tied) for the decode step,
//! 8.0e-3 and 8.8e-3 for prefill; asserted below 1.5e-2 and 3e-2.

use std::collections::HashMap;

use cuflow_models::llama::testing::{synthetic_tensors, WeightDtype};
use cuflow_models::llama::{Llama, LlamaConfig};
use cuflow_runtime::{Device, DeviceError};
use cuflow_testing::measure::rel_err_in_norm;
use half::bf16;
use rand::{Rng, SeedableRng};

struct RefModel {
    cfg: LlamaConfig,
    w: HashMap<String, Vec<f64>>,
}

impl RefModel {
    fn new(cfg: &LlamaConfig, seed: u64) -> RefModel {
        let w = synthetic_tensors(cfg, seed, WeightDtype::Bf16)
            .expect("the reference config is valid")
            .into_iter()
            .map(|t| {
                let v = t
                    .data
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64())
                    .collect();
                (t.name, v)
            })
            .collect();
        RefModel {
            cfg: cfg.clone(),
            w,
        }
    }

    fn t(&self, name: &str) -> &[f64] {
        &self.w[name]
    }

    /// `W · x` for `W` `[rows, x.len()]`.
    fn matvec(&self, name: &str, x: &[f64]) -> Vec<f64> {
        self.t(name)
            .chunks(x.len())
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn rms_norm(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + self.cfg.rms_norm_eps).sqrt();
        x.iter().zip(self.t(name)).map(|(x, w)| x * r * w).collect()
    }

    /// Llama 3 frequencies, as Hugging Face transformers computes them.
    fn inv_freq(&self) -> Vec<f64> {
        let hd = self.cfg.head_dim() as f64;
        let s = self
            .cfg
            .rope_scaling
            .as_ref()
            .expect("the tiny config scales rope");
        let old = s.original_max_position_embeddings as f64;
        (0..self.cfg.head_dim() / 2)
            .map(|i| {
                let f = self.cfg.rope_theta.powf(-(2.0 * i as f64) / hd);
                let wavelen = 2.0 * std::f64::consts::PI / f;
                let scaled = if wavelen > old / s.low_freq_factor {
                    f / s.factor
                } else {
                    f
                };
                let smooth =
                    (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                let medium =
                    wavelen >= old / s.high_freq_factor && wavelen <= old / s.low_freq_factor;
                if medium {
                    (1.0 - smooth) * scaled / s.factor + smooth * scaled
                } else {
                    scaled
                }
            })
            .collect()
    }

    fn rope(&self, x: &mut [f64], pos: usize, inv_freq: &[f64]) {
        let half = x.len() / 2;
        for i in 0..half {
            let (s, c) = (pos as f64 * inv_freq[i]).sin_cos();
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
    }

    /// The logits after the last token of `prompt`.
    fn logits(&self, prompt: &[u32]) -> Vec<f64> {
        let cfg = &self.cfg;
        let (d, hd, nh, nkv) = (
            cfg.hidden_size,
            cfg.head_dim(),
            cfg.num_attention_heads,
            cfg.kv_heads(),
        );
        let inv_freq = self.inv_freq();
        let embed = self.t("model.embed_tokens.weight");
        let mut xs: Vec<Vec<f64>> = prompt
            .iter()
            .map(|&id| embed[id as usize * d..(id as usize + 1) * d].to_vec())
            .collect();
        for l in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let mut keys = Vec::new();
            let mut values = Vec::new();
            let mut queries = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let h = self.rms_norm(&format!("{p}.input_layernorm.weight"), x);
                let mut q = self.matvec(&format!("{p}.self_attn.q_proj.weight"), &h);
                let mut k = self.matvec(&format!("{p}.self_attn.k_proj.weight"), &h);
                let v = self.matvec(&format!("{p}.self_attn.v_proj.weight"), &h);
                for head in q.chunks_mut(hd).chain(k.chunks_mut(hd)) {
                    self.rope(head, pos, &inv_freq);
                }
                queries.push(q);
                keys.push(k);
                values.push(v);
            }
            for (pos, x) in xs.iter_mut().enumerate() {
                let mut attn = vec![0.0; nh * hd];
                for h in 0..nh {
                    let kvh = h / (nh / nkv);
                    let q = &queries[pos][h * hd..(h + 1) * hd];
                    let scores: Vec<f64> = (0..=pos)
                        .map(|t| {
                            let k = &keys[t][kvh * hd..(kvh + 1) * hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (t, e) in e.iter().enumerate() {
                        for c in 0..hd {
                            attn[h * hd + c] += e / z * values[t][kvh * hd + c];
                        }
                    }
                }
                let o = self.matvec(&format!("{p}.self_attn.o_proj.weight"), &attn);
                x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
                let h = self.rms_norm(&format!("{p}.post_attention_layernorm.weight"), x);
                let g = self.matvec(&format!("{p}.mlp.gate_proj.weight"), &h);
                let u = self.matvec(&format!("{p}.mlp.up_proj.weight"), &h);
                let act: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let down = self.matvec(&format!("{p}.mlp.down_proj.weight"), &act);
                x.iter_mut().zip(&down).for_each(|(x, o)| *x += o);
            }
        }
        let last = xs.last().expect("a prompt");
        let h = self.rms_norm("model.norm.weight", last);
        let head = if cfg.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        self.matvec(head, &h)
    }
}

fn random_prompt(len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(0..vocab as u32)).collect()
}

#[test]
fn tiny_logits_match_a_float64_reference() -> Result<(), DeviceError> {
    let device = Device::auto()?;
    let stream = device.new_stream()?;
    for (cfg, seed) in [
        (LlamaConfig::tiny(), 11),
        (
            LlamaConfig {
                tie_word_embeddings: true,
                ..LlamaConfig::tiny()
            },
            12,
        ),
    ] {
        let model = Llama::synthetic(&device, cfg.clone(), seed)?;
        let reference = RefModel::new(&cfg, seed);
        let prompt = random_prompt(9, cfg.vocab_size, seed);
        let want = reference.logits(&prompt);
        assert!(
            want.iter().any(|v| v.abs() > 0.1),
            "degenerate reference logits"
        );

        let decoded = model.decode_logits(&stream, &prompt)?;
        let prefilled = model.prefill_logits(&stream, &prompt)?;
        let (e_decode, e_prefill) = (
            rel_err_in_norm(&decoded, &want),
            rel_err_in_norm(&prefilled, &want),
        );
        eprintln!(
            "tie={}: relative error of the logits: decode step {e_decode:.2e}, prefill {e_prefill:.2e}",
            cfg.tie_word_embeddings
        );
        assert!(
            e_decode < 1.5e-2,
            "decode step logits: relative error {e_decode:.3e}"
        );
        assert!(
            e_prefill < 3e-2,
            "prefill logits: relative error {e_prefill:.3e}"
        );
    }
    Ok(())
}

/// Random small shapes: head widths 16 to 128, groups of 1 to 8 query heads per key/value
/// head, hidden sizes that are not the heads' total width, odd vocabularies, one or two layers,
/// tied or not, prompts of 1 to 12 tokens. Each model's logits (the decode step and prefill)
/// against the float64 reference, and its ids generated eagerly against those of its captured
/// step replayed. The tolerance is the tiny model's.
#[test]
fn random_small_shapes_match_a_float64_reference_and_replay_their_eager_ids(
) -> Result<(), DeviceError> {
    use cuflow_models::llama::GenerateOptions;
    let device = Device::auto()?;
    let stream = device.new_stream()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x11a3_a5a9);
    for case in 0..16 {
        let head_dim = [16, 32, 64, 128][rng.gen_range(0..4)];
        let kv = rng.gen_range(1..=3);
        let group = [1, 2, 3, 4, 8][rng.gen_range(0..5)];
        let cfg = LlamaConfig {
            hidden_size: 8 * rng.gen_range(2..=24),
            intermediate_size: 8 * rng.gen_range(1..=24),
            num_hidden_layers: rng.gen_range(1..=2),
            num_attention_heads: kv * group,
            num_key_value_heads: Some(kv),
            head_dim: Some(head_dim),
            vocab_size: rng.gen_range(2..600),
            tie_word_embeddings: rng.gen_bool(0.5),
            ..LlamaConfig::tiny()
        };
        let seed = rng.gen();
        let prompt = random_prompt(rng.gen_range(1..=12), cfg.vocab_size, seed);
        let what = format!("case {case}: {cfg:?}, prompt {prompt:?}");
        let model = Llama::synthetic(&device, cfg.clone(), seed)?;
        let want = RefModel::new(&cfg, seed).logits(&prompt);
        let decoded = model.decode_logits(&stream, &prompt)?;
        let prefilled = model.prefill_logits(&stream, &prompt)?;
        let (e_decode, e_prefill) = (
            rel_err_in_norm(&decoded, &want),
            rel_err_in_norm(&prefilled, &want),
        );
        assert!(
            e_decode < 1.5e-2,
            "{what}: decode step logits: relative error {e_decode:.3e}"
        );
        assert!(
            e_prefill < 3e-2,
            "{what}: prefill logits: relative error {e_prefill:.3e}"
        );

        let tokens = 6;
        let eager = model.generate(&stream, &prompt, tokens, &GenerateOptions::greedy())?;
        let mut step = model.capture(&stream, GenerateOptions::greedy().max_seq(32))?;
        assert_eq!(
            step.generate(&prompt, tokens)?,
            eager,
            "{what}: replayed ids"
        );
    }
    Ok(())
}

//! The model's weights on the device, and where each comes from.
//!
//! Weights are stored `bf16` whatever the checkpoint's dtype (`f32` and `f16` checkpoints are
//! converted on the host while staging): the decode kernels read `bf16`, and memory traffic
//! is what a decode step costs. The query, key and value projections of a layer are stacked
//! into one `[q + k + v, hidden]` matrix, and the gate and up projections into one
//! `[2 · intermediate, hidden]` matrix, so each is one GEMV per step; the stacking happens
//! while loading (each checkpoint tensor is copied into its rows of the stacked tensor).

use std::sync::Arc;

use cuflow_runtime::{DeviceBuffer, DeviceError, Stream};
use cuflow_tensor::{bf16, Tensor};

use super::config::LlamaConfig;
use super::loader::Stager;
use super::model::ensure_fits;

/// The weights of one decoder layer (linear weights `[out_features, in_features]`).
#[derive(Clone, Debug)]
pub(crate) struct LayerWeights {
    pub(crate) attn_norm: Tensor<bf16>,
    /// `[q_proj; k_proj; v_proj]`.
    pub(crate) wqkv: Tensor<bf16>,
    pub(crate) wo: Tensor<bf16>,
    pub(crate) mlp_norm: Tensor<bf16>,
    /// `[gate_proj; up_proj]`.
    pub(crate) w_gate_up: Tensor<bf16>,
    pub(crate) w_down: Tensor<bf16>,
}

/// Every weight of the model: shared handles to device tensors.
#[derive(Clone, Debug)]
pub(crate) struct Weights {
    pub(crate) embed: Tensor<bf16>,
    pub(crate) layers: Vec<LayerWeights>,
    pub(crate) final_norm: Tensor<bf16>,
    /// The embedding table itself when the config ties them.
    pub(crate) lm_head: Tensor<bf16>,
}

impl Weights {
    /// Bytes of every distinct weight tensor (a tied head counted once).
    pub(crate) fn bytes(&self) -> usize {
        let layer = |l: &LayerWeights| {
            [
                &l.attn_norm,
                &l.wqkv,
                &l.wo,
                &l.mlp_norm,
                &l.w_gate_up,
                &l.w_down,
            ]
            .iter()
            .map(|t| t.len())
            .sum::<usize>()
        };
        let head = if Arc::ptr_eq(self.lm_head.buffer(), self.embed.buffer()) {
            0
        } else {
            self.lm_head.len()
        };
        2 * (self.embed.len()
            + self.layers.iter().map(layer).sum::<usize>()
            + self.final_norm.len()
            + head)
    }
}

/// The checkpoint tensors of a model, in Hugging Face's names, with their shapes, made as
/// they are asked for (a config of absurdly many layers lists nothing ahead of its first
/// missing tensor). The config must be valid ([`LlamaConfig::validate`]): the shapes are
/// products of its sizes.
pub(crate) fn hf_tensors(cfg: &LlamaConfig) -> impl Iterator<Item = (String, Vec<usize>)> {
    let (d, i) = (cfg.hidden_size, cfg.intermediate_size);
    let (q, kv) = (
        cfg.num_attention_heads * cfg.head_dim(),
        cfg.kv_heads() * cfg.head_dim(),
    );
    let vocab = cfg.vocab_size;
    let layer = move |l: usize| {
        let p = format!("model.layers.{l}");
        [
            (format!("{p}.input_layernorm.weight"), vec![d]),
            (format!("{p}.self_attn.q_proj.weight"), vec![q, d]),
            (format!("{p}.self_attn.k_proj.weight"), vec![kv, d]),
            (format!("{p}.self_attn.v_proj.weight"), vec![kv, d]),
            (format!("{p}.self_attn.o_proj.weight"), vec![d, q]),
            (format!("{p}.post_attention_layernorm.weight"), vec![d]),
            (format!("{p}.mlp.gate_proj.weight"), vec![i, d]),
            (format!("{p}.mlp.up_proj.weight"), vec![i, d]),
            (format!("{p}.mlp.down_proj.weight"), vec![d, i]),
        ]
    };
    let head = (!cfg.tie_word_embeddings).then(|| ("lm_head.weight".to_string(), vec![vocab, d]));
    std::iter::once(("model.embed_tokens.weight".to_string(), vec![vocab, d]))
        .chain((0..cfg.num_hidden_layers).flat_map(layer))
        .chain(std::iter::once(("model.norm.weight".to_string(), vec![d])))
        .chain(head)
}

/// Allocates one device tensor of `shape` and fills it with the checkpoint tensors `parts`
/// stacked along the first axis, each read through `stager`.
fn stacked(
    stream: &Stream,
    stager: &mut Stager<'_>,
    shape: &[usize],
    parts: &[(String, Vec<usize>)],
) -> Result<Tensor<bf16>, DeviceError> {
    let len: usize = shape.iter().product();
    let buffer = Arc::new(DeviceBuffer::<bf16>::alloc(stream, len)?);
    let mut offset = 0;
    for (name, part_shape) in parts {
        let n: usize = part_shape.iter().product();
        stager.read(name, part_shape, buffer.slice(offset..offset + n)?)?;
        offset += n;
    }
    Tensor::from_buffer(buffer, shape)
}

/// Builds the device weights of `cfg`, reading every checkpoint tensor through `stager`.
pub(crate) fn build(
    stream: &Stream,
    cfg: &LlamaConfig,
    stager: &mut Stager<'_>,
) -> Result<Weights, DeviceError> {
    // Every tensor is found, and of the right shape, dtype and size, and no other is in the
    // checkpoint, before the first allocation: a config that does not describe the
    // checkpoint allocates nothing.
    stager.check_all(hf_tensors(cfg), cfg.tie_word_embeddings)?;
    // And weights the device's memory cannot hold are refused then too, not found out by the
    // allocation that fails after the ones before it were filled.
    ensure_fits(stream.device(), cfg.bf16_weight_bytes()?, 0)?;
    let mut names = hf_tensors(cfg);
    let mut next = || {
        names
            .next()
            .ok_or_else(|| DeviceError::internal("the tensor list of the config ran short"))
    };
    let single = |stager: &mut Stager<'_>, t: (String, Vec<usize>)| {
        stacked(stream, stager, &t.1.clone(), &[t])
    };
    let embed = single(stager, next()?)?;
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for _ in 0..cfg.num_hidden_layers {
        let attn_norm = single(stager, next()?)?;
        let (q, k, v) = (next()?, next()?, next()?);
        let wqkv = stacked(
            stream,
            stager,
            &[cfg.qkv_rows(), cfg.hidden_size],
            &[q, k, v],
        )?;
        let wo = single(stager, next()?)?;
        let mlp_norm = single(stager, next()?)?;
        let (gate, up) = (next()?, next()?);
        let w_gate_up = stacked(
            stream,
            stager,
            &[2 * cfg.intermediate_size, cfg.hidden_size],
            &[gate, up],
        )?;
        let w_down = single(stager, next()?)?;
        layers.push(LayerWeights {
            attn_norm,
            wqkv,
            wo,
            mlp_norm,
            w_gate_up,
            w_down,
        });
    }
    let final_norm = single(stager, next()?)?;
    let lm_head = if cfg.tie_word_embeddings {
        embed.clone()
    } else {
        single(stager, next()?)?
    };
    stager.finish()?;
    Ok(Weights {
        embed,
        layers,
        final_norm,
        lm_head,
    })
}

/// The synthetic value of a checkpoint tensor: uniform values of mean `1` and spread `0.1`
/// for norm weights, of mean `0` and standard deviation `1/√in_features` for matrices (so
/// activations and logits stay of order one), drawn from a generator seeded by the model's
/// seed and the tensor's name.
pub(crate) fn synthetic_values(name: &str, shape: &[usize], seed: u64) -> Vec<bf16> {
    let mut state = name.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) | 1;
    let n: usize = shape.iter().product();
    let (mean, half_width) = if shape.len() == 1 {
        (1.0f32, 0.1f32)
    } else {
        let fan_in = shape.last().copied().unwrap_or(1).max(1) as f32;
        (0.0, (3.0 / fan_in).sqrt())
    };
    (0..n)
        .map(|_| {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
            let u = bits as f32 * (1.0 / 16_777_216.0);
            bf16::from_f32(mean + (2.0 * u - 1.0) * half_width)
        })
        .collect()
}

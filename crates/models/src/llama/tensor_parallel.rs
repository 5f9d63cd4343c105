//! Tensor parallelism, Megatron-style: each of `tp` ranks holds a slice of every layer and the
//! ranks sum their partial results with one all-reduce after the attention output projection
//! and one after the MLP down projection.
//!
//! Rank `r` holds query heads `r · h/tp ..`, key/value heads `r · kv/tp ..` (the rows of the
//! query, key and value projections: column-parallel), the matching columns of the output
//! projection (row-parallel), rows `r · i/tp ..` of the gate and up projections and the
//! matching columns of the down projection. Embeddings, norms and the head are replicated. So
//! a rank's weights are exactly those of a *local* config (`h/tp` heads, `kv/tp` key/value
//! heads, `i/tp` MLP width, the same hidden size and head width), and the decode step runs
//! unchanged on them, but for its two residual adds: rank 0 adds its partial product to the
//! residual stream, the other ranks store theirs, and the all-reduce leaves the sum of the
//! stream and every partial on every rank.

use std::collections::HashMap;

use cuflow_runtime::DeviceError;

use super::config::LlamaConfig;
use super::testing::CheckpointTensor;

/// The config of one rank's slice of `cfg` split over `tp` ranks.
///
/// # Errors
///
/// [`DeviceError::Usage`] when the query heads, key/value heads or MLP width do not divide by
/// `tp` (or the slice's MLP width is not a multiple of 8).
pub(crate) fn local_config(cfg: &LlamaConfig, tp: usize) -> Result<LlamaConfig, DeviceError> {
    let split = |what: &str, n: usize| -> Result<usize, DeviceError> {
        if tp == 0 || !n.is_multiple_of(tp) {
            return Err(DeviceError::usage(format!(
                "tensor parallelism over {tp} ranks splits {what} ({n}) evenly; choose a \
                 number of ranks that divides it"
            )));
        }
        Ok(n / tp)
    };
    let mut local = cfg.clone();
    local.head_dim = Some(cfg.head_dim());
    local.num_attention_heads = split("num_attention_heads", cfg.num_attention_heads)?;
    local.num_key_value_heads = Some(split("num_key_value_heads", cfg.kv_heads())?);
    local.intermediate_size = split("intermediate_size", cfg.intermediate_size)?;
    if !local.intermediate_size.is_multiple_of(8) {
        return Err(DeviceError::usage(format!(
            "tensor parallelism over {tp} ranks leaves each an MLP width of {}, which the \
             kernels need to be a multiple of 8",
            local.intermediate_size
        )));
    }
    Ok(local)
}

/// Rows `rows` of a row-major `[_, cols]` matrix of 2-byte elements.
fn rows(t: &CheckpointTensor, range: std::ops::Range<usize>, cols: usize) -> Vec<u8> {
    t.data[range.start * cols * 2..range.end * cols * 2].to_vec()
}

/// Columns `range` of a row-major `[rows, cols]` matrix of 2-byte elements.
fn columns(t: &CheckpointTensor, range: std::ops::Range<usize>, cols: usize) -> Vec<u8> {
    t.data
        .chunks_exact(cols * 2)
        .flat_map(|row| &row[range.start * 2..range.end * 2])
        .copied()
        .collect()
}

/// Rank `rank`'s slice (of `tp`) of the `bf16` checkpoint tensors `full` of `cfg`.
pub(crate) fn shard(
    full: &HashMap<String, CheckpointTensor>,
    cfg: &LlamaConfig,
    rank: usize,
    tp: usize,
) -> Result<HashMap<String, CheckpointTensor>, DeviceError> {
    let local = local_config(cfg, tp)?;
    let (d, hd) = (cfg.hidden_size, cfg.head_dim());
    let (q, kv, i) = (
        local.num_attention_heads * hd,
        local.kv_heads() * hd,
        local.intermediate_size,
    );
    let (q_all, i_all) = (cfg.num_attention_heads * hd, cfg.intermediate_size);
    let mut out = HashMap::with_capacity(full.len());
    for (name, t) in full {
        let kind = name.rsplit('.').nth(1).unwrap_or("");
        let (shape, data) = match kind {
            "q_proj" => (vec![q, d], rows(t, rank * q..(rank + 1) * q, d)),
            "k_proj" | "v_proj" => (vec![kv, d], rows(t, rank * kv..(rank + 1) * kv, d)),
            "o_proj" => (vec![d, q], columns(t, rank * q..(rank + 1) * q, q_all)),
            "gate_proj" | "up_proj" => (vec![i, d], rows(t, rank * i..(rank + 1) * i, d)),
            "down_proj" => (vec![d, i], columns(t, rank * i..(rank + 1) * i, i_all)),
            _ => (t.shape.clone(), t.data.clone()),
        };
        out.insert(
            name.clone(),
            CheckpointTensor {
                name: name.clone(),
                dtype: t.dtype,
                shape,
                data,
            },
        );
    }
    Ok(out)
}

//! Kernels for batch-1 decoding of transformer language models, with `bf16` weights and
//! caches and `f32` activations: a memory-bound GEMV with the RMS norm of its input, the
//! residual add or SwiGLU fused in, RMS norms fused with a residual add (for prefill),
//! RoPE fused with the key/value cache append, split-K attention over the cache
//! (flash-decoding), the two in one kernel for a decode step's single row, SiLU·mul, and
//! on-device sampling.
//!
//! Every function returns an op that writes into outputs the caller owns (`&mut Tensor`) and
//! allocates nothing, so a decode step built from them can be captured into a graph and
//! replayed with its intermediates in memory allocated once. Values that change from step to
//! step (the position, the token, the random generator's counter) are read from and written
//! to device tensors by the kernels, never passed as scalars, so one captured step serves
//! every position.
//!
//! Every tensor they take must be contiguous: a contiguous view (rows of a larger tensor) is
//! passed from its first element, and a strided view is refused with
//! [`DeviceError::InvalidShape`], since copying it would allocate. The kernels index in 32
//! bits: a size they take (rows, columns, vocabulary, positions, ...) past `2^31 - 1` is an
//! [`DeviceError::InvalidShape`] too.
//!
//! Layouts (row-major):
//! - a linear weight is `[out_features, in_features]` `bf16`, with `in_features` a multiple
//!   of 8 (the GEMV reads it in 16-byte vectors);
//! - a layer's key/value cache is `[2, kv_heads, max_seq, head_dim]` `bf16`: keys, then
//!   values, each head's positions contiguous;
//! - the fused projection output `qkv` is `[rows, (heads + 2 · kv_heads) · head_dim]` `f32`:
//!   the query heads, then the key heads, then the value heads.
//!
//! Invariants the kernels keep whatever the device tensors hold: a position at or past
//! `max_seq` writes nothing into the cache and is read as `max_seq - 1`; a token id past the
//! vocabulary embeds as zeros; the generated-token buffer is written only below its length.

mod attention;
mod gemv;
mod norm;
mod rope;
mod sample;

pub use attention::{
    attention, attention_partitions, rope_attention, AttentionCounters, AttentionShape,
};
pub use gemv::{gemv, gemv_fused, GemvEpilogue, GemvInput};
pub use norm::{embed_rows, residual_rms_norm, rms_norm_rows, silu_mul};
pub use rope::rope_kv_append;
pub use sample::{sample, SampleParams, SAMPLE_SCRATCH_LEN};

use cuflow_runtime::{Device, DeviceError};

use crate::dtype::DType;
use crate::tensor::Tensor;

/// Compiles every decode kernel a model with attention of `shape` launches, for `device`, now
/// (a no-op on the host backend), so that a capture that follows compiles nothing. The
/// attention kernels are compiled for `shape`'s head width and group size only (`max_seq`
/// does not matter).
///
/// # Errors
///
/// [`DeviceError::Compile`] with the compiler's log, or [`DeviceError::NoCompiler`];
/// [`DeviceError::InvalidShape`] for a shape the attention kernels do not support.
pub fn compile_all(device: &Device, shape: AttentionShape) -> Result<(), DeviceError> {
    shape.check("compile_all")?;
    for k in gemv::kernels(device)
        .into_iter()
        .chain([
            norm::residual_kernel(),
            norm::plain_kernel(),
            norm::embed_kernel(),
            norm::silu_mul_kernel(),
            rope::kernel(),
            sample::kernel(),
            sample::argmax_kernel(),
        ])
        .chain(attention::kernels(&shape))
    {
        k.compile(device)?;
    }
    Ok(())
}

/// `Err(InvalidShape)` unless `t` holds exactly `len` elements.
fn check_len<T: DType>(
    op: &'static str,
    name: &str,
    t: &Tensor<T>,
    len: usize,
) -> Result<(), DeviceError> {
    if t.len() != len {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "`{name}` must hold {len} elements, but its shape {:?} holds {}",
                t.shape(),
                t.len()
            ),
        });
    }
    Ok(())
}

/// The largest size the kernels take: below 2^31, so that their `unsigned` loops over it
/// (`i += blockDim.x`, at most 1024 a step) and the sums of a size and a block count never
/// pass `u32::MAX` and wrap (a loop over a size near `u32::MAX` would wrap to its start and
/// never end).
const MAX_SIZE: u32 = i32::MAX as u32;

/// A size as the `u32` the kernels take, at most [`MAX_SIZE`].
fn u32_of(op: &'static str, what: &str, v: usize) -> Result<u32, DeviceError> {
    u32::try_from(v)
        .ok()
        .filter(|&v| v <= MAX_SIZE)
        .ok_or_else(|| DeviceError::InvalidShape {
            op,
            reason: format!(
                "{what} = {v} does not fit the kernel's 32-bit indices (at most 2^31 - 1)"
            ),
        })
}

/// The value of a one-element index tensor on the host side of a kernel (past every table
/// when it is empty).
fn first_index(t: &[u32]) -> usize {
    t.first().map_or(usize::MAX, |&v| v as usize)
}

/// `bf16` conversions of the CUDA C sources (`ld_bf16`, `st_bf16`, `T_bf16`).
fn bf16_defs() -> String {
    crate::dtype::cuda_defs::<half::bf16>()
}

#[cfg(test)]
mod tests {
    use super::u32_of;

    /// Sizes stop below 2^31, where a loop stepping by a block of threads could pass
    /// `u32::MAX`.
    #[test]
    fn sizes_stop_below_2_pow_31() {
        assert_eq!(u32_of("t", "n", (1 << 31) - 1).ok(), Some((1 << 31) - 1));
        for v in [1usize << 31, u32::MAX as usize - 1, u32::MAX as usize] {
            let e = u32_of("t", "vocab", v).unwrap_err().to_string();
            assert!(e.contains("vocab") && e.contains("2^31 - 1"), "{e}");
        }
    }
}

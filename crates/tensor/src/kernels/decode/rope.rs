//! Rotary position embedding fused with the key/value cache append: one kernel rotates the
//! query heads into their own buffer and writes the rotated keys and the values of each row's
//! position into the cache, so the projection output is read once and nothing else touches
//! the cache before attention.
//!
//! Rotation pairs element `i` with element `i + head_dim / 2` (the "rotate half" convention
//! of Hugging Face Llama checkpoints): `(a, b) → (a·cos θ − b·sin θ, b·cos θ + a·sin θ)` with
//! `θ = position · inv_freq[i]`, computed in `f32`. The table `inv_freq` (`head_dim / 2`
//! frequencies) carries `rope_theta` and any frequency scaling; the caller computes it once.

use cuflow_device_op::{from_fn, ExecutionContext};
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig};
use half::bf16;

use super::{bf16_defs, check_len, first_index, u32_of, AttentionShape};
use crate::kernels::check_device;
use crate::op::{cached_kernel, TensorOp};
use crate::tensor::Tensor;

pub(super) fn kernel() -> Kernel {
    cached_kernel("decode_rope_kv_append", "bf16", || {
        let source = format!(
            r#"{defs}
extern "C" __global__ void decode_rope_kv_append(float* q_out, T_bf16* cache, const float* qkv,
                                                 const float* inv_freq, const unsigned* pos,
                                                 unsigned heads, unsigned kv_heads,
                                                 unsigned head_dim, unsigned max_seq) {{
  const unsigned all = heads + kv_heads;
  const unsigned row = blockIdx.x / all, h = blockIdx.x % all;
  // The row's position in 64 bits, as on the host: near the top of u32, pos[0] + row passes
  // it, and such a row writes nothing into the cache (not row 0).
  const unsigned long long p = (unsigned long long)pos[0] + row;
  const unsigned half = head_dim / 2;
  const float* src = qkv + (unsigned long long)row * (heads + 2 * kv_heads) * head_dim;
  for (unsigned i = threadIdx.x; i < half; i += blockDim.x) {{
    float s, c;
    sincosf((float)p * inv_freq[i], &s, &c);
    if (h < heads) {{
      const float* x = src + (unsigned long long)h * head_dim;
      float* o = q_out + ((unsigned long long)row * heads + h) * head_dim;
      const float a = x[i], b = x[i + half];
      o[i] = a * c - b * s;
      o[i + half] = b * c + a * s;
    }} else if (p < max_seq) {{
      const unsigned kh = h - heads;
      const float* k = src + (unsigned long long)(heads + kh) * head_dim;
      const float* v = src + (unsigned long long)(heads + kv_heads + kh) * head_dim;
      T_bf16* kd = cache + ((unsigned long long)kh * max_seq + p) * head_dim;
      T_bf16* vd = cache + ((unsigned long long)(kv_heads + kh) * max_seq + p) * head_dim;
      const float a = k[i], b = k[i + half];
      kd[i] = st_bf16(a * c - b * s);
      kd[i + half] = st_bf16(b * c + a * s);
      vd[i] = st_bf16(v[i]);
      vd[i + half] = st_bf16(v[i + half]);
    }}
  }}
}}
"#,
            defs = bf16_defs()
        );
        crate::op::builtin_kernel("decode_rope_kv_append", source).with_host(|args| {
            let qkv = args.input::<f32>(2)?;
            let inv_freq = args.input::<f32>(3)?;
            let start = first_index(args.input::<u32>(4)?);
            let heads = args.scalar::<u32>(5)? as usize;
            let kv_heads = args.scalar::<u32>(6)? as usize;
            let hd = args.scalar::<u32>(7)? as usize;
            let max_seq = args.scalar::<u32>(8)? as usize;
            let q_out = args.output::<f32>(0)?;
            let cache = args.output::<bf16>(1)?;
            let (half, width) = (hd / 2, (heads + 2 * kv_heads) * hd);
            let rotate = |x: &[f32], p: usize, out: &mut dyn FnMut(usize, f32)| {
                for i in 0..half {
                    let (s, c) = (p as f32 * inv_freq[i]).sin_cos();
                    let (a, b) = (x[i], x[i + half]);
                    out(i, a * c - b * s);
                    out(i + half, b * c + a * s);
                }
            };
            for (row, src) in qkv.chunks(width.max(1)).enumerate() {
                let p = start.saturating_add(row);
                for h in 0..heads {
                    let o = &mut q_out[(row * heads + h) * hd..(row * heads + h + 1) * hd];
                    rotate(&src[h * hd..(h + 1) * hd], p, &mut |i, v| o[i] = v);
                }
                if p >= max_seq {
                    continue;
                }
                for kh in 0..kv_heads {
                    let k = &src[(heads + kh) * hd..(heads + kh + 1) * hd];
                    let kd = (kh * max_seq + p) * hd;
                    rotate(k, p, &mut |i, v| cache[kd + i] = bf16::from_f32(v));
                    let v = &src[(heads + kv_heads + kh) * hd..(heads + kv_heads + kh + 1) * hd];
                    let vd = ((kv_heads + kh) * max_seq + p) * hd;
                    for (d, v) in cache[vd..vd + hd].iter_mut().zip(v) {
                        *d = bf16::from_f32(*v);
                    }
                }
            }
            Ok(())
        })
    })
}

/// Rotates the queries and keys of `qkv` (`f32`, `[rows, (heads + 2 · kv_heads) · head_dim]`)
/// for positions `pos[0] + row`, writes the rotated queries into `q` (`f32`,
/// `[rows, heads · head_dim]`) and the rotated keys and the values into `cache` (`bf16`,
/// `[2, kv_heads, max_seq, head_dim]`) at those positions. `inv_freq` holds the
/// `head_dim / 2` rotation frequencies; `pos` (`u32`, `[1]`) is read on the device.
/// Positions at or past `max_seq` are not written to the cache.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `rope_kv_append` when `shape` breaks a rule of
/// [`AttentionShape`] (a size of zero among them, the error naming it) or a shape disagrees
/// with it.
pub fn rope_kv_append<'a>(
    q: &'a mut Tensor<f32>,
    cache: &'a mut Tensor<bf16>,
    qkv: &'a Tensor<f32>,
    inv_freq: &'a Tensor<f32>,
    pos: &'a Tensor<u32>,
    shape: AttentionShape,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        const OP: &str = "rope_kv_append";
        let stream = ctx.stream()?;
        for t in [&*q, qkv, inv_freq] {
            check_device(OP, stream, t)?;
        }
        check_device(OP, stream, cache)?;
        check_device(OP, stream, pos)?;
        shape.check(OP)?;
        let hd = shape.head_dim;
        let width = (shape.heads + 2 * shape.kv_heads) * hd;
        if !qkv.len().is_multiple_of(width) {
            return Err(DeviceError::InvalidShape {
                op: OP,
                reason: format!("`qkv` {:?} is not made of rows of {width}", qkv.shape()),
            });
        }
        let rows = qkv.len() / width;
        check_len(OP, "q", q, rows * shape.heads * hd)?;
        check_len(OP, "cache", cache, shape.cache_len())?;
        check_len(OP, "inv_freq", inv_freq, hd / 2)?;
        check_len(OP, "pos", pos, 1)?;
        if rows == 0 {
            return Ok(());
        }
        let blocks = rows * (shape.heads + shape.kv_heads);
        kernel().launch(
            stream,
            LaunchConfig::linear(
                u32_of(OP, "blocks", blocks)?,
                (hd as u32 / 2).clamp(32, 256),
            ),
            KernelArgs::new()
                .output(q.view("decode::rope_kv_append")?)
                .output(cache.view("decode::rope_kv_append")?)
                .input(qkv.view("decode::rope_kv_append")?)
                .input(inv_freq.view("decode::rope_kv_append")?)
                .input(pos.view("decode::rope_kv_append")?)
                .scalar(u32_of(OP, "heads", shape.heads)?)
                .scalar(u32_of(OP, "kv_heads", shape.kv_heads)?)
                .scalar(u32_of(OP, "head_dim", hd)?)
                .scalar(u32_of(OP, "max_seq", shape.max_seq)?),
        )
    })
}

//! The model's own kernels: the key/value cache write, decode attention over the cache, and
//! the token record, each with CUDA C source and a host implementation.

use cuflow_runtime::{DeviceError, Kernel};

use crate::kernels::reviewed_kernel;

/// Threads per block of the attention kernel (a multiple of the warp size).
pub(super) const ATTENTION_THREADS: u32 = 512;

/// The value of a one-element index tensor (past every table when it is empty).
fn first_index(t: &[u32]) -> usize {
    t.first().map_or(usize::MAX, |&v| v as usize)
}

/// Writes the key and value of the current position into a layer's cache: block 0 copies
/// `qkv[d..2d]` into `cache[0, pos]`, block 1 copies `qkv[2d..3d]` into `cache[1, pos]`.
pub(super) fn kv_write_kernel() -> Kernel {
    let kernel = reviewed_kernel(
        "kv_cache_write",
        r#"extern "C" __global__ void kv_cache_write(float* cache, const float* qkv,
                                                     const unsigned* pos, unsigned d_model,
                                                     unsigned max_seq,
                                                     unsigned long long n_cache,
                                                     unsigned long long n_qkv,
                                                     unsigned long long n_pos) {
            if (n_pos == 0) return;
            const unsigned p = *pos;
            if (p >= max_seq) return;
            const size_t dst = ((size_t)blockIdx.x * max_seq + p) * d_model;
            const size_t src = (size_t)(blockIdx.x + 1) * d_model;
            for (unsigned c = threadIdx.x; c < d_model; c += blockDim.x) {
                if (dst + c < n_cache && src + c < n_qkv) cache[dst + c] = qkv[src + c];
            }
        }"#,
    );
    kernel.with_host(|args| {
        let qkv = args.input::<f32>(1)?;
        let p = first_index(args.input::<u32>(2)?);
        let d = args.scalar::<u32>(3)? as usize;
        let s = args.scalar::<u32>(4)? as usize;
        let cache = args.output::<f32>(0)?;
        if p < s && cache.len() >= 2 * s * d && qkv.len() >= 3 * d {
            for half in 0..2 {
                let dst = (half * s + p) * d;
                cache[dst..dst + d].copy_from_slice(&qkv[(half + 1) * d..(half + 2) * d]);
            }
        }
        Ok(())
    })
}

/// Attention of one query over the cached keys and values of positions `0..=pos`, one block
/// per head: scores `q·k / √head_dim` (one warp per cached row), softmax, weighted sum of the
/// value rows (the block's threads split over columns and groups of rows).
const ATTENTION_SOURCE: &str = r#"
__device__ float block_reduce(float v, float* red, bool take_max) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = take_max ? fmaxf(v, w) : v + w;
  }
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (unsigned w = 1; w < warps; ++w) v = take_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

extern "C" __global__ void decode_attention(float* out, const float* qkv, const float* cache,
                                            const unsigned* pos, unsigned d_model,
                                            unsigned head_dim, unsigned max_seq, float scale,
                                            unsigned long long n_out, unsigned long long n_qkv,
                                            unsigned long long n_cache,
                                            unsigned long long n_pos) {
  extern __shared__ float smem[];
  /* Every access below stays within the element counts and the dynamic shared memory this
     launch was given, or the block does nothing (a condition alike for all its threads). */
  unsigned smem_bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem_bytes));
  const unsigned long long heads = gridDim.x, width = blockDim.x > head_dim ? blockDim.x : head_dim;
  if (n_pos == 0 || max_seq == 0 || head_dim == 0 || blockDim.x % 32 != 0
      || heads * head_dim > d_model || n_out < heads * head_dim
      || n_qkv < 3ull * d_model || n_cache < 2ull * max_seq * d_model
      || (unsigned long long)smem_bytes < (max_seq + 32ull + width) * sizeof(float)) {
    return;
  }
  float* scores = smem;
  float* red = scores + max_seq;
  float* part = red + 32;
  const unsigned h = blockIdx.x, tid = threadIdx.x;
  const unsigned lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const unsigned p = *pos;
  const unsigned n = (p < max_seq ? p : max_seq - 1) + 1;
  const float* q = qkv + (size_t)h * head_dim;
  const float* keys = cache + (size_t)h * head_dim;
  const float* values = cache + (size_t)max_seq * d_model + (size_t)h * head_dim;

  for (unsigned t = warp; t < n; t += warps) {
    const float* k = keys + (size_t)t * d_model;
    float s = 0.0f;
    for (unsigned c = lane; c < head_dim; c += 32) s += q[c] * k[c];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) scores[t] = s * scale;
  }
  __syncthreads();

  float m = -__int_as_float(0x7f800000);
  for (unsigned t = tid; t < n; t += blockDim.x) m = fmaxf(m, scores[t]);
  m = block_reduce(m, red, true);
  float sum = 0.0f;
  for (unsigned t = tid; t < n; t += blockDim.x) {
    const float e = expf(scores[t] - m);
    scores[t] = e;
    sum += e;
  }
  sum = block_reduce(sum, red, false);

  const unsigned groups = blockDim.x >= head_dim ? blockDim.x / head_dim : 1;
  const unsigned g = blockDim.x >= head_dim ? tid / head_dim : 0;
  if (g < groups) {
    for (unsigned c = tid % head_dim; c < head_dim; c += blockDim.x) {
      float acc = 0.0f;
      for (unsigned t = g; t < n; t += groups) acc += scores[t] * values[(size_t)t * d_model + c];
      part[g * head_dim + c] = acc;
    }
  }
  __syncthreads();
  const float inv = 1.0f / sum;
  for (unsigned c = tid; c < head_dim; c += blockDim.x) {
    float acc = 0.0f;
    for (unsigned j = 0; j < groups; ++j) acc += part[j * head_dim + c];
    out[(size_t)h * head_dim + c] = acc * inv;
  }
}
"#;

pub(super) fn attention_kernel() -> Kernel {
    let kernel = reviewed_kernel("decode_attention", ATTENTION_SOURCE);
    kernel.with_host(|args| {
        let qkv = args.input::<f32>(1)?;
        let cache = args.input::<f32>(2)?;
        let p = first_index(args.input::<u32>(3)?);
        let d = args.scalar::<u32>(4)? as usize;
        let hd = args.scalar::<u32>(5)? as usize;
        let s = args.scalar::<u32>(6)? as usize;
        let scale = args.scalar::<f32>(7)?;
        let out = args.output::<f32>(0)?;
        let n = p.min(s.saturating_sub(1)) + 1;
        if cache.len() < 2 * s * d || qkv.len() < 3 * d || out.len() > d || s * d * hd == 0 {
            return Err(DeviceError::usage(
                "decode_attention: the buffers do not match the sizes passed",
            ));
        }
        let (keys, values) = cache.split_at(s * d);
        let mut scores = vec![0f32; n];
        for (h, out) in out.chunks_mut(hd).enumerate() {
            let q = &qkv[h * hd..(h + 1) * hd];
            for (t, score) in scores.iter_mut().enumerate() {
                let k = &keys[t * d + h * hd..t * d + (h + 1) * hd];
                *score = q.iter().zip(k).map(|(q, k)| q * k).sum::<f32>() * scale;
            }
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for score in scores.iter_mut() {
                *score = (*score - m).exp();
                sum += *score;
            }
            for (c, o) in out.iter_mut().enumerate() {
                let acc: f32 = scores
                    .iter()
                    .enumerate()
                    .map(|(t, e)| e * values[t * d + h * hd + c])
                    .sum();
                *o = acc / sum;
            }
        }
        Ok(())
    })
}

/// `history[pos] = next[0]` (one thread), skipping positions past the history.
pub(super) fn record_kernel() -> Kernel {
    let kernel = reviewed_kernel(
        "record_token",
        r#"extern "C" __global__ void record_token(unsigned* history, const unsigned* next,
                                                   const unsigned* pos, unsigned len,
                                                   unsigned long long n_history,
                                                   unsigned long long n_next,
                                                   unsigned long long n_pos) {
            if (threadIdx.x != 0 || n_next == 0 || n_pos == 0) return;
            const unsigned p = *pos;
            if (p < len && p < n_history) history[p] = next[0];
        }"#,
    );
    kernel.with_host(|args| {
        let next = args.input::<u32>(1)?.first().copied();
        let p = first_index(args.input::<u32>(2)?);
        if let (Some(next), Some(slot)) = (next, args.output::<u32>(0)?.get_mut(p)) {
            *slot = next;
        }
        Ok(())
    })
}

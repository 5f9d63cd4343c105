//! Attention of query rows over a layer's key/value cache, split over the sequence
//! (flash-decoding): the positions `0..=p` a query attends are cut into partitions of
//! `chunk` positions, each partition is reduced by its own block into a partial result (its
//! score maximum `m`, the sum `l` of `exp(score − m)`, and the `exp`-weighted sum of values),
//! and the partitions of each head are combined with the usual rescaling. Long contexts thus
//! spread over many blocks instead of one block per head.
//!
//! One kernel does both: when a single partition covers the context its block writes the
//! normalized result directly; otherwise each block publishes its partial result and
//! increments a counter per (row, key/value head), and the block that brings it to the
//! number of live partitions combines them and resets the counter to zero. As the choice
//! is made on the device, one launch serves every position of a captured step.
//!
//! Grouped-query attention reads each key and value once per group: a block handles one
//! key/value head and all the query heads that share it. Query row `r` sits at position
//! `pos[0] + r` and attends positions `0..=pos[0] + r` (causal), clamped to the cache.
//!
//! [`rope_attention`] is the same kernel for the one query row of a decode step with RoPE and
//! the cache append of `rope_kv_append` folded in: one launch instead of two per layer.
//!
//! The partial results live in a scratch tensor the caller allocates once,
//! `[rows, heads, parts, head_dim + 2]` `f32`; partitions past a row's last position are
//! neither written nor read (their blocks exit at once), and when one partition covers the
//! row nothing is written there. The counters, `[rows · kv_heads]` `u32`, must be zero
//! before the first launch; every launch leaves them zero.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cuflow_device_op::{from_fn, DeviceOp, ExecutionContext};
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig};
use half::bf16;

use super::{bf16_defs, check_len, first_index, u32_of};
use crate::kernels::check_device;
use crate::op::TensorOp;
use crate::tensor::Tensor;

/// Threads per block of the partial kernel.
const PARTIAL_THREADS: usize = 256;
/// The largest partition the partial kernel holds scores for.
const MAX_CHUNK: usize = 1024;
/// The most query heads that share one key/value head.
const MAX_GROUP: usize = 8;

/// The sizes of multi-head attention over a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Query heads; a positive multiple of `kv_heads`, at most 8 per key/value head.
    pub heads: usize,
    /// Key/value heads; positive.
    pub kv_heads: usize,
    /// Width of a head: a power of two from 16 to 256.
    pub head_dim: usize,
    /// Positions the cache holds; positive.
    pub max_seq: usize,
}

impl AttentionShape {
    /// Elements of one layer's cache, `[2, kv_heads, max_seq, head_dim]`, saturating at
    /// `usize::MAX` (the kernels refuse a shape whose cache does not fit in `usize`).
    pub fn cache_len(&self) -> usize {
        [2, self.kv_heads, self.max_seq, self.head_dim]
            .iter()
            .fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Whether the width of a row of the fused projection, `(heads + 2 · kv_heads) ·
    /// head_dim`, and the cache's element count fit in `usize`: every other size the kernels
    /// compute from the shape is at most one of them.
    fn sizes_fit(&self) -> bool {
        let sizes = || {
            let kv2 = self.kv_heads.checked_mul(2)?;
            kv2.checked_add(self.heads)?.checked_mul(self.head_dim)?;
            kv2.checked_mul(self.max_seq)?.checked_mul(self.head_dim)
        };
        sizes().is_some()
    }

    pub(super) fn check(&self, op: &'static str) -> Result<(), DeviceError> {
        let bad = |reason: String| Err(DeviceError::InvalidShape { op, reason });
        // Rows, groups and partitions are counted by dividing by these sizes.
        for (field, size) in [
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("max_seq", self.max_seq),
        ] {
            if size == 0 {
                return bad(format!("`{field}` is 0; it must be positive"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} key/value heads",
                self.heads, self.kv_heads
            ));
        }
        if self.heads / self.kv_heads > MAX_GROUP {
            return bad(format!(
                "{} query heads per key/value head; at most {MAX_GROUP} are supported",
                self.heads / self.kv_heads
            ));
        }
        if !(16..=256).contains(&self.head_dim) || !self.head_dim.is_power_of_two() {
            return bad(format!(
                "head_dim {} must be a power of two from 16 to 256",
                self.head_dim
            ));
        }
        if !self.sizes_fit() {
            return bad(format!(
                "{} query and {} key/value heads of width {} over {} positions overflow usize \
                 (the row width (heads + 2 · kv_heads) · head_dim, or the cache's \
                 2 · kv_heads · max_seq · head_dim elements)",
                self.heads, self.kv_heads, self.head_dim, self.max_seq
            ));
        }
        Ok(())
    }
}

/// The number of partitions of about `chunk` positions that cover `max_seq` positions: the
/// third axis of the scratch tensor of [`attention`]. Partitions hold at most 1024 positions.
pub fn attention_partitions(max_seq: usize, chunk: usize) -> usize {
    max_seq.div_ceil(chunk.clamp(1, MAX_CHUNK)).max(1)
}

/// The template arguments of the kernels for `shape`: the head width, and the group size
/// where the kernel has code specialized for it (widths 64 and 128, groups of 1, 2, 4 or 8),
/// else 0 (the group is read at run time). Each variant is compiled on its own, the first
/// time a shape needs it: compiling all of them at once took some 20 seconds a kernel.
fn variant(shape: &AttentionShape) -> (usize, usize) {
    let g = shape.heads / shape.kv_heads.max(1);
    let g_t = if matches!(shape.head_dim, 64 | 128) && matches!(g, 1 | 2 | 4 | 8) {
        g
    } else {
        0
    };
    (shape.head_dim, g_t)
}

/// The attention kernel (`rope`: the one with RoPE and the append folded in) for `shape`,
/// declared once per process and variant.
fn variant_kernel(rope: bool, shape: &AttentionShape) -> Kernel {
    type Variants = Mutex<HashMap<(bool, usize, usize), Kernel>>;
    static VARIANTS: OnceLock<Variants> = OnceLock::new();
    let (hd, g) = variant(shape);
    let mut map = match VARIANTS.get_or_init(Default::default).lock() {
        Ok(m) => m,
        Err(poisoned) => poisoned.into_inner(),
    };
    map.entry((rope, hd, g))
        .or_insert_with(|| {
            let name = if rope {
                "decode_rope_attention"
            } else {
                "decode_attention_split"
            };
            let source = SOURCE
                .replace("@DEFS@", &bf16_defs())
                .replace("@MAX_GROUP@", &MAX_GROUP.to_string())
                .replace("@THREADS@", &PARTIAL_THREADS.to_string())
                .replace("@HD@", &hd.to_string())
                .replace("@G@", &g.to_string());
            let kernel = crate::op::builtin_kernel(name, source);
            if rope {
                kernel.with_host(host_rope_attention)
            } else {
                kernel.with_host(host_attention)
            }
        })
        .clone()
}

/// Both attention kernels for `shape` (for `compile_all`).
pub(super) fn kernels(shape: &AttentionShape) -> [Kernel; 2] {
    [variant_kernel(false, shape), variant_kernel(true, shape)]
}

/// Dynamic shared memory of one block, in bytes: the scaled queries of the group
/// (`g · head_dim`), the scores of the partition (`g · chunk`), and one partial weighted sum
/// of values per warp (`warps · g · head_dim`).
fn shared_bytes(g: usize, head_dim: usize, chunk: usize) -> usize {
    (g * head_dim + g * chunk + PARTIAL_THREADS / 32 * g * head_dim) * std::mem::size_of::<f32>()
}

/// The CUDA C of the kernel. A block of 256 threads handles one partition of one key/value
/// head. At the short contexts of decoding the kernel is latency-bound (a few blocks, a chain
/// of dependent loads and barriers), so the code is shaped to issue its loads early and to
/// run no instruction it does not need:
///
/// - The head width, and for the common widths (64, 128) the group size, are template
///   parameters: the loops over a row's 16-byte vectors and over the group's query heads are
///   unrolled, every load of a key or value row is issued before any of them is used, and no
///   instruction is spent on heads past the group (a run-time width or group made each warp
///   wait out one load latency per vector and run the code of eight heads).
/// - Each thread's first key and value rows are loaded before the queries are waited for.
/// - Scores: `TPP` threads share a position, each loading at most four vectors of its key
///   row, and sum their dot products with shuffles.
/// - Values: `HD / 8` threads cover a row, a vector each; rows are summed with shuffles
///   within a warp, then across warps in shared memory.
const SOURCE: &str = r#"@DEFS@
#define MAX_GROUP @MAX_GROUP@
#define THREADS @THREADS@
__device__ __forceinline__ float bf_lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ void unpack8(uint4 w, float* f) {
  f[0] = bf_lo(w.x); f[1] = bf_hi(w.x); f[2] = bf_lo(w.y); f[3] = bf_hi(w.y);
  f[4] = bf_lo(w.z); f[5] = bf_hi(w.z); f[6] = bf_lo(w.w); f[7] = bf_hi(w.w);
}

// ROPE: the queries and this position's key and value come unrotated from the QKV row
// `qkv` (one query row); the block whose partition holds the position (`owner`) rotates the
// key, appends both rows to the cache at `p_rope`, and hands them to its own first loads
// through shared memory (no thread of it reads that row of the cache before the barrier).
template <int HD, int G, bool ROPE>
__device__ __forceinline__ void attend(
    float* out, float* part, unsigned* counts, const float* q, const T_bf16* cache,
    unsigned heads, unsigned kv_heads, unsigned max_seq, unsigned parts, unsigned chunk,
    float scale, unsigned row, unsigned kvh, unsigned pi, unsigned n, float* sm,
    const float* qkv, const float* inv_freq, T_bf16* cache_w, unsigned p_rope, bool owner) {
  constexpr int V8 = HD / 8;                        // 16-byte vectors per row
  constexpr int NG = G > 0 ? G : MAX_GROUP;        // query heads the loops unroll over
  constexpr int TPP = V8 / 4 > 4 ? V8 / 4 : (V8 < 4 ? V8 : 4);  // threads per score
  constexpr int PER = V8 / TPP;                     // vectors each of them loads
  constexpr int RG = THREADS / V8;                  // rows the value pass covers at once
  constexpr int U = 4;                              // value rows a thread loads at once
  __shared__ float s_m[MAX_GROUP], s_l[MAX_GROUP];
  __shared__ unsigned s_last;
  const unsigned g = G > 0 ? G : heads / kv_heads, W = HD + 2;
  const unsigned t0 = pi * chunk;
  const unsigned live = (n + chunk - 1) / chunk;
  const unsigned t1 = t0 + chunk < n ? t0 + chunk : n;
  const unsigned len = t1 - t0;
  const unsigned long long head0 = (unsigned long long)row * heads + (unsigned long long)kvh * g;
  float* outp = part + head0 * parts * W;
  float* outr = out + head0 * HD;
  float* qs = sm;                 // [g][HD], pre-scaled
  float* s = qs + g * HD;         // [g][chunk]
  float* red = s + g * chunk;     // [warps][g][HD]
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint4* K = (const uint4*)(cache + ((unsigned long long)kvh * max_seq + t0) * HD);
  const uint4* V = (const uint4*)(cache + ((unsigned long long)(kv_heads + kvh) * max_seq + t0) * HD);
  // The first key and value rows of each thread are loaded before the queries are waited
  // for: the three loads depend only on the position, and overlap.
  const unsigned sub = threadIdx.x % TPP, first_t = threadIdx.x / TPP;
  const unsigned cv = threadIdx.x % V8, rg = threadIdx.x / V8;
  // Rows the first loads may read from the cache: with ROPE, the owner's last row is written
  // by this block below and reaches its first loads through shared memory instead.
  const unsigned plen = ROPE && owner ? len - 1 : len;
  uint4 w[PER];
#pragma unroll
  for (int c = 0; c < PER; ++c)
    w[c] = first_t < plen ? K[(unsigned long long)first_t * V8 + sub + c * TPP] : make_uint4(0u, 0u, 0u, 0u);
  uint4 vw[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const unsigned tt = rg + u * RG;
    vw[u] = tt < plen ? V[(unsigned long long)tt * V8 + cv] : make_uint4(0u, 0u, 0u, 0u);
  }
  __shared__ uint4 s_new4[ROPE ? HD / 4 : 1];       // the new key and value rows
  T_bf16* s_new = (T_bf16*)s_new4;
  if (ROPE) {
    constexpr int H2 = HD / 2;
    const float pf = (float)p_rope;
    const float* src = qkv + (unsigned long long)kvh * g * HD;
    for (unsigned i = threadIdx.x; i < g * H2; i += THREADS) {
      const unsigned j = i / H2, d = i % H2;
      float sn, cs;
      sincosf(pf * inv_freq[d], &sn, &cs);
      const float a = src[j * HD + d], b = src[j * HD + d + H2];
      const float r0 = a * cs - b * sn, r1 = b * cs + a * sn;
      qs[j * HD + d] = r0 * scale;
      qs[j * HD + d + H2] = r1 * scale;
    }
    if (owner) {
      const float* k = qkv + (unsigned long long)(heads + kvh) * HD;
      const float* v = qkv + (unsigned long long)(heads + kv_heads + kvh) * HD;
      T_bf16* kd = cache_w + ((unsigned long long)kvh * max_seq + p_rope) * HD;
      T_bf16* vd = cache_w + ((unsigned long long)(kv_heads + kvh) * max_seq + p_rope) * HD;
      for (unsigned d = threadIdx.x; d < H2; d += THREADS) {
        float sn, cs;
        sincosf(pf * inv_freq[d], &sn, &cs);
        const float a = k[d], b = k[d + H2];
        const T_bf16 k0 = st_bf16(a * cs - b * sn), k1 = st_bf16(b * cs + a * sn);
        const T_bf16 v0 = st_bf16(v[d]), v1 = st_bf16(v[d + H2]);
        kd[d] = k0; kd[d + H2] = k1; vd[d] = v0; vd[d + H2] = v1;
        s_new[d] = k0; s_new[d + H2] = k1; s_new[HD + d] = v0; s_new[HD + d + H2] = v1;
      }
    }
  } else {
    const float* qrow = q + head0 * HD;
    for (unsigned i = threadIdx.x; i < g * HD; i += THREADS) qs[i] = qrow[i] * scale;
  }
  __syncthreads();
  if (ROPE && owner) {
    // The block's own new rows: the cache writes above are visible to the later loads of
    // this block after the barrier, and the first loads take them from shared memory.
    const uint4* nk = s_new4;
    if (first_t == len - 1) {
#pragma unroll
      for (int c = 0; c < PER; ++c) w[c] = nk[sub + c * TPP];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) if (rg + u * RG == len - 1) vw[u] = nk[V8 + cv];
  }

  // Scores of the partition's positions against the group's queries.
  const unsigned mask = TPP == 32 ? 0xffffffffu : (((1u << TPP) - 1u) << (lane & ~(unsigned)(TPP - 1)));
  for (unsigned t = first_t; t < len; t += THREADS / TPP) {
    if (t != first_t) {
#pragma unroll
      for (int c = 0; c < PER; ++c) w[c] = K[(unsigned long long)t * V8 + sub + c * TPP];
    }
    float acc[NG];
#pragma unroll
    for (int j = 0; j < NG; ++j) acc[j] = 0.0f;
#pragma unroll
    for (int c = 0; c < PER; ++c) {
      float kf[8];
      unpack8(w[c], kf);
      const unsigned base = (sub + c * TPP) * 8;
#pragma unroll
      for (int j = 0; j < NG; ++j) {
        if (G > 0 || j < (int)g) {
          const float* qj = qs + j * HD + base;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[j] = fmaf(qj[e], kf[e], acc[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NG; ++j) {
#pragma unroll
      for (int o = TPP / 2; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(mask, acc[j], o);
    }
    if (sub == 0) {
#pragma unroll
      for (int j = 0; j < NG; ++j) if (G > 0 || j < (int)g) s[j * chunk + t] = acc[j];
    }
  }
  __syncthreads();

  // Softmax of each head's scores: a warp per head.
  for (unsigned j = warp; j < g; j += THREADS / 32) {
    float m = -__int_as_float(0x7f800000);
    for (unsigned t = lane; t < len; t += 32) m = fmaxf(m, s[j * chunk + t]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.0f;
    for (unsigned t = lane; t < len; t += 32) {
      const float e = expf(s[j * chunk + t] - m);
      s[j * chunk + t] = e;
      l += e;
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) {
      s_l[j] = l;
      if (live > 1) {
        float* o = outp + ((unsigned long long)j * parts + pi) * W;
        o[HD] = m;
        o[HD + 1] = l;
      }
    }
  }
  __syncthreads();

  // The weighted sum of the value rows.
  float a[NG][8];
#pragma unroll
  for (int j = 0; j < NG; ++j) {
#pragma unroll
    for (int d = 0; d < 8; ++d) a[j][d] = 0.0f;
  }
  for (unsigned t = rg; t < len; t += RG * U) {
    if (t != rg) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const unsigned tt = t + u * RG;
        vw[u] = tt < len ? V[(unsigned long long)tt * V8 + cv] : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned tt = t + u * RG;
      if (tt < len) {
        float vf[8];
        unpack8(vw[u], vf);
#pragma unroll
        for (int j = 0; j < NG; ++j) {
          if (G > 0 || j < (int)g) {
            const float e = s[j * chunk + tt];
#pragma unroll
            for (int d = 0; d < 8; ++d) a[j][d] = fmaf(e, vf[d], a[j][d]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < NG; ++j) {
    if (G > 0 || j < (int)g) {
#pragma unroll
      for (int d = 0; d < 8; ++d) {
#pragma unroll
        for (int o = V8; o < 32; o <<= 1) a[j][d] += __shfl_xor_sync(0xffffffffu, a[j][d], o);
        if (lane < V8) red[(warp * g + j) * HD + cv * 8 + d] = a[j][d];
      }
    }
  }
  __syncthreads();
  if (live == 1) {
    // One partition covers the context: it is the result, normalized here.
    for (unsigned i = threadIdx.x; i < g * HD; i += THREADS) {
      const unsigned j = i / HD, c = i % HD;
      float v = 0.0f;
#pragma unroll
      for (int r = 0; r < THREADS / 32; ++r) v += red[(r * g + j) * HD + c];
      outr[i] = v / s_l[j];
    }
    return;
  }
  for (unsigned i = threadIdx.x; i < g * HD; i += THREADS) {
    const unsigned j = i / HD, c = i % HD;
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < THREADS / 32; ++r) v += red[(r * g + j) * HD + c];
    outp[((unsigned long long)j * parts + pi) * W + c] = v;
  }
  // Publish this partition, then count it; the block that counts the last live partition
  // of this (row, key/value head) combines them all and resets the counter for the next
  // launch.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned k = row * kv_heads + kvh;
    const unsigned done = atomicAdd(counts + k, 1u) + 1u;
    s_last = done == live;
    if (done == live) counts[k] = 0u;
    __threadfence();
  }
  __syncthreads();
  if (!s_last) return;
  for (unsigned j = warp; j < g; j += THREADS / 32) {
    const float* p = outp + (unsigned long long)j * parts * W;
    float m = -__int_as_float(0x7f800000);
    for (unsigned i = lane; i < live; i += 32) m = fmaxf(m, __ldcg(p + i * W + HD));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.0f;
    for (unsigned i = lane; i < live; i += 32)
      l += expf(__ldcg(p + i * W + HD) - m) * __ldcg(p + i * W + HD + 1);
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) {
      s_m[j] = m;
      s_l[j] = 1.0f / l;
    }
  }
  __syncthreads();
  for (unsigned i = threadIdx.x; i < g * HD; i += THREADS) {
    const unsigned j = i / HD, c = i % HD;
    const float* p = outp + (unsigned long long)j * parts * W;
    const float m = s_m[j];
    float acc = 0.0f;
#pragma unroll 4
    for (unsigned pj = 0; pj < live; ++pj)
      acc += expf(__ldcg(p + pj * W + HD) - m) * __ldcg(p + pj * W + c);
    outr[i] = acc * s_l[j];
  }
}

// The kernel is compiled for one head width and group size (0: the group read at run time),
// the ones of the shape it is launched for (see `variant`).
#define HD_T @HD@
#define G_T @G@
template <bool ROPE>
__device__ __forceinline__ void dispatch(
    float* out, float* part, unsigned* counts, const float* q, const T_bf16* cache,
    unsigned heads, unsigned kv_heads, unsigned max_seq, unsigned parts, unsigned chunk,
    float scale, unsigned row, unsigned kvh, unsigned pi, unsigned n, float* sm,
    const float* qkv, const float* inv_freq, T_bf16* cache_w, unsigned p_rope, bool owner) {
  attend<HD_T, G_T, ROPE>(out, part, counts, q, cache, heads, kv_heads, max_seq, parts, chunk,
                          scale, row, kvh, pi, n, sm, qkv, inv_freq, cache_w, p_rope, owner);
}

extern "C" __global__ void __launch_bounds__(THREADS) decode_attention_split(
    float* out, float* part, unsigned* counts, const float* q, const T_bf16* cache,
    const unsigned* pos, unsigned heads, unsigned kv_heads, unsigned head_dim, unsigned max_seq,
    unsigned parts, unsigned chunk, float scale) {
  extern __shared__ float sm[];
  unsigned b = blockIdx.x;
  const unsigned pi = b % parts; b /= parts;
  const unsigned kvh = b % kv_heads;
  const unsigned row = b / kv_heads;
  // The row's position in 64 bits (pos[0] + row passes u32::MAX near its top), clamped to
  // the cache's last position as on the host.
  const unsigned long long p = (unsigned long long)pos[0] + row;
  const unsigned qp = p < max_seq ? (unsigned)p : max_seq - 1;
  const unsigned n = qp + 1;
  // Partitions past the row's last position do nothing: only the live ones count.
  if (pi * chunk >= n) return;
  dispatch<false>(out, part, counts, q, cache, heads, kv_heads, max_seq, parts, chunk, scale,
                  row, kvh, pi, n, sm, nullptr, nullptr, nullptr, 0u, false);
}

// One query row at position pos[0], its queries, key and value unrotated in `qkv`: RoPE, the
// append of the key and value rows to the cache (when the position is inside it) and the
// attention in one launch.
extern "C" __global__ void __launch_bounds__(THREADS) decode_rope_attention(
    float* out, float* part, unsigned* counts, T_bf16* cache, const float* qkv,
    const float* inv_freq, const unsigned* pos, unsigned heads, unsigned kv_heads,
    unsigned head_dim, unsigned max_seq, unsigned parts, unsigned chunk, float scale) {
  extern __shared__ float sm[];
  const unsigned pi = blockIdx.x % parts, kvh = blockIdx.x / parts;
  const unsigned p = pos[0];
  const unsigned qp = p < max_seq ? p : max_seq - 1;
  const unsigned n = qp + 1;
  if (pi * chunk >= n) return;
  const bool owner = p < max_seq && pi == qp / chunk;
  dispatch<true>(out, part, counts, nullptr, cache, heads, kv_heads, max_seq, parts, chunk,
                 scale, 0u, kvh, pi, n, sm, qkv, inv_freq, cache, p, owner);
}
"#;

/// The kernel on the host: the same partitions, the same arithmetic in `f32`, then their
/// combination (the counters stay zero).
fn host_attention(args: &mut cuflow_runtime::HostKernelArgs<'_>) -> Result<(), DeviceError> {
    let q = args.input::<f32>(3)?;
    let cache = args.input::<bf16>(4)?;
    let start = first_index(args.input::<u32>(5)?);
    let sizes = HostSizes::read(args, 6)?;
    let out = args.output::<f32>(0)?;
    let part = args.output::<f32>(1)?;
    attend_host(q, cache, start, sizes, out, part);
    Ok(())
}

/// The kernel that rotates and appends before attending, on the host: RoPE of the queries
/// and of the key, the key and value rows appended to the cache, then [`attend_host`].
fn host_rope_attention(args: &mut cuflow_runtime::HostKernelArgs<'_>) -> Result<(), DeviceError> {
    let qkv = args.input::<f32>(4)?;
    let inv_freq = args.input::<f32>(5)?;
    let p = first_index(args.input::<u32>(6)?);
    let sizes = HostSizes::read(args, 7)?;
    let HostSizes {
        heads,
        kv_heads,
        hd,
        max_seq,
        ..
    } = sizes;
    let half = hd / 2;
    let rotate = |x: &[f32], out: &mut dyn FnMut(usize, f32)| {
        for i in 0..half {
            let (s, c) = (p as f32 * inv_freq[i]).sin_cos();
            let (a, b) = (x[i], x[i + half]);
            out(i, a * c - b * s);
            out(i + half, b * c + a * s);
        }
    };
    let mut q = vec![0f32; heads * hd];
    for (h, o) in q.chunks_mut(hd.max(1)).enumerate() {
        rotate(&qkv[h * hd..][..hd], &mut |i, v| o[i] = v);
    }
    let cache = args.output::<bf16>(3)?;
    if p < max_seq {
        for kh in 0..kv_heads {
            let kd = (kh * max_seq + p) * hd;
            rotate(&qkv[(heads + kh) * hd..][..hd], &mut |i, v| {
                cache[kd + i] = bf16::from_f32(v)
            });
            let v = &qkv[(heads + kv_heads + kh) * hd..][..hd];
            let vd = ((kv_heads + kh) * max_seq + p) * hd;
            for (d, v) in cache[vd..vd + hd].iter_mut().zip(v) {
                *d = bf16::from_f32(*v);
            }
        }
    }
    let out = args.output::<f32>(0)?;
    let part = args.output::<f32>(1)?;
    attend_host(&q, cache, p, sizes, out, part);
    Ok(())
}

/// The sizes both attention kernels take as their last seven scalars.
#[derive(Clone, Copy)]
struct HostSizes {
    heads: usize,
    kv_heads: usize,
    hd: usize,
    max_seq: usize,
    parts: usize,
    chunk: usize,
    scale: f32,
}

impl HostSizes {
    fn read(args: &cuflow_runtime::HostKernelArgs<'_>, first: usize) -> Result<Self, DeviceError> {
        Ok(HostSizes {
            heads: args.scalar::<u32>(first)? as usize,
            kv_heads: (args.scalar::<u32>(first + 1)? as usize).max(1),
            hd: args.scalar::<u32>(first + 2)? as usize,
            max_seq: (args.scalar::<u32>(first + 3)? as usize).max(1),
            parts: (args.scalar::<u32>(first + 4)? as usize).max(1),
            chunk: (args.scalar::<u32>(first + 5)? as usize).max(1),
            scale: args.scalar::<f32>(first + 6)?,
        })
    }
}

/// The partitions and their combination over rotated queries `q` (rows at positions
/// `start..`), in `f32` as the kernel computes them.
fn attend_host(
    q: &[f32],
    cache: &[bf16],
    start: usize,
    sizes: HostSizes,
    out: &mut [f32],
    part: &mut [f32],
) {
    let HostSizes {
        heads,
        kv_heads,
        hd,
        max_seq,
        parts,
        chunk,
        scale,
    } = sizes;
    let (g, w) = (heads / kv_heads, hd + 2);
    let rows = q.len() / (heads * hd).max(1);
    let mut scores = vec![0f32; chunk];
    for row in 0..rows {
        let n = start.saturating_add(row).min(max_seq - 1) + 1;
        let live = n.div_ceil(chunk).min(parts);
        for h in 0..heads {
            let kvh = h / g.max(1);
            let p = &mut part[(row * heads + h) * parts * w..][..parts * w];
            for pi in 0..live {
                let (t0, t1) = (pi * chunk, ((pi + 1) * chunk).min(n));
                let o = &mut p[pi * w..][..w];
                let qh = &q[(row * heads + h) * hd..][..hd];
                for (t, s) in (t0..t1).zip(scores.iter_mut()) {
                    let k = &cache[(kvh * max_seq + t) * hd..][..hd];
                    *s = qh.iter().zip(k).map(|(q, k)| q * scale * k.to_f32()).sum();
                }
                let len = t1 - t0;
                let m = scores[..len]
                    .iter()
                    .copied()
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut l = 0.0;
                for s in &mut scores[..len] {
                    *s = (*s - m).exp();
                    l += *s;
                }
                for (c, o) in o[..hd].iter_mut().enumerate() {
                    *o = (t0..t1)
                        .zip(&scores[..len])
                        .map(|(t, e)| e * cache[((kv_heads + kvh) * max_seq + t) * hd + c].to_f32())
                        .sum();
                }
                o[hd] = m;
                o[hd + 1] = l;
            }
            let m = (0..live)
                .map(|i| p[i * w + hd])
                .fold(f32::NEG_INFINITY, f32::max);
            let l: f32 = (0..live)
                .map(|i| (p[i * w + hd] - m).exp() * p[i * w + hd + 1])
                .sum();
            let o = &mut out[(row * heads + h) * hd..][..hd];
            for (c, o) in o.iter_mut().enumerate() {
                let acc: f32 = (0..live)
                    .map(|i| (p[i * w + hd] - m).exp() * p[i * w + c])
                    .sum();
                *o = acc / l;
            }
        }
    }
}

/// The partition counters of [`attention`], one per query row and key/value head.
///
/// The partition of a (row, key/value head) that finishes last combines the others, and
/// knows it is last by this count; it then sets the count back to zero. Counters are
/// therefore made only here, zeroed, and every launch leaves them zero: a program cannot
/// hand the kernel counts that would keep the combination from happening (and its output
/// from being written).
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::kernels::decode::AttentionCounters;
/// let counters = AttentionCounters::zeroed(3, 2).sync()?;
/// assert_eq!(counters.to_host_vec()?, vec![0; 6]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
#[derive(Debug)]
pub struct AttentionCounters(Tensor<u32>);

impl AttentionCounters {
    /// Zeroed counters for `rows` query rows of a model with `kv_heads` key/value heads.
    ///
    /// # Errors
    ///
    /// The allocation's error, when the op runs.
    pub fn zeroed(
        rows: usize,
        kv_heads: usize,
    ) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<AttentionCounters, DeviceError> + Send>
    {
        from_fn(move |ctx: &mut ExecutionContext| {
            let counts = rows
                .checked_mul(kv_heads)
                .ok_or_else(|| DeviceError::InvalidShape {
                    op: "AttentionCounters::zeroed",
                    reason: format!("{rows} rows of {kv_heads} key/value heads overflow usize"),
                })?;
            crate::api::zeros::<u32>(&[counts])
                .execute(ctx)
                .map(AttentionCounters)
        })
    }

    /// The counts, read back (every one is zero between launches).
    ///
    /// # Errors
    ///
    /// As [`Tensor::to_host_vec`].
    pub fn to_host_vec(&self) -> Result<Vec<u32>, DeviceError> {
        self.0.to_host_vec()
    }
}

/// Causal attention of the query rows `q` (`f32`, `[rows, heads · head_dim]`, already
/// rotated) over `cache` (`bf16`, `[2, kv_heads, max_seq, head_dim]`), query row `r` at
/// position `pos[0] + r`, scores scaled by `1/√head_dim`; the result goes to `out` (`f32`,
/// `[rows, heads · head_dim]`). `scratch` (`f32`, `[rows, heads, parts, head_dim + 2]`, from
/// [`attention_partitions`]) holds the partial results: `parts` partitions cover `max_seq`.
/// `counts` counts the finished partitions of each row and key/value head (see
/// [`AttentionCounters`]); keep it with `scratch`.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `attention` when `shape` breaks a rule of
/// [`AttentionShape`] (a size of zero among them, the error naming it), a shape disagrees
/// with `shape`, or the partitions are longer than 1024 positions.
pub fn attention<'a>(
    out: &'a mut Tensor<f32>,
    scratch: &'a mut Tensor<f32>,
    counts: &'a mut AttentionCounters,
    q: &'a Tensor<f32>,
    cache: &'a Tensor<bf16>,
    pos: &'a Tensor<u32>,
    shape: AttentionShape,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        const OP: &str = "attention";
        let stream = ctx.stream()?;
        for t in [&*out, &*scratch, q] {
            check_device(OP, stream, t)?;
        }
        check_device(OP, stream, cache)?;
        check_device(OP, stream, pos)?;
        check_device(OP, stream, &counts.0)?;
        shape.check(OP)?;
        let hd = shape.head_dim;
        let g = shape.heads / shape.kv_heads;
        let row_len = shape.heads * hd;
        if !q.len().is_multiple_of(row_len) {
            return Err(DeviceError::InvalidShape {
                op: OP,
                reason: format!("`q` {:?} is not made of rows of {row_len}", q.shape()),
            });
        }
        let rows = q.len() / row_len;
        check_len(OP, "out", out, q.len())?;
        check_len(OP, "cache", cache, shape.cache_len())?;
        check_len(OP, "pos", pos, 1)?;
        check_len(OP, "counts", &counts.0, rows * shape.kv_heads)?;
        let (parts, chunk) = partitions(OP, scratch, rows, shape)?;
        if rows == 0 {
            return Ok(());
        }
        let shared = shared_bytes(g, hd, chunk);
        let blocks = rows * shape.kv_heads * parts;
        variant_kernel(false, &shape).launch(
            stream,
            LaunchConfig::linear(u32_of(OP, "blocks", blocks)?, PARTIAL_THREADS as u32)
                .with_shared_mem(u32_of(OP, "shared memory", shared)?),
            KernelArgs::new()
                .output(out.view("decode::attention")?)
                .output(scratch.view("decode::attention")?)
                .output(counts.0.view("decode::attention")?)
                .input(q.view("decode::attention")?)
                .input(cache.view("decode::attention")?)
                .input(pos.view("decode::attention")?)
                .scalar(u32_of(OP, "heads", shape.heads)?)
                .scalar(u32_of(OP, "kv_heads", shape.kv_heads)?)
                .scalar(u32_of(OP, "head_dim", hd)?)
                .scalar(u32_of(OP, "max_seq", shape.max_seq)?)
                .scalar(u32_of(OP, "parts", parts)?)
                .scalar(u32_of(OP, "chunk", chunk)?)
                .scalar(1.0 / (hd as f32).sqrt()),
        )
    })
}

/// The partitions of `scratch` (`[rows, heads, parts, head_dim + 2]`) and the positions each
/// holds, checked.
fn partitions(
    op: &'static str,
    scratch: &Tensor<f32>,
    rows: usize,
    shape: AttentionShape,
) -> Result<(usize, usize), DeviceError> {
    let hd = shape.head_dim;
    let parts = match *scratch.shape() {
        [r, h, p, w] if r == rows && h == shape.heads && w == hd + 2 && p > 0 => p,
        _ => {
            return Err(DeviceError::InvalidShape {
                op,
                reason: format!(
                    "`scratch` must be [{rows}, {}, parts, {}], got {:?}",
                    shape.heads,
                    hd + 2,
                    scratch.shape()
                ),
            })
        }
    };
    let chunk = shape.max_seq.div_ceil(parts);
    if chunk > MAX_CHUNK {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "{parts} partitions of {} positions hold {chunk} positions each; at most \
                 {MAX_CHUNK} (use attention_partitions)",
                shape.max_seq
            ),
        });
    }
    Ok((parts, chunk))
}

/// One decode step's attention with RoPE and the cache append folded in: what
/// [`rope_kv_append`](super::rope_kv_append) followed by [`attention`] compute for one query
/// row, in one launch.
///
/// `qkv` (`f32`, `[heads + 2 · kv_heads] · head_dim` elements: the queries, keys and values
/// of one token, as the QKV projection writes them, unrotated) is at position `pos[0]`. The
/// queries and the key are rotated with `inv_freq` (`head_dim / 2` elements); the key and
/// value rows are written into `cache` at that position when it lies inside the cache (as
/// `rope_kv_append` does); the query row then attends positions `0..=pos[0]` (clamped to the
/// cache) and the result goes to `out` (`f32`, `heads · head_dim`). `scratch` (`[1, heads,
/// parts, head_dim + 2]`) and `counts` (one row) are as for [`attention`].
///
/// The block whose partition holds the new position writes the cache rows and uses them
/// itself; no other block reads that row, so one launch needs no ordering between blocks.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::api::{from_vec, zeros};
/// use cuflow_tensor::kernels::decode::{
///     attention_partitions, rope_attention, AttentionCounters, AttentionShape,
/// };
/// use half::bf16;
/// let shape = AttentionShape { heads: 2, kv_heads: 1, head_dim: 16, max_seq: 8 };
/// let width = (shape.heads + 2 * shape.kv_heads) * shape.head_dim;
/// let qkv = from_vec((0..width).map(|i| (i as f32 * 0.37).sin()).collect(), &[1, width]).sync()?;
/// let inv_freq = from_vec(vec![1.0f32; shape.head_dim / 2], &[shape.head_dim / 2]).sync()?;
/// let pos = from_vec(vec![0u32], &[1]).sync()?;
/// let mut cache = zeros::<bf16>(&[shape.cache_len()]).sync()?;
/// let parts = attention_partitions(shape.max_seq, 4);
/// let mut scratch = zeros::<f32>(&[1, shape.heads, parts, shape.head_dim + 2]).sync()?;
/// let mut counts = AttentionCounters::zeroed(1, shape.kv_heads).sync()?;
/// let mut out = zeros::<f32>(&[1, shape.heads * shape.head_dim]).sync()?;
/// rope_attention(&mut out, &mut scratch, &mut counts, &mut cache, &qkv, &inv_freq, &pos, shape)
///     .sync()?;
/// // At position 0 the only key is the token's own, so each head's result is its value row.
/// let (out, cache) = (out.to_host_vec()?, cache.to_host_vec()?);
/// let value = &cache[shape.kv_heads * shape.max_seq * shape.head_dim..][..shape.head_dim];
/// for h in 0..shape.heads {
///     for (o, v) in out[h * shape.head_dim..][..shape.head_dim].iter().zip(value) {
///         assert!((o - v.to_f32()).abs() < 1e-6);
///     }
/// }
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `rope_attention` when `qkv` is not one row, or a
/// shape disagrees with `shape`, as for [`attention`].
#[allow(clippy::too_many_arguments)]
pub fn rope_attention<'a>(
    out: &'a mut Tensor<f32>,
    scratch: &'a mut Tensor<f32>,
    counts: &'a mut AttentionCounters,
    cache: &'a mut Tensor<bf16>,
    qkv: &'a Tensor<f32>,
    inv_freq: &'a Tensor<f32>,
    pos: &'a Tensor<u32>,
    shape: AttentionShape,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        const OP: &str = "rope_attention";
        let stream = ctx.stream()?;
        for t in [&*out, &*scratch, qkv, inv_freq] {
            check_device(OP, stream, t)?;
        }
        check_device(OP, stream, cache)?;
        check_device(OP, stream, pos)?;
        check_device(OP, stream, &counts.0)?;
        shape.check(OP)?;
        let hd = shape.head_dim;
        let g = shape.heads / shape.kv_heads;
        let width = (shape.heads + 2 * shape.kv_heads) * hd;
        if qkv.len() != width {
            return Err(DeviceError::InvalidShape {
                op: OP,
                reason: format!(
                    "`qkv` {:?} must be one row of {width} (queries, keys and values of one \
                     token); for several rows use rope_kv_append and attention",
                    qkv.shape()
                ),
            });
        }
        check_len(OP, "out", out, shape.heads * hd)?;
        check_len(OP, "cache", cache, shape.cache_len())?;
        check_len(OP, "inv_freq", inv_freq, hd / 2)?;
        check_len(OP, "pos", pos, 1)?;
        check_len(OP, "counts", &counts.0, shape.kv_heads)?;
        let (parts, chunk) = partitions(OP, scratch, 1, shape)?;
        let shared = shared_bytes(g, hd, chunk);
        let blocks = shape.kv_heads * parts;
        variant_kernel(true, &shape).launch(
            stream,
            LaunchConfig::linear(u32_of(OP, "blocks", blocks)?, PARTIAL_THREADS as u32)
                .with_shared_mem(u32_of(OP, "shared memory", shared)?),
            KernelArgs::new()
                .output(out.view("decode::rope_attention")?)
                .output(scratch.view("decode::rope_attention")?)
                .output(counts.0.view("decode::rope_attention")?)
                .output(cache.view("decode::rope_attention")?)
                .input(qkv.view("decode::rope_attention")?)
                .input(inv_freq.view("decode::rope_attention")?)
                .input(pos.view("decode::rope_attention")?)
                .scalar(u32_of(OP, "heads", shape.heads)?)
                .scalar(u32_of(OP, "kv_heads", shape.kv_heads)?)
                .scalar(u32_of(OP, "head_dim", hd)?)
                .scalar(u32_of(OP, "max_seq", shape.max_seq)?)
                .scalar(u32_of(OP, "parts", parts)?)
                .scalar(u32_of(OP, "chunk", chunk)?)
                .scalar(1.0 / (hd as f32).sqrt()),
        )
    })
}

//! Choosing the next token on the device: greedy (argmax), or temperature sampling restricted
//! to the top `k` tokens and then to the smallest set of them holding probability `p`
//! (nucleus), drawn from a counter-based generator whose seed and counter live in a device
//! tensor. The same kernel then feeds the next step: it writes the token where the next
//! embedding reads it, records it in the generated-token buffer at the next position, and
//! advances the position and the generator's counter, so a captured step replays with no
//! copy from the host.
//!
//! Greedy decoding, `top_k == 1` and a temperature of zero take the argmax in two stages: up
//! to 128 blocks keep the best key (the logit's order, then the lowest index) of a
//! contiguous slice each, then the sampling block takes the best of their keys. Otherwise
//! one block of 1024 threads does it all. Thresholds are found by bisection over the logits'
//! order, not their value: a float's bits map to a `u32` key that orders as the floats do
//! (`-0` as `+0`, NaN as `0`, below every number), and the count and mass of the logits at or
//! above a key are monotone in it, so at most 32 passes (each a block reduction over the
//! vocabulary) put the cut exactly between two distinct logits, at any temperature and any
//! spread of the logits. Top-k stops early once exactly `k` tokens are kept. Only then are
//! the weights `exp((l - max) / temperature)` of the kept tokens summed, and one uniform draw
//! picks a token by their cumulative weight in index order.
//!
//! The kept set starts as the logits at most `SPAN` (30) temperatures below the largest one:
//! never a `-inf` logit (it has no probability) unless every number is `-inf`, and only the
//! `+inf` logits when there is one. Every kept token has weight `1` at an infinite temperature
//! (`1 / temperature` is `0`): the draw is then uniform over the top-k / top-p set, no
//! `0 · inf` arises, and top-p keeps the smallest prefix of the sorted tokens whose count
//! reaches `p` of the top-k set's. Tokens tied at a cut are all kept or all dropped, so top-k
//! keeps more than `k` tokens only when the `k`-th largest logit is tied.
//!
//! The generator: `splitmix64(seed ^ counter · 0x9E3779B97F4A7C15)`, its top 24 bits as a
//! uniform in `[0, 1)`; `rng` is `u32` `[3]`: the seed's low and high words and the counter.

use cuflow_device_op::{from_fn, ExecutionContext};
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig};

use super::{check_len, first_index, u32_of};
use crate::kernels::check_device;
use crate::op::{cached_kernel, TensorOp};
use crate::tensor::Tensor;

/// Threads of the sampling block.
const SAMPLE_THREADS: u32 = 1024;
/// Tokens whose logit lies this many temperatures below the maximum are never kept (their
/// probability relative to the best is below e⁻³⁰).
const SPAN: f32 = 30.0;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleParams {
    /// Softmax temperature; `0` (or below) means greedy, `+inf` draws uniformly from the
    /// tokens `top_k` and `top_p` keep; NaN is refused.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (and any tied with the `k`-th); `0` keeps
    /// all, `1` is greedy.
    pub top_k: u32,
    /// Then keep the smallest set of the most likely tokens whose probability reaches
    /// `top_p`; `1` keeps all.
    pub top_p: f32,
}

impl SampleParams {
    /// The argmax.
    pub const GREEDY: SampleParams = SampleParams {
        temperature: 0.0,
        top_k: 1,
        top_p: 1.0,
    };

    /// Whether these parameters choose the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

pub(super) fn kernel() -> Kernel {
    cached_kernel("decode_sample", "f32", || {
        let source = format!(
            r#"
#define NT {threads}
__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {{
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}}
{keys}
__device__ float block_sum_f(float v, float* red) {{
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
  for (unsigned i = 0; i < (blockDim.x >> 5); ++i) s += red[i];
  return s;
}}
__device__ unsigned block_sum_u(unsigned v, unsigned* red) {{
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned s = 0;
  for (unsigned i = 0; i < (blockDim.x >> 5); ++i) s += red[i];
  return s;
}}
// The weight of a kept logit `l` against the largest `m`: 1 at `m` and everywhere at an
// infinite temperature (inv_t = 0: uniform, and no 0 * inf).
__device__ __forceinline__ float weight(float l, float m, float inv_t) {{
  return (inv_t == 0.0f || l == m) ? 1.0f : expf((l - m) * inv_t);
}}
// Count and mass of the logits whose order key is at or above `tau`.
__device__ void kept(const float* logits, unsigned vocab, unsigned tau, float m, float inv_t,
                     float* red, unsigned* redu, float* mass, unsigned* count) {{
  float s = 0.0f;
  unsigned c = 0;
  for (unsigned i = threadIdx.x; i < vocab; i += blockDim.x) {{
    const float l = logits[i];
    if (order_key(l) >= tau) {{ ++c; s += weight(l, m, inv_t); }}
  }}
  *mass = block_sum_f(s, red);
  *count = block_sum_u(c, redu);
}}
extern "C" __global__ void decode_sample(unsigned* token, unsigned* generated, unsigned* pos,
                                         unsigned* rng, const float* logits, unsigned vocab,
                                         unsigned gen_len, float temperature, unsigned top_k,
                                         float top_p, const unsigned* partials,
                                         unsigned nparts) {{
  __shared__ float red[32];
  __shared__ unsigned redu[32];
  __shared__ float sums[NT];
  __shared__ unsigned owner_s, pick_s;
  __shared__ float rem_s;
  const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  if (nparts > 0) {{
    /* Greedy after decode_argmax_blocks: the largest of its keys. */
    __shared__ unsigned long long keys[32];
    unsigned long long k = 0ull;
    const unsigned long long* p64 = (const unsigned long long*)partials;
    for (unsigned i = tid; i < nparts; i += blockDim.x) k = p64[i] > k ? p64[i] : k;
    k = warp_max_key(k);
    if (lane == 0) keys[warp] = k;
    __syncthreads();
    if (tid == 0) {{
      for (unsigned w = 1; w < warps; ++w) k = keys[w] > k ? keys[w] : k;
      const unsigned pick = k == 0ull ? 0u : 0xffffffffu - (unsigned)k, p = pos[0];
      token[0] = pick;
      if ((unsigned long long)p + 1 < gen_len) generated[p + 1] = pick;
      pos[0] = p + 1;
      rng[2] = rng[2] + 1;
    }}
    return;
  }}
  float best = 0.0f;
  unsigned bi = 0xffffffffu;
  for (unsigned i = tid; i < vocab; i += blockDim.x) {{
    const float v = logits[i];
    if (v == v && (bi == 0xffffffffu || v > best)) {{ best = v; bi = i; }}
  }}
  for (int o = 16; o > 0; o >>= 1) {{
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi != 0xffffffffu && (bi == 0xffffffffu || ov > best || (ov == best && oi < bi))) {{ best = ov; bi = oi; }}
  }}
  __shared__ float bv[32];
  __shared__ unsigned bx[32];
  if (lane == 0) {{ bv[warp] = best; bx[warp] = bi; }}
  __syncthreads();
  if (tid == 0) {{
    for (unsigned w = 1; w < warps; ++w) {{
      if (bx[w] != 0xffffffffu && (bi == 0xffffffffu || bv[w] > best || (bv[w] == best && bx[w] < bi))) {{
        best = bv[w]; bi = bx[w];
      }}
    }}
    bv[0] = best;
    bx[0] = bi;
    pick_s = bi == 0xffffffffu ? 0u : bi;
  }}
  __syncthreads();
  const float m = bv[0];
  if (temperature > 0.0f && top_k != 1 && bx[0] != 0xffffffffu) {{
    const float inv_t = 1.0f / temperature;
    /* The lowest logit kept (see the module docs); `below` is NaN only when m and the
       temperature are both +inf. Bisections over order keys: lo is kept, above hi is not;
       every thread holds the same lo and hi, so the loops are uniform. */
    const float below = m - {span:.1}f * temperature;
    const float lowest = below != below ? m : fminf(fmaxf(below, -3.40282347e38f), m);
    unsigned lo = order_key(lowest), hi = order_key(m), count;
    float mass;
    if (top_k > 0) {{
      while (lo < hi) {{
        const unsigned mid = lo + (hi - lo + 1u) / 2u;
        kept(logits, vocab, mid, m, inv_t, red, redu, &mass, &count);
        if (count == top_k) {{ lo = mid; break; }}
        if (count > top_k) lo = mid; else hi = mid - 1u;
      }}
    }}
    if (top_p < 1.0f) {{
      kept(logits, vocab, lo, m, inv_t, red, redu, &mass, &count);
      const float goal = top_p * mass;
      hi = order_key(m);
      while (lo < hi) {{
        const unsigned mid = lo + (hi - lo + 1u) / 2u;
        float s;
        kept(logits, vocab, mid, m, inv_t, red, redu, &s, &count);
        if (s >= goal) lo = mid; else hi = mid - 1u;
      }}
    }}
    const unsigned tau = lo;
    const unsigned per = (vocab + blockDim.x - 1) / blockDim.x;
    const unsigned b0 = tid * per < vocab ? tid * per : vocab;
    const unsigned b1 = b0 + per < vocab ? b0 + per : vocab;
    float local = 0.0f;
    for (unsigned i = b0; i < b1; ++i) {{
      const float l = logits[i];
      if (order_key(l) >= tau) local += weight(l, m, inv_t);
    }}
    sums[tid] = local;
    __syncthreads();
    if (tid == 0) {{
      const unsigned long long seed = ((unsigned long long)rng[1] << 32) | rng[0];
      const unsigned long long x = splitmix64(seed ^ ((unsigned long long)rng[2] * 0x9E3779B97F4A7C15ull));
      const float u = (float)(x >> 40) * (1.0f / 16777216.0f);
      float total = 0.0f;
      for (unsigned t = 0; t < blockDim.x; ++t) total += sums[t];
      const float target = u * total;
      float acc = 0.0f;
      unsigned owner = 0xffffffffu, last = 0xffffffffu;
      float rem = 3.0e38f;
      for (unsigned t = 0; t < blockDim.x; ++t) {{
        if (sums[t] <= 0.0f) continue;
        last = t;
        if (target < acc + sums[t]) {{ owner = t; rem = target - acc; break; }}
        acc += sums[t];
      }}
      owner_s = owner != 0xffffffffu ? owner : last;
      rem_s = rem;
    }}
    __syncthreads();
    if (tid == owner_s) {{
      float acc = 0.0f;
      unsigned chosen = 0xffffffffu;
      for (unsigned i = b0; i < b1; ++i) {{
        const float l = logits[i];
        if (order_key(l) < tau) continue;
        const float w = weight(l, m, inv_t);
        if (w > 0.0f) chosen = i;
        acc += w;
        if (rem_s < acc) break;
      }}
      if (chosen != 0xffffffffu) pick_s = chosen;
    }}
    __syncthreads();
  }}
  if (tid == 0) {{
    const unsigned pick = pick_s, p = pos[0];
    token[0] = pick;
    if ((unsigned long long)p + 1 < gen_len) generated[p + 1] = pick;
    pos[0] = p + 1;
    rng[2] = rng[2] + 1;
  }}
}}
"#,
            threads = SAMPLE_THREADS,
            span = SPAN,
            keys = ARGMAX_KEYS,
        );
        crate::op::builtin_kernel("decode_sample", source).with_host(|args| {
            let logits = args.input::<f32>(4)?;
            let gen_len = args.scalar::<u32>(6)? as usize;
            let params = SampleParams {
                temperature: args.scalar::<f32>(7)?,
                top_k: args.scalar::<u32>(8)?,
                top_p: args.scalar::<f32>(9)?,
            };
            let rng = args.output::<u32>(3)?;
            let seed = (u64::from(rng[1]) << 32) | u64::from(rng[0]);
            let draw = splitmix64(seed ^ u64::from(rng[2]).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let u = (draw >> 40) as f32 * (1.0 / 16_777_216.0);
            rng[2] = rng[2].wrapping_add(1);
            let nparts = args.scalar::<u32>(11)? as usize;
            let pick = if nparts > 0 {
                let partials = args.input::<u32>(10)?;
                let best = (0..nparts)
                    .map(|b| host_partial(partials, b))
                    .max()
                    .unwrap_or(0);
                key_index(best)
            } else {
                host_pick(logits, params, u)
            };
            let pos = args.output::<u32>(2)?;
            let p = first_index(pos);
            pos[0] = pos[0].wrapping_add(1);
            if let Some(slot) = args.output::<u32>(1)?.get_mut(p.wrapping_add(1)) {
                if p + 1 < gen_len {
                    *slot = pick;
                }
            }
            args.output::<u32>(0)?[0] = pick;
            Ok(())
        })
    })
}

/// A float's order as a `u32` key ([`order_key`]), and the order of greedy choices as one
/// `u64` key, larger is better: the logit's order above the complement of its index (ties go
/// to the lowest index); `0` for a NaN, and so for a block without a number.
const ARGMAX_KEYS: &str = r#"
__device__ __forceinline__ unsigned order_key(float v) {
  if (v != v) return 0u;
  const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ unsigned long long argmax_key(float v, unsigned i) {
  if (v != v) return 0ull;
  return ((unsigned long long)order_key(v) << 32) | (0xffffffffu - i);
}
__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long k) {
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long ok = __shfl_xor_sync(0xffffffffu, k, o);
    k = ok > k ? ok : k;
  }
  return k;
}
"#;

/// A float's bits mapped to a `u32` that orders as the floats do (`-0` as `+0`); `0` for a
/// NaN, below every number (the smallest, `-inf`, is `0x007f_ffff`).
fn order_key(v: f32) -> u32 {
    if v.is_nan() {
        return 0;
    }
    let u = if v == 0.0 { 0 } else { v.to_bits() };
    if u & 0x8000_0000 != 0 {
        !u
    } else {
        u | 0x8000_0000
    }
}

fn argmax_key(v: f32, i: usize) -> u64 {
    if v.is_nan() {
        return 0;
    }
    (u64::from(order_key(v)) << 32) | u64::from(u32::MAX - i as u32)
}

/// The index a key names (`0` for the key of no number).
fn key_index(k: u64) -> u32 {
    if k == 0 {
        0
    } else {
        u32::MAX - k as u32
    }
}

/// Key `b` of the partials, stored as the `u32` words (low, high) of a `u64`.
fn host_partial(partials: &[u32], b: usize) -> u64 {
    let word = |i: usize| u64::from(partials.get(i).copied().unwrap_or(0));
    word(2 * b) | (word(2 * b + 1) << 32)
}

/// Blocks of the first stage of the greedy choice.
const ARGMAX_BLOCKS: usize = 128;
/// Threads per block of that stage.
const ARGMAX_THREADS: u32 = 256;

/// `u32` elements of the scratch tensor [`sample`] takes: a `u64` key per block of the
/// greedy choice's first stage.
///
/// The scratch carries those keys from one launch of [`sample`] to the next, so it belongs to
/// one sampling at a time: samplings that may run concurrently (on other streams, or in
/// graphs replayed side by side) each need their own, and no other op may write it, or a
/// clone of it, while a sampling runs: the greedy choice would then be taken from keys it did
/// not compute.
pub const SAMPLE_SCRATCH_LEN: usize = 2 * ARGMAX_BLOCKS;

pub(super) fn argmax_kernel() -> Kernel {
    cached_kernel("decode_argmax_blocks", "f32", || {
        let source = format!(
            r#"{keys}
/* Block b keeps the largest key of the contiguous slice b of the logits, as the u32 words
   (low, high) of partials[2b], partials[2b + 1]. */
extern "C" __global__ void decode_argmax_blocks(unsigned* partials, const float* logits,
                                                unsigned vocab, unsigned blocks) {{
  __shared__ unsigned long long keys[32];
  const unsigned chunk = (vocab + blocks - 1) / blocks;
  const unsigned b0 = min(blockIdx.x * chunk, vocab), b1 = min(b0 + chunk, vocab);
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  unsigned long long k = 0ull;
  for (unsigned i = b0 + threadIdx.x; i < b1; i += blockDim.x) {{
    const unsigned long long c = argmax_key(logits[i], i);
    k = c > k ? c : k;
  }}
  k = warp_max_key(k);
  if (lane == 0) keys[warp] = k;
  __syncthreads();
  if (threadIdx.x == 0) {{
    for (unsigned w = 1; w < warps; ++w) k = keys[w] > k ? keys[w] : k;
    ((unsigned long long*)partials)[blockIdx.x] = k;
  }}
}}
"#,
            keys = ARGMAX_KEYS
        );
        crate::op::builtin_kernel("decode_argmax_blocks", source).with_host(|args| {
            let logits = args.input::<f32>(1)?;
            let vocab = (args.scalar::<u32>(2)? as usize).min(logits.len());
            let blocks = args.scalar::<u32>(3)? as usize;
            let partials = args.output::<u32>(0)?;
            let chunk = vocab.div_ceil(blocks.max(1)).max(1);
            for (b, slice) in logits[..vocab].chunks(chunk).enumerate().take(blocks) {
                if 2 * b + 1 >= partials.len() {
                    break;
                }
                let best = slice
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| argmax_key(v, b * chunk + i))
                    .max()
                    .unwrap_or(0);
                partials[2 * b] = best as u32;
                partials[2 * b + 1] = (best >> 32) as u32;
            }
            Ok(())
        })
    })
}

fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The weight of a kept logit `l` against the largest `m`, as the kernel's `weight`.
fn weight(l: f32, m: f32, inv_t: f32) -> f32 {
    if inv_t == 0.0 || l == m {
        1.0
    } else {
        ((l - m) * inv_t).exp()
    }
}

/// The host's choice, by the kernel's algorithm (sums in index order).
fn host_pick(logits: &[f32], p: SampleParams, u: f32) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    let Some((bi, m)) = best else { return 0 };
    if p.is_greedy() {
        return bi as u32;
    }
    let inv_t = 1.0 / p.temperature;
    // Mass and count of the logits whose order key is at or above `tau`.
    let kept = |tau: u32| {
        logits
            .iter()
            .filter(|&&l| order_key(l) >= tau)
            .fold((0.0f32, 0u32), |(s, c), &l| {
                (s + weight(l, m, inv_t), c + 1)
            })
    };
    // The lowest logit kept (see the module docs); `below` is NaN only when `m` and the
    // temperature are both +inf.
    let below = m - SPAN * p.temperature;
    let lowest = if below.is_nan() {
        m
    } else {
        below.max(f32::MIN).min(m)
    };
    // Bisections over order keys: `lo` is kept, above `hi` is not.
    let (mut lo, mut hi) = (order_key(lowest), order_key(m));
    if p.top_k > 0 {
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            let count = kept(mid).1;
            if count == p.top_k {
                lo = mid;
                break;
            }
            if count > p.top_k {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
    }
    if p.top_p < 1.0 {
        let goal = p.top_p * kept(lo).0;
        hi = order_key(m);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if kept(mid).0 >= goal {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
    }
    let target = u * kept(lo).0;
    let mut acc = 0.0;
    let mut chosen = bi;
    for (i, &l) in logits.iter().enumerate() {
        if order_key(l) < lo {
            continue;
        }
        let w = weight(l, m, inv_t);
        if w > 0.0 {
            chosen = i;
        }
        acc += w;
        if target < acc {
            break;
        }
    }
    chosen as u32
}

/// Chooses the next token from `logits` (`f32`, `[vocab]`) as `params` say and feeds the
/// next step on the device: `token[0]` (`u32`, `[1]`) becomes the choice,
/// `generated[pos[0] + 1]` records it (when inside `generated`), `pos[0]` advances by one,
/// and so does the generator's counter `rng[2]` (`rng`: `u32` `[3]`, see the module docs).
/// `scratch` (`u32`, at least [`SAMPLE_SCRATCH_LEN`] elements, any contents) holds the
/// partial results of the greedy choice between its two kernels.
///
/// `scratch` must not be shared with a concurrent sampling, nor written by any other op,
/// through a clone or another view of its buffer, while this one runs: the accesses of the
/// two kernels are ordered one by one against other work on the buffer, not as a pair, so a
/// write that lands between them makes the greedy choice pick a token from keys it did not
/// compute. Give each sampling that may overlap another its own scratch.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `sample` when a shape is not as above, the
/// temperature is NaN (`+inf` is allowed: uniform over the kept tokens), or `top_p` is not in
/// `(0, 1]`.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, kernels::decode};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let logits = api::from_vec(vec![0.5f32, 2.0, -1.0, 1.0], &[4]).sync_on(&stream)?;
/// let mut token = api::zeros::<u32>(&[1]).sync_on(&stream)?;
/// let mut generated = api::zeros::<u32>(&[8]).sync_on(&stream)?;
/// let mut pos = api::from_vec(vec![3u32], &[1]).sync_on(&stream)?;
/// let mut rng = api::from_vec(vec![7u32, 0, 0], &[3]).sync_on(&stream)?;
/// let mut scratch = api::zeros::<u32>(&[decode::SAMPLE_SCRATCH_LEN]).sync_on(&stream)?;
/// decode::sample(&mut token, &mut generated, &mut pos, &mut rng, &mut scratch, &logits,
///     decode::SampleParams::GREEDY).sync_on(&stream)?;
/// assert_eq!(token.to_host_vec()?, vec![1]);
/// assert_eq!(generated.to_host_vec()?[4], 1);
/// assert_eq!(pos.to_host_vec()?, vec![4]);
/// # Ok(()) }
/// ```
pub fn sample<'a>(
    token: &'a mut Tensor<u32>,
    generated: &'a mut Tensor<u32>,
    pos: &'a mut Tensor<u32>,
    rng: &'a mut Tensor<u32>,
    scratch: &'a mut Tensor<u32>,
    logits: &'a Tensor<f32>,
    params: SampleParams,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        const OP: &str = "sample";
        let stream = ctx.stream()?;
        for t in [&*token, &*generated, &*pos, &*rng, &*scratch] {
            check_device(OP, stream, t)?;
        }
        if scratch.len() < SAMPLE_SCRATCH_LEN {
            return Err(DeviceError::InvalidShape {
                op: OP,
                reason: format!(
                    "`scratch` holds {} elements, fewer than SAMPLE_SCRATCH_LEN = {SAMPLE_SCRATCH_LEN}",
                    scratch.len()
                ),
            });
        }
        check_device(OP, stream, logits)?;
        check_len(OP, "token", token, 1)?;
        check_len(OP, "pos", pos, 1)?;
        check_len(OP, "rng", rng, 3)?;
        if logits.is_empty() {
            return Err(DeviceError::InvalidShape {
                op: OP,
                reason: "`logits` is empty".into(),
            });
        }
        if params.temperature.is_nan() {
            return Err(DeviceError::InvalidShape {
                op: OP,
                reason: "the temperature is NaN; use 0 (or below) for the argmax".into(),
            });
        }
        if !(params.top_p > 0.0 && params.top_p <= 1.0) {
            return Err(DeviceError::InvalidShape {
                op: OP,
                reason: format!("top_p = {} must be in (0, 1]", params.top_p),
            });
        }
        let vocab = u32_of(OP, "vocab", logits.len())?;
        // Greedy: many blocks take the argmax of a slice each, the sampling block the best
        // of theirs.
        let blocks = if params.is_greedy() {
            logits
                .len()
                .div_ceil(ARGMAX_THREADS as usize)
                .min(ARGMAX_BLOCKS)
        } else {
            0
        };
        let blocks = u32_of(OP, "blocks", blocks)?;
        if blocks > 0 {
            argmax_kernel().launch(
                stream,
                LaunchConfig::linear(blocks, ARGMAX_THREADS),
                KernelArgs::new()
                    .output(scratch.view("decode::sample")?)
                    .input(logits.view("decode::sample")?)
                    .scalar(vocab)
                    .scalar(blocks),
            )?;
        }
        kernel().launch(
            stream,
            LaunchConfig::linear(1, SAMPLE_THREADS),
            KernelArgs::new()
                .output(token.view("decode::sample")?)
                .output(generated.view("decode::sample")?)
                .output(pos.view("decode::sample")?)
                .output(rng.view("decode::sample")?)
                .input(logits.view("decode::sample")?)
                .scalar(vocab)
                .scalar(u32_of(OP, "generated", generated.len())?)
                .scalar(params.temperature)
                .scalar(params.top_k)
                .scalar(params.top_p)
                .input(scratch.view("decode::sample")?)
                .scalar(blocks),
        )
    })
}

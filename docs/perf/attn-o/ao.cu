// An experiment, not shipped: attention (RoPE, cache append) fused with the output projection
// and the residual add, for one decode step of the 1B shape (hidden 2048, 32/8 heads of 64).
// The production kernels (qkv, attention, o, gate/up, down: five a layer) against four a layer
// with att_o, in CUDA graphs of 16 layers, and a naive reference of the same math. att_o's
// block (kv head, row chunk) loads its slice of W_o into shared memory with cp.async first (it
// depends on nothing), then computes its kv head's attention itself (every row chunk of a head
// recomputes it), multiplies, and the last block of a row chunk adds the kv heads' partial
// sums to the residual in a fixed order (so the result is the same every run). The weights,
// the layers and the timing follow ../fused-layer/main.cu, repeated here so that neither
// harness can change the other's figures.
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#include "attention_gen.cuh"
#include "gemv_gen.cuh"
#ifndef RC
#define RC 16
#endif
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

static const unsigned D = 2048, INTER = 8192, HEADS = 32, KV = 8, HD = 64, QKVR = (HEADS + 2 * KV) * HD;
#define G 4
#define HDIM 64
#define NT 256
#define ROWS_PER (2048 / RC)
#define VPR (G * HDIM / 8)   // 16-byte vectors of a block's slice of one W_o row (32)

__device__ __forceinline__ float dot8f(uint4 p, const float* v, float acc) {
  acc = fmaf(bf_lo(p.x), v[0], acc); acc = fmaf(bf_hi(p.x), v[1], acc);
  acc = fmaf(bf_lo(p.y), v[2], acc); acc = fmaf(bf_hi(p.y), v[3], acc);
  acc = fmaf(bf_lo(p.z), v[4], acc); acc = fmaf(bf_hi(p.z), v[5], acc);
  acc = fmaf(bf_lo(p.w), v[6], acc); acc = fmaf(bf_hi(p.w), v[7], acc);
  return acc;
}

// Block (kvh, rc): attention of the G query heads of key/value head kvh over positions
// 0..=p, then rows rc*ROWS_PER.. of W_o (their G*HDIM columns of those heads) times it, into
// partial[kvh][row]; the last block of row chunk rc adds the KV partials, in order, to x.
extern "C" __global__ void __launch_bounds__(NT, 1)
att_o(float* x, float* partial, unsigned* counts, T_bf16* cache, const float* qkv,
      const float* inv_freq, const unsigned* posp, const T_bf16* wo, unsigned heads,
      unsigned kv, unsigned max_seq, unsigned d_model, float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float s_inv[G];
  __shared__ unsigned s_last;
  const unsigned kvh = blockIdx.x / RC, rc = blockIdx.x % RC;
  const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned cols = heads * HDIM;
  uint4* ws = (uint4*)smem;                                   // [ROWS_PER][VPR]
  float* qs = (float*)(smem + ROWS_PER * VPR * 16);           // [G][HDIM], scaled
  float* kn = qs + G * HDIM;                                  // new key (bf16-rounded)
  float* vn = kn + HDIM;                                      // new value
  float* red = vn + HDIM;                                     // [8 warps][G][HDIM]
  float* sc = red + 8 * G * HDIM;                             // [G][n]
  const unsigned row0 = rc * ROWS_PER;
  // The weights first: they depend on nothing before this kernel.
  for (unsigned i = tid; i < ROWS_PER * VPR; i += NT) {
    const unsigned r = i / VPR, v = i % VPR;
    const uint4* src = (const uint4*)(wo + (unsigned long long)(row0 + r) * cols + kvh * G * HDIM) + v;
    const unsigned dst = (unsigned)__cvta_generic_to_shared(ws + i);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src));
  }
  asm volatile("cp.async.commit_group;\n" ::);
  const unsigned p = posp[0];
  const unsigned n = p + 1 < max_seq ? p + 1 : max_seq;   // positions attended
  const bool has_new = p < max_seq;
  for (unsigned i = tid; i < G * HDIM / 2; i += NT) {
    const unsigned h = i / (HDIM / 2), j = i % (HDIM / 2);
    float s, c; sincosf((float)p * inv_freq[j], &s, &c);
    const float* q = qkv + (unsigned long long)(kvh * G + h) * HDIM;
    const float a = q[j], b = q[j + HDIM / 2];
    qs[h * HDIM + j] = (a * c - b * s) * scale;
    qs[h * HDIM + j + HDIM / 2] = (b * c + a * s) * scale;
  }
  if (tid < HDIM / 2) {
    const unsigned j = tid;
    float s, c; sincosf((float)p * inv_freq[j], &s, &c);
    const float* k = qkv + (unsigned long long)(heads + kvh) * HDIM;
    const float* v = qkv + (unsigned long long)(heads + kv + kvh) * HDIM;
    const float a = k[j], b = k[j + HDIM / 2];
    const T_bf16 k0 = st_bf16(a * c - b * s), k1 = st_bf16(b * c + a * s), v0 = st_bf16(v[j]), v1 = st_bf16(v[j + HDIM / 2]);
    kn[j] = ld_bf16(k0); kn[j + HDIM / 2] = ld_bf16(k1); vn[j] = ld_bf16(v0); vn[j + HDIM / 2] = ld_bf16(v1);
    if (rc == 0 && has_new) {
      T_bf16* kd = cache + ((unsigned long long)kvh * max_seq + p) * HDIM;
      T_bf16* vd = cache + ((unsigned long long)(kv + kvh) * max_seq + p) * HDIM;
      kd[j] = k0; kd[j + HDIM / 2] = k1; vd[j] = v0; vd[j + HDIM / 2] = v1;
    }
  }
  __syncthreads();
  const T_bf16* kc = cache + (unsigned long long)kvh * max_seq * HDIM;
  const T_bf16* vc = cache + (unsigned long long)(kv + kvh) * max_seq * HDIM;
  const unsigned last_t = has_new ? p : n;   // the position held in kn/vn, or none
  // Scores: one position a thread.
  for (unsigned t = tid; t < n; t += NT) {
    float acc[G];
#pragma unroll
    for (int h = 0; h < G; ++h) acc[h] = 0.0f;
    if (t == last_t) {
      for (int d = 0; d < HDIM; ++d) {
#pragma unroll
        for (int h = 0; h < G; ++h) acc[h] = fmaf(qs[h * HDIM + d], kn[d], acc[h]);
      }
    } else {
      const uint4* kr = (const uint4*)(kc + (unsigned long long)t * HDIM);
      uint4 kw[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) kw[i] = __ldg(kr + i);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float kf[8]; unpack8(kw[i], kf);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float4 qa = *(const float4*)(qs + h * HDIM + i * 8);
          const float4 qb = *(const float4*)(qs + h * HDIM + i * 8 + 4);
          acc[h] = fmaf(qa.x, kf[0], acc[h]); acc[h] = fmaf(qa.y, kf[1], acc[h]);
          acc[h] = fmaf(qa.z, kf[2], acc[h]); acc[h] = fmaf(qa.w, kf[3], acc[h]);
          acc[h] = fmaf(qb.x, kf[4], acc[h]); acc[h] = fmaf(qb.y, kf[5], acc[h]);
          acc[h] = fmaf(qb.z, kf[6], acc[h]); acc[h] = fmaf(qb.w, kf[7], acc[h]);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < G; ++h) sc[h * n + t] = acc[h];
  }
  __syncthreads();
  // Softmax of each head: warp h.
  if (warp < G) {
    float* sh = sc + warp * n;
    float m = -INFINITY;
    for (unsigned t = lane; t < n; t += 32) m = fmaxf(m, sh[t]);
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
    float l = 0.0f;
    for (unsigned t = lane; t < n; t += 32) { const float e = __expf(sh[t] - m); sh[t] = e; l += e; }
    for (int o = 16; o; o >>= 1) l += __shfl_xor_sync(~0u, l, o);
    if (lane == 0) s_inv[warp] = 1.0f / l;
  }
  __syncthreads();
  // Weighted values: warp w takes positions w, w + 8, ...; lane the two dims 2·lane, 2·lane+1.
  {
    float o[G][2];
#pragma unroll
    for (int h = 0; h < G; ++h) o[h][0] = o[h][1] = 0.0f;
    for (unsigned t = warp; t < n; t += 8) {
      float v0, v1;
      if (t == last_t) { v0 = vn[2 * lane]; v1 = vn[2 * lane + 1]; }
      else { const unsigned u = __ldg((const unsigned*)(vc + (unsigned long long)t * HDIM) + lane); v0 = bf_lo(u); v1 = bf_hi(u); }
#pragma unroll
      for (int h = 0; h < G; ++h) { const float w = sc[h * n + t]; o[h][0] = fmaf(w, v0, o[h][0]); o[h][1] = fmaf(w, v1, o[h][1]); }
    }
#pragma unroll
    for (int h = 0; h < G; ++h) { red[(warp * G + h) * HDIM + 2 * lane] = o[h][0]; red[(warp * G + h) * HDIM + 2 * lane + 1] = o[h][1]; }
  }
  __syncthreads();
  {
    const unsigned h = tid / HDIM, d = tid % HDIM;   // NT == G * HDIM
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) s += red[(w * G + h) * HDIM + d];
    qs[tid] = s * s_inv[h];   // the attention output of the group, [G][HDIM]
  }
  asm volatile("cp.async.wait_all;\n" ::);
  __syncthreads();
  // This block's rows of W_o times the group's output: a warp per row, a lane 8 columns.
  float ov[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) ov[e] = qs[lane * 8 + e];
  for (unsigned rr = warp; rr < ROWS_PER; rr += 8) {
    float acc = dot8f(ws[rr * VPR + lane], ov, 0.0f);
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
    if (lane == 0) partial[(unsigned long long)kvh * d_model + row0 + rr] = acc;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(counts + rc, 1u) == kv - 1;
  __syncthreads();
  if (s_last) {
    __threadfence();
    for (unsigned r = tid; r < ROWS_PER; r += NT) {
      float s = 0.0f;
      for (unsigned k = 0; k < kv; ++k) s += __ldcg(partial + (unsigned long long)k * d_model + row0 + r);
      x[row0 + r] += s;
    }
    if (tid == 0) counts[rc] = 0;
  }
}

template <int MODE, bool NORM>  // 0 store, 1 add, 2 swiglu
__global__ void ref_gemv(float* out, const T_bf16* w, const float* x, const T_bf16* nw, float eps, unsigned outputs, unsigned cols) {
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= outputs) return;
  float sc = 1.0f;
  if (NORM) {
    float ss = 0; for (unsigned c = lane; c < cols; c += 32) ss += x[c] * x[c];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
    sc = 1.0f / sqrtf(ss / cols + eps);
  }
  auto dot = [&](unsigned row) {
    float a = 0; for (unsigned c = lane; c < cols; c += 32) a += ld_bf16(w[(size_t)row * cols + c]) * x[c] * (NORM ? ld_bf16(nw[c]) : 1.0f);
    for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(~0u, a, o);
    return a * sc;
  };
  if (MODE == 2) { float g = dot(warp), u = dot(outputs + warp); if (lane == 0) out[warp] = g / (1.0f + expf(-g)) * u; }
  else { float y = dot(warp); if (lane == 0) { if (MODE == 0) out[warp] = y; else out[warp] += y; } }
}
// Naive attention of one query row (RoPE'd by the production kernel's q output is not
// available, so the reference rotates too): one block per query head.
__global__ void ref_att(float* out, T_bf16* cache, const float* qkv, const float* inv_freq, const unsigned* posp, unsigned max_seq, float scale) {
  const unsigned h = blockIdx.x, kvh = h / G, p = posp[0];
  __shared__ float q[HDIM], kn[HDIM], vn[HDIM], s[8192];
  if (threadIdx.x < HDIM / 2) {
    const unsigned j = threadIdx.x; float sn, cs; sincosf((float)p * inv_freq[j], &sn, &cs);
    const float* qq = qkv + h * HDIM; float a = qq[j], b = qq[j + 32];
    q[j] = a * cs - b * sn; q[j + 32] = b * cs + a * sn;
    const float* k = qkv + (HEADS + kvh) * HDIM; a = k[j]; b = k[j + 32];
    kn[j] = ld_bf16(st_bf16(a * cs - b * sn)); kn[j + 32] = ld_bf16(st_bf16(b * cs + a * sn));
    const float* v = qkv + (HEADS + KV + kvh) * HDIM; vn[j] = ld_bf16(st_bf16(v[j])); vn[j + 32] = ld_bf16(st_bf16(v[j + 32]));
  }
  __syncthreads();
  const unsigned n = p + 1;
  for (unsigned t = threadIdx.x; t < n; t += blockDim.x) {
    float a = 0; for (int d = 0; d < HDIM; ++d) a += q[d] * (t == p ? kn[d] : ld_bf16(cache[((size_t)kvh * max_seq + t) * HDIM + d]));
    s[t] = a * scale;
  }
  __syncthreads();
  if (threadIdx.x < HDIM) {
    float m = -INFINITY; for (unsigned t = 0; t < n; ++t) m = fmaxf(m, s[t]);
    float l = 0, o = 0; for (unsigned t = 0; t < n; ++t) { float e = expf(s[t] - m); l += e;
      o += e * (t == p ? vn[threadIdx.x] : ld_bf16(cache[((size_t)(KV + kvh) * max_seq + t) * HDIM + threadIdx.x])); }
    out[h * HDIM + threadIdx.x] = o / l;
  }
}

__global__ void fill_bf16(T_bf16* p, size_t n, unsigned seed, float amp) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = st_bf16(((h & 0xffffff) / 16777216.0f * 2.0f - 1.0f) * amp);
  }
}
__global__ void fill_f32(float* p, size_t n, unsigned seed, float amp) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = ((h & 0xffffff) / 16777216.0f * 2.0f - 1.0f) * amp;
  }
}

struct Layer { T_bf16 *wqkv, *an, *wo, *wgu, *mn, *wd; T_bf16* cache; };
static unsigned SMS;
static unsigned ksplit(unsigned units, unsigned vectors, unsigned sms) {
  unsigned k = 1; while (k < 8 && units * k < 16 * sms && vectors / (32 * 2 * k) >= 2) k *= 2; return k;
}
template <typename K>
static void prod_gemv(K kern, bool norm, bool swiglu, float* out, const T_bf16* w, const float* x, const T_bf16* nw, unsigned n, unsigned k, cudaStream_t s) {
  unsigned units = swiglu ? ((n / 2 + 1) / 2) : (n + 3) / 4;
  unsigned split = ksplit(units, k / 8, SMS);
  unsigned blocks = (units + 8 / split - 1) / (8 / split);
  unsigned rounds = (blocks + SMS * 2 - 1) / (SMS * 2);
  unsigned grid = (blocks + rounds - 1) / rounds;
  unsigned smem = norm && k <= 8192 ? 4 * k : 0;
  kern<<<grid, 256, smem, s>>>(out, w, x, nw, 1e-5f, n, k, split);
}

int main(int argc, char** argv) {
  const unsigned max_seq = argc > 1 ? atoi(argv[1]) : 4160;
  const unsigned pos_t = argc > 2 ? atoi(argv[2]) : 127;
  const int L = 16;
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0)); SMS = prop.multiProcessorCount;
  const unsigned chunk_pos = 256, parts = (max_seq + chunk_pos - 1) / chunk_pos, chunk = (max_seq + parts - 1) / parts;
  const float scale = 1.0f / sqrtf((float)HD), eps = 1e-5f;
  std::vector<Layer> ly(L);
  size_t cache_len = 2ull * KV * max_seq * HD;
  for (int l = 0; l < L; ++l) {
    Layer& y = ly[l];
    CK(cudaMalloc(&y.wqkv, (size_t)QKVR * D * 2)); CK(cudaMalloc(&y.an, D * 2)); CK(cudaMalloc(&y.wo, (size_t)D * HEADS * HD * 2));
    CK(cudaMalloc(&y.wgu, (size_t)2 * INTER * D * 2)); CK(cudaMalloc(&y.mn, D * 2)); CK(cudaMalloc(&y.wd, (size_t)D * INTER * 2));
    CK(cudaMalloc(&y.cache, cache_len * 2));
    fill_bf16<<<1024, 256>>>(y.wqkv, (size_t)QKVR * D, 11 + l, 0.05f); fill_bf16<<<64, 256>>>(y.an, D, 21 + l, 1.0f);
    fill_bf16<<<1024, 256>>>(y.wo, (size_t)D * HEADS * HD, 31 + l, 0.03f); fill_bf16<<<1024, 256>>>(y.wgu, (size_t)2 * INTER * D, 41 + l, 0.03f);
    fill_bf16<<<64, 256>>>(y.mn, D, 51 + l, 1.0f); fill_bf16<<<1024, 256>>>(y.wd, (size_t)D * INTER, 61 + l, 0.02f);
    fill_bf16<<<1024, 256>>>(y.cache, cache_len, 71 + l, 1.0f);
  }
  float *x, *qkv, *attn, *act, *part, *inv_freq, *x0, *xr, *opart; unsigned *counts, *pos, *ocounts;
  CK(cudaMalloc(&x, D * 4)); CK(cudaMalloc(&x0, D * 4)); CK(cudaMalloc(&xr, D * 4)); CK(cudaMalloc(&qkv, QKVR * 4)); CK(cudaMalloc(&attn, HEADS * HD * 4));
  CK(cudaMalloc(&act, INTER * 4)); CK(cudaMalloc(&part, (size_t)HEADS * parts * (HD + 2) * 4)); CK(cudaMalloc(&inv_freq, HD / 2 * 4));
  CK(cudaMalloc(&opart, (size_t)KV * D * 4)); CK(cudaMalloc(&ocounts, RC * 4)); CK(cudaMemset(ocounts, 0, RC * 4));
  CK(cudaMalloc(&counts, KV * 4)); CK(cudaMalloc(&pos, 4));
  CK(cudaMemset(counts, 0, KV * 4));
  std::vector<float> h_inv(HD / 2); for (unsigned i = 0; i < HD / 2; ++i) h_inv[i] = powf(500000.0f, -2.0f * i / HD);
  CK(cudaMemcpy(inv_freq, h_inv.data(), HD / 2 * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(pos, &pos_t, 4, cudaMemcpyHostToDevice));
  fill_f32<<<8, 256>>>(x0, D, 99, 1.0f);
  CK(cudaDeviceSynchronize());
  const unsigned att_floats = 4 * HD + 4 * chunk + 8 * 4 * HD;
  CK(cudaFuncSetAttribute(v0::decode_rms_norm_gemv, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768));
  CK(cudaFuncSetAttribute(v2::decode_rms_norm_gemv_swiglu, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768));
  const unsigned att_smem = att_floats * 4;
  CK(cudaFuncSetAttribute(decode_rope_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, att_smem));
  const unsigned n_att = pos_t + 1;
  const size_t ao_smem = (size_t)ROWS_PER * VPR * 16 + (G * HDIM + 2 * HDIM + 8 * G * HDIM + G * n_att) * 4;
  CK(cudaFuncSetAttribute(att_o, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ao_smem));
  printf("SMs %u, RC %d (%d blocks), att_o smem %zu B, max_seq %u pos %u\n", SMS, RC, KV * RC, ao_smem, max_seq, pos_t);

  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto reference = [&](int l, float* xx) {
    Layer& y = ly[l];
    ref_gemv<0, true><<<(QKVR + 7) / 8, 256, 0, s>>>(qkv, y.wqkv, xx, y.an, eps, QKVR, D);
    ref_att<<<HEADS, 256, 0, s>>>(attn, y.cache, qkv, inv_freq, pos, max_seq, scale);
    ref_gemv<1, false><<<(D + 7) / 8, 256, 0, s>>>(xx, y.wo, attn, nullptr, eps, D, HEADS * HD);
    ref_gemv<2, true><<<(INTER + 7) / 8, 256, 0, s>>>(act, y.wgu, xx, y.mn, eps, INTER, D);
    ref_gemv<1, false><<<(D + 7) / 8, 256, 0, s>>>(xx, y.wd, act, nullptr, eps, D, INTER);
  };
  auto production = [&](int l) {
    Layer& y = ly[l];
    prod_gemv(v0::decode_rms_norm_gemv, true, false, qkv, y.wqkv, x, y.an, QKVR, D, s);
    decode_rope_attention<<<KV * parts, 256, att_smem, s>>>(attn, part, counts, y.cache, qkv, inv_freq, pos, HEADS, KV, HD, max_seq, parts, chunk, scale);
    prod_gemv(v1::decode_gemv_add, false, false, x, y.wo, attn, y.an, D, HEADS * HD, s);
    prod_gemv(v2::decode_rms_norm_gemv_swiglu, true, true, act, y.wgu, x, y.mn, 2 * INTER, D, s);
    prod_gemv(v1::decode_gemv_add, false, false, x, y.wd, act, y.an, D, INTER, s);
  };
  auto fused = [&](int l) {
    Layer& y = ly[l];
    prod_gemv(v0::decode_rms_norm_gemv, true, false, qkv, y.wqkv, x, y.an, QKVR, D, s);
    att_o<<<KV * RC, NT, ao_smem, s>>>(x, opart, ocounts, y.cache, qkv, inv_freq, pos, y.wo, HEADS, KV, max_seq, D, scale);
    prod_gemv(v2::decode_rms_norm_gemv_swiglu, true, true, act, y.wgu, x, y.mn, 2 * INTER, D, s);
    prod_gemv(v1::decode_gemv_add, false, false, x, y.wd, act, y.an, D, INTER, s);
  };
  auto run16 = [&](auto body, float* out) {
    CK(cudaMemcpyAsync(x, x0, D * 4, cudaMemcpyDeviceToDevice, s));
    for (int l = 0; l < L; ++l) body(l);
    CK(cudaStreamSynchronize(s)); CK(cudaGetLastError());
    CK(cudaMemcpy(out, x, D * 4, cudaMemcpyDeviceToHost));
  };
  std::vector<float> a(D), b(D), c(D);
  CK(cudaMemcpyAsync(xr, x0, D * 4, cudaMemcpyDeviceToDevice, s));
  for (int l = 0; l < L; ++l) reference(l, xr);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(b.data(), xr, D * 4, cudaMemcpyDeviceToHost));
  auto err = [&](std::vector<float>& v) { double num = 0, den = 0; for (unsigned i = 0; i < D; ++i) { num += (v[i] - b[i]) * (double)(v[i] - b[i]); den += (double)b[i] * b[i]; } return sqrt(num / den); };
  run16(production, a.data()); printf("production vs reference after 16 layers: relative error %.3e\n", err(a));
  run16(fused, c.data()); printf("att_o      vs reference after 16 layers: relative error %.3e\n", err(c));
  run16(fused, a.data()); bool same = true; for (unsigned i = 0; i < D; ++i) same &= a[i] == c[i];
  printf("att_o twice: %s\n", same ? "bitwise equal" : "DIFFERENT");

  auto time_graph = [&](const char* name, auto body) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < L; ++l) body(l);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    const int N = 100;
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < N; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s)); CK(cudaStreamSynchronize(s));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("%-34s %8.1f us per 16 layers\n", name, ms * 1000.0 / N);
  };
  Layer* yl = ly.data();
  for (int rep = 0; rep < 3; ++rep) {
    time_graph("production (5 kernels a layer)", production);
    time_graph("att_o (4 kernels a layer)", fused);
  }
  time_graph("production attention + o only", [&](int l) {
    decode_rope_attention<<<KV * parts, 256, att_smem, s>>>(attn, part, counts, yl[l].cache, qkv, inv_freq, pos, HEADS, KV, HD, max_seq, parts, chunk, scale);
    prod_gemv(v1::decode_gemv_add, false, false, x, yl[l].wo, attn, yl[l].an, D, HEADS * HD, s); });
  time_graph("att_o only", [&](int l) {
    att_o<<<KV * RC, NT, ao_smem, s>>>(x, opart, ocounts, yl[l].cache, qkv, inv_freq, pos, yl[l].wo, HEADS, KV, max_seq, D, scale); });
  return 0;
}

// Harness: one decoder layer of the 1B-shaped Llama (hidden 2048, 32/8 heads of 64, MLP 8192,
// bf16 weights) as one cooperative kernel per layer (fused.cuh; fused2.cuh with -DV2, fused3.cuh
// with -DV3, fused4.cuh with -DV4), against the production decode kernels of crates/tensor
// (extracted by gen.py), and a naive reference of the same math. Prints the relative error of
// the residual stream after 16 layers of random weights, and the replay time of a CUDA graph of
// 16 layers of each. With -DTIMING (V3), each block's clock at the phase boundaries too.
// Arguments: max_seq (default 4160) and the position decoded (default 127).
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#if defined(V2) || defined(V3) || defined(V4) || defined(V5)
#define ATT_SYNC() asm volatile("bar.sync 1, 256;" ::: "memory")
#include "attention_gen2.cuh"
#else
#include "attention_gen.cuh"
#endif
#include "gemv_gen.cuh"
#if defined(V5)
#include "fused5.cuh"
#define VMAX 8
#define BLOCK_THREADS NT
#define FUSED_KERNEL decode_step
#elif defined(V4)
#include "fused4.cuh"
#define VMAX 8
#define BLOCK_THREADS NT
#elif defined(V3)
#include "fused3.cuh"
#define VMAX 8
#define BLOCK_THREADS NT
#elif defined(V2)
#include "fused2.cuh"
#else
#include "fused.cuh"
#endif
#ifdef V5
#define FUSED_NAME "fused (1 cooperative)"
#else
#define FUSED_NAME "fused (16 cooperative)"
#endif
#ifndef FUSED_KERNEL
#define FUSED_KERNEL decode_layer
#endif
#ifndef BLOCK_THREADS
#define BLOCK_THREADS LT
#endif

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

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
  if (MODE == 2) {
    float g = dot(warp), u = dot(outputs + warp);
    if (lane == 0) out[warp] = g / (1.0f + expf(-g)) * u;
  } else {
    float y = dot(warp);
    if (lane == 0) { if (MODE == 0) out[warp] = y; else out[warp] += y; }
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
__global__ void read_all(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) { uint4 v = __ldcs(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x12345678u) *sink = acc;
}

struct Layer { T_bf16 *wqkv, *an, *wo, *wgu, *mn, *wd; T_bf16* cache; };
static const unsigned D = 2048, INTER = 8192, HEADS = 32, KV = 8, HD = 64, QKVR = (HEADS + 2 * KV) * HD;
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
  float eps = 1e-5f;
  kern<<<grid, 256, smem, s>>>(out, w, x, nw, eps, n, k, split);
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
  float *x, *qkv, *attn, *act, *part, *inv_freq, *x0, *xr; unsigned *counts, *pos, *bar;
  CK(cudaMalloc(&x, D * 4)); CK(cudaMalloc(&x0, D * 4)); CK(cudaMalloc(&xr, D * 4)); CK(cudaMalloc(&qkv, QKVR * 4)); CK(cudaMalloc(&attn, HEADS * HD * 4));
  CK(cudaMalloc(&act, INTER * 4)); CK(cudaMalloc(&part, (size_t)HEADS * parts * (HD + 2) * 4)); CK(cudaMalloc(&inv_freq, HD / 2 * 4));
  CK(cudaMalloc(&counts, KV * 4)); CK(cudaMalloc(&pos, 4)); CK(cudaMalloc(&bar, 32));
  CK(cudaMemset(counts, 0, KV * 4)); CK(cudaMemset(bar, 0, 32));
  std::vector<float> h_inv(HD / 2); for (unsigned i = 0; i < HD / 2; ++i) h_inv[i] = powf(500000.0f, -2.0f * i / HD);
  CK(cudaMemcpy(inv_freq, h_inv.data(), HD / 2 * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(pos, &pos_t, 4, cudaMemcpyHostToDevice));
  fill_f32<<<8, 256>>>(x0, D, 99, 1.0f);
  CK(cudaDeviceSynchronize());

  const unsigned att_floats = 4 * HD + 4 * chunk + 8 * 4 * HD;
  unsigned xs_floats = INTER; if (att_floats > xs_floats) xs_floats = att_floats;
  const unsigned pslots = ((INTER + SMS - 1) / SMS) * 2 * 4 + 64;
  const size_t smem = (size_t)RING * VMAX * LT * 16 + xs_floats * 4 + pslots * 4;
  CK(cudaFuncSetAttribute(FUSED_KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, FUSED_KERNEL, BLOCK_THREADS, smem));
  printf("SMs %u, smem %zu B, occupancy %d, RING %d, max_seq %u pos %u parts %u chunk %u\n", SMS, smem, occ, RING, max_seq, pos_t, parts, chunk);
  CK(cudaFuncSetAttribute(v0::decode_rms_norm_gemv, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768));
  CK(cudaFuncSetAttribute(v2::decode_rms_norm_gemv_swiglu, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768));
  const unsigned att_smem = att_floats * 4;
  CK(cudaFuncSetAttribute(decode_rope_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, att_smem));

  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned d_ = D, inter_ = INTER, heads_ = HEADS, kv_ = KV, ms_ = max_seq, parts_ = parts, chunk_ = chunk;
  float scale_ = scale, eps_ = eps; unsigned xsf_ = xs_floats;
#ifdef V5
  StepLayer* d_layers; unsigned* ctr;
  CK(cudaMalloc(&d_layers, L * sizeof(StepLayer))); CK(cudaMalloc(&ctr, C_COUNT * 4)); CK(cudaMemset(ctr, 0, C_COUNT * 4));
  static_assert(sizeof(StepLayer) == sizeof(Layer), "layouts");
  CK(cudaMemcpy(d_layers, ly.data(), L * sizeof(Layer), cudaMemcpyHostToDevice));
  unsigned nl_ = L;
  auto fused = [&](int l) {
    if (l != 0) return cudaSuccess;
    void* args[] = {&x, &qkv, &attn, &act, &part, &counts, &ctr, &d_layers, &nl_, &inv_freq, &pos, &d_, &inter_, &heads_,
                    &kv_, &ms_, &parts_, &chunk_, &scale_, &eps_, &xsf_};
    return cudaLaunchCooperativeKernel((void*)decode_step, SMS, BLOCK_THREADS, args, smem, s);
  };
#else
  auto fused = [&](int l) {
    Layer& y = ly[l];
    void* args[] = {&x, &qkv, &attn, &act, &part, &counts, &y.cache, &bar, &y.wqkv, &y.an, &y.wo, &y.wgu, &y.mn, &y.wd,
                    &inv_freq, &pos, &d_, &inter_, &heads_, &kv_, &ms_, &parts_, &chunk_, &scale_, &eps_, &xsf_};
    return cudaLaunchCooperativeKernel((void*)decode_layer, SMS, BLOCK_THREADS, args, smem, s);
  };
#endif
  auto reference = [&](int l, float* xx) {
    Layer& y = ly[l];
    ref_gemv<0, true><<<(QKVR + 7) / 8, 256, 0, s>>>(qkv, y.wqkv, xx, y.an, eps, QKVR, D);
    decode_rope_attention<<<KV * parts, 256, att_smem, s>>>(attn, part, counts, y.cache, qkv, inv_freq, pos, HEADS, KV, HD, max_seq, parts, chunk, scale);
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

  // Correctness: 16 layers from x0, fused vs reference (each writes the same cache row).
  CK(cudaMemcpyAsync(x, x0, D * 4, cudaMemcpyDeviceToDevice, s));
  for (int l = 0; l < L; ++l) CK(fused(l));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpyAsync(xr, x0, D * 4, cudaMemcpyDeviceToDevice, s));
  for (int l = 0; l < L; ++l) reference(l, xr);
  CK(cudaStreamSynchronize(s));
  std::vector<float> a(D), b(D); CK(cudaMemcpy(a.data(), x, D * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(b.data(), xr, D * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0; for (unsigned i = 0; i < D; ++i) { num += (a[i] - b[i]) * (double)(a[i] - b[i]); den += (double)b[i] * b[i]; }
#ifdef TIMING
  {
    static unsigned long long t[sizeof(g_times) / sizeof(g_times[0])][132][12];
    CK(cudaMemcpyFromSymbol(t, g_times, sizeof t));
#ifdef V5
    const char* names[] = {"start", "qkv done", "att done", "att waited", "O done", "O waited", "GU done", "GU waited", "D done"};
    const int events = 9;
#else
    const char* names[] = {"start", "qkv done", "bar1 out", "att done", "bar2 out", "O staged", "O done", "bar3 out", "GU done", "bar4 out", "D done"};
    const int events = 11;
#endif
    // per event: mean over layers 1..15 of (min, max) over blocks, relative to the layer's min start
    for (int e = 0; e < events; ++e) {
      double mn = 0, mx = 0;
      for (int l = 1; l < 16; ++l) {
        unsigned long long s0 = ~0ull, lo = ~0ull, hi = 0;
        for (unsigned b = 0; b < SMS; ++b) { s0 = std::min(s0, t[l][b][0]); lo = std::min(lo, t[l][b][e]); hi = std::max(hi, t[l][b][e]); }
        mn += (lo - s0) / 1000.0; mx += (hi - s0) / 1000.0;
      }
      printf("  %-10s earliest block %7.2f us, latest %7.2f us\n", names[e], mn / 15, mx / 15);
    }
  }
#endif
  printf("fused vs reference after %d layers: relative error %.3e (|x| %.3f, x[0] %f vs %f)\n", L, sqrt(num / den), sqrt(den), a[0], b[0]);
  // production too
  CK(cudaMemcpyAsync(x, x0, D * 4, cudaMemcpyDeviceToDevice, s));
  for (int l = 0; l < L; ++l) production(l);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(a.data(), x, D * 4, cudaMemcpyDeviceToHost));
  num = 0; for (unsigned i = 0; i < D; ++i) num += (a[i] - b[i]) * (double)(a[i] - b[i]);
  printf("production vs reference: relative error %.3e\n", sqrt(num / den));

  // Timing: graphs of 16 layers.
  auto time_graph = [&](const char* name, auto body) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    body();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    const int N = 50;
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < N; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s)); CK(cudaStreamSynchronize(s));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = ms * 1000.0 / N;
    const double bytes = 16.0 * ((double)QKVR * D + D * HEADS * HD + 2.0 * INTER * D + (double)D * INTER) * 2;
    printf("%-28s %8.1f us per 16 layers, %6.3f TB/s of weights\n", name, us, bytes / us / 1e6);
    return us;
  };
  for (int rep = 0; rep < 2; ++rep) {
    time_graph("production (80 kernels)", [&] { for (int l = 0; l < L; ++l) production(l); });
    time_graph(FUSED_NAME, [&] { for (int l = 0; l < L; ++l) { cudaError_t e = fused(l); if (e) { printf("capture launch: %s\n", cudaGetErrorString(e)); exit(1);} } });
  }
  // Read bandwidth of the weights alone.
  {
    unsigned* sink; CK(cudaMalloc(&sink, 4));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    size_t n = (size_t)2 * INTER * D / 8;
    CK(cudaEventRecord(e0, s));
    for (int r = 0; r < 10; ++r) for (int l = 0; l < L; ++l) read_all<<<SMS * 4, 512, 0, s>>>((const uint4*)ly[l].wgu, n, sink);
    CK(cudaEventRecord(e1, s)); CK(cudaStreamSynchronize(s));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("plain read of gate/up weights: %.3f TB/s\n", 10.0 * L * n * 16 / (ms * 1e-3) / 1e12);
  }
  return 0;
}

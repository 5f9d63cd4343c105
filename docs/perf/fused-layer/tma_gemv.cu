// Harness: the decode GEMVs of crates/tensor (extracted by gen.py: the grid-stride kernel, and
// the streaming `_ring` kernel that replaced it for large products) against the GEMV this
// kernel was first measured as: weights streamed into a shared-memory ring by bulk copies from
// one producer thread (fused5.cuh's phase code as a kernel of its own: one block per SM, each
// block a contiguous slice of the outputs, 4 KiB slabs), for the products of the 1B shape. Each is replayed from a CUDA graph
// over copies of the weight larger than L2 together; prints µs per product, TB/s of weights,
// and each result's relative error against a float64 reference on the host.
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstring>
#include <cuda_runtime.h>
#define ATT_SYNC() asm volatile("bar.sync 1, 256;" ::: "memory")
#include "attention_gen2.cuh"
#include "gemv_gen.cuh"
#include "gemv_ring_gen.cuh"
#ifndef RING
#define RING 6
#endif
#include "fused5.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ void produce_one(const Phase& q, unsigned char* ring, unsigned long long* full, unsigned long long* empty) {
  const unsigned long long row_bytes = (unsigned long long)q.vpr * 16;
  for (unsigned c = 0, g = 0; c < q.chunks; ++c, ++g) {
    const unsigned slot = g % RING, use = g / RING;
    if (use > 0) mbar_wait(&empty[slot], (use - 1) & 1);
    unsigned char* dst = ring + (size_t)slot * CHUNK;
    if (q.kinds == 2) {
      const unsigned o = 4 * c, m = q.n - o < 4 ? q.n - o : 4;
      const unsigned bytes = (unsigned)(m * row_bytes);
      mbar_expect_tx(&full[slot], 2 * bytes);
      bulk_load(dst, q.w + (q.lo + o) * row_bytes, bytes, &full[slot]);
      bulk_load(dst + 4 * SLAB, q.w + (q.inter + q.lo + o) * row_bytes, bytes, &full[slot]);
    } else {
      const unsigned s = 8 * c, m = q.slabs - s < 8 ? q.slabs - s : 8;
      mbar_expect_tx(&full[slot], m * SLAB);
      bulk_load(dst, q.w + q.lo * row_bytes + (unsigned long long)s * SLAB, m * SLAB, &full[slot]);
    }
  }
}

template <int EPI, bool NORM>  // 0 store, 1 add, 2 swiglu
__global__ void __launch_bounds__(NT, 1) tma_gemv(float* out, const T_bf16* w, const float* x, const T_bf16* nw,
                                                   float eps, unsigned outputs, unsigned cols, unsigned xs_floats) {
  extern __shared__ __align__(128) unsigned char smt[];
  __shared__ float red[LT / 32];
  __shared__ __align__(8) unsigned long long full[RING], empty[RING];
  unsigned char* ring = smt;
  float4* xs = (float4*)(ring + (size_t)RING * CHUNK);
  float* partial = (float*)(xs + xs_floats / 4);
  Phase ph[4];
  ph[0] = make_phase(w, outputs, cols, EPI == 2 ? 2 : 1);
  if (threadIdx.x == 0) {
    for (int i = 0; i < RING; ++i) { mbar_init(&full[i], 1); mbar_init(&empty[i], LT / 32); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= LT) {
    if (threadIdx.x == LT) produce_one(ph[0], ring, full, empty);
    return;
  }
  const float sc = stage(xs, x, NORM ? nw : nullptr, cols, eps, red);
  unsigned g = 0;
  run_phase(ph, 0, g, ring, full, empty, xs, partial);
  const Phase& q = ph[0];
  for (unsigned o = threadIdx.x; o < q.n; o += LT) {
    if (EPI == 2) {
      const float gt = sum_kind(q, partial, o, 0) * sc, up = sum_kind(q, partial, o, 1) * sc;
      out[q.lo + o] = gt / (1.0f + expf(-gt)) * up;
    } else if (EPI == 1) {
      out[q.lo + o] += sum_kind(q, partial, o, 0) * sc;
    } else {
      out[q.lo + o] = sum_kind(q, partial, o, 0) * sc;
    }
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

static unsigned SMS;
static unsigned ksplit(unsigned units, unsigned vectors, unsigned sms) {
  unsigned k = 1; while (k < 8 && units * k < 16 * sms && vectors / (32 * 2 * k) >= 2) k *= 2; return k;
}

struct Shape { const char* name; int epi; bool norm; unsigned outputs, cols, copies, launches; };

template <int EPI, bool NORM>
static void run_shape(const Shape& sh, cudaStream_t s) {
  const unsigned rows = EPI == 2 ? 2 * sh.outputs : sh.outputs;
  const size_t wn = (size_t)rows * sh.cols;
  std::vector<T_bf16*> w(sh.copies);
  for (unsigned i = 0; i < sh.copies; ++i) { CK(cudaMalloc(&w[i], wn * 2)); fill_bf16<<<1024, 256>>>(w[i], wn, 7 + i, 0.03f); }
  T_bf16* nw; float *x, *out0, *base;
  CK(cudaMalloc(&nw, sh.cols * 2)); fill_bf16<<<64, 256>>>(nw, sh.cols, 5, 1.0f);
  CK(cudaMalloc(&x, sh.cols * 4)); fill_f32<<<64, 256>>>(x, sh.cols, 3, 1.0f);
  CK(cudaMalloc(&out0, sh.outputs * 4)); CK(cudaMalloc(&base, sh.outputs * 4));
  fill_f32<<<64, 256>>>(base, sh.outputs, 9, 1.0f);
  const float eps = 1e-5f;
  // production launch (as the tensor crate sizes it)
  auto prod_kernel = EPI == 2 ? v2::decode_rms_norm_gemv_swiglu : (EPI == 1 ? v1::decode_gemv_add : v0::decode_rms_norm_gemv);
  const unsigned units = EPI == 2 ? ((rows / 2 + 1) / 2) : (rows + 3) / 4;
  const unsigned split = ksplit(units, sh.cols / 8, SMS);
  const unsigned blocks = (units + 8 / split - 1) / (8 / split);
  const unsigned rounds = (blocks + SMS * 2 - 1) / (SMS * 2);
  const unsigned grid = (blocks + rounds - 1) / rounds;
  const unsigned psmem = NORM && sh.cols <= 8192 ? 4 * sh.cols : 0;
  CK(cudaFuncSetAttribute(prod_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768));
  auto prod = [&](unsigned i, float* out) { prod_kernel<<<grid, 256, psmem, s>>>(out, w[i], x, nw, eps, rows, sh.cols, split); };
  // the same kernel with every resident block slot filled (2 per SM) when there are more blocks
  const unsigned grid2 = blocks < 2 * SMS ? blocks : 2 * SMS;
  auto prod2 = [&](unsigned i, float* out) { prod_kernel<<<grid2, 256, psmem, s>>>(out, w[i], x, nw, eps, rows, sh.cols, split); };
  // bulk-copy ring launch
  const unsigned xs_floats = sh.cols;
  const unsigned kinds = EPI == 2 ? 2 : 1;
  const unsigned pfl = ((sh.outputs + SMS - 1) / SMS) * kinds * (sh.cols / 2048) + 64;
  const size_t tsmem = (size_t)RING * CHUNK + xs_floats * 4 + pfl * 4;
  CK(cudaFuncSetAttribute(tma_gemv<EPI, NORM>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tsmem));
  auto tma = [&](unsigned i, float* out) { tma_gemv<EPI, NORM><<<SMS, NT, tsmem, s>>>(out, w[i], x, nw, eps, sh.outputs, sh.cols, xs_floats); };
  // the streaming kernel as shipped (4 slots, 512-column slabs)
  auto ring_kernel = EPI == 2 ? r2::decode_rms_norm_gemv_swiglu_ring : (EPI == 1 ? r1::decode_gemv_add_ring : r0::decode_rms_norm_gemv_ring);
  const unsigned rgrid = SMS < sh.outputs ? SMS : sh.outputs;
  const size_t rsmem = 4 * 32768 + (size_t)sh.cols * 4 + (size_t)kinds * ((sh.outputs + rgrid - 1) / rgrid) * (sh.cols / 512) * 4;
  CK(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)rsmem));
  auto shipped = [&](unsigned i, float* out) { ring_kernel<<<rgrid, 288, rsmem, s>>>(out, w[i], x, nw, eps, rows, sh.cols); };
  // Each launch against a float64 host reference over 256 outputs spread over the product.
  std::vector<T_bf16> hw(wn), hn(sh.cols);
  std::vector<float> hx(sh.cols), hb(sh.outputs), got(sh.outputs);
  CK(cudaMemcpy(hw.data(), w[0], wn * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hn.data(), nw, sh.cols * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hx.data(), x, sh.cols * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hb.data(), base, sh.outputs * 4, cudaMemcpyDeviceToHost));
  auto bf = [](T_bf16 v) { unsigned u = (unsigned)v << 16; float f; memcpy(&f, &u, 4); return (double)f; };
  std::vector<double> in(sh.cols);
  double ss = 0; for (unsigned c = 0; c < sh.cols; ++c) ss += (double)hx[c] * hx[c];
  const double r = NORM ? 1.0 / sqrt(ss / sh.cols + eps) : 1.0;
  for (unsigned c = 0; c < sh.cols; ++c) in[c] = hx[c] * r * (NORM ? bf(hn[c]) : 1.0);
  auto dot = [&](size_t row) { double a = 0; for (unsigned c = 0; c < sh.cols; ++c) a += bf(hw[row * sh.cols + c]) * in[c]; return a; };
  auto check = [&](auto launch) {
    CK(cudaMemcpyAsync(out0, base, sh.outputs * 4, cudaMemcpyDeviceToDevice, s));
    launch(0, out0); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), out0, sh.outputs * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (unsigned k = 0; k < 256; ++k) {
      const unsigned o = (unsigned)((unsigned long long)k * sh.outputs / 256 + k % 7) % sh.outputs;
      double want;
      if (EPI == 2) { const double g = dot(o), u = dot(sh.outputs + o); want = g / (1.0 + exp(-g)) * u; }
      else want = (EPI == 1 ? hb[o] : 0.0) + dot(o);
      num += (got[o] - want) * (got[o] - want); den += want * want;
    }
    return sqrt(num / den);
  };
  const double e_prod = check(prod), e_prod2 = check(prod2), e_tma = check(tma), e_ship = check(shipped);
  auto time = [&](auto body) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (unsigned k = 0; k < sh.launches; ++k) body(k % sh.copies, out0);
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    const int N = 20;
    CK(cudaEventRecord(e0, s)); for (int i = 0; i < N; ++i) CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
    CK(cudaStreamSynchronize(s));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1000.0 / N / sh.launches;
  };
  printf("%-8s %6u x %5u  relative error vs float64: grid-stride %.2e (grid %u), all slots %.2e (grid %u), ring %.2e, shipped ring %.2e\n",
         sh.name, rows, sh.cols, e_prod, grid, e_prod2, grid2, e_tma, e_ship);
  for (int rep = 0; rep < 2; ++rep) {
    const double tp = time(prod), tp2 = time(prod2), tt = time(tma), ts = time(shipped);
    printf("%-8s %6u x %5u  grid-stride %7.2f us %5.3f TB/s | all slots %7.2f us (%.3f) | ring %7.2f us (%.3f) | shipped ring %7.2f us %5.3f TB/s (%.3f)\n",
           sh.name, rows, sh.cols, tp, wn * 2 / tp / 1e6, tp2, tp2 / tp, tt, tt / tp, ts, wn * 2 / ts / 1e6, ts / tp);
  }
  for (auto p : w) CK(cudaFree(p));
  CK(cudaFree(nw)); CK(cudaFree(x)); CK(cudaFree(out0)); CK(cudaFree(base));
}

// One launch of the grid-stride kernel as the tensor crate sizes it, or of the shipped
// streaming kernel.
template <int EPI, bool NORM>
static void launch_gemv(bool ring, float* out, const T_bf16* w, const float* x, const T_bf16* nw, unsigned rows, unsigned cols,
                        cudaStream_t s) {
  const float eps = 1e-5f;
  const unsigned outputs = EPI == 2 ? rows / 2 : rows, kinds = EPI == 2 ? 2 : 1;
  if (ring) {
    auto k = EPI == 2 ? r2::decode_rms_norm_gemv_swiglu_ring : (EPI == 1 ? r1::decode_gemv_add_ring : r0::decode_rms_norm_gemv_ring);
    const unsigned grid = SMS < outputs ? SMS : outputs;
    const size_t smem = 4 * 32768 + (size_t)cols * 4 + (size_t)kinds * ((outputs + grid - 1) / grid) * (cols / 512) * 4;
    static bool set[2][3] = {};
    if (!set[NORM][EPI]) { CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024)); set[NORM][EPI] = true; }
    k<<<grid, 288, smem, s>>>(out, w, x, nw, eps, rows, cols);
  } else {
    auto k = EPI == 2 ? v2::decode_rms_norm_gemv_swiglu : (EPI == 1 ? v1::decode_gemv_add : v0::decode_rms_norm_gemv);
    const unsigned units = EPI == 2 ? ((rows / 2 + 1) / 2) : (rows + 3) / 4;
    const unsigned split = ksplit(units, cols / 8, SMS);
    const unsigned blocks = (units + 8 / split - 1) / (8 / split);
    const unsigned rounds = (blocks + SMS * 2 - 1) / (SMS * 2);
    const unsigned grid = (blocks + rounds - 1) / rounds;
    const unsigned smem = NORM && cols <= 8192 ? 4 * cols : 0;
    static bool set[2][3] = {};
    if (!set[NORM][EPI]) { CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768)); set[NORM][EPI] = true; }
    k<<<grid, 256, smem, s>>>(out, w, x, nw, eps, rows, cols, split);
  }
}

// The four products of 16 layers of the 1B shape in their order and with their dependences
// (no attention: the output projection reads the first 2048 QKV outputs), replayed from a
// graph, with each product on the grid-stride or the streaming kernel as `mask` says (bit 0
// QKV, 1 output projection, 2 gate/up, 3 down).
static void chain(cudaStream_t s) {
  const unsigned D = 2048, I = 8192, Q = 3072, L = 16;
  struct W { T_bf16 *qkv, *an, *o, *gu, *mn, *d; };
  std::vector<W> ly(L);
  for (unsigned l = 0; l < L; ++l) {
    W& y = ly[l];
    CK(cudaMalloc(&y.qkv, (size_t)Q * D * 2)); CK(cudaMalloc(&y.an, D * 2)); CK(cudaMalloc(&y.o, (size_t)D * D * 2));
    CK(cudaMalloc(&y.gu, (size_t)2 * I * D * 2)); CK(cudaMalloc(&y.mn, D * 2)); CK(cudaMalloc(&y.d, (size_t)D * I * 2));
    fill_bf16<<<1024, 256>>>(y.qkv, (size_t)Q * D, 11 + l, 0.05f); fill_bf16<<<64, 256>>>(y.an, D, 21 + l, 1.0f);
    fill_bf16<<<1024, 256>>>(y.o, (size_t)D * D, 31 + l, 0.03f); fill_bf16<<<1024, 256>>>(y.gu, (size_t)2 * I * D, 41 + l, 0.03f);
    fill_bf16<<<64, 256>>>(y.mn, D, 51 + l, 1.0f); fill_bf16<<<1024, 256>>>(y.d, (size_t)D * I, 61 + l, 0.02f);
  }
  float *x, *x0, *qkv, *act;
  CK(cudaMalloc(&x, D * 4)); CK(cudaMalloc(&x0, D * 4)); CK(cudaMalloc(&qkv, Q * 4)); CK(cudaMalloc(&act, I * 4));
  fill_f32<<<8, 256>>>(x0, D, 99, 1.0f);
  CK(cudaDeviceSynchronize());
  auto body = [&](unsigned mask) {
    CK(cudaMemcpyAsync(x, x0, D * 4, cudaMemcpyDeviceToDevice, s));
    for (unsigned l = 0; l < L; ++l) {
      const W& y = ly[l];
      launch_gemv<0, true>(mask & 1, qkv, y.qkv, x, y.an, Q, D, s);
      launch_gemv<1, false>(mask & 2, x, y.o, qkv, nullptr, D, D, s);
      launch_gemv<2, true>(mask & 4, act, y.gu, x, y.mn, 2 * I, D, s);
      launch_gemv<1, false>(mask & 8, x, y.d, act, nullptr, D, I, s);
    }
  };
  std::vector<float> ref(D), got(D);
  for (int rep = 0; rep < 2; ++rep) {
    for (unsigned mask : {0u, 13u, 1u, 4u, 8u, 9u, 0u}) {
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      body(mask);
      CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
      for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(got.data(), x, D * 4, cudaMemcpyDeviceToHost));
      if (mask == 0) ref = got;
      double num = 0, den = 0;
      for (unsigned i = 0; i < D; ++i) { num += (got[i] - ref[i]) * (double)(got[i] - ref[i]); den += (double)ref[i] * ref[i]; }
      cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
      const int N = 30;
      CK(cudaEventRecord(e0, s)); for (int i = 0; i < N; ++i) CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
      CK(cudaStreamSynchronize(s));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
      printf("chain of 16 layers, streaming %s%s%s%s%s: %7.1f us (relative difference to all grid-stride %.1e)\n", mask & 1 ? "qkv " : "",
             mask & 2 ? "o " : "", mask & 4 ? "gate/up " : "", mask & 8 ? "down " : "", mask ? "" : "none", ms * 1000.0 / N,
             sqrt(num / den));
      CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    }
  }
}

int main() {
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0)); SMS = prop.multiProcessorCount;
  printf("%s, %u SMs, RING %d\n", prop.name, SMS, RING);
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  run_shape<0, true>({"qkv", 0, true, 3072, 2048, 16, 16}, s);
  run_shape<1, false>({"o", 1, false, 2048, 2048, 16, 16}, s);
  run_shape<2, true>({"gate/up", 2, true, 8192, 2048, 16, 16}, s);
  run_shape<1, false>({"down", 1, false, 2048, 8192, 16, 16}, s);
  run_shape<0, true>({"lm head", 0, true, 128256, 2048, 1, 4}, s);
  chain(s);
  return 0;
}

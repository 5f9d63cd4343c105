// How fast can an H100 read memory? Device copy (read + write counted) against read-only kernels.
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

template <int U, int MODE>
__global__ void rd(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i + (U - 1) * stride < n; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = MODE == 0 ? __ldg(p + i + u * stride) : MODE == 1 ? __ldcs(p + i + u * stride) : __ldcg(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) { uint4 v = __ldg(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x9e3779b9u) *sink = acc;
}
// Each block reads its own contiguous slice (as a GEMV's row range would).
template <int U>
__global__ void rd_slice(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  const size_t per = (n + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = lo + per < n ? lo + per : n;
  unsigned acc = 0;
  size_t i = lo + threadIdx.x;
  for (; i + (U - 1) * blockDim.x < hi; i += U * blockDim.x) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = __ldg(p + i + u * blockDim.x);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < hi; i += blockDim.x) { uint4 v = __ldg(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x9e3779b9u) *sink = acc;
}

int main() {
  const size_t bytes = 2ull << 30, n = bytes / 16;
  uint4 *a, *b; unsigned* sink;
  CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes)); CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(a, 1, bytes)); CK(cudaMemset(b, 2, bytes));
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  auto timeit = [&](const char* name, double moved, auto f) {
    f(); cudaDeviceSynchronize();
    float best = 1e30f;
    for (int r = 0; r < 7; ++r) { cudaEventRecord(e0); f(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); if (ms < best) best = ms; }
    printf("%-44s %7.3f TB/s\n", name, moved / (best * 1e-3) / 1e12);
  };
  timeit("device copy 1 GiB (read + write bytes)", 2.0 * (1 << 30), [&] { cudaMemcpyAsync(b, a, 1 << 30, cudaMemcpyDeviceToDevice); });
  timeit("device copy 2 GiB (read + write bytes)", 2.0 * bytes, [&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
  char name[128];
  for (int bps : {1, 2, 4, 8}) for (int thr : {256, 512, 1024}) {
    if (bps * thr > 2048) continue;
    snprintf(name, sizeof name, "read ldg U4 %d x %d blocks/SM", thr, bps);
    timeit(name, bytes, [&] { rd<4, 0><<<sms * bps, thr>>>(a, n, sink); });
    snprintf(name, sizeof name, "read ldg U8 %d x %d blocks/SM", thr, bps);
    timeit(name, bytes, [&] { rd<8, 0><<<sms * bps, thr>>>(a, n, sink); });
    snprintf(name, sizeof name, "read ldcs U8 %d x %d blocks/SM", thr, bps);
    timeit(name, bytes, [&] { rd<8, 1><<<sms * bps, thr>>>(a, n, sink); });
    snprintf(name, sizeof name, "read slices U8 %d x %d blocks/SM", thr, bps);
    timeit(name, bytes, [&] { rd_slice<8><<<sms * bps, thr>>>(a, n, sink); });
  }
  return 0;
}

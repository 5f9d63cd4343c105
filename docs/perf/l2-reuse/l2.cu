#include <cstdio>
#include <cuda_runtime.h>
// Does a buffer read by one kernel stay in L2 for the next? (docs/perf/llama-profile.md)
// A: fills L2 with buffer x (n bytes) by one of several load flavors; B: reads x like the GEMV (__ldg uint4), sums.
__global__ void fill(const uint4* x, size_t nv, int mode, unsigned* sink) {
  unsigned s = 0;
  unsigned long long pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += (size_t)gridDim.x * blockDim.x) {
    uint4 r;
    if (mode == 0) r = __ldg(x + i);
    else if (mode == 1) asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x),"=r"(r.y),"=r"(r.z),"=r"(r.w) : "l"(x+i));
    else if (mode == 2) asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(r.x),"=r"(r.y),"=r"(r.z),"=r"(r.w) : "l"(x+i), "l"(pol));
    else { asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(x+i)); r = make_uint4(0,0,0,0); }
    s ^= r.x ^ r.y ^ r.z ^ r.w;
  }
  if (s == 0x12345678u) sink[0] = s;
}
__global__ void gemvlike(const uint4* x, size_t nv, unsigned* sink) {
  unsigned s = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += (size_t)gridDim.x * blockDim.x) {
    uint4 r = __ldg(x + i); s ^= r.x ^ r.y ^ r.z ^ r.w; }
  if (s == 0x12345678u) sink[0] = s;
}
int main() {
  size_t MB = 1 << 20;
  size_t sizes[] = {8 * MB, 16 * MB, 24 * MB};
  uint4 *x, *y; unsigned* sink;
  cudaMalloc(&x, 64 * MB); cudaMalloc(&y, 256 * MB); cudaMalloc(&sink, 4);
  cudaMemset(x, 1, 64 * MB); cudaMemset(y, 2, 256 * MB);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (size_t n : sizes) {
    size_t nv = n / 16;
    for (int mode = -1; mode < 4; ++mode) {
      float best = 1e9, tot = 0;
      for (int t = 0; t < 20; ++t) {
        gemvlike<<<264, 256>>>(y, 256 * MB / 16, sink);  // evict x from L2
        if (mode >= 0) fill<<<132, 256>>>(x, nv, mode, sink);
        cudaEventRecord(a);
        gemvlike<<<264, 256>>>(x, nv, sink);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms; cudaEventElapsedTime(&ms, a, b);
        if (t > 2) { tot += ms; if (ms < best) best = ms; }
      }
      printf("size %zu MB mode %d (-1 none, 0 ldg, 1 ld, 2 evict_last, 3 prefetch): B best %.2f us mean %.2f us -> %.2f TB/s\n",
             n / MB, mode, best * 1e3, tot / 17 * 1e3, n / (best * 1e-3) / 1e12);
    }
  }
  return 0;
}

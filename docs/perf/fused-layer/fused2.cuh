// fused.cuh with 512 threads a block (LT), VMAX vectors a lane a slab, the outputs of a block
// interleaved with the other blocks', and attention on the first 256 threads (named barrier).
#ifndef RING
#define RING 5
#endif
#ifndef VMAX
#define VMAX 4
#endif
#ifndef LT
#define LT 512
#endif
#define NW (LT / 32)

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

struct Phase {
  const uint4* w;
  unsigned lo, n, kinds, inter, vpr, v, wpr, per, slabs, chunks;
};

__device__ __forceinline__ Phase make_phase(const T_bf16* w, unsigned outputs, unsigned cols, unsigned kinds) {
  Phase p;
  p.w = (const uint4*)w;
  // Interleaved: the block's outputs are blockIdx.x + i * gridDim.x, so that all blocks sweep
  // the weight together.
  p.lo = blockIdx.x;
  p.n = outputs > blockIdx.x ? (outputs - blockIdx.x + gridDim.x - 1) / gridDim.x : 0u;
  p.kinds = kinds;
  p.inter = outputs;
  p.vpr = cols >> 3;
  p.v = p.vpr >= 32 * VMAX ? VMAX : p.vpr / 32;
  p.wpr = p.vpr / (32 * p.v);
  p.per = kinds * p.wpr;
  p.slabs = p.n * p.per;
  p.chunks = (p.slabs + NW - 1) / NW;
  return p;
}

__device__ __forceinline__ uint4* ring_at(uint4* ring, unsigned slot, unsigned j) {
  return ring + ((slot * VMAX + j) * LT + threadIdx.x);
}

// Issues chunk `g` of the block's stream of weight chunks (the phases in order) into its
// ring slot: each warp copies the slab it will compute, each lane the vectors it will read.
__device__ __forceinline__ void issue(const Phase (&ph)[4], unsigned g, uint4* ring) {
  const unsigned slot = g % RING;
  unsigned p = 0, c = g;
  while (p < 4 && c >= ph[p].chunks) { c -= ph[p].chunks; ++p; }
  if (p < 4) {
    const Phase& q = ph[p];
    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned s = c * NW + warp;
    if (s < q.slabs) {
      const unsigned o = s / q.per, rem = s % q.per, kind = rem / q.wpr, part = rem % q.wpr;
      const unsigned row = (kind ? q.inter : 0u) + q.lo + o * gridDim.x;
      const uint4* src = q.w + (unsigned long long)row * q.vpr + part * 32 * q.v + lane;
      if (q.v == VMAX) {
#pragma unroll
        for (unsigned j = 0; j < VMAX; ++j) cp_async16(ring_at(ring, slot, j), src + j * 32);
      } else {
        for (unsigned j = 0; j < q.v; ++j) cp_async16(ring_at(ring, slot, j), src + j * 32);
      }
    }
  }
  cp_async_commit();
}

__device__ __forceinline__ float bfl(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bfh(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ float dot_vec(uint4* ring, unsigned slot, unsigned j, unsigned cv, const float4* xs,
                                         unsigned vpr, float acc) {
  const uint4 w = *ring_at(ring, slot, j);
  const float4 a = xs[cv], b = xs[vpr + cv];
  acc = fmaf(bfl(w.x), a.x, acc); acc = fmaf(bfh(w.x), a.y, acc);
  acc = fmaf(bfl(w.y), a.z, acc); acc = fmaf(bfh(w.y), a.w, acc);
  acc = fmaf(bfl(w.z), b.x, acc); acc = fmaf(bfh(w.z), b.y, acc);
  acc = fmaf(bfl(w.w), b.z, acc); acc = fmaf(bfh(w.w), b.w, acc);
  return acc;
}

// Stages x (cols floats, written by other blocks in this kernel: read through L2) into
// shared memory, times the norm weight when `nw`; returns the norm's scale (1 without).
__device__ __forceinline__ float stage(float4* xs, const float* x, const T_bf16* nw, unsigned cols, float eps,
                                       float* red) {
  const unsigned nv = cols >> 3, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#ifdef NOSTAGE
  __syncthreads();
  return 1.0f;
#endif
  const float4* x4 = (const float4*)x;
  const uint4* n4 = (const uint4*)nw;
  float ss = 0.0f;
  for (unsigned i = threadIdx.x; i < nv; i += LT) {
    float4 a = __ldcg(x4 + 2 * i), b = __ldcg(x4 + 2 * i + 1);
    if (nw) {
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
      const uint4 g = __ldg(n4 + i);
      a.x *= bfl(g.x); a.y *= bfh(g.x); a.z *= bfl(g.y); a.w *= bfh(g.y);
      b.x *= bfl(g.z); b.y *= bfh(g.z); b.z *= bfl(g.w); b.w *= bfh(g.w);
    }
    xs[i] = a;
    xs[nv + i] = b;
  }
  if (!nw) {
    __syncthreads();
    return 1.0f;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < LT / 32; ++i) s += red[i];
  return 1.0f / sqrtf(s / (float)cols + eps);
}

// The chunks of phase `p` (its first is chunk `g` of the stream): each warp's slab dotted
// with the staged input into `partial[slab]`, the chunk `RING` ahead issued into the slot.
__device__ __forceinline__ void run_phase(const Phase (&ph)[4], int p, unsigned& g, uint4* ring,
                                          const float4* xs, float* partial) {
  const Phase& q = ph[p];
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (unsigned c = 0; c < q.chunks; ++c, ++g) {
    cp_async_wait<RING - 1>();
    const unsigned s = c * NW + warp;
    if (s < q.slabs) {
      const unsigned rem = s % q.per, part = rem % q.wpr;
      const unsigned slot = g % RING;
      float acc = 0.0f;
      if (q.v == VMAX) {
#pragma unroll
        for (unsigned j = 0; j < VMAX; ++j) acc = dot_vec(ring, slot, j, part * 32 * VMAX + j * 32 + lane, xs, q.vpr, acc);
      } else {
        for (unsigned j = 0; j < q.v; ++j) acc = dot_vec(ring, slot, j, part * 32 * q.v + j * 32 + lane, xs, q.vpr, acc);
      }
      for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      if (lane == 0) partial[s] = acc;
    }
    issue(ph, g + RING, ring);
  }
  __syncthreads();
}

// Output `o` of the block's part of phase `q`: kind 0 (or the gate) and kind 1 (the up row).
__device__ __forceinline__ float sum_kind(const Phase& q, const float* partial, unsigned o, unsigned kind) {
  float y = 0.0f;
  for (unsigned t = 0; t < q.wpr; ++t) y += partial[o * q.per + kind * q.wpr + t];
  return y;
}

__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned& epoch) {
  __syncthreads();
#ifdef NOBAR
  return;
#endif
  epoch += 1;
  if (threadIdx.x == 0) {
#ifdef NOFENCE
    atomicAdd(bar, 1u);
    const unsigned target = epoch * gridDim.x;
    while (*(volatile unsigned*)bar < target) {}
#elif defined(RELEASE_ADD)
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
    const unsigned target = epoch * gridDim.x;
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
    } while (seen < target);
#else
    __threadfence();
    atomicAdd(bar, 1u);
    const unsigned target = epoch * gridDim.x;
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
    } while (seen < target);
    __threadfence();
#endif
  }
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(LT, 1) decode_layer(
    float* x, float* qkv, float* attn, float* act, float* part, unsigned* counts, T_bf16* cache,
    unsigned* bar, const T_bf16* wqkv, const T_bf16* attn_norm, const T_bf16* wo, const T_bf16* wgu,
    const T_bf16* mlp_norm, const T_bf16* wd, const float* inv_freq, const unsigned* pos, unsigned d,
    unsigned inter, unsigned heads, unsigned kv_heads, unsigned max_seq, unsigned parts, unsigned chunk,
    float scale, float eps, unsigned xs_floats) {
  extern __shared__ uint4 smem[];
  __shared__ float red[LT / 32];
  uint4* ring = smem;
  float4* xs = (float4*)(ring + RING * VMAX * LT);
  float* partial = (float*)(xs + xs_floats / 4);
  const unsigned hd = 64;  // HD_T
  const unsigned qd = heads * hd, qkv_rows = (heads + 2 * kv_heads) * hd;
  const Phase ph[4] = {make_phase(wqkv, qkv_rows, d, 1), make_phase(wo, d, qd, 1),
                       make_phase(wgu, inter, d, 2), make_phase(wd, d, inter, 1)};
  unsigned g = 0, epoch = 0;
  for (unsigned r = 0; r < RING; ++r) issue(ph, r, ring);

  // QKV = Wqkv · norm(x)
  float sc = stage(xs, x, attn_norm, d, eps, red);
  run_phase(ph, 0, g, ring, xs, partial);
  for (unsigned o = threadIdx.x; o < ph[0].n; o += LT) qkv[ph[0].lo + o * gridDim.x] = sum_kind(ph[0], partial, o, 0) * sc;
  grid_barrier(bar, epoch);

  // RoPE, the cache append and attention; the other blocks' weight copies stay in flight.
  {
    const unsigned p = pos[0];
    const unsigned qp = p < max_seq ? p : max_seq - 1;
    const unsigned n = qp + 1;
#ifdef NOATT
    if (0)
#endif
    if (threadIdx.x < 256)
    for (unsigned item = blockIdx.x; item < kv_heads * parts; item += gridDim.x) {
      const unsigned pi = item % parts, kvh = item / parts;
      if (pi * chunk >= n) continue;
      const bool owner = p < max_seq && pi == qp / chunk;
      dispatch<true>(attn, part, counts, nullptr, cache, heads, kv_heads, max_seq, parts, chunk, scale, 0u, kvh,
                     pi, n, (float*)xs, qkv, inv_freq, cache, p, owner);
      ATT_SYNC();
    }
  }
  grid_barrier(bar, epoch);

  // x += Wo · attn
  stage(xs, attn, nullptr, qd, eps, red);
  run_phase(ph, 1, g, ring, xs, partial);
  for (unsigned o = threadIdx.x; o < ph[1].n; o += LT) x[ph[1].lo + o * gridDim.x] += sum_kind(ph[1], partial, o, 0);
  grid_barrier(bar, epoch);

  // act = silu(gate) · up of Wgu · norm(x)
  sc = stage(xs, x, mlp_norm, d, eps, red);
  run_phase(ph, 2, g, ring, xs, partial);
  for (unsigned o = threadIdx.x; o < ph[2].n; o += LT) {
    const float gt = sum_kind(ph[2], partial, o, 0) * sc, up = sum_kind(ph[2], partial, o, 1) * sc;
    act[ph[2].lo + o * gridDim.x] = gt / (1.0f + expf(-gt)) * up;
  }
  grid_barrier(bar, epoch);

  // x += Wd · act
  stage(xs, act, nullptr, inter, eps, red);
  run_phase(ph, 3, g, ring, xs, partial);
  for (unsigned o = threadIdx.x; o < ph[3].n; o += LT) x[ph[3].lo + o * gridDim.x] += sum_kind(ph[3], partial, o, 0);

  // The last block out resets the barrier for the next launch.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned done = atomicAdd(bar + 1, 1u);
    if (done == gridDim.x - 1) {
      bar[0] = 0u;
      bar[1] = 0u;
      __threadfence();
    }
  }
}

// fused.cuh with the weights streamed by the tensor memory accelerator: one producer thread
// (a ninth warp) keeps a ring of RING 32 KiB slots filled with bulk copies, paced by
// mbarriers, independently of the eight consumer warps, which wait at the grid barriers and run
// attention while the producer goes on filling free slots.
#ifndef RING
#define RING 4
#endif
#define LT 256          // consumer threads
#define NT (LT + 32)    // and the producer warp
#define SLAB 4096       // bytes a consumer warp dots at once (32 lanes x 8 vectors)
#define CHUNK (8 * SLAB)

#ifdef TIMING
__device__ unsigned long long g_times[64][132][12];
__device__ unsigned g_launch;
__device__ __forceinline__ unsigned long long gtime() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
#define MARK(i) do { if (threadIdx.x == 0 && launch_idx < 64 && blockIdx.x < 132) g_times[launch_idx][blockIdx.x][i] = gtime(); } while (0)
#else
#define MARK(i) do {} while (0)
#endif
#define CSYNC() asm volatile("bar.sync 2, 256;" ::: "memory")

__device__ __forceinline__ unsigned saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned long long* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(saddr(b)), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(b)) : "memory");
}

// A GEMV phase as one block sees it: its outputs lo .. lo + n (contiguous), each a row of
// `vpr` 16-byte vectors (`wpr` slabs), or for SwiGLU a gate row and an up row of one slab each.
struct Phase {
  const unsigned char* w;
  unsigned lo, n, kinds, inter, vpr, wpr, slabs, chunks;
};

__device__ __forceinline__ Phase make_phase(const T_bf16* w, unsigned outputs, unsigned cols, unsigned kinds) {
  Phase p;
  p.w = (const unsigned char*)w;
  p.lo = (unsigned)((unsigned long long)blockIdx.x * outputs / gridDim.x);
  const unsigned hi = (unsigned)((unsigned long long)(blockIdx.x + 1) * outputs / gridDim.x);
  p.n = hi - p.lo;
  p.kinds = kinds;
  p.inter = outputs;
  p.vpr = cols >> 3;
  p.wpr = p.vpr / 256;
  p.slabs = p.n * kinds * p.wpr;
  p.chunks = kinds == 2 ? (p.n + 3) / 4 : (p.slabs + 7) / 8;
  return p;
}

// The producer: chunk after chunk of the block's stream, each into its slot once the
// consumers have released it.
__device__ void produce(const Phase (&ph)[4], unsigned char* ring, unsigned long long* full,
                        unsigned long long* empty, unsigned long long* gate) {
  unsigned g = 0;
  for (int p = 0; p < 4; ++p) {
    const Phase& q = ph[p];
#ifdef GATE
    // Phase p's weights are requested only once the block has passed (GATE 2) or reached
    // (GATE 1) the grid barrier before it, not while the barrier's own traffic is in flight.
    if (p > 0) mbar_wait(gate, (p - 1) & 1);
#endif
    const unsigned long long row_bytes = (unsigned long long)q.vpr * 16;
    for (unsigned c = 0; c < q.chunks; ++c, ++g) {
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
}

__device__ __forceinline__ float bfl(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bfh(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ float stage(float4* xs, const float* x, const T_bf16* nw, unsigned cols, float eps,
                                       float* red) {
  const unsigned nv = cols >> 3, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#ifdef NOSTAGE
  CSYNC();
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
    CSYNC();
    return 1.0f;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) red[warp] = ss;
  CSYNC();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < LT / 32; ++i) s += red[i];
  return 1.0f / sqrtf(s / (float)cols + eps);
}

// The consumers' side of phase `p`: each warp dots its slab of each chunk with the staged
// input into partial[output * kinds * wpr + kind * wpr + part], then releases the slot.
__device__ __forceinline__ void run_phase(const Phase (&ph)[4], int p, unsigned& g, const unsigned char* ring,
                                          unsigned long long* full, unsigned long long* empty, const float4* xs,
                                          float* partial) {
  const Phase& q = ph[p];
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (unsigned c = 0; c < q.chunks; ++c, ++g) {
    const unsigned slot = g % RING;
    mbar_wait(&full[slot], (g / RING) & 1);
    unsigned o, kind, part;
    bool live;
    if (q.kinds == 2) {
      o = 4 * c + (warp & 3);
      kind = warp >> 2;
      part = 0;
      live = o < q.n;
    } else {
      const unsigned s = 8 * c + warp;
      o = s / q.wpr;
      kind = 0;
      part = s % q.wpr;
      live = s < q.slabs;
    }
    if (live) {
      const uint4* w = (const uint4*)(ring + (size_t)slot * CHUNK + warp * SLAB) + lane;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint4 v = w[j * 32];
        const unsigned cv = part * 256 + j * 32 + lane;
        const float4 a = xs[cv], b = xs[q.vpr + cv];
        acc = fmaf(bfl(v.x), a.x, acc); acc = fmaf(bfh(v.x), a.y, acc);
        acc = fmaf(bfl(v.y), a.z, acc); acc = fmaf(bfh(v.y), a.w, acc);
        acc = fmaf(bfl(v.z), b.x, acc); acc = fmaf(bfh(v.z), b.y, acc);
        acc = fmaf(bfl(v.w), b.z, acc); acc = fmaf(bfh(v.w), b.w, acc);
      }
      for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
      if (lane == 0) partial[(o * q.kinds + kind) * q.wpr + part] = acc;
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
  }
  CSYNC();
}

__device__ __forceinline__ float sum_kind(const Phase& q, const float* partial, unsigned o, unsigned kind) {
  float y = 0.0f;
  for (unsigned t = 0; t < q.wpr; ++t) y += partial[(o * q.kinds + kind) * q.wpr + t];
  return y;
}

__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned& epoch, unsigned long long* gate = nullptr) {
  CSYNC();
#ifdef NOBAR
  return;
#endif
  epoch += 1;
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1u);
#if GATE == 1
    if (gate) mbar_arrive(gate);
#endif
    const unsigned target = epoch * gridDim.x;
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
    } while (seen < target);
    __threadfence();
#if GATE == 2
    if (gate) mbar_arrive(gate);
#endif
  }
  CSYNC();
}

extern "C" __global__ void __launch_bounds__(NT, 1) decode_layer(
    float* x, float* qkv, float* attn, float* act, float* part, unsigned* counts, T_bf16* cache,
    unsigned* bar, const T_bf16* wqkv, const T_bf16* attn_norm, const T_bf16* wo, const T_bf16* wgu,
    const T_bf16* mlp_norm, const T_bf16* wd, const float* inv_freq, const unsigned* pos, unsigned d,
    unsigned inter, unsigned heads, unsigned kv_heads, unsigned max_seq, unsigned parts, unsigned chunk,
    float scale, float eps, unsigned xs_floats) {
  extern __shared__ __align__(128) unsigned char smem3[];
  __shared__ float red[LT / 32];
  __shared__ __align__(8) unsigned long long full[RING], empty[RING], gate;
  unsigned char* ring = smem3;
  float4* xs = (float4*)(ring + (size_t)RING * CHUNK);
  float* partial = (float*)(xs + xs_floats / 4);
  const unsigned hd = 64;  // HD_T
  const unsigned qd = heads * hd, qkv_rows = (heads + 2 * kv_heads) * hd;
  const Phase ph[4] = {make_phase(wqkv, qkv_rows, d, 1), make_phase(wo, d, qd, 1),
                       make_phase(wgu, inter, d, 2), make_phase(wd, d, inter, 1)};
  if (threadIdx.x == 0) {
    for (int i = 0; i < RING; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], LT / 32);
    }
    mbar_init(&gate, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= LT) {
    if (threadIdx.x == LT) produce(ph, ring, full, empty, &gate);
    return;
  }
  unsigned g = 0, epoch = 0;
#ifdef TIMING
  const unsigned launch_idx = *(volatile unsigned*)&g_launch;
#endif
  MARK(0);

  float sc = stage(xs, x, attn_norm, d, eps, red);
  run_phase(ph, 0, g, ring, full, empty, xs, partial);
  for (unsigned o = threadIdx.x; o < ph[0].n; o += LT) qkv[ph[0].lo + o] = sum_kind(ph[0], partial, o, 0) * sc;
  MARK(1);
  grid_barrier(bar, epoch, &gate);
  MARK(2);

  {
    const unsigned p = pos[0];
    const unsigned qp = p < max_seq ? p : max_seq - 1;
    const unsigned n = qp + 1;
#ifdef NOATT
    if (0)
#endif
    for (unsigned item = blockIdx.x; item < kv_heads * parts; item += gridDim.x) {
      const unsigned pi = item % parts, kvh = item / parts;
      if (pi * chunk >= n) continue;
      const bool owner = p < max_seq && pi == qp / chunk;
      dispatch<true>(attn, part, counts, nullptr, cache, heads, kv_heads, max_seq, parts, chunk, scale, 0u, kvh,
                     pi, n, (float*)xs, qkv, inv_freq, cache, p, owner);
      CSYNC();
    }
  }
  MARK(3);
  grid_barrier(bar, epoch);
  MARK(4);

  stage(xs, attn, nullptr, qd, eps, red);
  MARK(5);
  run_phase(ph, 1, g, ring, full, empty, xs, partial);
  for (unsigned o = threadIdx.x; o < ph[1].n; o += LT) x[ph[1].lo + o] += sum_kind(ph[1], partial, o, 0);
  MARK(6);
  grid_barrier(bar, epoch, &gate);
  MARK(7);

  sc = stage(xs, x, mlp_norm, d, eps, red);
  run_phase(ph, 2, g, ring, full, empty, xs, partial);
  for (unsigned o = threadIdx.x; o < ph[2].n; o += LT) {
    const float gt = sum_kind(ph[2], partial, o, 0) * sc, up = sum_kind(ph[2], partial, o, 1) * sc;
    act[ph[2].lo + o] = gt / (1.0f + expf(-gt)) * up;
  }
  MARK(8);
  grid_barrier(bar, epoch, &gate);
  MARK(9);

  stage(xs, act, nullptr, inter, eps, red);
  run_phase(ph, 3, g, ring, full, empty, xs, partial);
  for (unsigned o = threadIdx.x; o < ph[3].n; o += LT) x[ph[3].lo + o] += sum_kind(ph[3], partial, o, 0);
  MARK(10);

  CSYNC();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned done = atomicAdd(bar + 1, 1u);
    if (done == gridDim.x - 1) {
#ifdef TIMING
      g_launch += 1;
#endif
      bar[0] = 0u;
      bar[1] = 0u;
      __threadfence();
    }
  }
}

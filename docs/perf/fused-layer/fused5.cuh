// fused3.cuh as one cooperative kernel for the whole stack of layers, so that the producer's
// stream of weights goes on across layers, with the grid barriers replaced by counters that
// only the work which needs them waits on: attention on a key/value head waits for that
// head's rows of the QKV product, the other phases for the rows of the phase before. The
// producer keeps at most INFLIGHT slots' copies in flight (the rest of the ring holds copies
// already landed), so that a consumer's own loads (its input, a counter) do not queue behind a
// burst of RING slots of weights.
#ifndef RING
#define RING 4
#endif
#define LT 256          // consumer threads
#define NT (LT + 32)    // and the producer warp
#define SLAB 4096       // bytes a consumer warp dots at once (32 lanes x 8 vectors)
#define CHUNK (8 * SLAB)

#ifndef INFLIGHT
#define INFLIGHT RING
#endif
#ifdef TIMING
__device__ unsigned long long g_times[16][132][12];
__device__ unsigned g_launch;
__device__ __forceinline__ unsigned long long gtime() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
#define MARK(i) do { if (threadIdx.x == 0 && launch_idx < 16 && blockIdx.x < 132) g_times[launch_idx][blockIdx.x][i] = gtime(); } while (0)
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

// The weights of one layer and its cache.
struct StepLayer { const T_bf16 *wqkv, *an, *wo, *wgu, *mn, *wd; T_bf16* cache; };

__device__ __forceinline__ void layer_phases(Phase (&ph)[4], const StepLayer& y, unsigned d, unsigned inter,
                                             unsigned qd, unsigned qkv_rows) {
  ph[0] = make_phase(y.wqkv, qkv_rows, d, 1);
  ph[1] = make_phase(y.wo, d, qd, 1);
  ph[2] = make_phase(y.wgu, inter, d, 2);
  ph[3] = make_phase(y.wd, d, inter, 1);
}

#ifdef AHEAD
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
// Asks L2 for chunk k of the block's stream (k counted over every layer), which the producer
// copies into the ring later.
__device__ void prefetch_chunk(const StepLayer* layers, unsigned per_layer, unsigned k, unsigned d,
                               unsigned inter, unsigned qd, unsigned qkv_rows) {
  const unsigned l = k / per_layer;
  unsigned c = k % per_layer;
  Phase ph[4];
  layer_phases(ph, layers[l], d, inter, qd, qkv_rows);
  int p = 0;
  while (c >= ph[p].chunks) c -= ph[p++].chunks;
  const Phase& q = ph[p];
  const unsigned long long row_bytes = (unsigned long long)q.vpr * 16;
  if (q.kinds == 2) {
    const unsigned o = 4 * c, m = q.n - o < 4 ? q.n - o : 4;
    bulk_prefetch_l2(q.w + (q.lo + o) * row_bytes, (unsigned)(m * row_bytes));
    bulk_prefetch_l2(q.w + (q.inter + q.lo + o) * row_bytes, (unsigned)(m * row_bytes));
  } else {
    const unsigned s = 8 * c, m = q.slabs - s < 8 ? q.slabs - s : 8;
    bulk_prefetch_l2(q.w + q.lo * row_bytes + (unsigned long long)s * SLAB, m * SLAB);
  }
}
#endif

// The producer: chunk after chunk of the block's stream over every layer, each into its slot
// once the consumers have released it, with at most INFLIGHT chunks requested and not landed.
__device__ void produce_all(const StepLayer* layers, unsigned n_layers, unsigned d, unsigned inter, unsigned qd,
                            unsigned qkv_rows, unsigned char* ring, unsigned long long* full,
                            unsigned long long* empty) {
  unsigned g = 0;
#ifdef AHEAD
  // With AHEAD, chunks g + 1 .. g + AHEAD are asked of L2 before chunk g is copied.
  unsigned pf = 0, per_layer = 0;
  {
    Phase ph[4];
    layer_phases(ph, layers[0], d, inter, qd, qkv_rows);
    for (int p = 0; p < 4; ++p) per_layer += ph[p].chunks;
  }
  const unsigned total = per_layer * n_layers;
#endif
  for (unsigned l = 0; l < n_layers; ++l) {
    Phase ph[4];
    layer_phases(ph, layers[l], d, inter, qd, qkv_rows);
    for (int p = 0; p < 4; ++p) {
      const Phase& q = ph[p];
      const unsigned long long row_bytes = (unsigned long long)q.vpr * 16;
      for (unsigned c = 0; c < q.chunks; ++c, ++g) {
#ifdef AHEAD
        if (pf <= g) pf = g + 1;
        for (; pf <= g + AHEAD && pf < total; ++pf) prefetch_chunk(layers, per_layer, pf, d, inter, qd, qkv_rows);
#endif
        const unsigned slot = g % RING, use = g / RING;
        if (use > 0) mbar_wait(&empty[slot], (use - 1) & 1);
#if INFLIGHT < RING
        if (g >= INFLIGHT) {
          const unsigned h = g - INFLIGHT;
          mbar_wait(&full[h % RING], (h / RING) & 1);
        }
#endif
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
}

// Counters (monotonic over the launch; the last block out resets them).
enum { C_HEAD = 0, C_ATT = 16, C_O, C_GU, C_D, C_END, C_COUNT };

// Thread 0 waits until ctr >= target, then the consumers go on together.
__device__ __forceinline__ void wait_for(const unsigned* ctr, unsigned target) {
#ifndef NOBAR
  if (threadIdx.x == 0) {
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ctr) : "memory");
    } while (seen < target);
    __threadfence();
  }
#endif
  CSYNC();
}
// The consumers' writes so far, then ctr += n.
__device__ __forceinline__ void signal(unsigned* ctr, unsigned n) {
  CSYNC();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(ctr, n);
  }
}

// The key/value head whose attention reads row r of the QKV product.
__device__ __forceinline__ unsigned head_of_row(unsigned r, unsigned heads, unsigned kv_heads, unsigned hd) {
  const unsigned h = r / hd;
  if (h < heads) return h / (heads / kv_heads);
  if (h < heads + kv_heads) return h - heads;
  return h - heads - kv_heads;
}

extern "C" __global__ void __launch_bounds__(NT, 1) decode_step(
    float* x, float* qkv, float* attn, float* act, float* part, unsigned* counts, unsigned* ctr,
    const StepLayer* layers, unsigned n_layers, const float* inv_freq, const unsigned* pos, unsigned d,
    unsigned inter, unsigned heads, unsigned kv_heads, unsigned max_seq, unsigned parts, unsigned chunk,
    float scale, float eps, unsigned xs_floats) {
  extern __shared__ __align__(128) unsigned char smem5[];
  __shared__ float red[LT / 32];
  __shared__ __align__(8) unsigned long long full[RING], empty[RING];
  unsigned char* ring = smem5;
  float4* xs = (float4*)(ring + (size_t)RING * CHUNK);
  float* partial = (float*)(xs + xs_floats / 4);
  const unsigned hd = 64;  // HD_T
  const unsigned qd = heads * hd, qkv_rows = (heads + 2 * kv_heads) * hd;
  const unsigned head_rows = (heads / kv_heads + 2) * hd;
  if (threadIdx.x == 0) {
    for (int i = 0; i < RING; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], LT / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= LT) {
    if (threadIdx.x == LT) produce_all(layers, n_layers, d, inter, qd, qkv_rows, ring, full, empty);
    return;
  }
  unsigned g = 0;
  const unsigned p = pos[0];
  const unsigned qp = p < max_seq ? p : max_seq - 1;
  const unsigned n = qp + 1;
  const unsigned items = kv_heads * parts;
  for (unsigned l = 0; l < n_layers; ++l) {
    const unsigned launch_idx = l;
    (void)launch_idx;
    const StepLayer y = layers[l];
    Phase ph[4];
    layer_phases(ph, y, d, inter, qd, qkv_rows);
    MARK(0);

    if (l > 0) wait_for(ctr + C_D, l * d);
    float sc = stage(xs, x, y.an, d, eps, red);
    run_phase(ph, 0, g, ring, full, empty, xs, partial);
    for (unsigned o = threadIdx.x; o < ph[0].n; o += LT) qkv[ph[0].lo + o] = sum_kind(ph[0], partial, o, 0) * sc;
    CSYNC();
    if (threadIdx.x == 0) {
      __threadfence();
      // Count the rows written for each key/value head they feed.
      unsigned r = ph[0].lo, end = ph[0].lo + ph[0].n;
      while (r < end) {
        const unsigned h = head_of_row(r, heads, kv_heads, hd);
        unsigned k = r + 1;
        while (k < end && head_of_row(k, heads, kv_heads, hd) == h) ++k;
        atomicAdd(ctr + C_HEAD + h, k - r);
        r = k;
      }
    }
    MARK(1);

    unsigned mine = 0;
#ifndef NOATT
    for (unsigned item = blockIdx.x; item < items; item += gridDim.x, ++mine) {
      const unsigned pi = item % parts, kvh = item / parts;
      if (pi * chunk >= n) continue;
      wait_for(ctr + C_HEAD + kvh, (l + 1) * head_rows);
      const bool owner = p < max_seq && pi == qp / chunk;
      dispatch<true>(attn, part, counts, nullptr, y.cache, heads, kv_heads, max_seq, parts, chunk, scale, 0u, kvh,
                     pi, n, (float*)xs, qkv, inv_freq, y.cache, p, owner);
      CSYNC();
    }
    if (mine) signal(ctr + C_ATT, mine);
    MARK(2);
    wait_for(ctr + C_ATT, (l + 1) * items);
#else
    for (unsigned item = blockIdx.x; item < items; item += gridDim.x) ++mine;
    (void)mine;
    for (unsigned h = 0; h < kv_heads; ++h) wait_for(ctr + C_HEAD + h, (l + 1) * head_rows);
#endif
    MARK(3);

    stage(xs, attn, nullptr, qd, eps, red);
    run_phase(ph, 1, g, ring, full, empty, xs, partial);
    for (unsigned o = threadIdx.x; o < ph[1].n; o += LT) x[ph[1].lo + o] += sum_kind(ph[1], partial, o, 0);
    signal(ctr + C_O, ph[1].n);
    MARK(4);
    wait_for(ctr + C_O, (l + 1) * d);
    MARK(5);

    sc = stage(xs, x, y.mn, d, eps, red);
    run_phase(ph, 2, g, ring, full, empty, xs, partial);
    for (unsigned o = threadIdx.x; o < ph[2].n; o += LT) {
      const float gt = sum_kind(ph[2], partial, o, 0) * sc, up = sum_kind(ph[2], partial, o, 1) * sc;
      act[ph[2].lo + o] = gt / (1.0f + expf(-gt)) * up;
    }
    signal(ctr + C_GU, ph[2].n);
    MARK(6);
    wait_for(ctr + C_GU, (l + 1) * inter);
    MARK(7);

    stage(xs, act, nullptr, inter, eps, red);
    run_phase(ph, 3, g, ring, full, empty, xs, partial);
    for (unsigned o = threadIdx.x; o < ph[3].n; o += LT) x[ph[3].lo + o] += sum_kind(ph[3], partial, o, 0);
    signal(ctr + C_D, ph[3].n);
    MARK(8);
  }

  CSYNC();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned done = atomicAdd(ctr + C_END, 1u);
    if (done == gridDim.x - 1) {
      for (int i = 0; i < C_COUNT; ++i) ctr[i] = 0u;
      __threadfence();
    }
  }
}

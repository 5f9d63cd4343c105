// fused3.cuh with chunks claimed dynamically: the weights streamed by the tensor memory accelerator: one producer thread
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

// A GEMV phase over the whole matrix: `rows` outputs of `vpr` 16-byte vectors (`wpr` slabs a
// row), or for SwiGLU `rows` gate rows followed by as many up rows. Chunks of eight slabs (four
// gate and their four up rows) are claimed by the blocks' producers from a counter, one at a time.
struct Phase {
  const unsigned char* w;
  float* out;
  unsigned rows, vpr, wpr, slabs, chunks, mode;  // mode 0 store (scaled), 1 accumulate, 2 SwiGLU (scaled)
};

__device__ __forceinline__ Phase make_phase(const T_bf16* w, float* out, unsigned rows, unsigned cols, unsigned mode) {
  Phase p;
  p.w = (const unsigned char*)w;
  p.out = out;
  p.rows = rows;
  p.vpr = cols >> 3;
  p.wpr = p.vpr / 256;
  p.mode = mode;
  p.slabs = rows * p.wpr;
  p.chunks = mode == 2 ? (rows + 3) / 4 : (p.slabs + 7) / 8;
  return p;
}

#define END_OF_PHASE 0xffffffffu

// The producer: for each phase, chunks claimed from the phase's counter until none is left
// (then an end marker), each into the next slot once the consumers have released it.
__device__ void produce(const Phase (&ph)[4], unsigned* claims, unsigned char* ring, unsigned* slot_chunk,
                        unsigned long long* full, unsigned long long* empty) {
  unsigned g = 0;
  for (int p = 0; p < 4; ++p) {
    const Phase& q = ph[p];
    const unsigned long long row_bytes = (unsigned long long)q.vpr * 16;
    unsigned next = atomicAdd(&claims[p], 1u);
    for (;; ++g) {
      // The claim after this one is in flight while this one waits for its slot.
      const unsigned c = next;
      if (c < q.chunks) next = atomicAdd(&claims[p], 1u);
      const unsigned slot = g % RING, use = g / RING;
      if (use > 0) mbar_wait(&empty[slot], (use - 1) & 1);
      unsigned char* dst = ring + (size_t)slot * CHUNK;
      if (c >= q.chunks) {
        slot_chunk[slot] = END_OF_PHASE;
        mbar_arrive(&full[slot]);
        ++g;
        break;
      }
      slot_chunk[slot] = c;
      if (q.mode == 2) {
        const unsigned o = 4 * c, m = q.rows - o < 4 ? q.rows - o : 4;
        const unsigned bytes = (unsigned)(m * row_bytes);
        mbar_expect_tx(&full[slot], 2 * bytes);
        bulk_load(dst, q.w + o * row_bytes, bytes, &full[slot]);
        bulk_load(dst + 4 * SLAB, q.w + (q.rows + o) * row_bytes, bytes, &full[slot]);
      } else {
        const unsigned s = 8 * c, m = q.slabs - s < 8 ? q.slabs - s : 8;
        mbar_expect_tx(&full[slot], m * SLAB);
        bulk_load(dst, q.w + (unsigned long long)s * SLAB, m * SLAB, &full[slot]);
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
// input; the last warp to finish a chunk combines the chunk's partial sums into its outputs.
__device__ __forceinline__ void run_phase(const Phase& q, unsigned& g, const unsigned char* ring,
                                          const unsigned* slot_chunk, unsigned long long* full,
                                          unsigned long long* empty, const float4* xs, float* partial,
                                          unsigned* done, float sc) {
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (;; ++g) {
    const unsigned slot = g % RING;
    mbar_wait(&full[slot], (g / RING) & 1);
    const unsigned c = slot_chunk[slot];
    if (c == END_OF_PHASE) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
      ++g;
      break;
    }
    unsigned part;
    bool live;
    if (q.mode == 2) {
      part = 0;
      live = 4 * c + (warp & 3) < q.rows;
    } else {
      const unsigned s = 8 * c + warp;
      part = s % q.wpr;
      live = s < q.slabs;
    }
    float acc = 0.0f;
    if (live) {
      const uint4* w = (const uint4*)(ring + (size_t)slot * CHUNK + warp * SLAB) + lane;
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
    }
    if (lane == 0) {
      partial[slot * 8 + warp] = acc;
      __threadfence_block();
      if (atomicAdd(&done[slot], 1u) == 7u) {
        __threadfence_block();
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = partial[slot * 8 + k];
        done[slot] = 0u;
        mbar_arrive(&empty[slot]);
        // Stores and reductions without a result: nothing here waits on memory.
        if (q.mode == 2) {
#pragma unroll
          for (unsigned k = 0; k < 4; ++k) {
            const unsigned o = 4 * c + k;
            if (o < q.rows) {
              const float gt = v[k] * sc, up = v[4 + k] * sc;
              q.out[o] = gt / (1.0f + expf(-gt)) * up;
            }
          }
        } else {
#pragma unroll
          for (unsigned k = 0; k < 8; ++k) {
            if (k % q.wpr != 0) continue;
            const unsigned s = 8 * c + k;
            if (s < q.slabs) {
              float y = 0.0f;
              for (unsigned t = 0; t < q.wpr; ++t) y += v[k + t];
              const unsigned r = s / q.wpr;
              // Each output is added to once, by the chunk that holds its row: one rounding,
              // as `+=` would give, without waiting for the old value.
              if (q.mode == 0) q.out[r] = y * sc; else atomicAdd(q.out + r, y);
            }
          }
        }
      } else {
        mbar_arrive(&empty[slot]);
      }
    }
  }
  CSYNC();
}

__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned& epoch) {
  CSYNC();
#ifdef NOBAR
  return;
#endif
  epoch += 1;
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1u);
    const unsigned target = epoch * gridDim.x;
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
    } while (seen < target);
    __threadfence();
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
  __shared__ __align__(8) unsigned long long full[RING], empty[RING];
  __shared__ unsigned slot_chunk[RING], done[RING];
  __shared__ float partial[RING * 8];
  unsigned char* ring = smem3;
  float4* xs = (float4*)(ring + (size_t)RING * CHUNK);
  const unsigned hd = 64;  // HD_T
  const unsigned qd = heads * hd, qkv_rows = (heads + 2 * kv_heads) * hd;
  const Phase ph[4] = {make_phase(wqkv, qkv, qkv_rows, d, 0), make_phase(wo, x, d, qd, 1),
                       make_phase(wgu, act, inter, d, 2), make_phase(wd, x, d, inter, 1)};
  if (threadIdx.x == 0) {
    for (int i = 0; i < RING; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], LT / 32);
      done[i] = 0u;
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= LT) {
    if (threadIdx.x == LT) produce(ph, bar + 2, ring, slot_chunk, full, empty);
    return;
  }
  unsigned g = 0, epoch = 0;

  float sc = stage(xs, x, attn_norm, d, eps, red);
  run_phase(ph[0], g, ring, slot_chunk, full, empty, xs, partial, done, sc);
  grid_barrier(bar, epoch);

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
  grid_barrier(bar, epoch);

  stage(xs, attn, nullptr, qd, eps, red);
  run_phase(ph[1], g, ring, slot_chunk, full, empty, xs, partial, done, 1.0f);
  grid_barrier(bar, epoch);

  sc = stage(xs, x, mlp_norm, d, eps, red);
  run_phase(ph[2], g, ring, slot_chunk, full, empty, xs, partial, done, sc);
  grid_barrier(bar, epoch);

  stage(xs, act, nullptr, inter, eps, red);
  run_phase(ph[3], g, ring, slot_chunk, full, empty, xs, partial, done, 1.0f);

  // The last block out resets the barrier and the claim counters for the next launch.
  CSYNC();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned out = atomicAdd(bar + 1, 1u);
    if (out == gridDim.x - 1) {
      for (int i = 0; i < 6; ++i) bar[i] = 0u;
      __threadfence();
    }
  }
}

//! `out = W · x` for a `bf16` weight `[rows, cols]` and an `f32` vector: the memory-bound
//! matrix-vector product of batch-1 decoding, with the vector operations around it fused in.
//!
//! Fusions, chosen per launch ([`GemvInput`], [`GemvEpilogue`]):
//! - the RMS norm of `x` ([`GemvInput::RmsNorm`]): every block sums the squares of `x` (read
//!   from L2, a few kilobytes) and stages `x · weight` once in shared memory; the scale
//!   `rsqrt(mean + eps)` multiplies the finished sums, so the normalized vector is never
//!   written to global memory;
//! - the residual add ([`GemvEpilogue::Accumulate`]): `out += W · x`, each element read and
//!   written by the one thread that owns its row;
//! - SwiGLU ([`GemvEpilogue::SwiGlu`]): a fused gate/up weight `[2 · inter, cols]` gives
//!   `out[i] = silu(y[i]) · y[inter + i]`, the warp that computes gate rows `i, i + 1`
//!   computing up rows `inter + i, inter + i + 1` too.
//!
//! On CUDA a warp computes four rows at once (four accumulators, one read of `x` for all), a
//! lane keeping eight 16-byte weight loads in flight; the first of them are issued before the
//! norm's reduction, so the weights stream while the block waits on its barrier. When there
//! are few rows for the device, `ksplit` warps of a block share a unit of four rows, each
//! summing an interleaved part of the columns, and the block adds their partial sums through
//! shared memory (a barrier before the sums are read and another before the slots are written
//! again). Blocks loop over units, so the norm's sum of squares is computed once per block.
//! Reading the weights once is the whole cost.
//!
//! Large products with too few rows for a warp each (those the kernel above splits) stream
//! their weights instead on devices of compute capability 9.0 and later (the `_ring`
//! kernels, chosen by [`ring_plan`]): one block per multiprocessor owns a contiguous run of
//! outputs, whose rows are contiguous bytes; one thread of a ninth warp copies them in 32
//! KiB bulk copies into a ring of four shared-memory slots, paced by mbarriers, while eight
//! warps dot each landed slot with the staged input and release it. The copies keep a
//! multiprocessor's loads in flight without a register per byte, and a block's work ends
//! when its bytes have arrived, with no tail of grid-stride rounds. On an H200 this took
//! the 3072 × 2048 QKV product of a 1B-shaped Llama from 7.9 to 6.6 µs and the 2048 × 8192
//! down projection from 12.9 to 11.9 µs, and made its replayed decode step 3.5% faster
//! (`docs/perf/fused-layer/tma_gemv.cu`, `docs/perf/llama-profile.md`). The kernel above
//! keeps products under [`RING_MIN_BYTES`] of weights (the 8 MB output projection: 5.8
//! against 5.2 µs streamed) and those whose rows fill its grid (the gate/up product: 19.2
//! against 19.6 µs; the LM head: as fast both ways). A row's sums are added in a fixed
//! order, so the result is the same on every run.

use cuflow_device_op::{from_fn, ExecutionContext};
use cuflow_runtime::{Device, DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};
use half::bf16;

use super::{bf16_defs, check_len, u32_of};
use crate::kernels::check_device;
use crate::op::{cached_kernel, TensorOp};
use crate::tensor::Tensor;

/// Threads per block (eight warps).
const THREADS: u32 = 256;
/// Resident blocks per multiprocessor the grid is sized for (and the kernel's launch bound).
/// Two, not four: over the GEMVs of a 1B-shaped decode step on an H100 (16 layers and the LM
/// head, `docs/perf/gemv-sweep.txt`), the looser register bound and the smaller grid took the
/// step from 1194 to 1155 µs; 16-byte loads per row in flight (`UNROLL`) of 4 or 8 were slower.
const BLOCKS_PER_SM: usize = 2;
/// Rows a warp computes at once.
const ROWS_PER_WARP: usize = 4;
/// 16-byte weight vectors per row a lane loads before it uses them.
const UNROLL: usize = 2;
/// Longest input whose normalized copy is staged in shared memory (32 KiB, within the
/// 48 KiB a block gets without opting in, beside the kernel's static arrays).
const STAGE_MAX_COLS: usize = 8 * 1024;
/// Weight bytes from which a product streams through shared memory ([`ring_plan`]).
const RING_MIN_BYTES: usize = 12_000_000;
/// Shared-memory slots of a streaming block's ring (four measured faster than six for the
/// 2048 × 8192 product, and as fast for the others).
const RING_SLOTS: usize = 4;
/// Bytes of one slot, and of one bulk copy at most.
const RING_CHUNK: usize = 32 * 1024;
/// Columns of a slab, what one warp dots at once (32 lanes × two 16-byte vectors): a row's
/// columns must be a multiple of it, so that no slab spans two rows.
const RING_SLAB_COLS: usize = 512;
/// Threads of a streaming block: eight consumer warps and the producer's warp.
const RING_THREADS: u32 = 288;
/// Shared memory a streaming block uses beside its dynamic part (mbarriers, the norm's
/// partial sums), with room to spare.
const RING_STATIC_BYTES: usize = 1024;

/// How a fused GEMV reads its input vector `x`.
#[derive(Clone, Copy, Debug)]
pub enum GemvInput<'a> {
    /// `x` as it is.
    Plain,
    /// The RMS norm of `x`, `x / sqrt(mean(x²) + eps) · weight` (`weight` `bf16`, one value
    /// per column), computed as `x` is loaded.
    RmsNorm {
        /// The norm's weight.
        weight: &'a Tensor<bf16>,
        /// Added to the mean square.
        eps: f32,
    },
}

/// What a fused GEMV does with the products `y = W · x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvEpilogue {
    /// `out = y` (`out` has one element per row of `W`).
    Store,
    /// `out += y`: the residual add (`out` has one element per row of `W`).
    Accumulate,
    /// SwiGLU of a fused gate/up weight `[2 · inter, k]`: `out[i] = silu(y[i]) · y[inter + i]`
    /// (`out` has `inter` elements).
    SwiGlu,
}

impl GemvEpilogue {
    fn code(self) -> u32 {
        match self {
            GemvEpilogue::Store => 0,
            GemvEpilogue::Accumulate => 1,
            GemvEpilogue::SwiGlu => 2,
        }
    }
}

fn kernel_name(norm: bool, epilogue: GemvEpilogue) -> &'static str {
    match (norm, epilogue) {
        (false, GemvEpilogue::Store) => "decode_gemv",
        (false, GemvEpilogue::Accumulate) => "decode_gemv_add",
        (false, GemvEpilogue::SwiGlu) => "decode_gemv_swiglu",
        (true, GemvEpilogue::Store) => "decode_rms_norm_gemv",
        (true, GemvEpilogue::Accumulate) => "decode_rms_norm_gemv_add",
        (true, GemvEpilogue::SwiGlu) => "decode_rms_norm_gemv_swiglu",
    }
}

/// Every variant `device` can launch, for [`compile_all`](super::compile_all).
pub(super) fn kernels(device: &Device) -> Vec<Kernel> {
    let epilogues = [
        GemvEpilogue::Store,
        GemvEpilogue::Accumulate,
        GemvEpilogue::SwiGlu,
    ];
    let ring = streams_in_bulk(device.compute_capability());
    [false, true]
        .into_iter()
        .flat_map(|norm| {
            epilogues.into_iter().flat_map(move |e| {
                std::iter::once(kernel(norm, e)).chain(ring.then(|| ring_kernel(norm, e)))
            })
        })
        .collect()
}

/// Whether a device of compute capability `cc` has bulk copies into shared memory paced by
/// mbarriers (9.0 and later; `None`, the host, has not).
fn streams_in_bulk(cc: Option<(u32, u32)>) -> bool {
    cc.is_some_and(|cc| cc >= (9, 0))
}

/// How a streaming launch is sized: its grid and its dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RingPlan {
    grid: usize,
    shared: usize,
}

/// The streaming launch of a product of `n` rows (for SwiGLU, `n / 2` gate and as many up
/// rows) of `k` columns, or `None` where the grid-stride kernel runs: on devices without bulk
/// copies (`cc`), for fewer than [`RING_MIN_BYTES`] of weights, for rows that are not whole
/// slabs, where the grid-stride kernel has rows enough to give each warp its own (it is as
/// fast there: the gate/up product and the LM head), or when the ring, the staged input and
/// the partial sums do not fit `max_shared`. One block per multiprocessor (`sms`), at most
/// one per output.
fn ring_plan(
    cc: Option<(u32, u32)>,
    sms: usize,
    max_shared: usize,
    (n, k): (usize, usize),
    epilogue: GemvEpilogue,
) -> Option<RingPlan> {
    let bytes = n.checked_mul(k)?.checked_mul(2)?;
    if !streams_in_bulk(cc)
        || k % RING_SLAB_COLS != 0
        || bytes < RING_MIN_BYTES
        || ksplit(units(n, epilogue), k / 8, sms) == 1
    {
        return None;
    }
    let (outputs, kinds) = match epilogue {
        GemvEpilogue::SwiGlu => (n / 2, 2),
        _ => (n, 1),
    };
    let grid = sms.min(outputs).max(1);
    let partials = kinds * outputs.div_ceil(grid) * (k / RING_SLAB_COLS);
    let shared = RING_SLOTS * RING_CHUNK + 4 * k + 4 * partials;
    (shared + RING_STATIC_BYTES <= max_shared).then_some(RingPlan { grid, shared })
}

fn source(name: &str, norm: bool, epilogue: GemvEpilogue) -> String {
    format!(
        r#"{defs}
#define IN_NORM {norm}
#define EPILOGUE {epilogue}
#define ROWS {rows}
#define UNROLL {unroll}
#define STAGE_MAX {stage_max}
__device__ __forceinline__ float bf_lo(unsigned v) {{ return __uint_as_float(v << 16); }}
__device__ __forceinline__ float bf_hi(unsigned v) {{ return __uint_as_float(v & 0xffff0000u); }}
__device__ __forceinline__ float dot8(uint4 p, const float* v, float acc) {{
  acc = fmaf(bf_lo(p.x), v[0], acc);
  acc = fmaf(bf_hi(p.x), v[1], acc);
  acc = fmaf(bf_lo(p.y), v[2], acc);
  acc = fmaf(bf_hi(p.y), v[3], acc);
  acc = fmaf(bf_lo(p.z), v[4], acc);
  acc = fmaf(bf_hi(p.z), v[5], acc);
  acc = fmaf(bf_lo(p.w), v[6], acc);
  acc = fmaf(bf_hi(p.w), v[7], acc);
  return acc;
}}
/* Row j of the ROWS rows of unit u, clamped to a row that exists (its product is not
   written): rows 4u .. 4u + 3, or for SwiGLU the gate rows 2u, 2u + 1 and the up rows
   inter + 2u, inter + 2u + 1. */
__device__ __forceinline__ unsigned row_of(unsigned u, unsigned j, unsigned rows) {{
#if EPILOGUE == 2
  const unsigned inter = rows >> 1;
  unsigned g = 2 * u + (j & 1);
  if (g >= inter) g = 2 * u;
  return j < 2 ? g : inter + g;
#else
  const unsigned r = ROWS * u + j;
  return r < rows ? r : rows - 1;
#endif
}}
/* The weight vectors i0 + k · stride (k < UNROLL) of every row of the unit. */
__device__ __forceinline__ void load_chunk(uint4 (&p)[ROWS][UNROLL], const uint4* const (&wr)[ROWS],
                                           unsigned i0, unsigned stride, unsigned nv) {{
#pragma unroll
  for (int k = 0; k < UNROLL; ++k) {{
    const unsigned i = i0 + k * stride;
#pragma unroll
    for (int j = 0; j < ROWS; ++j) p[j][k] = i < nv ? __ldg(wr[j] + i) : make_uint4(0u, 0u, 0u, 0u);
  }}
}}
/* Unit u's rows; false when the warp has no unit. */
__device__ __forceinline__ bool set_rows(const uint4* (&wr)[ROWS], const T_bf16* w, unsigned u,
                                         unsigned units, unsigned rows, unsigned cols) {{
#pragma unroll
  for (int j = 0; j < ROWS; ++j)
    wr[j] = (const uint4*)(w + (unsigned long long)row_of(u < units ? u : 0, j, rows) * cols);
  return u < units;
}}
/* A warp computes the ROWS rows of a unit, each lane keeping ROWS · UNROLL 16-byte weight
   loads in flight; `ksplit` warps of a block share a unit, each summing an interleaved part
   of the columns. The first loads are issued before the norm's reduction. With the norm,
   x · weight is staged once per block in shared memory (xs[i] = elements 8i .. 8i + 3,
   xs[nv + i] = elements 8i + 4 .. 8i + 7, so a warp's reads are contiguous) when it fits,
   and the scale rsqrt(mean(x²) + eps) multiplies the finished sums. */
extern "C" __global__ void __launch_bounds__(256, {min_blocks})
{name}(float* out, const T_bf16* w, const float* x, const T_bf16* nw, float eps,
       unsigned rows, unsigned cols, unsigned ksplit) {{
  extern __shared__ float4 xs[];
  __shared__ float partial[ROWS * 8];
  __shared__ float squares[8];
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const unsigned nv = cols >> 3;
  const float4* x4 = (const float4*)x;
  const uint4* nw4 = (const uint4*)nw;
#if EPILOGUE == 2
  const unsigned units = ((rows >> 1) + 1) >> 1;
#else
  const unsigned units = (rows + ROWS - 1) / ROWS;
#endif
  const unsigned per_block = warps / ksplit;
  const unsigned slot = warp / ksplit, part = warp % ksplit, stride = 32 * ksplit;
  const unsigned start = part * 32 + lane;
  const unsigned first = blockIdx.x * per_block, step = gridDim.x * per_block;
  const uint4* wr[ROWS];
  uint4 p[ROWS][UNROLL];
  if (set_rows(wr, w, first + slot, units, rows, cols)) load_chunk(p, wr, start, stride, nv);
  float scale = 1.0f;
#if IN_NORM
  const bool staged = cols <= STAGE_MAX;
  {{
    float ss = 0.0f;
    for (unsigned i = threadIdx.x; i < nv; i += blockDim.x) {{
      const float4 a = __ldg(x4 + 2 * i), b = __ldg(x4 + 2 * i + 1);
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
      ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
      if (staged) {{
        const uint4 g = __ldg(nw4 + i);
        xs[i] = make_float4(a.x * bf_lo(g.x), a.y * bf_hi(g.x), a.z * bf_lo(g.y), a.w * bf_hi(g.y));
        xs[nv + i] = make_float4(b.x * bf_lo(g.z), b.y * bf_hi(g.z), b.z * bf_lo(g.w), b.w * bf_hi(g.w));
      }}
    }}
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) squares[warp] = ss;
    __syncthreads();
    float s = 0.0f;
    for (unsigned i = 0; i < warps; ++i) s += squares[i];
    scale = 1.0f / sqrtf(s / (float)cols + eps);
  }}
#endif
  for (unsigned base = first; base < units; base += step) {{
    const unsigned u = base + slot;
    float acc[ROWS];
#pragma unroll
    for (int j = 0; j < ROWS; ++j) acc[j] = 0.0f;
    if (u < units) {{
      if (base != first) {{
        set_rows(wr, w, u, units, rows, cols);
        load_chunk(p, wr, start, stride, nv);
      }}
      for (unsigned i0 = start; i0 < nv; i0 += UNROLL * stride) {{
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {{
          const unsigned i = i0 + k * stride;
          if (i < nv) {{
            float4 a, b;
#if IN_NORM
            if (staged) {{
              a = xs[i];
              b = xs[nv + i];
            }} else {{
              const uint4 g = __ldg(nw4 + i);
              a = __ldg(x4 + 2 * i);
              b = __ldg(x4 + 2 * i + 1);
              a.x *= bf_lo(g.x); a.y *= bf_hi(g.x); a.z *= bf_lo(g.y); a.w *= bf_hi(g.y);
              b.x *= bf_lo(g.z); b.y *= bf_hi(g.z); b.z *= bf_lo(g.w); b.w *= bf_hi(g.w);
            }}
#else
            a = __ldg(x4 + 2 * i);
            b = __ldg(x4 + 2 * i + 1);
#endif
            const float v[8] = {{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
#pragma unroll
            for (int j = 0; j < ROWS; ++j) acc[j] = dot8(p[j][k], v, acc[j]);
          }}
        }}
        if (i0 + UNROLL * stride < nv) load_chunk(p, wr, i0 + UNROLL * stride, stride, nv);
      }}
#pragma unroll
      for (int j = 0; j < ROWS; ++j)
        for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    }}
    if (ksplit > 1) {{
      if (lane == 0) {{
#pragma unroll
        for (int j = 0; j < ROWS; ++j) partial[ROWS * warp + j] = acc[j];
      }}
      __syncthreads();
      if (part == 0) {{
#pragma unroll
        for (int j = 0; j < ROWS; ++j) {{
          acc[j] = 0.0f;
          for (unsigned q = 0; q < ksplit; ++q) acc[j] += partial[ROWS * (warp + q) + j];
        }}
      }}
      __syncthreads();
    }}
    if (lane == 0 && part == 0 && u < units) {{
#pragma unroll
      for (int j = 0; j < ROWS; ++j) acc[j] *= scale;
#if EPILOGUE == 2
      const unsigned inter = rows >> 1;
#pragma unroll
      for (int j = 0; j < 2; ++j) {{
        const unsigned g = 2 * u + j;
        if (g < inter) out[g] = acc[j] / (1.0f + expf(-acc[j])) * acc[j + 2];
      }}
#else
#pragma unroll
      for (int j = 0; j < ROWS; ++j) {{
        const unsigned r = ROWS * u + j;
#if EPILOGUE == 0
        if (r < rows) out[r] = acc[j];
#else
        if (r < rows) out[r] += acc[j];
#endif
      }}
#endif
    }}
  }}
}}
"#,
        defs = bf16_defs(),
        norm = u32::from(norm),
        epilogue = epilogue.code(),
        rows = ROWS_PER_WARP,
        unroll = UNROLL,
        stage_max = STAGE_MAX_COLS,
        min_blocks = BLOCKS_PER_SM,
    )
}

fn kernel(norm: bool, epilogue: GemvEpilogue) -> Kernel {
    let name = kernel_name(norm, epilogue);
    cached_kernel(name, "bf16", || {
        crate::op::builtin_kernel(name, source(name, norm, epilogue))
            .with_host(move |args| run_on_host(args, norm, epilogue))
    })
}

/// The streaming variant `(norm, epilogue)` (see the module doc). Its arguments are the grid-
/// stride kernel's but the last (`ksplit`), so the host runs it the same way.
fn ring_kernel(norm: bool, epilogue: GemvEpilogue) -> Kernel {
    let name = match (norm, epilogue) {
        (false, GemvEpilogue::Store) => "decode_gemv_ring",
        (false, GemvEpilogue::Accumulate) => "decode_gemv_add_ring",
        (false, GemvEpilogue::SwiGlu) => "decode_gemv_swiglu_ring",
        (true, GemvEpilogue::Store) => "decode_rms_norm_gemv_ring",
        (true, GemvEpilogue::Accumulate) => "decode_rms_norm_gemv_add_ring",
        (true, GemvEpilogue::SwiGlu) => "decode_rms_norm_gemv_swiglu_ring",
    };
    cached_kernel(name, "bf16", || {
        let source = RING_SOURCE
            .replace("@DEFS@", &bf16_defs())
            .replace("@NAME@", name)
            .replace("@NORM@", &u32::from(norm).to_string())
            .replace("@EPILOGUE@", &epilogue.code().to_string())
            .replace("@SLOTS@", &RING_SLOTS.to_string())
            .replace("@CHUNK@", &RING_CHUNK.to_string())
            .replace("@THREADS@", &RING_THREADS.to_string());
        crate::op::builtin_kernel(name, source)
            .with_host(move |args| run_on_host(args, norm, epilogue))
    })
}

/// A launch of either kernel on the host backend.
fn run_on_host(
    args: &mut cuflow_runtime::HostKernelArgs<'_>,
    norm: bool,
    epilogue: GemvEpilogue,
) -> Result<(), DeviceError> {
    let w = args.input::<bf16>(1)?;
    let x = args.input::<f32>(2)?;
    let nw = args.input::<bf16>(3)?;
    let eps = f64::from(args.scalar::<f32>(4)?);
    let cols = (args.scalar::<u32>(6)? as usize).max(1);
    let out = args.output::<f32>(0)?;
    host_gemv(out, w, x, norm.then_some((nw, eps)), epilogue, cols);
    Ok(())
}

/// The streaming kernels' CUDA C. Block `b` owns outputs `lo .. lo + n` (an even split of the
/// outputs over the grid); their rows (for SwiGLU the gate rows, then the up rows) are
/// `kinds` runs of contiguous bytes, streamed in chunks of `CHUNK` bytes into the ring's
/// slots by thread `LT` (the first of the ninth warp), which waits for a slot's `empty`
/// mbarrier (each of the 256 consumer threads released it after its last read of it) before
/// it reuses it and arms its `full` mbarrier with the chunk's byte count. Consumer warp `j`
/// dots slabs `4j .. 4j + 3` of a landed chunk (512 columns each, two 16-byte vectors a lane;
/// all eight vectors loaded first) with the staged input, one sum for each run of them
/// within a row, stored at the run's first slab; the consumers then add a row's slab sums in
/// order (slots no run starts at hold zero). Only the consumer warps meet at barrier 1 (the
/// producer's warp has returned).
const RING_SOURCE: &str = r#"@DEFS@
#define IN_NORM @NORM@
#define EPILOGUE @EPILOGUE@
#define SLOTS @SLOTS@u
#define CHUNK @CHUNK@u
#define LT 256u
#define SLAB 1024u
#define SPW (CHUNK / SLAB / (LT / 32))  /* slabs a warp dots of each chunk: four contiguous */
#define CSYNC() asm volatile("bar.sync 1, 256;" ::: "memory")
__device__ __forceinline__ float bf_lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ float dot8(uint4 p, float4 a, float4 b, float acc) {
  acc = fmaf(bf_lo(p.x), a.x, acc);
  acc = fmaf(bf_hi(p.x), a.y, acc);
  acc = fmaf(bf_lo(p.y), a.z, acc);
  acc = fmaf(bf_hi(p.y), a.w, acc);
  acc = fmaf(bf_lo(p.z), b.x, acc);
  acc = fmaf(bf_hi(p.z), b.y, acc);
  acc = fmaf(bf_lo(p.w), b.z, acc);
  acc = fmaf(bf_hi(p.w), b.w, acc);
  return acc;
}
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(unsigned long long* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
/* Waits until the phase of parity `parity` of mbarrier `b` has completed. */
__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_addr(b)), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned long long* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}
/* `bytes` (a multiple of 16, from a 16-byte aligned address) into shared memory at `dst`,
   counted against mbarrier `b` as they land. */
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(b)) : "memory");
}
extern "C" __global__ void __launch_bounds__(@THREADS@, 1)
@NAME@(float* out, const T_bf16* w, const float* x, const T_bf16* nw, float eps,
       unsigned rows, unsigned cols) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long full[SLOTS], empty[SLOTS];
  __shared__ float squares[LT / 32];
#if EPILOGUE == 2
  const unsigned outputs = rows >> 1, kinds = 2;
#else
  const unsigned outputs = rows, kinds = 1;
#endif
  const unsigned lo = (unsigned)((unsigned long long)blockIdx.x * outputs / gridDim.x);
  const unsigned n = (unsigned)((unsigned long long)(blockIdx.x + 1) * outputs / gridDim.x) - lo;
  const unsigned nv = cols >> 3, wpr = cols / 512u;
  const unsigned long long row_bytes = (unsigned long long)cols * 2ull;
  const unsigned long long run = (unsigned long long)n * row_bytes;
  const unsigned run_chunks = (unsigned)((run + CHUNK - 1) / CHUNK);
  const unsigned chunks = kinds * run_chunks;
  unsigned char* ring = smem;
  float4* xs = (float4*)(smem + SLOTS * CHUNK);  /* x: xs[i] = 8i .. 8i + 3, xs[nv + i] = 8i + 4 .. 8i + 7 */
  float* partial = (float*)(xs + 2 * nv);        /* [kinds][n][wpr] */
  if (threadIdx.x == 0) {
    for (unsigned i = 0; i < SLOTS; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], LT);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= LT) {
    if (threadIdx.x == LT) {
      for (unsigned c = 0; c < chunks; ++c) {
        const unsigned slot = c % SLOTS, use = c / SLOTS;
        if (use > 0) mbar_wait(&empty[slot], (use - 1) & 1);
        const unsigned kind = c / run_chunks;
        const unsigned long long off = (unsigned long long)(c % run_chunks) * CHUNK;
        const unsigned bytes = run - off < CHUNK ? (unsigned)(run - off) : CHUNK;
        const unsigned long long first_row = (unsigned long long)kind * outputs + lo;
        mbar_expect(&full[slot], bytes);
        bulk_copy(ring + slot * CHUNK, (const unsigned char*)w + first_row * row_bytes + off, bytes, &full[slot]);
      }
    }
    return;
  }
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float4* x4 = (const float4*)x;
  float scale = 1.0f;
  {
#if IN_NORM
    const uint4* nw4 = (const uint4*)nw;
    float ss = 0.0f;
#endif
    for (unsigned i = threadIdx.x; i < nv; i += LT) {
      float4 a = __ldg(x4 + 2 * i), b = __ldg(x4 + 2 * i + 1);
#if IN_NORM
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
      ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
      const uint4 g = __ldg(nw4 + i);
      a.x *= bf_lo(g.x); a.y *= bf_hi(g.x); a.z *= bf_lo(g.y); a.w *= bf_hi(g.y);
      b.x *= bf_lo(g.z); b.y *= bf_hi(g.z); b.z *= bf_lo(g.w); b.w *= bf_hi(g.w);
#endif
      xs[i] = a;
      xs[nv + i] = b;
    }
    /* Slots no run of slabs starts at stay zero. */
    for (unsigned i = threadIdx.x; i < kinds * n * wpr; i += LT) partial[i] = 0.0f;
#if IN_NORM
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) squares[warp] = ss;
#endif
    CSYNC();
#if IN_NORM
    float s = 0.0f;
    for (unsigned i = 0; i < LT / 32; ++i) s += squares[i];
    scale = 1.0f / sqrtf(s / (float)cols + eps);
#endif
  }
  for (unsigned c = 0; c < chunks; ++c) {
    const unsigned slot = c % SLOTS;
    mbar_wait(&full[slot], (c / SLOTS) & 1);
    const unsigned kind = c / run_chunks;
    const unsigned long long off = (unsigned long long)(c % run_chunks) * CHUNK;
    const unsigned slabs = (unsigned)((run - off < CHUNK ? run - off : CHUNK) / SLAB);
    const unsigned j0 = warp * SPW;
    if (j0 < slabs) {
      const uint4* v = (const uint4*)(ring + slot * CHUNK) + j0 * 64;
      const unsigned live = slabs - j0 < SPW ? slabs - j0 : SPW;
      uint4 p[2 * SPW];
#pragma unroll
      for (unsigned i = 0; i < SPW; ++i) {
        if (i < live) {
          p[2 * i] = v[i * 64 + lane];
          p[2 * i + 1] = v[i * 64 + 32 + lane];
        }
      }
      const unsigned t = (unsigned)(off / SLAB) + j0;
      unsigned r = t / wpr, part = t % wpr, start = part;
      float acc = 0.0f;
#pragma unroll
      for (unsigned i = 0; i < SPW; ++i) {
        if (i < live) {
          const unsigned c0 = part * 64 + lane, c1 = c0 + 32;
          acc = dot8(p[2 * i], xs[c0], xs[nv + c0], acc);
          acc = dot8(p[2 * i + 1], xs[c1], xs[nv + c1], acc);
          /* A row's run of this warp's slabs ends: its sum goes to the slot of the run's first slab. */
          if (++part == wpr || i + 1 == live) {
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) partial[(kind * n + r) * wpr + start] = acc;
            acc = 0.0f;
            if (part == wpr) {
              part = 0;
              ++r;
            }
            start = part;
          }
        }
      }
    }
    /* Every consumer thread releases the slot itself: an arrive releases the reads of the
       thread that makes it, and the next bulk copy into the slot must follow all of them. */
    mbar_arrive(&empty[slot]);
  }
  CSYNC();
  for (unsigned o = threadIdx.x; o < n; o += LT) {
    float y = 0.0f;
    for (unsigned t = 0; t < wpr; ++t) y += partial[o * wpr + t];
    y *= scale;
#if EPILOGUE == 2
    float u = 0.0f;
    for (unsigned t = 0; t < wpr; ++t) u += partial[(n + o) * wpr + t];
    u *= scale;
    out[lo + o] = y / (1.0f + expf(-y)) * u;
#elif EPILOGUE == 1
    out[lo + o] += y;
#else
    out[lo + o] = y;
#endif
  }
}
"#;

/// The host implementation: the input (normalized in `f64` when `norm` is given), products
/// accumulated in `f64`, the epilogue in `f64`, one rounding to `f32` per output.
fn host_gemv(
    out: &mut [f32],
    w: &[bf16],
    x: &[f32],
    norm: Option<(&[bf16], f64)>,
    epilogue: GemvEpilogue,
    cols: usize,
) {
    let x = &x[..cols.min(x.len())];
    let input: Vec<f64> = match norm {
        Some((nw, eps)) => {
            let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let r = 1.0 / (ss / cols as f64 + eps).sqrt();
            x.iter()
                .zip(nw)
                .map(|(&v, g)| f64::from(v) * r * f64::from(g.to_f32()))
                .collect()
        }
        None => x.iter().map(|&v| f64::from(v)).collect(),
    };
    let dot = |row: &[bf16]| -> f64 {
        row.iter()
            .zip(&input)
            .map(|(w, v)| f64::from(w.to_f32()) * v)
            .sum()
    };
    let products = w.chunks(cols).map(dot);
    match epilogue {
        GemvEpilogue::Store => {
            for (o, y) in out.iter_mut().zip(products) {
                *o = y as f32;
            }
        }
        GemvEpilogue::Accumulate => {
            for (o, y) in out.iter_mut().zip(products) {
                *o = (f64::from(*o) + y) as f32;
            }
        }
        GemvEpilogue::SwiGlu => {
            let y: Vec<f64> = products.collect();
            let (gate, up) = y.split_at(y.len() / 2);
            for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
                *o = (g / (1.0 + (-g).exp()) * u) as f32;
            }
        }
    }
}

/// The grid-stride kernel's units of work for `n` weight rows: four rows, for SwiGLU two gate
/// rows and their two up rows.
fn units(n: usize, epilogue: GemvEpilogue) -> usize {
    if epilogue == GemvEpilogue::SwiGlu {
        (n / 2).div_ceil(ROWS_PER_WARP / 2)
    } else {
        n.div_ceil(ROWS_PER_WARP)
    }
}

/// Warps that share one unit of rows: doubled while the grid has fewer than sixteen warps
/// per multiprocessor and each lane keeps at least two 16-byte loads per row.
fn ksplit(units: usize, vectors: usize, sms: usize) -> usize {
    let warps = (THREADS / 32) as usize;
    let mut k = 1;
    while k < warps && units * k < 16 * sms && vectors / (32 * 2 * k) >= 2 {
        k *= 2;
    }
    k
}

/// Checks the shapes and launches the variant `(input, epilogue)` on row `x_row` of `x`.
fn launch(
    op: &'static str,
    stream: &Stream,
    out: &mut Tensor<f32>,
    w: &Tensor<bf16>,
    (x, x_row): (&Tensor<f32>, usize),
    input: GemvInput<'_>,
    epilogue: GemvEpilogue,
) -> Result<(), DeviceError> {
    for t in [&*out, x] {
        check_device(op, stream, t)?;
    }
    check_device(op, stream, w)?;
    let [n, k] = *w.shape() else {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!("`w` must be [n, k], got {:?}", w.shape()),
        });
    };
    if k % 8 != 0 {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "`w` is {:?}: its columns must be a multiple of 8 (16-byte loads)",
                w.shape()
            ),
        });
    }
    if epilogue == GemvEpilogue::SwiGlu {
        if n % 2 != 0 {
            return Err(DeviceError::InvalidShape {
                op,
                reason: format!(
                    "`w` is {:?}: a fused gate/up weight needs an even number of rows",
                    w.shape()
                ),
            });
        }
        check_len(op, "out", out, n / 2)?;
    } else {
        check_len(op, "out", out, n)?;
    }
    // The end of row `x_row`, checked: a row index past the address space has no row.
    let Some(row_end) = x_row
        .checked_add(1)
        .and_then(|r| r.checked_mul(k))
        .filter(|&end| end <= x.len())
    else {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "`x` {:?} has no row {x_row} of {k} elements, the columns of `w`",
                x.shape()
            ),
        });
    };
    let (norm_weight, eps) = match input {
        GemvInput::Plain => (w, 0.0),
        GemvInput::RmsNorm { weight, eps } => {
            check_device(op, stream, weight)?;
            check_len(op, "weight", weight, k)?;
            (weight, eps)
        }
    };
    if n == 0 {
        return Ok(());
    }
    if k == 0 {
        // Every product is an empty sum: zeros stored (SwiGLU's `silu(0) · 0` too), nothing
        // added.
        if epilogue != GemvEpilogue::Accumulate {
            out.view("decode::gemv")?.fill_bytes(stream, 0)?;
        }
        return Ok(());
    }
    let norm = matches!(input, GemvInput::RmsNorm { .. });
    let sms = crate::kernels::multiprocessors(stream);
    let device = stream.device();
    let max_shared = device.limits().max_shared_mem_per_block_optin as usize;
    // Both kernels take these; the grid-stride one takes `ksplit` after them.
    let mut args = KernelArgs::new();
    args.output(out.view("decode::gemv")?)
        .input(w.view("decode::gemv")?)
        .input(x.view("decode::gemv")?.slice(row_end - k..row_end)?)
        .input(norm_weight.view("decode::gemv")?)
        .scalar(eps)
        .scalar(u32_of(op, "rows", n)?)
        .scalar(u32_of(op, "cols", k)?);
    let plan = ring_plan(
        device.compute_capability(),
        sms,
        max_shared,
        (n, k),
        epilogue,
    );
    if let Some(plan) = plan {
        return ring_kernel(norm, epilogue).launch(
            stream,
            LaunchConfig::linear(u32_of(op, "blocks", plan.grid)?, RING_THREADS)
                .with_shared_mem(u32_of(op, "shared memory", plan.shared)?),
            &args,
        );
    }
    let units = units(n, epilogue);
    let split = ksplit(units, k / 8, sms);
    let blocks = units.div_ceil((THREADS / 32) as usize / split);
    // Blocks loop over units: as few rounds as the resident blocks allow, evenly spread.
    let rounds = blocks.div_ceil(sms * BLOCKS_PER_SM);
    let grid = blocks.div_ceil(rounds);
    // The normalized input, staged in shared memory when it fits.
    let staged = if norm && k <= STAGE_MAX_COLS {
        4 * k
    } else {
        0
    };
    kernel(norm, epilogue).launch(
        stream,
        LaunchConfig::linear(u32_of(op, "blocks", grid)?, THREADS).with_shared_mem(u32_of(
            op,
            "shared memory",
            staged,
        )?),
        args.scalar(u32_of(op, "ksplit", split)?),
    )
}

/// `out = w · x[row]`: the product of a `bf16` weight `[n, k]` (`k` a multiple of 8) with
/// row `x_row` of `x` (`f32`, `k` elements per row), into `out` (`f32`, `n` elements).
/// Accumulates in `f32` (in `f64` on the host backend).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `gemv` when `w` is not 2-D with `k` a multiple of 8,
/// `out` does not hold `n` elements, or `x` has no row `x_row` of `k` elements.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, bf16, kernels::decode};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let w = api::from_vec(vec![bf16::from_f32(0.5); 2 * 8], &[2, 8]).sync_on(&stream)?;
/// let x = api::arange::<f32>(0.0, 8.0, 1.0).sync_on(&stream)?;
/// let mut out = api::zeros::<f32>(&[2]).sync_on(&stream)?;
/// decode::gemv(&mut out, &w, &x, 0).sync_on(&stream)?;
/// assert_eq!(out.to_host_vec()?, vec![14.0, 14.0]);
/// # Ok(()) }
/// ```
pub fn gemv<'a>(
    out: &'a mut Tensor<f32>,
    w: &'a Tensor<bf16>,
    x: &'a Tensor<f32>,
    x_row: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        launch(
            "gemv",
            stream,
            out,
            w,
            (x, x_row),
            GemvInput::Plain,
            GemvEpilogue::Store,
        )
    })
}

/// `W · x` with the vector work around it fused in: `x` (`f32`, `k` elements) read as it is
/// or through an RMS norm ([`GemvInput`]), the products `y = W · x` of the `bf16` weight `w`
/// `[n, k]` (`k` a multiple of 8) stored into `out`, added to it, or combined by SwiGLU
/// ([`GemvEpilogue`]). Accumulates in `f32` (in `f64` on the host backend).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `gemv_fused` when `w` is not 2-D with `k` a multiple
/// of 8, `x` does not hold `k` elements, the norm weight does not hold `k` elements, `out`
/// does not hold `n` elements (`n / 2` for SwiGLU), or SwiGLU is asked of an odd `n`.
///
/// # Examples
///
/// The residual stream after a projection, `x += W · a`, and the next norm fused into the
/// projection that reads it:
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, bf16, kernels::decode};
/// use decode::{GemvEpilogue, GemvInput};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let w = api::from_vec(vec![bf16::from_f32(0.5); 8 * 8], &[8, 8]).sync_on(&stream)?;
/// let a = api::full::<f32>(&[8], 1.0).sync_on(&stream)?;
/// let mut x = api::full::<f32>(&[8], 1.0).sync_on(&stream)?;
/// decode::gemv_fused(&mut x, &w, &a, GemvInput::Plain, GemvEpilogue::Accumulate)
///     .sync_on(&stream)?;
/// assert_eq!(x.to_host_vec()?, vec![5.0; 8]);
/// let norm = api::full(&[8], bf16::from_f32(2.0)).sync_on(&stream)?;
/// let mut y = api::zeros::<f32>(&[8]).sync_on(&stream)?;
/// let input = GemvInput::RmsNorm { weight: &norm, eps: 0.0 };
/// decode::gemv_fused(&mut y, &w, &x, input, GemvEpilogue::Store).sync_on(&stream)?;
/// assert_eq!(y.to_host_vec()?, vec![8.0; 8]); // rows of 0.5 · (1 · 2) over 8 columns
/// # Ok(()) }
/// ```
pub fn gemv_fused<'a>(
    out: &'a mut Tensor<f32>,
    w: &'a Tensor<bf16>,
    x: &'a Tensor<f32>,
    input: GemvInput<'a>,
    epilogue: GemvEpilogue,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        if let [_, k] = *w.shape() {
            check_len("gemv_fused", "x", x, k)?;
        }
        launch("gemv_fused", stream, out, w, (x, 0), input, epilogue)
    })
}

#[cfg(test)]
mod tests {
    use super::{ring_plan, GemvEpilogue, RingPlan, RING_CHUNK, RING_MIN_BYTES, RING_SLOTS};

    const H200: Option<(u32, u32)> = Some((9, 0));
    const OPTIN: usize = 227 * 1024;

    /// The products of a 1B-shaped Llama that stream on a device of 132 multiprocessors
    /// (QKV and down: too few rows for a warp each), and those that do not: the 8 MB output
    /// projection, and the gate/up product and the LM head, whose rows fill the grid.
    #[test]
    fn large_products_stream_on_compute_capability_9() {
        let plan = |n, k, e| ring_plan(H200, 132, OPTIN, (n, k), e);
        let qkv = plan(3072, 2048, GemvEpilogue::Store).expect("QKV streams");
        assert_eq!(qkv.grid, 132);
        // 24 outputs a block at most, four slabs a row.
        assert_eq!(qkv.shared, RING_SLOTS * RING_CHUNK + 4 * 2048 + 4 * 24 * 4);
        let down = plan(2048, 8192, GemvEpilogue::Accumulate).expect("down streams");
        assert_eq!(
            down.shared,
            RING_SLOTS * RING_CHUNK + 4 * 8192 + 4 * 16 * 16
        );
        assert_eq!(plan(2048, 2048, GemvEpilogue::Accumulate), None, "o_proj");
        assert_eq!(plan(16384, 2048, GemvEpilogue::SwiGlu), None, "gate/up");
        assert_eq!(plan(128_256, 2048, GemvEpilogue::Store), None, "LM head");
        // A SwiGLU product of as few rows streams: gate and up partial sums a block.
        let swiglu = plan(6144, 2048, GemvEpilogue::SwiGlu).expect("a smaller SwiGLU streams");
        assert_eq!(
            swiglu.shared,
            RING_SLOTS * RING_CHUNK + 4 * 2048 + 4 * 2 * 24 * 4
        );
    }

    #[test]
    fn other_devices_and_shapes_keep_the_grid_stride_kernel() {
        let big = (4096, 4096);
        assert!(ring_plan(H200, 132, OPTIN, big, GemvEpilogue::Store).is_some());
        // The host, and devices without bulk copies.
        for cc in [None, Some((8, 9)), Some((8, 0))] {
            assert_eq!(
                ring_plan(cc, 132, OPTIN, big, GemvEpilogue::Store),
                None,
                "{cc:?}"
            );
        }
        // Rows that are not whole slabs of 512 columns.
        assert_eq!(
            ring_plan(H200, 132, OPTIN, (6000, 2056), GemvEpilogue::Store),
            None
        );
        // Just under and at the threshold.
        let rows = RING_MIN_BYTES / (2 * 1024);
        assert_eq!(
            ring_plan(H200, 132, OPTIN, (rows - 1, 1024), GemvEpilogue::Store),
            None
        );
        assert!(ring_plan(H200, 132, OPTIN, (rows + 1, 1024), GemvEpilogue::Store).is_some());
        // An input too long for shared memory beside the ring.
        assert_eq!(
            ring_plan(H200, 132, OPTIN, (2048, 32768), GemvEpilogue::Store),
            None
        );
        // Sizes whose byte count overflows.
        assert_eq!(
            ring_plan(H200, 132, OPTIN, (usize::MAX, 1024), GemvEpilogue::Store),
            None
        );
    }

    /// A grid never has more blocks than outputs, so no block owns none.
    #[test]
    fn the_grid_is_at_most_one_block_per_output() {
        assert_eq!(
            ring_plan(H200, 1000, OPTIN, (100, 65536), GemvEpilogue::Store),
            None,
            "64 KiB of input per row does not fit beside the ring"
        );
        let RingPlan { grid, .. } =
            ring_plan(H200, 1000, OPTIN, (400, 16384), GemvEpilogue::Store).unwrap();
        assert_eq!(grid, 400);
        let RingPlan { grid, .. } =
            ring_plan(H200, 1000, OPTIN, (800, 16384), GemvEpilogue::SwiGlu).unwrap();
        assert_eq!(grid, 400);
    }
}

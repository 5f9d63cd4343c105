//! The CUDA C of the strided elementwise kernel ([`super::strided`]), generated from one
//! description ([`StridedEw`]) in two walks over the output that share the argument list, the
//! loads and the store:
//!
//! - the linear walk: a grid-stride loop over chunks of `EPT` × `blockDim` output elements,
//!   element `base + j * blockDim + tid` for `j < EPT`. Each thread turns its `EPT` indices
//!   into offsets (one division per merged axis, by magic numbers below 2^31) and issues all
//!   their loads before any store, so that `EPT` loads per input are in flight at once;
//! - the tiled walk, for an operand read transposed (unit stride along an earlier output axis
//!   `tp`, not along the last): 32 × 32 tiles over axes `tp` and the last, one tile of
//!   32 × 8 threads at a time, batched over the other axes. The operands marked in `staged`
//!   are read coalesced along `tp` into shared memory and read back transposed; the others
//!   are read where they lie. Reads and the write are then all coalesced.
//!
//! Both take the same leading arguments (the tiled one adds `tp` and `staged` after them),
//! so one host implementation serves both.

use std::sync::Arc;

use cuflow_runtime::{DeviceError, HostKernelArgs, Kernel};

use super::strided::HostLayout;
use crate::dtype::{cuda_prelude, DType};
use crate::op::cached_kernel2;
use crate::view::MAX_DIMS;

/// Output elements one thread of the linear walk handles per iteration.
pub(crate) const EPT: usize = 4;
/// The side of a tile of the tiled walk (the columns of threads of its block).
pub(crate) const TILE: usize = 32;
/// The rows of threads of a tiled block: each thread moves `TILE / TILE_ROWS` elements.
pub(crate) const TILE_ROWS: usize = 8;
// A tiled thread moves `EPT` elements of its column (the same registers as the linear walk).
const _: () = assert!(EPT * TILE_ROWS == TILE);

/// The element type of one operand as the kernel source names it.
#[derive(Clone, Copy)]
pub(crate) enum Elem {
    /// The kernel's dtype `T`, loaded to the compute type `A` with `ld`.
    T,
    /// A `u8` mask (`unsigned char`), read as it is.
    Mask,
}

impl Elem {
    /// The type in memory.
    fn ctype(self) -> &'static str {
        match self {
            Elem::T => "T",
            Elem::Mask => "unsigned char",
        }
    }

    /// The type the expression sees.
    fn value_type(self) -> &'static str {
        match self {
            Elem::T => "A",
            Elem::Mask => "unsigned char",
        }
    }

    /// `place` (an lvalue of [`Elem::ctype`]) as [`Elem::value_type`].
    fn load(self, place: &str) -> String {
        match self {
            Elem::T => format!("ld({place})"),
            Elem::Mask => place.to_string(),
        }
    }
}

/// One strided elementwise operation.
pub(crate) struct StridedEw {
    /// The kernel's base name; the dtype is appended.
    pub(crate) name: &'static str,
    /// The CUDA C expression in `a`, `b`, `c` (the inputs) and `s`, `t` (the scalars, as `A`).
    pub(crate) expr: &'static str,
    /// The inputs' element types (1 to 3).
    pub(crate) inputs: &'static [Elem],
    /// The output's element type.
    pub(crate) out: Elem,
}

/// The two walks of one operation and dtype (see the module documentation).
pub(crate) struct StridedKernel {
    pub(crate) linear: Kernel,
    pub(crate) tiled: Kernel,
}

/// The names of the inputs in the expression.
const NAMES: [&str; 3] = ["a", "b", "c"];

impl StridedEw {
    /// The source text both walks start with: the prelude, the expression, and the kernel's
    /// signature up to its body (`extra` are parameters after the common ones).
    fn head<T: DType>(&self, fname: &str, extra: &str) -> String {
        let mut params = String::new();
        let mut strides = String::new();
        for (k, e) in self.inputs.iter().enumerate() {
            params += &format!(", const {}* __restrict__ x{k}", e.ctype());
            let list: Vec<String> = (0..MAX_DIMS).map(|d| format!("u64 s{k}_{d}")).collect();
            strides += &format!(", {}", list.join(", "));
        }
        let dims: Vec<String> = (0..MAX_DIMS)
            .map(|d| format!("u64 d{d}"))
            .chain((0..MAX_DIMS).map(|d| format!("u64 m{d}")))
            .collect();
        format!(
            r#"{prelude}
typedef unsigned long long u64;
#define EXPR_ ({expr})
extern "C" __global__ void {fname}({out_t}* __restrict__ out{params}, T s_, T t_, u64 n, int rank,
                                   {dims}{strides}{extra}) {{
  A s = ld(s_), t = ld(t_);
  (void)s; (void)t;
  // The merged axes are dims[lo..{MAX_DIMS}] (the innermost last), after lengths of 1.
  const int lo = {MAX_DIMS} - rank;
{setup}"#,
            prelude = cuda_prelude::<T>(),
            expr = self.expr,
            out_t = self.out.ctype(),
            dims = dims.join(", "),
            setup = self.setup(),
        )
    }

    /// The arrays of the merged lengths, their magic numbers and each input's strides.
    fn setup(&self) -> String {
        let list = |p: &str| {
            (0..MAX_DIMS)
                .map(|d| format!("{p}{d}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut s = format!(
            "  const u64 dims[{MAX_DIMS}] = {{{}}};\n  const u64 mg[{MAX_DIMS}] = {{{}}};\n",
            list("d"),
            list("m")
        );
        for k in 0..self.inputs.len() {
            s += &format!(
                "  const u64 st{k}[{MAX_DIMS}] = {{{}}};\n",
                list(&format!("s{k}_"))
            );
        }
        s
    }

    /// Declares the registers `v{k}[EPT]` the loads of one iteration go to.
    fn registers(&self) -> String {
        self.inputs
            .iter()
            .enumerate()
            .map(|(k, e)| format!("{} v{k}[{EPT}]; ", e.value_type()))
            .collect()
    }

    /// Writes the output element at `at` from the registers of element `j`.
    fn store(&self, at: &str) -> String {
        let names: String = self
            .inputs
            .iter()
            .enumerate()
            .map(|(k, e)| format!("{} {} = v{k}[j]; ", e.value_type(), NAMES[k]))
            .collect();
        let value = match self.out {
            Elem::T => "st((A)(EXPR_))",
            Elem::Mask => "(unsigned char)((EXPR_) ? 1 : 0)",
        };
        format!("{{ {names}out[{at}] = {value}; }}")
    }

    /// One linear walk, with indices of type `it` divided by `divmod` (which leaves the
    /// coordinate in `c` and the quotient in `r`).
    fn linear_walk(&self, it: &str, divmod: &str) -> String {
        let offs: String = (0..self.inputs.len())
            .map(|k| format!("u64 o{k} = 0; "))
            .collect();
        let step: String = (0..self.inputs.len())
            .map(|k| format!("o{k} += c * st{k}[d]; "))
            .collect();
        let loads: String = self
            .inputs
            .iter()
            .enumerate()
            .map(|(k, e)| format!("v{k}[j] = {}; ", e.load(&format!("x{k}[o{k}]"))))
            .collect();
        format!(
            r#"    const u64 chunk = (u64)blockDim.x * {EPT};
    for (u64 base = (u64)blockIdx.x * chunk; base < n; base += (u64)gridDim.x * chunk) {{
      {registers}
#pragma unroll
      for (int j = 0; j < {EPT}; ++j) {{
        const u64 i = base + (u64)j * blockDim.x + threadIdx.x;
        if (i < n) {{
          {it} r = ({it})i; {offs}
#pragma unroll
          for (int d = {last}; d >= 0; --d) {{
            if (d < lo) break;
            {divmod} {step}
          }}
          {loads}
        }}
      }}
#pragma unroll
      for (int j = 0; j < {EPT}; ++j) {{
        const u64 i = base + (u64)j * blockDim.x + threadIdx.x;
        if (i < n) {store}
      }}
    }}
"#,
            registers = self.registers(),
            last = MAX_DIMS - 1,
            store = self.store("i"),
        )
    }

    /// The source of the linear walk.
    fn linear_source<T: DType>(&self, fname: &str) -> String {
        let narrow =
            "const unsigned q = (__umulhi(r, (unsigned)mg[d]) + r) >> (unsigned)(mg[d] >> 32); \
                      const u64 c = (u64)(r - q * (unsigned)dims[d]); r = q;";
        let wide = "const u64 c = r % dims[d]; r /= dims[d];";
        format!(
            "{head}  // Below 2^31 elements, r / dims[d] is a multiply-high and a shift by the magic\n  \
             // numbers mg[d] (the multiplier in the low 32 bits, the shift above them).\n  \
             if (n <= 0x7fffffffull) {{\n{narrow_walk}  }} else {{\n{wide_walk}  }}\n}}\n",
            head = self.head::<T>(fname, ""),
            narrow_walk = self.linear_walk("unsigned", narrow),
            wide_walk = self.linear_walk("u64", wide),
        )
    }

    /// The source of the tiled walk.
    fn tiled_source<T: DType>(&self, fname: &str) -> String {
        let ks = 0..self.inputs.len();
        let tiles: String = self
            .inputs
            .iter()
            .enumerate()
            .map(|(k, e)| format!("  __shared__ {} tile{k}[{TILE}][{TILE} + 1];\n", e.ctype()))
            .collect();
        let along = |what: &str| -> String {
            ks.clone()
                .map(|k| format!(", {what}{k} = 0"))
                .collect::<String>()
        };
        let pick: String = ks.clone().map(|k| format!("sp{k} = st{k}[d]; ")).collect();
        let last: String = ks
            .clone()
            .map(|k| format!(", sl{k} = st{k}[{top}]", top = MAX_DIMS - 1))
            .collect();
        let batch_step: String = ks
            .clone()
            .map(|k| format!("b{k} += c * st{k}[d]; "))
            .collect();
        let stage: String = self
            .inputs
            .iter()
            .enumerate()
            .map(|(k, _)| {
                format!(
                    r#"      if (staged & {bit}) {{
#pragma unroll
        for (int j = 0; j < {EPT}; ++j) {{
          const u64 l = l0 + ty + j * {TILE_ROWS}, p = p0 + tx;
          if (p < dp && l < dl) tile{k}[ty + j * {TILE_ROWS}][tx] = x{k}[b{k} + p * sp{k} + l * sl{k}];
        }}
      }}
"#,
                    bit = 1 << k
                )
            })
            .collect();
        let loads: String = self
            .inputs
            .iter()
            .enumerate()
            .map(|(k, e)| {
                format!(
                    "v{k}[j] = (staged & {bit}) ? {tile} : {direct}; ",
                    bit = 1 << k,
                    tile = e.load(&format!("tile{k}[tx][ty + j * {TILE_ROWS}]")),
                    direct = e.load(&format!("x{k}[b{k} + p * sp{k} + l * sl{k}]")),
                )
            })
            .collect();
        format!(
            r#"{head}{tiles}  const bool narrow = n <= 0x7fffffffull;
  // The output's (dense) strides over the merged axes.
  u64 ost[{MAX_DIMS}];
  u64 acc = 1;
#pragma unroll
  for (int d = {top}; d >= 0; --d) {{
    ost[d] = acc;
    acc *= dims[d];
  }}
  // The tile's axes: tp, and the last (the innermost, unit stride in the output).
  const u64 dl = dims[{top}]{last};
  u64 dp = 1, op = 0{sp};
#pragma unroll
  for (int d = 0; d < {top}; ++d) {{
    if (d == tp) {{ dp = dims[d]; op = ost[d]; {pick}}}
  }}
  const u64 batch = n / (dp * dl);
  const u64 l0 = (u64)blockIdx.x * {TILE};
  const unsigned tx = threadIdx.x, ty = threadIdx.y;
  for (u64 bt = blockIdx.z; bt < batch; bt += gridDim.z) {{
    // The offsets of batch index bt over the axes other than tp and the last.
    u64 r = bt, ob = 0{b};
#pragma unroll
    for (int d = {top} - 1; d >= 0; --d) {{
      // A predicate, not a `break`: the loop unrolls with constant indices, so the axis
      // arrays stay in registers (with `break` they went to a 256-byte stack frame).
      if (d >= lo && d != tp) {{
        u64 c;
        if (narrow) {{
          const unsigned r32 = (unsigned)r;
          const unsigned q = (__umulhi(r32, (unsigned)mg[d]) + r32) >> (unsigned)(mg[d] >> 32);
          c = (u64)(r32 - q * (unsigned)dims[d]);
          r = q;
        }} else {{
          c = r % dims[d];
          r /= dims[d];
        }}
        ob += c * ost[d]; {batch_step}
      }}
    }}
    for (u64 p0 = (u64)blockIdx.y * {TILE}; p0 < dp; p0 += (u64)gridDim.y * {TILE}) {{
{stage}      __syncthreads();
      {registers}
      const u64 l = l0 + tx;
#pragma unroll
      for (int j = 0; j < {EPT}; ++j) {{
        const u64 p = p0 + ty + j * {TILE_ROWS};
        if (p < dp && l < dl) {{ {loads}}}
      }}
#pragma unroll
      for (int j = 0; j < {EPT}; ++j) {{
        const u64 p = p0 + ty + j * {TILE_ROWS};
        if (p < dp && l < dl) {store}
      }}
      __syncthreads();
    }}
  }}
}}
"#,
            head = self.head::<T>(fname, ", int tp, int staged"),
            top = MAX_DIMS - 1,
            sp = along("sp"),
            b = along("b"),
            registers = self.registers(),
            store = self.store("ob + p * op + l"),
        )
    }

    /// The two walks for dtype `T`, with `host` as their host implementation over the
    /// inputs' element offsets (one per input, in `HostView` order).
    pub(crate) fn kernel<T: DType>(
        &self,
        host: impl Fn(&mut HostKernelArgs<'_>, &HostLayout) -> Result<(), DeviceError>
            + Send
            + Sync
            + 'static,
    ) -> StridedKernel {
        type Host =
            dyn Fn(&mut HostKernelArgs<'_>, &HostLayout) -> Result<(), DeviceError> + Send + Sync;
        let inputs = self.inputs.len();
        let host: Arc<Host> = Arc::new(host);
        let with_host = |kernel: Kernel, host: Arc<Host>| {
            kernel.with_host(move |args| {
                let layout = HostLayout::read(args, inputs)?;
                host(args, &layout)
            })
        };
        let linear = cached_kernel2(self.name, T::NAME, "strided", || {
            let fname = format!("{}_strided_{}", self.name, T::NAME);
            let source = self.linear_source::<T>(&fname);
            with_host(crate::op::builtin_kernel(fname, source), host.clone())
        });
        let tiled = cached_kernel2(self.name, T::NAME, "strided_tiled", || {
            let fname = format!("{}_tiled_{}", self.name, T::NAME);
            let source = self.tiled_source::<T>(&fname);
            with_host(crate::op::builtin_kernel(fname, source), host)
        });
        StridedKernel { linear, tiled }
    }
}

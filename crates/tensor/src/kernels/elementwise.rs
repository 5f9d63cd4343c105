//! Elementwise kernels: one generated CUDA C kernel per (operation, dtype), with a host
//! implementation computing the same function.
//!
//! Every elementwise kernel has the shape `out[i] = OP(out[i], x[i], y[j], s)` where `y` is
//! either a tensor of the same shape (`j = i`) or a row vector broadcast over rows
//! (`j = i % cols`), and `s` a scalar. Without a partition the launch is a grid-stride loop
//! with 16-byte vector accesses; with one, each tile is one block.
//!
//! These are the fast paths of dense operands. Binary operations over views or under other
//! broadcasts run the same expression in the strided kernel ([`super::strided`]).

use std::sync::Arc;

use cuflow_device_op::{from_fn, DeviceOp, ExecutionContext};
use cuflow_runtime::{
    BufferView, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig, Stream,
};

use super::strided::{self, Elem};
use crate::dtype::{cuda_prelude, DType};
use crate::op::{cached_kernel, kernel_op, strided_op2, TensorOp};
use crate::tensor::{tiling, Partition, Tensor, TensorInput, TensorMut, TensorRef, Tiling};

/// The host function of an elementwise kernel: `(out, x, y, s) -> out`.
pub(crate) type HostFn<T> = fn(T, T, T, T) -> T;

/// One elementwise operation.
pub(crate) struct Ew<T> {
    /// The kernel's base name; the dtype is appended.
    pub(crate) name: &'static str,
    /// A CUDA C expression in `o`, `a`, `b`, `s` (all of type `A`).
    pub(crate) expr: &'static str,
    /// Number of tensor inputs: 0 (fill), 1 (`x`) or 2 (`x`, `y`).
    pub(crate) inputs: u8,
    /// Whether `o`, the old output, is read.
    pub(crate) reads_out: bool,
    /// Extra CUDA C device functions the expression uses.
    pub(crate) helpers: &'static str,
    /// The host implementation of the expression.
    pub(crate) host: HostFn<T>,
}

impl<T: DType> Ew<T> {
    fn source(&self, fname: &str) -> String {
        let x_param = if self.inputs >= 1 {
            ", const T* __restrict__ x"
        } else {
            ""
        };
        let y_param = if self.inputs >= 2 {
            ", const T* __restrict__ y"
        } else {
            ""
        };
        format!(
            r#"{prelude}
{helpers}
#define HAS_X {has_x}
#define HAS_Y {has_y}
#define READS_OUT {reads_out}
typedef unsigned long long u64;
__device__ __forceinline__ A op_(A o, A a, A b, A s) {{ return ({expr}); }}
extern "C" __global__ void {fname}(T* __restrict__ out{x_param}{y_param}, T s_, u64 R, u64 C,
                                   u64 tr, u64 tc, int ybc) {{
  A s = ld(s_);
  u64 n = R * C;
#define ELEM(i) {{ \
    A o_ = READS_OUT ? ld(out[i]) : (A)0; \
    A a_ = (A)0, b_ = (A)0; \
    IF_X(a_ = ld(x[i]);) \
    IF_Y(b_ = ld(y[ybc ? (i) % C : (i)]);) \
    out[i] = st(op_(o_, a_, b_, s)); }}
  const int V = 16 / sizeof(T);
  union Vec {{ uint4 u; T v[16 / sizeof(T)]; }};
#define VLOAD(w, xo, xa, xb) {{ \
    if (READS_OUT) xo.u = ((const uint4*)out)[w]; \
    IF_X(xa.u = ((const uint4*)x)[w];) \
    IF_Y(xb.u = ((const uint4*)y)[ybc ? (((w) * V) % C) / V : (w)];) }}
#define VSTORE(w, xo, xa, xb) {{ \
    Vec r; \
    _Pragma("unroll") \
    for (int k_ = 0; k_ < V; ++k_) {{ \
      A o_ = READS_OUT ? ld(xo.v[k_]) : (A)0; \
      A a_ = (A)0, b_ = (A)0; \
      IF_X(a_ = ld(xa.v[k_]);) \
      IF_Y(b_ = ld(xb.v[k_]);) \
      r.v[k_] = st(op_(o_, a_, b_, s)); \
    }} \
    ((uint4*)out)[w] = r.u; }}
#define VSTEP(w) {{ Vec o1, a1, b1; VLOAD(w, o1, a1, b1) VSTORE(w, o1, a1, b1) }}
#define VSTEP2(w, w2) {{ \
    Vec o1, a1, b1, o2, a2, b2; \
    VLOAD(w, o1, a1, b1) VLOAD(w2, o2, a2, b2) \
    VSTORE(w, o1, a1, b1) VSTORE(w2, o2, a2, b2) }}
  bool vec_ok = !ybc || C % V == 0;
  if (tr == 0) {{
    u64 stride = (u64)blockDim.x * gridDim.x;
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (n % V == 0 && vec_ok) {{
      u64 nv = n / V;
      u64 w = t;
      for (; w + stride < nv; w += 2 * stride) VSTEP2(w, w + stride)
      if (w < nv) VSTEP(w)
    }} else {{
      for (u64 i = t; i < n; i += stride) ELEM(i)
    }}
    return;
  }}
  u64 tiles_c = C / tc;
  u64 row0 = (blockIdx.x / tiles_c) * tr, col0 = (blockIdx.x % tiles_c) * tc;
  u64 te = tr * tc;
  if (tc == C) {{
    u64 base = row0 * C;
    if (te % V == 0 && base % V == 0 && vec_ok) {{
      u64 wb = base / V, nvt = te / V, k = threadIdx.x;
      for (; k + blockDim.x < nvt; k += 2 * blockDim.x) VSTEP2(wb + k, wb + k + blockDim.x)
      if (k < nvt) VSTEP(wb + k)
    }} else {{
      for (u64 k = threadIdx.x; k < te; k += blockDim.x) {{ u64 i = base + k; ELEM(i) }}
    }}
  }} else {{
    for (u64 k = threadIdx.x; k < te; k += blockDim.x) {{
      u64 i = (row0 + k / tc) * C + col0 + k % tc;
      ELEM(i)
    }}
  }}
}}
"#,
            prelude = cuda_prelude::<T>(),
            helpers = self.helpers,
            has_x = u8::from(self.inputs >= 1),
            has_y = u8::from(self.inputs >= 2),
            reads_out = u8::from(self.reads_out),
            expr = self.expr,
        )
        .replace(
            "#define HAS_X",
            &format!(
                "#define IF_X(s) {}\n#define IF_Y(s) {}\n#define HAS_X",
                if self.inputs >= 1 { "s" } else { "" },
                if self.inputs >= 2 { "s" } else { "" }
            ),
        )
    }

    fn kernel(&self) -> Kernel {
        let host = self.host;
        let inputs = self.inputs;
        let name = self.name;
        cached_kernel(name, T::NAME, || {
            let fname = format!("{name}_{}", T::NAME);
            let source = self.source(&fname);
            crate::op::builtin_kernel(fname, source).with_host(move |args| {
                let s = args.scalar::<T>(1 + inputs as usize)?;
                let cols = args.scalar::<u64>(3 + inputs as usize)? as usize;
                let ybc = args.scalar::<i32>(6 + inputs as usize)? != 0;
                let x = if inputs >= 1 {
                    Some(args.input::<T>(1)?)
                } else {
                    None
                };
                let y = if inputs >= 2 {
                    Some(args.input::<T>(2)?)
                } else {
                    None
                };
                let out = args.output::<T>(0)?;
                let zero = T::default();
                for (i, o) in out.iter_mut().enumerate() {
                    let a = x.map_or(zero, |x| x[i]);
                    let b = y.map_or(zero, |y| y[if ybc { i % cols.max(1) } else { i }]);
                    *o = host(*o, a, b, s);
                }
                Ok(())
            })
        })
    }

    /// Enqueues `out = OP(out, x, y, s)` on `stream`, over `tiling` (a partition) or the
    /// whole tensor.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        &self,
        stream: &Stream,
        out: BufferView<'_, T>,
        x: Option<BufferView<'_, T>>,
        y: Option<(BufferView<'_, T>, bool)>,
        s: T,
        rows_cols: (usize, usize),
        tiling: Option<Tiling>,
    ) -> Result<(), DeviceError> {
        let (rows, cols) = rows_cols;
        let n = out.len();
        if n == 0 {
            return Ok(());
        }
        let (config, tr, tc) = match tiling {
            Some(t) => {
                let te = t.tile_rows * t.tile_cols;
                let block = te.div_ceil(32).clamp(1, 8) as u32 * 32;
                let grid = u32::try_from(t.tiles()).map_err(|_| DeviceError::InvalidPartition {
                    op: self.name,
                    reason: format!("{} tiles are more blocks than a launch can have", t.tiles()),
                })?;
                (LaunchConfig::linear(grid, block), t.tile_rows, t.tile_cols)
            }
            None => {
                let v = (16 / std::mem::size_of::<T>()).max(1);
                let sms = crate::kernels::multiprocessors(stream);
                let grid = n.div_ceil(v * 256).clamp(1, sms * 32) as u32;
                (LaunchConfig::linear(grid, 256), 0, 0)
            }
        };
        let mut args = KernelArgs::new();
        args.output(out);
        if let Some(x) = x {
            args.input(x);
        }
        if let Some((y, _)) = y {
            args.input(y);
        }
        args.scalar(s)
            .scalar(rows as u64)
            .scalar(cols as u64)
            .scalar(tr as u64)
            .scalar(tc as u64)
            .scalar(i32::from(y.is_some_and(|(_, b)| b)));
        self.kernel().launch(stream, config, &args)
    }
}

pub(crate) fn check_device<T: DType>(
    op: &'static str,
    stream: &Stream,
    t: &Tensor<T>,
) -> Result<(), DeviceError> {
    if t.device() != stream.device() {
        return Err(DeviceError::device_mismatch(
            op,
            format!("a tensor {:?}", t.shape()),
            stream.device(),
            t.device(),
        ));
    }
    Ok(())
}

/// A new tensor of `shape` on the context's stream (contents unspecified) for `op`, which an
/// element count or a size in bytes past the address space names.
pub(crate) fn alloc<T: DType>(
    op: &'static str,
    stream: &Stream,
    shape: &[usize],
) -> Result<Tensor<T>, DeviceError> {
    let n = crate::tensor::numel(op, shape)?;
    if n.checked_mul(std::mem::size_of::<T>())
        .is_none_or(|bytes| bytes > isize::MAX as usize)
    {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "{shape:?} holds {n} elements of {}, more bytes than the address space has",
                T::NAME
            ),
        });
    }
    Tensor::from_buffer(Arc::new(DeviceBuffer::alloc(stream, n)?), shape)
}

/// `x OP s` into a new tensor.
pub(crate) fn unary<T: DType, X: TensorInput<T>>(
    ew: Ew<T>,
    x: X,
    s: T,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send> {
    kernel_op(ew.name, x, move |stream, x| {
        let out = alloc::<T>(ew.name, stream, x.shape())?;
        ew.launch(
            stream,
            out.view(ew.name)?,
            Some(x.view(ew.name)?),
            None,
            s,
            x.rows_cols(),
            None,
        )?;
        Ok(out)
    })
}

/// `x OP y` into a new tensor, `x` and `y` broadcast to a common shape under NumPy's rules.
/// Dense operands of one shape, or a dense `x` with a dense row of its last axis, take the
/// vectorized kernel; any other operands the strided one, which reads views and broadcast
/// operands in place.
pub(crate) fn binary<T: DType, X: TensorInput<T>, Y: TensorInput<T>>(
    ew: Ew<T>,
    x: X,
    y: Y,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send> {
    strided_op2(ew.name, (x, y), move |stream, x, y| {
        let shape = crate::view::broadcast_shapes(ew.name, x.shape(), y.shape())?;
        let out = alloc::<T>(ew.name, stream, &shape)?;
        let (_, cols) = out.rows_cols();
        let dense = x.is_kernel_ready() && y.is_kernel_ready() && x.shape() == &shape[..];
        let row = y.shape().last() == Some(&cols) && y.len() == cols && cols > 0;
        if dense && (y.shape() == x.shape() || row) {
            ew.launch(
                stream,
                out.view(ew.name)?,
                Some(x.view(ew.name)?),
                Some((y.view(ew.name)?, y.shape() != x.shape())),
                T::default(),
                x.rows_cols(),
                None,
            )?;
            return Ok(out);
        }
        let host = ew.host;
        let zero = T::default();
        strided::broadcast2(
            stream,
            ew.name,
            ew.expr,
            Elem::T,
            x,
            y,
            &out,
            move |a, b| host(zero, a, b, zero),
        )?;
        Ok(out)
    })
}

/// Writes `OP(out, x, s)` into a partitioned output, in place; yields the partition and `x`.
#[allow(clippy::type_complexity)]
pub(crate) fn into_partition<T: DType, P: TensorMut<T>, X: TensorInput<T>>(
    ew: Ew<T>,
    out: Partition<P>,
    x: X,
    s: T,
) -> TensorOp<
    impl FnOnce(&mut ExecutionContext) -> Result<(Partition<P>, X::Value), DeviceError> + Send,
> {
    let x = x.into_op();
    from_fn(move |ctx: &mut ExecutionContext| {
        let x = x.execute(ctx)?;
        let stream = ctx.stream()?;
        {
            let (o, xt) = (out.get().tensor(), x.tensor());
            check_device(ew.name, stream, o)?;
            check_device(ew.name, stream, xt)?;
            if o.shape() != xt.shape() {
                return Err(DeviceError::shape_mismatch(
                    ew.name,
                    "the output and `x` must have the same shape",
                    o.shape(),
                    xt.shape(),
                ));
            }
            o.out_view(ew.name)?;
            let t = tiling(ew.name, o.shape(), out.tile())?;
            // An `x` in the output's memory is copied first, so that every output reads the
            // values of before the kernel (blocks run in any order) and the launch does not
            // name one range as both an input and the output.
            let xd = if shares_memory(o, xt) {
                std::borrow::Cow::Owned(super::gather_copy(ew.name, stream, xt)?)
            } else {
                super::dense(ew.name, stream, xt)?
            };
            ew.launch(
                stream,
                o.out_view(ew.name)?,
                Some(xd.view(ew.name)?),
                None,
                s,
                o.rows_cols(),
                Some(t),
            )?;
        }
        Ok((out, x))
    })
}

/// Whether `a` and `b` have elements in one range of one buffer's memory (from each first
/// element to each last), through clones or reinterpretations of it alike.
fn shares_memory<T: DType>(a: &Tensor<T>, b: &Tensor<T>) -> bool {
    let range = |t: &Tensor<T>| {
        let span = crate::view::span(t.shape(), t.strides());
        (t.offset(), t.offset() + span)
    };
    let ((a0, a1), (b0, b1)) = (range(a), range(b));
    a.buffer().same_memory(b.buffer()) && a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
}

/// Fills a new tensor of `shape` with `v`, for `op` (`fill`, `ones`, `full`, ...).
pub(crate) fn fill<T: DType>(
    op: &'static str,
    shape: &[usize],
    v: T,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send> {
    let shape: crate::tensor::Shape = shape.into();
    from_fn(move |ctx: &mut ExecutionContext| {
        let stream = ctx.stream()?;
        let out = alloc::<T>(op, stream, &shape)?;
        fill_ew::<T>().launch(
            stream,
            out.view("fill")?,
            None,
            None,
            v,
            out.rows_cols(),
            None,
        )?;
        Ok(out)
    })
}

pub(crate) fn fill_ew<T: DType>() -> Ew<T> {
    Ew {
        name: "fill",
        expr: "s",
        inputs: 0,
        reads_out: false,
        helpers: "",
        host: |_, _, _, s| s,
    }
}

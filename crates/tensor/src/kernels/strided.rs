//! The strided elementwise kernel: `out[i] = EXPR(a, b, c, s, t)` over a dense output, where
//! `a`, `b`, `c` are read from up to three inputs through their own strides (0 along axes
//! they are broadcast over), so neither views nor broadcast inputs are copied first. The
//! dense copy of a view ([`contiguous`]), NumPy-broadcast binary operations, comparisons,
//! `where_` and `clamp` are all this one kernel with another expression.
//!
//! The shape and strides are merged to the fewest axes first (packed neighbours become one
//! axis), then passed by value as up to [`MAX_DIMS`] lengths and strides per input. Each
//! thread walks a grid-stride loop and turns its linear index into offsets with one division
//! per axis, in 32-bit arithmetic when the element count allows.

use std::borrow::Cow;

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::{
    BufferView, DeviceError, HostKernelArgs, Kernel, KernelArgs, LaunchConfig, Stream,
};

use super::{alloc, TensorResult};
use crate::dtype::{cuda_prelude, DType};
use crate::op::{cached_kernel2, strided_op, TensorOp};
use crate::tensor::{Shape, Tensor, TensorInput};
use crate::view::{collapse, span, Strided, MAX_DIMS};

/// The element type of one operand as the kernel source names it.
#[derive(Clone, Copy)]
pub(crate) enum Elem {
    /// The kernel's dtype `T`, loaded to the compute type `A` with `ld`.
    T,
    /// A `u8` mask (`unsigned char`), read as it is.
    Mask,
}

impl Elem {
    fn ctype(self) -> &'static str {
        match self {
            Elem::T => "T",
            Elem::Mask => "unsigned char",
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

impl StridedEw {
    fn source<T: DType>(&self, fname: &str) -> String {
        let names = ["a", "b", "c"];
        let mut params = String::new();
        let mut strides = String::new();
        let mut setup = String::new();
        let mut offs = String::new();
        let mut step = String::new();
        let mut loads = String::new();
        for (k, e) in self.inputs.iter().enumerate() {
            params += &format!(", const {}* __restrict__ x{k}", e.ctype());
            let list: Vec<String> = (0..MAX_DIMS).map(|d| format!("u64 s{k}_{d}")).collect();
            strides += &format!(", {}", list.join(", "));
            let vals: Vec<String> = (0..MAX_DIMS).map(|d| format!("s{k}_{d}")).collect();
            setup += &format!("  const u64 st{k}[{MAX_DIMS}] = {{{}}};\n", vals.join(", "));
            offs += &format!("u64 o{k} = 0; ");
            step += &format!("o{k} += c * st{k}[d]; ");
            let load = match e {
                Elem::T => format!("ld(x{k}[o{k}])"),
                Elem::Mask => format!("x{k}[o{k}]"),
            };
            loads += &format!("{} {} = {load}; ", e_type(*e), names[k]);
        }
        let dims: Vec<String> = (0..MAX_DIMS)
            .map(|d| format!("u64 d{d}"))
            .chain((0..MAX_DIMS).map(|d| format!("u64 m{d}")))
            .collect();
        let dim_vals: Vec<String> = (0..MAX_DIMS).map(|d| format!("d{d}")).collect();
        let magic_vals: Vec<String> = (0..MAX_DIMS).map(|d| format!("m{d}")).collect();
        let store = match self.out {
            Elem::T => "st((A)(EXPR_))",
            Elem::Mask => "(unsigned char)((EXPR_) ? 1 : 0)",
        };
        format!(
            r#"{prelude}
typedef unsigned long long u64;
#define EXPR_ ({expr})
// Below 2^31 elements, r / dims[d] is a multiply-high and a shift by the magic numbers of
// mg[d] (the multiplier in the low 32 bits, the shift above them).
#define DIVMOD_MAGIC \
  unsigned q = (__umulhi(r, (unsigned)mg[d]) + r) >> (unsigned)(mg[d] >> 32); \
  u64 c = (u64)(r - q * (unsigned)dims[d]); r = q;
#define DIVMOD_WIDE u64 c = r % dims[d]; r /= dims[d];
#define WALK(IT, DIVMOD) \
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {{ \
    IT r = (IT)i; {offs} \
    _Pragma("unroll") \
    for (int d = {last}; d >= 0; --d) {{ \
      if (d < rank) {{ DIVMOD {step} }} \
    }} \
    {loads} \
    out[i] = {store}; \
  }}
extern "C" __global__ void {fname}({out_t}* __restrict__ out{params}, T s_, T t_, u64 n, int rank,
                                   {dims}{strides}) {{
  A s = ld(s_), t = ld(t_);
  (void)s; (void)t;
  const u64 dims[{MAX_DIMS}] = {{{dim_vals}}};
  const u64 mg[{MAX_DIMS}] = {{{magic_vals}}};
{setup}  if (n <= 0x7fffffffull) {{
    WALK(unsigned, DIVMOD_MAGIC)
  }} else {{
    WALK(u64, DIVMOD_WIDE)
  }}
}}
"#,
            prelude = cuda_prelude::<T>(),
            expr = self.expr,
            last = MAX_DIMS - 1,
            out_t = self.out.ctype(),
            dims = dims.join(", "),
            dim_vals = dim_vals.join(", "),
            magic_vals = magic_vals.join(", "),
        )
    }

    /// The kernel for dtype `T`, with `host` as its host implementation over the inputs'
    /// element offsets (one per input, in `HostView` order).
    pub(crate) fn kernel<T: DType>(
        &self,
        host: impl Fn(&mut HostKernelArgs<'_>, &HostLayout) -> Result<(), DeviceError>
            + Send
            + Sync
            + 'static,
    ) -> Kernel {
        let inputs = self.inputs.len();
        cached_kernel2(self.name, T::NAME, "strided", || {
            let fname = format!("{}_strided_{}", self.name, T::NAME);
            let source = self.source::<T>(&fname);
            crate::op::builtin_kernel(fname, source).with_host(move |args| {
                let layout = HostLayout::read(args, inputs)?;
                host(args, &layout)
            })
        })
    }
}

fn e_type(e: Elem) -> &'static str {
    match e {
        Elem::T => "A",
        Elem::Mask => "unsigned char",
    }
}

/// The layout a host implementation of a strided kernel reads from its arguments: the merged
/// shape and each input's strides.
pub(crate) struct HostLayout {
    shape: Vec<usize>,
    strides: Vec<Vec<usize>>,
    /// The index of the first scalar (`s`).
    pub(crate) scalars: usize,
}

impl HostLayout {
    fn read(args: &HostKernelArgs<'_>, inputs: usize) -> Result<HostLayout, DeviceError> {
        let base = 1 + inputs;
        let rank = args.scalar::<i32>(base + 3)? as usize;
        let dims = base + 4;
        let shape = (0..rank)
            .map(|d| args.scalar::<u64>(dims + d).map(|v| v as usize))
            .collect::<Result<Vec<_>, _>>()?;
        let strides = (0..inputs)
            .map(|k| {
                (0..rank)
                    .map(|d| {
                        args.scalar::<u64>(dims + MAX_DIMS * (2 + k) + d)
                            .map(|v| v as usize)
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HostLayout {
            shape,
            strides,
            scalars: base,
        })
    }

    /// The offsets of input `k`'s elements in row-major order of the output.
    pub(crate) fn offsets(&self, k: usize) -> impl Iterator<Item = usize> + '_ {
        Strided::new(&self.shape, &self.strides[k], 0).offsets()
    }
}

/// One input of a strided launch: a tensor read through `strides` (over the output's shape).
pub(crate) struct Operand<'a, U: Clone> {
    pub(crate) tensor: Cow<'a, Tensor<U>>,
    pub(crate) strides: Shape,
}

impl<'a, U: DType> Operand<'a, U> {
    /// `tensor` read as it is (its shape is the output's).
    pub(crate) fn whole(tensor: &'a Tensor<U>) -> Self {
        Operand {
            tensor: Cow::Borrowed(tensor),
            strides: tensor.strides().into(),
        }
    }

    /// `tensor` broadcast to `shape` (checked by the caller). An operand whose axes merge to
    /// more than [`MAX_DIMS`] over `shape` (a view permuted over many axes, or one broadcast
    /// along alternating axes) is read from a dense copy of it broadcast to `shape`, made on
    /// `stream`, whose axes merge.
    pub(crate) fn broadcast(
        stream: &Stream,
        tensor: &'a Tensor<U>,
        shape: &[usize],
    ) -> Result<Self, DeviceError> {
        let strides = crate::view::broadcast_strides(tensor.shape(), tensor.strides(), shape);
        let dense = crate::tensor::contiguous_strides("broadcast", shape)?;
        if collapse(shape, [&dense, &strides]).0.len() <= MAX_DIMS {
            return Ok(Operand {
                tensor: Cow::Borrowed(tensor),
                strides,
            });
        }
        Ok(Operand {
            tensor: Cow::Owned(gather(stream, &tensor.expand(shape)?)?),
            strides: dense,
        })
    }

    /// The part of the buffer the operand reads, from its first element.
    pub(crate) fn view(&self, shape: &[usize]) -> Result<BufferView<'_, U>, DeviceError> {
        let t = &*self.tensor;
        let n = span(shape, &self.strides);
        if n == 0 {
            return t.buffer().slice(0..0);
        }
        t.buffer().slice(t.offset()..t.offset() + n)
    }
}

/// Writes `host(x, y)` of `x` and `y` broadcast to `shape` into `out` (dense, of `shape`,
/// elements of kind `out_elem`): the two-input strided launch that the arithmetic and the
/// comparisons share. `expr` is the CUDA expression of the element, `name` the kernel's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn broadcast2<T: DType, O: DType>(
    stream: &Stream,
    name: &'static str,
    expr: &'static str,
    out_elem: Elem,
    x: &Tensor<T>,
    y: &Tensor<T>,
    out: &Tensor<O>,
    host: impl Fn(T, T) -> O + Send + Sync + 'static,
) -> Result<(), DeviceError> {
    let shape = out.shape();
    let kernel = StridedEw {
        name,
        expr,
        inputs: &[Elem::T, Elem::T],
        out: out_elem,
    }
    .kernel::<T>(move |args, layout| {
        let (a, b) = (args.input::<T>(1)?, args.input::<T>(2)?);
        for ((o, i), j) in args
            .output::<O>(0)?
            .iter_mut()
            .zip(layout.offsets(0))
            .zip(layout.offsets(1))
        {
            *o = host(a[i], b[j]);
        }
        Ok(())
    });
    let (xo, yo) = (
        Operand::broadcast(stream, x, shape)?,
        Operand::broadcast(stream, y, shape)?,
    );
    let (xv, yv) = (xo.view(shape)?, yo.view(shape)?);
    launch(
        stream,
        &kernel,
        name,
        out.view(name)?,
        shape,
        &[&xo.strides, &yo.strides],
        |a| {
            a.input(xv).input(yv);
        },
        T::default(),
        T::default(),
    )
}

/// Enqueues `kernel` writing `out` (dense, of `shape`) from `inputs` read through their
/// strides, with scalars `s` and `t`. `push` adds the inputs' views to the arguments in order;
/// `strides` are their strides over `shape`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch<'a, T: DType, O: DType>(
    stream: &Stream,
    kernel: &Kernel,
    name: &'static str,
    out: BufferView<'a, O>,
    shape: &[usize],
    inputs: &[&[usize]],
    push: impl FnOnce(&mut KernelArgs<'a>),
    s: T,
    t: T,
) -> Result<(), DeviceError> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    // Merge axes over the output's (dense) strides and every input's.
    let out_strides = crate::tensor::contiguous_strides(name, shape)?;
    let (dims, strides) = match inputs.len() {
        1 => {
            let (d, [_, a]) = collapse(shape, [&out_strides, inputs[0]]);
            (d, vec![a])
        }
        2 => {
            let (d, [_, a, b]) = collapse(shape, [&out_strides, inputs[0], inputs[1]]);
            (d, vec![a, b])
        }
        _ => {
            let (d, [_, a, b, c]) =
                collapse(shape, [&out_strides, inputs[0], inputs[1], inputs[2]]);
            (d, vec![a, b, c])
        }
    };
    if dims.len() > MAX_DIMS {
        return Err(DeviceError::InvalidShape {
            op: name,
            reason: format!(
                "{shape:?} indexes more than {MAX_DIMS} axes that cannot be merged (operands \
                 broadcast along different axes); copy the broadcast operands to the full \
                 shape first with `kernels::contiguous(x.expand(shape))`"
            ),
        });
    }
    let mut args = KernelArgs::new();
    args.output(out);
    push(&mut args);
    args.scalar(s)
        .scalar(t)
        .scalar(n as u64)
        .scalar(dims.len() as i32);
    for d in 0..MAX_DIMS {
        args.scalar(dims.get(d).copied().unwrap_or(1) as u64);
    }
    for d in 0..MAX_DIMS {
        args.scalar(magic(dims.get(d).copied().unwrap_or(1)));
    }
    for st in &strides {
        for d in 0..MAX_DIMS {
            args.scalar(st.get(d).copied().unwrap_or(0) as u64);
        }
    }
    let sms = stream.device().limits().multiprocessor_count.max(1) as usize;
    let grid = n.div_ceil(256 * 4).clamp(1, sms * 32) as u32;
    kernel.launch(stream, LaunchConfig::linear(grid, 256), &args)
}

/// The magic numbers that divide an index below 2^31 by `d` with a multiply-high and a shift
/// (Granlund and Montgomery; the form PyTorch's `IntDivider` uses): the multiplier in the low
/// 32 bits, the shift above them. The kernel takes them only when every index is below 2^31,
/// and every axis length is then below it too.
fn magic(d: usize) -> u64 {
    if d == 0 || d > i32::MAX as usize {
        return 0;
    }
    let d = d as u64;
    let shift = (0u32..32).find(|s| (1u64 << s) >= d).unwrap_or(31);
    let m1 = ((1u64 << 32) * ((1u64 << shift) - d)) / d + 1;
    (u64::from(shift) << 32) | (m1 & 0xffff_ffff)
}

/// The copy kernel: `out[i] = a`.
fn copy_ew() -> StridedEw {
    StridedEw {
        name: "contiguous",
        expr: "a",
        inputs: &[Elem::T],
        out: Elem::T,
    }
}

/// A dense copy of `x` on `stream`.
pub(crate) fn gather<T: DType>(stream: &Stream, x: &Tensor<T>) -> TensorResult<T> {
    let out = alloc::<T>(stream, x.shape())?;
    copy_into(stream, out.view("contiguous")?, x)?;
    Ok(out)
}

/// Copies `x` into `out` (dense, `x.len()` elements). A view whose axes merge to more than
/// [`MAX_DIMS`] is copied one index of its first axis at a time (each a view of one axis
/// fewer), so that any view has a dense copy.
fn copy_into<T: DType>(
    stream: &Stream,
    out: BufferView<'_, T>,
    x: &Tensor<T>,
) -> Result<(), DeviceError> {
    let dense = crate::tensor::contiguous_strides("contiguous", x.shape())?;
    let (dims, _) = collapse(x.shape(), [&dense, x.strides()]);
    if dims.len() > MAX_DIMS {
        let inner = x.len() / x.shape()[0];
        for i in 0..x.shape()[0] {
            copy_into(
                stream,
                out.slice(i * inner..(i + 1) * inner)?,
                &x.select(0, i)?,
            )?;
        }
        return Ok(());
    }
    let kernel = copy_ew().kernel::<T>(|args, layout| {
        let x = args.input::<T>(1)?;
        let out = args.output::<T>(0)?;
        for (o, i) in out.iter_mut().zip(layout.offsets(0)) {
            *o = x[i];
        }
        Ok(())
    });
    let input = Operand::whole(x);
    let view = input.view(x.shape())?;
    launch(
        stream,
        &kernel,
        "contiguous",
        out,
        x.shape(),
        &[&input.strides],
        |a| {
            a.input(view);
        },
        T::default(),
        T::default(),
    )
}

/// `x` itself when kernels read it where it lies (contiguous, its first element at a 16-byte
/// boundary), else a dense copy made on `stream`: what a kernel that reads packed rows calls
/// on its inputs.
pub(crate) fn dense<'a, T: DType>(
    _op: &'static str,
    stream: &Stream,
    x: &'a Tensor<T>,
) -> Result<Cow<'a, Tensor<T>>, DeviceError> {
    if x.is_kernel_ready() {
        Ok(Cow::Borrowed(x))
    } else {
        Ok(Cow::Owned(gather(stream, x)?))
    }
}

/// `x` as a contiguous tensor: `x` itself (sharing memory) when it already is and its first
/// element lies at a 16-byte boundary of its buffer (as kernels need), else a dense copy,
/// made by one strided gather kernel on the executing stream.
///
/// Kernels call this themselves on inputs they need dense, so it is needed only to pay for
/// the copy once when a view feeds several kernels, or before
/// [`reshape`](crate::Tensor::reshape) and [`Launch`](crate::Launch) (which take contiguous
/// tensors only).
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, kernels};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let x = api::arange::<f32>(0.0, 6.0, 1.0).sync_on(&stream)?.reshape(&[2, 3])?;
/// let t = kernels::contiguous(x.transpose(0, 1)?).sync_on(&stream)?;
/// assert!(t.is_contiguous());
/// assert_eq!(t.to_host_vec()?, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
/// # Ok(()) }
/// ```
pub fn contiguous<T: DType, X: TensorInput<T>>(
    x: X,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    strided_op("contiguous", x, |stream, x| {
        Ok(dense("contiguous", stream, x)?.into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::magic;

    /// The device's quotient by the magic numbers, computed as the CUDA C computes it.
    fn magic_div(r: u32, m: u64) -> u32 {
        let m1 = m as u32;
        let shift = (m >> 32) as u32;
        let hi = ((u64::from(r) * u64::from(m1)) >> 32) as u32;
        (hi + r) >> shift
    }

    #[test]
    fn magic_division_is_exact_below_2_pow_31() {
        let divisors = (1u32..300)
            .chain([
                511,
                512,
                513,
                1000,
                4097,
                65_535,
                65_536,
                1 << 20,
                (1 << 30) + 7,
            ])
            .chain([(1 << 31) - 1]);
        let top = (1u32 << 31) - 1;
        for d in divisors {
            let m = magic(d as usize);
            for r in (0..2000).chain(top - 2000..=top).chain([
                d,
                d - 1,
                d + 1,
                d.saturating_mul(2),
                d.saturating_mul(3) - 1,
            ]) {
                if r > top {
                    continue;
                }
                assert_eq!(magic_div(r, m), r / d, "{r} / {d}");
            }
        }
    }
}

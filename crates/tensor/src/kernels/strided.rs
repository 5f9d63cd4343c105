//! The strided elementwise kernel: `out[i] = EXPR(a, b, c, s, t)` over a dense output, where
//! `a`, `b`, `c` are read from up to three inputs through their own strides (0 along axes
//! they are broadcast over), so neither views nor broadcast inputs are copied first. The
//! dense copy of a view ([`contiguous`]), NumPy-broadcast binary operations, comparisons,
//! `where_` and `clamp` are all this one kernel with another expression.
//!
//! The shape and strides are merged to the fewest axes first (packed neighbours become one
//! axis), then passed by value as up to [`MAX_DIMS`] lengths and strides per input. The
//! launch then picks one of the two walks of [`super::strided_source`] ([`plan`]): tiles
//! through shared memory where an input is read transposed to the output (unit stride along
//! an earlier output axis, not along the last), else a grid-stride loop over the output in
//! which each thread turns its indices into offsets with one division per axis, in 32-bit
//! arithmetic when the element count allows.

use std::borrow::Cow;

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::{BufferView, DeviceError, HostKernelArgs, KernelArgs, LaunchConfig, Stream};

pub(crate) use super::strided_source::{Elem, StridedEw, StridedKernel};
use super::strided_source::{EPT, TILE, TILE_ROWS};
use super::{alloc, TensorResult};
use crate::dtype::DType;
use crate::op::{strided_op, TensorOp};
use crate::tensor::{Shape, Tensor, TensorInput};
use crate::view::{collapse, span, Strided, MAX_DIMS};

/// The layout a host implementation of a strided kernel reads from its arguments: the merged
/// shape and each input's strides.
pub(crate) struct HostLayout {
    shape: Vec<usize>,
    strides: Vec<Vec<usize>>,
    /// The index of the first scalar (`s`).
    pub(crate) scalars: usize,
}

impl HostLayout {
    pub(crate) fn read(
        args: &HostKernelArgs<'_>,
        inputs: usize,
    ) -> Result<HostLayout, DeviceError> {
        let base = 1 + inputs;
        let rank = args.scalar::<i32>(base + 3)? as usize;
        // The merged axes are the last `rank` of the `MAX_DIMS` passed.
        let dims = base + 4 + MAX_DIMS.saturating_sub(rank);
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
            tensor: Cow::Owned(gather("broadcast", stream, &tensor.expand(shape)?)?),
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
    kernel: &StridedKernel,
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
    let (dims, strides) = merged(name, shape, inputs)?;
    let mut args = KernelArgs::new();
    args.output(out);
    push(&mut args);
    args.scalar(s)
        .scalar(t)
        .scalar(n as u64)
        .scalar(dims.len() as i32);
    // The merged axes are passed as the last `rank` of `MAX_DIMS`, after axes of length 1,
    // so that the innermost is always the last and the kernels' loops over the axes, from
    // the innermost, stop after `rank`.
    let pad = MAX_DIMS - dims.len();
    let aligned = |v: &[usize], fill: usize, d: usize| d.checked_sub(pad).map_or(fill, |d| v[d]);
    for d in 0..MAX_DIMS {
        args.scalar(aligned(&dims, 1, d) as u64);
    }
    for d in 0..MAX_DIMS {
        args.scalar(magic(aligned(&dims, 1, d)));
    }
    for st in &strides {
        for d in 0..MAX_DIMS {
            args.scalar(aligned(st, 0, d) as u64);
        }
    }
    let sms = super::multiprocessors(stream);
    match plan(&dims, &strides) {
        Walk::Tiled { axis, staged } => {
            let (dp, dl) = (dims[axis], dims[dims.len() - 1]);
            let batch = n / (dp * dl);
            // `plan` keeps the tiles along the last axis within the grid's first dimension;
            // the others are walked in grid-stride loops, over about 8 blocks per
            // multiprocessor: each block walks many tiles along `axis`, so its setup (the
            // batch offsets) is paid once per block, not once per tile (on an H100, 8192² in
            // 256 x 256 blocks ran at 0.54 TB/s, in 256 x 4 at 1.31).
            let (gx, gz) = (dl.div_ceil(TILE), batch.min(GRID_YZ));
            let gy = dp
                .div_ceil(TILE)
                .min(GRID_YZ)
                .min((8 * sms).div_ceil(gx * gz).max(1));
            let grid = (gx as u32, gy as u32, gz as u32);
            args.scalar((pad + axis) as i32).scalar(staged as i32);
            let config = LaunchConfig::new(grid, (TILE as u32, TILE_ROWS as u32, 1));
            kernel.tiled.launch(stream, config, &args)
        }
        Walk::Linear => {
            let grid = n.div_ceil(256 * EPT).clamp(1, sms * 32) as u32;
            kernel
                .linear
                .launch(stream, LaunchConfig::linear(grid, 256), &args)
        }
    }
}

/// `shape` and the inputs' `strides` over it merged to the fewest axes, over the output's
/// (dense) strides and every input's.
fn merged(
    name: &'static str,
    shape: &[usize],
    inputs: &[&[usize]],
) -> Result<(Shape, Vec<Shape>), DeviceError> {
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
    Ok((dims, strides))
}

/// The most blocks along a launch's second and third grid dimensions.
const GRID_YZ: usize = 65_535;

/// The shortest axes (after merging) a tiled walk is taken for: below them most of a tile's
/// threads would idle, and a strided read wastes little.
const MIN_TILED_AXIS: usize = 16;

/// How a launch walks its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// The grid-stride loop over the output in row-major order.
    Linear,
    /// Tiles over the merged axis `axis` and the last, the inputs whose bit is set in
    /// `staged` read through shared memory.
    Tiled { axis: usize, staged: u32 },
}

/// The walk for merged lengths `dims` and the inputs' `strides` over them: tiled when an input
/// is read transposed to the output, that is with a stride other than 0 or 1 along the last
/// axis and a unit stride along an earlier one, both axes at least [`MIN_TILED_AXIS`] long.
/// The inputs read transposed along that same axis are staged; the others (dense, broadcast)
/// are read directly.
fn plan(dims: &[usize], strides: &[Shape]) -> Walk {
    let Some(last) = dims.len().checked_sub(1) else {
        return Walk::Linear;
    };
    let transposed = |st: &Shape, axis: usize| st[axis] == 1 && st[last] > 1;
    let axis = strides.iter().find_map(|st| {
        (0..last)
            .rev()
            .find(|&axis| transposed(st, axis) && dims[axis] >= MIN_TILED_AXIS)
    });
    let Some(axis) = axis else {
        return Walk::Linear;
    };
    if dims[last] < MIN_TILED_AXIS || dims[last].div_ceil(TILE) > i32::MAX as usize {
        return Walk::Linear;
    }
    let staged = strides
        .iter()
        .enumerate()
        .filter(|(_, st)| transposed(st, axis))
        .fold(0, |bits, (k, _)| bits | 1 << k);
    Walk::Tiled { axis, staged }
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

/// A dense copy of `x` on `stream`, for `op`.
pub(crate) fn gather<T: DType>(
    op: &'static str,
    stream: &Stream,
    x: &Tensor<T>,
) -> TensorResult<T> {
    let out = alloc::<T>(op, stream, x.shape())?;
    copy_into(stream, out.view("contiguous")?, x)?;
    Ok(out)
}

/// Copies `x` into `out` (dense, `x.len()` elements). A view whose axes merge to more than
/// [`MAX_DIMS`] is copied one index of its first merged axis at a time (each a view of one
/// merged axis fewer), so that any view has a dense copy. The recursion walks the merged
/// axes, none of length 1 (so at most 64 of them, their product fitting in `usize`), not the
/// view's own axes, which may number in the thousands.
fn copy_into<T: DType>(
    stream: &Stream,
    out: BufferView<'_, T>,
    x: &Tensor<T>,
) -> Result<(), DeviceError> {
    let dense = crate::tensor::contiguous_strides("contiguous", x.shape())?;
    let (dims, [_, strides]) = collapse(x.shape(), [&dense, x.strides()]);
    if dims.len() > MAX_DIMS {
        // The same elements in the same row-major order, over the merged axes.
        let merged = Tensor {
            buf: x.buf.clone(),
            shape: dims,
            strides,
            offset: x.offset,
        };
        let inner = merged.len() / merged.shape[0];
        for i in 0..merged.shape[0] {
            copy_into(
                stream,
                out.slice(i * inner..(i + 1) * inner)?,
                &merged.select(0, i)?,
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
    op: &'static str,
    stream: &Stream,
    x: &'a Tensor<T>,
) -> Result<Cow<'a, Tensor<T>>, DeviceError> {
    if x.is_kernel_ready() {
        Ok(Cow::Borrowed(x))
    } else {
        Ok(Cow::Owned(gather(op, stream, x)?))
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
    use super::{magic, merged, plan, Walk};

    /// The walk a launch over `shape` with inputs of `strides` takes.
    fn walk(shape: &[usize], strides: &[&[usize]]) -> Walk {
        let (dims, st) = merged("test", shape, strides).unwrap();
        plan(&dims, &st)
    }

    #[test]
    fn transposed_operands_take_the_tiled_walk() {
        let n = 8192;
        // x.t() + y: x staged, y read directly.
        let tiled = Walk::Tiled { axis: 0, staged: 1 };
        assert_eq!(walk(&[n, n], &[&[1, n], &[n, 1]]), tiled);
        // y + x.t(), and the copy of a transpose.
        let second = Walk::Tiled { axis: 0, staged: 2 };
        assert_eq!(walk(&[n, n], &[&[n, 1], &[1, n]]), second);
        assert_eq!(walk(&[65, 33], &[&[1, 65]]), tiled);
        // Both transposed, beside a broadcast column.
        let both = Walk::Tiled { axis: 0, staged: 3 };
        assert_eq!(walk(&[70, 35], &[&[1, 70], &[1, 70], &[1, 0]]), both);
        // A batched permute [b, m, n] -> [b, n, m]: the batch axis before the tile's.
        let batched = Walk::Tiled { axis: 1, staged: 1 };
        assert_eq!(walk(&[3, 65, 33], &[&[65 * 33, 1, 65]]), batched);
        // [a, b, c] -> [c, b, a]: the batch axis between the tile's.
        let outer = Walk::Tiled { axis: 0, staged: 1 };
        assert_eq!(walk(&[40, 3, 65], &[&[1, 40, 120]]), outer);
    }

    #[test]
    fn other_operands_take_the_linear_walk() {
        let n = 8192;
        // x + col: both read along the last axis (the column broadcast along it).
        assert_eq!(walk(&[n, n], &[&[n, 1], &[1, 0]]), Walk::Linear);
        // Dense, and a permute that keeps the last axis.
        assert_eq!(walk(&[n, n], &[&[n, 1], &[n, 1]]), Walk::Linear);
        assert_eq!(walk(&[33, 3, 65], &[&[65, 33 * 65, 1]]), Walk::Linear);
        // Axes too short to tile, vectors, and no unit stride anywhere.
        assert_eq!(walk(&[200, 5], &[&[1, 200]]), Walk::Linear);
        assert_eq!(walk(&[5, 200], &[&[1, 5]]), Walk::Linear);
        assert_eq!(walk(&[65, 33, 3], &[&[1, 65, 65 * 33]]), Walk::Linear);
        assert_eq!(walk(&[1000, 1], &[&[1, 1000]]), Walk::Linear);
        assert_eq!(walk(&[64, 64], &[&[2, 128]]), Walk::Linear);
        assert_eq!(walk(&[], &[&[]]), Walk::Linear);
    }

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

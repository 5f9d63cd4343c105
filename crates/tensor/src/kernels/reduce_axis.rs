//! Reductions along any axis, with `keepdim`: `sum_axis`, `mean_axis`, `max_axis`,
//! `min_axis`, `argmax_axis`, `argmin_axis`, and `softmax_axis` / `log_softmax_axis`.
//!
//! A reduction over the last axis of a contiguous tensor is the row kernel of
//! [`super::rows`] (one block per row). Any other axis, or a view, runs the strided reduction
//! kernel: a block takes up to 256 neighbouring outputs, up to 8 threads per output walking
//! the reduced axis through its stride (combined in shared memory), so neighbouring threads
//! read neighbouring elements wherever the axes after the reduced one are packed, and nothing
//! is copied. Few outputs over a long axis instead copy the tensor with
//! the reduced axis last and take the row kernel, which spreads each row over a block.
//! Softmax along an axis other than the last of a contiguous tensor runs the row kernel over
//! such a copy and copies the result back to the input's axis order.

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};
use smallvec::SmallVec;

use super::rows::{arg_kernel, launch_rows, norm_kernel, reduce_kernel, LOG_SOFTMAX_BODY};
use super::strided::gather;
use super::{alloc, TensorResult};
use crate::dtype::{cuda_prelude, DType, FloatDType};
use crate::op::{cached_kernel, strided_op, TensorOp};
use crate::tensor::{contiguous_strides, Shape, Tensor, TensorInput};
use crate::view::{check_axis, collapse, Strided, MAX_DIMS};

/// One reduction: its name (`sum`, `mean`, `max`, `min`, `argmax`, `argmin`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
    ArgMax,
    ArgMin,
}

impl Red {
    fn name(self) -> &'static str {
        match self {
            Red::Sum => "sum",
            Red::Mean => "mean",
            Red::Max => "max",
            Red::Min => "min",
            Red::ArgMax => "argmax",
            Red::ArgMin => "argmin",
        }
    }

    /// Folds `v` (at index `vi`) into `acc` (at index `bi`). Ties keep the lower index.
    fn step(self) -> &'static str {
        match self {
            Red::Sum | Red::Mean => "acc += v;",
            Red::Max => "if (v > acc) acc = v;",
            Red::Min => "if (v < acc) acc = v;",
            Red::ArgMax => "if (v > acc || (v == acc && vi < bi)) { acc = v; bi = vi; }",
            Red::ArgMin => "if (v < acc || (v == acc && vi < bi)) { acc = v; bi = vi; }",
        }
    }

    fn finish(self) -> &'static str {
        match self {
            Red::Sum | Red::Max | Red::Min => "st(acc)",
            Red::Mean => "st(acc / (A)K)",
            Red::ArgMax | Red::ArgMin => "bi",
        }
    }

    /// The host reduction of the values `v` (at least one): the value and its index.
    fn host<T: DType>(self, v: impl Iterator<Item = T>) -> (T, u32) {
        let mut it = v.enumerate();
        let Some((_, first)) = it.next() else {
            return (T::default(), 0);
        };
        let (mut acc, mut bi, mut n) = (first, 0u32, 1usize);
        let mut sum = first.to_f64();
        for (k, v) in it {
            n += 1;
            match self {
                Red::Sum if !T::IS_FLOAT => acc = acc.add(v),
                Red::Sum | Red::Mean => sum += v.to_f64(),
                Red::Max | Red::ArgMax if v > acc => (acc, bi) = (v, k as u32),
                Red::Min | Red::ArgMin if v < acc => (acc, bi) = (v, k as u32),
                _ => {}
            }
        }
        match self {
            Red::Sum if T::IS_FLOAT => (T::from_f64(sum), 0),
            Red::Mean => (T::from_f64(sum / n as f64), 0),
            _ => (acc, bi),
        }
    }
}

/// The strided reduction kernel of `red` for dtype `T`, writing values of `T` or `u32` indices.
fn strided_kernel<T: DType>(red: Red) -> Kernel {
    let name = match red {
        Red::Sum => "sum_strided",
        Red::Mean => "mean_strided",
        Red::Max => "max_strided",
        Red::Min => "min_strided",
        Red::ArgMax => "argmax_strided",
        Red::ArgMin => "argmin_strided",
    };
    cached_kernel(name, T::NAME, || {
        let fname = format!("{name}_{}", T::NAME);
        let dims: Vec<String> = (0..MAX_DIMS).map(|d| format!("u64 d{d}")).collect();
        let strides: Vec<String> = (0..MAX_DIMS).map(|d| format!("u64 s{d}")).collect();
        let dv: Vec<String> = (0..MAX_DIMS).map(|d| format!("d{d}")).collect();
        let sv: Vec<String> = (0..MAX_DIMS).map(|d| format!("s{d}")).collect();
        let source = format!(
            r#"{prelude}
typedef unsigned long long u64;
#define STEP {{ {step} }}
// Block (bx, by): bx consecutive outputs, each reduced by by threads that take every by-th
// element of the axis, then combined through shared memory by the first.
extern "C" __global__ void {fname}({out_t}* __restrict__ out, const T* __restrict__ x, u64 n,
                                   u64 K, u64 sk, int rank, {dims}, {strides}) {{
  __shared__ A shv[256];
  __shared__ unsigned shi[256];
  const u64 dims[{MAX_DIMS}] = {{{dv}}};
  const u64 xs[{MAX_DIMS}] = {{{sv}}};
  const unsigned bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  for (u64 base = (u64)blockIdx.x * bx; base < n; base += (u64)gridDim.x * bx) {{
    u64 i = base + tx;
    A acc = (A)0;
    unsigned bi = 0xffffffffu;
    if (i < n && ty < K) {{
      u64 r = i, o = 0;
#pragma unroll
      for (int d = {last}; d >= 0; --d) {{
        if (d < rank) {{ u64 c = r % dims[d]; r /= dims[d]; o += c * xs[d]; }}
      }}
      const T* p = x + o;
      acc = ld(p[(u64)ty * sk]);
      bi = ty;
#pragma unroll 4
      for (u64 k = ty + by; k < K; k += by) {{
        A v = ld(p[k * sk]);
        unsigned vi = (unsigned)k;
        (void)vi;
        STEP
      }}
    }}
    shv[ty * bx + tx] = acc;
    shi[ty * bx + tx] = bi;
    __syncthreads();
    if (ty == 0 && i < n) {{
      for (unsigned j = 1; j < by; ++j) {{
        A v = shv[j * bx + tx];
        unsigned vi = shi[j * bx + tx];
        if (vi != 0xffffffffu) STEP
      }}
      out[i] = {finish};
    }}
    __syncthreads();
  }}
}}
"#,
            prelude = cuda_prelude::<T>(),
            out_t = if red == Red::ArgMax || red == Red::ArgMin {
                "unsigned"
            } else {
                "T"
            },
            dims = dims.join(", "),
            strides = strides.join(", "),
            dv = dv.join(", "),
            sv = sv.join(", "),
            last = MAX_DIMS - 1,
            step = red.step(),
            finish = red.finish(),
        );
        crate::op::builtin_kernel(fname, source).with_host(move |args| {
            let x = args.input::<T>(1)?;
            let k = args.scalar::<u64>(3)? as usize;
            let sk = args.scalar::<u64>(4)? as usize;
            let rank = args.scalar::<i32>(5)? as usize;
            let read = |i: usize| args.scalar::<u64>(i).map(|v| v as usize);
            let shape = (0..rank)
                .map(|d| read(6 + d))
                .collect::<Result<Vec<_>, _>>()?;
            let strides = (0..rank)
                .map(|d| read(6 + MAX_DIMS + d))
                .collect::<Result<Vec<_>, _>>()?;
            let offsets = Strided::new(&shape, &strides, 0).offsets();
            let values = offsets.map(|base| red.host((0..k).map(|j| x[base + j * sk])));
            if red == Red::ArgMax || red == Red::ArgMin {
                for (o, (_, i)) in args.output::<u32>(0)?.iter_mut().zip(values) {
                    *o = i;
                }
            } else {
                for (o, (v, _)) in args.output::<T>(0)?.iter_mut().zip(values) {
                    *o = v;
                }
            }
            Ok(())
        })
    })
}

/// The shape of a reduction of `shape` over `axis`: without it, or with length 1 there when
/// `keepdim`.
fn reduced(shape: &[usize], axis: usize, keepdim: bool) -> Shape {
    let mut out: Shape = shape.into();
    if keepdim {
        out[axis] = 1;
    } else {
        out.remove(axis);
    }
    out
}

/// `x` with `axis` moved last, as a dense copy (or `x` itself when it is last already and `x`
/// is contiguous).
fn axis_last<T: DType>(stream: &Stream, x: &Tensor<T>, axis: usize) -> TensorResult<T> {
    let mut order: SmallVec<[usize; 8]> = (0..x.rank()).filter(|&a| a != axis).collect();
    order.push(axis);
    let p = x.permute(&order)?;
    if p.is_kernel_ready() {
        Ok(p)
    } else {
        gather(stream, &p)
    }
}

/// Launches the reduction `red` of `x` over `axis` into `out` (of the reduced shape).
fn reduce_into<T: DType, O: DType>(
    stream: &Stream,
    red: Red,
    x: &Tensor<T>,
    axis: usize,
    out_shape: &[usize],
) -> TensorResult<O> {
    let k = x.shape()[axis];
    let n_out: usize = out_shape.iter().product();
    let last = axis + 1 == x.rank();
    let rows = if last && x.is_kernel_ready() {
        Some(x.clone())
    } else if n_out < 1024 && k >= 4096 {
        Some(axis_last(stream, x, axis)?)
    } else {
        None
    };
    if let Some(rows) = rows {
        let kernel = || match red {
            Red::ArgMax | Red::ArgMin => arg_kernel::<T>(red.name()),
            Red::Sum | Red::Mean => reduce_kernel::<T>(red.name(), "op_sum"),
            Red::Max => reduce_kernel::<T>("max", "op_max"),
            Red::Min => reduce_kernel::<T>("min", "op_min"),
        };
        return launch_rows(stream, kernel, out_shape, &rows, &[], None);
    }
    let out = alloc::<O>(stream, out_shape)?;
    // The outputs' layout over `x`: every axis but `axis`.
    let mut shape: Shape = x.shape().into();
    let mut strides: Shape = x.strides().into();
    let sk = strides.remove(axis);
    shape.remove(axis);
    let dense = contiguous_strides(red.name(), &shape)?;
    let (dims, [_, st]) = collapse(&shape, [&dense, &strides]);
    if dims.len() > MAX_DIMS {
        return reduce_into(stream, red, &gather(stream, x)?, axis, out_shape);
    }
    let span = crate::view::span(x.shape(), x.strides());
    let view = x.buffer().slice(x.offset()..x.offset() + span)?;
    {
        let mut args = KernelArgs::new();
        args.output(out.view(red.name())?)
            .input(view)
            .scalar(n_out as u64)
            .scalar(k as u64)
            .scalar(sk as u64)
            .scalar(dims.len() as i32);
        for d in 0..MAX_DIMS {
            args.scalar(dims.get(d).copied().unwrap_or(1) as u64);
        }
        for d in 0..MAX_DIMS {
            args.scalar(st.get(d).copied().unwrap_or(0) as u64);
        }
        // Up to 8 threads share an output's axis; the rest of the 256 take neighbouring
        // outputs.
        let by = k.next_power_of_two().min(8);
        let bx = 256 / by;
        let sms = stream.device().limits().multiprocessor_count.max(1) as usize;
        let grid = n_out.div_ceil(bx).clamp(1, sms * 32) as u32;
        let config = LaunchConfig::new((grid, 1, 1), (bx as u32, by as u32, 1));
        strided_kernel::<T>(red).launch(stream, config, &args)?;
    }
    Ok(out)
}

fn reduce<T: DType, O: DType, X: TensorInput<T>>(
    red: Red,
    x: X,
    axis: usize,
    keepdim: bool,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<O> + Send> {
    strided_op(red.name(), x, move |stream, x| {
        check_axis(red.name(), axis, x.shape())?;
        let out_shape = reduced(x.shape(), axis, keepdim);
        let k = x.shape()[axis];
        if k == 0 && red != Red::Sum {
            return Err(DeviceError::InvalidShape {
                op: red.name(),
                reason: format!(
                    "axis {axis} of {:?} is empty: {} of no elements is undefined",
                    x.shape(),
                    red.name()
                ),
            });
        }
        if (red == Red::ArgMax || red == Red::ArgMin) && k > u32::MAX as usize {
            return Err(DeviceError::InvalidShape {
                op: red.name(),
                reason: format!(
                    "axis {axis} of {:?} is longer than u32 indices reach",
                    x.shape()
                ),
            });
        }
        if k == 0 || out_shape.contains(&0) {
            // The sum over an empty axis is 0; no outputs need no launch.
            let out = alloc::<O>(stream, &out_shape)?;
            out.view(red.name())?.fill_bytes(stream, 0)?;
            return Ok(out);
        }
        reduce_into::<T, O>(stream, red, x, axis, &out_shape)
    })
}

macro_rules! axis_reduction {
    ($(#[$doc:meta])* $fn:ident, $red:expr, $bound:ident, $out:ty) => {
        $(#[$doc])*
        ///
        /// The output drops `axis`, or keeps it with length 1 when `keepdim` (as PyTorch's
        /// `keepdim`). Views are read in place.
        pub fn $fn<T: $bound, X: TensorInput<T>>(
            x: X,
            axis: usize,
            keepdim: bool,
        ) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<$out> + Send> {
            reduce::<T, $out, X>($red, x, axis, keepdim)
        }
    };
}

axis_reduction!(
    /// The sum along `axis` (0 over an empty axis). Floats accumulate in `float` (`double`
    /// for `f64`); integers wrap. [`sum`](super::sum) is its last-axis form.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range.
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
    /// let cols = kernels::sum_axis(&x, 0, false).sync_on(&stream)?;
    /// assert_eq!(cols.to_host_vec()?, vec![3.0, 5.0, 7.0]);
    /// let rows = kernels::sum_axis(&x, 1, true).sync_on(&stream)?;
    /// assert_eq!(rows.shape(), &[2, 1]);
    /// # Ok(()) }
    /// ```
    sum_axis, Red::Sum, DType, T
);
axis_reduction!(
    /// The mean along `axis`, accumulated as [`sum_axis`].
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range or empty.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<f32>(0.0, 6.0, 1.0).sync_on(&stream)?.reshape(&[2, 3])?;
    /// assert_eq!(kernels::mean_axis(&x, 1, false).sync_on(&stream)?.to_host_vec()?, vec![1.0, 4.0]);
    /// # Ok(()) }
    /// ```
    mean_axis, Red::Mean, FloatDType, T
);
axis_reduction!(
    /// The maximum along `axis`. [`max`](super::max) is its last-axis form. Which value a
    /// lane holding NaN gives is unspecified (as for [`min_axis`], [`argmax_axis`] and
    /// [`argmin_axis`]).
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range or empty.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1i32, 5, 3, 4], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(kernels::max_axis(&x, 0, false).sync_on(&stream)?.to_host_vec()?, vec![3, 5]);
    /// # Ok(()) }
    /// ```
    max_axis, Red::Max, DType, T
);
axis_reduction!(
    /// The minimum along `axis`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range or empty.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1i32, 5, 3, 4], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(kernels::min_axis(&x, 1, true).sync_on(&stream)?.to_host_vec()?, vec![1, 3]);
    /// # Ok(()) }
    /// ```
    min_axis, Red::Min, DType, T
);
axis_reduction!(
    /// The index of the maximum along `axis`, as `u32`; ties go to the first index.
    /// [`argmax`](super::argmax) is its last-axis form.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range, empty, or
    /// longer than `u32` indices reach.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(kernels::argmax_axis(&x, 0, false).sync_on(&stream)?.to_host_vec()?, vec![1, 0]);
    /// # Ok(()) }
    /// ```
    argmax_axis, Red::ArgMax, DType, u32
);
axis_reduction!(
    /// The index of the minimum along `axis`, as `u32`; ties go to the first index.
    ///
    /// # Errors
    ///
    /// As [`argmax_axis`].
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::{api, kernels};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], &[2, 2]).sync_on(&stream)?;
    /// assert_eq!(kernels::argmin_axis(&x, 1, false).sync_on(&stream)?.to_host_vec()?, vec![0, 0]);
    /// # Ok(()) }
    /// ```
    argmin_axis, Red::ArgMin, DType, u32
);

/// Softmax or log-softmax (`body`) of `x` along `axis`.
fn normalize<T: FloatDType, X: TensorInput<T>>(
    name: &'static str,
    body: &'static str,
    x: X,
    axis: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    strided_op(name, x, move |stream, x| {
        check_axis(name, axis, x.shape())?;
        let rows = axis_last(stream, x, axis)?;
        let kernel = || norm_kernel::<T>(name, "", body);
        let out = launch_rows(stream, kernel, rows.shape(), &rows, &[], None)?;
        if axis + 1 == x.rank() {
            return Ok(out);
        }
        // Back to the input's axis order, dense.
        let mut order: SmallVec<[usize; 8]> = (0..x.rank() - 1).collect();
        order.insert(axis, x.rank() - 1);
        gather(stream, &out.permute(&order)?)
    })
}

/// The softmax along `axis`, numerically stable. [`softmax`](super::softmax) is its
/// last-axis form, and the fast path here for the last axis of a contiguous tensor.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming the axis when it is out of range.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, kernels};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let x = api::zeros::<f32>(&[4, 2]).sync_on(&stream)?;
/// let p = kernels::softmax_axis(&x, 0).sync_on(&stream)?;
/// assert_eq!(p.to_host_vec()?, vec![0.25; 8]);
/// # Ok(()) }
/// ```
pub fn softmax_axis<T: FloatDType, X: TensorInput<T>>(
    x: X,
    axis: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    normalize("softmax", super::rows::SOFTMAX_BODY, x, axis)
}

/// The log-softmax along `axis`: `x - max - ln Σ exp(x - max)`, numerically stable.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming the axis when it is out of range.
///
/// ```
/// # use cuflow_device_op::DeviceOpExt;
/// # use cuflow_tensor::{api, kernels};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// # let stream = cuflow_runtime::Device::host().new_stream()?;
/// let x = api::zeros::<f64>(&[2, 4]).sync_on(&stream)?;
/// let l = kernels::log_softmax_axis(&x, 1).sync_on(&stream)?.to_host_vec()?;
/// assert!(l.iter().all(|v| (v + 4f64.ln()).abs() < 1e-12));
/// # Ok(()) }
/// ```
pub fn log_softmax_axis<T: FloatDType, X: TensorInput<T>>(
    x: X,
    axis: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    normalize("log_softmax", LOG_SOFTMAX_BODY, x, axis)
}

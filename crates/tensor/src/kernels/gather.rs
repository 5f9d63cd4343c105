//! Joining and indexing along an axis: `concat`, `stack`, `index_select`, `gather`.
//!
//! Each views its tensors as `[outer, len, inner]` around the axis (`outer` the product of the
//! axes before it, `inner` of those after it), so one kernel serves every axis:
//! - `concat` / `stack` copy each input's `[outer, len × inner]` block into its column range of
//!   the output (a plain copy where `outer` is 1);
//! - `index_select` / `gather` read `x[o, id, i]` for the index `id` of each output element
//!   (one index per `[outer, n, inner]` row position for `index_select`, one per element for
//!   `gather`). An index outside `0..len` (negative ones included) gives zero, on both
//!   backends, and is not an error: the check runs on the device, so the ops stay lazy and
//!   capturable, as [`embedding`](super::embedding) does.
//!
//! Views are accepted: an input that is not contiguous (or not at a 16-byte boundary) is
//! copied to a dense tensor on the executing stream, once every shape has been checked on the
//! tensors as given (a mismatched broadcast view is a shape error, never a huge copy).

use cuflow_device_op::op::zip::Zip2;
use cuflow_device_op::{from_fn, join_all, DeviceOp, ExecutionContext};
use cuflow_runtime::{DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};

use super::{alloc, check_device, TensorResult};
use crate::dtype::{cuda_defs, cuda_prelude, DType};
use crate::op::{cached_kernel, cached_kernel2, TensorOp};
use crate::tensor::{Tensor, TensorInput, TensorRef};

/// The element types of index tensors: `u8`, `u32`, `i32`, `i64`.
pub trait IndexDType: DType {}

impl IndexDType for u8 {}
impl IndexDType for u32 {}
impl IndexDType for i32 {}
impl IndexDType for i64 {}

fn invalid(op: &'static str, reason: String) -> DeviceError {
    DeviceError::InvalidShape { op, reason }
}

/// Refuses an axis past the last of a tensor of `rank` axes (`bound` = `rank`, or `rank + 1`
/// where a new axis may be inserted).
fn check_axis(
    op: &'static str,
    axis: usize,
    bound: usize,
    shape: &[usize],
) -> Result<(), DeviceError> {
    if axis < bound {
        return Ok(());
    }
    Err(invalid(
        op,
        format!(
            "axis {axis} is out of range for {shape:?} (axes 0..{bound}{})",
            if bound > shape.len() {
                ", counting the new one"
            } else {
                ""
            }
        ),
    ))
}

/// The `(outer, len, inner)` of `shape` around `axis`.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

fn grid(stream: &Stream, n: usize) -> LaunchConfig {
    let sms = crate::kernels::multiprocessors(stream);
    LaunchConfig::linear(n.div_ceil(256).clamp(1, sms * 32) as u32, 256)
}

fn copy_cols_kernel<T: DType>() -> Kernel {
    cached_kernel("copy_cols", T::NAME, || {
        let name = format!("copy_cols_{}", T::NAME);
        let source = format!(
            r#"{prelude}
typedef unsigned long long u64;
extern "C" __global__ void {name}(T* out, const T* x, unsigned long long outer,
                                  unsigned long long cols, unsigned long long out_cols,
                                  unsigned long long offset) {{
  u64 n = outer * cols;
  for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < n;
       k += (u64)blockDim.x * gridDim.x) {{
    u64 o = k / cols, c = k - o * cols;
    out[o * out_cols + offset + c] = x[k];
  }}
}}
"#,
            prelude = cuda_prelude::<T>()
        );
        crate::op::builtin_kernel(name, source).with_host(|args| {
            let x = args.input::<T>(1)?;
            let cols = args.scalar::<u64>(3)? as usize;
            let out_cols = args.scalar::<u64>(4)? as usize;
            let offset = args.scalar::<u64>(5)? as usize;
            let out = args.output::<T>(0)?;
            for (o, row) in x.chunks(cols.max(1)).enumerate() {
                let start = o * out_cols + offset;
                out[start..start + row.len()].copy_from_slice(row);
            }
            Ok(())
        })
    })
}

fn select_kernel<T: DType, I: IndexDType>() -> Kernel {
    cached_kernel2("index_select", T::NAME, I::NAME, || {
        let (t, i) = (T::NAME, I::NAME);
        let name = format!("index_select_{t}_{i}");
        let defs = if t == i {
            cuda_defs::<T>()
        } else {
            format!("{}{}", cuda_defs::<T>(), cuda_defs::<I>())
        };
        let source = format!(
            r#"{defs}
typedef unsigned long long u64;
extern "C" __global__ void {name}(T_{t}* out, const T_{t}* x, const T_{i}* idx,
                                  unsigned long long outer, unsigned long long len,
                                  unsigned long long n, unsigned long long inner,
                                  int per_element) {{
  u64 total = outer * n * inner;
  for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < total;
       k += (u64)blockDim.x * gridDim.x) {{
    u64 r = k / inner, i = k - r * inner;
    u64 o = r / n, j = r - o * n;
    long long id = (long long)idx[per_element ? k : j];
    out[k] = (id >= 0 && (u64)id < len) ? x[(o * len + (u64)id) * inner + i]
                                        : st_{t}((A_{t})0);
  }}
}}
"#
        );
        crate::op::builtin_kernel(name, source).with_host(|args| {
            let x = args.input::<T>(1)?;
            let idx = args.input::<I>(2)?;
            let len = args.scalar::<u64>(4)? as usize;
            let n = args.scalar::<u64>(5)? as usize;
            let inner = args.scalar::<u64>(6)? as usize;
            let per_element = args.scalar::<i32>(7)? != 0;
            let out = args.output::<T>(0)?;
            for (k, o_k) in out.iter_mut().enumerate() {
                let (r, i) = (k / inner, k % inner);
                let (o, j) = (r / n, r % n);
                let id = idx[if per_element { k } else { j }]
                    .to_i128()
                    .and_then(|id| usize::try_from(id).ok())
                    .filter(|id| *id < len);
                *o_k = match id {
                    Some(id) => x[(o * len + id) * inner + i],
                    None => T::default(),
                };
            }
            Ok(())
        })
    })
}

/// Runs every input together on the context's device and checks each is there. They are
/// given as they are: their shapes are checked before [`dense_all`] copies any view.
fn run_inputs<T: DType, X: TensorInput<T>>(
    op: &'static str,
    inputs: Vec<X>,
    ctx: &mut ExecutionContext,
) -> Result<(Vec<X::Value>, Stream), DeviceError> {
    let all = join_all(inputs.into_iter().map(TensorInput::into_op).collect());
    let values = ctx.with_same_device(|ctx| all.execute(ctx))?;
    let stream = ctx.stream()?.clone();
    for v in &values {
        check_device(op, &stream, v.tensor())?;
    }
    Ok((values, stream))
}

/// The tensors as dense tensors: views copied on `stream`, others shared.
fn dense_all<T: DType>(
    op: &'static str,
    stream: &Stream,
    parts: &[&Tensor<T>],
) -> Result<Vec<Tensor<T>>, DeviceError> {
    parts
        .iter()
        .map(|x| Ok(super::dense(op, stream, x)?.into_owned()))
        .collect()
}

/// Copies each tensor's `[outer, cols_k]` block into its column range of `out`
/// (`[outer, Σ cols_k]`).
fn copy_blocks<T: DType>(
    stream: &Stream,
    out: &Tensor<T>,
    parts: &[&Tensor<T>],
    outer: usize,
) -> Result<(), DeviceError> {
    let out_cols = out.numel().checked_div(outer).unwrap_or(0);
    let mut offset = 0;
    for x in parts {
        let cols = x.numel().checked_div(outer).unwrap_or(0);
        if x.numel() > 0 {
            if outer == 1 {
                out.view("concat")?
                    .slice(offset..offset + cols)?
                    .copy_from(stream, x.view("concat")?)?;
            } else {
                copy_cols_kernel::<T>().launch(
                    stream,
                    grid(stream, x.numel()),
                    KernelArgs::new()
                        .output(out.view("concat")?)
                        .input(x.view("concat")?)
                        .scalar(outer as u64)
                        .scalar(cols as u64)
                        .scalar(out_cols as u64)
                        .scalar(offset as u64),
                )?;
            }
        }
        offset += cols;
    }
    Ok(())
}

/// The tensors joined along an existing `axis`: their shapes must agree on every other axis,
/// and the output's `axis` is the sum of theirs.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `concat` (when run) for no inputs, an axis out of
/// range, ranks that differ, or shapes that differ on another axis (naming it and both
/// sizes); [`DeviceError::DeviceMismatch`] for an input on another device.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::{api, kernels};
/// let a = api::from_vec(vec![1, 2, 3, 4], &[2, 2]).sync()?;
/// let b = api::from_vec(vec![5, 6], &[2, 1]).sync()?;
/// let c = kernels::concat(vec![&a, &b], 1).sync()?;
/// assert_eq!(c.shape(), &[2, 3]);
/// assert_eq!(c.to_host_vec()?, vec![1, 2, 5, 3, 4, 6]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn concat<T: DType, X: TensorInput<T>>(
    inputs: Vec<X>,
    axis: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let (values, stream) = run_inputs("concat", inputs, ctx)?;
        let parts: Vec<&Tensor<T>> = values.iter().map(TensorRef::tensor).collect();
        let Some(first) = parts.first() else {
            return Err(invalid("concat", "needs at least one tensor".into()));
        };
        let rank = first.ndim();
        check_axis("concat", axis, rank, first.shape())?;
        let mut shape = first.shape().to_vec();
        shape[axis] = 0;
        for (k, x) in parts.iter().enumerate() {
            if x.ndim() != rank {
                return Err(invalid(
                    "concat",
                    format!(
                        "input {k} {:?} has {} axes but input 0 {:?} has {rank}",
                        x.shape(),
                        x.ndim(),
                        first.shape()
                    ),
                ));
            }
            if let Some(d) = (0..rank).find(|&d| d != axis && x.shape()[d] != first.shape()[d]) {
                return Err(invalid(
                    "concat",
                    format!(
                        "input {k} {:?} and input 0 {:?} differ along axis {d} ({} vs {}); only \
                         the concatenated axis {axis} may differ",
                        x.shape(),
                        first.shape(),
                        x.shape()[d],
                        first.shape()[d]
                    ),
                ));
            }
            shape[axis] = shape[axis]
                .checked_add(x.shape()[axis])
                .ok_or_else(|| invalid("concat", format!("axis {axis} overflows usize")))?;
        }
        let out = alloc::<T>("concat", &stream, &shape)?;
        let dense = dense_all("concat", &stream, &parts)?;
        let parts: Vec<&Tensor<T>> = dense.iter().collect();
        copy_blocks(&stream, &out, &parts, around(&shape, axis).0)?;
        Ok(out)
    })
}

/// The tensors, all of one shape, joined along a new `axis` (`0..=rank`) of length the number
/// of inputs.
///
/// # Errors
///
/// As [`concat()`], naming `stack`; every input must have the same shape.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::{api, kernels};
/// let a = api::from_vec(vec![1.0f32, 2.0], &[2]).sync()?;
/// let b = api::from_vec(vec![3.0f32, 4.0], &[2]).sync()?;
/// let s = kernels::stack(vec![a, b], 1).sync()?;
/// assert_eq!(s.shape(), &[2, 2]);
/// assert_eq!(s.to_host_vec()?, vec![1.0, 3.0, 2.0, 4.0]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn stack<T: DType, X: TensorInput<T>>(
    inputs: Vec<X>,
    axis: usize,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let (values, stream) = run_inputs("stack", inputs, ctx)?;
        let parts: Vec<&Tensor<T>> = values.iter().map(TensorRef::tensor).collect();
        let Some(first) = parts.first() else {
            return Err(invalid("stack", "needs at least one tensor".into()));
        };
        check_axis("stack", axis, first.ndim() + 1, first.shape())?;
        if let Some((k, x)) = parts
            .iter()
            .enumerate()
            .find(|(_, x)| x.shape() != first.shape())
        {
            let d = (0..first.ndim().max(x.ndim()))
                .find(|&d| x.shape().get(d) != first.shape().get(d))
                .unwrap_or(0);
            return Err(invalid(
                "stack",
                format!(
                    "input {k} {:?} and input 0 {:?} differ (first along axis {d}); stacked \
                     tensors must have the same shape",
                    x.shape(),
                    first.shape()
                ),
            ));
        }
        let mut shape = first.shape().to_vec();
        shape.insert(axis, parts.len());
        let out = alloc::<T>("stack", &stream, &shape)?;
        let dense = dense_all("stack", &stream, &parts)?;
        let parts: Vec<&Tensor<T>> = dense.iter().collect();
        copy_blocks(&stream, &out, &parts, around(&shape, axis).0)?;
        Ok(out)
    })
}

/// Launches the index kernel: `out` (`[outer, n, inner]`) from `x` (`[outer, len, inner]`).
fn launch_select<T: DType, I: IndexDType>(
    stream: &Stream,
    out: &Tensor<T>,
    x: &Tensor<T>,
    idx: &Tensor<I>,
    (outer, len, n, inner): (usize, usize, usize, usize),
    per_element: bool,
) -> Result<(), DeviceError> {
    if out.numel() == 0 {
        return Ok(());
    }
    select_kernel::<T, I>().launch(
        stream,
        grid(stream, out.numel()),
        KernelArgs::new()
            .output(out.view("index_select")?)
            .input(x.view("index_select")?)
            .input(idx.view("index_select")?)
            .scalar(outer as u64)
            .scalar(len as u64)
            .scalar(n as u64)
            .scalar(inner as u64)
            .scalar(i32::from(per_element)),
    )
}

/// What [`run_indexed`] gives: the output, and the inputs to compute it (none when it is
/// empty).
type Indexed<T, I> = (Tensor<T>, Option<(Tensor<T>, Tensor<I>, Stream)>);

/// Runs `x` and `index` together, checks them (device, axis, then `check_shapes` on them as
/// given), allocates the output of the shape `out_shape` gives, and then gives the inputs as
/// dense tensors (views copied on the executing stream, once their shapes are known to fit),
/// unless the output is empty: then nothing reads them, and no view is copied.
fn run_indexed<T: DType, I: IndexDType, X: TensorInput<T>, J: TensorInput<I>>(
    op: &'static str,
    (x, index): (X, J),
    axis: usize,
    check_shapes: impl FnOnce(&Tensor<T>, &Tensor<I>) -> Result<(), DeviceError>,
    out_shape: impl FnOnce(&Tensor<T>, &Tensor<I>) -> Vec<usize>,
    ctx: &mut ExecutionContext,
) -> Result<Indexed<T, I>, DeviceError> {
    let both = Zip2::new(x.into_op(), index.into_op());
    let (x, index) = ctx.with_same_device(|ctx| both.execute(ctx))?;
    let stream = ctx.stream()?.clone();
    check_device(op, &stream, x.tensor())?;
    check_device(op, &stream, index.tensor())?;
    check_axis(op, axis, x.tensor().ndim(), x.tensor().shape())?;
    check_shapes(x.tensor(), index.tensor())?;
    let out = alloc::<T>(op, &stream, &out_shape(x.tensor(), index.tensor()))?;
    if out.numel() == 0 {
        return Ok((out, None));
    }
    let x = super::dense(op, &stream, x.tensor())?.into_owned();
    let index = super::dense(op, &stream, index.tensor())?.into_owned();
    Ok((out, Some((x, index, stream))))
}

/// The entries of `x` at positions `indices` (1-D, any [`IndexDType`]) along `axis`: the
/// output is `x`'s shape with `axis` of length `indices.len()`, and
/// `out[.., j, ..] = x[.., indices[j], ..]`.
///
/// # Out-of-range indices
///
/// **An index outside `0..x.shape[axis]` is not an error: it gives zeros** in its slot of the
/// output, on both backends. Negative indices count as out of range (they do not count from
/// the end as in NumPy). The indices live on the device, often written by an earlier kernel,
/// so checking them would mean waiting for the device and reading them back; the op stays
/// lazy and capturable instead. Check indices of uncertain origin before the op (e.g. with
/// [`kernels::ge`](crate::kernels::ge) and [`kernels::max_axis`](crate::kernels::max_axis)).
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `index_select` (when run) for an axis out of range or
/// an index tensor that is not 1-D; [`DeviceError::DeviceMismatch`] for a tensor on another
/// device.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::{api, kernels};
/// let x = api::from_vec(vec![1, 2, 3, 4, 5, 6], &[2, 3]).sync()?;
/// let idx = api::from_vec(vec![2u32, 0, 2], &[3]).sync()?;
/// let y = kernels::index_select(&x, 1, &idx).sync()?;
/// assert_eq!(y.to_host_vec()?, vec![3, 1, 3, 6, 4, 6]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn index_select<T: DType, I: IndexDType, X: TensorInput<T>, J: TensorInput<I>>(
    x: X,
    axis: usize,
    indices: J,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let one_dim = |_: &Tensor<T>, indices: &Tensor<I>| match indices.shape() {
            [_] => Ok(()),
            other => Err(invalid(
                "index_select",
                format!("the indices must be 1-D, got {other:?}"),
            )),
        };
        let shape = |x: &Tensor<T>, indices: &Tensor<I>| {
            let mut shape = x.shape().to_vec();
            shape[axis] = indices.numel();
            shape
        };
        let (out, inputs) = run_indexed("index_select", (x, indices), axis, one_dim, shape, ctx)?;
        let Some((x, indices, stream)) = inputs else {
            return Ok(out);
        };
        let n = indices.numel();
        let (outer, len, inner) = around(x.shape(), axis);
        launch_select(&stream, &out, &x, &indices, (outer, len, n, inner), false)?;
        Ok(out)
    })
}

/// PyTorch's `gather`: `out[i][j][k] = x[i][index[i][j][k]][k]` for `axis = 1` (likewise on
/// any axis). `index` has `x`'s rank and `x`'s lengths on every axis but `axis`; the output
/// has `index`'s shape.
///
/// # Out-of-range indices
///
/// **An index outside `0..x.shape[axis]` (negative ones included) is not an error: its output
/// element is zero**, on both backends, as for [`index_select`].
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] naming `gather` (when run) for an axis out of range, an
/// index of another rank or of another length on an axis other than `axis` (naming it and
/// both sizes); [`DeviceError::DeviceMismatch`] for a tensor on another device.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::{api, kernels};
/// let x = api::from_vec(vec![10, 11, 12, 20, 21, 22], &[2, 3]).sync()?;
/// let idx = api::from_vec(vec![2i64, 2, 0, 1], &[2, 2]).sync()?;
/// let y = kernels::gather(&x, 1, &idx).sync()?;
/// assert_eq!(y.to_host_vec()?, vec![12, 12, 20, 21]);
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
pub fn gather<T: DType, I: IndexDType, X: TensorInput<T>, J: TensorInput<I>>(
    x: X,
    axis: usize,
    index: J,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    from_fn(move |ctx: &mut ExecutionContext| {
        let shape = |_: &Tensor<T>, index: &Tensor<I>| index.shape().to_vec();
        let checks = check_gather_shapes(axis);
        let (out, inputs) = run_indexed("gather", (x, index), axis, checks, shape, ctx)?;
        let Some((x, index, stream)) = inputs else {
            return Ok(out);
        };
        let (outer, len, inner) = around(x.shape(), axis);
        let n = index.shape()[axis];
        launch_select(&stream, &out, &x, &index, (outer, len, n, inner), true)?;
        Ok(out)
    })
}

/// The shape check of [`gather()`]: `index` has `x`'s rank and its lengths but along `axis`.
fn check_gather_shapes<T: DType, I: IndexDType>(
    axis: usize,
) -> impl FnOnce(&Tensor<T>, &Tensor<I>) -> Result<(), DeviceError> {
    move |x, index| {
        if index.ndim() != x.ndim() {
            return Err(invalid(
                "gather",
                format!(
                    "the index {:?} has {} axes but the input {:?} has {}",
                    index.shape(),
                    index.ndim(),
                    x.shape(),
                    x.ndim()
                ),
            ));
        }
        if let Some(d) = (0..x.ndim()).find(|&d| d != axis && index.shape()[d] != x.shape()[d]) {
            return Err(invalid(
                "gather",
                format!(
                    "the index {:?} and the input {:?} differ along axis {d} ({} vs {}); only \
                     the gathered axis {axis} may differ",
                    index.shape(),
                    x.shape(),
                    index.shape()[d],
                    x.shape()[d]
                ),
            ));
        }
        Ok(())
    }
}

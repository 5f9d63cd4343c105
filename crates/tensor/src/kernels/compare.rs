//! Comparisons (`eq`, `ne`, `lt`, `le`, `gt`, `ge`) giving `u8` masks, `where_` selecting by
//! a mask, and `clamp`: the strided elementwise kernel ([`super::strided`]) with NumPy
//! broadcasting, reading views and broadcast operands in place.

use cuflow_device_op::ExecutionContext;
use cuflow_runtime::DeviceError;

use super::strided::{self, Elem, Operand, StridedEw};
use super::{alloc, TensorResult};
use crate::dtype::DType;
use crate::op::{strided_op, strided_op2, strided_op3, TensorOp};
use crate::tensor::TensorInput;
use crate::view::broadcast_shapes;

/// `cmp(x, y)` as a `u8` mask (1 where it holds, else 0) of the broadcast shape.
fn compare<T: DType, X: TensorInput<T>, Y: TensorInput<T>>(
    name: &'static str,
    expr: &'static str,
    host: fn(&T, &T) -> bool,
    x: X,
    y: Y,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<u8> + Send> {
    strided_op2(name, (x, y), move |stream, x, y| {
        let shape = broadcast_shapes(name, x.shape(), y.shape())?;
        let out = alloc::<u8>(name, stream, &shape)?;
        strided::broadcast2(stream, name, expr, Elem::Mask, x, y, &out, move |a, b| {
            u8::from(host(&a, &b))
        })?;
        Ok(out)
    })
}

macro_rules! compare_kernel {
    ($fn:ident, $what:literal, $expr:literal, $host:path, $want:literal) => {
        #[doc = concat!("`", $what, "` elementwise.")]
        ///
        /// The result is a `u8` mask of the shape `x` and `y` broadcast to (NumPy's rules):
        /// 1 where the comparison holds, 0 elsewhere. Comparisons with NaN are false, except
        /// `ne`, which is true.
        ///
        /// # Errors
        ///
        /// [`DeviceError::ShapeMismatch`](cuflow_runtime::DeviceError::ShapeMismatch) naming
        /// the axis where the shapes do not broadcast.
        ///
        /// # Examples
        ///
        /// ```
        /// use cuflow_device_op::DeviceOpExt;
        /// use cuflow_runtime::Device;
        /// use cuflow_tensor::{api, kernels};
        /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
        /// let stream = Device::host().new_stream()?;
        /// let x = api::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).sync_on(&stream)?;
        /// let y = api::from_vec(vec![2.0f32], &[1]).sync_on(&stream)?; // broadcast
        #[doc = concat!("let m = kernels::", stringify!($fn), "(&x, &y).sync_on(&stream)?;")]
        #[doc = concat!("assert_eq!(m.to_host_vec()?, vec!", $want, ");")]
        /// # Ok(()) }
        /// ```
        pub fn $fn<T: DType, X: TensorInput<T>, Y: TensorInput<T>>(
            x: X,
            y: Y,
        ) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<u8> + Send> {
            compare(stringify!($fn), $expr, $host, x, y)
        }
    };
}

compare_kernel!(eq, "x == y", "a == b", PartialEq::eq, "[0u8, 1, 0, 0]");
compare_kernel!(ne, "x != y", "a != b", PartialEq::ne, "[1u8, 0, 1, 1]");
compare_kernel!(lt, "x < y", "a < b", PartialOrd::lt, "[1u8, 0, 0, 0]");
compare_kernel!(le, "x <= y", "a <= b", PartialOrd::le, "[1u8, 1, 0, 0]");
compare_kernel!(gt, "x > y", "a > b", PartialOrd::gt, "[0u8, 0, 1, 1]");
compare_kernel!(ge, "x >= y", "a >= b", PartialOrd::ge, "[0u8, 1, 1, 1]");

/// A shape mismatch of `where_` with the arguments it is between named first (a mismatch of
/// `mask` is with the broadcast of `a` and `b`, a shape that is none of the arguments').
fn naming(e: DeviceError, args: String) -> DeviceError {
    match e {
        DeviceError::ShapeMismatch { op, what, lhs, rhs } => DeviceError::ShapeMismatch {
            op,
            what: format!("{args}: {what}"),
            lhs,
            rhs,
        },
        other => other,
    }
}

/// `a` where `mask` is nonzero, else `b`, elementwise; the three are broadcast to one shape
/// under NumPy's rules. Masks come from the comparisons ([`eq`], [`lt`], ...).
///
/// # Errors
///
/// [`DeviceError::ShapeMismatch`](cuflow_runtime::DeviceError::ShapeMismatch) naming the axis where the shapes do not broadcast.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, kernels};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let x = api::from_vec(vec![-1.0f32, 2.0, -3.0], &[3]).sync_on(&stream)?;
/// let zero = api::zeros::<f32>(&[1]).sync_on(&stream)?;
/// let positive = kernels::gt(&x, &zero).sync_on(&stream)?;
/// let relu = kernels::where_(&positive, &x, &zero).sync_on(&stream)?;
/// assert_eq!(relu.to_host_vec()?, vec![0.0, 2.0, 0.0]);
/// # Ok(()) }
/// ```
pub fn where_<T: DType, M: TensorInput<u8>, A: TensorInput<T>, B: TensorInput<T>>(
    mask: M,
    a: A,
    b: B,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    strided_op3("where_", (mask, a, b), move |stream, m, a, b| {
        let ab = broadcast_shapes("where_", a.shape(), b.shape())
            .map_err(|e| naming(e, format!("`a` {:?} and `b` {:?}", a.shape(), b.shape())))?;
        let shape = broadcast_shapes("where_", m.shape(), &ab).map_err(|e| {
            naming(
                e,
                format!(
                    "`mask` {:?} and the shape {ab:?} that `a` {:?} and `b` {:?} broadcast to",
                    m.shape(),
                    a.shape(),
                    b.shape()
                ),
            )
        })?;
        let out = alloc::<T>("where_", stream, &shape)?;
        let kernel = StridedEw {
            name: "where",
            expr: "a ? b : c",
            inputs: &[Elem::Mask, Elem::T, Elem::T],
            out: Elem::T,
        }
        .kernel::<T>(|args, layout| {
            let m = args.input::<u8>(1)?;
            let (a, b) = (args.input::<T>(2)?, args.input::<T>(3)?);
            for (((o, i), j), k) in args
                .output::<T>(0)?
                .iter_mut()
                .zip(layout.offsets(0))
                .zip(layout.offsets(1))
                .zip(layout.offsets(2))
            {
                *o = if m[i] != 0 { a[j] } else { b[k] };
            }
            Ok(())
        });
        let mo = Operand::broadcast(stream, m, &shape)?;
        let (ao, bo) = (
            Operand::broadcast(stream, a, &shape)?,
            Operand::broadcast(stream, b, &shape)?,
        );
        let (mv, av, bv) = (mo.view(&shape)?, ao.view(&shape)?, bo.view(&shape)?);
        strided::launch(
            stream,
            &kernel,
            "where_",
            out.view("where_")?,
            &shape,
            &[&mo.strides, &ao.strides, &bo.strides],
            |args| {
                args.input(mv).input(av).input(bv);
            },
            T::default(),
            T::default(),
        )?;
        Ok(out)
    })
}

/// `x` limited to `[min, max]` elementwise: `min` below it, `max` above it (`max` everywhere
/// when `min > max`, as PyTorch), NaN kept. Reads views in place.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, kernels};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let stream = Device::host().new_stream()?;
/// let x = api::from_vec(vec![-2.0f32, 0.5, 3.0], &[3]).sync_on(&stream)?;
/// let c = kernels::clamp(&x, -1.0, 1.0).sync_on(&stream)?;
/// assert_eq!(c.to_host_vec()?, vec![-1.0, 0.5, 1.0]);
/// # Ok(()) }
/// ```
pub fn clamp<T: DType, X: TensorInput<T>>(
    x: X,
    min: T,
    max: T,
) -> TensorOp<impl FnOnce(&mut ExecutionContext) -> TensorResult<T> + Send> {
    strided_op("clamp", x, move |stream, x| {
        let out = alloc::<T>("clamp", stream, x.shape())?;
        let kernel = StridedEw {
            name: "clamp",
            expr: "(a < s ? s : a) > t ? t : (a < s ? s : a)",
            inputs: &[Elem::T],
            out: Elem::T,
        }
        .kernel::<T>(|args, layout| {
            let a = args.input::<T>(1)?;
            let s = args.scalar::<T>(layout.scalars)?;
            let t = args.scalar::<T>(layout.scalars + 1)?;
            for (o, i) in args.output::<T>(0)?.iter_mut().zip(layout.offsets(0)) {
                let lo = if a[i] < s { s } else { a[i] };
                *o = if lo > t { t } else { lo };
            }
            Ok(())
        });
        let xo = Operand::broadcast(stream, x, x.shape())?;
        let xv = xo.view(x.shape())?;
        strided::launch(
            stream,
            &kernel,
            "clamp",
            out.view("clamp")?,
            x.shape(),
            &[&xo.strides],
            |args| {
                args.input(xv);
            },
            min,
            max,
        )?;
        Ok(out)
    })
}

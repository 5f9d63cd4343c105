//! `Display` for [`Tensor`]: PyTorch-like nested brackets, elided for large tensors, followed
//! by the shape, the dtype and the device.
//!
//! Printing reads the tensor back (as [`Tensor::to_host_vec`] does: after all queued work that
//! used it), so it waits for the device. A failed readback prints an error marker in place of
//! the elements; formatting never panics.

use std::fmt;

use cuflow_runtime::DeviceError;

use crate::dtype::DType;
use crate::tensor::Tensor;

/// Tensors with more elements than this are printed elided.
pub(crate) const ELIDE_ABOVE: usize = 1000;

/// The elements shown at each end of an elided axis.
pub(crate) const EDGE_ITEMS: usize = 3;

/// The digits after the point of floating-point elements, unless the format asks for others.
const DEFAULT_PRECISION: usize = 4;

/// The printed tensor's indices along an axis of length `len`: all, or the first and last
/// [`EDGE_ITEMS`] around a gap (`None`).
fn shown(len: usize, elide: bool) -> Vec<Option<usize>> {
    if elide && len > 2 * EDGE_ITEMS {
        (0..EDGE_ITEMS)
            .map(Some)
            .chain([None])
            .chain((len - EDGE_ITEMS..len).map(Some))
            .collect()
    } else {
        (0..len).map(Some).collect()
    }
}

/// The number of leading axes of length 1 of `shape`. Printing steps over them at once, so
/// that its recursion goes one level per longer axis (at most 64 of them, their product
/// fitting in `usize`), however many axes of length 1 a view has.
fn unit_axes(shape: &[usize]) -> usize {
    shape.iter().take_while(|&&d| d == 1).count()
}

/// How the elements of one tensor print: their text by index into `data` (the part of the
/// buffer the tensor covers, read through `strides`), padded to the width of the widest
/// element shown.
struct Cells<'a, T> {
    data: &'a [T],
    strides: &'a [usize],
    precision: usize,
    elide: bool,
    width: usize,
}

impl<T: DType> Cells<'_, T> {
    fn text(&self, i: usize) -> String {
        let Some(v) = self.data.get(i) else {
            return "?".to_string();
        };
        match v.to_i128() {
            Some(int) => int.to_string(),
            None => format!("{:.*}", self.precision, v.to_f64()),
        }
    }

    /// Calls `f` with the index in `data` of every element shown.
    fn visit(&self, shape: &[usize], base: usize, f: &mut impl FnMut(usize)) {
        // Leading axes of length 1 add nothing to the index.
        let shape = &shape[unit_axes(shape)..];
        let Some((&len, rest)) = shape.split_first() else {
            f(base);
            return;
        };
        let step = self.strides[self.strides.len() - shape.len()];
        for i in shown(len, self.elide).into_iter().flatten() {
            self.visit(rest, base + i * step, f);
        }
    }

    /// Writes the elements under `shape` from index `base` of `data`, nested lines indented
    /// by `indent` columns.
    fn render(&self, out: &mut String, shape: &[usize], base: usize, indent: usize) {
        // Leading axes of length 1 hold one item each: their brackets, around the rest.
        let units = unit_axes(shape);
        if units > 0 {
            out.push_str(&"[".repeat(units));
            self.render(out, &shape[units..], base, indent + units);
            out.push_str(&"]".repeat(units));
            return;
        }
        let Some((&len, rest)) = shape.split_first() else {
            out.push_str(&format!("{:>w$}", self.text(base), w = self.width));
            return;
        };
        let step = self.strides[self.strides.len() - shape.len()];
        out.push('[');
        for (k, item) in shown(len, self.elide).into_iter().enumerate() {
            if k > 0 {
                out.push(',');
                if rest.is_empty() {
                    out.push(' ');
                } else {
                    out.push_str(&"\n".repeat(rest.len()));
                    out.push_str(&" ".repeat(indent + 1));
                }
            }
            match item {
                Some(i) => self.render(out, rest, base + i * step, indent + 1),
                None => out.push_str("..."),
            }
        }
        out.push(']');
    }
}

/// The body of a tensor's printout (the part between `tensor(` and the shape), from the part
/// of the buffer it covers (`data`, from its first element) and its strides. Only the
/// elements shown are read, so a large [expanded](Tensor::expand) view prints without being
/// gathered.
fn body<T: DType>(data: &[T], shape: &[usize], strides: &[usize], precision: usize) -> String {
    if shape.contains(&0) {
        return "[]".to_string();
    }
    let mut cells = Cells {
        data,
        strides,
        precision,
        elide: shape.iter().product::<usize>() > ELIDE_ABOVE,
        width: 0,
    };
    let mut width = 0;
    cells.visit(shape, 0, &mut |i| width = width.max(cells.text(i).len()));
    cells.width = width;
    let mut out = String::new();
    cells.render(&mut out, shape, 0, "tensor(".len());
    out
}

/// Prints the tensor as PyTorch does, with its shape, dtype and device:
///
/// ```text
/// tensor([[ 1.0000, -2.0000],
///         [ 3.5000,  4.0000]], shape=[2, 2], dtype=f32, device=host)
/// ```
///
/// Floating-point elements print with 4 digits after the point, or the format's precision
/// (`{:.2}`); integers in full. A tensor of more than 1000 elements prints only the first and
/// last 3 entries of each longer axis, with `...` between.
///
/// **Printing reads the tensor back from its device**: it waits for every piece of queued work
/// that used the tensor, then copies the part of its buffer it covers to the host, like
/// [`Tensor::to_host_vec`] (a large [expanded](Tensor::expand) view is not gathered: only the
/// elements shown are looked up). If that readback fails (e.g. the work writing the tensor failed), the elements are replaced by
/// `<readback failed: ...>` naming the error; printing never panics.
///
/// # Examples
///
/// ```
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_tensor::api;
/// let t = api::from_vec(vec![1i32, -20, 3, 4], &[2, 2]).sync()?;
/// assert_eq!(
///     t.to_string(),
///     format!("tensor([[  1, -20],\n        [  3,   4]], shape=[2, 2], dtype=i32, device={})", t.device()),
/// );
/// let x = api::from_vec(vec![0.5f32, 0.25], &[2]).sync()?;
/// assert!(format!("{x:.2}").starts_with("tensor([0.50, 0.25], shape=[2], dtype=f32"));
/// # Ok::<(), cuflow_runtime::DeviceError>(())
/// ```
impl<T: DType> fmt::Display for Tensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The part of the buffer the tensor covers, read as `to_host_vec` reads it.
        let readback = match self.buffer().last_stream() {
            Some(s) => Ok(s),
            None => self.device().new_stream(),
        }
        .and_then(|stream| self.span_host_vec(&stream));
        printout(f, readback, self.shape(), self.strides(), self.device())
    }
}

/// Writes the printout of a tensor of `shape` and `strides` on `device` from the readback of
/// the part of its buffer it covers.
fn printout<T: DType>(
    f: &mut fmt::Formatter<'_>,
    readback: Result<Vec<T>, DeviceError>,
    shape: &[usize],
    strides: &[usize],
    device: &dyn fmt::Display,
) -> fmt::Result {
    let body = match readback {
        Ok(data) => body(
            &data,
            shape,
            strides,
            f.precision().unwrap_or(DEFAULT_PRECISION),
        ),
        Err(e) => format!("<readback failed: {e}>"),
    };
    write!(
        f,
        "tensor({body}, shape={shape:?}, dtype={}, device={device})",
        T::NAME
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_print_bare() {
        assert_eq!(body(&[2.5f32], &[], &[], 4), "2.5000");
    }

    /// A tensor whose readback fails prints the error in place of its elements.
    struct Failed;

    impl fmt::Display for Failed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let err = DeviceError::InvalidShape {
                op: "test",
                reason: "no data".to_string(),
            };
            printout::<f32>(f, Err(err), &[2, 3], &[3, 1], &"host")
        }
    }

    #[test]
    fn failed_readback_prints_a_marker() {
        let text = Failed.to_string();
        assert!(text.starts_with("tensor(<readback failed: "), "{text}");
        assert!(text.contains("no data"), "{text}");
        assert!(
            text.ends_with(">, shape=[2, 3], dtype=f32, device=host)"),
            "{text}"
        );
    }

    #[test]
    fn short_axes_are_not_elided() {
        let data: Vec<i32> = (0..1000).collect();
        let text = body(&data, &[1000], &[1], 4);
        assert!(!text.contains("..."));
        assert!(text.ends_with("998, 999]"));
    }
}

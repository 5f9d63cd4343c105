//! `Display` for [`Tensor`]: PyTorch-like nested brackets, elided for large tensors, followed
//! by the shape, the dtype and the device.
//!
//! Printing reads the shown elements back (after all queued work that used the tensor, as
//! [`Tensor::to_host_vec`] does), so it waits for the device. It shows at most [`MAX_CELLS`]
//! elements however many axes the tensor has, and reads back only those (in runs of nearby
//! elements), never the whole buffer. A failed readback prints an error marker in place of the
//! elements; formatting never panics.

use std::fmt;

use cuflow_runtime::{DeviceError, Stream};

use crate::dtype::DType;
use crate::tensor::Tensor;

/// Tensors with more elements than this are printed elided.
pub(crate) const ELIDE_ABOVE: usize = 1000;

/// The elements shown at each end of an elided axis.
pub(crate) const EDGE_ITEMS: usize = 3;

/// The most elements a printout shows: past it, more axes are elided (to their first and last
/// entries, then to their first), outermost first.
pub(crate) const MAX_CELLS: usize = 1000;

/// Elements shown less than this far apart in the buffer are read back in one copy.
const READ_GAP: usize = 64;

/// The digits after the point of floating-point elements, unless the format asks for others.
const DEFAULT_PRECISION: usize = 4;

/// What an axis shows: every entry, the first and last `n`, or the first only.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shown {
    All,
    Edges(usize),
    First,
}

impl Shown {
    /// The entries shown of an axis of length `len`.
    fn count(self, len: usize) -> usize {
        match self {
            Shown::All => len,
            Shown::Edges(n) => len.min(2 * n),
            Shown::First => len.min(1),
        }
    }

    /// The indices shown of an axis of length `len`, `None` marking a gap.
    fn indices(self, len: usize) -> Vec<Option<usize>> {
        let (head, tail) = match self {
            Shown::Edges(n) if 2 * n < len => (n, n),
            Shown::First if len > 1 => (1, 0),
            _ => return (0..len).map(Some).collect(),
        };
        (0..head)
            .map(Some)
            .chain([None])
            .chain((len - tail..len).map(Some))
            .collect()
    }
}

/// The indices shown along each axis of `shape`: all of them up to [`ELIDE_ABOVE`] elements;
/// beyond, the first and last [`EDGE_ITEMS`] of each longer axis; and while that still shows
/// more than [`MAX_CELLS`] elements, axes cut to their first and last entries, then to their
/// first, outermost first.
fn shown_indices(shape: &[usize]) -> Vec<Vec<Option<usize>>> {
    if shape.contains(&0) {
        // No element to show: no axis lists its indices (one may be far too long to list).
        return vec![Vec::new(); shape.len()];
    }
    let numel = shape.iter().fold(1usize, |n, &d| n.saturating_mul(d));
    let mut shown: Vec<Shown> = shape
        .iter()
        .map(|&len| {
            if numel > ELIDE_ABOVE && len > 2 * EDGE_ITEMS {
                Shown::Edges(EDGE_ITEMS)
            } else {
                Shown::All
            }
        })
        .collect();
    let cells = |shown: &[Shown]| {
        shown
            .iter()
            .zip(shape)
            .fold(1usize, |n, (s, &len)| n.saturating_mul(s.count(len)))
    };
    for cut in [Shown::Edges(1), Shown::First] {
        for axis in 0..shape.len() {
            if cells(&shown) <= MAX_CELLS {
                break;
            }
            if cut.count(shape[axis]) < shown[axis].count(shape[axis]) {
                shown[axis] = cut;
            }
        }
    }
    shown
        .iter()
        .zip(shape)
        .map(|(s, &len)| s.indices(len))
        .collect()
}

/// The number of leading axes of length 1 of `shape`. Printing steps over them at once, so
/// that its recursion goes one level per longer axis (at most 64 of them, their product
/// fitting in `usize`), however many axes of length 1 a view has.
fn unit_axes(shape: &[usize]) -> usize {
    shape.iter().take_while(|&&d| d == 1).count()
}

/// The elements read back, by their index in the part of the buffer the tensor covers
/// (`Σ iₖ · strides[k]`), sorted by it.
struct Values<T> {
    at: Vec<usize>,
    values: Vec<T>,
}

impl<T: DType> Values<T> {
    fn get(&self, i: usize) -> Option<T> {
        let k = self.at.binary_search(&i).ok()?;
        self.values.get(k).copied()
    }
}

/// How a tensor's axes print: its strides and the indices shown along each.
struct Layout<'a> {
    strides: &'a [usize],
    shown: &'a [Vec<Option<usize>>],
}

impl Layout<'_> {
    /// The stride and the indices shown of the axis that `shape` (a tail of the tensor's
    /// shape, at least one axis long) starts with.
    fn axis(&self, shape: &[usize]) -> (usize, &[Option<usize>]) {
        let k = self.strides.len() - shape.len();
        (self.strides[k], &self.shown[k])
    }

    /// Calls `f` with the index of every element shown.
    fn visit(&self, shape: &[usize], base: usize, f: &mut impl FnMut(usize)) {
        // Leading axes of length 1 add nothing to the index.
        let shape = &shape[unit_axes(shape)..];
        let Some((_, rest)) = shape.split_first() else {
            f(base);
            return;
        };
        let (step, shown) = self.axis(shape);
        for i in shown.iter().flatten() {
            self.visit(rest, base + i * step, f);
        }
    }

    /// The indices of the elements shown, sorted, each once.
    fn indices(&self, shape: &[usize]) -> Vec<usize> {
        let mut at = Vec::new();
        if !shape.contains(&0) {
            self.visit(shape, 0, &mut |i| at.push(i));
        }
        at.sort_unstable();
        at.dedup();
        at
    }
}

/// The elements shown of `t`, read back on `stream`: one copy per run of indices less than
/// [`READ_GAP`] apart.
fn read_shown<T: DType>(
    t: &Tensor<T>,
    stream: &Stream,
    at: Vec<usize>,
) -> Result<Values<T>, DeviceError> {
    let mut values = Vec::with_capacity(at.len());
    let mut k = 0;
    while let Some(&first) = at.get(k) {
        let mut end = k + 1;
        while end < at.len() && at[end] - at[end - 1] < READ_GAP {
            end += 1;
        }
        let last = at[end - 1];
        let run = t
            .buffer()
            .slice(t.offset() + first..t.offset() + last + 1)?
            .to_host_vec(stream)?;
        values.extend(
            at[k..end]
                .iter()
                .filter_map(|&i| run.get(i - first).copied()),
        );
        k = end;
    }
    Ok(Values { at, values })
}

/// How the elements of one tensor print: their text, padded to the width of the widest element
/// shown.
struct Cells<'a, T> {
    values: &'a Values<T>,
    layout: Layout<'a>,
    precision: usize,
    width: usize,
}

impl<T: DType> Cells<'_, T> {
    fn text(&self, i: usize) -> String {
        let Some(v) = self.values.get(i) else {
            return "?".to_string();
        };
        match v.to_i128() {
            Some(int) => int.to_string(),
            None => format!("{:.*}", self.precision, v.to_f64()),
        }
    }

    /// Writes the elements under `shape` from index `base`, nested lines indented by `indent`
    /// columns.
    fn render(&self, out: &mut String, shape: &[usize], base: usize, indent: usize) {
        // Leading axes of length 1 hold one item each: their brackets, around the rest.
        let units = unit_axes(shape);
        if units > 0 {
            out.push_str(&"[".repeat(units));
            self.render(out, &shape[units..], base, indent + units);
            out.push_str(&"]".repeat(units));
            return;
        }
        let Some((_, rest)) = shape.split_first() else {
            out.push_str(&format!("{:>w$}", self.text(base), w = self.width));
            return;
        };
        let (step, shown) = self.layout.axis(shape);
        out.push('[');
        for (k, item) in shown.iter().enumerate() {
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

/// The body of a tensor's printout (the part between `tensor(` and the shape), from the
/// elements read back and the layout.
fn body<T: DType>(
    values: &Values<T>,
    shape: &[usize],
    layout: Layout<'_>,
    precision: usize,
) -> String {
    if shape.contains(&0) {
        return "[]".to_string();
    }
    let mut cells = Cells {
        values,
        layout,
        precision,
        width: 0,
    };
    let mut width = 0;
    cells
        .layout
        .visit(shape, 0, &mut |i| width = width.max(cells.text(i).len()));
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
/// last 3 entries of each longer axis, with `...` between; and at most 1000 elements in all:
/// where that still shows more (many short axes), axes are cut to their first and last entry,
/// then to their first, outermost first.
///
/// **Printing reads the tensor back from its device**: it waits for every piece of queued work
/// that used the tensor, then copies the elements shown to the host (in runs of nearby
/// elements: not the whole buffer, and a large [expanded](Tensor::expand) view is not
/// gathered). If that readback fails (e.g. the work writing the tensor failed), the elements
/// are replaced by `<readback failed: ...>` naming the error; printing never panics.
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
        let shown = shown_indices(self.shape());
        let layout = Layout {
            strides: self.strides(),
            shown: &shown,
        };
        let at = layout.indices(self.shape());
        let readback = match self.buffer().last_stream() {
            Some(s) => Ok(s),
            None => self.device().new_stream(),
        }
        .and_then(|stream| read_shown(self, &stream, at));
        printout(f, readback, self.shape(), layout, self.device())
    }
}

/// Writes the printout of a tensor of `shape` on `device` from the readback of the elements
/// `layout` shows.
fn printout<T: DType>(
    f: &mut fmt::Formatter<'_>,
    readback: Result<Values<T>, DeviceError>,
    shape: &[usize],
    layout: Layout<'_>,
    device: &dyn fmt::Display,
) -> fmt::Result {
    let body = match readback {
        Ok(values) => body(
            &values,
            shape,
            layout,
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

    /// The body of the printout of `data` as a tensor of `shape` and `strides`.
    fn body_of<T: DType>(data: &[T], shape: &[usize], strides: &[usize]) -> String {
        let shown = shown_indices(shape);
        let values = Values {
            at: (0..data.len()).collect(),
            values: data.to_vec(),
        };
        let layout = Layout {
            strides,
            shown: &shown,
        };
        body(&values, shape, layout, 4)
    }

    #[test]
    fn scalars_print_bare() {
        assert_eq!(body_of(&[2.5f32], &[], &[]), "2.5000");
    }

    /// A tensor whose readback fails prints the error in place of its elements.
    struct Failed;

    impl fmt::Display for Failed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let err = DeviceError::InvalidShape {
                op: "test",
                reason: "no data".to_string(),
            };
            let shown = shown_indices(&[2, 3]);
            let layout = Layout {
                strides: &[3, 1],
                shown: &shown,
            };
            printout::<f32>(f, Err(err), &[2, 3], layout, &"host")
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
        let text = body_of(&data, &[1000], &[1]);
        assert!(!text.contains("..."));
        assert!(text.ends_with("998, 999]"));
    }

    /// The cells shown stay under the cap however many short axes there are.
    #[test]
    fn many_short_axes_are_cut_to_the_cap() {
        for shape in [
            vec![4; 11],
            vec![6; 20],
            vec![2; 64],
            vec![3, 1000, 7, 7, 7],
        ] {
            let cells: usize = shown_indices(&shape)
                .iter()
                .map(|axis| axis.iter().flatten().count())
                .product();
            assert!(cells <= MAX_CELLS, "{shape:?} shows {cells} cells");
        }
        let cut = shown_indices(&[4; 11]);
        assert_eq!(cut[0], vec![Some(0), None]);
        assert_eq!(cut[10], vec![Some(0), None, Some(3)]);
        // Within the cap, nothing more is cut.
        assert_eq!(shown_indices(&[10, 100])[1].len(), 100);
        assert_eq!(shown_indices(&[50, 30])[0].len(), 7);
    }
}

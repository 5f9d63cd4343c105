//! Views: tensors over the buffer of another with other strides and an offset, made without
//! copying (`narrow`, `slice`, `select`, `permute`, `transpose`, `expand`, `squeeze`,
//! `unsqueeze`), and the stride arithmetic kernels over strided inputs share.
//!
//! A view holds the same `Arc` of the buffer as the tensor it was taken from, so its reads and
//! writes are ordered against every other user of that buffer exactly as the tensor's own:
//! the runtime orders accesses per buffer range, whichever tensor names them.
//!
//! Offsets never leave `usize`: a view with elements lies inside its buffer, so the offset of
//! any of its elements fits, and a view without elements starts at 0 (its offset would
//! otherwise grow with each narrow of an axis longer than any buffer, and overflow).

use std::ops::{Bound, Range, RangeBounds};

use cuflow_runtime::{BufferView, DeviceError};
use smallvec::SmallVec;

use crate::dtype::DType;
use crate::tensor::{numel, Shape, Tensor};

/// The most axes a strided kernel indexes, after merging the axes that can be merged.
pub(crate) const MAX_DIMS: usize = 8;

/// The number of buffer elements from a view's first element to its last, inclusive (0 for a
/// view without elements).
pub(crate) fn span(shape: &[usize], strides: &[usize]) -> usize {
    if shape.contains(&0) {
        return 0;
    }
    1 + shape
        .iter()
        .zip(strides)
        .map(|(&d, &s)| (d - 1) * s)
        .sum::<usize>()
}

/// A strided layout whose element offsets are visited in row-major order.
pub(crate) struct Strided<'a> {
    shape: &'a [usize],
    strides: &'a [usize],
    base: usize,
}

impl<'a> Strided<'a> {
    pub(crate) fn new(shape: &'a [usize], strides: &'a [usize], base: usize) -> Self {
        Strided {
            shape,
            strides,
            base,
        }
    }

    /// The offset of every element, in row-major order of the shape.
    pub(crate) fn offsets(&self) -> impl Iterator<Item = usize> + 'a {
        let (shape, strides, base) = (self.shape, self.strides, self.base);
        let n: usize = shape.iter().product();
        let mut index: SmallVec<[usize; MAX_DIMS]> = SmallVec::from_elem(0, shape.len());
        let mut offset = base;
        (0..n).map(move |k| {
            if k > 0 {
                // Step the row-major index: carry from the last axis.
                for a in (0..shape.len()).rev() {
                    index[a] += 1;
                    offset += strides[a];
                    if index[a] < shape[a] {
                        break;
                    }
                    offset -= strides[a] * shape[a];
                    index[a] = 0;
                }
            }
            offset
        })
    }
}

/// `shape` with the strides of `operands` (each over `shape`), merged where every operand
/// steps over two neighbouring axes as over one, axes of length 1 dropped: the fewest axes
/// that index the same elements. A shape without elements gives `[0]`; a scalar gives `[]`.
pub(crate) fn collapse<const N: usize>(
    shape: &[usize],
    operands: [&[usize]; N],
) -> (Shape, [Shape; N]) {
    if shape.contains(&0) {
        return (
            SmallVec::from_elem(0, 1),
            std::array::from_fn(|_| SmallVec::from_elem(0, 1)),
        );
    }
    let mut out_shape = Shape::new();
    let mut out_strides: [Shape; N] = std::array::from_fn(|_| Shape::new());
    for a in 0..shape.len() {
        let d = shape[a];
        if d == 1 {
            continue;
        }
        let merges = out_shape.last().is_some_and(|_| {
            operands
                .iter()
                .zip(&out_strides)
                .all(|(s, o)| o.last().copied() == Some(s[a] * d))
        });
        if merges {
            if let Some(last) = out_shape.last_mut() {
                *last *= d;
            }
            for (o, s) in out_strides.iter_mut().zip(operands) {
                if let Some(last) = o.last_mut() {
                    *last = s[a];
                }
            }
        } else {
            out_shape.push(d);
            for (o, s) in out_strides.iter_mut().zip(operands) {
                o.push(s[a]);
            }
        }
    }
    (out_shape, out_strides)
}

/// The shape `a` and `b` broadcast to under NumPy's rules: aligned at the last axis, each pair
/// of lengths equal or one of them 1. The error names `op` and the first axis (of the result)
/// where they disagree.
pub(crate) fn broadcast_shapes(
    op: &'static str,
    a: &[usize],
    b: &[usize],
) -> Result<Shape, DeviceError> {
    let rank = a.len().max(b.len());
    let mut out: Shape = SmallVec::from_elem(1, rank);
    for (axis, o) in out.iter_mut().enumerate() {
        let da = (axis + a.len()).checked_sub(rank).map_or(1, |i| a[i]);
        let db = (axis + b.len()).checked_sub(rank).map_or(1, |i| b[i]);
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(DeviceError::shape_mismatch(
                    op,
                    format!(
                        "the shapes do not broadcast: along axis {axis} of the result one has \
                         {da} elements and the other {db} (lengths must be equal or 1)"
                    ),
                    a,
                    b,
                ))
            }
        };
    }
    numel(op, &out)?;
    Ok(out)
}

/// The strides of a tensor of `shape` and `strides` read as `out` (a shape it broadcasts to,
/// checked): 0 along the axes it is repeated over.
pub(crate) fn broadcast_strides(shape: &[usize], strides: &[usize], out: &[usize]) -> Shape {
    let lead = out.len() - shape.len();
    (0..out.len())
        .map(|a| match a.checked_sub(lead) {
            Some(i) if shape[i] == out[a] => strides[i],
            _ => 0,
        })
        .collect()
}

/// Checks that `axis` is an axis of a tensor of `rank` axes.
pub(crate) fn check_axis(
    op: &'static str,
    axis: usize,
    shape: &[usize],
) -> Result<(), DeviceError> {
    if axis >= shape.len() {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "axis {axis} is out of range for a tensor of shape {shape:?} ({} axes)",
                shape.len()
            ),
        });
    }
    Ok(())
}

fn bounds(range: &impl RangeBounds<usize>, len: usize) -> (usize, usize) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    (start, end)
}

impl<T: DType> Tensor<T> {
    /// A view of this tensor's buffer; one without elements starts at 0, whatever `offset`.
    fn with_layout(&self, shape: Shape, strides: Shape, offset: usize) -> Tensor<T> {
        let offset = if shape.contains(&0) { 0 } else { offset };
        Tensor {
            buf: self.buf.clone(),
            shape,
            strides,
            offset,
        }
    }

    /// The buffer offset of index `index` along `axis` (the other indices 0), for the view
    /// `op` takes from this tensor, checked. Within a view with elements it always fits, but
    /// a wrong offset must not come from arithmetic that wraps.
    fn offset_along(
        &self,
        op: &'static str,
        axis: usize,
        index: usize,
    ) -> Result<usize, DeviceError> {
        index
            .checked_mul(self.strides[axis])
            .and_then(|step| step.checked_add(self.offset))
            .ok_or_else(|| DeviceError::InvalidShape {
                op,
                reason: format!(
                    "index {index} along axis {axis} of {:?} (strides {:?}, from element {}) \
                     lies past usize::MAX",
                    self.shape, self.strides, self.offset
                ),
            })
    }

    /// The view of elements `start..start + len` along `axis`, sharing memory.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range or the range
    /// does not lie inside it.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::DeviceOpExt;
    /// use cuflow_runtime::Device;
    /// use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let stream = Device::host().new_stream()?;
    /// let x = api::arange::<f32>(0.0, 12.0, 1.0).sync_on(&stream)?.reshape(&[3, 4])?;
    /// let cols = x.narrow(1, 1, 2)?;
    /// assert_eq!(cols.shape(), &[3, 2]);
    /// assert_eq!(cols.to_host_vec()?, vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
    /// # Ok(()) }
    /// ```
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Tensor<T>, DeviceError> {
        self.slice_axis_as("narrow", axis, start..start.saturating_add(len))
    }

    /// The view of `range` along `axis` (`..`, `a..`, `..b`, `a..b`, `a..=b`).
    ///
    /// # Errors
    ///
    /// As [`narrow`](Tensor::narrow).
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<f32>(0.0, 6.0, 1.0).sync_on(&stream)?;
    /// assert_eq!(x.slice_axis(0, 4..)?.to_host_vec()?, vec![4.0, 5.0]);
    /// # Ok(()) }
    /// ```
    pub fn slice_axis(
        &self,
        axis: usize,
        range: impl RangeBounds<usize>,
    ) -> Result<Tensor<T>, DeviceError> {
        self.slice_axis_as("slice_axis", axis, range)
    }

    /// [`slice_axis`](Tensor::slice_axis) for `op`, the method called, which errors name.
    fn slice_axis_as(
        &self,
        op: &'static str,
        axis: usize,
        range: impl RangeBounds<usize>,
    ) -> Result<Tensor<T>, DeviceError> {
        check_axis(op, axis, &self.shape)?;
        let len = self.shape[axis];
        let (start, end) = bounds(&range, len);
        if start > end || end > len {
            return Err(DeviceError::InvalidShape {
                op,
                reason: format!(
                    "the range {start}..{end} does not lie inside axis {axis} of {:?} \
                     ({len} elements)",
                    self.shape
                ),
            });
        }
        let mut shape = self.shape.clone();
        shape[axis] = end - start;
        let offset = if shape.contains(&0) {
            0
        } else {
            self.offset_along(op, axis, start)?
        };
        Ok(self.with_layout(shape, self.strides.clone(), offset))
    }

    /// The view of `ranges[k]` along each axis `k`; axes past the ranges are taken whole.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when there are more ranges than axes or
    /// a range does not lie inside its axis.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<f32>(0.0, 12.0, 1.0).sync_on(&stream)?.reshape(&[3, 4])?;
    /// let block = x.slice(&[1..3, 2..4])?;
    /// assert_eq!(block.to_host_vec()?, vec![6.0, 7.0, 10.0, 11.0]);
    /// # Ok(()) }
    /// ```
    pub fn slice(&self, ranges: &[Range<usize>]) -> Result<Tensor<T>, DeviceError> {
        if ranges.len() > self.rank() {
            return Err(DeviceError::InvalidShape {
                op: "slice",
                reason: format!(
                    "{} ranges for a tensor of shape {:?}: axis {} does not exist",
                    ranges.len(),
                    self.shape,
                    self.rank()
                ),
            });
        }
        let mut t = self.clone();
        for (axis, r) in ranges.iter().enumerate() {
            t = t.slice_axis_as("slice", axis, r.clone())?;
        }
        Ok(t)
    }

    /// The view at `index` along `axis`, without that axis.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range or `index` is
    /// not below its length.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<f32>(0.0, 6.0, 1.0).sync_on(&stream)?.reshape(&[2, 3])?;
    /// assert_eq!(x.select(1, 2)?.to_host_vec()?, vec![2.0, 5.0]);
    /// # Ok(()) }
    /// ```
    pub fn select(&self, axis: usize, index: usize) -> Result<Tensor<T>, DeviceError> {
        check_axis("select", axis, &self.shape)?;
        if index >= self.shape[axis] {
            return Err(DeviceError::InvalidShape {
                op: "select",
                reason: format!(
                    "index {index} is out of range for axis {axis} of {:?}",
                    self.shape
                ),
            });
        }
        let mut shape = self.shape.clone();
        let mut strides = self.strides.clone();
        shape.remove(axis);
        strides.remove(axis);
        let offset = if shape.contains(&0) {
            0
        } else {
            self.offset_along("select", axis, index)?
        };
        Ok(self.with_layout(shape, strides, offset))
    }

    /// The view with its axes reordered: axis `k` of the result is axis `order[k]` of this
    /// tensor.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] when `order` is not a permutation of the axes (naming the
    /// axis that is missing, repeated or out of range).
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::zeros::<f32>(&[2, 3, 4]).sync_on(&stream)?;
    /// assert_eq!(x.permute(&[2, 0, 1])?.shape(), &[4, 2, 3]);
    /// # Ok(()) }
    /// ```
    pub fn permute(&self, order: &[usize]) -> Result<Tensor<T>, DeviceError> {
        if order.len() != self.rank() {
            return Err(DeviceError::InvalidShape {
                op: "permute",
                reason: format!(
                    "the order {order:?} names {} axes but the tensor {:?} has {}",
                    order.len(),
                    self.shape,
                    self.rank()
                ),
            });
        }
        let mut seen: SmallVec<[bool; 8]> = SmallVec::from_elem(false, order.len());
        for &a in order {
            check_axis("permute", a, &self.shape)?;
            if std::mem::replace(&mut seen[a], true) {
                return Err(DeviceError::InvalidShape {
                    op: "permute",
                    reason: format!("axis {a} appears twice in the order {order:?}"),
                });
            }
        }
        let shape = order.iter().map(|&a| self.shape[a]).collect();
        let strides = order.iter().map(|&a| self.strides[a]).collect();
        Ok(self.with_layout(shape, strides, self.offset))
    }

    /// The view with axes `a` and `b` swapped (for a matrix, its transpose). Kernels copy it
    /// to a dense tensor where they need one; [`kernels::transpose`](crate::kernels::transpose)
    /// makes the dense transpose of a matrix directly.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis that is out of range.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::arange::<f32>(0.0, 6.0, 1.0).sync_on(&stream)?.reshape(&[2, 3])?;
    /// let t = x.transpose(0, 1)?;
    /// assert_eq!(t.shape(), &[3, 2]);
    /// assert_eq!(t.to_host_vec()?, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    /// # Ok(()) }
    /// ```
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor<T>, DeviceError> {
        check_axis("transpose", a, &self.shape)?;
        check_axis("transpose", b, &self.shape)?;
        let mut order: SmallVec<[usize; 8]> = (0..self.rank()).collect();
        order.swap(a, b);
        self.permute(&order)
    }

    /// The view repeated to `shape` without copying (stride 0 along repeated axes), under
    /// NumPy's rules: `shape` may add leading axes, and an axis of length 1 may take any
    /// length. Kernels read the repeated elements where they are.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis of `shape` the tensor cannot be expanded
    /// along.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let row = api::arange::<f32>(0.0, 3.0, 1.0).sync_on(&stream)?;
    /// let grid = row.expand(&[2, 3])?;
    /// assert_eq!(grid.strides(), &[0, 1]);
    /// assert_eq!(grid.to_host_vec()?, vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    /// # Ok(()) }
    /// ```
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor<T>, DeviceError> {
        self.expand_as("expand", shape)
    }

    /// [`expand`](Tensor::expand) for `op`, the method called, which errors name.
    fn expand_as(&self, op: &'static str, shape: &[usize]) -> Result<Tensor<T>, DeviceError> {
        let lead =
            shape
                .len()
                .checked_sub(self.rank())
                .ok_or_else(|| DeviceError::InvalidShape {
                    op,
                    reason: format!(
                        "cannot expand {:?} to {shape:?}, which has fewer axes",
                        self.shape
                    ),
                })?;
        for (i, &d) in self.shape.iter().enumerate() {
            if d != shape[lead + i] && d != 1 {
                return Err(DeviceError::InvalidShape {
                    op,
                    reason: format!(
                        "cannot expand {:?} to {shape:?}: along axis {} the length {d} \
                         differs from {}, and only an axis of length 1 expands",
                        self.shape,
                        lead + i,
                        shape[lead + i]
                    ),
                });
            }
        }
        numel(op, shape)?;
        let strides = broadcast_strides(&self.shape, &self.strides, shape);
        Ok(self.with_layout(SmallVec::from_slice(shape), strides, self.offset))
    }

    /// The same as [`expand`](Tensor::expand) (NumPy's name).
    ///
    /// # Errors
    ///
    /// As [`expand`](Tensor::expand).
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let col = api::ones::<f32>(&[2, 1]).sync_on(&stream)?;
    /// assert_eq!(col.broadcast_to(&[4, 2, 5])?.shape(), &[4, 2, 5]);
    /// # Ok(()) }
    /// ```
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor<T>, DeviceError> {
        self.expand_as("broadcast_to", shape)
    }

    /// The view without `axis`, which must have length 1.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is out of range or longer than 1.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::zeros::<f32>(&[3, 1, 2]).sync_on(&stream)?;
    /// assert_eq!(x.squeeze(1)?.shape(), &[3, 2]);
    /// # Ok(()) }
    /// ```
    pub fn squeeze(&self, axis: usize) -> Result<Tensor<T>, DeviceError> {
        check_axis("squeeze", axis, &self.shape)?;
        if self.shape[axis] != 1 {
            return Err(DeviceError::InvalidShape {
                op: "squeeze",
                reason: format!(
                    "axis {axis} of {:?} has {} elements; only an axis of length 1 can be \
                     removed",
                    self.shape, self.shape[axis]
                ),
            });
        }
        self.select(axis, 0)
    }

    /// The view with a new axis of length 1 before axis `axis` (`axis == rank` appends it).
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidShape`] naming the axis when it is past `rank`.
    ///
    /// ```
    /// # use cuflow_device_op::DeviceOpExt;
    /// # use cuflow_tensor::api;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// # let stream = cuflow_runtime::Device::host().new_stream()?;
    /// let x = api::zeros::<f32>(&[3, 2]).sync_on(&stream)?;
    /// assert_eq!(x.unsqueeze(2)?.shape(), &[3, 2, 1]);
    /// # Ok(()) }
    /// ```
    pub fn unsqueeze(&self, axis: usize) -> Result<Tensor<T>, DeviceError> {
        if axis > self.rank() {
            return Err(DeviceError::InvalidShape {
                op: "unsqueeze",
                reason: format!(
                    "axis {axis} is past the {} axes of {:?}",
                    self.rank(),
                    self.shape
                ),
            });
        }
        let stride = if axis == self.rank() {
            Some(1)
        } else {
            self.strides[axis].checked_mul(self.shape[axis])
        };
        let stride = stride.ok_or_else(|| DeviceError::InvalidShape {
            op: "unsqueeze",
            reason: format!(
                "the step over axis {axis} of {:?} (strides {:?}) is past usize::MAX",
                self.shape, self.strides
            ),
        })?;
        let mut shape = self.shape.clone();
        let mut strides = self.strides.clone();
        shape.insert(axis, 1);
        strides.insert(axis, stride);
        Ok(self.with_layout(shape, strides, self.offset))
    }

    /// [`view`](Tensor::view) of an output a kernel writes in place, whose errors say how to
    /// proceed without a copy (writing into a copy would leave this tensor unchanged).
    pub(crate) fn out_view(&self, op: &'static str) -> Result<BufferView<'_, T>, DeviceError> {
        let reason = if !self.is_contiguous() {
            format!(
                "writes its output in place, which must be contiguous: a view of shape {:?} \
                 with strides {:?} is not (its elements are scattered, or repeated); write a \
                 dense tensor instead",
                self.shape, self.strides
            )
        } else if !self.is_kernel_ready() {
            format!(
                "writes its output in 16-byte vectors, so it must start at a 16-byte boundary \
                 of its buffer; a view of shape {:?} starts at element {}: write a dense \
                 tensor and copy it into the view with `api::memcpy`",
                self.shape, self.offset
            )
        } else {
            return self.view(op);
        };
        Err(DeviceError::InvalidShape { op, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapse_merges_packed_axes_and_keeps_broadcast_ones() {
        let (s, [a, b]) = collapse(&[2, 3, 4], [&[12, 4, 1], &[0, 4, 1]]);
        assert_eq!(
            (&s[..], &a[..], &b[..]),
            (&[2, 12][..], &[12, 1][..], &[0, 1][..])
        );
        let (s, [a]) = collapse(&[2, 1, 3], [&[3, 7, 1]]);
        assert_eq!((&s[..], &a[..]), (&[6][..], &[1][..]));
        let (s, [a]) = collapse(&[2, 0, 3], [&[3, 3, 1]]);
        assert_eq!((&s[..], &a[..]), (&[0][..], &[0][..]));
    }

    #[test]
    fn offsets_follow_row_major_order() {
        let offsets: Vec<usize> = Strided::new(&[2, 3], &[1, 2], 5).offsets().collect();
        assert_eq!(offsets, vec![5, 7, 9, 6, 8, 10]);
    }
}

//! What a tensor says about itself without touching its data: element count, rank, bytes,
//! dtype, device, and whether its elements are packed in row-major order.

use cuflow_runtime::DeviceId;

use crate::dtype::DType;
use crate::tensor::Tensor;

impl<T: DType> Tensor<T> {
    /// The number of elements: the product of the shape (1 for a scalar).
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_device_op::DeviceOpExt;
    /// use cuflow_tensor::api;
    /// let t = api::zeros::<f32>(&[2, 3, 4]).sync()?;
    /// assert_eq!((t.numel(), t.ndim(), t.size_bytes()), (24, 3, 96));
    /// assert_eq!(t.dtype(), "f32");
    /// assert!(t.is_contiguous());
    /// assert_eq!(t.device_id(), t.device().id());
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// The number of axes (the same as [`Tensor::rank`]).
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// The bytes the tensor's elements take: `numel() × size_of::<T>()` (as a dense copy;
    /// an [expanded](Tensor::expand) view may take more than its buffer holds), saturating at
    /// `usize::MAX`.
    pub fn size_bytes(&self) -> usize {
        self.numel().saturating_mul(std::mem::size_of::<T>())
    }

    /// The element type's name: `"f32"`, `"bf16"`, `"i64"`, ...
    pub fn dtype(&self) -> &'static str {
        T::NAME
    }

    /// The id of the device holding the tensor (its [`Device`](cuflow_runtime::Device) is
    /// [`Tensor::device`]; a CUDA device's ordinal is `device().ordinal()`).
    pub fn device_id(&self) -> DeviceId {
        self.device().id()
    }

    /// Whether the elements lie packed in row-major order: each axis's stride is the product
    /// of the lengths after it. Axes of length 1 may have any stride, and a tensor without
    /// elements is contiguous. Computed from the shape and the strides. A contiguous view whose
    /// first element lies at a 16-byte boundary of its buffer goes to kernels without a copy
    /// (rows of a matrix from [`Tensor::narrow`], say); others are copied where a kernel needs
    /// dense rows.
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(self.shape(), self.strides())
    }
}

/// Whether `strides` are the packed row-major strides of `shape` (see
/// [`Tensor::is_contiguous`]).
pub(crate) fn is_contiguous(shape: &[usize], strides: &[usize]) -> bool {
    if shape.len() != strides.len() {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1usize;
    for (&len, &stride) in shape.iter().zip(strides).rev() {
        if len != 1 && stride != expected {
            return false;
        }
        expected = expected.saturating_mul(len);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::is_contiguous;

    #[test]
    fn contiguity_from_shape_and_strides() {
        assert!(is_contiguous(&[2, 3, 4], &[12, 4, 1]));
        assert!(is_contiguous(&[], &[]));
        assert!(
            is_contiguous(&[2, 1, 4], &[4, 99, 1]),
            "length-1 axes take any stride"
        );
        assert!(is_contiguous(&[2, 0, 4], &[7, 7, 7]), "no elements");
        assert!(!is_contiguous(&[2, 3], &[1, 2]), "a transpose");
        assert!(
            !is_contiguous(&[2, 3], &[6, 1]),
            "a row stride past the row"
        );
        assert!(!is_contiguous(&[4], &[0]), "a broadcast");
        assert!(!is_contiguous(&[2, 3], &[3]), "rank mismatch");
    }
}

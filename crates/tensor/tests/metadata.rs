//! Tensor metadata: element count, rank, bytes, dtype, device, contiguity.

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, bf16};
use cuflow_testing::device::stream;

#[test]
fn metadata_of_tensors_of_several_shapes() -> Result<(), DeviceError> {
    let s = stream();
    let t = api::zeros::<bf16>(&[3, 5, 7]).sync_on(&s)?;
    assert_eq!((t.numel(), t.ndim(), t.size_bytes()), (105, 3, 210));
    assert_eq!(t.dtype(), "bf16");
    assert_eq!(t.device_id(), s.device().id());
    assert!(t.is_contiguous());

    let scalar = api::full::<i64>(&[], 4).sync_on(&s)?;
    assert_eq!(
        (scalar.numel(), scalar.ndim(), scalar.size_bytes()),
        (1, 0, 8)
    );
    assert!(scalar.is_contiguous());

    let empty = api::zeros::<f64>(&[4, 0]).sync_on(&s)?;
    assert_eq!((empty.numel(), empty.ndim(), empty.size_bytes()), (0, 2, 0));
    assert!(empty.is_contiguous());

    let reshaped = t.reshape(&[15, 7])?;
    assert!(reshaped.is_contiguous());
    assert_eq!(reshaped.size_bytes(), 210);
    Ok(())
}

/// A view expanded past `usize::MAX` bytes (but not elements) reports its size saturated.
#[test]
fn size_bytes_of_a_huge_expanded_view_saturates() -> Result<(), DeviceError> {
    let s = stream();
    let x = api::zeros::<f32>(&[1]).sync_on(&s)?;
    let big = x.expand(&[1 << 62])?;
    assert_eq!((big.numel(), big.size_bytes()), (1 << 62, usize::MAX));
    let fits = x.expand(&[1 << 40])?;
    assert_eq!(fits.size_bytes(), 4 << 40);
    Ok(())
}

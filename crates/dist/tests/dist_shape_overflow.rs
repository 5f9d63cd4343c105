//! Output shapes that do not fit in `usize` are errors of the op, on every rank, never a
//! panic or a wrapped shape: an empty tensor may have an axis 0 of any length.

mod common;

use std::time::Duration;

use common::communicators;
use cuflow_device_op::DeviceOpExt;
use cuflow_dist::{all_gather, group, GroupCall};
use cuflow_runtime::DeviceError;
use cuflow_tensor::{api, Tensor};
use cuflow_testing::thread::on_each;

const TIMEOUT: Duration = Duration::from_secs(10);

/// An empty tensor whose axis 0 times two overflows `usize`.
fn huge_empty(c: &cuflow_dist::Communicator) -> Result<Tensor<f32>, DeviceError> {
    api::zeros::<f32>(&[usize::MAX / 2 + 1, 0]).sync_on(c.stream())
}

fn assert_shape_error(results: Vec<Result<String, DeviceError>>) {
    for r in results {
        match r {
            Err(DeviceError::InvalidShape { op, reason }) => {
                assert!(op.contains("all_gather"), "{op}: {reason}");
                assert!(reason.contains("overflows"), "{reason}");
            }
            other => panic!("expected an InvalidShape error, got {other:?}"),
        }
    }
}

#[test]
fn all_gather_of_an_axis_0_that_overflows_is_an_error() {
    let Some(comms) = communicators(2, TIMEOUT) else {
        return;
    };
    assert_shape_error(on_each(&comms, |c| {
        let y = all_gather(c, huge_empty(c)?).sync_on(c.stream())?;
        Ok(format!("{:?}", y.shape()))
    }));
}

#[test]
fn grouped_all_gather_of_an_axis_0_that_overflows_is_an_error() {
    let Some(comms) = communicators(2, TIMEOUT) else {
        return;
    };
    assert_shape_error(on_each(&comms, |c| {
        let out = group(c, vec![GroupCall::AllGather(huge_empty(c)?)]).sync_on(c.stream())?;
        Ok(format!("{:?}", out[0].shape()))
    }));
}

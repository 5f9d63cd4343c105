//! cuflow: compose GPU work as lazy DAGs and run it fast and safely.
//!
//! Build [`DeviceOp`] values with [`then`](DeviceOpExt::then), [`zip!`], [`map`](DeviceOpExt::map)
//! and [`shared`](DeviceOpExt::shared); nothing runs until [`sync`](DeviceOpExt::sync),
//! [`sync_on`](DeviceOpExt::sync_on) or `.await`. A [`SchedulingPolicy`] maps each part of an op
//! onto streams (round-robin over a stream pool by default) and the executor joins branches with
//! events. The same program runs on an NVIDIA GPU through the CUDA driver and on the CPU host
//! backend, which is the default where no GPU is present.
//!
//! ```
//! use cuflow::prelude::*;
//! # fn main() -> Result<(), DeviceError> {
//! let (a, b) = zip!(api::ones::<f32>(&[64]), api::full::<f32>(&[64], 2.0)).sync()?;
//! let c = kernels::add(&a, &b).sync()?;
//! assert_eq!(c.to_host_vec()?, vec![3.0; 64]);
//! # Ok(()) }
//! ```
//!
//! The crates behind the facade, lowest first: [`runtime`] (devices, streams, buffers,
//! kernels), [`scheduler`] (policies), [`device_op`] (ops and execution), [`graph_capture`]
//! (record and replay), [`tensor`] (tensors, constructors in [`api`], [`kernels`]), [`dist`]
//! (collectives between the ranks of a communicator, in one process or across processes).

#![forbid(unsafe_code)]

pub use cuflow_device_op as device_op;
pub use cuflow_dist as dist;
pub use cuflow_graph_capture as graph_capture;
pub use cuflow_models as models;
pub use cuflow_runtime as runtime;
pub use cuflow_scheduler as scheduler;
pub use cuflow_tensor as tensor;

pub use cuflow_runtime::trace;
pub use cuflow_tensor::{api, kernels};

pub use cuflow_device_op::{
    default_device, from_fn, join_all, value, with_context, zip, BoxedOp, DeviceFuture, DeviceOp,
    DeviceOpExt, ExecutionContext, ExecutionStats, Shared, UnzipExt, UnzipOutput,
};
pub use cuflow_graph_capture::{CudaGraph, GraphCaptureExt, RecaptureOutcome};
pub use cuflow_runtime::{
    BackendKind, Device, DeviceBuffer, DeviceError, Event, Graph, GraphExec, Kernel, KernelArgs,
    LaunchConfig, PinnedBuffer, Stream,
};
pub use cuflow_scheduler::{
    DevicePolicyExt, DeviceSpread, LeastLoaded, MultiDevice, Placement, Priority, PriorityLevel,
    SchedulingPolicy, SingleStream, StreamPoolRoundRobin,
};
pub use cuflow_tensor::{
    bf16, f16, DType, FloatDType, IntoShape, Launch, Partition, PartitionExt, PartitionOpExt,
    ReshapeOpExt, Tensor, TensorInput, TensorMut, TensorOpExt, TensorRef, ToDeviceExt,
};

/// The names most programs need: `use cuflow::prelude::*;`.
pub mod prelude {
    pub use cuflow_device_op::{
        from_fn, join_all, value, with_context, zip, BoxedOp, DeviceFuture, DeviceOp, DeviceOpExt,
        ExecutionContext, UnzipExt,
    };
    pub use cuflow_graph_capture::{CudaGraph, GraphCaptureExt};
    pub use cuflow_runtime::{
        BackendKind, Device, DeviceBuffer, DeviceError, Event, Kernel, KernelArgs, LaunchConfig,
        Stream,
    };
    pub use cuflow_scheduler::{
        DevicePolicyExt, DeviceSpread, LeastLoaded, MultiDevice, Priority, PriorityLevel,
        SchedulingPolicy, SingleStream, StreamPoolRoundRobin,
    };
    pub use cuflow_tensor::{
        api, bf16, f16, kernels, DType, FloatDType, Launch, Partition, PartitionExt,
        PartitionOpExt, ReshapeOpExt, Tensor, TensorOpExt, ToDeviceExt,
    };
}

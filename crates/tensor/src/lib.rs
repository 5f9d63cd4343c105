//! cuflow's tensors, constructors and kernels.
//!
//! A [`Tensor<T>`] is an array on a device: dense and row-major as constructors and kernels
//! make it, or a view ([`Tensor::narrow`], [`Tensor::permute`], [`Tensor::expand`], ...) over
//! the same memory with other strides. The functions of [`api`] build tensors and the
//! functions of [`kernels`] compute with them (binary operations broadcast as NumPy does, and
//! reductions run along any axis); every one returns a lazy op
//! to chain with `then`, combine with `zip!`, and run with `.sync()`, `.sync_on(&stream)` or
//! `.await`. Each kernel has a CUDA C implementation (compiled by NVRTC for the device, once
//! per process) and a host implementation, so the same program runs on a GPU and on the CPU
//! host backend.
//!
//! ```
//! use cuflow_device_op::DeviceOpExt;
//! use cuflow_runtime::Device;
//! use cuflow_tensor::{api, kernels, PartitionExt};
//! # fn main() -> Result<(), cuflow_runtime::DeviceError> {
//! let stream = Device::host().new_stream()?;
//! let mut z = api::zeros::<f32>(&[16, 16]).sync_on(&stream)?;
//! let x = api::ones::<f32>(&[16, 16]).sync_on(&stream)?;
//! // Borrow-based: &mut z for output, &x for input. z holds the result afterwards.
//! let _ = kernels::saxpy((&mut z).partition([4, 4]), 2.0, &x).sync_on(&stream)?;
//! assert_eq!(z.to_host_vec()?, vec![2.0f32; 256]);
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]

pub mod api;
mod constructors;
mod custom;
mod display;
mod dtype;
pub mod kernels;
mod lazy;
mod meta;
mod methods;
mod op;
mod partition;
mod tensor;
mod to_device;
mod view;

pub use custom::Launch;
pub use dtype::{DType, FloatDType};
pub use half::{bf16, f16};
pub use lazy::{IntoShape, PartitionOpExt, Partitioned, Reshape, ReshapeOpExt};
pub use methods::{TensorMethodsExt, ViewOp};
pub use op::TensorOp;
pub use tensor::{
    Partition, PartitionExt, Shape, Tensor, TensorInput, TensorMut, TensorOpExt, TensorRef,
};
pub use to_device::{ToDevice, ToDeviceExt};

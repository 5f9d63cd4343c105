//! The one error type of cuflow.
//!
//! Every fallible operation in every cuflow crate returns [`DeviceError`]. Its variants carry
//! structured fields (what was asked, what the device allows) so that a caller can react to them
//! and a person reading the message knows what went wrong and how to fix it. Driver errors keep
//! the name of the call that failed, the driver's own code and message, and the driver's error
//! itself as their [`source`](std::error::Error::source).
//!
//! Both public enums are `#[non_exhaustive]`: new backends and new failure kinds can be added
//! without breaking a caller's `match`.

use std::fmt;

pub use cudarc::driver::DriverError;

use crate::device::{Device, DeviceId};

/// The kind of backend a [`Device`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// CPU threads; the embedded default where no GPU is present and the reference for results.
    Host,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// Everything that can go wrong in cuflow.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The CUDA driver library (libcuda) could not be loaded.
    #[error(
        "no CUDA driver: {reason}; install the NVIDIA driver, or use the host backend \
         (Device::host() or CUFLOW_DEVICE=host)"
    )]
    NoDriver {
        /// Why the driver could not be used.
        reason: String,
    },
    /// NVRTC (the CUDA runtime compiler) could not be loaded, so CUDA C kernels cannot be built.
    #[error(
        "no NVRTC library: {reason}; install the CUDA toolkit's libnvrtc and put it on \
         LD_LIBRARY_PATH"
    )]
    NoCompiler {
        /// Why the compiler could not be used.
        reason: String,
    },
    /// cuBLAS (the CUDA toolkit's BLAS library) could not be loaded, so [`gemm`](crate::gemm)
    /// cannot run on CUDA devices.
    #[error(
        "no cuBLAS library: {reason}; install the CUDA toolkit's libcublas (CUDA 12 or 13), \
         add its lib64 directory to LD_LIBRARY_PATH, or point CUDA_HOME at the toolkit"
    )]
    NoBlas {
        /// Which libraries were tried and why they could not be used.
        reason: String,
    },
    /// There is no CUDA device with this ordinal.
    #[error("no CUDA device {ordinal}: {count} device(s) visible")]
    NoDevice {
        /// The ordinal that was asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// `CUFLOW_DEVICE` holds something cuflow does not understand.
    #[error("CUFLOW_DEVICE={value:?} is not understood; use `host`, `host:N`, `cuda` or `cuda:N`")]
    BadDeviceSelector {
        /// The value that was found.
        value: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {name} ({code}): {message}")]
    Driver {
        /// The driver function that failed.
        call: &'static str,
        /// The `CUresult` code.
        code: i32,
        /// The driver's name for the code, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`, read when the call
        /// failed.
        name: String,
        /// The driver's description of the code, read when the call failed.
        message: String,
        /// The driver's error itself.
        #[source]
        source: DriverError,
    },
    /// The device hit a fault its context cannot survive (a kernel trapped, read or wrote out
    /// of bounds, or executed an illegal instruction), or this handle belongs to the device's
    /// state from before a [`Device::recover`](crate::Device::recover). Every later call on
    /// that state fails with this error at once; `Device::recover` gives a working device.
    #[error(
        "device {device} is faulted: {cause}; nothing more runs on its current state \
         (call Device::recover to reset it, then create streams and buffers again)"
    )]
    DeviceFaulted {
        /// The device, e.g. `cuda:0`.
        device: String,
        /// The fault, e.g. the driver error first seen, or that the state was reset.
        cause: String,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS call {call} failed: {name} ({status}): {message}")]
    Blas {
        /// The cuBLAS function that failed.
        call: &'static str,
        /// The `cublasStatus_t` code.
        status: i32,
        /// cuBLAS's name for the code, e.g. `CUBLAS_STATUS_NOT_SUPPORTED`.
        name: String,
        /// cuBLAS's description of the code.
        message: String,
    },
    /// A kernel failed to compile; `log` holds the compiler's log.
    #[error("kernel `{kernel}` failed to compile:\n{log}")]
    Compile {
        /// The kernel's name.
        kernel: String,
        /// The compiler's log.
        log: String,
    },
    /// A launch configuration the device cannot run.
    #[error("invalid launch of `{kernel}`: {reason}")]
    InvalidLaunch {
        /// The kernel's name.
        kernel: String,
        /// What is wrong, with the limit that was exceeded.
        reason: String,
    },
    /// Kernel arguments that do not match what the kernel expects.
    #[error("invalid argument {index} of `{kernel}`: {reason}")]
    InvalidArgument {
        /// The kernel or operation.
        kernel: String,
        /// The argument's position.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The device has not enough memory for an allocation.
    #[error("out of memory: could not allocate {bytes} bytes on {device}")]
    OutOfMemory {
        /// The size asked for.
        bytes: usize,
        /// The device's name.
        device: String,
    },
    /// An operation the backend does not provide.
    #[error("{what} is not supported on the {backend} backend")]
    Unsupported {
        /// What was asked for.
        what: String,
        /// The backend that lacks it.
        backend: BackendKind,
    },
    /// Shapes that do not fit together.
    #[error("shape mismatch in {op}: {what}: {lhs:?} vs {rhs:?}")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// Which arguments and dimensions disagree, e.g. "inner dimensions differ: the columns
        /// of `a` (4) are not the rows of `b` (5)".
        what: String,
        /// The first shape.
        lhs: Vec<usize>,
        /// The second shape.
        rhs: Vec<usize>,
    },
    /// A shape or index that is invalid by itself.
    #[error("invalid shape in {op}: {reason}")]
    InvalidShape {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A partition that does not divide the tensor it splits.
    #[error("invalid partition in {op}: {reason}")]
    InvalidPartition {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Objects of different devices used together.
    #[error(
        "device mismatch in {op}: {what} is on {found_name}, but the operation runs on \
         {expected_name}; move data with .to_device(..) first"
    )]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// The offending object, e.g. "argument 2 of `saxpy`" or "the stream".
        what: String,
        /// The device the operation runs on.
        expected: DeviceId,
        /// The device of the offending object.
        found: DeviceId,
        /// How `expected` displays, e.g. `cuda:0 (NVIDIA H100 80GB HBM3)`.
        expected_name: String,
        /// How `found` displays.
        found_name: String,
    },
    /// A copy between buffers of different lengths, or a view out of range.
    #[error("length mismatch in {op}: {expected} elements expected, {found} given")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// The length expected.
        expected: usize,
        /// The length given.
        found: usize,
    },
    /// Something that cannot happen while a stream is being captured into a graph, or a capture
    /// that went wrong.
    #[error("capture error in {op}: {reason}")]
    Capture {
        /// The operation that broke the capture.
        op: String,
        /// What went wrong.
        reason: String,
    },
    /// An op was executed from inside another op's execution on the same thread, the device
    /// was called from inside a host function or host kernel, or shared ops were consumed
    /// while they were being produced (by the same thread, or in a cycle across threads):
    /// work that would wait for itself.
    #[error(
        "re-entrant execution: {what}; this would wait for itself. It happens when an op or \
         the device is called from inside work of the runtime (an op executing on this thread, \
         a host function or a host kernel), or when shared ops consume each other; compose with \
         `then`, or make the call after that work, instead of calling it inside"
    )]
    Reentrant {
        /// What was called.
        what: &'static str,
    },
    /// A user closure panicked while an op was executing.
    #[error("a closure panicked during {op}: {message}")]
    Panicked {
        /// Where the panic happened.
        op: &'static str,
        /// The panic's message, where it was a string.
        message: String,
    },
    /// A shared op whose first execution failed or panicked.
    #[error("shared op is poisoned: its execution failed earlier: {reason}")]
    Poisoned {
        /// What happened to the first execution.
        reason: String,
    },
    /// A kernel's host implementation failed, or the host backend lacks one.
    #[error("kernel `{kernel}` on the host backend: {reason}")]
    HostKernel {
        /// The kernel's name.
        kernel: String,
        /// What went wrong.
        reason: String,
    },
    /// A stream's worker is gone (its thread stopped).
    #[error("stream {stream} is closed: {reason}")]
    StreamClosed {
        /// The stream's id.
        stream: u64,
        /// Why.
        reason: String,
    },
    /// NCCL (NVIDIA's collective communication library) could not be loaded, so collectives
    /// cannot run on CUDA devices.
    #[error(
        "no NCCL library: {reason}; install NCCL (`pip install nvidia-nccl-cu12`, or the \
         libnccl2 package), put its lib directory on LD_LIBRARY_PATH, or name the library file \
         in CUFLOW_NCCL_LIB"
    )]
    NoNccl {
        /// Which libraries were tried and why they could not be used.
        reason: String,
    },
    /// An NCCL call failed.
    #[error("NCCL call {call} failed: {name} ({code}): {message}")]
    Nccl {
        /// The NCCL function that failed.
        call: &'static str,
        /// The `ncclResult_t` code.
        code: i32,
        /// NCCL's description of the code, e.g. `unhandled cuda error`.
        name: String,
        /// NCCL's last error message, when it gives one.
        message: String,
    },
    /// A collective could not complete: the ranks called different collectives, a peer closed
    /// its connection, or the transport failed.
    #[error("collective {op} on rank {rank}: {reason}")]
    Collective {
        /// The collective, e.g. `all_reduce`, or the step of setting up a communicator.
        op: &'static str,
        /// The rank that saw the failure.
        rank: usize,
        /// What went wrong and how to fix it.
        reason: String,
    },
    /// A wait for another process or rank ran past its deadline.
    #[error(
        "{what}: nothing after {waited_ms} ms; check that every rank is running and calls the \
         same collectives in the same order, or raise the timeout (CUFLOW_DIST_TIMEOUT_MS)"
    )]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long, in milliseconds.
        waited_ms: u64,
    },
    /// A mistake in how an API was used that has no more specific variant.
    #[error("{what}")]
    Usage {
        /// What is wrong and how to fix it.
        what: String,
    },
    /// A state cuflow's own invariants rule out: a bug in cuflow, not in the program using it.
    #[error("internal error in cuflow: {what}; this is a bug, please report it")]
    Internal {
        /// Which invariant did not hold.
        what: String,
    },
}

impl DeviceError {
    /// Builds a [`DeviceError::Panicked`] from a caught panic's payload, and drops the payload.
    ///
    /// The payload is the program's (`std::panic::panic_any` takes any value), and so is its
    /// drop: a drop that panics in turn is caught too, and that second payload leaked, so that
    /// no panic unwinds out of the caller. Prefer it to [`DeviceError::from_panic`] wherever a
    /// caught payload is at hand.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::DeviceError;
    /// struct Loud;
    /// impl Drop for Loud {
    ///     fn drop(&mut self) {
    ///         panic!("dropped");
    ///     }
    /// }
    /// # std::panic::set_hook(Box::new(|_| {}));
    /// let payload = std::panic::catch_unwind(|| std::panic::panic_any(Loud)).unwrap_err();
    /// let e = DeviceError::from_panic_payload("a closure", payload);
    /// assert!(matches!(e, DeviceError::Panicked { op: "a closure", .. }));
    /// ```
    pub fn from_panic_payload(op: &'static str, payload: Box<dyn std::any::Any + Send>) -> Self {
        let error = DeviceError::from_panic(op, &*payload);
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
        if let Err(again) = dropped {
            std::mem::forget(again);
        }
        error
    }

    /// Builds a [`DeviceError::Panicked`] from a caught panic's payload, which it leaves to the
    /// caller (see [`DeviceError::from_panic_payload`] for one that drops it safely).
    pub fn from_panic(op: &'static str, payload: &(dyn std::any::Any + Send)) -> Self {
        let message = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "non-string panic payload".to_string()
        };
        DeviceError::Panicked { op, message }
    }

    /// Builds a [`DeviceError::Usage`].
    pub fn usage(what: impl Into<String>) -> Self {
        DeviceError::Usage { what: what.into() }
    }

    /// Builds a [`DeviceError::Internal`]: an invariant of cuflow itself did not hold.
    pub fn internal(what: impl Into<String>) -> Self {
        DeviceError::Internal { what: what.into() }
    }

    /// Builds a [`DeviceError::ShapeMismatch`] of `op` between `lhs` and `rhs`, saying which
    /// arguments and dimensions disagree.
    pub fn shape_mismatch(
        op: &'static str,
        what: impl Into<String>,
        lhs: &[usize],
        rhs: &[usize],
    ) -> Self {
        DeviceError::ShapeMismatch {
            op,
            what: what.into(),
            lhs: lhs.to_vec(),
            rhs: rhs.to_vec(),
        }
    }

    /// Builds a [`DeviceError::DeviceMismatch`]: `what`, an object of `found`, was used by `op`,
    /// which runs on `expected`.
    pub fn device_mismatch(
        op: &'static str,
        what: impl Into<String>,
        expected: &Device,
        found: &Device,
    ) -> Self {
        DeviceError::DeviceMismatch {
            op,
            what: what.into(),
            expected: expected.id(),
            found: found.id(),
            expected_name: expected.to_string(),
            found_name: found.to_string(),
        }
    }
}

/// A `Result` whose error is [`DeviceError`].
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use cudarc::driver::sys::cudaError_enum;

    use super::*;

    #[test]
    fn driver_errors_keep_the_driver_error_as_their_source() {
        // Built by hand: the name and message are read when the call fails, so neither
        // `Display` nor this test needs a driver.
        let e = DeviceError::Driver {
            call: "cuMemAlloc",
            code: cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY as i32,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            message: "out of memory".into(),
            source: DriverError(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY),
        };
        let source = e.source().expect("the driver error is the source");
        let driver = source.downcast_ref::<DriverError>().expect("a DriverError");
        assert_eq!(driver.0, cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(
            e.to_string(),
            "CUDA driver call cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"
        );
    }

    #[test]
    fn internal_errors_say_they_are_bugs() {
        let e = DeviceError::internal("a slot was filled twice");
        assert!(matches!(e, DeviceError::Internal { .. }));
        let text = e.to_string();
        assert!(
            text.contains("a slot was filled twice") && text.contains("bug"),
            "{text}"
        );
    }

    #[test]
    fn device_mismatches_carry_both_devices() {
        let (a, b) = (Device::host(), Device::host_numbered(1));
        let e = DeviceError::device_mismatch("copy_from", "the source", &a, &b);
        match &e {
            DeviceError::DeviceMismatch {
                op,
                what,
                expected,
                found,
                ..
            } => {
                assert_eq!((*op, what.as_str()), ("copy_from", "the source"));
                assert_eq!((*expected, *found), (a.id(), b.id()));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            e.to_string(),
            "device mismatch in copy_from: the source is on host:1, but the operation runs on \
             host; move data with .to_device(..) first"
        );
    }
}

//! The one error type of the benchmark program.
//!
//! cuflow's own failures arrive as [`DeviceError`]; the raw cudarc baselines keep the name of
//! the call that failed and cudarc's error as the `source`, so that `main` prints the whole
//! chain. A benchmark that finds its work was not done reports [`BenchError::Verification`].

use std::error::Error;
use std::fmt;

use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;
use cudarc::nvrtc::CompileError;
use cuflow::prelude::DeviceError;

/// Why a benchmark could not produce its figures.
#[derive(Debug)]
pub(crate) enum BenchError {
    /// A cuflow call failed.
    Device(DeviceError),
    /// A CUDA driver call of a raw cudarc baseline failed.
    Driver {
        /// The cudarc function that failed.
        call: &'static str,
        /// cudarc's error.
        source: DriverError,
    },
    /// NVRTC could not compile a raw baseline's kernel.
    Compile {
        /// The kernel's entry-point name.
        kernel: String,
        /// NVRTC's error, with its log.
        source: CompileError,
    },
    /// An NVRTC call other than compilation failed.
    Nvrtc {
        /// The NVRTC function that failed.
        call: &'static str,
        /// NVRTC's error.
        source: NvrtcError,
    },
    /// A library a raw baseline needs could not be loaded.
    Unavailable {
        /// The library, and what needs it.
        what: &'static str,
    },
    /// The measured work did not do what it should have.
    Verification(String),
    /// The benchmark needs more CUDA devices than are visible.
    MissingDevices {
        /// How many it needs.
        needed: usize,
        /// How many the driver reports.
        visible: usize,
    },
}

impl BenchError {
    /// Wraps a driver error of the raw baseline's `call`.
    pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> BenchError {
        move |source| BenchError::Driver { call, source }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Device(e) => write!(f, "{e}"),
            BenchError::Driver { call, .. } => write!(f, "raw cudarc baseline: {call} failed"),
            BenchError::Compile { kernel, .. } => {
                write!(f, "raw cudarc baseline: NVRTC could not compile `{kernel}`")
            }
            BenchError::Nvrtc { call, .. } => write!(f, "{call} failed"),
            BenchError::Unavailable { what } => write!(f, "{what} could not be loaded"),
            BenchError::Verification(what) => write!(f, "verification failed: {what}"),
            BenchError::MissingDevices { needed, visible } => write!(
                f,
                "this benchmark needs {needed} CUDA devices and {visible} are visible; run it \
                 on a machine with {needed} GPUs (CUDA_VISIBLE_DEVICES must list them)"
            ),
        }
    }
}

impl Error for BenchError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            BenchError::Device(e) => e.source(),
            BenchError::Driver { source, .. } => Some(source),
            BenchError::Compile { source, .. } => Some(source),
            BenchError::Nvrtc { source, .. } => Some(source),
            BenchError::Unavailable { .. }
            | BenchError::Verification(_)
            | BenchError::MissingDevices { .. } => None,
        }
    }
}

impl From<DeviceError> for BenchError {
    fn from(e: DeviceError) -> Self {
        BenchError::Device(e)
    }
}

//! Raw cudarc baselines: the same launches and copies written directly against cudarc, as a
//! user of the driver bindings would write them, and the driver and NVRTC version queries.
//!
//! This is the only module of the benchmark program with `unsafe` code: cudarc's kernel launch
//! and `disable_event_tracking` are `unsafe`, and so are its version queries. Two invariants
//! make the blocks here sound:
//!
//! - Every function takes the CUDA [`Device`] that cuflow opened, so libcuda is loaded before
//!   any cudarc call (cudarc panics when a library it calls into is absent). NVRTC is checked
//!   with `is_culib_present` before its first use.
//! - Each [`RawLauncher`] and [`RawCopier`] owns its own `CudaContext` object (on the device's
//!   primary context), one stream, and at most one buffer, which is allocated, used and freed
//!   on that one stream.
//!   The kernel and the arguments pushed for it are both chosen by one [`RawKernel`] value, so
//!   they always match.

#![allow(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{self, compile_ptx_with_opts, CompileOptions};
use cuflow::prelude::Device;

use crate::error::BenchError;
use crate::kernels;

/// One block of one thread without shared memory: every raw launch's configuration.
const ONE_THREAD: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

/// Whether cudarc records an event per buffer use to order streams (its default is on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventTracking {
    /// `CudaContext::disable_event_tracking`: launches do no event work.
    Off,
    /// cudarc's default: each buffer argument adds stream waits and an event record.
    On,
}

/// The kernel a [`RawLauncher`] launches; it also fixes the arguments pushed for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawKernel {
    /// `empty_kernel()`, no arguments.
    Empty,
    /// `empty_kernel_arg(float* p)`, one `CudaSlice<f32>` of one element.
    EmptyOneBuffer,
    /// `inc_kernel(float* x)`, one `CudaSlice<f32>` of one element, which it increments.
    Inc,
}

impl RawKernel {
    fn name_and_source(self) -> (&'static str, &'static str) {
        match self {
            RawKernel::Empty => (kernels::EMPTY_NAME, kernels::EMPTY_SRC),
            RawKernel::EmptyOneBuffer => (kernels::EMPTY_ARG_NAME, kernels::EMPTY_ARG_SRC),
            RawKernel::Inc => (kernels::INC_NAME, kernels::INC_SRC),
        }
    }
}

/// A context object, stream and loaded kernel of raw cudarc, on the device cuflow opened.
#[derive(Debug)]
pub(crate) struct RawLauncher {
    stream: Arc<CudaStream>,
    function: CudaFunction,
    /// The kernel's one argument: `Some` exactly for [`RawKernel::EmptyOneBuffer`] and
    /// [`RawKernel::Inc`].
    buffer: Option<CudaSlice<f32>>,
    /// A second stream, made only with tracking on: cudarc then orders the buffer's uses on
    /// the two streams with its own events.
    second: Option<Arc<CudaStream>>,
}

fn require_nvrtc() -> Result<(), BenchError> {
    // SAFETY: `is_culib_present` only tries to dlopen the candidate library names.
    if unsafe { nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(BenchError::Unavailable {
            what: "libnvrtc (which the raw cudarc baseline compiles its kernels with)",
        })
    }
}

fn ordinal(device: &Device) -> Result<usize, BenchError> {
    device.ordinal().ok_or(BenchError::Verification(format!(
        "{device} is not a CUDA device"
    )))
}

impl RawLauncher {
    /// A new `CudaContext` object for `device` with `tracking`, a stream on it, `kernel`
    /// compiled by NVRTC for the device's architecture and loaded, and its buffer allocated.
    pub(crate) fn new(
        device: &Device,
        tracking: EventTracking,
        kernel: RawKernel,
    ) -> Result<RawLauncher, BenchError> {
        let ordinal = ordinal(device)?;
        require_nvrtc()?;
        let ctx = CudaContext::new(ordinal).map_err(BenchError::driver("CudaContext::new"))?;
        if tracking == EventTracking::Off {
            // SAFETY: tracking is turned off before this context object creates any stream or
            // buffer, and its one buffer is allocated, used and freed on its one stream (module
            // docs), so stream order alone synchronizes every use: no buffer is used on another
            // stream, or freed while another stream uses it.
            unsafe { ctx.disable_event_tracking() };
        }
        let stream = ctx
            .new_stream()
            .map_err(BenchError::driver("CudaContext::new_stream"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(BenchError::driver("CudaContext::compute_capability"))?;
        let (name, source) = kernel.name_and_source();
        let ptx = compile_ptx_with_opts(
            source,
            CompileOptions {
                options: vec![format!("--gpu-architecture=sm_{major}{minor}")],
                ..CompileOptions::default()
            },
        )
        .map_err(|source| BenchError::Compile {
            kernel: name.to_string(),
            source,
        })?;
        let module = ctx
            .load_module(ptx)
            .map_err(BenchError::driver("CudaContext::load_module"))?;
        let function = module
            .load_function(name)
            .map_err(BenchError::driver("CudaModule::load_function"))?;
        let buffer = match kernel {
            RawKernel::Empty => None,
            RawKernel::EmptyOneBuffer | RawKernel::Inc => Some(
                stream
                    .alloc_zeros::<f32>(1)
                    .map_err(BenchError::driver("CudaStream::alloc_zeros"))?,
            ),
        };
        let second = match tracking {
            EventTracking::On => Some(
                ctx.new_stream()
                    .map_err(BenchError::driver("CudaContext::new_stream"))?,
            ),
            EventTracking::Off => None,
        };
        stream
            .synchronize()
            .map_err(BenchError::driver("CudaStream::synchronize"))?;
        Ok(RawLauncher {
            stream,
            function,
            buffer,
            second,
        })
    }

    /// Launches the kernel `n` times back to back (one block of one thread), then synchronizes
    /// the stream; returns the wall time of the whole, synchronize included.
    pub(crate) fn launch_n(&mut self, n: usize) -> Result<Duration, BenchError> {
        let start = Instant::now();
        for _ in 0..n {
            self.launch_one()?;
        }
        self.stream
            .synchronize()
            .map_err(BenchError::driver("CudaStream::synchronize"))?;
        Ok(start.elapsed())
    }

    /// Launches the kernel `n` times, alternately on the two streams (tracking on only: each
    /// launch then waits, through cudarc's events, for the previous one on the other stream),
    /// then synchronizes both; returns the wall time of the whole.
    pub(crate) fn launch_n_alternating(&mut self, n: usize) -> Result<Duration, BenchError> {
        let second = self.second.clone().ok_or_else(|| {
            BenchError::Verification("alternating launches need event tracking on".into())
        })?;
        let first = self.stream.clone();
        let start = Instant::now();
        for i in 0..n {
            let stream = if i % 2 == 0 { &first } else { &second };
            let mut launch = stream.launch_builder(&self.function);
            if let Some(buffer) = self.buffer.as_mut() {
                launch.arg(buffer);
            }
            // SAFETY: as in `launch_one`; the buffer is used on two streams, which cudarc's
            // event tracking (on, or `second` would not exist) orders.
            unsafe { launch.launch(ONE_THREAD) }
                .map_err(BenchError::driver("LaunchArgs::launch"))?;
        }
        for stream in [&first, &second] {
            stream
                .synchronize()
                .map_err(BenchError::driver("CudaStream::synchronize"))?;
        }
        Ok(start.elapsed())
    }

    /// Launches the kernel once, one block of one thread.
    #[inline(always)]
    fn launch_one(&mut self) -> Result<(), BenchError> {
        let mut launch = self.stream.launch_builder(&self.function);
        if let Some(buffer) = self.buffer.as_mut() {
            launch.arg(buffer);
        }
        // SAFETY: the arguments pushed are exactly the kernel's parameters, both fixed by the
        // `RawKernel` of `new` (module docs): none for `empty_kernel()`, one device pointer to a
        // live one-element f32 allocation for `empty_kernel_arg(float*)` (which never
        // dereferences it) and for `inc_kernel(float*)` (whose one thread writes element 0).
        // The buffer is owned by `self`, so it outlives the launch, and it is freed on the same
        // stream after it. One block of one thread without shared memory is a valid
        // configuration on every device.
        unsafe { launch.launch(ONE_THREAD) }.map_err(BenchError::driver("LaunchArgs::launch"))?;
        Ok(())
    }

    /// Captures `n` launches of the kernel (one block of one thread each) on the stream into a
    /// CUDA graph with cudarc's capture API, instantiated and uploaded: a raw graph baseline.
    pub(crate) fn capture_graph(&mut self, n: usize) -> Result<RawGraph, BenchError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(BenchError::driver("CudaStream::begin_capture"))?;
        let mut launched = Ok(());
        for _ in 0..n {
            launched = self.launch_one();
            if launched.is_err() {
                break;
            }
        }
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags_enum(0))
            .map_err(BenchError::driver("CudaStream::end_capture"))?;
        launched?;
        let graph = graph
            .ok_or_else(|| BenchError::Verification("the raw capture recorded no graph".into()))?;
        graph
            .upload()
            .map_err(BenchError::driver("CudaGraph::upload"))?;
        Ok(RawGraph {
            graph,
            stream: self.stream.clone(),
        })
    }

    /// The kernel's buffer, read back (after the stream's work): for [`RawKernel::Inc`], how
    /// many launches ran.
    pub(crate) fn read_buffer(&self) -> Result<f32, BenchError> {
        let buffer = self.buffer.as_ref().ok_or_else(|| {
            BenchError::Verification("this raw kernel has no buffer to read".into())
        })?;
        let host = self
            .stream
            .clone_dtoh(buffer)
            .map_err(BenchError::driver("CudaStream::clone_dtoh"))?;
        host.first()
            .copied()
            .ok_or_else(|| BenchError::Verification("the raw kernel's buffer is empty".into()))
    }
}

/// A graph captured with raw cudarc ([`RawLauncher::capture_graph`]), replayed on its stream.
/// It holds no buffer of its own: the launcher it came from must outlive it (the graph's
/// kernels write the launcher's buffer), which [`RawGraph::replay_k`] callers keep.
pub(crate) struct RawGraph {
    graph: cudarc::driver::CudaGraph,
    stream: Arc<CudaStream>,
}

impl std::fmt::Debug for RawGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawGraph").finish_non_exhaustive()
    }
}

impl RawGraph {
    /// Launches the graph `k` times back to back, then synchronizes its stream; returns the
    /// wall time of the whole, synchronize included.
    pub(crate) fn replay_k(&self, k: usize) -> Result<Duration, BenchError> {
        let start = Instant::now();
        for _ in 0..k {
            self.graph
                .launch()
                .map_err(BenchError::driver("CudaGraph::launch"))?;
        }
        self.stream
            .synchronize()
            .map_err(BenchError::driver("CudaStream::synchronize"))?;
        Ok(start.elapsed())
    }
}

/// The CUDA version the installed driver supports (`cuDriverGetVersion`), as (major, minor).
pub(crate) fn cuda_driver_version(device: &Device) -> Result<(i32, i32), BenchError> {
    ordinal(device)?;
    let mut version = 0;
    // SAFETY: `device` is a CUDA device cuflow opened, so libcuda is loaded and initialized
    // (module docs); `version` is a valid out-pointer for the duration of the call.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(BenchError::driver("cuDriverGetVersion"))?;
    Ok((version / 1000, (version % 1000) / 10))
}

/// The version of the NVRTC library loaded (`nvrtcVersion`), as (major, minor).
pub(crate) fn nvrtc_version() -> Result<(i32, i32), BenchError> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: `require_nvrtc` found libnvrtc, so the call cannot panic on a missing library;
    // both out-pointers are valid for the duration of the call.
    unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|source| BenchError::Nvrtc {
            call: "nvrtcVersion",
            source,
        })?;
    Ok((major, minor))
}

/// Raw cudarc copies between pageable host memory and one device buffer, on a context object
/// of its own with event tracking off and one stream, which allocates, uses and frees the
/// buffer (module docs).
pub(crate) struct RawCopier {
    stream: Arc<CudaStream>,
    buffer: CudaSlice<u8>,
}

impl std::fmt::Debug for RawCopier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawCopier")
            .field("bytes", &self.buffer.len())
            .finish_non_exhaustive()
    }
}

impl RawCopier {
    /// A buffer of `bytes` zeroed bytes on `device`, through raw cudarc.
    pub(crate) fn new(device: &Device, bytes: usize) -> Result<RawCopier, BenchError> {
        let ctx =
            CudaContext::new(ordinal(device)?).map_err(BenchError::driver("CudaContext::new"))?;
        // SAFETY: tracking is turned off before this context object creates any stream or
        // buffer; its one buffer is allocated, used and freed on its one stream (module docs).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(BenchError::driver("CudaContext::new_stream"))?;
        let buffer = stream
            .alloc_zeros::<u8>(bytes)
            .map_err(BenchError::driver("CudaStream::alloc_zeros"))?;
        Ok(RawCopier { stream, buffer })
    }

    /// Copies `data` into the start of the buffer and waits for the copy.
    pub(crate) fn upload(&mut self, data: &[u8]) -> Result<(), BenchError> {
        let mut dst = self.buffer.slice_mut(..data.len());
        self.stream
            .memcpy_htod(data, &mut dst)
            .map_err(BenchError::driver("CudaStream::memcpy_htod"))?;
        self.stream
            .synchronize()
            .map_err(BenchError::driver("CudaStream::synchronize"))
    }

    /// Copies the start of the buffer into `out` and waits for the copy.
    pub(crate) fn download(&mut self, out: &mut [u8]) -> Result<(), BenchError> {
        let src = self.buffer.slice(..out.len());
        self.stream
            .memcpy_dtoh(&src, out)
            .map_err(BenchError::driver("CudaStream::memcpy_dtoh"))?;
        self.stream
            .synchronize()
            .map_err(BenchError::driver("CudaStream::synchronize"))
    }
}

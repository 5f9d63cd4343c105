//! Kernels: CUDA C source compiled by NVRTC on first launch (cached per device), with an
//! optional host implementation in Rust over the same typed arguments.
//!
//! A launch is checked before it reaches a backend: the configuration against the device's
//! limits ([`DeviceError::InvalidLaunch`]), every buffer against the stream's device, and on
//! the host backend every argument's element type against what the host implementation reads
//! ([`DeviceError::InvalidArgument`]).

use std::any::TypeId;
use std::fmt;

use smallvec::SmallVec;

mod params;

use crate::access::{ordered, Access, Accesses};
use crate::backend::{cuda, host};
use crate::device::{Device, DeviceId, DeviceLimits};
use crate::error::{BackendKind, DeviceError, Result};
use crate::memory::{BufferView, DeviceCopy, Memory};
use crate::stream::{Stream, StreamBackend};
use crate::sync::{Arc, Mutex};

/// Grid and block dimensions and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks along x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block along x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch of `grid` blocks of `block` threads.
    #[must_use]
    pub fn linear(grid: u32, block: u32) -> Self {
        LaunchConfig {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Enough 256-thread blocks to give every one of `n` elements a thread (at least one block).
    #[must_use]
    pub fn for_num_elems(n: usize) -> Self {
        let blocks = n.div_ceil(256).clamp(1, i32::MAX as usize) as u32;
        Self::linear(blocks, 256)
    }

    /// The same launch with `bytes` of dynamic shared memory.
    #[must_use]
    pub fn with_shared_mem(mut self, bytes: u32) -> Self {
        self.shared_mem_bytes = bytes;
        self
    }

    /// Total threads per block.
    pub fn threads_per_block(&self) -> u64 {
        self.block.0 as u64 * self.block.1 as u64 * self.block.2 as u64
    }

    /// Total blocks.
    pub fn block_count(&self) -> u64 {
        self.grid.0 as u64 * self.grid.1 as u64 * self.grid.2 as u64
    }

    /// Checks the configuration against `limits`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidLaunch`] naming the limit that is exceeded.
    pub fn validate(&self, kernel: &str, limits: &DeviceLimits) -> Result<()> {
        let bad = |reason: String| {
            Err(DeviceError::InvalidLaunch {
                kernel: kernel.to_string(),
                reason,
            })
        };
        let g = [self.grid.0, self.grid.1, self.grid.2];
        let b = [self.block.0, self.block.1, self.block.2];
        if g.contains(&0) || b.contains(&0) {
            return bad(format!(
                "grid {:?} and block {:?} must be at least 1 in every dimension",
                self.grid, self.block
            ));
        }
        for (axis, name) in ["x", "y", "z"].iter().enumerate() {
            if b[axis] > limits.max_block_dim[axis] {
                return bad(format!(
                    "block.{name} = {} exceeds the device's limit of {}",
                    b[axis], limits.max_block_dim[axis]
                ));
            }
            if g[axis] > limits.max_grid_dim[axis] {
                return bad(format!(
                    "grid.{name} = {} exceeds the device's limit of {}",
                    g[axis], limits.max_grid_dim[axis]
                ));
            }
        }
        if self.threads_per_block() > limits.max_threads_per_block as u64 {
            return bad(format!(
                "{} threads per block exceed the device's limit of {}",
                self.threads_per_block(),
                limits.max_threads_per_block
            ));
        }
        if self.shared_mem_bytes > limits.max_shared_mem_per_block_optin {
            return bad(format!(
                "{} bytes of shared memory exceed the device's limit of {}",
                self.shared_mem_bytes, limits.max_shared_mem_per_block_optin
            ));
        }
        Ok(())
    }
}

#[derive(Clone)]
pub(crate) enum KernelArg<'a> {
    Buffer {
        mem: &'a Arc<Memory>,
        byte_offset: usize,
        byte_len: usize,
        ty: TypeId,
        ty_name: &'static str,
        writable: bool,
    },
    Scalar {
        bytes: [u8; 16],
        len: u8,
        ty: TypeId,
        ty_name: &'static str,
    },
}

impl<'a> KernelArgs<'a> {
    /// The buffers of the launch and how it uses them: outputs are written, inputs read.
    fn accesses(&self) -> Accesses<'a> {
        self.args
            .iter()
            .filter_map(|a| match a {
                KernelArg::Buffer { mem, writable, .. } => Some((
                    *mem,
                    if *writable {
                        Access::Write
                    } else {
                        Access::Read
                    },
                )),
                KernelArg::Scalar { .. } => None,
            })
            .collect()
    }
}

/// The arguments of one launch, in the order the kernel declares its parameters.
///
/// Buffers are passed to CUDA C as pointers to their first element (`const T*` for inputs,
/// `T*` for outputs) and scalars by value.
#[derive(Clone, Default)]
pub struct KernelArgs<'a> {
    pub(crate) args: SmallVec<[KernelArg<'a>; 8]>,
    pub(crate) error: Option<DeviceError>,
}

impl<'a> KernelArgs<'a> {
    /// No arguments yet.
    pub fn new() -> Self {
        KernelArgs::default()
    }

    fn buffer<T: DeviceCopy>(&mut self, view: BufferView<'a, T>, writable: bool) -> &mut Self {
        self.args.push(KernelArg::Buffer {
            mem: view.mem,
            byte_offset: view.byte_offset(),
            byte_len: view.byte_len(),
            ty: TypeId::of::<T>(),
            ty_name: std::any::type_name::<T>(),
            writable,
        });
        self
    }

    /// Adds a buffer the kernel only reads.
    pub fn input<T: DeviceCopy>(&mut self, view: impl Into<BufferView<'a, T>>) -> &mut Self {
        self.buffer(view.into(), false)
    }

    /// Adds a buffer the kernel writes (and may read).
    pub fn output<T: DeviceCopy>(&mut self, view: impl Into<BufferView<'a, T>>) -> &mut Self {
        self.buffer(view.into(), true)
    }

    /// Adds a scalar passed by value (at most 16 bytes).
    pub fn scalar<T: DeviceCopy>(&mut self, value: T) -> &mut Self {
        let src = bytemuck::bytes_of(&value);
        if src.len() > 16 {
            if self.error.is_none() {
                self.error = Some(DeviceError::InvalidArgument {
                    kernel: String::new(),
                    index: self.args.len(),
                    reason: format!(
                        "scalar of type {} is {} bytes; at most 16 are supported",
                        std::any::type_name::<T>(),
                        src.len()
                    ),
                });
            }
            return self;
        }
        let mut bytes = [0u8; 16];
        bytes[..src.len()].copy_from_slice(src);
        self.args.push(KernelArg::Scalar {
            bytes,
            len: src.len() as u8,
            ty: TypeId::of::<T>(),
            ty_name: std::any::type_name::<T>(),
        });
        self
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }
}

impl fmt::Debug for KernelArgs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for a in &self.args {
            match a {
                KernelArg::Buffer {
                    ty_name,
                    byte_len,
                    writable,
                    ..
                } => l.entry(&format_args!(
                    "{} {ty_name}[{byte_len} bytes]",
                    if *writable { "out" } else { "in" }
                )),
                KernelArg::Scalar { ty_name, .. } => l.entry(&format_args!("scalar {ty_name}")),
            };
        }
        l.finish()
    }
}

pub(crate) enum HostSlot<'a> {
    In {
        bytes: &'a [u8],
        ty: TypeId,
        ty_name: &'static str,
    },
    Out {
        bytes: Option<&'a mut [u8]>,
        ty: TypeId,
        ty_name: &'static str,
    },
    Scalar {
        bytes: [u8; 16],
        len: u8,
        ty: TypeId,
        ty_name: &'static str,
    },
}

/// What a host implementation sees of a launch: the configuration and typed access to the
/// arguments (by position, as in the CUDA C signature).
pub struct HostKernelArgs<'a> {
    pub(crate) kernel: &'a str,
    pub(crate) config: LaunchConfig,
    pub(crate) slots: Vec<HostSlot<'a>>,
}

impl<'a> HostKernelArgs<'a> {
    /// The launch configuration.
    pub fn config(&self) -> LaunchConfig {
        self.config
    }

    /// The kernel's name.
    pub fn kernel_name(&self) -> &str {
        self.kernel
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn mismatch(&self, index: usize, reason: String) -> DeviceError {
        DeviceError::InvalidArgument {
            kernel: self.kernel.to_string(),
            index,
            reason,
        }
    }

    /// The input buffer at `index`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidArgument`] when the argument is not an input buffer of `T`.
    pub fn input<T: DeviceCopy>(&self, index: usize) -> Result<&'a [T]> {
        match self.slots.get(index) {
            Some(HostSlot::In { bytes, ty, ty_name }) => {
                if *ty != TypeId::of::<T>() {
                    return Err(self.mismatch(
                        index,
                        format!(
                            "is a buffer of {ty_name}, read as {}",
                            std::any::type_name::<T>()
                        ),
                    ));
                }
                let bytes: &'a [u8] = bytes;
                bytemuck::try_cast_slice(bytes).map_err(|e| self.mismatch(index, e.to_string()))
            }
            Some(_) => Err(self.mismatch(index, "is not an input buffer".into())),
            None => Err(self.mismatch(index, format!("only {} arguments", self.slots.len()))),
        }
    }

    /// The output buffer at `index`; each output can be taken once per launch.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidArgument`] when the argument is not an output buffer of `T`, or
    /// was taken already.
    pub fn output<T: DeviceCopy>(&mut self, index: usize) -> Result<&'a mut [T]> {
        let n = self.slots.len();
        let kernel = self.kernel;
        let err = |reason: String| DeviceError::InvalidArgument {
            kernel: kernel.to_string(),
            index,
            reason,
        };
        match self.slots.get_mut(index) {
            Some(HostSlot::Out { bytes, ty, ty_name }) => {
                if *ty != TypeId::of::<T>() {
                    return Err(err(format!(
                        "is a buffer of {ty_name}, written as {}",
                        std::any::type_name::<T>()
                    )));
                }
                let taken = bytes
                    .take()
                    .ok_or_else(|| err("was already taken in this launch".into()))?;
                bytemuck::try_cast_slice_mut(taken).map_err(|e| err(e.to_string()))
            }
            Some(_) => Err(err("is not an output buffer".into())),
            None => Err(err(format!("only {n} arguments"))),
        }
    }

    /// The scalar at `index`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidArgument`] when the argument is not a scalar of `T`.
    pub fn scalar<T: DeviceCopy>(&self, index: usize) -> Result<T> {
        match self.slots.get(index) {
            Some(HostSlot::Scalar {
                bytes,
                len,
                ty,
                ty_name,
            }) => {
                if *ty != TypeId::of::<T>() {
                    return Err(self.mismatch(
                        index,
                        format!(
                            "is a scalar of {ty_name}, read as {}",
                            std::any::type_name::<T>()
                        ),
                    ));
                }
                bytemuck::try_pod_read_unaligned(&bytes[..*len as usize])
                    .map_err(|e| self.mismatch(index, e.to_string()))
            }
            Some(_) => Err(self.mismatch(index, "is not a scalar".into())),
            None => Err(self.mismatch(index, format!("only {} arguments", self.slots.len()))),
        }
    }
}

impl fmt::Debug for HostKernelArgs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostKernelArgs")
            .field("kernel", &self.kernel)
            .field("config", &self.config)
            .field("args", &self.slots.len())
            .finish()
    }
}

/// A host implementation of a kernel.
pub type HostKernelFn = dyn Fn(&mut HostKernelArgs<'_>) -> Result<()> + Send + Sync;

/// Compiled functions, one per device the kernel ran on.
type CompileCache = SmallVec<[(DeviceId, Arc<cuda::CompiledKernel>); 2]>;

pub(crate) struct KernelInner {
    pub(crate) name: Arc<str>,
    pub(crate) source: Arc<str>,
    pub(crate) options: Vec<String>,
    pub(crate) host: Option<Arc<HostKernelFn>>,
    compiled: Mutex<CompileCache>,
    /// The parameters the source declares, read at the first launch (`None`: unreadable).
    params: std::sync::OnceLock<Option<Vec<params::Param>>>,
}

/// A kernel: CUDA C source with an `extern "C" __global__` function named `name`, and an
/// optional host implementation. Cheap to clone.
///
/// Compiled modules are cached per device by (name, source, options): clones, and kernels
/// declared again from the same source, share one module, which stays loaded while the device
/// lives (captured graphs keep launching it).
///
/// # Examples
///
/// ```
/// use cuflow_runtime::{Device, DeviceBuffer, Kernel, KernelArgs, LaunchConfig};
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// // SAFETY: the source writes only x[0..n], and n is the length of the buffer passed.
/// let add_one = unsafe {
///     Kernel::new(
///         "add_one",
///         r#"extern "C" __global__ void add_one(float* x, unsigned n) {
///             unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
///             if (i < n) x[i] += 1.0f;
///         }"#,
///     )
/// }
/// .with_host(|args| {
///     let n = args.scalar::<u32>(1)? as usize;
///     for v in &mut args.output::<f32>(0)?[..n] {
///         *v += 1.0;
///     }
///     Ok(())
/// });
/// let stream = Device::host().new_stream()?;
/// let x = DeviceBuffer::from_host(&stream, &[1.0f32, 2.0])?;
/// add_one.launch(&stream, LaunchConfig::for_num_elems(2), KernelArgs::new().output(&x).scalar(2u32))?;
/// assert_eq!(x.to_host_vec(&stream)?, vec![2.0, 3.0]);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Kernel {
    inner: Arc<KernelInner>,
}

impl Kernel {
    /// Declares a kernel from CUDA C `source` whose entry point is `extern "C" __global__ void
    /// name(..)`. Nothing is compiled until the first launch on a CUDA device.
    ///
    /// Launching it is safe: the configuration is checked against the device, and the
    /// arguments against the parameters the source declares (their number, which are
    /// pointers, their element types). What no check can see is what the CUDA C code does with
    /// the memory it is given, hence `unsafe`.
    ///
    /// # Safety
    ///
    /// For every launch made through the checked API, the kernel must:
    /// - read and write only within the buffers passed to it, below the lengths its arguments
    ///   give it (an out-of-bounds access corrupts memory or faults the device);
    /// - write only the buffers passed as outputs ([`KernelArgs::output`]): cuflow orders
    ///   accesses across streams by what each launch declares, so a write through an input
    ///   races with other readers;
    /// - be free of data races between its own threads, and terminate.
    ///
    /// The host implementation given with [`Kernel::with_host`] is ordinary safe Rust and needs
    /// no such promise.
    pub unsafe fn new(name: impl Into<String>, source: impl Into<String>) -> Kernel {
        Kernel {
            inner: Arc::new(KernelInner {
                name: Arc::from(name.into()),
                source: Arc::from(source.into()),
                options: Vec::new(),
                host: None,
                compiled: Mutex::new(SmallVec::new()),
                params: std::sync::OnceLock::new(),
            }),
        }
    }

    fn modify(self, f: impl FnOnce(&mut KernelInner)) -> Kernel {
        let mut inner = match Arc::try_unwrap(self.inner) {
            Ok(inner) => inner,
            Err(shared) => KernelInner {
                name: shared.name.clone(),
                source: shared.source.clone(),
                options: shared.options.clone(),
                host: shared.host.clone(),
                compiled: Mutex::new(SmallVec::new()),
                params: std::sync::OnceLock::new(),
            },
        };
        f(&mut inner);
        inner.compiled.lock().clear();
        Kernel {
            inner: Arc::new(inner),
        }
    }

    /// Adds the host implementation, run by the host backend over the same arguments.
    pub fn with_host(
        self,
        f: impl Fn(&mut HostKernelArgs<'_>) -> Result<()> + Send + Sync + 'static,
    ) -> Kernel {
        self.modify(|k| k.host = Some(Arc::new(f)))
    }

    /// Adds an NVRTC option (e.g. `--use_fast_math`).
    pub fn with_compile_option(self, option: impl Into<String>) -> Kernel {
        let option = option.into();
        self.modify(|k| k.options.push(option))
    }

    /// The kernel's entry-point name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether the kernel has a host implementation.
    pub fn has_host_impl(&self) -> bool {
        self.inner.host.is_some()
    }

    /// Compiles the kernel for `device` now rather than at its first launch (no-op on host).
    ///
    /// Loading a module can wait for work in flight on the device, so a program that blocks a
    /// stream with a host function compiles its kernels before doing so.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Compile`] with the compiler log, or [`DeviceError::NoCompiler`].
    pub fn compile(&self, device: &Device) -> Result<()> {
        if let crate::device::DeviceBackend::Cuda(_) = device.backend() {
            self.compiled_for(device)?;
        }
        Ok(())
    }

    fn compiled_for(&self, device: &Device) -> Result<Arc<cuda::CompiledKernel>> {
        let id = device.id();
        {
            let cache = self.inner.compiled.lock();
            if let Some((_, k)) = cache.iter().find(|(d, _)| *d == id) {
                return Ok(k.clone());
            }
        }
        let crate::device::DeviceBackend::Cuda(cuda_device) = device.backend() else {
            return Err(DeviceError::usage("compiling for a non-CUDA device"));
        };
        let compiled =
            cuda_device.compile(&self.inner.name, &self.inner.source, &self.inner.options)?;
        let mut cache = self.inner.compiled.lock();
        if let Some((_, k)) = cache.iter().find(|(d, _)| *d == id) {
            return Ok(k.clone());
        }
        cache.push((id, compiled.clone()));
        Ok(compiled)
    }

    /// Enqueues the kernel on `stream`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidLaunch`] for a configuration the device cannot run,
    /// [`DeviceError::DeviceMismatch`] for a buffer of another device,
    /// [`DeviceError::Compile`] when the source does not compile,
    /// [`DeviceError::HostKernel`] on the host backend when there is no host implementation.
    pub fn launch(
        &self,
        stream: &Stream,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        if let Some(e) = &args.error {
            let mut e = e.clone();
            if let DeviceError::InvalidArgument { kernel, .. } = &mut e {
                *kernel = self.inner.name.to_string();
            }
            return Err(e);
        }
        let device = stream.device();
        config.validate(&self.inner.name, device.limits())?;
        let declared = self
            .inner
            .params
            .get_or_init(|| params::parse(&self.inner.source, &self.inner.name));
        if let Some(declared) = declared {
            params::check(&self.inner.name, declared, &args.args)?;
        }
        for (index, a) in args.args.iter().enumerate() {
            if let KernelArg::Buffer { mem, .. } = a {
                if mem.device != *device {
                    return Err(DeviceError::DeviceMismatch {
                        op: "Kernel::launch",
                        expected: device.to_string(),
                        found: format!(
                            "{} (argument {index} of `{}`)",
                            mem.device, self.inner.name
                        ),
                    });
                }
            }
        }
        match stream.backend() {
            StreamBackend::Host(s) => {
                let Some(f) = &self.inner.host else {
                    return Err(DeviceError::HostKernel {
                        kernel: self.inner.name.to_string(),
                        reason: "it has no host implementation; add one with Kernel::with_host, \
                                 or run it on a CUDA device"
                            .into(),
                    });
                };
                ordered(stream, "Kernel::launch", args.accesses(), || {
                    host::launch_host_kernel(s, self.inner.name.clone(), f.clone(), config, args)
                })
            }
            StreamBackend::Cuda(s) => {
                let compiled = self.compiled_for(device)?;
                ordered(stream, "Kernel::launch", args.accesses(), || {
                    s.launch(&compiled, config, args)
                })
            }
        }
    }

    /// Which backends can run this kernel.
    pub fn supports(&self, backend: BackendKind) -> bool {
        match backend {
            BackendKind::Host => self.has_host_impl(),
            BackendKind::Cuda => true,
        }
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.inner.name)
            .field("host_impl", &self.inner.host.is_some())
            .finish()
    }
}

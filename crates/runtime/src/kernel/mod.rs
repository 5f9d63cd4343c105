//! Kernels: CUDA C source compiled by NVRTC on first launch (cached per device), with an
//! optional host implementation in Rust over the same typed arguments.
//!
//! A launch is checked before it reaches a backend: the configuration against the device's
//! limits ([`DeviceError::InvalidLaunch`]), every buffer against the stream's device, and on
//! the host backend every argument's element type against what the host implementation reads
//! ([`DeviceError::InvalidArgument`]).
//!
//! One concept per file: [`Kernel`] here, [`LaunchConfig`] in `config.rs`, the arguments
//! ([`KernelArgs`], [`HostKernelArgs`]) in `args.rs`, and the parameters the CUDA C source
//! declares, with the check of a launch's arguments against them, in `params/`.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;

mod args;
mod config;
mod params;

pub use args::{HostKernelArgs, HostKernelFn, KernelArgs};
pub(crate) use args::{HostSlot, KernelArg};
pub use config::LaunchConfig;
pub(crate) use params::SourceLayout;

use crate::access::{ordered_traced, Access, Accesses};
use crate::backend::{CompileCache, CompiledFor};
use crate::device::Device;
use crate::error::{BackendKind, DeviceError, Result};
use crate::memory::Memory;
use crate::stream::Stream;
use crate::trace::Work;

pub(crate) struct KernelInner {
    pub(crate) name: Arc<str>,
    pub(crate) source: Arc<str>,
    pub(crate) options: Vec<String>,
    pub(crate) host: Option<Arc<HostKernelFn>>,
    /// The function compiled for the first CUDA device the kernel ran on: read without a lock
    /// at every launch.
    pub(crate) compiled_first: std::sync::OnceLock<CompiledFor>,
    /// Compiled functions for the other CUDA devices the kernel ran on.
    pub(crate) compiled: Mutex<CompileCache>,
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
    /// pointers, which of those it may write, their element types). What no check can see is what the CUDA C code does with
    /// the memory it is given, hence `unsafe`.
    ///
    /// # Safety
    ///
    /// For every launch made through the checked API, the kernel must:
    /// - read and write only within the buffers passed to it, below the lengths its arguments
    ///   give it (an out-of-bounds access corrupts memory or faults the device);
    /// - write only through pointer parameters whose elements it does not declare `const`
    ///   (`float* y`, not `const float* x`): the launch hands such a parameter only a buffer
    ///   passed as an output ([`KernelArgs::output`]), and cuflow orders accesses across
    ///   streams by what each launch declares, so a write through a `const` parameter, which
    ///   may hold an input, races with other readers. Where the signature cannot be read from
    ///   the source (a macro declares it), the launch cannot tell; the kernel must then write
    ///   only the buffers its callers pass as outputs;
    /// - be free of data races between its own threads, and terminate.
    ///
    /// "Every launch" means every launch safe code can make with this kernel: any grid, block
    /// size and scalar values. A kernel that bounds its accesses by a length passed as a scalar
    /// can keep the promise only where every launch passes the true length: keep such a
    /// `Kernel` private to code that does (as cuflow's built-in kernels are kept), rather than
    /// hand it to callers who choose the scalars. The tensor crate's `Launch` appends each
    /// tensor's element count to the arguments, so a kernel launched through it can bound every
    /// access by values no caller chooses.
    ///
    /// The check knows a parameter's type only from the source itself: a type named by a header
    /// the source includes (`my_ptr_t x`, a pointer type declared there) is checked by kind as a
    /// value of unknown type, so a launch may pass any scalar for it (on CUDA, one of its size).
    /// A kernel that dereferences such a parameter cannot keep the promise above for scalars
    /// that safe code chooses: spell pointer parameters out in the source (`float* x`), where
    /// the check sees them.
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
                compiled_first: std::sync::OnceLock::new(),
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
                compiled_first: std::sync::OnceLock::new(),
                compiled: Mutex::new(SmallVec::new()),
                params: std::sync::OnceLock::new(),
            },
        };
        f(&mut inner);
        inner.compiled_first = std::sync::OnceLock::new();
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

    /// Adds an NVRTC option, one of those that change how the source is compiled but not what
    /// it declares:
    ///
    /// - `--use_fast_math`, `-lineinfo` (`--generate-line-info`), `-G` (`--device-debug`),
    ///   `--extra-device-vectorization`;
    /// - `--maxrregcount=N`;
    /// - `--ftz=`, `--prec-div=`, `--prec-sqrt=`, `--fmad=`, each `true` or `false`;
    ///
    /// each also with a single dash where NVRTC takes one (`-use_fast_math`,
    /// `-maxrregcount=N`, `-ftz=true`).
    ///
    /// Kernels are compiled as C++17, and `-std=` (`--std=`) is refused: the standard is
    /// not the kernel's to choose, and a second one beside cuflow's would make the compile
    /// depend on how NVRTC treats a repeated option.
    ///
    /// Other options are refused: a launch is checked against the parameters read from the
    /// source as written, and [`Kernel::new`]'s promise covers that source, so an option that
    /// changes its meaning (`-Dfloat=double`, `-DN=..`, `-include`, `-U`) would let a safe
    /// caller launch a kernel neither the check nor the promise covered. Write macros in the
    /// source instead (`#define N 256`), where the check reads them. The allowed options do
    /// predefine macros (`__USE_FAST_MATH__`, `__CUDACC_DEBUG__`); a source that
    /// branches on them keeps its promise under each, as it does for every device it may be
    /// compiled for.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidArgument`] for an option not listed above, naming it, whose
    /// `index` is the number of options the kernel had before it.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{DeviceError, Kernel};
    /// # fn main() -> Result<(), DeviceError> {
    /// let source = r#"extern "C" __global__ void k(float* x, unsigned n) {
    ///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    ///     if (i < n) x[i] = __expf(x[i]);
    /// }"#;
    /// // SAFETY: the source writes only x[0..n], and n is the length of the buffer passed.
    /// let k = unsafe { Kernel::new("k", source) }.with_compile_option("--use_fast_math")?;
    /// assert!(matches!(
    ///     k.with_compile_option("-Dfloat=double"),
    ///     Err(DeviceError::InvalidArgument { .. })
    /// ));
    /// # Ok(()) }
    /// ```
    pub fn with_compile_option(self, option: impl Into<String>) -> Result<Kernel> {
        fn allowed(option: &str) -> bool {
            let Some(option) = option
                .strip_prefix("--")
                .or_else(|| option.strip_prefix('-'))
            else {
                return false;
            };
            let value = |name: &str| {
                option
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix('='))
            };
            let boolean = |v: Option<&str>| matches!(v, Some("true" | "false"));
            matches!(
                option,
                "use_fast_math"
                    | "lineinfo"
                    | "generate-line-info"
                    | "G"
                    | "device-debug"
                    | "extra-device-vectorization"
            ) || value("maxrregcount")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                || ["ftz", "prec-div", "prec-sqrt", "fmad"]
                    .iter()
                    .any(|name| boolean(value(name)))
        }
        let option = option.into();
        let standard = option
            .strip_prefix("--")
            .or_else(|| option.strip_prefix('-'))
            .and_then(|o| o.strip_prefix("std"))
            .is_some_and(|v| !v.contains(char::is_whitespace));
        if standard {
            return Err(DeviceError::InvalidArgument {
                kernel: self.inner.name.to_string(),
                index: self.inner.options.len(),
                reason: format!(
                    "compile option `{option}` chooses the C++ standard, but kernels are always \
                     compiled as C++17; remove the option (a source that needs another \
                     standard's features cannot be compiled by cuflow)"
                ),
            });
        }
        if !allowed(&option) {
            return Err(DeviceError::InvalidArgument {
                kernel: self.inner.name.to_string(),
                index: self.inner.options.len(),
                reason: format!(
                    "compile option `{option}` is not one of those that cannot change what the \
                     source declares (--use_fast_math, -lineinfo, -G, \
                     --extra-device-vectorization, --maxrregcount=N, --ftz=, --prec-div=, \
                     --prec-sqrt=, --fmad= (true or false)); write macros in the source \
                     instead"
                ),
            });
        }
        Ok(self.modify(|k| k.options.push(option)))
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
        crate::backend::refuse_in_host_function()?;
        device.backend().compile_kernel(&self.inner, device.id())
    }

    /// Enqueues the kernel on `stream`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidLaunch`] for a configuration the device cannot run,
    /// [`DeviceError::DeviceMismatch`] for a buffer of another device,
    /// [`DeviceError::InvalidArgument`] for arguments that do not match the kernel's
    /// parameters, or for two buffer arguments that overlap in an allocation the launch writes
    /// (on every backend, so that no launch races with itself on a GPU), or, on CUDA with a
    /// driver older than CUDA 12.4 (which cannot report a compiled kernel's parameters), for
    /// every launch of a kernel whose source does not establish the number of parameters and
    /// the size of each by-value one (a macro declares it, declarations disagree, a struct
    /// or template type is passed by value), which nothing could check,
    /// [`DeviceError::Compile`] when the source does not compile,
    /// [`DeviceError::HostKernel`] on the host backend when there is no host implementation.
    pub fn launch(
        &self,
        stream: &Stream,
        config: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        // Before the compiled-module cache: the thread loading a module waits for the device.
        crate::backend::refuse_in_host_function()?;
        if let Some(e) = &args.error {
            return Err(self.argument_error(e));
        }
        let device = stream.device();
        config.validate(&self.inner.name, device.limits())?;
        if let Some(declared) = self.inner.declared() {
            params::check(&self.inner.name, declared, &args.args)?;
        }
        // One pass over the arguments: every buffer is of the stream's device, and the
        // accesses the launch is ordered by.
        let mut accesses = Accesses::new();
        for (index, a) in args.args.iter().enumerate() {
            if let KernelArg::Buffer { mem, writable, .. } = a {
                if mem.device != *device {
                    return Err(self.device_mismatch(index, device, &mem.device));
                }
                let access = if *writable {
                    Access::Write
                } else {
                    Access::Read
                };
                accesses.push((*mem, access));
            }
        }
        if accesses.len() > 1 {
            check_disjoint(&self.inner.name, &args.args)?;
        }
        // The host implementation, or the module compiled for this GPU (compiled now at the
        // first launch): resolved before the launch is ordered.
        let code = device.backend().kernel_code(&self.inner, device.id())?;
        let work = || Work::Kernel {
            name: self.inner.name.clone(),
            grid: config.grid,
            block: config.block,
            shared_bytes: config.shared_mem_bytes,
        };
        ordered_traced(stream, "Kernel::launch", work, accesses, || {
            stream
                .backend()
                .launch_kernel(&code, &self.inner.name, config, args)
        })
    }

    /// The error an argument recorded while the launch's arguments were built, naming this
    /// kernel.
    #[cold]
    #[inline(never)]
    fn argument_error(&self, e: &DeviceError) -> DeviceError {
        let mut e = e.clone();
        if let DeviceError::InvalidArgument { kernel, .. } = &mut e {
            *kernel = self.inner.name.to_string();
        }
        e
    }

    /// The error of argument `index`, a buffer of `other`, launched on a stream of `device`.
    #[cold]
    #[inline(never)]
    fn device_mismatch(&self, index: usize, device: &Device, other: &Device) -> DeviceError {
        DeviceError::device_mismatch(
            "Kernel::launch",
            format!("argument {index} of `{}`", self.inner.name),
            device,
            other,
        )
    }

    /// Which backends can run this kernel.
    pub fn supports(&self, backend: BackendKind) -> bool {
        match backend {
            BackendKind::Host => self.has_host_impl(),
            BackendKind::Cuda => true,
        }
    }
}

impl KernelInner {
    /// The parameters the source declares (`None`: no declaration found), read at the first
    /// call.
    #[inline]
    pub(crate) fn declared(&self) -> Option<&[params::Param]> {
        self.params
            .get_or_init(|| params::parse(&self.source, &self.name))
            .as_deref()
    }

    /// What the check against the source establishes about the memory a launch's arguments
    /// occupy (see [`SourceLayout`]).
    pub(crate) fn source_layout(&self) -> SourceLayout {
        SourceLayout::of(self.declared())
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

/// Refuses two buffer arguments whose ranges overlap in an allocation that any argument of the
/// launch writes: threads writing one while others read or write the other would race. Reads
/// may overlap in allocations the launch only reads. An empty range overlaps nothing and
/// writes nothing, wherever it lies. The host backend carves the same ranges out of each
/// allocation, so both backends refuse the same launches.
///
/// On the launch path, so it allocates nothing: a pairwise scan over the few arguments of a
/// launch, where distinct allocations cost one pointer comparison a pair.
fn check_disjoint(kernel: &str, args: &[KernelArg<&Arc<Memory>>]) -> Result<()> {
    fn range<'m>(a: &KernelArg<&'m Arc<Memory>>) -> Option<(&'m Arc<Memory>, usize, usize)> {
        match a {
            KernelArg::Buffer {
                mem,
                byte_offset,
                byte_len,
                ..
            } if *byte_len > 0 => Some((*mem, *byte_offset, byte_offset.saturating_add(*byte_len))),
            _ => None,
        }
    }
    let written = |mem: &Arc<Memory>| {
        args.iter().any(|a| {
            matches!(a, KernelArg::Buffer { mem: m, writable: true, byte_len, .. }
                if *byte_len > 0 && Arc::ptr_eq(m, mem))
        })
    };
    for (j, b) in args.iter().enumerate() {
        let Some((mem_b, start_b, end_b)) = range(b) else {
            continue;
        };
        for a in &args[..j] {
            let Some((mem_a, start_a, end_a)) = range(a) else {
                continue;
            };
            if Arc::ptr_eq(mem_a, mem_b) && start_a < end_b && start_b < end_a && written(mem_a) {
                return Err(DeviceError::InvalidArgument {
                    kernel: kernel.to_string(),
                    index: j,
                    reason: "overlaps another argument of the same buffer that the kernel \
                             writes"
                        .into(),
                });
            }
        }
    }
    Ok(())
}

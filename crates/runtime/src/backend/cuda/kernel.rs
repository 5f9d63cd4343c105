//! NVRTC compilation of CUDA C kernels into cubins for the device's architecture.

use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cudarc::driver::{sys, CudaFunction, CudaModule};
use cudarc::nvrtc;

use super::{driver_err, CudaDeviceShared, Life};
use crate::error::{DeviceError, Result};
use crate::kernel::{KernelArg, SourceLayout};

/// A kernel compiled and loaded for one device.
pub(crate) struct CompiledKernel {
    name: String,
    /// Dropped in `Drop`, unless the context was reset (then the driver unloaded the module).
    function: ManuallyDrop<CudaFunction>,
    module: ManuallyDrop<Arc<CudaModule>>,
    dynamic_smem_limit: AtomicU32,
    /// How launches are checked against the compiled function's parameters in memory.
    params: ParamCheck,
    life: Arc<Life>,
}

impl Drop for CompiledKernel {
    fn drop(&mut self) {
        let (function, module) = (&mut self.function, &mut self.module);
        self.life.release(|| {
            // SAFETY: each is dropped once, here, and not used after; skipped (leaked) when
            // the context was reset, which unloaded the module already.
            unsafe {
                ManuallyDrop::drop(function);
                ManuallyDrop::drop(module);
            }
        });
    }
}

impl CompiledKernel {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// `DeviceFaulted` when the kernel was loaded into another state of the device's context
    /// than `shared`'s (one from before a reset).
    pub(crate) fn check_state(&self, shared: &CudaDeviceShared) -> Result<()> {
        if Arc::ptr_eq(&self.life, &shared.life) {
            return Ok(());
        }
        self.life.check()?;
        shared.life.check()?;
        Err(DeviceError::usage(format!(
            "kernel `{}` was loaded for another device than the stream's",
            self.name
        )))
    }

    /// Checks a launch's arguments against the compiled function's parameters in memory (see
    /// [`ParamCheck`]).
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidArgument`] naming the first parameter that does not match, or
    /// saying why no launch of this kernel can be checked.
    #[inline]
    pub(crate) fn check_args<M>(&self, args: &[KernelArg<M>]) -> Result<()> {
        self.params.check(&self.name, args)
    }

    pub(crate) fn function(&self) -> sys::CUfunction {
        self.function.cu_function()
    }

    /// Raises the kernel's dynamic shared memory limit when a launch asks for more than the
    /// default 48 KiB (the launch config was already checked against the opt-in maximum).
    pub(crate) fn prepare_shared_mem(&self, bytes: u32) -> Result<()> {
        if bytes <= 48 * 1024 || bytes <= self.dynamic_smem_limit.load(Ordering::Acquire) {
            return Ok(());
        }
        self.function
            .set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(|e| driver_err("cuFuncSetAttribute", e))?;
        self.dynamic_smem_limit.fetch_max(bytes, Ordering::AcqRel);
        Ok(())
    }
}

fn nvrtc_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the candidate library names.
    *PRESENT.get_or_init(|| unsafe { nvrtc::sys::is_culib_present() })
}

fn include_paths() -> Vec<String> {
    let mut roots: Vec<String> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Ok(v) = std::env::var(var) {
            roots.push(format!("{v}/include"));
        }
    }
    roots.push("/usr/local/cuda/include".into());
    roots.push("/opt/cuda/include".into());
    roots
        .into_iter()
        .filter(|p| std::path::Path::new(p).join("cuda_fp16.h").exists())
        .collect()
}

fn compile_err(kernel: &str, log: impl Into<String>) -> DeviceError {
    DeviceError::Compile {
        kernel: kernel.to_string(),
        log: log.into(),
    }
}

/// Compiles `source` for `shared`'s architecture and loads the function `name`; `layout` is
/// what the check against the source establishes about its launches, which decides how they
/// are checked where the driver cannot report the function's parameters.
pub(crate) fn compile(
    shared: &CudaDeviceShared,
    name: &str,
    source: &str,
    extra: &[String],
    layout: &SourceLayout,
) -> Result<CompiledKernel> {
    if !nvrtc_present() {
        return Err(DeviceError::NoCompiler {
            reason: "libnvrtc.so could not be loaded".into(),
        });
    }
    let src =
        CString::new(source).map_err(|_| compile_err(name, "the source contains a NUL byte"))?;
    let prog_name = CString::new(format!("{name}.cu"))
        .map_err(|_| compile_err(name, "the kernel name contains a NUL byte"))?;
    let (major, minor) = shared.cc;
    let mut options = vec![
        format!("--gpu-architecture=sm_{major}{minor}"),
        "--std=c++17".to_string(),
    ];
    for p in include_paths() {
        options.push(format!("--include-path={p}"));
    }
    for o in extra {
        if o.contains('\0') {
            return Err(compile_err(
                name,
                format!("option {o:?} contains a NUL byte"),
            ));
        }
        options.push(o.clone());
    }
    let prog = nvrtc::result::create_program(&src, Some(&prog_name))
        .map_err(|e| compile_err(name, format!("nvrtcCreateProgram failed: {e}")))?;
    let guard = ProgramGuard(prog);
    // SAFETY: `prog` is a live program (destroyed only by `guard`); no option holds a NUL
    // byte (checked above), so the call cannot panic.
    let compiled = unsafe { nvrtc::result::compile_program(prog, &options) };
    if let Err(e) = compiled {
        // SAFETY: `prog` is live; the log is a NUL-terminated C string.
        let log = unsafe { nvrtc::result::get_program_log(prog) }
            .map(|raw| {
                let bytes: Vec<u8> = raw
                    .iter()
                    .take_while(|c| **c != 0)
                    .map(|c| *c as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_else(|_| String::new());
        return Err(compile_err(name, format!("{e}\n{log}")));
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is a valid out-pointer.
    unsafe { nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| compile_err(name, format!("nvrtcGetCUBINSize failed: {e}")))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported for the image.
    unsafe { nvrtc::sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut std::ffi::c_char) }
        .result()
        .map_err(|e| compile_err(name, format!("nvrtcGetCUBIN failed: {e}")))?;
    drop(guard);

    let _bound = shared.bind()?;
    let module = shared
        .ctx
        .load_module(nvrtc::Ptx::from_binary(cubin))
        .map_err(|e| driver_err("cuModuleLoadData", e))?;
    let function = module.load_function(name).map_err(|e| {
        compile_err(
            name,
            format!(
                "the module has no function `{name}` ({}); declare it `extern \"C\" __global__`",
                driver_err("cuModuleGetFunction", e)
            ),
        )
    })?;
    // Load the function now rather than lazily at its first launch, which may happen while a
    // stream is being captured (where loading is not permitted): querying an attribute loads it.
    function
        .num_regs()
        .map_err(|e| driver_err("cuFuncGetAttribute", e))?;
    let params = ParamCheck::decide(name, param_sizes(function.cu_function()), layout);
    Ok(CompiledKernel {
        name: name.to_string(),
        function: ManuallyDrop::new(function),
        module: ManuallyDrop::new(module),
        dynamic_smem_limit: AtomicU32::new(48 * 1024),
        params,
        life: shared.life.clone(),
    })
}

/// The size of each parameter of `function`, from `cuFuncGetParamInfo`; `None` when the loaded
/// driver lacks it (before CUDA 12.4) or fails.
///
/// Drivers of CUDA 13 and later say how many parameters there are (`cuFuncGetParamCount`), so
/// every query succeeds; older ones are asked index after index until the driver answers that
/// the index is past the last parameter (one expected `CUDA_ERROR_INVALID_VALUE`).
fn param_sizes(function: sys::CUfunction) -> Option<Vec<usize>> {
    type ParamInfoFn =
        unsafe extern "C" fn(sys::CUfunction, usize, *mut usize, *mut usize) -> sys::CUresult;
    type ParamCountFn = unsafe extern "C" fn(sys::CUfunction, *mut usize) -> sys::CUresult;
    // SAFETY: a CUDA device exists, so libcuda is loaded; looking a symbol up runs no code of
    // the library, and the symbol is only tested for presence here.
    let present = unsafe { sys::culib().get::<ParamInfoFn>(b"cuFuncGetParamInfo\0") }.is_ok();
    if !present {
        return None;
    }
    // SAFETY: as above; the symbol, when present, has the signature of the driver's
    // `CUresult cuFuncGetParamCount(CUfunction, size_t*)`.
    let count_fn = unsafe { sys::culib().get::<ParamCountFn>(b"cuFuncGetParamCount\0") };
    let count = match count_fn {
        Ok(count_fn) => {
            let mut count = 0usize;
            // SAFETY: `function` is a loaded function of a live module (kept by the caller) and
            // the out-pointer is valid for a write.
            match unsafe { count_fn(function, &mut count) } {
                sys::CUresult::CUDA_SUCCESS => Some(count),
                _ => return None,
            }
        }
        Err(_) => None,
    };
    let mut sizes = Vec::new();
    // A kernel's parameters fit in 32 KiB, which bounds the loop on a misbehaving driver.
    while sizes.len() <= 32 * 1024 && count.is_none_or(|n| sizes.len() < n) {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `function` is a loaded function of a live module (kept by the caller); both
        // out-pointers are valid for writes; the symbol exists (checked above), so the lazy
        // loader finds it.
        let r = unsafe { sys::cuFuncGetParamInfo(function, sizes.len(), &mut offset, &mut size) };
        match r {
            sys::CUresult::CUDA_SUCCESS => sizes.push(size),
            // Past the last parameter (asked only when the driver did not give the count).
            sys::CUresult::CUDA_ERROR_INVALID_VALUE if count.is_none() => return Some(sizes),
            _ => return None,
        }
    }
    count.map(|_| sizes)
}

struct ProgramGuard(nvrtc::sys::nvrtcProgram);

impl Drop for ProgramGuard {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once, here.
        if let Err(e) = unsafe { nvrtc::result::destroy_program(self.0) } {
            tracing::warn!("nvrtcDestroyProgram failed: {e}");
        }
    }
}

/// How the launches of one compiled kernel are checked against its parameters in memory (the
/// argument array the driver reads, one pointer per parameter, and behind each as many bytes
/// as the parameter's size), decided once when the kernel is loaded.
#[derive(Debug)]
enum ParamCheck {
    /// Against the size of each parameter as the driver reports it.
    Driver(Vec<usize>),
    /// By the check against the source alone, which established the number of parameters
    /// and every by-value parameter's size.
    Source,
    /// Neither check can establish them: every launch is refused with this error.
    Refused(DeviceError),
}

impl ParamCheck {
    /// The check for kernel `name`, from the parameter sizes the driver reported (`None`: a
    /// driver without `cuFuncGetParamInfo`, before CUDA 12.4) and what the check against the
    /// source established.
    fn decide(name: &str, driver: Option<Vec<usize>>, source: &SourceLayout) -> ParamCheck {
        if let Some(sizes) = driver {
            return ParamCheck::Driver(sizes);
        }
        let Some((index, what)) = source.gap() else {
            return ParamCheck::Source;
        };
        ParamCheck::Refused(DeviceError::InvalidArgument {
            kernel: name.to_string(),
            index,
            reason: format!(
                "no launch of this kernel can be checked on this device: {what}, and the CUDA \
                 driver did not report the compiled kernel's parameters (cuFuncGetParamInfo, \
                 in drivers of CUDA 12.4 and later), so the driver could read past the \
                 arguments given; declare the kernel's signature plainly in the source \
                 (`extern \"C\" __global__ void {name}(...)` with every parameter's type \
                 written out, a struct passed by value as a pointer or as a struct of one \
                 plain type the source defines), or use a driver of CUDA 12.4 or later"
            ),
        })
    }

    /// Checks a launch's arguments: against the driver's sizes, their count and each one's
    /// size (8 bytes for a buffer's device pointer), the driver's own account of the function
    /// beneath the check against the CUDA C signature (which also sees element types, and
    /// runs on every backend); nothing more where that check established the layout; and
    /// none passes where neither can.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidArgument`] naming the first parameter that does not match, or
    /// saying why no launch of this kernel can be checked.
    #[inline]
    fn check<M>(&self, name: &str, args: &[KernelArg<M>]) -> Result<()> {
        let sizes = match self {
            ParamCheck::Driver(sizes) => sizes,
            ParamCheck::Source => return Ok(()),
            ParamCheck::Refused(e) => return Err(e.clone()),
        };
        if sizes.len() != args.len() {
            return Err(DeviceError::InvalidArgument {
                kernel: name.to_string(),
                index: sizes.len().min(args.len()),
                reason: format!(
                    "the compiled kernel takes {} parameter(s), but the launch passes {}",
                    sizes.len(),
                    args.len()
                ),
            });
        }
        for (index, (&size, arg)) in sizes.iter().zip(args).enumerate() {
            let (given, what) = match arg {
                KernelArg::Buffer { .. } => (std::mem::size_of::<u64>(), "a buffer (a pointer)"),
                KernelArg::Scalar { len, ty_name, .. } => (usize::from(*len), *ty_name),
            };
            if given != size {
                return Err(DeviceError::InvalidArgument {
                    kernel: name.to_string(),
                    index,
                    reason: format!(
                        "the compiled kernel's parameter is {size} byte(s), but the launch \
                         passes {what} of {given} byte(s)"
                    ),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::any::TypeId;

    use super::*;

    fn buffer() -> KernelArg<()> {
        KernelArg::Buffer {
            mem: (),
            byte_offset: 0,
            byte_len: 32,
            ty: TypeId::of::<f64>(),
            ty_name: "f64",
            plain: None,
            elem_size: 8,
            writable: true,
        }
    }

    fn scalar(len: u8) -> KernelArg<()> {
        KernelArg::Scalar {
            bytes: [0; 16],
            len,
            ty: TypeId::of::<[u8; 4]>(),
            ty_name: "bytes",
            plain: None,
        }
    }

    fn unknown_layouts() -> Vec<SourceLayout> {
        vec![
            SourceLayout::NotDeclared,
            SourceLayout::Disputed,
            SourceLayout::UnsizedValue {
                index: 1,
                text: "struct M m".into(),
            },
            SourceLayout::Unresolved {
                index: 1,
                text: "real r".into(),
            },
        ]
    }

    #[test]
    fn the_driver_s_sizes_check_every_launch_whatever_the_source_established() {
        let mut layouts = unknown_layouts();
        layouts.push(SourceLayout::Established);
        for source in &layouts {
            let check = ParamCheck::decide("k", Some(vec![8, 4]), source);
            assert!(matches!(check, ParamCheck::Driver(_)), "{source:?}");
            assert!(check.check("k", &[buffer(), scalar(4)]).is_ok());
            assert!(matches!(
                check.check("k", &[buffer()]),
                Err(DeviceError::InvalidArgument { index: 1, .. })
            ));
            assert!(matches!(
                check.check("k", &[buffer(), scalar(2)]),
                Err(DeviceError::InvalidArgument { index: 1, .. })
            ));
            assert!(matches!(
                check.check("k", &[scalar(4), scalar(4)]),
                Err(DeviceError::InvalidArgument { index: 0, .. })
            ));
        }
    }

    #[test]
    fn without_the_driver_s_sizes_the_source_check_must_have_established_the_layout() {
        let check = ParamCheck::decide("k", None, &SourceLayout::Established);
        assert!(matches!(check, ParamCheck::Source));
        // The check against the source has run before: nothing more is checked here.
        assert!(check.check("k", &[buffer(), scalar(4)]).is_ok());
    }

    #[test]
    fn a_launch_neither_check_can_verify_is_refused() {
        for source in &unknown_layouts() {
            let check = ParamCheck::decide("k", None, source);
            for args in [vec![buffer(), scalar(4)], vec![], vec![scalar(16); 3]] {
                match check.check("k", &args) {
                    Err(DeviceError::InvalidArgument {
                        kernel,
                        index,
                        reason,
                    }) => {
                        assert_eq!(kernel, "k");
                        let (gap_index, _) = source.gap().expect("a gap");
                        assert_eq!(index, gap_index);
                        assert!(reason.contains("CUDA 12.4 or later"), "{reason}");
                        assert!(reason.contains("declare"), "{reason}");
                    }
                    other => panic!("{source:?}: expected InvalidArgument, got {other:?}"),
                }
            }
        }
    }
}

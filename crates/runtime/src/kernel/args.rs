//! The arguments of a launch: [`KernelArgs`] as the caller builds them (buffers with their
//! element types and whether the kernel writes them, scalars by value), and
//! [`HostKernelArgs`], the typed view a host implementation reads them through.

use std::any::TypeId;
use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use smallvec::SmallVec;

use super::params::Plain;
use super::LaunchConfig;
use crate::error::{DeviceError, Result};
use crate::memory::{BufferView, DeviceCopy, Memory};

/// One argument of a launch. `M` holds the buffer's memory: borrowed while the caller builds
/// the launch (`&Arc<Memory>`, in [`KernelArgs`]), owned by a host task that may run after the
/// caller dropped its buffers (`Arc<Memory>`).
#[derive(Clone)]
pub(crate) enum KernelArg<M> {
    Buffer {
        mem: M,
        byte_offset: usize,
        byte_len: usize,
        ty: TypeId,
        ty_name: &'static str,
        /// The element type as a plain C type, if it is one (see `params/`).
        plain: Option<Plain>,
        /// `size_of` the element type.
        elem_size: usize,
        writable: bool,
    },
    Scalar {
        bytes: [u8; 16],
        len: u8,
        ty: TypeId,
        ty_name: &'static str,
        /// The value's type as a plain C type, if it is one (see `params/`).
        plain: Option<Plain>,
    },
}

impl<M> KernelArg<M> {
    /// The same argument, its buffer's memory handle made by `f` from this one's.
    pub(crate) fn map_mem<N>(&self, f: impl FnOnce(&M) -> N) -> KernelArg<N> {
        match self {
            KernelArg::Buffer {
                mem,
                byte_offset,
                byte_len,
                ty,
                ty_name,
                plain,
                elem_size,
                writable,
            } => KernelArg::Buffer {
                mem: f(mem),
                byte_offset: *byte_offset,
                byte_len: *byte_len,
                ty: *ty,
                ty_name,
                plain: *plain,
                elem_size: *elem_size,
                writable: *writable,
            },
            KernelArg::Scalar {
                bytes,
                len,
                ty,
                ty_name,
                plain,
            } => KernelArg::Scalar {
                bytes: *bytes,
                len: *len,
                ty: *ty,
                ty_name,
                plain: *plain,
            },
        }
    }
}

/// The arguments of one launch, in the order the kernel declares its parameters.
///
/// Buffers are passed to CUDA C as pointers to their first element (`const T*` for inputs,
/// `T*` for outputs) and scalars by value.
#[derive(Clone, Default)]
pub struct KernelArgs<'a> {
    pub(crate) args: SmallVec<[KernelArg<&'a Arc<Memory>>; 8]>,
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
            plain: Plain::of_rust::<T>(),
            elem_size: std::mem::size_of::<T>(),
            writable,
        });
        self
    }

    /// Adds a buffer the kernel only reads: its parameter must be declared `const`
    /// (`const float* x`), or the launch is refused.
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
            plain: Plain::of_rust::<T>(),
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
    /// A buffer given with [`KernelArgs::output`]: taken once by [`HostKernelArgs::output`],
    /// or read (any number of times) by [`HostKernelArgs::input`], for a parameter the CUDA C
    /// declares `const` — not both in one launch.
    /// (Behind a lock, not a `Cell`: a host implementation may read its arguments from
    /// several threads.)
    Out {
        bytes: Mutex<Option<&'a mut [u8]>>,
        /// The bytes, once [`HostKernelArgs::input`] read them.
        read: OnceLock<&'a [u8]>,
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

    /// The input buffer at `index`: a buffer given with [`KernelArgs::input`], or one given
    /// with [`KernelArgs::output`] that the kernel only reads (as a CUDA C parameter declared
    /// `const` does), which [`HostKernelArgs::output`] then no longer gives in this launch.
    ///
    /// # Errors
    ///
    /// [`DeviceError::InvalidArgument`] when the argument is not a buffer of `T`, or is an
    /// output already taken with [`HostKernelArgs::output`].
    pub fn input<T: DeviceCopy>(&self, index: usize) -> Result<&'a [T]> {
        let of_t = |ty: &TypeId, ty_name: &str| {
            if *ty == TypeId::of::<T>() {
                return Ok(());
            }
            Err(self.mismatch(
                index,
                format!(
                    "is a buffer of {ty_name}, read as {}",
                    std::any::type_name::<T>()
                ),
            ))
        };
        let bytes: &'a [u8] = match self.slots.get(index) {
            Some(HostSlot::In { bytes, ty, ty_name }) => {
                of_t(ty, ty_name)?;
                bytes
            }
            Some(HostSlot::Out {
                bytes,
                read,
                ty,
                ty_name,
            }) => {
                // Checked before the output is taken: a refused read leaves it as it was.
                of_t(ty, ty_name)?;
                let mut writable = bytes.lock();
                match (read.get(), writable.take()) {
                    (Some(shared), _) => shared,
                    (None, Some(writable)) => {
                        let shared: &'a [u8] = writable;
                        read.get_or_init(|| shared)
                    }
                    (None, None) => {
                        return Err(self.mismatch(
                            index,
                            "is an output already taken with HostKernelArgs::output in this \
                             launch, so it cannot also be read as an input"
                                .into(),
                        ))
                    }
                }
            }
            Some(HostSlot::Scalar { .. }) => {
                return Err(self.mismatch(index, "is a scalar, not a buffer".into()))
            }
            None => {
                return Err(self.mismatch(index, format!("only {} arguments", self.slots.len())))
            }
        };
        if bytes.is_empty() {
            // Whatever the address of the empty range: it holds no element to align.
            return Ok(&[]);
        }
        bytemuck::try_cast_slice(bytes).map_err(|e| self.mismatch(index, e.to_string()))
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
            Some(HostSlot::Out {
                bytes,
                read,
                ty,
                ty_name,
            }) => {
                if *ty != TypeId::of::<T>() {
                    return Err(err(format!(
                        "is a buffer of {ty_name}, written as {}",
                        std::any::type_name::<T>()
                    )));
                }
                if read.get().is_some() {
                    return Err(err(
                        "was read with HostKernelArgs::input in this launch, so \
                                    it cannot also be written"
                            .into(),
                    ));
                }
                let taken = bytes
                    .get_mut()
                    .take()
                    .ok_or_else(|| err("was already taken in this launch".into()))?;
                if taken.is_empty() {
                    // As for an input: an empty range holds no element to align.
                    return Ok(&mut []);
                }
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

/// A host implementation may read its arguments from threads of its own.
const _: fn() = || {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<HostKernelArgs<'static>>();
};

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

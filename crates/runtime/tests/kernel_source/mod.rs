//! What the tests of the kernel-source reader share: argument lists of every kind, launches
//! on the host backend that report a panic with the source and the arguments, the detection
//! of a case that hangs (naming it), and the outcomes a launch documents.

#![allow(dead_code, unreachable_pub)]

pub mod check_model;
pub mod signatures;

use std::fmt::Write as _;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cuflow_runtime::{DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig, Stream};
use cuflow_testing::thread::HANG_LIMIT;
use rand::rngs::StdRng;
use rand::Rng;

/// A plain C element type, as the documented check compares them: integers of one size match
/// whatever their signedness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plain {
    Float(usize),
    BFloat16,
    Int(usize),
    Bool,
}

impl Plain {
    pub fn size(self) -> usize {
        match self {
            Plain::Float(n) | Plain::Int(n) => n,
            Plain::BFloat16 => 2,
            Plain::Bool => 1,
        }
    }
}

/// Declares the Rust types arguments are made of: [`RustTy`] names them, [`Buffer`] holds a
/// buffer of one.
macro_rules! rust_types {
    ($($name:ident: $t:ty => $plain:expr),* $(,)?) => {
        /// The element type of a buffer argument, or the type of a scalar.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum RustTy { $($name),* }

        impl RustTy {
            pub const ALL: &'static [RustTy] = &[$(RustTy::$name),*];

            pub fn size(self) -> usize {
                match self { $(RustTy::$name => std::mem::size_of::<$t>()),* }
            }

            /// The plain C type the check knows this type as, if any.
            pub fn plain(self) -> Option<Plain> {
                match self { $(RustTy::$name => $plain),* }
            }

            pub fn buffer(self, s: &Stream, len: usize) -> Result<Buffer, DeviceError> {
                Ok(match self {
                    $(RustTy::$name => Buffer::$name(DeviceBuffer::<$t>::alloc(s, len)?)),*
                })
            }

            pub fn push_scalar(self, args: &mut KernelArgs<'_>) {
                match self { $(RustTy::$name => { args.scalar(<$t>::default()); }),* }
            }
        }

        /// A buffer of one of the [`RustTy`]s.
        pub enum Buffer { $($name(DeviceBuffer<$t>)),* }

        impl Buffer {
            pub fn push<'a>(&'a self, args: &mut KernelArgs<'a>, writable: bool) {
                match self {
                    $(Buffer::$name(b) => {
                        if writable { args.output(b); } else { args.input(b); }
                    }),*
                }
            }
        }
    };
}

rust_types! {
    F32: f32 => Some(Plain::Float(4)),
    F64: f64 => Some(Plain::Float(8)),
    F16: half::f16 => Some(Plain::Float(2)),
    Bf16: half::bf16 => Some(Plain::BFloat16),
    I8: i8 => Some(Plain::Int(1)),
    U8: u8 => Some(Plain::Int(1)),
    I16: i16 => Some(Plain::Int(2)),
    U16: u16 => Some(Plain::Int(2)),
    I32: i32 => Some(Plain::Int(4)),
    U32: u32 => Some(Plain::Int(4)),
    I64: i64 => Some(Plain::Int(8)),
    U64: u64 => Some(Plain::Int(8)),
    Usize: usize => Some(Plain::Int(8)),
    Byte1: [u8; 1] => None,
    Bytes3: [u8; 3] => None,
    U16x2: [u16; 2] => None,
    U16x3: [u16; 3] => None,
    F32x2: [f32; 2] => None,
    F32x3: [f32; 3] => None,
    F32x4: [f32; 4] => None,
    F64x2: [f64; 2] => None,
    U64x4: [u64; 4] => None,
    U64x32: [u64; 32] => None,
}

/// One argument of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgSpec {
    /// A buffer of `len` elements, passed as an output (`writable`) or an input.
    Buffer {
        ty: RustTy,
        len: usize,
        writable: bool,
    },
    /// A scalar passed by value.
    Scalar(RustTy),
}

impl ArgSpec {
    pub fn random(rng: &mut StdRng) -> ArgSpec {
        let ty = RustTy::ALL[rng.gen_range(0..RustTy::ALL.len())];
        if rng.gen_bool(0.6) {
            ArgSpec::Buffer {
                ty,
                len: [0, 1, 3][rng.gen_range(0..3)],
                writable: rng.gen(),
            }
        } else {
            ArgSpec::Scalar(ty)
        }
    }
}

/// A kernel of `source` whose host implementation does nothing.
pub fn noop(name: &str, source: &str) -> Kernel {
    // SAFETY: every launch in this file is on the host backend, which never compiles nor runs
    // the CUDA C source, and the host implementation does nothing.
    unsafe { Kernel::new(name, source) }.with_host(|_| Ok(()))
}

/// Launches `k` on `s` with arguments made to `specs` (each buffer an allocation of its own),
/// and waits for it.
pub fn launch(k: &Kernel, s: &Stream, specs: &[ArgSpec]) -> Result<(), DeviceError> {
    let buffers: Vec<Option<(Buffer, bool)>> = specs
        .iter()
        .map(|a| match *a {
            ArgSpec::Buffer { ty, len, writable } => Ok(Some((ty.buffer(s, len)?, writable))),
            ArgSpec::Scalar(_) => Ok(None),
        })
        .collect::<Result<_, DeviceError>>()?;
    let mut args = KernelArgs::new();
    for (spec, buffer) in specs.iter().zip(&buffers) {
        match (buffer, spec) {
            (Some((b, writable)), _) => b.push(&mut args, *writable),
            (None, ArgSpec::Scalar(ty)) => ty.push_scalar(&mut args),
            (None, ArgSpec::Buffer { .. }) => {}
        }
    }
    k.launch(s, LaunchConfig::linear(1, 1), &args)?;
    s.synchronize()
}

/// `source` for a failure message: whole when short, else its start and end.
pub fn shown(source: &str) -> String {
    const KEEP: usize = 1500;
    if source.len() <= 2 * KEEP {
        return format!("{source}\n(as a Rust string: {source:?})");
    }
    let mut head = KEEP;
    while !source.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = source.len() - KEEP;
    while !source.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{:?} .. ({} bytes in all) .. {:?}",
        &source[..head],
        source.len(),
        &source[tail..]
    )
}

/// Launches kernel `name` of `source` with `specs`, failing the test with `what`, the source
/// and the arguments when the launch panics.
pub fn launch_unwinding(
    what: &str,
    name: &str,
    source: &str,
    specs: &[ArgSpec],
    s: &Stream,
) -> Result<(), DeviceError> {
    catch_unwind(AssertUnwindSafe(|| launch(&noop(name, source), s, specs))).unwrap_or_else(|_| {
        panic!(
            "{what}: the launch panicked\nkernel {name:?}, arguments {specs:?}\nsource:\n{}",
            shown(source)
        )
    })
}

/// The case a test is at, and since when: see [`naming_a_hang`].
pub type CurrentCase = Mutex<(String, Instant)>;

/// Runs `cases` on a thread of its own, which records each case in the slot it is given as it
/// starts it ([`at_case`]); fails the test naming the case when one has not finished within
/// [`HANG_LIMIT`], however many cases there are.
pub fn naming_a_hang(cases: impl FnOnce(&CurrentCase) + Send + 'static) {
    let current = Arc::new(Mutex::new((
        String::from("before the first case"),
        Instant::now(),
    )));
    let slot = Arc::clone(&current);
    let (done, finished) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        cases(&slot);
        let _ = done.send(());
    });
    loop {
        match finished.recv_timeout(Duration::from_millis(100)) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if let Err(panic) = worker.join() {
                    resume_unwind(panic);
                }
                return;
            }
            Err(RecvTimeoutError::Timeout) => {
                let (case, since) = &*current.lock().unwrap_or_else(PoisonError::into_inner);
                assert!(since.elapsed() < HANG_LIMIT, "the reader hung on {case}");
            }
        }
    }
}

/// Records in `current` that the test starts case `what` (see [`naming_a_hang`]).
pub fn at_case(current: &CurrentCase, what: &str, name: &str, source: &str) {
    *current.lock().unwrap_or_else(PoisonError::into_inner) = (
        format!("{what}, kernel {name:?} of the source\n{}", shown(source)),
        Instant::now(),
    );
}

/// Fails unless `outcome` is one the launch documents for a kernel with a host implementation
/// and a valid configuration: `Ok`, or an argument refused, naming the kernel and an index no
/// greater than the number of arguments (one past the last: an argument missing).
#[track_caller]
pub fn assert_documented(
    what: &str,
    name: &str,
    source: &str,
    specs: &[ArgSpec],
    outcome: &Result<(), DeviceError>,
) {
    match outcome {
        Ok(()) => {}
        Err(DeviceError::InvalidArgument {
            kernel,
            index,
            reason,
        }) if kernel == name && *index <= specs.len() && !reason.trim().is_empty() => {}
        Err(e) => panic!(
            "{what}: unexpected outcome {e:?}\nkernel {name:?}, arguments {specs:?}\nsource:\n{}",
            shown(source)
        ),
    }
}

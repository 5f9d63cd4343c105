//! The kernels the benchmarks launch: CUDA C sources shared by the cuflow kernels and the raw
//! cudarc baselines, so that both sides launch the same code.

use std::sync::Arc;

use cuflow::prelude::*;

/// Entry point of [`EMPTY_SRC`].
pub(crate) const EMPTY_NAME: &str = "empty_kernel";

/// An empty kernel without parameters: launch overhead only.
pub(crate) const EMPTY_SRC: &str = r#"extern "C" __global__ void empty_kernel() {}"#;

/// Entry point of [`EMPTY_ARG_SRC`].
pub(crate) const EMPTY_ARG_NAME: &str = "empty_kernel_arg";

/// An empty kernel with one pointer parameter that it never dereferences: launch overhead with
/// one buffer argument (the case where cudarc's event tracking does work).
pub(crate) const EMPTY_ARG_SRC: &str =
    r#"extern "C" __global__ void empty_kernel_arg(float* p) {}"#;

/// Entry point of [`INC_SRC`].
pub(crate) const INC_NAME: &str = "inc_kernel";

/// One thread adds 1 to `x[0]`: the tiny kernel of graph-replay measurements, whose effect
/// (a count of executions) checks that every node ran.
pub(crate) const INC_SRC: &str =
    r#"extern "C" __global__ void inc_kernel(float* x) { x[0] += 1.0f; }"#;

/// A single thread that spins for `cycles` SM clock cycles, then writes `out[0] += 1`.
pub(crate) const SPIN_SRC: &str = r#"
extern "C" __global__ void spin_kernel(unsigned long long* out, unsigned long long cycles) {
    long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) { }
    out[0] += 1ull;
}"#;

/// [`EMPTY_SRC`] as a cuflow kernel.
#[allow(unsafe_code)] // declaring a kernel from CUDA C source (see the SAFETY comment)
pub(crate) fn empty_kernel() -> Kernel {
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let kernel = unsafe { Kernel::new(EMPTY_NAME, EMPTY_SRC) };
    kernel.with_host(|_| Ok(()))
}

/// [`EMPTY_ARG_SRC`] as a cuflow kernel; pass it one `f32` buffer.
#[allow(unsafe_code)] // declaring a kernel from CUDA C source (see the SAFETY comment)
pub(crate) fn empty_arg_kernel() -> Kernel {
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let kernel = unsafe { Kernel::new(EMPTY_ARG_NAME, EMPTY_ARG_SRC) };
    kernel.with_host(|_| Ok(()))
}

/// [`INC_SRC`] as a cuflow kernel; pass it one `f32` buffer.
#[allow(unsafe_code)] // declaring a kernel from CUDA C source (see the SAFETY comment)
pub(crate) fn inc_kernel() -> Kernel {
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let kernel = unsafe { Kernel::new(INC_NAME, INC_SRC) };
    kernel.with_host(|args| {
        args.output::<f32>(0)?[0] += 1.0;
        Ok(())
    })
}

/// [`SPIN_SRC`] as a cuflow kernel; on the host it sleeps for about the same time.
#[allow(unsafe_code)] // declaring a kernel from CUDA C source (see the SAFETY comment)
pub(crate) fn spin_kernel() -> Kernel {
    // SAFETY: the kernel's source reads and writes only the elements of the buffers it is
    // given, below the counts it is given, and has no data race of its own.
    let kernel = unsafe { Kernel::new("spin_kernel", SPIN_SRC) };
    kernel.with_host(|args| {
        let cycles = args.scalar::<u64>(1)?;
        // About 2 GHz: cycles / 2000 microseconds.
        std::thread::sleep(std::time::Duration::from_micros(cycles / 2000));
        args.output::<u64>(0)?[0] += 1;
        Ok(())
    })
}

/// One empty-kernel launch as an op.
pub(crate) struct EmptyOp(pub(crate) Kernel);

impl DeviceOp for EmptyOp {
    type Output = ();
    fn execute(self, ctx: &mut ExecutionContext) -> Result<(), DeviceError> {
        self.0.launch(
            ctx.stream()?,
            LaunchConfig::linear(1, 1),
            &KernelArgs::new(),
        )
    }
}

cuflow::device_op::impl_op_boilerplate!([] EmptyOp);

/// One single-block spin kernel as an op, writing into its own counter.
pub(crate) struct SpinOp {
    pub(crate) kernel: Kernel,
    pub(crate) counter: Arc<DeviceBuffer<u64>>,
    pub(crate) cycles: u64,
}

impl DeviceOp for SpinOp {
    type Output = Arc<DeviceBuffer<u64>>;
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        self.kernel.launch(
            ctx.stream()?,
            LaunchConfig::linear(1, 1),
            KernelArgs::new().output(&*self.counter).scalar(self.cycles),
        )?;
        Ok(self.counter)
    }
}

//! The kernels the benchmarks launch, as cuflow kernels and as CUDA C for the raw baselines.

use std::sync::Arc;

use cuflow::prelude::*;

/// An empty kernel: launch overhead only.
pub(crate) const EMPTY_SRC: &str = r#"extern "C" __global__ void empty_kernel() {}"#;

/// A single thread that spins for `cycles` SM clock cycles, then writes `out[0] += 1`.
pub(crate) const SPIN_SRC: &str = r#"
extern "C" __global__ void spin_kernel(unsigned long long* out, unsigned long long cycles) {
    long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) { }
    out[0] += 1ull;
}"#;

pub(crate) fn empty_kernel() -> Kernel {
    Kernel::new("empty_kernel", EMPTY_SRC).with_host(|_| Ok(()))
}

pub(crate) fn spin_kernel() -> Kernel {
    Kernel::new("spin_kernel", SPIN_SRC).with_host(|args| {
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

//! Dropping in-flight futures frees nothing a kernel still uses. In its own test binary so that
//! no other test allocates while memory is counted.

use cuflow_device_op::{DeviceOp, DeviceOpExt, ExecutionContext};
use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig};
use cuflow_scheduler::StreamPoolRoundRobin;

struct FillSlowly(usize, Kernel);

impl DeviceOp for FillSlowly {
    type Output = DeviceBuffer<f32>;
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        let s = ctx.stream()?;
        let buf = DeviceBuffer::<f32>::alloc(s, self.0)?;
        self.1.launch(
            s,
            LaunchConfig::for_num_elems(self.0),
            KernelArgs::new()
                .output(&buf)
                .scalar(self.0 as u32)
                .scalar(200_000u64),
        )?;
        Ok(buf)
    }
}

#[test]
fn dropping_in_flight_futures_returns_memory_to_its_baseline() -> Result<(), DeviceError> {
    let device = Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable");
    let kernel = Kernel::new(
        "fill_slowly",
        r#"extern "C" __global__ void fill_slowly(float* x, unsigned n, unsigned long long cycles) {
            long long start = clock64();
            while ((unsigned long long)(clock64() - start) < cycles) { }
            for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
                x[i] = 1.0f;
        }"#,
    )
    .with_host(|args| {
        args.output::<f32>(0)?.fill(1.0);
        Ok(())
    });
    kernel.compile(&device)?;
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let baseline = device.bytes_in_use();
    for _ in 0..100 {
        let f = FillSlowly(1 << 16, kernel.clone()).schedule(&policy)?;
        drop(f);
    }
    device.synchronize()?;
    assert_eq!(device.bytes_in_use(), baseline);
    // The device is healthy: a later op completes.
    let out = futures::executor::block_on(FillSlowly(8, kernel).schedule(&policy)?)?;
    assert_eq!(out.to_host_vec(&device.new_stream()?)?, vec![1.0; 8]);
    Ok(())
}

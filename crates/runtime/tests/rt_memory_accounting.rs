//! Memory accounting, in its own test binary so that no other test allocates meanwhile.

use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig};

#[test]
fn bytes_in_use_returns_to_its_baseline_after_buffers_drop() -> Result<(), DeviceError> {
    let device = Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable");
    let s = device.new_stream()?;
    let before = device.bytes_in_use();
    let touch = Kernel::new(
        "touch",
        r#"extern "C" __global__ void touch(unsigned char* x, unsigned n) {
            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) x[i] = (unsigned char)i;
        }"#,
    )
    .with_host(|args| {
        for (i, v) in args.output::<u8>(0)?.iter_mut().enumerate() {
            *v = i as u8;
        }
        Ok(())
    });
    let mut live = Vec::new();
    for _ in 0..8 {
        let b = DeviceBuffer::<u8>::zeroed(&s, 1 << 20)?;
        touch.launch(
            &s,
            LaunchConfig::for_num_elems(1 << 20),
            KernelArgs::new().output(&b).scalar(1u32 << 20),
        )?;
        live.push(b);
    }
    assert_eq!(device.bytes_in_use(), before + 8 * (1 << 20));
    // Dropped while their kernels may still run: the frees are stream-ordered.
    drop(live);
    s.synchronize()?;
    assert_eq!(device.bytes_in_use(), before);
    let info = device.memory_info()?;
    assert!(info.total > 0 && info.free <= info.total);
    Ok(())
}

//! A program whose first use of the device comes from a thread with a 128 KiB stack: opening
//! the device (the driver's initialization) and the first compile work there. In a file of its
//! own, so that this test is the first in its process to open the device.

use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig};
use cuflow_testing::kernels::prefix_mut;
use cuflow_testing::thread::on_stack_of;

#[test]
fn a_device_first_opened_from_a_thread_with_a_small_stack_works() {
    let got = on_stack_of(128 * 1024, || -> Result<Vec<f32>, DeviceError> {
        let device = Device::auto()?;
        let s = device.new_stream()?;
        let x = DeviceBuffer::from_host(&s, &[1.0f32, -2.0, 3.5])?;
        // SAFETY: writes x[0..n] only, and this kernel stays in this test, whose one launch
        // passes the buffer's length as n.
        let k = unsafe {
            Kernel::new(
                "small_stack_negate",
                r#"extern "C" __global__ void small_stack_negate(float* x, unsigned n) {
                    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                    if (i < n) x[i] = -x[i];
                }"#,
            )
        }
        .with_host(|args| {
            let n = args.scalar::<u32>(1)? as usize;
            for v in prefix_mut("small_stack_negate", args.output::<f32>(0)?, n)? {
                *v = -*v;
            }
            Ok(())
        });
        k.launch(
            &s,
            LaunchConfig::for_num_elems(3),
            KernelArgs::new().output(&x).scalar(3u32),
        )?;
        x.to_host_vec(&s)
    })
    .expect("the device works");
    assert_eq!(got, vec![-1.0, 2.0, -3.5]);
}

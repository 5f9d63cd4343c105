//! Memory accounting, in its own process so that no other test allocates on the device
//! meanwhile.

use cuflow_runtime::{DeviceBuffer, DeviceError};
use cuflow_testing::{
    device::device,
    kernels::launch_add_one,
    rng::{random_f32, rng},
};

#[test]
fn bytes_in_use_returns_to_its_baseline_after_buffers_drop() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let other = device.new_stream()?;
    let before = device.bytes_in_use();

    let mut live = Vec::new();
    for n in [1usize, 1000, 4097, (1 << 20) + 3] {
        let b = DeviceBuffer::from_host(&s, &random_f32(&mut rng(), n))?;
        launch_add_one(&s, &b)?;
        live.push(b);
    }
    let bytes: usize = live.iter().map(|b| b.len() * 4).sum();
    assert_eq!(device.bytes_in_use(), before + bytes);
    let bytes_u8 = DeviceBuffer::<u8>::zeroed(&other, 333)?;
    let words = DeviceBuffer::<u64>::zeroed(&other, 7)?;
    assert_eq!(device.bytes_in_use(), before + bytes + 333 + 56);

    // Dropped while their kernels may still run: the frees are ordered after them.
    drop(live);
    drop(bytes_u8);
    s.synchronize()?;
    other.synchronize()?;
    assert_eq!(device.bytes_in_use(), before + 56);
    drop(words);
    other.synchronize()?;
    assert_eq!(device.bytes_in_use(), before);

    // A buffer captured into a graph stays counted while the graph holds it.
    let x = DeviceBuffer::<f32>::zeroed(&s, 1024)?;
    s.synchronize()?;
    s.begin_capture()?;
    launch_add_one(&s, &x)?;
    let graph = s.end_capture()?;
    let exec = graph.instantiate()?;
    drop(x);
    exec.launch(&s)?;
    s.synchronize()?;
    assert_eq!(
        device.bytes_in_use(),
        before + 4096,
        "the graph's buffer was freed"
    );
    drop(graph);
    assert_eq!(
        device.bytes_in_use(),
        before + 4096,
        "the executable's buffer was freed"
    );
    drop(exec);
    s.synchronize()?;
    assert_eq!(device.bytes_in_use(), before);

    let info = device.memory_info()?;
    assert!(info.total > 0 && info.free <= info.total);
    Ok(())
}

//! The device's memory pool: statistics (in use, reserved, high-water marks and their reset),
//! the release threshold, trimming, and memory that a captured graph keeps. One test, in its
//! own process, so that nothing else allocates on the device meanwhile.

use cuflow_runtime::{DeviceBuffer, DeviceError, PoolStats};
use cuflow_testing::{device::device, kernels::launch_add_one};

const MIB: usize = 1 << 20;

fn check_consistent(stats: PoolStats, when: &str) {
    assert!(stats.peak_in_use >= stats.in_use, "{when}: {stats:?}");
    assert!(stats.reserved >= stats.in_use, "{when}: {stats:?}");
    assert!(stats.peak_reserved >= stats.reserved, "{when}: {stats:?}");
}

#[test]
fn pool_statistics_threshold_and_capture() -> Result<(), DeviceError> {
    let device = device();
    let pool = device.memory_pool();
    let s = device.new_stream()?;
    assert_eq!(pool.device(), &device);
    // The default keeps every freed byte.
    assert_eq!(pool.release_threshold()?, u64::MAX);

    // In use and its high-water mark follow allocations and frees.
    s.synchronize()?;
    pool.reset_peak()?;
    let base = pool.stats()?;
    check_consistent(base, "at the start");
    assert_eq!(
        base.peak_in_use, base.in_use,
        "a reset peak is the current value"
    );
    let a = DeviceBuffer::<f32>::zeroed(&s, 16 * MIB / 4)?;
    let b = DeviceBuffer::<u8>::zeroed(&s, 8 * MIB)?;
    let both = pool.stats()?;
    check_consistent(both, "with two buffers");
    assert_eq!(both.in_use, base.in_use + 24 * MIB);
    assert_eq!(both.peak_in_use, base.in_use + 24 * MIB);
    assert!(both.reserved >= base.in_use + 24 * MIB);
    drop(a);
    s.synchronize()?;
    let one = pool.stats()?;
    check_consistent(one, "after a free");
    assert_eq!(one.in_use, base.in_use + 8 * MIB);
    assert_eq!(one.peak_in_use, base.in_use + 24 * MIB, "the peak stays");

    // Resetting the peak brings it down to what is in use now.
    pool.reset_peak()?;
    let reset = pool.stats()?;
    assert_eq!(reset.peak_in_use, one.in_use);
    assert!(reset.peak_reserved >= reset.reserved);
    drop(b);
    s.synchronize()?;

    // With a release threshold of 0, a synchronization returns freed memory to the driver:
    // what the pool reserves drops by (at least) a freed 64 MiB buffer.
    pool.set_release_threshold(0)?;
    assert_eq!(pool.release_threshold()?, 0);
    let big = DeviceBuffer::<u8>::zeroed(&s, 64 * MIB)?;
    s.synchronize()?;
    let held = pool.stats()?;
    drop(big);
    s.synchronize()?;
    let released = pool.stats()?;
    check_consistent(released, "after a release");
    assert_eq!(released.in_use, held.in_use - 64 * MIB);
    assert!(
        released.reserved + 64 * MIB <= held.reserved,
        "threshold 0 keeps freed memory: {held:?} then {released:?}"
    );

    // With everything kept, trimming returns what is free.
    pool.set_release_threshold(u64::MAX)?;
    let big = DeviceBuffer::<u8>::zeroed(&s, 64 * MIB)?;
    drop(big);
    s.synchronize()?;
    pool.trim_to(0)?;
    let trimmed = pool.stats()?;
    check_consistent(trimmed, "after a trim");
    assert!(
        trimmed.reserved + 64 * MIB <= held.reserved,
        "{held:?} then {trimmed:?}"
    );

    // A buffer allocated during a capture is kept by the graph: in use while the graph
    // lives, released when it goes.
    let x = DeviceBuffer::<f32>::zeroed(&s, 1024)?;
    s.synchronize()?;
    let before_capture = pool.stats()?.in_use;
    s.begin_capture()?;
    let scratch = DeviceBuffer::<f32>::zeroed(&s, 4 * MIB / 4)?;
    launch_add_one(&s, &scratch)?;
    launch_add_one(&s, &x)?;
    let graph = s.end_capture()?;
    let exec = graph.instantiate()?;
    drop(scratch);
    drop(graph);
    exec.launch(&s)?;
    s.synchronize()?;
    pool.trim_to(0)?;
    let captured = pool.stats()?;
    assert_eq!(
        captured.in_use,
        before_capture + 4 * MIB,
        "the graph keeps its buffer"
    );
    assert!(
        captured.reserved >= captured.in_use,
        "trimming cannot take it: {captured:?}"
    );
    drop(exec);
    s.synchronize()?;
    assert_eq!(
        pool.stats()?.in_use,
        before_capture,
        "released with the graph"
    );
    Ok(())
}

//! The runtime's conformance suite: written once against the public API, run on whatever
//! `Device::auto()` gives (the host backend in CI; CUDA under `CUFLOW_DEVICE=cuda`, where a
//! device that cannot be reached fails the tests instead of skipping them).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_runtime::{
    BackendKind, Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig, PinnedBuffer,
};
use rand::Rng;

fn device() -> Device {
    Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable")
}

fn random_f32(n: usize) -> Vec<f32> {
    let mut rng = rand::thread_rng();
    (0..n).map(|_| rng.gen_range(-10.0f32..10.0)).collect()
}

fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(1e-300)).sqrt()
}

fn saxpy() -> Kernel {
    Kernel::new(
        "saxpy",
        r#"extern "C" __global__ void saxpy(float* y, const float* x, float a, unsigned n) {
            for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
                 i += blockDim.x * gridDim.x) {
                y[i] = a * x[i] + y[i];
            }
        }"#,
    )
    .with_host(|args| {
        let x = args.input::<f32>(1)?;
        let a = args.scalar::<f32>(2)?;
        for (y, x) in args.output::<f32>(0)?.iter_mut().zip(x) {
            *y += a * x;
        }
        Ok(())
    })
}

/// `out[r * cols + c] = in[c * rows + r]` with a 2-D launch.
fn transpose() -> Kernel {
    Kernel::new(
        "transpose2d",
        r#"extern "C" __global__ void transpose2d(float* out, const float* in,
                                                  unsigned rows, unsigned cols) {
            unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
            unsigned r = blockIdx.y * blockDim.y + threadIdx.y;
            if (r < rows && c < cols) out[r * cols + c] = in[c * rows + r];
        }"#,
    )
    .with_host(|args| {
        let input = args.input::<f32>(1)?;
        let rows = args.scalar::<u32>(2)? as usize;
        let cols = args.scalar::<u32>(3)? as usize;
        let out = args.output::<f32>(0)?;
        for r in 0..rows {
            for c in 0..cols {
                out[r * cols + c] = input[c * rows + r];
            }
        }
        Ok(())
    })
}

/// One thread waits a long time, then writes `value` into `out[0]`.
fn slow_write() -> Kernel {
    Kernel::new(
        "slow_write",
        r#"extern "C" __global__ void slow_write(float* out, float value, unsigned long long cycles) {
            long long start = clock64();
            while ((unsigned long long)(clock64() - start) < cycles) { }
            out[0] = value;
        }"#,
    )
    .with_host(|args| {
        let value = args.scalar::<f32>(1)?;
        std::thread::sleep(std::time::Duration::from_millis(50));
        args.output::<f32>(0)?[0] = value;
        Ok(())
    })
}

fn add_one() -> Kernel {
    Kernel::new(
        "add_one",
        r#"extern "C" __global__ void add_one(float* x, unsigned n) {
            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) x[i] += 1.0f;
        }"#,
    )
    .with_host(|args| {
        for v in args.output::<f32>(0)? {
            *v += 1.0;
        }
        Ok(())
    })
}

#[test]
fn copies_round_trip_random_data_of_odd_sizes() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let mut rng = rand::thread_rng();
    for n in [1usize, 7, 1000, 4097, (1 << 20) + 3] {
        let f: Vec<f32> = random_f32(n);
        assert_eq!(
            DeviceBuffer::from_host(&stream, &f)?.to_host_vec(&stream)?,
            f
        );
        let b: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        assert_eq!(
            DeviceBuffer::from_host(&stream, &b)?.to_host_vec(&stream)?,
            b
        );
        let d: Vec<f64> = (0..n).map(|_| rng.gen()).collect();
        assert_eq!(
            DeviceBuffer::from_host(&stream, &d)?.to_host_vec(&stream)?,
            d
        );
        let i: Vec<i64> = (0..n).map(|_| rng.gen()).collect();
        let buf = DeviceBuffer::from_host(&stream, &i)?;
        let copy = DeviceBuffer::<i64>::alloc(&stream, n)?;
        copy.copy_from(&stream, &buf)?;
        assert_eq!(copy.to_host_vec(&stream)?, i);
    }
    Ok(())
}

#[test]
fn sub_views_write_at_their_offset_only() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let n = 1001;
    let buf = DeviceBuffer::<u32>::alloc(&stream, n)?;
    buf.view().fill_bytes(&stream, 0xAB)?;
    let patch: Vec<u32> = (0..100).collect();
    buf.slice(300..400)?.copy_from_host(&stream, &patch)?;
    let got = buf.to_host_vec(&stream)?;
    for (i, v) in got.iter().enumerate() {
        let want = if (300..400).contains(&i) {
            (i - 300) as u32
        } else {
            0xABAB_ABAB
        };
        assert_eq!(*v, want, "element {i}");
    }
    assert_eq!(
        buf.slice(395..)?.slice(..5)?.to_host_vec(&stream)?,
        vec![95, 96, 97, 98, 99]
    );
    assert!(matches!(
        buf.slice(1000..1002),
        Err(DeviceError::InvalidShape { .. })
    ));
    assert!(matches!(
        buf.copy_from_host(&stream, &[1, 2, 3]),
        Err(DeviceError::LengthMismatch { .. })
    ));
    Ok(())
}

#[test]
fn pinned_buffers_round_trip_asynchronously() -> Result<(), DeviceError> {
    let device = device();
    let stream = device.new_stream()?;
    let n = 4097;
    let data = random_f32(n);
    let mut pinned = PinnedBuffer::<f32>::new(&device, n)?;
    pinned.as_mut_slice().copy_from_slice(&data);
    let dev = DeviceBuffer::<f32>::alloc(&stream, n)?;
    let pinned = pinned.copy_to_device(&stream, dev.view())?.wait()?;
    let back = PinnedBuffer::<f32>::new(&device, n)?;
    let back = back.copy_from_device(&stream, dev.view())?.wait()?;
    assert_eq!(&*back.as_slice(), &data[..]);
    assert_eq!(&*pinned.as_slice(), &data[..]);
    Ok(())
}

#[test]
fn a_kernel_gives_the_same_values_on_this_device_and_the_host() -> Result<(), DeviceError> {
    let device = device();
    let host = Device::host();
    for n in [1usize, 7, 1000, 4097, 100_003] {
        let x = random_f32(n);
        let y = random_f32(n);
        let a = 1.7f32;
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(x, y)| a as f64 * *x as f64 + *y as f64)
            .collect();
        let mut results = Vec::new();
        for d in [&device, &host] {
            let s = d.new_stream()?;
            let xb = DeviceBuffer::from_host(&s, &x)?;
            let yb = DeviceBuffer::from_host(&s, &y)?;
            saxpy().launch(
                &s,
                LaunchConfig::linear(7, 128),
                KernelArgs::new()
                    .output(&yb)
                    .input(&xb)
                    .scalar(a)
                    .scalar(n as u32),
            )?;
            results.push(yb.to_host_vec(&s)?);
        }
        for r in &results {
            assert!(
                rel_err(r, &want) < 1e-6,
                "n = {n}: error {}",
                rel_err(r, &want)
            );
        }
    }
    // A 2-D launch.
    let (rows, cols) = (37u32, 1001u32);
    let input = random_f32((rows * cols) as usize);
    let s = device.new_stream()?;
    let ib = DeviceBuffer::from_host(&s, &input)?;
    let ob = DeviceBuffer::<f32>::alloc(&s, input.len())?;
    ob.view().fill_bytes(&s, 0xFF)?;
    let cfg = LaunchConfig {
        grid: (cols.div_ceil(32), rows.div_ceil(8), 1),
        block: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    transpose().launch(
        &s,
        cfg,
        KernelArgs::new()
            .output(&ob)
            .input(&ib)
            .scalar(rows)
            .scalar(cols),
    )?;
    let out = ob.to_host_vec(&s)?;
    for r in 0..rows as usize {
        for c in 0..cols as usize {
            assert_eq!(out[r * cols as usize + c], input[c * rows as usize + r]);
        }
    }
    Ok(())
}

#[test]
fn a_reader_waiting_on_an_event_sees_the_writers_data() -> Result<(), DeviceError> {
    let device = device();
    let a = device.new_stream()?;
    let b = device.new_stream()?;
    let buf = DeviceBuffer::from_host(&a, &[0.0f32])?;
    let copy = DeviceBuffer::from_host(&b, &[-1.0f32])?;
    a.synchronize()?;
    b.synchronize()?;
    // ~50 ms at 2 GHz on CUDA; a sleep of the same order on the host.
    slow_write().launch(
        &a,
        LaunchConfig::linear(1, 1),
        KernelArgs::new()
            .output(&buf)
            .scalar(42.0f32)
            .scalar(100_000_000u64),
    )?;
    b.wait_event(&a.record_event()?)?;
    copy.copy_from(&b, &buf)?;
    b.synchronize()?;
    let mut out = [0.0f32];
    copy.view().copy_to_host(&b, &mut out)?;
    assert_eq!(out[0], 42.0, "stream b read before stream a's write landed");
    Ok(())
}

#[test]
fn capture_and_replay_n_times_has_n_times_the_effect() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let n = 1000;
    let x = DeviceBuffer::<f32>::zeroed(&s, n)?;
    s.synchronize()?;
    s.begin_capture()?;
    add_one().launch(
        &s,
        LaunchConfig::for_num_elems(n),
        KernelArgs::new().output(&x).scalar(n as u32),
    )?;
    let graph = s.end_capture()?;
    assert_eq!(
        x.to_host_vec(&s)?,
        vec![0.0; n],
        "capturing must not run the work"
    );
    let exec = graph.instantiate()?;
    for _ in 0..5 {
        exec.launch(&s)?;
    }
    assert_eq!(x.to_host_vec(&s)?, vec![5.0; n]);
    // The same topology updates in place.
    let mut exec = exec;
    s.begin_capture()?;
    add_one().launch(
        &s,
        LaunchConfig::for_num_elems(n),
        KernelArgs::new().output(&x).scalar(n as u32),
    )?;
    let again = s.end_capture()?;
    assert!(exec.update(&again)?);
    exec.launch(&s)?;
    assert_eq!(x.to_host_vec(&s)?, vec![6.0; n]);
    Ok(())
}

#[test]
fn multi_stream_capture_records_parallel_branches() -> Result<(), DeviceError> {
    let device = device();
    let origin = device.new_stream()?;
    let side = device.new_stream()?;
    let n = 256;
    let a = DeviceBuffer::<f32>::zeroed(&origin, n)?;
    let b = DeviceBuffer::<f32>::zeroed(&origin, n)?;
    origin.synchronize()?;
    let cfg = LaunchConfig::for_num_elems(n);
    origin.begin_capture()?;
    side.wait_event(&origin.record_event()?)?;
    assert!(
        side.is_capturing(),
        "waiting on a capture event joins the capture"
    );
    add_one().launch(&origin, cfg, KernelArgs::new().output(&a).scalar(n as u32))?;
    add_one().launch(&side, cfg, KernelArgs::new().output(&b).scalar(n as u32))?;
    origin.wait_event(&side.record_event()?)?;
    let graph = origin.end_capture()?;
    assert!(!side.is_capturing());
    assert!(graph.max_parallelism()? >= 2, "edges {:?}", graph.edges()?);
    let exec = graph.instantiate()?;
    exec.launch(&origin)?;
    exec.launch(&origin)?;
    assert_eq!(a.to_host_vec(&origin)?, vec![2.0; n]);
    assert_eq!(b.to_host_vec(&origin)?, vec![2.0; n]);
    Ok(())
}

#[test]
fn unjoined_capture_and_host_waits_in_capture_are_errors() -> Result<(), DeviceError> {
    let device = device();
    let origin = device.new_stream()?;
    let side = device.new_stream()?;
    let x = DeviceBuffer::<f32>::zeroed(&origin, 16)?;
    origin.synchronize()?;
    origin.begin_capture()?;
    side.wait_event(&origin.record_event()?)?;
    add_one().launch(
        &side,
        LaunchConfig::for_num_elems(16),
        KernelArgs::new().output(&x).scalar(16u32),
    )?;
    assert!(matches!(
        origin.end_capture(),
        Err(DeviceError::Capture { .. })
    ));
    assert!(!origin.is_capturing() && !side.is_capturing());

    origin.begin_capture()?;
    assert!(matches!(
        origin.synchronize(),
        Err(DeviceError::Capture { .. })
    ));
    assert!(matches!(
        DeviceBuffer::<f32>::alloc(&origin, 4),
        Err(DeviceError::Capture { .. })
    ));
    assert!(origin.end_capture().is_err());
    // Both streams are usable afterwards.
    for s in [&origin, &side] {
        let y = DeviceBuffer::from_host(s, &[1.0f32, 2.0])?;
        add_one().launch(
            s,
            LaunchConfig::for_num_elems(2),
            KernelArgs::new().output(&y).scalar(2u32),
        )?;
        assert_eq!(y.to_host_vec(s)?, vec![2.0, 3.0]);
    }
    Ok(())
}

#[test]
fn compile_errors_and_missing_host_implementations_are_reported() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let broken = Kernel::new(
        "broken",
        r#"extern "C" __global__ void broken() { this is not C; }"#,
    );
    match device.kind() {
        BackendKind::Cuda => match broken.compile(&device) {
            Err(DeviceError::Compile { kernel, log }) => {
                assert_eq!(kernel, "broken");
                assert!(log.contains("error"), "log: {log}");
            }
            other => panic!("expected a compile error, got {other:?}"),
        },
        BackendKind::Host => {
            match broken.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new()) {
                Err(DeviceError::HostKernel { kernel, reason }) => {
                    assert_eq!(kernel, "broken");
                    assert!(reason.contains("host implementation"));
                }
                other => panic!("expected a missing host implementation, got {other:?}"),
            }
        }
    }
    Ok(())
}

#[test]
fn impossible_allocations_are_out_of_memory() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    match DeviceBuffer::<f32>::alloc(&s, 1 << 48) {
        Err(DeviceError::OutOfMemory { bytes, .. }) => assert_eq!(bytes, 4 << 48),
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert_eq!(
        DeviceBuffer::from_host(&s, &[3u8])?.to_host_vec(&s)?,
        vec![3]
    );
    Ok(())
}

#[test]
fn bad_launches_and_arguments_are_errors() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let x = DeviceBuffer::<f32>::zeroed(&s, 4)?;
    let k = add_one();
    for cfg in [
        LaunchConfig::linear(1, 2048),
        LaunchConfig::linear(0, 32),
        LaunchConfig {
            grid: (1, 1, 1),
            block: (1, 1, 65),
            shared_mem_bytes: 0,
        },
        LaunchConfig::linear(1, 32).with_shared_mem(1 << 30),
    ] {
        let r = k.launch(&s, cfg, KernelArgs::new().output(&x).scalar(4u32));
        assert!(
            matches!(r, Err(DeviceError::InvalidLaunch { .. })),
            "{cfg:?}: {r:?}"
        );
    }
    if device.kind() == BackendKind::Host {
        // The host implementation reads argument 0 as f32: an i32 buffer is refused.
        let wrong = DeviceBuffer::<i32>::zeroed(&s, 4)?;
        k.launch(
            &s,
            LaunchConfig::linear(1, 4),
            KernelArgs::new().output(&wrong).scalar(4u32),
        )?;
        assert!(matches!(
            s.synchronize(),
            Err(DeviceError::InvalidArgument { .. })
        ));
    } else {
        // A host buffer handed to a CUDA kernel is a device mismatch.
        let host_stream = Device::host().new_stream()?;
        let on_host = DeviceBuffer::<f32>::zeroed(&host_stream, 4)?;
        let r = k.launch(
            &s,
            LaunchConfig::linear(1, 4),
            KernelArgs::new().output(&on_host).scalar(4u32),
        );
        assert!(
            matches!(r, Err(DeviceError::DeviceMismatch { .. })),
            "{r:?}"
        );
    }
    // The stream still works.
    k.launch(
        &s,
        LaunchConfig::linear(1, 4),
        KernelArgs::new().output(&x).scalar(4u32),
    )?;
    assert_eq!(x.to_host_vec(&s)?, vec![1.0; 4]);
    Ok(())
}

#[test]
fn host_kernel_failures_come_back_from_synchronize() -> Result<(), DeviceError> {
    let device = device();
    if device.kind() != BackendKind::Host {
        // Device faults poison a CUDA context for the whole process; they are not provoked here.
        return Ok(());
    }
    let s = device.new_stream()?;
    let failing = Kernel::new("failing", "").with_host(|_| Err(DeviceError::usage("boom")));
    failing.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new())?;
    assert!(matches!(s.synchronize(), Err(DeviceError::Usage { .. })));
    let panicking = Kernel::new("panicking", "").with_host(|_| panic!("kernel panic"));
    panicking.launch(&s, LaunchConfig::linear(1, 1), &KernelArgs::new())?;
    assert!(matches!(s.synchronize(), Err(DeviceError::Panicked { .. })));
    s.synchronize()?;
    Ok(())
}

#[test]
fn events_and_host_functions() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let start = s.record_timed_event()?;
    let x = DeviceBuffer::<f32>::zeroed(&s, 1 << 16)?;
    add_one().launch(
        &s,
        LaunchConfig::for_num_elems(1 << 16),
        KernelArgs::new().output(&x).scalar(1u32 << 16),
    )?;
    let end = s.record_timed_event()?;
    end.synchronize()?;
    assert!(end.is_complete()?);
    assert!(start.elapsed_ms(&end)? >= 0.0);
    let untimed = s.record_event()?;
    untimed.synchronize()?;
    assert!(matches!(
        untimed.elapsed_ms(&end),
        Err(DeviceError::Usage { .. })
    ));

    let order = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(usize::MAX));
    let (o, sn) = (order.clone(), seen.clone());
    s.enqueue_host_fn(move || sn.store(o.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst))?;
    let o = order.clone();
    s.enqueue_host_fn(move || {
        o.fetch_add(1, Ordering::SeqCst);
    })?;
    s.synchronize()?;
    device.synchronize()?;
    assert_eq!(order.load(Ordering::SeqCst), 2);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        0,
        "host functions run in order"
    );

    Ok(())
}

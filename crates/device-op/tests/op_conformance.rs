//! DeviceOp conformance on whatever `Device::auto()` gives (host in CI, CUDA under
//! `CUFLOW_DEVICE=cuda`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_device_op::{
    join_all, value, with_context, zip, BoxedOp, DeviceOp, DeviceOpExt, ExecutionContext, UnzipExt,
};
use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Kernel, KernelArgs, LaunchConfig};
use cuflow_scheduler::{DevicePolicyExt, SingleStream, StreamPoolRoundRobin};

fn device() -> Device {
    Device::auto().expect("the device selected by CUFLOW_DEVICE must be usable")
}

/// One thread waits ~`cycles` clock cycles (host: ~20 ms), then sets `x[0] = x[0] * 10 + digit`.
fn slow_append() -> Kernel {
    Kernel::new(
        "slow_append",
        r#"extern "C" __global__ void slow_append(double* x, double digit, unsigned long long cycles) {
            long long start = clock64();
            while ((unsigned long long)(clock64() - start) < cycles) { }
            x[0] = x[0] * 10.0 + digit;
        }"#,
    )
    .with_host(|args| {
        let digit = args.scalar::<f64>(1)?;
        std::thread::sleep(std::time::Duration::from_millis(20));
        let x = args.output::<f64>(0)?;
        x[0] = x[0] * 10.0 + digit;
        Ok(())
    })
}

/// `dst[0] = a[0] + b[0]`.
fn add_first() -> Kernel {
    Kernel::new(
        "add_first",
        r#"extern "C" __global__ void add_first(double* dst, const double* a, const double* b) {
            dst[0] = a[0] + b[0];
        }"#,
    )
    .with_host(|args| {
        let a = args.input::<f64>(1)?[0];
        let b = args.input::<f64>(2)?[0];
        args.output::<f64>(0)?[0] = a + b;
        Ok(())
    })
}

struct Append {
    x: Arc<DeviceBuffer<f64>>,
    digit: f64,
}

impl DeviceOp for Append {
    type Output = Arc<DeviceBuffer<f64>>;
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        slow_append().launch(
            ctx.stream()?,
            LaunchConfig::linear(1, 1),
            KernelArgs::new()
                .output(&*self.x)
                .scalar(self.digit)
                .scalar(40_000_000u64),
        )?;
        Ok(self.x)
    }
}

cuflow_device_op::impl_op_boilerplate!([] Append);

struct AddFirst {
    dst: Arc<DeviceBuffer<f64>>,
    a: Arc<DeviceBuffer<f64>>,
    b: Arc<DeviceBuffer<f64>>,
}

impl DeviceOp for AddFirst {
    type Output = Arc<DeviceBuffer<f64>>;
    fn execute(self, ctx: &mut ExecutionContext) -> Result<Self::Output, DeviceError> {
        add_first().launch(
            ctx.stream()?,
            LaunchConfig::linear(1, 1),
            KernelArgs::new()
                .output(&*self.dst)
                .input(&*self.a)
                .input(&*self.b),
        )?;
        Ok(self.dst)
    }
}

cuflow_device_op::impl_op_boilerplate!([] AddFirst);

fn buffer(v: f64) -> Arc<DeviceBuffer<f64>> {
    let d = device();
    let s = d.new_stream().expect("stream");
    let b = Arc::new(DeviceBuffer::from_host(&s, &[v]).expect("buffer"));
    s.synchronize().expect("sync");
    b
}

fn read(b: &DeviceBuffer<f64>) -> f64 {
    let s = b.device().new_stream().expect("stream");
    b.to_host_vec(&s).expect("read")[0]
}

#[test]
fn then_orders_dependent_work_on_one_stream() -> Result<(), DeviceError> {
    let x = buffer(0.0);
    let op = Append {
        x: x.clone(),
        digit: 1.0,
    }
    .then(|x| Append { x, digit: 2.0 })
    .then(|x| Append { x, digit: 3.0 });
    let stream = device().new_stream()?;
    let (out, stats) = op.sync_on_with_stats(&stream)?;
    assert_eq!(
        read(&out),
        123.0,
        "then must run its continuation after the first op"
    );
    assert_eq!(
        stats.events_recorded, 0,
        "a chain on one stream needs no events"
    );
    Ok(())
}

#[test]
fn zip_branches_land_on_distinct_streams_and_the_join_sees_their_writes() -> Result<(), DeviceError>
{
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 8)?;
    let (a, b, sum) = (buffer(0.0), buffer(0.0), buffer(-1.0));
    let op = zip!(
        Append {
            x: a.clone(),
            digit: 4.0
        },
        Append {
            x: b.clone(),
            digit: 5.0
        }
    )
    .then({
        let sum = sum.clone();
        move |(a, b)| AddFirst { dst: sum, a, b }
    });
    let (out, stats) = op.sync_with_policy(&policy)?;
    assert_eq!(read(&out), 9.0, "the join must wait for both branches");
    // Root plus one stream per branch.
    assert_eq!(stats.streams.len(), 3, "{stats:?}");
    // No fork events under a policy-chosen root; one join event per branch.
    assert_eq!(stats.events_recorded, 2, "{stats:?}");
    assert_eq!(stats.event_waits, 2, "{stats:?}");
    Ok(())
}

#[test]
fn zip_of_host_values_records_no_events() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 4)?;
    let op = zip!(
        value(1),
        value(2).map(|v| v * 2),
        value("x"),
        value(4.0).map(|v| v + 1.0)
    );
    let ((a, b, c, d), stats) = op.sync_with_policy(&policy)?;
    assert_eq!((a, b, c, d), (1, 4, "x", 5.0));
    assert_eq!(
        (stats.events_recorded, stats.event_waits),
        (0, 0),
        "{stats:?}"
    );
    assert!(stats.streams.is_empty());
    Ok(())
}

#[test]
fn single_stream_serializes_branches() -> Result<(), DeviceError> {
    let device = device();
    let policy = SingleStream::new(&device)?;
    let (a, b) = (buffer(0.0), buffer(0.0));
    let ((a, b), stats) =
        zip!(Append { x: a, digit: 1.0 }, Append { x: b, digit: 2.0 }).sync_with_policy(&policy)?;
    assert_eq!((read(&a), read(&b)), (1.0, 2.0));
    assert_eq!(stats.streams.len(), 1);
    assert_eq!(stats.events_recorded, 0);
    Ok(())
}

#[test]
fn shared_runs_once_across_clones_and_threads() -> Result<(), DeviceError> {
    let runs = Arc::new(AtomicUsize::new(0));
    let x = buffer(0.0);
    let r = runs.clone();
    let shared = Append { x, digit: 7.0 }
        .inspect(move |_| {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .shared();
    let clones: Vec<_> = (0..8).map(|_| shared.clone()).collect();
    let outputs: Vec<Arc<Arc<DeviceBuffer<f64>>>> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for pair in clones.chunks(2) {
            let pair = pair.to_vec();
            handles.push(scope.spawn(move || {
                pair.into_iter()
                    .map(|op| op.sync())
                    .collect::<Result<Vec<_>, _>>()
            }));
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.into_iter().flatten().collect())
    })?;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(outputs.len(), 8);
    assert!(outputs.iter().all(|o| Arc::ptr_eq(o, &outputs[0])));
    assert_eq!(read(&outputs[0]), 7.0);
    Ok(())
}

#[test]
fn shared_failures_reach_every_consumer() {
    let failing = with_context(|_| value(()))
        .then(|_| -> BoxedOp<'static, ()> { panic!("producer panics") })
        .shared();
    assert!(matches!(
        failing.clone().sync(),
        Err(DeviceError::Panicked { .. })
    ));
    assert!(matches!(failing.sync(), Err(DeviceError::Poisoned { .. })));
    // The thread is still usable.
    assert_eq!(value(5).sync().expect("after a panic"), 5);
}

#[test]
fn unzip_boxed_and_join_all() -> Result<(), DeviceError> {
    let (a, b) = value((1, String::from("two"))).unzip();
    assert_eq!(zip!(b, a).sync()?, (String::from("two"), 1));
    let (x, y, z) = value((1u8, 2u16, 3u32)).unzip();
    assert_eq!(zip!(z, y, x).sync()?, (3, 2, 1));
    let buf = buffer(0.0);
    let ops: Vec<BoxedOp<'static, f64>> = vec![
        value(1.5).boxed(),
        Append { x: buf, digit: 6.0 }.map(|x| read(&x)).boxed(),
        value(2).map(|v| v as f64 * 2.0).boxed(),
    ];
    assert_eq!(join_all(ops).sync()?, vec![1.5, 6.0, 4.0]);
    Ok(())
}

#[test]
fn schedule_and_await_under_block_on() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 2)?;
    let f = Append {
        x: buffer(0.0),
        digit: 8.0,
    }
    .schedule(&policy)?;
    let out = futures::executor::block_on(f)?;
    assert_eq!(read(&out), 8.0);
    let out = futures::executor::block_on(async {
        Append {
            x: buffer(0.0),
            digit: 9.0,
        }
        .await
    })?;
    assert_eq!(read(&out), 9.0);
    Ok(())
}

#[test]
fn await_on_tokio_multi_thread_with_a_thousand_ops() -> Result<(), DeviceError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .expect("runtime");
    let stream = device().new_stream()?;
    let inputs: Vec<Arc<DeviceBuffer<f64>>> = (0..1000)
        .map(|i| DeviceBuffer::from_host(&stream, &[i as f64]).map(Arc::new))
        .collect::<Result<_, _>>()?;
    stream.synchronize()?;
    let results = rt.block_on(async move {
        let mut handles = Vec::new();
        for (i, x) in inputs.into_iter().enumerate() {
            handles.push(tokio::spawn(async move {
                // Initialized on its own stream, outside any op: wait for it before use.
                let init = x.device().new_stream()?;
                let dst = Arc::new(DeviceBuffer::<f64>::zeroed(&init, 1)?);
                init.synchronize()?;
                tokio::task::yield_now().await;
                let out = AddFirst {
                    dst,
                    a: x.clone(),
                    b: x,
                }
                .await?;
                Ok::<_, DeviceError>((i, out))
            }));
        }
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.expect("task")?);
        }
        Ok::<_, DeviceError>(out)
    })?;
    for (i, out) in results {
        assert_eq!(read(&out), 2.0 * i as f64);
    }
    Ok(())
}

#[test]
fn nested_execution_is_an_error_and_panics_are_values() {
    let inner = Arc::new(parking_lot::Mutex::new(None));
    let slot = inner.clone();
    let out = value(1)
        .map(move |v| {
            *slot.lock() = Some(value(2).sync());
            v
        })
        .sync()
        .expect("the outer op completes");
    assert_eq!(out, 1);
    assert!(matches!(
        inner.lock().take(),
        Some(Err(DeviceError::Reentrant { .. }))
    ));

    let r = value(1)
        .map(|_: i32| -> i32 { panic!("closure panics") })
        .sync();
    assert!(matches!(r, Err(DeviceError::Panicked { .. })));
    assert_eq!(
        value(3).map(|v| v + 1).sync().expect("thread still usable"),
        4
    );
}

#[test]
fn the_default_policy_is_process_wide() -> Result<(), DeviceError> {
    let device = device();
    let mine = std::thread::spawn({
        let d = device.clone();
        move || d.default_policy().map(|p| format!("{p:p}"))
    })
    .join()
    .expect("thread")?;
    assert_eq!(mine, format!("{:p}", device.default_policy()?));
    Ok(())
}

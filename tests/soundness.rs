//! Soundness of the safe API under sharing and concurrency, on the device under test
//! (`Device::auto()`: the host backend in CI, CUDA under `CUFLOW_DEVICE=cuda`).
//!
//! - Tensors shared through clones, or through `&mut` borrows whose future was dropped, and
//!   written or read by ops on different streams with nothing between them: every access is
//!   ordered after the conflicting ones.
//! - A capture running on one thread records exactly its own op: ops run meanwhile by other
//!   threads on the default policy's streams all complete, with the right values, and the graph
//!   replays only the captured work.

use std::sync::Barrier;
use std::time::Duration;

use cuflow::prelude::*;
use cuflow_testing::{
    device::device,
    measure::assert_close_elementwise,
    rng::{random_f32, rng},
};

const N: usize = 1 << 20;

#[test]
fn clones_written_by_ops_on_two_streams_lose_no_update() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 2)?;
    let xs = random_f32(&mut rng(), N);
    let x = api::from_vec(xs.clone(), &[N]).sync()?;
    for trial in 0..4 {
        let z = api::zeros::<f32>(&[N]).sync()?;
        // Two ops on two streams of the pool, both writing z through clones, neither waiting.
        let first =
            kernels::saxpy(z.clone().partition([N / 8]), 2.0, x.clone()).schedule(&policy)?;
        let second =
            kernels::saxpy(z.clone().partition([N / 8]), 3.0, x.clone()).schedule(&policy)?;
        // A third reads z on yet another stream, before anyone waits.
        let read = kernels::scale(z.clone(), 1.0).schedule(&policy)?;
        let read = futures::executor::block_on(read)?;
        futures::executor::block_on(first)?;
        futures::executor::block_on(second)?;
        let want: Vec<f64> = xs.iter().map(|&v| 5.0 * v as f64).collect();
        let z = z.to_host_vec()?;
        assert_close_elementwise(&format!("trial {trial}: z = 5x"), &z, &want, 1e-6, 1e-5);
        let read = read.to_host_vec()?;
        let what = format!("trial {trial}: a read on a third stream");
        assert_close_elementwise(&what, &read, &want, 1e-6, 1e-5);
    }
    Ok(())
}

#[test]
fn a_dropped_future_of_a_mut_borrow_is_still_ordered() -> Result<(), DeviceError> {
    let device = device();
    let policy = StreamPoolRoundRobin::new(&device, 3)?;
    let xs = random_f32(&mut rng(), N);
    let x = api::from_vec(xs.clone(), &[N]).sync()?;
    let mut z = api::zeros::<f32>(&[N]).sync()?;
    let pending = kernels::saxpy((&mut z).partition([N / 8]), 4.0, &x).schedule(&policy)?;
    drop(pending); // the borrow ends; the work may still run
    let y = kernels::scale(&z, 0.5).schedule(&policy)?; // another stream reads z
    let y = futures::executor::block_on(y)?;
    let want: Vec<f64> = xs.iter().map(|&v| 2.0 * v as f64).collect();
    let what = "a read after a dropped write";
    assert_close_elementwise(what, &y.to_host_vec()?, &want, 1e-6, 1e-5);
    Ok(())
}

#[test]
fn a_capture_on_one_thread_records_nothing_of_other_threads() -> Result<(), DeviceError> {
    let threads = 4;
    let start = Barrier::new(threads + 1);
    let xs = random_f32(&mut rng(), 4096);
    let x = api::from_vec(xs.clone(), &[4096]).sync()?;
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (start, x) = (&start, x.clone());
                scope.spawn(move || -> Result<usize, DeviceError> {
                    start.wait();
                    let mut done = 0;
                    for i in 0..40 {
                        let k = (t * 100 + i) as f32;
                        let y = kernels::scale(x.clone(), k).sync()?;
                        let got = y.to_host_vec()?;
                        for (g, v) in got.iter().zip(&x.to_host_vec()?) {
                            assert_eq!(*g, v * k, "thread {t}, op {i}");
                        }
                        done += 1;
                    }
                    Ok(done)
                })
            })
            .collect();
        // The captured op: two kernels on two branches, and a pause on the host while the
        // capture is open, so that the other threads' ops run during it.
        let step = zip!(
            kernels::scale(x.clone(), 2.0),
            kernels::scale(x.clone(), 3.0),
            value(()).map(|()| std::thread::sleep(Duration::from_millis(200)))
        )
        .then(|(a, b, ())| kernels::add(a, b));
        start.wait();
        let mut graph = step.graph()?;
        let out = graph.take_output().expect("the output");
        for w in workers {
            assert_eq!(w.join().expect("worker thread")?, 40);
        }
        // Exactly the captured kernels: two scales and an add.
        assert_eq!(graph.graph().node_count()?, 3);
        graph.launch()?;
        graph.synchronize()?;
        let want: Vec<f64> = xs.iter().map(|&v| 5.0 * v as f64).collect();
        assert_close_elementwise("the replay", &out.to_host_vec()?, &want, 1e-6, 1e-5);
        Ok(())
    })
}

/// An eager read-back of a tensor that captures read is never refused because of them: the
/// streams a capture runs on are its own, and a read-back that picks the stream that last used
/// a tensor never picks one of them (another capture may begin on it at any moment).
#[test]
fn eager_read_backs_beside_repeated_captures_of_the_same_tensor_succeed() -> Result<(), DeviceError>
{
    let stream = device().new_stream()?;
    let xs = random_f32(&mut rng(), 256);
    let x = api::from_vec(xs.clone(), &[256]).sync_on(&stream)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        let reader = scope.spawn(|| -> Result<usize, DeviceError> {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert_eq!(x.to_host_vec()?, xs, "read-back {reads}");
                let shown = format!("{x}");
                assert!(shown.starts_with("tensor(["), "display {reads}: {shown}");
                reads += 1;
            }
            Ok(reads)
        });
        let captured = (|| {
            for _ in 0..500 {
                drop(kernels::scale(x.clone(), 2.0).graph_on(stream.clone())?);
            }
            Ok(())
        })();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let reads = reader.join().expect("reader thread")?;
        captured?;
        assert!(reads > 0);
        Ok(())
    })
}

//! Graphs and their executables used from many threads at once: instantiated, launched, updated
//! and dropped together. The CUDA driver keeps state shared by a graph and the executables
//! instantiated from it, so these calls must never overlap inside it; every replay must land.

use cuflow_runtime::{Device, DeviceBuffer, DeviceError, Graph, Stream};
use cuflow_testing::{
    device::device,
    kernels::launch_add_one,
    rng::{random_f32, rng},
};

/// `v` plus 1.0 added `times` times in f32, as the kernel does it.
fn plus_ones(v: &[f32], times: usize) -> Vec<f32> {
    v.iter()
        .map(|x| (0..times).fold(*x, |acc, _| acc + 1.0))
        .collect()
}

/// A stream of the test device and a buffer of `n` random values on it, with those values.
fn random_buffer(n: usize) -> Result<(Device, Stream, Vec<f32>, DeviceBuffer<f32>), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let x0 = random_f32(&mut rng(), n);
    let x = DeviceBuffer::from_host(&s, &x0)?;
    Ok((device, s, x0, x))
}

/// Random values and the buffers holding them.
type Filled = (Vec<Vec<f32>>, Vec<DeviceBuffer<f32>>);

/// `count` buffers of `n` random values on `s`, with those values, after `s` has written them.
fn random_buffers(s: &Stream, count: usize, n: usize) -> Result<Filled, DeviceError> {
    let mut rng = rng();
    let initial: Vec<Vec<f32>> = (0..count).map(|_| random_f32(&mut rng, n)).collect();
    let buffers = initial
        .iter()
        .map(|v| DeviceBuffer::from_host(s, v))
        .collect::<Result<Vec<_>, _>>()?;
    s.synchronize()?;
    Ok((initial, buffers))
}

/// Waits for every worker; the first error, or a worker's panic, fails the test.
fn join_all(
    workers: Vec<std::thread::ScopedJoinHandle<'_, Result<(), DeviceError>>>,
) -> Result<(), DeviceError> {
    for w in workers {
        w.join().expect("a worker panicked")?;
    }
    Ok(())
}

/// A graph of one launch adding 1.0 to every element of `x`, captured on `s`.
fn capture_add_one(s: &Stream, x: &DeviceBuffer<f32>) -> Result<Graph, DeviceError> {
    s.begin_capture()?;
    let added = launch_add_one(s, x);
    let graph = s.end_capture();
    added?;
    graph
}

/// Many threads instantiate executables from one graph, launch each once and drop it right
/// away, so instantiations and destructions of the graph's executables meet all the time.
#[test]
fn executables_of_one_graph_made_launched_and_dropped_by_many_threads() -> Result<(), DeviceError> {
    let (device, s, x0, x) = random_buffer(129)?;
    let graph = capture_add_one(&s, &x)?;
    let (threads, rounds) = (8, 150);
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<(), DeviceError> {
                    let own = device.new_stream()?;
                    for _ in 0..rounds {
                        graph.instantiate()?.launch(&own)?;
                    }
                    own.synchronize()
                })
            })
            .collect();
        join_all(workers)
    })?;
    assert_eq!(x.to_host_vec(&s)?, plus_ones(&x0, threads * rounds));
    Ok(())
}

/// Executables launched and dropped by their own threads while the thread that captured their
/// graph drops the graph: each executable still replays the captured work.
#[test]
fn a_graph_dropped_while_threads_launch_and_drop_its_executables() -> Result<(), DeviceError> {
    let (device, s, x0, x) = random_buffer(65)?;
    let (threads, launches) = (8, 40);
    for _ in 0..10 {
        let graph = capture_add_one(&s, &x)?;
        let execs = (0..threads)
            .map(|_| graph.instantiate())
            .collect::<Result<Vec<_>, _>>()?;
        std::thread::scope(|scope| -> Result<(), DeviceError> {
            let workers: Vec<_> = execs
                .into_iter()
                .map(|exec| {
                    scope.spawn(|| -> Result<(), DeviceError> {
                        let own = device.new_stream()?;
                        for _ in 0..launches {
                            exec.launch(&own)?;
                        }
                        drop(exec);
                        own.synchronize()
                    })
                })
                .collect();
            drop(graph);
            for w in workers {
                w.join().expect("a worker panicked")?;
            }
            Ok(())
        })?;
    }
    assert_eq!(x.to_host_vec(&s)?, plus_ones(&x0, 10 * threads * launches));
    Ok(())
}

/// Two executables updated crosswise from each other's graph (same work, so each update
/// succeeds) while other threads instantiate from both graphs and launch: no call deadlocks,
/// and every launch, before or after an update, adds one.
#[test]
fn executables_updated_crosswise_while_both_graphs_instantiate() -> Result<(), DeviceError> {
    let (device, s, x0, x) = random_buffer(33)?;
    let (g1, g2) = (capture_add_one(&s, &x)?, capture_add_one(&s, &x)?);
    let rounds = 100;
    let device = &device;
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        let updaters: Vec<_> = [(&g1, &g2), (&g2, &g1)]
            .into_iter()
            .map(|(from, to)| {
                scope.spawn(move || -> Result<(), DeviceError> {
                    let own = device.new_stream()?;
                    let mut exec = from.instantiate()?;
                    for round in 0..rounds {
                        let target = if round % 2 == 0 { to } else { from };
                        assert!(
                            exec.update(target)?,
                            "an update of the same work was refused"
                        );
                        exec.launch(&own)?;
                    }
                    own.synchronize()
                })
            })
            .collect();
        let instantiators: Vec<_> = [&g1, &g2]
            .into_iter()
            .map(|g| {
                scope.spawn(move || -> Result<(), DeviceError> {
                    let own = device.new_stream()?;
                    for _ in 0..rounds {
                        g.instantiate()?.launch(&own)?;
                    }
                    own.synchronize()
                })
            })
            .collect();
        join_all(updaters.into_iter().chain(instantiators).collect())
    })?;
    assert_eq!(x.to_host_vec(&s)?, plus_ones(&x0, 4 * rounds));
    Ok(())
}

/// Captures that record events (a second stream joins and is joined back) made, instantiated,
/// replayed and dropped over and over on some threads while other threads record and wait on
/// events of eager work: the events a capture recorded are never recorded again by eager work
/// while the driver may still read them, and every launch lands.
#[test]
fn events_recorded_in_captures_and_eager_events_of_other_threads() -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let (capturers, eager, rounds) = (2, 4, 120);
    let (initial, buffers) = random_buffers(&s, 2 * capturers + eager, 97)?;
    let device = &device;
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        let mut workers = Vec::new();
        for pair in buffers[..2 * capturers].chunks(2) {
            workers.push(scope.spawn(move || -> Result<(), DeviceError> {
                let (origin, side) = (device.new_stream()?, device.new_stream()?);
                for _ in 0..rounds {
                    origin.begin_capture()?;
                    let captured = (|| {
                        side.wait_event(&origin.record_event()?)?;
                        launch_add_one(&origin, &pair[0])?;
                        launch_add_one(&side, &pair[1])?;
                        origin.wait_event(&side.record_event()?)
                    })();
                    let graph = origin.end_capture();
                    captured?;
                    graph?.instantiate()?.launch(&origin)?;
                }
                origin.synchronize()
            }));
        }
        for x in &buffers[2 * capturers..] {
            workers.push(scope.spawn(move || -> Result<(), DeviceError> {
                let (a, b) = (device.new_stream()?, device.new_stream()?);
                for round in 0..rounds {
                    let (from, to) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
                    launch_add_one(from, x)?;
                    to.wait_event(&from.record_event()?)?;
                }
                a.synchronize()?;
                b.synchronize()
            }));
        }
        join_all(workers)
    })?;
    for (i, (x, x0)) in buffers.iter().zip(&initial).enumerate() {
        assert_eq!(x.to_host_vec(&s)?, plus_ones(x0, rounds), "buffer {i}");
    }
    Ok(())
}

/// Replays read back into host memory on some threads while other threads instantiate
/// executables of their own graphs, launch and drop them: every read returns the replayed
/// values, and no thread waits for another forever.
#[test]
fn replays_read_back_while_other_threads_instantiate_and_drop_executables(
) -> Result<(), DeviceError> {
    let device = device();
    let s = device.new_stream()?;
    let (readers, churners, rounds) = (3, 4, 60);
    let (initial, buffers) = random_buffers(&s, readers + churners, 1001)?;
    let device = &device;
    std::thread::scope(|scope| -> Result<(), DeviceError> {
        let mut workers = Vec::new();
        for (x, x0) in buffers[..readers].iter().zip(&initial) {
            workers.push(scope.spawn(move || -> Result<(), DeviceError> {
                let own = device.new_stream()?;
                let exec = capture_add_one(&own, x)?.instantiate()?;
                for round in 1..=rounds {
                    exec.launch(&own)?;
                    assert_eq!(x.to_host_vec(&own)?, plus_ones(x0, round));
                }
                Ok(())
            }));
        }
        for x in &buffers[readers..] {
            workers.push(scope.spawn(move || -> Result<(), DeviceError> {
                let own = device.new_stream()?;
                let graph = capture_add_one(&own, x)?;
                for _ in 0..rounds {
                    graph.instantiate()?.launch(&own)?;
                }
                own.synchronize()
            }));
        }
        join_all(workers)
    })?;
    for (i, (x, x0)) in buffers.iter().zip(&initial).enumerate().skip(readers) {
        assert_eq!(x.to_host_vec(&s)?, plus_ones(x0, rounds), "buffer {i}");
    }
    Ok(())
}

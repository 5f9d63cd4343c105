//! Random DAGs captured and replayed (on a stream of their own, on a pool's stream, on a stream
//! of the default pool, under a policy placing each branch at random) from two threads while
//! two other threads run random DAGs eagerly on the same device: each replay must give the
//! DAG's modelled value in every element, capturing must run nothing, a DAG holding a failing
//! launch must fail to capture with that launch's error (one holding a host function, the work
//! that fails on the stream, with the refusal of the host function), and no eager DAG may lose
//! its work to a capture (a DAG resolving `Ok` with the value unwritten fails its check). Captured DAGs also read shared ops produced
//! eagerly before, which every replay reads again. `CUFLOW_RANDOM_DAGS=N` runs N times as many
//! DAGs.

use cuflow_device_op::{DeviceError, DeviceOpExt};
use cuflow_graph_capture::GraphCaptureExt;
use cuflow_scheduler::StreamPoolRoundRobin;
use cuflow_testing::{
    dags::{check, draw_shared, draw_with_buffers},
    device::device,
    ops::{assert_all, buffer, compile_kernels, copy},
    policies::RandomPlacement,
    rng::{scale_from_env, seeded_rng},
    thread::within_a_minute,
};
use rand::Rng;

/// Where a DAG is captured.
#[derive(Clone, Copy, Debug)]
enum Capture {
    OwnStream,
    Pool,
    DefaultPool,
    RandomPlacement,
}

fn captured_and_eager_dags(seed: u64, dags: usize) {
    let dags = dags * scale_from_env("CUFLOW_RANDOM_DAGS");
    let device = device();
    compile_kernels(&device).expect("compile the test kernels");
    let mut rng = seeded_rng(seed);
    // Shared ops produced eagerly before any capture: captured DAGs read them in every replay.
    let common = draw_shared(&mut rng, 4, 2);
    for shared in &common {
        let dst = buffer(0.0);
        let got = shared.op.clone().then(move |b| copy(&dst, &b)).sync();
        check(
            "a shared op produced before the captures",
            got,
            shared.value,
        );
    }
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (device, common) = (device.clone(), common.clone());
            let seed = seed ^ ((t as u64 + 1) << 32);
            scope.spawn(move || {
                let mut rng = seeded_rng(seed);
                for d in 0..dags {
                    let mut bufs = Vec::new();
                    let (op, want) = draw_with_buffers(&mut rng, 3, &common, &mut bufs);
                    if t % 2 == 1 {
                        let what = format!("eager thread {t}, DAG {d} of seed {seed:#x}");
                        check(&what, op.sync(), want);
                        continue;
                    }
                    let how = match rng.gen_range(0..4) {
                        0 => Capture::OwnStream,
                        1 => Capture::Pool,
                        2 => Capture::DefaultPool,
                        _ => Capture::RandomPlacement,
                    };
                    let what = format!("capturing thread {t}, DAG {d} of seed {seed:#x}, {how:?}");
                    let graph = match how {
                        Capture::OwnStream => op.graph_on(device.new_stream().expect("a stream")),
                        Capture::Pool => op.graph_with_policy(
                            &StreamPoolRoundRobin::new(&device, 3).expect("a pool"),
                        ),
                        Capture::DefaultPool => op.graph(),
                        Capture::RandomPlacement => op.graph_with_policy(
                            &RandomPlacement::new(&device, 3, rng.gen()).expect("a policy"),
                        ),
                    };
                    let mut graph = match (graph, want) {
                        (Ok(graph), Some(_)) => graph,
                        (Ok(_), None) => panic!("{what}: captured a DAG holding failing work"),
                        (Err(e), Some(v)) => {
                            panic!("{what}: capture failed ({e}), the model gives {v}")
                        }
                        (Err(e), None) => {
                            // A refused launch fails the capture with its own error; a host
                            // function (the work that fails on the stream) cannot be recorded.
                            let refused_host_fn = matches!(
                                &e,
                                DeviceError::Capture { op, .. } if op == "Stream::enqueue_host_fn"
                            );
                            assert!(
                                matches!(e, DeviceError::InvalidLaunch { .. }) || refused_host_fn,
                                "{what}: failed with {e:?}, not its failing work's error"
                            );
                            continue;
                        }
                    };
                    let out = graph.take_output().expect("the captured op's output");
                    let poison = buffer(f32::NAN);
                    let want = want.expect("a DAG that captured has a value");
                    // Every buffer of a DAG starts at zero, and capturing runs nothing.
                    for (i, buf) in bufs.iter().enumerate() {
                        assert_all(buf, 0.0, &format!("{what}, buffer {i} after capturing"));
                    }
                    for replay in 0..rng.gen_range(1..=3) {
                        // Each replay rewrites every buffer of the DAG from scratch: poison
                        // them all first (work left out of the graph then shows as NaN).
                        for buf in &bufs {
                            copy(buf, &poison).sync().expect("poison a buffer");
                        }
                        graph
                            .replay_and_wait()
                            .unwrap_or_else(|e| panic!("{what}: replay {replay} failed: {e}"));
                        assert_all(&out, want, &format!("{what}, replay {replay}"));
                    }
                }
            });
        }
    });
}

#[test]
fn random_dags_captured_beside_eager_ones_replay_their_models_values() {
    within_a_minute("captures of random DAGs beside eager ones hung", || {
        captured_and_eager_dags(0x0ca9_7a3e_0001, 30)
    });
}

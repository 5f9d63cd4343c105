//! Random DAGs (`cuflow_testing::dags`: `then`, `zip!`, `join_all`, `shared`, `unzip` and the
//! rest) executed from several threads at once through every entry point (`sync`, `sync_on`,
//! policies, `.await`, a future dropped unpolled or in flight), and awaited by many tokio tasks,
//! against a model of each DAG's value. Every buffer of a DAG holds one value in all its
//! elements; an op writes a new buffer or rewrites one only its own DAG reads, and kernels with
//! a spin before their write make a missing wait show as a stale value. Shared ops are consumed
//! by several DAGs of several threads, some of which fail or are dropped. Each DAG must give its
//! model's value in every element, or the error of the failing work it holds (a refused launch,
//! or work that fails on the stream), and nothing may hang. `CUFLOW_RANDOM_DAGS=N` runs N times
//! as many DAGs.

use std::future::Future;

use cuflow_device_op::{BoxedOp, DeviceError, DeviceOpExt};
use cuflow_runtime::Device;
use cuflow_scheduler::{SingleStream, StreamPoolRoundRobin};
use cuflow_testing::{
    dags::{check, draw, draw_shared, SharedValue},
    device::device,
    ops::{buffer, compile_kernels, copy, Buf},
    policies::RandomPlacement,
    rng::{scale_from_env, seeded_rng},
    thread::within_a_minute,
};
use rand::Rng;

/// How a thread runs a DAG.
#[derive(Clone, Copy, Debug)]
enum Run {
    Sync,
    SyncOn,
    RoundRobin,
    OneStream,
    RandomPlacement,
    Await,
    DropUnpolled,
    DropInFlight,
}

const RUNS: [Run; 8] = [
    Run::Sync,
    Run::SyncOn,
    Run::RoundRobin,
    Run::OneStream,
    Run::RandomPlacement,
    Run::Await,
    Run::DropUnpolled,
    Run::DropInFlight,
];

/// Runs `op` as `how` says (a random placement drawing from `seed`); `None` when its result
/// was dropped unseen.
fn run(
    device: &Device,
    op: BoxedOp<'static, Buf>,
    how: Run,
    seed: u64,
) -> Option<Result<Buf, DeviceError>> {
    let pool = || StreamPoolRoundRobin::new(device, 3).expect("a pool of three streams");
    Some(match how {
        Run::Sync => op.sync(),
        Run::SyncOn => op.sync_on(&device.new_stream().expect("a stream")),
        Run::RoundRobin => op.sync_with_policy(&pool()).map(|(b, _)| b),
        Run::RandomPlacement => op
            .sync_with_policy(&RandomPlacement::new(device, 3, seed).expect("a policy"))
            .map(|(b, _)| b),
        Run::OneStream => op
            .sync_with_policy(&SingleStream::new(device).expect("a stream"))
            .map(|(b, _)| b),
        Run::Await => match op.schedule(&pool()) {
            Ok(future) => futures::executor::block_on(future),
            Err(e) => Err(e),
        },
        Run::DropUnpolled => {
            drop(op.schedule(&pool()));
            return None;
        }
        Run::DropInFlight => {
            let mut future = match op.schedule(&pool()) {
                Ok(future) => future,
                Err(_) => return None,
            };
            let waker = futures::task::noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            let _ = std::pin::Pin::new(&mut future).poll(&mut cx);
            drop(future);
            return None;
        }
    })
}

/// `threads` threads, each running `dags` random DAGs, drawing on shared ops made up front
/// (consumed by every thread) and on shared ops of their own.
fn random_dags(seed: u64, threads: usize, dags: usize) {
    let dags = dags * scale_from_env("CUFLOW_RANDOM_DAGS");
    let device = device();
    compile_kernels(&device).expect("compile the test kernels");
    let mut rng = seeded_rng(seed);
    let common = draw_shared(&mut rng, 4, 2);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (device, common) = (device.clone(), common.clone());
            let seed = seed ^ ((t as u64 + 1) << 32);
            scope.spawn(move || {
                let mut rng = seeded_rng(seed);
                let mut pool = common;
                for d in 0..dags {
                    let (op, want) = draw(&mut rng, 4, &pool);
                    // Some DAGs become shared ops of later ones, on this thread.
                    if rng.gen_bool(0.15) {
                        pool.push(SharedValue {
                            op: op.shared(),
                            value: want,
                        });
                        continue;
                    }
                    let how = RUNS[rng.gen_range(0..RUNS.len())];
                    let what = format!("thread {t}, DAG {d} of seed {seed:#x}, run {how:?}");
                    if let Some(got) = run(&device, op, how, rng.gen()) {
                        check(&what, got, want);
                    }
                }
                // Every shared op left in the pool, consumed once more here: whatever dropped
                // or failed before, each gives its value.
                for (i, shared) in pool.into_iter().enumerate() {
                    let dst = buffer(0.0);
                    let got = shared.op.then(move |b| copy(&dst, &b)).sync();
                    check(
                        &format!("thread {t}, shared op {i} at the end"),
                        got,
                        shared.value,
                    );
                }
            });
        }
    });
}

#[test]
fn random_dags_from_four_threads_give_their_models_values() {
    within_a_minute("random DAGs from four threads hung", || {
        random_dags(0x0da6_5eed_0001, 4, 40)
    });
}

#[test]
fn random_dags_from_one_thread_give_their_models_values() {
    within_a_minute("random DAGs from one thread hung", || {
        random_dags(0x0da6_5eed_0002, 1, 80)
    });
}

/// Random DAGs awaited as tasks of a multi-thread tokio runtime, many in flight at once: each
/// task `.await`s its DAG (the default policy, through the completion reactor) or schedules it
/// under a policy of its own and awaits the future, and checks its model's value. Shared ops
/// made up front are consumed by the tasks concurrently.
#[test]
fn random_dags_awaited_by_many_tokio_tasks_give_their_models_values() {
    within_a_minute("random DAGs awaited by tokio tasks hung", || {
        let device = device();
        compile_kernels(&device).expect("compile the test kernels");
        let mut rng = seeded_rng(0x0da6_5eed_0003);
        let common = draw_shared(&mut rng, 6, 2);
        let tasks = 48 * scale_from_env("CUFLOW_RANDOM_DAGS");
        let dags: Vec<_> = (0..tasks)
            .map(|_| {
                (
                    draw(&mut rng, 3, &common),
                    rng.gen_bool(0.5),
                    rng.gen::<u64>(),
                )
            })
            .collect();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        rt.block_on(async {
            let handles: Vec<_> = dags
                .into_iter()
                .enumerate()
                .map(|(i, ((op, want), own_policy, seed))| {
                    let device = device.clone();
                    tokio::spawn(async move {
                        let got = if own_policy {
                            match op.schedule(
                                &RandomPlacement::new(&device, 3, seed).expect("a policy"),
                            ) {
                                Ok(future) => future.await,
                                Err(e) => Err(e),
                            }
                        } else {
                            op.await
                        };
                        check(&format!("task {i} (own policy: {own_policy})"), got, want);
                    })
                })
                .collect();
            for handle in handles {
                handle.await.expect("a task panicked");
            }
        });
    });
}

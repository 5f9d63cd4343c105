//! Random sequences of ops over a few shared buffers, each op enqueued at once on a stream of
//! its own choosing (`schedule` under one of several policies, or `sync_on` on one of several
//! streams) and none awaited before the next is enqueued: the access ordering must make the
//! buffers end as the sequence run in order would leave them. A write waits for the earlier
//! reads and writes of its buffers on other streams, a read for the last write; writes that
//! follow a spin make a missing wait show as a stale value or a lost update. Futures are
//! awaited late, early or never (dropped: their work still runs, in order); the buffers are
//! also read back part-way. Four threads run sequences of their own at once.
//! `CUFLOW_RANDOM_ORDERS=N` runs N times as many sequences.

use cuflow_device_op::{zip, BoxedOp, DeviceError, DeviceFuture, DeviceOpExt};
use cuflow_runtime::Device;
use cuflow_scheduler::{SingleStream, StreamPoolRoundRobin};
use cuflow_testing::{
    dags::SHORT_SPIN,
    device::device,
    ops::{
        accumulate, add, affine, assert_all, bad_launch, buffer, compile_kernels, copy, fill,
        spin_then_write, Buf,
    },
    rng::{scale_from_env, seeded_rng},
    thread::within_a_minute,
};
use rand::rngs::StdRng;
use rand::Rng;

/// Buffers a sequence works on.
const BUFFERS: usize = 4;

/// One op of a sequence over buffers `0..BUFFERS`, and its effect on the model.
#[derive(Clone, Copy, Debug)]
enum Step {
    Fill(usize, i8),
    SpinFill(usize, i8),
    Affine(usize, i8, i8),
    Copy(usize, usize),
    Add(usize, usize, usize),
    Accumulate(usize, usize),
    /// Two steps in the branches of one `zip!` (on distinct buffers).
    Zip(usize, i8, usize, usize),
    /// A launch refused when enqueued: no effect.
    Refused(usize),
}

fn draw(rng: &mut StdRng) -> Step {
    let b = |rng: &mut StdRng| rng.gen_range(0..BUFFERS);
    let v = |rng: &mut StdRng| rng.gen_range(-4i8..4);
    let (x, y) = (b(rng), b(rng));
    let y = if y == x { (x + 1) % BUFFERS } else { y };
    match rng.gen_range(0..15) {
        0..=1 => Step::Fill(x, v(rng)),
        2..=4 => Step::SpinFill(x, v(rng)),
        5..=6 => Step::Affine(x, rng.gen_range(-1i8..=1), v(rng)),
        7..=8 => Step::Copy(x, y),
        // The output must not alias an input (such a launch is refused).
        9..=10 => {
            let z = (0..BUFFERS)
                .find(|&z| z != x && z != y)
                .expect("four buffers");
            Step::Add(x, y, if rng.gen_bool(0.5) { y } else { z })
        }
        11..=12 => Step::Accumulate(x, y),
        13 => {
            // Branch one writes `x`; branch two copies `y` into a third buffer.
            let z = (0..BUFFERS)
                .find(|&z| z != x && z != y)
                .expect("four buffers");
            Step::Zip(x, v(rng), z, y)
        }
        _ => Step::Refused(x),
    }
}

/// The step applied to the model.
fn apply(step: Step, m: &mut [f32; BUFFERS]) {
    match step {
        Step::Fill(x, v) | Step::SpinFill(x, v) => m[x] = f32::from(v),
        Step::Affine(x, a, c) => m[x] = m[x] * f32::from(a) + f32::from(c),
        Step::Copy(dst, src) => m[dst] = m[src],
        Step::Add(dst, x, y) => m[dst] = m[x] + m[y],
        Step::Accumulate(dst, src) => m[dst] += m[src],
        Step::Zip(x, v, dst, src) => {
            m[x] = f32::from(v);
            m[dst] = m[src];
        }
        Step::Refused(_) => {}
    }
}

/// The step as an op over `bufs`.
fn op(step: Step, bufs: &[Buf]) -> BoxedOp<'static, ()> {
    match step {
        Step::Fill(x, v) => fill(&bufs[x], f32::from(v)).map(drop).boxed(),
        Step::SpinFill(x, v) => spin_then_write(&bufs[x], f32::from(v), SHORT_SPIN)
            .map(drop)
            .boxed(),
        Step::Affine(x, a, c) => affine(&bufs[x], f32::from(a), f32::from(c))
            .map(drop)
            .boxed(),
        Step::Copy(dst, src) => copy(&bufs[dst], &bufs[src]).map(drop).boxed(),
        Step::Add(dst, x, y) => add(&bufs[dst], &bufs[x], &bufs[y]).map(drop).boxed(),
        Step::Accumulate(dst, src) => accumulate(&bufs[dst], &bufs[src]).map(drop).boxed(),
        Step::Zip(x, v, dst, src) => zip!(
            spin_then_write(&bufs[x], f32::from(v), SHORT_SPIN),
            copy(&bufs[dst], &bufs[src])
        )
        .map(drop)
        .boxed(),
        Step::Refused(x) => bad_launch(&bufs[x]).map(drop).boxed(),
    }
}

/// Where and how a step is enqueued.
struct Placements {
    one: SingleStream,
    other: SingleStream,
    pool: StreamPoolRoundRobin,
    streams: Vec<cuflow_runtime::Stream>,
}

impl Placements {
    fn new(device: &Device) -> Self {
        Placements {
            one: SingleStream::new(device).expect("a stream"),
            other: SingleStream::new(device).expect("a stream"),
            pool: StreamPoolRoundRobin::new(device, 3).expect("a pool"),
            streams: (0..2)
                .map(|_| device.new_stream().expect("a stream"))
                .collect(),
        }
    }

    /// Enqueues `op` somewhere at random: a future still to await, or `None` when it ran to
    /// completion already (`sync_on`).
    fn enqueue(
        &self,
        rng: &mut StdRng,
        op: BoxedOp<'static, ()>,
    ) -> Result<Option<DeviceFuture<()>>, DeviceError> {
        match rng.gen_range(0..5) {
            0 => op.schedule(&self.one).map(Some),
            1 => op.schedule(&self.other).map(Some),
            2 | 3 => op.schedule(&self.pool).map(Some),
            _ => op
                .sync_on(&self.streams[rng.gen_range(0..self.streams.len())])
                .map(|()| None),
        }
    }
}

fn sequences(seed: u64, count: usize, len: usize) {
    let count = count * scale_from_env("CUFLOW_RANDOM_ORDERS");
    let device = device();
    compile_kernels(&device).expect("compile the test kernels");
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let device = device.clone();
            scope.spawn(move || {
                let seed = seed ^ ((t + 1) << 32);
                let mut rng = seeded_rng(seed);
                let places = Placements::new(&device);
                for s in 0..count {
                    let mut model = [0.0f32; BUFFERS];
                    let bufs: Vec<Buf> = (0..BUFFERS).map(|_| buffer(0.0)).collect();
                    let mut pending = Vec::new();
                    let mut steps = Vec::new();
                    for _ in 0..len {
                        // Sums of sums double: past 2^16 a buffer is filled anew, so that
                        // every value stays an integer `f32` holds exactly.
                        let step = match draw(&mut rng) {
                            _ if model.iter().any(|v| v.abs() > 65536.0) => {
                                let x = (0..BUFFERS)
                                    .find(|&x| model[x].abs() > 65536.0)
                                    .expect("a large value");
                                Step::Fill(x, 1)
                            }
                            step => step,
                        };
                        steps.push(step);
                        let what = format!("thread {t}, sequence {s} of seed {seed:#x}: {steps:?}");
                        let enqueued = places.enqueue(&mut rng, op(step, &bufs));
                        match (enqueued, step) {
                            (Err(e), Step::Refused(_)) => assert!(
                                matches!(e, DeviceError::InvalidLaunch { .. }),
                                "{what}: refused with {e:?}"
                            ),
                            (Err(e), _) => panic!("{what}: failed: {e}"),
                            (Ok(_), Step::Refused(_)) => panic!("{what}: a refused launch ran"),
                            (Ok(Some(future)), _) => match rng.gen_range(0..10) {
                                0 => futures::executor::block_on(future)
                                    .unwrap_or_else(|e| panic!("{what}: failed: {e}")),
                                1 => drop(future),
                                _ => pending.push((future, what)),
                            },
                            (Ok(None), _) => {}
                        }
                        apply(step, &mut model);
                        if rng.gen_bool(0.05) {
                            // A read-back part-way orders itself after all of it.
                            let x = rng.gen_range(0..BUFFERS);
                            let what = format!("thread {t}, sequence {s} of seed {seed:#x}, buffer {x} part-way: {steps:?}");
                            assert_all(&bufs[x], model[x], &what);
                        }
                    }
                    for (future, what) in pending {
                        futures::executor::block_on(future)
                            .unwrap_or_else(|e| panic!("{what}: failed: {e}"));
                    }
                    for (x, buf) in bufs.iter().enumerate() {
                        let what = format!(
                            "thread {t}, sequence {s} of seed {seed:#x}, buffer {x} at the end: {steps:?}"
                        );
                        assert_all(buf, model[x], &what);
                    }
                }
            });
        }
    });
}

#[test]
fn random_sequences_over_shared_buffers_end_as_run_in_order() {
    within_a_minute("random sequences over shared buffers hung", || {
        sequences(0x00de_0a11_0001, 8, 24)
    });
}

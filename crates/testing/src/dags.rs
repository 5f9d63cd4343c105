//! Random DAGs of test ops for the tests of execution and capture: `then`, `zip!`,
//! `join_all`, `shared`, `unzip`, `map`, `inspect`, `named` and `with_priority` over
//! [`ops`](crate::ops), each DAG drawn with a model of its value. Every buffer of a DAG holds
//! one value in all its elements; an op writes a new buffer or rewrites one only its own DAG
//! uses, and writes that follow a spin make a missing wait show as a stale value. A DAG may
//! hold a failing launch ([`ops::bad_launch`](crate::ops::bad_launch), refused when enqueued)
//! or work that fails on the stream after it was enqueued
//! ([`ops::panic_on_stream`](crate::ops::panic_on_stream)), and may consume shared ops that
//! other DAGs consume too (only ever reading them).

use cuflow_device_op::{join_all, zip, BoxedOp, DeviceError, DeviceOpExt, Shared, UnzipExt};
use cuflow_scheduler::PriorityLevel;
use rand::rngs::StdRng;
use rand::Rng;

use crate::ops::{
    add, affine, assert_all, bad_launch, buffer, copy, fill, panic_on_stream, spin_then_write,
    sum_into, Buf, LEN, SPIN,
};

/// A spin of about 50 µs before a write (a 50 µs sleep on the host).
pub const SHORT_SPIN: u64 = SPIN / 400;

/// What a DAG gives: the value of every element of its output, or a failure.
pub type Value = Option<f32>;

/// A shared op and the value its consumers must read.
#[derive(Clone)]
pub struct SharedValue {
    /// The shared op.
    pub op: Shared<BoxedOp<'static, Buf>>,
    /// What its consumers read.
    pub value: Value,
}

impl std::fmt::Debug for SharedValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedValue")
            .field("value", &self.value)
            .finish_non_exhaustive()
    }
}

/// Draws a DAG of at most `depth` levels over new buffers and the shared ops of `pool`: the
/// op and what it must give.
pub fn draw(rng: &mut StdRng, depth: u32, pool: &[SharedValue]) -> (BoxedOp<'static, Buf>, Value) {
    draw_with_buffers(rng, depth, pool, &mut Vec::new())
}

/// `n` DAGs of at most `depth` levels, each made a shared op, with the values their consumers
/// must read.
pub fn draw_shared(rng: &mut StdRng, n: usize, depth: u32) -> Vec<SharedValue> {
    (0..n)
        .map(|_| {
            let (op, value) = draw(rng, depth, &[]);
            SharedValue {
                op: op.shared(),
                value,
            }
        })
        .collect()
}

/// Checks a DAG's outcome against its model: every element of its output equal to its value,
/// or, for a DAG holding failing work, the error of that work (a refused launch's or a
/// panic's), never `Ok`.
#[track_caller]
pub fn check(what: &str, got: Result<Buf, DeviceError>, want: Value) {
    match (got, want) {
        (Ok(buf), Some(v)) => assert_all(&buf, v, what),
        (Ok(_), None) => panic!("{what}: resolved Ok, but it holds failing work"),
        (Err(e), Some(v)) => panic!("{what}: failed ({e}), the model gives {v}"),
        (Err(e), None) => assert!(
            matches!(
                e,
                DeviceError::InvalidLaunch { .. } | DeviceError::Panicked { .. }
            ),
            "{what}: failed with {e:?}, not the error of its failing work"
        ),
    }
}

/// A new buffer of zeros, pushed onto `bufs`.
fn new_buf(bufs: &mut Vec<Buf>) -> Buf {
    let b = buffer(0.0);
    bufs.push(b.clone());
    b
}

/// [`draw`], also pushing onto `bufs` every buffer the DAG writes (all of them new, equal to
/// zero until the DAG runs; the buffers of the shared ops of `pool` are not among them).
pub fn draw_with_buffers(
    rng: &mut StdRng,
    depth: u32,
    pool: &[SharedValue],
    bufs: &mut Vec<Buf>,
) -> (BoxedOp<'static, Buf>, Value) {
    // Leaves are kinds 0 to 2; the kinds from 3 on nest DAGs one level less deep.
    let leaf = depth == 0 || rng.gen_bool(0.2);
    let kind = if leaf {
        rng.gen_range(0..3)
    } else {
        rng.gen_range(3..12)
    };
    match kind {
        0 => {
            let v = f32::from(rng.gen_range(-8i8..8));
            (fill(&new_buf(bufs), v).boxed(), Some(v))
        }
        1 => {
            let v = f32::from(rng.gen_range(-8i8..8));
            let out = spin_then_write(&new_buf(bufs), v, SHORT_SPIN).boxed();
            (out, Some(v))
        }
        2 if rng.gen_bool(0.1) => (bad_launch(&new_buf(bufs)).boxed(), None),
        2 if rng.gen_bool(0.05) => {
            // Work that fails on the stream, after it was enqueued.
            let op = fill(&new_buf(bufs), 1.0)
                .then(|b| panic_on_stream().map(move |()| b))
                .boxed();
            (op, None)
        }
        2 if pool.is_empty() => {
            let v = f32::from(rng.gen_range(-8i8..8));
            (fill(&new_buf(bufs), v).boxed(), Some(v))
        }
        2 | 3 if !pool.is_empty() => {
            // A consumer of a shared op: its output copied into a buffer of this DAG.
            let shared = pool[rng.gen_range(0..pool.len())].clone();
            let dst = new_buf(bufs);
            let op = shared.op.then(move |b| copy(&dst, &b)).boxed();
            (op, shared.value)
        }
        3 | 4 => {
            // `x · a + b` in place, after the op that wrote `x`.
            let (op, v) = draw_with_buffers(rng, depth - 1, pool, bufs);
            let (a, b) = (
                f32::from(rng.gen_range(-1i8..=1)),
                f32::from(rng.gen_range(-4i8..4)),
            );
            let op = op.then(move |x| affine(&x, a, b)).boxed();
            (op, v.map(|v| v * a + b))
        }
        5 => {
            // Two branches, their sum into a new buffer after both.
            let (x, vx) = draw_with_buffers(rng, depth - 1, pool, bufs);
            let (y, vy) = draw_with_buffers(rng, depth - 1, pool, bufs);
            let dst = new_buf(bufs);
            let op = zip!(x, y).then(move |(x, y)| add(&dst, &x, &y)).boxed();
            (op, vx.zip(vy).map(|(x, y)| x + y))
        }
        6 => {
            // Up to four branches joined, summed on one stream after all of them.
            let n = rng.gen_range(1..=4);
            let (ops, values): (Vec<_>, Vec<_>) = (0..n)
                .map(|_| draw_with_buffers(rng, depth - 1, pool, bufs))
                .unzip();
            let dst = new_buf(bufs);
            let op = join_all(ops).then(move |bufs| sum_into(&dst, bufs)).boxed();
            let total = values.into_iter().sum::<Option<f32>>();
            (op, total)
        }
        7 => {
            // A shared op consumed twice within this DAG, on two branches.
            let (x, v) = draw_with_buffers(rng, depth - 1, pool, bufs);
            let shared = x.shared();
            let (d1, d2, dst) = (new_buf(bufs), new_buf(bufs), new_buf(bufs));
            let left = shared.clone().then(move |b| copy(&d1, &b));
            let right = shared.then(move |b| copy(&d2, &b));
            let op = zip!(left, right)
                .then(move |(l, r)| add(&dst, &l, &r))
                .boxed();
            (op, v.map(|v| 2.0 * v))
        }
        9 => {
            // A pair of DAGs unzipped, its parts consumed in the other order.
            let (x, vx) = draw_with_buffers(rng, depth - 1, pool, bufs);
            let (y, vy) = draw_with_buffers(rng, depth - 1, pool, bufs);
            let (px, py) = zip!(x, y).unzip();
            let dst = new_buf(bufs);
            let op = zip!(py, px).then(move |(y, x)| add(&dst, &x, &y)).boxed();
            (op, vx.zip(vy).map(|(x, y)| x + y))
        }
        10 => {
            let (x, v) = draw_with_buffers(rng, depth - 1, pool, bufs);
            (x.with_priority(PriorityLevel::High).boxed(), v)
        }
        11 => {
            // Named and looked at on the host: the output passes unchanged.
            let (x, v) = draw_with_buffers(rng, depth - 1, pool, bufs);
            let op = x
                .named("a random DAG")
                .inspect(|b| assert_eq!(b.len(), LEN))
                .boxed();
            (op, v)
        }
        _ => {
            // A copy of the op's output, through a stage of `value`/`map`.
            let (x, v) = draw_with_buffers(rng, depth - 1, pool, bufs);
            let dst = new_buf(bufs);
            let op = x.map(|b| (b, 1)).then(move |(b, _)| copy(&dst, &b)).boxed();
            (op, v)
        }
    }
}

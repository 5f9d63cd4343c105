//! Random sequences of collectives, the same on every rank, each checked against a float64
//! model: all-reduce (out of place and in place, every reduction), all-gather,
//! reduce-scatter, broadcast from any root, a ring of sends and receives, and groups of
//! several of them, over `f32` and `i32` tensors of random shapes (empty ones included),
//! passed whole or as rows of a larger tensor. Each rank runs each step its own way: waited
//! for on the communicator's stream or on a stream of its own, or enqueued without waiting
//! and read back only at the end of the sequence, so that the collectives of a sequence
//! queue up behind one another and behind the copies that fill their inputs. The values are
//! small integers, so every result but a float mean is exact. `CUFLOW_RANDOM_COLLECTIVES=N`
//! runs N times as many sequences.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::communicators;
use cuflow_device_op::{enqueue_on, DeviceError, DeviceOp, DeviceOpExt};
use cuflow_dist::{
    all_gather, all_reduce, all_reduce_in_place, broadcast, group, reduce_scatter, CollectiveType,
    Communicator, GroupCall, ReduceOp,
};
use cuflow_runtime::Stream;
use cuflow_scheduler::{SchedulingPolicy, SingleStream};
use cuflow_tensor::{api, Tensor};
use cuflow_testing::rng::{scale_from_env, seeded_rng};
use cuflow_testing::thread::{on_each, within_a_minute};
use rand::rngs::StdRng;
use rand::Rng;

const TIMEOUT: Duration = Duration::from_secs(60);

/// One collective of a sequence: its kind and the shape of each rank's input.
#[derive(Clone, Debug)]
enum Call {
    AllReduce(ReduceOp),
    AllReduceInPlace(ReduceOp),
    AllGather,
    /// Each rank's input has `world` times the rows of the output.
    ReduceScatter(ReduceOp),
    Broadcast(usize),
    /// Each rank sends to the next and receives from the previous, in one group.
    Ring,
}

#[derive(Clone, Debug)]
struct Step {
    /// The collectives, in one group when there are several.
    calls: Vec<Call>,
    rows: usize,
    cols: usize,
    int: bool,
}

fn op(rng: &mut StdRng) -> ReduceOp {
    [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg][rng.gen_range(0..4)]
}

fn call(rng: &mut StdRng, world: usize) -> Call {
    match rng.gen_range(0..6) {
        0 => Call::AllReduce(op(rng)),
        1 => Call::AllReduceInPlace(op(rng)),
        2 => Call::AllGather,
        3 => Call::ReduceScatter(op(rng)),
        4 => Call::Broadcast(rng.gen_range(0..world)),
        // A rank does not send to itself (that is an error: a copy does it).
        _ if world == 1 => Call::AllGather,
        _ => Call::Ring,
    }
}

fn draw(rng: &mut StdRng, world: usize) -> Step {
    let calls = if rng.gen_bool(0.2) {
        // A group holds no in-place all-reduce (there is no such group call).
        (0..rng.gen_range(2..=3))
            .map(|_| match call(rng, world) {
                Call::AllReduceInPlace(op) => Call::AllReduce(op),
                c => c,
            })
            .collect()
    } else {
        vec![call(rng, world)]
    };
    Step {
        calls,
        rows: [0, 1, 2, 5, 64][rng.gen_range(0..5)],
        cols: [1, 3, 17, 1000][rng.gen_range(0..4)],
        int: rng.gen_bool(0.4),
    }
}

/// The rows of `call`'s input on each rank: `world` times as many for a reduce-scatter.
fn input_rows(call: &Call, step: &Step, world: usize) -> usize {
    match call {
        Call::ReduceScatter(_) => step.rows * world,
        _ => step.rows,
    }
}

/// Rank `rank`'s input of call `k` of step `s` of sequence `seq`: small integers, the same
/// on every rank (each rank's model needs every rank's inputs).
fn input(seq: u64, s: usize, k: usize, rank: usize, len: usize) -> Vec<f64> {
    let mut rng = seeded_rng(seq ^ ((s as u64) << 20) ^ ((k as u64) << 12) ^ rank as u64);
    (0..len)
        .map(|_| f64::from(rng.gen_range(-3i8..=3)))
        .collect()
}

fn reduce(op: ReduceOp, int: bool, xs: &[f64]) -> f64 {
    match op {
        ReduceOp::Sum => xs.iter().sum(),
        ReduceOp::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
        ReduceOp::Avg => {
            let mean = xs.iter().sum::<f64>() / xs.len() as f64;
            // Integers divide truncating toward zero.
            if int {
                mean.trunc()
            } else {
                mean
            }
        }
        _ => unreachable!("a reduction the sequences do not draw"),
    }
}

/// What `rank` must hold after `call`, from every rank's input.
fn model(call: &Call, int: bool, inputs: &[Vec<f64>], rank: usize) -> Vec<f64> {
    let world = inputs.len();
    let len = inputs[0].len();
    let reduced = |op| -> Vec<f64> {
        (0..len)
            .map(|i| {
                let xs: Vec<f64> = inputs.iter().map(|x| x[i]).collect();
                reduce(op, int, &xs)
            })
            .collect()
    };
    match *call {
        Call::AllReduce(op) | Call::AllReduceInPlace(op) => reduced(op),
        Call::AllGather => inputs.concat(),
        Call::ReduceScatter(op) => {
            let part = len / world;
            reduced(op)[rank * part..(rank + 1) * part].to_vec()
        }
        Call::Broadcast(root) => inputs[root].clone(),
        Call::Ring => inputs[(rank + world - 1) % world].clone(),
    }
}

/// How a rank runs one step.
#[derive(Clone, Copy, Debug)]
enum Run {
    /// `sync_on` the communicator's stream.
    OnComm,
    /// `sync_on` a stream of the rank's own.
    OnOwn,
    /// Enqueued on the rank's own stream, not waited for: read back at the end.
    Enqueued,
}

fn run<O: DeviceOp>(
    op: O,
    how: Run,
    comm: &Communicator,
    own: &Stream,
) -> Result<O::Output, DeviceError> {
    match how {
        Run::OnComm => op.sync_on(comm.stream()),
        Run::OnOwn => op.sync_on(own),
        Run::Enqueued => {
            let policy: Arc<dyn SchedulingPolicy> = Arc::new(SingleStream::on(own));
            enqueue_on(op, own, policy).map(|(out, _)| out)
        }
    }
}

/// Rank `comm`'s input tensor of `rows` × `cols` elements `data`: a whole tensor, or rows
/// in the middle of a larger one whose other rows are poison.
fn upload<T: CollectiveType>(
    rng: &mut StdRng,
    data: &[f64],
    rows: usize,
    cols: usize,
    own: &Stream,
) -> Result<Tensor<T>, DeviceError> {
    let values: Vec<T> = data.iter().map(|&v| T::from_f64(v)).collect();
    if rng.gen_bool(0.5) {
        return api::from_slice(&values, &[rows, cols]).sync_on(own);
    }
    let (before, after) = (rng.gen_range(0..3), rng.gen_range(0..3));
    let mut padded = vec![T::from_f64(99.0); before * cols];
    padded.extend(values);
    padded.extend(vec![T::from_f64(-99.0); after * cols]);
    let whole = api::from_slice(&padded, &[before + rows + after, cols]).sync_on(own)?;
    whole.narrow(0, before, rows)
}

/// The outputs a rank holds for one step's calls, to be read back and checked.
type Outputs<T> = Vec<(String, Tensor<T>, Vec<f64>)>;

/// Runs step `s` of sequence `seq` on `comm`; gives each call's output and what it must hold.
fn run_step<T: CollectiveType>(
    comm: &Communicator,
    own: &Stream,
    rng: &mut StdRng,
    seq: u64,
    s: usize,
    step: &Step,
) -> Result<Outputs<T>, DeviceError> {
    let (world, rank) = (comm.world_size(), comm.rank());
    let how = [Run::OnComm, Run::OnOwn, Run::Enqueued][rng.gen_range(0..3)];
    let mut inputs = Vec::new();
    let mut wants = Vec::new();
    for (k, call) in step.calls.iter().enumerate() {
        let rows = input_rows(call, step, world);
        let all: Vec<Vec<f64>> = (0..world)
            .map(|r| input(seq, s, k, r, rows * step.cols))
            .collect();
        wants.push(model(call, step.int, &all, rank));
        inputs.push(upload::<T>(rng, &all[rank], rows, step.cols, own)?);
    }
    let what = |k: usize| format!("step {s} ({:?}, run {how:?}), call {k}", step);
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    if step.calls.len() > 1 {
        let calls = step
            .calls
            .iter()
            .zip(&inputs)
            .flat_map(|(call, x)| match *call {
                Call::AllReduce(op) | Call::AllReduceInPlace(op) => {
                    vec![GroupCall::AllReduce(x.clone(), op)]
                }
                Call::AllGather => vec![GroupCall::AllGather(x.clone())],
                Call::ReduceScatter(op) => vec![GroupCall::ReduceScatter(x.clone(), op)],
                Call::Broadcast(root) => vec![GroupCall::Broadcast(x.clone(), root)],
                Call::Ring => vec![
                    GroupCall::Send(x.clone(), next),
                    GroupCall::Recv(x.shape().to_vec(), prev),
                ],
            })
            .collect();
        let outs = run(group(comm, calls), how, comm, own)?;
        // One output per call; a ring gives the sent tensor, then the received one.
        let mut outs = outs.into_iter();
        let mut got = Vec::new();
        for (k, (call, want)) in step.calls.iter().zip(wants).enumerate() {
            if let Call::Ring = call {
                outs.next();
            }
            let out = outs.next().expect("one output per call of the group");
            got.push((what(k), out, want));
        }
        return Ok(got);
    }
    let (call, mut x, want) = (&step.calls[0], inputs.remove(0), wants.remove(0));
    let out = match *call {
        Call::AllReduce(op) => run(all_reduce(comm, &x, op), how, comm, own)?,
        Call::AllReduceInPlace(op) => {
            run(all_reduce_in_place(comm, &mut x, op), how, comm, own)?;
            x
        }
        Call::AllGather => run(all_gather(comm, &x), how, comm, own)?,
        Call::ReduceScatter(op) => run(reduce_scatter(comm, &x, op), how, comm, own)?,
        Call::Broadcast(root) => run(broadcast(comm, &x, root), how, comm, own)?,
        Call::Ring => {
            let calls = vec![
                GroupCall::Send(x.clone(), next),
                GroupCall::Recv(x.shape().to_vec(), prev),
            ];
            let mut outs = run(group(comm, calls), how, comm, own)?;
            outs.pop().expect("the received tensor")
        }
    };
    Ok(vec![(what(0), out, want)])
}

/// Runs `count` sequences of `len` steps over `world` ranks; each rank checks every output.
fn run_sequences(world: usize, seed: u64, count: usize, len: usize) {
    let Some(comms) = communicators(world, TIMEOUT) else {
        return;
    };
    for sequence in 0..count {
        let seq = seed.wrapping_add(sequence as u64 * 0x9e37_79b9);
        let mut rng = seeded_rng(seq);
        let steps: Vec<Step> = (0..len).map(|_| draw(&mut rng, world)).collect();
        let results = on_each(&comms, |comm| -> Result<(), String> {
            let own = comm.device().new_stream().map_err(|e| e.to_string())?;
            let mut rng = seeded_rng(seq ^ ((comm.rank() as u64 + 1) << 40));
            let mut held = Vec::new();
            for (s, step) in steps.iter().enumerate() {
                let outs = if step.int {
                    run_step::<i32>(comm, &own, &mut rng, seq, s, step).map(|o| {
                        o.into_iter()
                            .map(|(w, t, want)| (w, Held::I32(t), want))
                            .collect::<Vec<_>>()
                    })
                } else {
                    run_step::<f32>(comm, &own, &mut rng, seq, s, step).map(|o| {
                        o.into_iter()
                            .map(|(w, t, want)| (w, Held::F32(t), want))
                            .collect::<Vec<_>>()
                    })
                };
                let outs = outs.map_err(|e| {
                    said(sequence, comm, format!("step {s} ({step:?}) failed: {e}"))
                })?;
                held.extend(outs);
                // Now and then, read back everything held so far, part-way.
                if rng.gen_bool(0.2) {
                    for (what, t, want) in held.drain(..) {
                        t.check(&what, &want).map_err(|e| said(sequence, comm, e))?;
                    }
                }
            }
            for (what, t, want) in held {
                t.check(&what, &want).map_err(|e| said(sequence, comm, e))?;
            }
            Ok(())
        });
        for (rank, r) in results.into_iter().enumerate() {
            if let Err(e) = r {
                panic!(
                    "sequence {sequence} of seed {seed:#x} over {world} ranks, rank {rank}: {e}\n\
                     steps: {steps:?}"
                );
            }
        }
    }
}

/// `why` a rank stops, said at once on stderr: under CUDA the other ranks then wait for this
/// one's next collective until their communicator's timeout.
fn said(sequence: usize, comm: &Communicator, why: String) -> String {
    eprintln!("sequence {sequence}, rank {}: {why}", comm.rank());
    why
}

/// An output of either element type.
enum Held {
    F32(Tensor<f32>),
    I32(Tensor<i32>),
}

impl Held {
    fn check(&self, what: &str, want: &[f64]) -> Result<(), String> {
        let got: Vec<f64> = match self {
            Held::F32(t) => t
                .to_host_vec()
                .map_err(|e| format!("{what}: read back: {e}"))?
                .into_iter()
                .map(f64::from)
                .collect(),
            Held::I32(t) => t
                .to_host_vec()
                .map_err(|e| format!("{what}: read back: {e}"))?
                .into_iter()
                .map(f64::from)
                .collect(),
        };
        if got.len() != want.len() {
            return Err(format!(
                "{what}: {} elements, the model has {}",
                got.len(),
                want.len()
            ));
        }
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            // Exact but for a float mean, which rounds: a sum divided by 3 rounds once, but a
            // backend may scale each input by 1/3 before summing (NCCL does), and a mean of
            // zero then comes out as a few ulps of the inputs (at most 3 in magnitude).
            if (g - w).abs() > 1e-6 * (w.abs() + 3.0) {
                return Err(format!("{what}: element {i} is {g}, the model gives {w}"));
            }
        }
        Ok(())
    }
}

#[test]
fn random_sequences_of_collectives_match_the_model_on_every_rank() {
    let count = 6 * scale_from_env("CUFLOW_RANDOM_COLLECTIVES");
    for world in [1, 2, 3, 4] {
        within_a_minute("random sequences of collectives", move || {
            run_sequences(world, 0xc011_0000 + world as u64, count, 12);
        });
    }
}

//! Collectives as device ops over tensors.
//!
//! Each op runs its lazy input, then enqueues its collective on its communicator's stream
//! ([`Communicator::stream`]) in order with the executing context's work: the communicator's
//! stream waits for what the context enqueued before, and the context's later work waits for
//! the collective (an event each way, added only when the context runs on another stream). So
//! the ops compose with `then` / `zip!` like kernels. Within a capture the collective is
//! recorded on a stream of the communicator's device private to the execution
//! (`ExecutionContext::on_stream`): the communicator's stream never joins the capture and stays
//! usable by other threads while it runs. Outputs are fresh tensors (inputs are only read),
//! except where noted.
//!
//! Every rank must build the same collectives in the same order. A collective moves a
//! tensor's elements as one range of its buffer: a contiguous view (rows from `narrow`, say)
//! moves its own elements, a strided one (a transpose) is an [`DeviceError::InvalidShape`]
//! that says to make a dense copy with `contiguous`. `all_gather` and `reduce_scatter` work
//! along axis 0.

use std::sync::Arc;

use cuflow_device_op::{from_fn, DeviceOp, ExecutionContext, FromFn};
use cuflow_runtime::{
    collective, BufferView, CollectiveCall, CollectiveElem, DeviceBuffer, DeviceError, Stream,
};
use cuflow_tensor::{DType, Tensor, TensorInput, TensorRef};

use crate::Communicator;
pub use cuflow_runtime::ReduceOp;

/// The op type of every collective: a [`from_fn`] op.
pub type CollectiveOp<F> = FromFn<F>;

/// Element types of tensors that collectives move: the tensor dtypes NCCL supports (`u8`,
/// `i32`, `u32`, `i64`, `f16`, `bf16`, `f32`, `f64`).
pub trait CollectiveType: DType + CollectiveElem {}

impl<T: DType + CollectiveElem> CollectiveType for T {}

fn alloc<T: CollectiveType>(stream: &Stream, shape: &[usize]) -> Result<Tensor<T>, DeviceError> {
    let len = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| DeviceError::InvalidShape {
            op: "collective",
            reason: format!("{shape:?} overflows usize"),
        })?;
    Tensor::from_buffer(Arc::new(DeviceBuffer::alloc(stream, len)?), shape)
}

fn check_on<T: DType>(
    op: &'static str,
    comm: &Communicator,
    t: &Tensor<T>,
) -> Result<(), DeviceError> {
    if t.device() != comm.device() {
        return Err(DeviceError::device_mismatch(
            op,
            "the tensor",
            comm.device(),
            t.device(),
        ));
    }
    Ok(())
}

/// The elements of `t` as one range of its buffer (a view moves its own elements, not its
/// buffer's); [`DeviceError::InvalidShape`] naming `op` for a strided view.
fn elements<'t, T: CollectiveType>(
    op: &'static str,
    t: &'t Tensor<T>,
) -> Result<BufferView<'t, T>, DeviceError> {
    if !t.is_contiguous() {
        return Err(DeviceError::InvalidShape {
            op,
            reason: format!(
                "moves a contiguous tensor, got a view of shape {:?} with strides {:?}; make a \
                 dense copy first with `contiguous`",
                t.shape(),
                t.strides()
            ),
        });
    }
    t.buffer().slice(t.offset()..t.offset() + t.len())
}

/// Runs the body of a collective op (its input, its checks, the enqueueing of its call) with
/// `ctx`. A body that fails has not enqueued its call on this rank, while the peers may have
/// enqueued theirs: the communicator is broken then (`Comm::abandon_call`), so that this rank's
/// next collective is refused instead of pairing with the peers' call of this one.
fn given_up_breaks_comm<R>(
    op: &'static str,
    comm: &Communicator,
    ctx: &mut ExecutionContext,
    body: impl FnOnce(&mut ExecutionContext) -> Result<R, DeviceError>,
) -> Result<R, DeviceError> {
    let result = body(ctx);
    if let Err(e) = &result {
        comm.comm().abandon_call(op, e);
    }
    result
}

/// Runs `enqueue` on `comm`'s stream, in order with `ctx`'s work.
fn on_comm<R>(
    ctx: &mut ExecutionContext,
    comm: &Communicator,
    enqueue: impl FnOnce(&Stream) -> Result<R, DeviceError>,
) -> Result<R, DeviceError> {
    ctx.on_stream(comm.stream(), enqueue)
}

/// The shape of a tensor with axis 0 scaled by `world` (`all_gather`'s output); a scalar
/// gathers into a vector. An [`DeviceError::InvalidShape`] naming `op` where axis 0 times
/// `world` overflows `usize` (an empty tensor may have an axis 0 of any length).
fn gathered(op: &'static str, shape: &[usize], world: usize) -> Result<Vec<usize>, DeviceError> {
    match shape.split_first() {
        Some((first, rest)) => {
            let first = first
                .checked_mul(world)
                .ok_or_else(|| DeviceError::InvalidShape {
                    op,
                    reason: format!(
                        "gathering {shape:?} from world_size = {world} ranks: axis 0 times \
                         {world} overflows usize"
                    ),
                })?;
            Ok(std::iter::once(first).chain(rest.iter().copied()).collect())
        }
        None => Ok(vec![world]),
    }
}

/// The op of a collective whose output is a fresh tensor: runs `x`, checks it is on `comm`'s
/// device, allocates the output (of the shape `out_shape` gives for `x`'s shape and the world
/// size) and enqueues the one call `call` makes of the input's and the output's elements.
fn out_of_place<T: CollectiveType, X: TensorInput<T>>(
    name: &'static str,
    comm: &Communicator,
    x: X,
    out_shape: impl FnOnce(&[usize], usize) -> Result<Vec<usize>, DeviceError> + Send,
    call: impl for<'b> FnOnce(BufferView<'b, T>, BufferView<'b, T>) -> CollectiveCall<'b> + Send,
) -> CollectiveOp<impl FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send> {
    let comm = comm.clone();
    let x = x.into_op();
    from_fn(move |ctx: &mut ExecutionContext| {
        given_up_breaks_comm(name, &comm, ctx, |ctx| {
            let x = x.execute(ctx)?;
            let x = x.tensor();
            check_on(name, &comm, x)?;
            let shape = out_shape(x.shape(), comm.world_size())?;
            on_comm(ctx, &comm, |stream| {
                let out = alloc::<T>(stream, &shape)?;
                let call = call(elements(name, x)?, out.buffer().view());
                collective(stream, comm.comm(), &[call])?;
                Ok(out)
            })
        })
    })
}

/// The shape of `reduce_scatter`'s output: axis 0 divided by `world`; an
/// [`DeviceError::InvalidShape`] where it does not divide (or there is no axis 0).
fn scattered(shape: &[usize], world: usize) -> Result<Vec<usize>, DeviceError> {
    match shape.split_first() {
        Some((&first, rest)) if first % world == 0 => Ok(std::iter::once(first / world)
            .chain(rest.iter().copied())
            .collect()),
        _ => Err(DeviceError::InvalidShape {
            op: "reduce_scatter",
            reason: format!(
                "splits axis 0 into world_size = {world} parts; {shape:?} has no axis 0 \
                 divisible by {world}"
            ),
        }),
    }
}

/// The element-wise reduction `op` of every rank's `x`, on every rank (`x` is read, a new
/// tensor of its shape holds the result).
///
/// # Examples
///
/// ```
/// use cuflow_dist::{all_reduce, Communicator, ReduceOp};
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::api;
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let [comm] = <[Communicator; 1]>::try_from(Communicator::local(&[Device::host()])?).unwrap();
/// let x = api::from_slice(&[1.0f32, -2.0], &[2]);
/// let y = all_reduce(&comm, x, ReduceOp::Max).sync_on(comm.stream())?;
/// assert_eq!(y.to_host_vec()?, vec![1.0, -2.0]); // one rank: its own values
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`DeviceError::DeviceMismatch`] when `x` is not on `comm`'s device; the errors of
/// [`cuflow_runtime::collective`]; on host devices a [`DeviceError::Timeout`] when a rank does
/// not take part; on CUDA, after the communicator's timeout (300 s unless
/// [`Communicator::local_with_timeout`] or [`DistConfig::timeout`](crate::DistConfig) said
/// otherwise), a [`DeviceError::Timeout`] from an NCCL call, which aborts the communicator,
/// and a device fault from the one-shot path of small sums (see
/// [`cuflow_runtime::collective`]).
pub fn all_reduce<T: CollectiveType, X: TensorInput<T>>(
    comm: &Communicator,
    x: X,
    op: ReduceOp,
) -> CollectiveOp<impl FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send> {
    out_of_place(
        "all_reduce",
        comm,
        x,
        |shape, _| Ok(shape.to_vec()),
        move |x, out| CollectiveCall::all_reduce(x, out, op),
    )
}

/// [`all_reduce`] in place: `x` itself becomes the reduction `op` of every rank's `x`. Allocates
/// nothing, so a step that uses it can be captured with its buffers fixed.
///
/// # Examples
///
/// ```
/// use cuflow_dist::{all_reduce_in_place, Communicator, ReduceOp};
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::api;
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let comms = Communicator::local(&[Device::host_numbered(0), Device::host_numbered(1)])?;
/// let sums = std::thread::scope(|s| {
///     let ranks: Vec<_> = comms.iter().map(|c| s.spawn(move || {
///         let mut x = api::full::<i32>(&[2], 1 + c.rank() as i32).sync_on(c.stream())?;
///         all_reduce_in_place(c, &mut x, ReduceOp::Sum).sync_on(c.stream())?;
///         x.to_host_vec()
///     })).collect();
///     ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<Vec<_>, _>>()
/// })?;
/// assert_eq!(sums, vec![vec![3, 3]; 2]);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// As [`all_reduce`].
pub fn all_reduce_in_place<'a, T: CollectiveType>(
    comm: &'a Communicator,
    x: &'a mut Tensor<T>,
    op: ReduceOp,
) -> CollectiveOp<impl FnOnce(&mut ExecutionContext) -> Result<(), DeviceError> + Send + 'a> {
    from_fn(move |ctx: &mut ExecutionContext| {
        given_up_breaks_comm("all_reduce", comm, ctx, |ctx| {
            check_on("all_reduce", comm, x)?;
            on_comm(ctx, comm, |stream| {
                let v = elements("all_reduce", x)?;
                collective(stream, comm.comm(), &[CollectiveCall::all_reduce(v, v, op)])
            })
        })
    })
}

/// Every rank's `x` concatenated along axis 0 in rank order, on every rank: `[n, …]` becomes
/// `[world_size · n, …]` (a scalar becomes a vector of `world_size`).
///
/// # Errors
///
/// As [`all_reduce`].
pub fn all_gather<T: CollectiveType, X: TensorInput<T>>(
    comm: &Communicator,
    x: X,
) -> CollectiveOp<impl FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send> {
    out_of_place(
        "all_gather",
        comm,
        x,
        |shape, world| gathered("all_gather", shape, world),
        |x, out| CollectiveCall::all_gather(x, out),
    )
}

/// The reduction `op` of every rank's `x`, split along axis 0 into `world_size` parts: rank `r`
/// gets part `r`, `[world_size · n, …]` becomes `[n, …]`.
///
/// # Errors
///
/// [`DeviceError::InvalidShape`] when `x` is a scalar or its axis 0 does not divide by the
/// world size; otherwise as [`all_reduce`].
pub fn reduce_scatter<T: CollectiveType, X: TensorInput<T>>(
    comm: &Communicator,
    x: X,
    op: ReduceOp,
) -> CollectiveOp<impl FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send> {
    out_of_place("reduce_scatter", comm, x, scattered, move |x, out| {
        CollectiveCall::reduce_scatter(x, out, op)
    })
}

/// Rank `root`'s `x` on every rank. Every rank passes a tensor of the same shape; only the
/// root's is read.
///
/// # Errors
///
/// [`DeviceError::InvalidArgument`] when `root` is not a rank; otherwise as [`all_reduce`].
pub fn broadcast<T: CollectiveType, X: TensorInput<T>>(
    comm: &Communicator,
    x: X,
    root: usize,
) -> CollectiveOp<impl FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send> {
    out_of_place(
        "broadcast",
        comm,
        x,
        |shape, _| Ok(shape.to_vec()),
        move |x, out| CollectiveCall::broadcast(x, out, root),
    )
}

/// Sends `x` to rank `peer`, which runs a matching [`recv`]; gives `x` back.
///
/// # Errors
///
/// [`DeviceError::InvalidArgument`] when `peer` is not another rank; otherwise as
/// [`all_reduce`].
pub fn send<T: CollectiveType, X: TensorInput<T>>(
    comm: &Communicator,
    x: X,
    peer: usize,
) -> CollectiveOp<impl FnOnce(&mut ExecutionContext) -> Result<X::Value, DeviceError> + Send> {
    let comm = comm.clone();
    let x = x.into_op();
    from_fn(move |ctx: &mut ExecutionContext| {
        given_up_breaks_comm("send", &comm, ctx, |ctx| {
            let x = x.execute(ctx)?;
            check_on("send", &comm, x.tensor())?;
            on_comm(ctx, &comm, |stream| {
                let call = CollectiveCall::send(elements("send", x.tensor())?, peer);
                collective(stream, comm.comm(), &[call])
            })?;
            Ok(x)
        })
    })
}

/// A new tensor of `shape` holding what rank `peer` sends with a matching [`send`].
///
/// # Errors
///
/// As [`send`].
pub fn recv<T: CollectiveType>(
    comm: &Communicator,
    shape: &[usize],
    peer: usize,
) -> CollectiveOp<impl FnOnce(&mut ExecutionContext) -> Result<Tensor<T>, DeviceError> + Send> {
    let comm = comm.clone();
    let shape = shape.to_vec();
    from_fn(move |ctx: &mut ExecutionContext| {
        given_up_breaks_comm("recv", &comm, ctx, |ctx| {
            on_comm(ctx, &comm, |stream| {
                let out = alloc::<T>(stream, &shape)?;
                collective(
                    stream,
                    comm.comm(),
                    &[CollectiveCall::recv(out.buffer().view(), peer)],
                )?;
                Ok(out)
            })
        })
    })
}

/// One collective of a [`group`].
#[derive(Debug)]
#[non_exhaustive]
pub enum GroupCall<T> {
    /// [`all_reduce`] of the tensor.
    AllReduce(Tensor<T>, ReduceOp),
    /// [`all_gather`] of the tensor.
    AllGather(Tensor<T>),
    /// [`reduce_scatter`] of the tensor.
    ReduceScatter(Tensor<T>, ReduceOp),
    /// [`broadcast`] of the tensor from the root rank.
    Broadcast(Tensor<T>, usize),
    /// [`send`] of the tensor to the peer rank.
    Send(Tensor<T>, usize),
    /// [`recv`] of a tensor of the shape from the peer rank.
    Recv(Vec<usize>, usize),
}

/// Runs `calls` as one group (NCCL's `ncclGroupStart` / `ncclGroupEnd`): they proceed
/// together, so sends and receives that pair up across ranks in any order cannot deadlock (a
/// ring exchange: each rank sends right and receives from the left). Gives one tensor per call,
/// in order: the result of each collective, the sent tensor itself for a send.
///
/// # Examples
///
/// ```
/// use cuflow_dist::{group, Communicator, GroupCall};
/// use cuflow_device_op::DeviceOpExt;
/// use cuflow_runtime::Device;
/// use cuflow_tensor::api;
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let comms = Communicator::local(&[Device::host_numbered(0), Device::host_numbered(1)])?;
/// // A ring shift: each rank sends its rank to the next and receives from the previous.
/// let got: Vec<Vec<i32>> = std::thread::scope(|s| {
///     let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || {
///         let (n, r) = (c.world_size(), c.rank());
///         let mine = api::full::<i32>(&[3], r as i32).sync_on(c.stream())?;
///         let calls = vec![GroupCall::Send(mine, (r + 1) % n), GroupCall::Recv(vec![3], (r + n - 1) % n)];
///         let out = group(c, calls).sync_on(c.stream())?;
///         out[1].to_host_vec()
///     })).collect();
///     hs.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, cuflow_runtime::DeviceError>>()
/// })?;
/// assert_eq!(got, vec![vec![1; 3], vec![0; 3]]);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// As the single collectives; [`DeviceError::DeviceMismatch`] when a tensor is not on `comm`'s
/// device.
pub fn group<T: CollectiveType>(
    comm: &Communicator,
    calls: Vec<GroupCall<T>>,
) -> CollectiveOp<impl FnOnce(&mut ExecutionContext) -> Result<Vec<Tensor<T>>, DeviceError> + Send>
{
    let comm = comm.clone();
    from_fn(move |ctx: &mut ExecutionContext| {
        given_up_breaks_comm("collective group", &comm, ctx, |ctx| {
            for call in &calls {
                if let GroupCall::AllReduce(t, _)
                | GroupCall::AllGather(t)
                | GroupCall::ReduceScatter(t, _)
                | GroupCall::Broadcast(t, _)
                | GroupCall::Send(t, _) = call
                {
                    check_on("collective group", &comm, t)?;
                }
            }
            on_comm(ctx, &comm, |stream| {
                let world = comm.world_size();
                let mut outs: Vec<Tensor<T>> = Vec::with_capacity(calls.len());
                for call in &calls {
                    outs.push(match call {
                        GroupCall::AllReduce(t, _) | GroupCall::Broadcast(t, _) => {
                            alloc(stream, t.shape())?
                        }
                        GroupCall::AllGather(t) => {
                            alloc(stream, &gathered("all_gather", t.shape(), world)?)?
                        }
                        GroupCall::ReduceScatter(t, _) => {
                            let shape = match t.shape().split_first() {
                                Some((&f, rest)) if f % world == 0 => std::iter::once(f / world)
                                    .chain(rest.iter().copied())
                                    .collect::<Vec<_>>(),
                                _ => {
                                    return Err(DeviceError::InvalidShape {
                                        op: "reduce_scatter",
                                        reason: format!(
                                            "splits axis 0 into world_size = {world} parts; {:?} \
                                             has no axis 0 divisible by {world}",
                                            t.shape()
                                        ),
                                    })
                                }
                            };
                            alloc(stream, &shape)?
                        }
                        GroupCall::Send(t, _) => t.clone(),
                        GroupCall::Recv(shape, _) => alloc(stream, shape)?,
                    });
                }
                let runtime_calls = calls
                    .iter()
                    .zip(&outs)
                    .map(|(call, out)| {
                        let o = out.buffer().view();
                        Ok(match call {
                            GroupCall::AllReduce(t, op) => {
                                CollectiveCall::all_reduce(elements("all_reduce", t)?, o, *op)
                            }
                            GroupCall::AllGather(t) => {
                                CollectiveCall::all_gather(elements("all_gather", t)?, o)
                            }
                            GroupCall::ReduceScatter(t, op) => CollectiveCall::reduce_scatter(
                                elements("reduce_scatter", t)?,
                                o,
                                *op,
                            ),
                            GroupCall::Broadcast(t, root) => {
                                CollectiveCall::broadcast(elements("broadcast", t)?, o, *root)
                            }
                            GroupCall::Send(t, peer) => {
                                CollectiveCall::send(elements("send", t)?, *peer)
                            }
                            GroupCall::Recv(_, peer) => CollectiveCall::recv(o, *peer),
                        })
                    })
                    .collect::<Result<Vec<CollectiveCall<'_>>, DeviceError>>()?;
                collective(stream, comm.comm(), &runtime_calls)?;
                Ok(outs)
            })
        })
    })
}

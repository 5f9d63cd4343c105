//! [`CollectiveCall`]: one collective of a group, with the buffers it reads and writes, and the
//! checks that keep a group's buffers consistent with its world size and free of races.

use std::fmt;

use super::dtype::{CollectiveDtype, CollectiveElem, ReduceOp};
use crate::error::{DeviceError, Result};
use crate::memory::{BufferView, Region};
use crate::stream::Stream;

/// What a call does; counts are in elements as NCCL counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallKind {
    AllReduce(ReduceOp),
    AllGather,
    ReduceScatter(ReduceOp),
    Broadcast { root: usize },
    Send { peer: usize },
    Recv { peer: usize },
}

impl CallKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            CallKind::AllReduce(_) => "all_reduce",
            CallKind::AllGather => "all_gather",
            CallKind::ReduceScatter(_) => "reduce_scatter",
            CallKind::Broadcast { .. } => "broadcast",
            CallKind::Send { .. } => "send",
            CallKind::Recv { .. } => "recv",
        }
    }

    /// The name of a group of calls of `kinds` in errors and traces: its one call's, or
    /// "collective group".
    pub(crate) fn group_name(mut kinds: impl ExactSizeIterator<Item = CallKind>) -> &'static str {
        match (kinds.len(), kinds.next()) {
            (1, Some(kind)) => kind.name(),
            _ => "collective group",
        }
    }
}

/// One collective: what it does, its element type, and its buffers. Built by the constructors
/// below and enqueued with [`collective`](fn@crate::collective) (a group of one or more calls).
///
/// Lengths, for a world of `n` ranks: `all_reduce` and `broadcast` take send and receive
/// buffers of one length; `all_gather` receives `n` times what each rank sends (rank `r`'s part
/// at `r · len`); `reduce_scatter` sends `n` times what it receives (part `r` goes to rank `r`).
/// Send and receive buffers may be the same range (in place) where NCCL allows it: the same view
/// for `all_reduce` and `broadcast`, the send view at this rank's part of the receive view for
/// `all_gather`, the receive view at this rank's part of the send view for `reduce_scatter`.
#[derive(Clone, Copy)]
pub struct CollectiveCall<'a> {
    pub(crate) kind: CallKind,
    pub(crate) dtype: CollectiveDtype,
    pub(crate) send: Option<Region<'a>>,
    pub(crate) recv: Option<Region<'a>>,
    /// Elements sent per rank and part (see [`CallKind`]).
    pub(crate) count: usize,
}

impl fmt::Debug for CollectiveCall<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectiveCall")
            .field("kind", &self.kind)
            .field("dtype", &self.dtype)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl<'a> CollectiveCall<'a> {
    fn new<T: CollectiveElem>(
        kind: CallKind,
        send: Option<BufferView<'a, T>>,
        recv: Option<BufferView<'a, T>>,
        count: usize,
    ) -> Self {
        CollectiveCall {
            kind,
            dtype: T::DTYPE,
            send: send.map(|v| v.region()),
            recv: recv.map(|v| v.region()),
            count,
        }
    }

    /// Every rank's `recv` becomes the reduction (`op`) over the ranks of their `send`.
    pub fn all_reduce<T: CollectiveElem>(
        send: BufferView<'a, T>,
        recv: BufferView<'a, T>,
        op: ReduceOp,
    ) -> Self {
        Self::new(CallKind::AllReduce(op), Some(send), Some(recv), send.len())
    }

    /// Every rank's `recv` becomes the ranks' `send` buffers one after another, in rank order.
    pub fn all_gather<T: CollectiveElem>(send: BufferView<'a, T>, recv: BufferView<'a, T>) -> Self {
        Self::new(CallKind::AllGather, Some(send), Some(recv), send.len())
    }

    /// Rank `r`'s `recv` becomes the reduction (`op`) over the ranks of part `r` of their
    /// `send` (each `send` is `world_size` parts of `recv`'s length).
    pub fn reduce_scatter<T: CollectiveElem>(
        send: BufferView<'a, T>,
        recv: BufferView<'a, T>,
        op: ReduceOp,
    ) -> Self {
        Self::new(
            CallKind::ReduceScatter(op),
            Some(send),
            Some(recv),
            recv.len(),
        )
    }

    /// Every rank's `recv` becomes rank `root`'s `send` (read on `root` only).
    pub fn broadcast<T: CollectiveElem>(
        send: BufferView<'a, T>,
        recv: BufferView<'a, T>,
        root: usize,
    ) -> Self {
        Self::new(
            CallKind::Broadcast { root },
            Some(send),
            Some(recv),
            recv.len(),
        )
    }

    /// Sends `data` to rank `peer`, which enqueues a matching [`CollectiveCall::recv`].
    pub fn send<T: CollectiveElem>(data: BufferView<'a, T>, peer: usize) -> Self {
        Self::new(CallKind::Send { peer }, Some(data), None, data.len())
    }

    /// Receives into `out` what rank `peer` sends with a matching [`CollectiveCall::send`] of
    /// the same length.
    pub fn recv<T: CollectiveElem>(out: BufferView<'a, T>, peer: usize) -> Self {
        Self::new(CallKind::Recv { peer }, None, Some(out), out.len())
    }

    /// Whether the call moves no data (then nothing is enqueued for it).
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn shape_err(&self, reason: String) -> DeviceError {
        DeviceError::InvalidShape {
            op: self.kind.name(),
            reason,
        }
    }

    fn arg_err(&self, index: usize, reason: String) -> DeviceError {
        DeviceError::InvalidArgument {
            kernel: self.kind.name().into(),
            index,
            reason,
        }
    }

    /// Checks the call against the stream's device and the communicator's world.
    pub(crate) fn validate(&self, stream: &Stream, rank: usize, world: usize) -> Result<()> {
        let op = self.kind.name();
        for (what, region) in [
            ("the send buffer", self.send),
            ("the receive buffer", self.recv),
        ] {
            if let Some(r) = region {
                r.mem.check_device(stream, op, what)?;
            }
        }
        let elem = self.dtype.size();
        let len = |r: Option<Region<'_>>| r.map_or(0, |r| r.len / elem);
        let (send, recv) = (len(self.send), len(self.recv));
        let per_rank =
            |total: usize, what: &str| -> Result<()> {
                if Some(total) != self.count.checked_mul(world) {
                    return Err(self.shape_err(format!(
                    "{what} must hold world_size × {} = {world} × {} elements, it holds {total}",
                    if what.starts_with("the receive") { "send length" } else { "receive length" },
                    self.count,
                )));
                }
                Ok(())
            };
        match self.kind {
            CallKind::AllReduce(_) | CallKind::Broadcast { .. } if send != recv => {
                return Err(self.shape_err(format!(
                    "the send buffer holds {send} elements and the receive buffer {recv}; they \
                     must be of one length"
                )));
            }
            CallKind::AllGather => per_rank(recv, "the receive buffer")?,
            CallKind::ReduceScatter(_) => per_rank(send, "the send buffer")?,
            _ => {}
        }
        let peer_check = |what: &str, peer: usize, self_ok: bool| -> Result<()> {
            if peer >= world {
                return Err(self.arg_err(
                    1,
                    format!("{what} {peer} is not a rank of this world of {world} ranks"),
                ));
            }
            if !self_ok && peer == rank {
                return Err(self.arg_err(
                    1,
                    format!("{what} {peer} is this rank itself; copy the buffer instead"),
                ));
            }
            Ok(())
        };
        match self.kind {
            CallKind::Broadcast { root } => peer_check("root", root, true),
            CallKind::Send { peer } | CallKind::Recv { peer } => peer_check("peer", peer, false),
            _ => Ok(()),
        }?;
        self.check_in_place(rank)
    }

    /// The send and receive buffers of one call are disjoint, or in place as NCCL allows.
    fn check_in_place(&self, rank: usize) -> Result<()> {
        let (Some(send), Some(recv)) = (self.send, self.recv) else {
            return Ok(());
        };
        if !overlap(&send, &recv) {
            return Ok(());
        }
        let part = self.count * self.dtype.size();
        let at = |r: &Region<'a>, offset: usize| Region {
            mem: r.mem,
            offset: r.offset + offset,
            len: part,
        };
        let allowed = match self.kind {
            CallKind::AllReduce(_) | CallKind::Broadcast { .. } => same(&send, &recv),
            CallKind::AllGather => same(&send, &at(&recv, rank * part)),
            CallKind::ReduceScatter(_) => same(&recv, &at(&send, rank * part)),
            _ => true,
        };
        if allowed {
            return Ok(());
        }
        Err(self.arg_err(
            1,
            "the send and receive buffers overlap; make them disjoint, or in place as the \
             collective allows (the same view for all_reduce and broadcast, this rank's part \
             of the other for all_gather and reduce_scatter)"
                .into(),
        ))
    }

    fn regions(&self) -> impl Iterator<Item = (Region<'a>, bool)> {
        let send = self.send.map(|r| (r, false));
        let recv = self.recv.map(|r| (r, true));
        send.into_iter().chain(recv)
    }
}

fn overlap(a: &Region<'_>, b: &Region<'_>) -> bool {
    std::ptr::eq(&**a.mem, &**b.mem)
        && a.len > 0
        && b.len > 0
        && a.offset < b.offset + b.len
        && b.offset < a.offset + a.len
}

fn same(a: &Region<'_>, b: &Region<'_>) -> bool {
    std::ptr::eq(&**a.mem, &**b.mem) && a.offset == b.offset && a.len == b.len
}

/// No call of a group writes a range that another call of the group reads or writes: the
/// calls of a group run concurrently on NCCL.
pub(crate) fn check_overlaps(calls: &[CollectiveCall<'_>]) -> Result<()> {
    for (i, a) in calls.iter().enumerate() {
        for b in &calls[i + 1..] {
            for (ra, wa) in a.regions() {
                for (rb, wb) in b.regions() {
                    if (wa || wb) && overlap(&ra, &rb) {
                        return Err(DeviceError::InvalidArgument {
                            kernel: "collective group".into(),
                            index: i,
                            reason: format!(
                                "{} writes a range that {} of the same group uses; the calls \
                                 of a group run concurrently, give them disjoint buffers",
                                if wa { a.kind.name() } else { b.kind.name() },
                                if wa { b.kind.name() } else { a.kind.name() },
                            ),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

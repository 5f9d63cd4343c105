//! Collectives on the host backend, built on a [`HostTransport`]'s point-to-point messages.
//!
//! A group runs as one task on the stream's worker, in three phases: it reads every send
//! buffer (each under its lock for the copy only) and hands every message to the transport,
//! which never waits for the receiver; it then receives what the group needs from each peer
//! (each wait bounded by the transport's deadline) and computes the results; last, it writes
//! every receive buffer. No buffer lock is held while waiting for a peer, so ranks in one
//! process never wait on each other's locks, and sending everything before receiving anything
//! lets every rank's group complete whatever the order in which the ranks reach it.
//!
//! Every message opens with a [`Header`] naming the call it belongs to: its kind, reduction,
//! root, element type and length, and its number among the communicator's calls of that kind.
//! The receiver compares it with its own call, so ranks that called different collectives (a
//! reduction or root of their own, another element type) fail at once, naming both calls,
//! instead of exchanging data; and a part a peer left behind in a collective that failed there
//! is never taken for a later one's (its number is older). A broadcast's other ranks send the
//! root a header alone, so that a root that another rank does not agree on is found by every
//! rank. Messages are matched by the call's kind; sends and receives pair in order per pair of
//! ranks, as NCCL's do.
//!
//! Reductions fold the contributions in rank order (rank 0's, then rank 1's, …), so every
//! rank computes bit-identical results; half types add in f32 and round at each step, as NCCL
//! does. The task is an `Fn`: a captured group exchanges again at every replay.
//!
//! A group that failed may leave messages behind (a peer's part that was never taken, after
//! another peer's part was refused), which a later group would take for its own: so the first
//! failure breaks the communicator for good, and every later group fails at once, saying why;
//! the transport tells the peers ([`HostTransport::abort`]), so that theirs break too.

use std::sync::Arc;

use bytemuck::Pod;
use parking_lot::Mutex;

use super::capture::HostNodeKind;
use super::memory::host_mem;
use super::stream::HostStream;
use crate::collective::CallKind;
use crate::collective::{CollectiveCall, CollectiveDtype, HostTransport, ReduceOp};
use crate::error::{DeviceError, Result};
use crate::memory::Memory;

/// A byte range the task owns a handle to.
struct OwnedRegion {
    mem: Arc<Memory>,
    offset: usize,
    len: usize,
}

impl OwnedRegion {
    fn read(&self) -> Result<Vec<u8>> {
        let h = host_mem(&self.mem)?;
        let words = h.read();
        let bytes: &[u8] = bytemuck::cast_slice(&words[..]);
        Ok(bytes[self.offset..self.offset + self.len].to_vec())
    }

    fn write(&self, data: &[u8]) -> Result<()> {
        let h = host_mem(&self.mem)?;
        let mut words = h.write();
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words[..]);
        bytes[self.offset..self.offset + self.len].copy_from_slice(data);
        Ok(())
    }
}

struct HostCall {
    kind: CallKind,
    dtype: CollectiveDtype,
    count: usize,
    send: Option<OwnedRegion>,
    recv: Option<OwnedRegion>,
}

/// The collective kinds (all but send / recv): each numbers its calls, per communicator.
const NUMBERED_KINDS: usize = 4;

impl HostCall {
    /// The tag of the call's messages: its kind (send and receive share one). Messages of one
    /// tag between two ranks are matched in order; their [`Header`]s say whether they belong
    /// together.
    fn tag(&self) -> u64 {
        match self.kind {
            CallKind::AllReduce(_) => 1,
            CallKind::AllGather => 2,
            CallKind::ReduceScatter(_) => 3,
            CallKind::Broadcast { .. } => 4,
            CallKind::Send { .. } | CallKind::Recv { .. } => 5,
        }
    }

    /// The index of the call's kind among [`NUMBERED_KINDS`]; `None` for send and receive,
    /// which pair in order per pair of ranks.
    fn numbered_kind(&self) -> Option<usize> {
        match self.kind {
            CallKind::AllReduce(_) => Some(0),
            CallKind::AllGather => Some(1),
            CallKind::ReduceScatter(_) => Some(2),
            CallKind::Broadcast { .. } => Some(3),
            CallKind::Send { .. } | CallKind::Recv { .. } => None,
        }
    }

    /// The header of the call's messages, the call being number `seq` of its kind.
    fn header(&self, seq: u64) -> Header {
        let (kind, op, root) = match self.kind {
            CallKind::AllReduce(op) => (1, Some(op), 0),
            CallKind::AllGather => (2, None, 0),
            CallKind::ReduceScatter(op) => (3, Some(op), 0),
            CallKind::Broadcast { root } => (4, None, root as u64),
            CallKind::Send { .. } | CallKind::Recv { .. } => (5, None, 0),
        };
        let op = match op {
            None => 0,
            Some(ReduceOp::Sum) => 1,
            Some(ReduceOp::Max) => 2,
            Some(ReduceOp::Min) => 3,
            Some(ReduceOp::Avg) => 4,
        };
        Header {
            seq,
            root,
            count: self.count as u64,
            kind,
            op,
            dtype: self.dtype as u8,
        }
    }

    fn part_bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    fn send_bytes(&self) -> Result<Vec<u8>> {
        match &self.send {
            Some(r) => r.read(),
            None => Err(DeviceError::internal(
                "a collective without a send buffer sends",
            )),
        }
    }
}

/// What a message says of the call it belongs to; its receiver takes the message only when
/// the header is the one its own call would send. Encoded little-endian ahead of the data.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Header {
    /// The call's number among its communicator's calls of its kind (0 for send / recv).
    seq: u64,
    /// A broadcast's root (0 for other kinds).
    root: u64,
    /// Elements per part, as [`HostCall::count`].
    count: u64,
    /// 1 all-reduce, 2 all-gather, 3 reduce-scatter, 4 broadcast, 5 send / recv.
    kind: u8,
    /// 0 none, 1 sum, 2 max, 3 min, 4 average.
    op: u8,
    /// The [`CollectiveDtype`]'s discriminant.
    dtype: u8,
}

impl Header {
    const BYTES: usize = 27;

    /// The header's bytes followed by `data`.
    fn message(&self, data: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(Self::BYTES + data.len());
        m.extend_from_slice(&self.seq.to_le_bytes());
        m.extend_from_slice(&self.root.to_le_bytes());
        m.extend_from_slice(&self.count.to_le_bytes());
        m.extend_from_slice(&[self.kind, self.op, self.dtype]);
        m.extend_from_slice(data);
        m
    }

    /// The header at the start of `message`, or `None` when it is too short to hold one.
    fn read(message: &[u8]) -> Option<Header> {
        let u64_at = |i: usize| {
            message
                .get(i..i + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        let byte = |i: usize| message.get(i).copied();
        Some(Header {
            seq: u64_at(0)?,
            root: u64_at(8)?,
            count: u64_at(16)?,
            kind: byte(24)?,
            op: byte(25)?,
            dtype: byte(26)?,
        })
    }
}

impl std::fmt::Display for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const KINDS: [&str; 5] = [
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "broadcast",
            "send / recv",
        ];
        const OPS: [&str; 4] = ["sum", "max", "min", "avg"];
        const DTYPES: [&str; 8] = ["u8", "i32", "u32", "i64", "f16", "bf16", "f32", "f64"];
        let name = |names: &[&'static str], code: u8, base: u8| {
            code.checked_sub(base)
                .and_then(|i| names.get(usize::from(i)).copied())
                .unwrap_or("?")
        };
        write!(f, "{}", name(&KINDS, self.kind, 1))?;
        if self.kind != 5 {
            write!(f, " #{}", self.seq)?;
        }
        if self.op != 0 {
            write!(f, " ({})", name(&OPS, self.op, 1))?;
        }
        if self.kind == 4 {
            write!(f, " from rank {}", self.root)?;
        }
        write!(
            f,
            " of {} {} elements",
            self.count,
            name(&DTYPES, self.dtype, 0)
        )
    }
}

/// A host communicator: its transport, the number of its next call of each kind, and the
/// first failure of its groups.
pub(crate) struct HostComm {
    transport: Arc<dyn HostTransport>,
    /// The number the next call of each of [`NUMBERED_KINDS`] gets.
    next: Mutex<[u64; NUMBERED_KINDS]>,
    /// The first failed group's error; once set, every group fails at once.
    failed: Mutex<Option<DeviceError>>,
}

impl HostComm {
    pub(crate) fn new(transport: Arc<dyn HostTransport>) -> HostComm {
        HostComm {
            transport,
            next: Mutex::new([0; NUMBERED_KINDS]),
            failed: Mutex::new(None),
        }
    }

    /// The headers of `calls`, each numbered after the earlier calls of its kind.
    fn headers(&self, calls: &[HostCall]) -> Vec<Header> {
        let mut next = self.next.lock();
        calls
            .iter()
            .map(|call| {
                let seq = match call.numbered_kind().and_then(|k| next.get_mut(k)) {
                    Some(n) => {
                        let seq = *n;
                        *n += 1;
                        seq
                    }
                    None => 0,
                };
                call.header(seq)
            })
            .collect()
    }

    /// Breaks the communicator with `failure` unless a group failed already, and tells the
    /// peers: a failed group's parts may be left at them (`HostTransport::abort`).
    fn fail(&self, failure: DeviceError) {
        if self.first_failure(&failure) {
            self.transport.abort(&failure.to_string());
        }
    }

    /// Breaks the communicator after a call this rank gave up before sending anything of it
    /// (see `Comm::abandon_call`), run once the rank's earlier groups have: the peers take what
    /// it sent before, then fail (`HostTransport::close`).
    pub(crate) fn abandon(&self, failure: DeviceError) {
        if self.first_failure(&failure) {
            self.transport.close(&failure.to_string());
        }
    }

    /// Keeps `failure` unless a group failed already; whether it is the first.
    fn first_failure(&self, failure: &DeviceError) -> bool {
        let mut failed = self.failed.lock();
        let first = failed.is_none();
        failed.get_or_insert_with(|| failure.clone());
        first
    }

    /// Runs the group `calls` of rank `rank`, unless an earlier group failed.
    fn run(&self, rank: usize, calls: &[HostCall]) -> Result<()> {
        if let Some(first) = &*self.failed.lock() {
            return Err(DeviceError::Collective {
                op: CallKind::group_name(calls.iter().map(|c| c.kind)),
                rank,
                reason: format!(
                    "an earlier collective of this communicator failed ({first}), which left \
                     its ranks out of step; make a new communicator"
                ),
            });
        }
        let headers = self.headers(calls);
        let result = run_group(&*self.transport, rank, calls, &headers);
        if let Err(e) = &result {
            self.fail(e.clone());
        }
        result
    }
}

/// Enqueues the group `calls` of rank `rank` on `stream`.
pub(crate) fn enqueue_collective(
    stream: &HostStream,
    comm: Arc<HostComm>,
    rank: usize,
    calls: &[&CollectiveCall<'_>],
) -> Result<()> {
    let own = |r: Option<crate::memory::Region<'_>>| {
        r.map(|r| OwnedRegion {
            mem: Arc::clone(r.mem),
            offset: r.offset,
            len: r.len,
        })
    };
    let calls: Vec<HostCall> = calls
        .iter()
        .map(|c| HostCall {
            kind: c.kind,
            dtype: c.dtype,
            count: c.count,
            send: own(c.send),
            recv: own(c.recv),
        })
        .collect();
    let (first, n) = (calls.first().map(|c| (c.kind.name(), c.count)), calls.len());
    let label = move || match first {
        Some((kind, count)) if n == 1 => format!("{kind} of {count} elements"),
        _ => format!("collective group of {n} calls"),
    };
    stream.enqueue(
        Arc::new(move || comm.run(rank, &calls)),
        HostNodeKind::Collective,
        label,
    )
}

fn run_group(
    t: &dyn HostTransport,
    rank: usize,
    calls: &[HostCall],
    headers: &[Header],
) -> Result<()> {
    let world = t.world_size();
    let others = || (0..world).filter(move |&p| p != rank);
    // Phase 1: read the send buffers and post every message.
    let mut own: Vec<Option<Vec<u8>>> = Vec::with_capacity(calls.len());
    for (call, header) in calls.iter().zip(headers) {
        let tag = call.tag();
        let part = call.part_bytes();
        own.push(match call.kind {
            CallKind::AllReduce(_) | CallKind::AllGather => {
                let data = call.send_bytes()?;
                let message = header.message(&data);
                for peer in others() {
                    t.send(peer, tag, message.clone())?;
                }
                Some(data)
            }
            CallKind::ReduceScatter(_) => {
                let data = call.send_bytes()?;
                for peer in others() {
                    t.send(
                        peer,
                        tag,
                        header.message(&data[peer * part..(peer + 1) * part]),
                    )?;
                }
                Some(data[rank * part..(rank + 1) * part].to_vec())
            }
            CallKind::Broadcast { root } if root == rank => {
                let data = call.send_bytes()?;
                let message = header.message(&data);
                for peer in others() {
                    t.send(peer, tag, message.clone())?;
                }
                Some(data)
            }
            CallKind::Broadcast { .. } => {
                // The header alone, to every rank: each checks that every other takes the
                // same rank for the root (a rank that took another rank for the root would
                // otherwise be told by no one, and wait for it until its deadline).
                let message = header.message(&[]);
                for peer in others() {
                    t.send(peer, tag, message.clone())?;
                }
                None
            }
            CallKind::Send { peer } => {
                t.send(peer, tag, header.message(&call.send_bytes()?))?;
                None
            }
            CallKind::Recv { .. } => None,
        });
    }
    // Phase 2: receive and compute each call's result.
    let mut results: Vec<Option<Vec<u8>>> = Vec::with_capacity(calls.len());
    for ((call, header), own) in calls.iter().zip(headers).zip(own) {
        let tag = call.tag();
        let part = call.part_bytes();
        let name = call.kind.name();
        let fail = |reason: String| DeviceError::Collective {
            op: name,
            rank,
            reason,
        };
        let recv = |peer: usize, want: usize| -> Result<Vec<u8>> {
            // Named after the collective, not the transport's step.
            let mut data = t.recv(peer, tag).map_err(|e| match e {
                DeviceError::Timeout { what, waited_ms } => DeviceError::Timeout {
                    what: format!("{name}: {what}"),
                    waited_ms,
                },
                DeviceError::Collective { rank, reason, .. } => DeviceError::Collective {
                    op: name,
                    rank,
                    reason,
                },
                e => e,
            })?;
            match Header::read(&data) {
                Some(theirs) if theirs == *header => {}
                Some(theirs) => {
                    return Err(fail(format!(
                        "rank {peer} sent its part of {theirs} where this rank calls \
                         {header}; every rank must call the same collectives, with the same \
                         arguments, in the same order"
                    )))
                }
                None => {
                    return Err(fail(format!(
                        "rank {peer} sent a message of {} bytes, too short for a header",
                        data.len()
                    )))
                }
            }
            data.drain(..Header::BYTES);
            if data.len() != want {
                return Err(fail(format!(
                    "rank {peer} sent {} bytes where this rank expects {want}; every rank \
                     must pass buffers of the same length",
                    data.len()
                )));
            }
            Ok(data)
        };
        let gather = |own: Vec<u8>, want: usize| -> Result<Vec<Vec<u8>>> {
            let mut own = Some(own);
            (0..world)
                .map(|r| match own.take_if(|_| r == rank) {
                    Some(o) => Ok(o),
                    None => recv(r, want),
                })
                .collect()
        };
        let own_data = || {
            own.clone()
                .ok_or_else(|| DeviceError::internal("no own data"))
        };
        results.push(match call.kind {
            CallKind::AllReduce(op) | CallKind::ReduceScatter(op) => {
                let parts = gather(own_data()?, part)?;
                Some(reduce(call.dtype, op, &parts))
            }
            CallKind::AllGather => Some(gather(own_data()?, part)?.concat()),
            CallKind::Broadcast { root } if root == rank => {
                for peer in others() {
                    recv(peer, 0)?;
                }
                own
            }
            CallKind::Broadcast { root } => {
                let mut data = None;
                for peer in others() {
                    let got = recv(peer, if peer == root { part } else { 0 })?;
                    if peer == root {
                        data = Some(got);
                    }
                }
                data
            }
            CallKind::Recv { peer } => Some(recv(peer, part)?),
            CallKind::Send { .. } => None,
        });
    }
    // Phase 3: write the receive buffers.
    for (call, result) in calls.iter().zip(results) {
        if let (Some(out), Some(data)) = (&call.recv, result) {
            out.write(&data)?;
        }
    }
    Ok(())
}

/// Arithmetic of the element types, as the reductions need it. A float max or min skips a NaN
/// (NaN only when both are), as NCCL's does (`fmaxf` / `fminf`, `__hmax` / `__hmin`): the
/// result does not depend on which rank holds the NaN.
///
/// An average of floats scales each part by `1/n` before the parts are summed, as NCCL's
/// `ncclAvg` does for them (so values near the type's largest do not overflow to infinity); an
/// average of integers sums, wrapping, then divides, as NCCL's does.
trait Reduce: Pod {
    /// Whether an average scales the parts before it sums them.
    const SCALES_FIRST: bool;
    fn add(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn div(a: Self, n: usize) -> Self;
}

macro_rules! reduce_int {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            const SCALES_FIRST: bool = false;
            fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            // In i128: the world size may not fit the element type (257 ranks of u8), and
            // the quotient fits wherever `a` does.
            fn div(a: Self, n: usize) -> Self {
                let n = i128::try_from(n).unwrap_or(i128::MAX);
                <$t>::try_from(i128::from(a) / n).unwrap_or_default()
            }
        }
    )*};
}
reduce_int!(u8, i32, u32, i64);

macro_rules! reduce_float {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            const SCALES_FIRST: bool = true;
            fn add(a: Self, b: Self) -> Self { a + b }
            fn max(a: Self, b: Self) -> Self { a.max(b) }
            fn min(a: Self, b: Self) -> Self { a.min(b) }
            fn div(a: Self, n: usize) -> Self { a / (n as $t) }
        }
    )*};
}
reduce_float!(f32, f64);

macro_rules! reduce_half {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            const SCALES_FIRST: bool = true;
            fn add(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() + b.to_f32()) }
            fn max(a: Self, b: Self) -> Self { a.max(b) }
            fn min(a: Self, b: Self) -> Self { a.min(b) }
            fn div(a: Self, n: usize) -> Self { <$t>::from_f32(a.to_f32() / n as f32) }
        }
    )*};
}
reduce_half!(half::f16, half::bf16);

/// The element-wise reduction of `parts` (one per rank, in rank order) as bytes.
fn reduce(dtype: CollectiveDtype, op: ReduceOp, parts: &[Vec<u8>]) -> Vec<u8> {
    match dtype {
        CollectiveDtype::U8 => reduce_as::<u8>(op, parts),
        CollectiveDtype::I32 => reduce_as::<i32>(op, parts),
        CollectiveDtype::U32 => reduce_as::<u32>(op, parts),
        CollectiveDtype::I64 => reduce_as::<i64>(op, parts),
        CollectiveDtype::F16 => reduce_as::<half::f16>(op, parts),
        CollectiveDtype::BF16 => reduce_as::<half::bf16>(op, parts),
        CollectiveDtype::F32 => reduce_as::<f32>(op, parts),
        CollectiveDtype::F64 => reduce_as::<f64>(op, parts),
    }
}

/// `bytes` (of any alignment) as elements.
fn elements<T: Pod>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

fn reduce_as<T: Reduce>(op: ReduceOp, parts: &[Vec<u8>]) -> Vec<u8> {
    let ranks = parts.len();
    let scale_first = op == ReduceOp::Avg && T::SCALES_FIRST;
    let part = |bytes: &Vec<u8>| -> Vec<T> {
        let mut x: Vec<T> = elements(bytes);
        if scale_first {
            for v in &mut x {
                *v = T::div(*v, ranks);
            }
        }
        x
    };
    let mut parts = parts.iter();
    let mut acc: Vec<T> = match parts.next() {
        Some(first) => part(first),
        None => return Vec::new(),
    };
    let f: fn(T, T) -> T = match op {
        ReduceOp::Sum | ReduceOp::Avg => T::add,
        ReduceOp::Max => T::max,
        ReduceOp::Min => T::min,
    };
    for x in parts {
        for (a, b) in acc.iter_mut().zip(part(x)) {
            *a = f(*a, b);
        }
    }
    if op == ReduceOp::Avg && !scale_first {
        for a in &mut acc {
            *a = T::div(*a, ranks);
        }
    }
    bytemuck::cast_slice(&acc).to_vec()
}

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

impl HostCall {
    /// The tag of the call's messages: its kind and element type. Messages of one tag between
    /// two ranks are matched in order.
    fn tag(&self) -> u64 {
        let kind: u64 = match self.kind {
            CallKind::AllReduce(_) => 1,
            CallKind::AllGather => 2,
            CallKind::ReduceScatter(_) => 3,
            CallKind::Broadcast { .. } => 4,
            CallKind::Send { .. } | CallKind::Recv { .. } => 5,
        };
        (kind << 8) | self.dtype as u64
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

/// A host communicator: its transport, and the first failure of its groups.
pub(crate) struct HostComm {
    transport: Arc<dyn HostTransport>,
    /// The first failed group's error; once set, every group fails at once.
    failed: Mutex<Option<DeviceError>>,
}

impl HostComm {
    pub(crate) fn new(transport: Arc<dyn HostTransport>) -> HostComm {
        HostComm {
            transport,
            failed: Mutex::new(None),
        }
    }

    /// Runs the group `calls` of rank `rank`, unless an earlier group failed.
    fn run(&self, rank: usize, calls: &[HostCall]) -> Result<()> {
        if let Some(first) = &*self.failed.lock() {
            let op = match calls {
                [call] => call.kind.name(),
                _ => "collective group",
            };
            return Err(DeviceError::Collective {
                op,
                rank,
                reason: format!(
                    "an earlier collective of this communicator failed ({first}), which left \
                     its ranks out of step; make a new communicator"
                ),
            });
        }
        let result = run_group(&*self.transport, rank, calls);
        if let Err(e) = &result {
            let first = {
                let mut failed = self.failed.lock();
                let first = failed.is_none();
                failed.get_or_insert_with(|| e.clone());
                first
            };
            if first {
                self.transport.abort(&e.to_string());
            }
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
    stream.enqueue(Arc::new(move || comm.run(rank, &calls)), label)
}

fn run_group(t: &dyn HostTransport, rank: usize, calls: &[HostCall]) -> Result<()> {
    let world = t.world_size();
    // Phase 1: read the send buffers and post every message.
    let mut own: Vec<Option<Vec<u8>>> = Vec::with_capacity(calls.len());
    for call in calls {
        let tag = call.tag();
        let part = call.part_bytes();
        own.push(match call.kind {
            CallKind::AllReduce(_) | CallKind::AllGather => {
                let data = call.send_bytes()?;
                for peer in (0..world).filter(|&p| p != rank) {
                    t.send(peer, tag, data.clone())?;
                }
                Some(data)
            }
            CallKind::ReduceScatter(_) => {
                let data = call.send_bytes()?;
                for peer in (0..world).filter(|&p| p != rank) {
                    t.send(peer, tag, data[peer * part..(peer + 1) * part].to_vec())?;
                }
                Some(data[rank * part..(rank + 1) * part].to_vec())
            }
            CallKind::Broadcast { root } if root == rank => {
                let data = call.send_bytes()?;
                for peer in (0..world).filter(|&p| p != rank) {
                    t.send(peer, tag, data.clone())?;
                }
                Some(data)
            }
            CallKind::Send { peer } => {
                t.send(peer, tag, call.send_bytes()?)?;
                None
            }
            CallKind::Broadcast { .. } | CallKind::Recv { .. } => None,
        });
    }
    // Phase 2: receive and compute each call's result.
    let mut results: Vec<Option<Vec<u8>>> = Vec::with_capacity(calls.len());
    for (call, own) in calls.iter().zip(own) {
        let tag = call.tag();
        let part = call.part_bytes();
        let name = call.kind.name();
        let recv = |peer: usize, want: usize| -> Result<Vec<u8>> {
            let data = t.recv(peer, tag).map_err(|e| match e {
                DeviceError::Timeout { what, waited_ms } => DeviceError::Timeout {
                    what: format!("{name}: {what}"),
                    waited_ms,
                },
                e => e,
            })?;
            if data.len() != want {
                return Err(DeviceError::Collective {
                    op: name,
                    rank,
                    reason: format!(
                        "rank {peer} sent {} bytes where this rank expects {want}; every rank \
                         must pass buffers of the same length",
                        data.len()
                    ),
                });
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
            CallKind::Broadcast { root } if root == rank => own,
            CallKind::Broadcast { root } => Some(recv(root, part)?),
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

/// Arithmetic of the element types, as the reductions need it.
trait Reduce: Pod {
    fn add(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn div(a: Self, n: usize) -> Self;
}

macro_rules! reduce_int {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            // In i128: the world size need not fit in the element type (256 ranks and more
            // average u8s); the quotient is no larger than `a`, so it converts back exactly.
            fn div(a: Self, n: usize) -> Self { (i128::from(a) / n as i128) as $t }
        }
    )*};
}
reduce_int!(u8, i32, u32, i64);

macro_rules! reduce_float {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            fn add(a: Self, b: Self) -> Self { a + b }
            fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            fn div(a: Self, n: usize) -> Self { a / (n as $t) }
        }
    )*};
}
reduce_float!(f32, f64);

macro_rules! reduce_half {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            fn add(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() + b.to_f32()) }
            fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
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
    let mut parts = parts.iter();
    let mut acc: Vec<T> = match parts.next() {
        Some(first) => elements(first),
        None => return Vec::new(),
    };
    let f: fn(T, T) -> T = match op {
        ReduceOp::Sum | ReduceOp::Avg => T::add,
        ReduceOp::Max => T::max,
        ReduceOp::Min => T::min,
    };
    let mut ranks = 1;
    for part in parts {
        let x: Vec<T> = elements(part);
        for (a, b) in acc.iter_mut().zip(x) {
            *a = f(*a, b);
        }
        ranks += 1;
    }
    if op == ReduceOp::Avg {
        for a in &mut acc {
            *a = T::div(*a, ranks);
        }
    }
    bytemuck::cast_slice(&acc).to_vec()
}

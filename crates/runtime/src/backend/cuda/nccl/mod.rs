//! Collectives on CUDA devices through NCCL, loaded at run time ([`library`]).
//!
//! An [`NcclComm`] is one rank's NCCL communicator, made in its device's context. A group of
//! calls is issued between `ncclGroupStart` and `ncclGroupEnd` on the stream's `CUstream`, with
//! the device's context bound; the neutral runtime has already ordered the stream after the
//! conflicting accesses to the buffers (see `crate::collective`). NCCL forbids concurrent calls
//! on one communicator, so each communicator's calls hold its lock.
//!
//! Lifetime: a communicator is destroyed (`ncclCommDestroy`, which finalizes it after its
//! outstanding operations) when the last handle goes, unless a capture recorded one of its
//! calls: a graph may replay it at any time, so such a communicator stays for the process's
//! lifetime.

mod library;
mod oneshot;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use self::library::{nccl, Nccl, RawComm, UniqueId, UNIQUE_ID_BYTES};
use self::oneshot::OneShot;
pub(crate) use self::oneshot::AREA_BYTES as ONESHOT_AREA_BYTES;
use super::{CudaDeviceShared, CudaStreamHandle};
use crate::collective::{CallKind, CollectiveCall, CollectiveDtype, ReduceOp};
use crate::error::{DeviceError, Result};
use crate::memory::Memory;

/// The raw communicator, behind the lock that serializes the calls on it.
struct Raw(RawComm);

// SAFETY: an `ncclComm_t` is a handle NCCL lets any thread use, one call at a time; every use
// goes through the `Mutex` in `NcclComm` (or `Drop`, which has `&mut self`).
unsafe impl Send for Raw {}

/// One rank's NCCL communicator.
pub(crate) struct NcclComm {
    raw: Mutex<Raw>,
    shared: Arc<CudaDeviceShared>,
    lib: &'static Nccl,
    /// Whether a capture recorded a call of this communicator (then it is never destroyed).
    captured: AtomicBool,
    /// The one-shot all-reduce state of its group and this communicator's rank in it, where
    /// the group has one (see [`oneshot`]).
    oneshot: OnceLock<(Arc<OneShot>, usize)>,
    /// The stream that the one-shot sums of an eager group run on beside the group's NCCL
    /// calls (see [`NcclComm::enqueue`]), made at the first such group.
    side: OnceLock<CudaStreamHandle>,
    /// The same for groups recorded by captures, one stream each: a stream forked into a
    /// capture stays in it until the capture ends, so it serves no other call; kept, like a
    /// captured communicator.
    captured_sides: Mutex<Vec<CudaStreamHandle>>,
}

fn to_int(what: &str, value: usize) -> Result<c_int> {
    c_int::try_from(value).map_err(|_| {
        DeviceError::usage(format!(
            "{what} {value} is beyond what NCCL can address (i32)"
        ))
    })
}

fn dtype(d: CollectiveDtype) -> c_int {
    match d {
        CollectiveDtype::U8 => 1,
        CollectiveDtype::I32 => 2,
        CollectiveDtype::U32 => 3,
        CollectiveDtype::I64 => 4,
        CollectiveDtype::F16 => 6,
        CollectiveDtype::F32 => 7,
        CollectiveDtype::F64 => 8,
        CollectiveDtype::BF16 => 9,
    }
}

fn red_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
    }
}

impl NcclComm {
    fn wrap(raw: RawComm, shared: Arc<CudaDeviceShared>, lib: &'static Nccl) -> NcclComm {
        NcclComm {
            raw: Mutex::new(Raw(raw)),
            shared,
            lib,
            captured: AtomicBool::new(false),
            oneshot: OnceLock::new(),
            side: OnceLock::new(),
            captured_sides: Mutex::new(Vec::new()),
        }
    }

    /// Rank `rank` of `world_size` of the communicator `unique_id` names, on the device of
    /// `shared`. Blocks until every rank joined.
    pub(crate) fn new(
        shared: &Arc<CudaDeviceShared>,
        unique_id: &[u8],
        rank: usize,
        world_size: usize,
    ) -> Result<NcclComm> {
        if unique_id.len() != UNIQUE_ID_BYTES {
            return Err(DeviceError::usage(format!(
                "an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got {}; pass the bytes of \
                 Comm::nccl_unique_id from one rank to every rank",
                unique_id.len()
            )));
        }
        let lib = nccl()?;
        let mut id = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        for (dst, src) in id.internal.iter_mut().zip(unique_id) {
            *dst = *src as std::ffi::c_char;
        }
        let (world, rank) = (to_int("world size", world_size)?, to_int("rank", rank)?);
        let _bound = shared.bind()?;
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the device's context is current on this
        // thread, so NCCL makes the communicator on this device.
        lib.check("ncclCommInitRank", unsafe {
            (lib.comm_init_rank)(&mut raw, world, id, rank)
        })?;
        Ok(NcclComm::wrap(raw, shared.clone(), lib))
    }

    /// One communicator per device of `shared`, rank `i` on `shared[i]`.
    pub(crate) fn init_all(shared: &[Arc<CudaDeviceShared>]) -> Result<Vec<NcclComm>> {
        let lib = nccl()?;
        let ordinals: Vec<c_int> = shared
            .iter()
            .map(|s| to_int("device ordinal", s.ordinal))
            .collect::<Result<_>>()?;
        let mut raws: Vec<RawComm> = vec![std::ptr::null_mut(); shared.len()];
        let n = to_int("device count", shared.len())?;
        // SAFETY: `raws` has room for `n` communicators and `ordinals` holds `n` device
        // ordinals; NCCL binds each device itself (on its primary context, the one cuflow's
        // devices use).
        lib.check("ncclCommInitAll", unsafe {
            (lib.comm_init_all)(raws.as_mut_ptr(), n, ordinals.as_ptr())
        })?;
        Ok(raws
            .into_iter()
            .zip(shared)
            .map(|(raw, s)| NcclComm::wrap(raw, s.clone(), lib))
            .collect())
    }

    /// Whether one-shot all-reduces are turned on for communicators made from now on
    /// (`CUFLOW_NCCL_ONESHOT` is not `0`).
    pub(crate) fn oneshot_enabled() -> bool {
        OneShot::enabled()
    }

    /// Gives the communicators `comms` of one group (rank `r` is `comms[r]`, all made by
    /// [`NcclComm::init_all`]) the one-shot all-reduce over the zeroed areas `areas` (rank `r`'s
    /// on its device, [`ONESHOT_AREA_BYTES`] each), whose kernels wait for each other up to
    /// `deadline` before they trap, where their devices allow it; returns whether they have it.
    ///
    /// # Errors
    ///
    /// A compile or driver error.
    pub(crate) fn attach_oneshot(
        comms: &[NcclComm],
        areas: Vec<Arc<Memory>>,
        deadline: std::time::Duration,
    ) -> Result<bool> {
        let shared: Vec<Arc<CudaDeviceShared>> = comms.iter().map(|c| c.shared.clone()).collect();
        let Some(state) = OneShot::new(&shared, areas, deadline)? else {
            return Ok(false);
        };
        for (rank, comm) in comms.iter().enumerate() {
            if comm.oneshot.set((state.clone(), rank)).is_err() {
                return Err(DeviceError::internal(
                    "a communicator's one-shot state set twice",
                ));
            }
        }
        Ok(true)
    }

    /// Whether `call` takes the one-shot path: an `f32` sum of at most `oneshot::CAP`
    /// elements, on a communicator whose group has it. It depends only on the call, which
    /// every rank makes alike, never on what else the call's group holds (that differs between
    /// ranks: one groups a sum with a send, another makes the sum alone), so the ranks agree.
    fn takes_oneshot(&self, call: &CollectiveCall<'_>) -> bool {
        self.oneshot.get().is_some()
            && call.kind == CallKind::AllReduce(ReduceOp::Sum)
            && call.dtype == CollectiveDtype::F32
            && call.count <= oneshot::CAP
    }

    /// The buffer a run of `calls` writes besides their receive buffers (this rank's one-shot
    /// area), for the access tracker; `None` when none of them takes the one-shot path.
    pub(crate) fn oneshot_area(&self, calls: &[&CollectiveCall<'_>]) -> Option<&Arc<Memory>> {
        let (state, rank) = self.oneshot.get()?;
        calls
            .iter()
            .any(|c| self.takes_oneshot(c))
            .then(|| state.area(*rank))
    }

    /// The communicator's stream for the one-shot sums of eager groups that also have NCCL
    /// calls, made at the first such group.
    fn eager_side(&self) -> Result<&CudaStreamHandle> {
        if let Some(side) = self.side.get() {
            return Ok(side);
        }
        let (side, _) = CudaStreamHandle::new(&self.shared, None)?;
        Ok(self.side.get_or_init(|| side))
    }

    /// Issues the group `calls` on `stream` (validated, none empty); `capturing` says that
    /// the stream is being captured.
    ///
    /// The calls that take the one-shot path (see [`NcclComm::takes_oneshot`]) run as one
    /// kernel each, in their order. When the group has NCCL calls too, those kernels run on a
    /// side stream forked from `stream` and joined back into it, so that they proceed beside
    /// the NCCL calls as the calls of one NCCL group do: another rank may make the same calls
    /// in another order around them (a send grouped before the sum here, the matching receive
    /// after it there), and neither may wait for the other to finish.
    pub(crate) fn enqueue(
        &self,
        stream: &CudaStreamHandle,
        calls: &[&CollectiveCall<'_>],
        capturing: bool,
    ) -> Result<()> {
        if capturing {
            self.captured.store(true, Ordering::Release);
        }
        let raw = self.raw.lock();
        let Some((state, rank)) = self.oneshot.get() else {
            return self.nccl_group(raw.0, stream, calls);
        };
        let (small, rest): (Vec<&CollectiveCall<'_>>, Vec<&CollectiveCall<'_>>) =
            calls.iter().copied().partition(|c| self.takes_oneshot(c));
        if small.is_empty() {
            return self.nccl_group(raw.0, stream, &rest);
        }
        let run_small = |on: &CudaStreamHandle| -> Result<()> {
            for call in &small {
                state.enqueue(
                    *rank,
                    on,
                    device_ptr(call.send)?,
                    device_ptr(call.recv)?,
                    call.count,
                )?;
            }
            Ok(())
        };
        if rest.is_empty() {
            return run_small(stream);
        }
        let captured_side = if capturing {
            Some(CudaStreamHandle::new(&self.shared, None)?.0)
        } else {
            None
        };
        let side = match &captured_side {
            Some(side) => side,
            None => self.eager_side()?,
        };
        // A side that joins the capture records the capture's events, which must not go back
        // to the pool while its graph lives (see `CapturedEvents`).
        let events = captured_side.as_ref().and(stream.capture_events());
        if let (Some(side), Some(events)) = (&captured_side, &events) {
            side.join_capture(events);
        }
        let forked = stream
            .record_event(false)
            .and_then(|fork| side.wait_event(&fork));
        if let Err(e) = forked {
            if let Some(side) = &captured_side {
                side.leave_capture();
            }
            return Err(e);
        }
        let small_done = run_small(side);
        let rest_done = self.nccl_group(raw.0, stream, &rest);
        // Joined back whatever failed: a capture ends only with its forks joined, and the
        // stream's later work must follow the side's.
        let joined = side
            .record_event(false)
            .and_then(|done| stream.wait_event(&done));
        if let Some(side) = captured_side {
            side.leave_capture();
            self.captured_sides.lock().push(side);
        }
        small_done.and(rest_done).and(joined)
    }

    /// Issues `calls` through NCCL, as one group on `stream`, on the locked communicator
    /// `comm`.
    fn nccl_group(
        &self,
        comm: RawComm,
        stream: &CudaStreamHandle,
        calls: &[&CollectiveCall<'_>],
    ) -> Result<()> {
        let lib = self.lib;
        let s = stream.raw() as *mut c_void;
        let _bound = self.shared.bind()?;
        // SAFETY: the communicator is locked for this group (the caller holds its lock); the
        // context is current.
        lib.check("ncclGroupStart", unsafe { (lib.group_start)() })?;
        let mut issued = Ok(());
        for call in calls {
            let (t, n) = (dtype(call.dtype), call.count);
            let resolved = (|| -> Result<_> {
                let sp = match call.send {
                    Some(_) => device_ptr(call.send)? as *const c_void,
                    None => std::ptr::null(),
                };
                let rp = match call.recv {
                    Some(_) => device_ptr(call.recv)? as *mut c_void,
                    None => std::ptr::null_mut(),
                };
                let other = match call.kind {
                    CallKind::Broadcast { root } => to_int("root", root)?,
                    CallKind::Send { peer } | CallKind::Recv { peer } => to_int("peer", peer)?,
                    _ => 0,
                };
                Ok((sp, rp, other))
            })();
            let (sp, rp, other) = match resolved {
                Ok(r) => r,
                Err(e) => {
                    issued = Err(e);
                    break;
                }
            };
            // SAFETY: the buffers are device memory of this communicator's device holding the
            // lengths `collective` validated for this kind, count and world size (the pointer a
            // kind reads or writes is never the null one); they stay allocated until the work is
            // done (the access tracker recorded them on the stream, so frees wait for it) and,
            // in a capture, as long as the graph (the capture keeps them). The stream is alive
            // (owned by `stream`); the communicator is locked for this group.
            let status = unsafe {
                match call.kind {
                    CallKind::AllReduce(op) => (lib.all_reduce)(sp, rp, n, t, red_op(op), comm, s),
                    CallKind::AllGather => (lib.all_gather)(sp, rp, n, t, comm, s),
                    CallKind::ReduceScatter(op) => {
                        (lib.reduce_scatter)(sp, rp, n, t, red_op(op), comm, s)
                    }
                    CallKind::Broadcast { .. } => (lib.broadcast)(sp, rp, n, t, other, comm, s),
                    CallKind::Send { .. } => (lib.send)(sp, n, t, other, comm, s),
                    CallKind::Recv { .. } => (lib.recv)(rp, n, t, other, comm, s),
                }
            };
            if let Err(e) = lib.check(nccl_call_name(call.kind), status) {
                issued = Err(e);
                break;
            }
        }
        // SAFETY: closes the group opened above, whatever was issued in it.
        let ended = lib.check("ncclGroupEnd", unsafe { (lib.group_end)() });
        issued.and(ended)
    }
}

/// The device address of a call's buffer.
fn device_ptr(r: Option<crate::memory::Region<'_>>) -> Result<u64> {
    match r {
        Some(r) => Ok(r.mem.backend.cuda()?.ptr() + r.offset as u64),
        None => Err(DeviceError::internal(
            "a collective call without its buffer",
        )),
    }
}

fn nccl_call_name(kind: CallKind) -> &'static str {
    match kind {
        CallKind::AllReduce(_) => "ncclAllReduce",
        CallKind::AllGather => "ncclAllGather",
        CallKind::ReduceScatter(_) => "ncclReduceScatter",
        CallKind::Broadcast { .. } => "ncclBroadcast",
        CallKind::Send { .. } => "ncclSend",
        CallKind::Recv { .. } => "ncclRecv",
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.captured.load(Ordering::Acquire) {
            tracing::debug!("an NCCL communicator used in a capture is kept for the process");
            return;
        }
        let comm = self.raw.get_mut().0;
        let Ok(_bound) = self.shared.bind() else {
            tracing::debug!("an NCCL communicator of a reset device is not destroyed");
            return;
        };
        // SAFETY: `&mut self`: no other call uses the communicator; the context is current.
        let status = unsafe { (self.lib.comm_destroy)(comm) };
        if let Err(e) = self.lib.check("ncclCommDestroy", status) {
            tracing::warn!(error = %e, "destroying an NCCL communicator failed");
        }
    }
}

/// A fresh NCCL unique id, as bytes.
pub(crate) fn nccl_unique_id() -> Result<Vec<u8>> {
    let lib = nccl()?;
    let mut id = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    // SAFETY: `id` is a valid out-pointer of the right size.
    lib.check("ncclGetUniqueId", unsafe { (lib.get_unique_id)(&mut id) })?;
    Ok(id.internal.iter().map(|&b| b as u8).collect())
}

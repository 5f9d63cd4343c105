//! Collectives on CUDA devices through NCCL, loaded at run time ([`library`]).
//!
//! An [`NcclComm`] is one rank's NCCL communicator, made in its device's context. A group of
//! calls is issued between `ncclGroupStart` and `ncclGroupEnd` on the stream's `CUstream`, with
//! the device's context bound; the neutral runtime has already ordered the stream after the
//! conflicting accesses to the buffers (see `crate::collective`). NCCL forbids concurrent calls
//! on one communicator, so each communicator's calls hold its lock.
//!
//! Deadline: NCCL's kernels wait for the other ranks without one. Every eager group of NCCL
//! calls is watched ([`watchdog`]): once it has been the communicator's oldest unfinished call
//! for the communicator's timeout, the watchdog reports a [`DeviceError::Timeout`] to the
//! work that enqueued it and aborts this rank's communicator (`ncclCommAbort`), whose kernels
//! then return; every later call of the communicator is refused, saying to make a new one.
//! A communicator that a capture recorded is never aborted (a graph may replay its calls at
//! any time), so its waits keep no deadline.
//!
//! Lifetime: a communicator is destroyed (`ncclCommDestroy`) when the last handle goes, in the
//! thread that drops it, once its calls in flight have finished (waited for there up to the
//! deadline, past which it is aborted instead), unless a capture recorded one of its calls: a
//! graph may replay it at any time, so such a communicator stays for the process's lifetime.
//! An aborted communicator is already freed.

mod library;
mod oneshot;
mod watchdog;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use self::library::{nccl, Nccl, RawComm, UniqueId, UNIQUE_ID_BYTES};
use self::oneshot::OneShot;
pub(crate) use self::oneshot::AREA_BYTES as ONESHOT_AREA_BYTES;
use super::{CudaDeviceShared, CudaStreamHandle};
use crate::collective::{CallKind, CollectiveCall, CollectiveDtype, ReduceOp};
use crate::error::{DeviceError, Result};
use crate::memory::Memory;

/// The raw communicator, behind the lock that serializes the calls on it.
enum Raw {
    Live(RawComm),
    /// Aborted by the watchdog, for the reason given: the handle is freed.
    Aborted(String),
    /// Destroyed when its [`NcclComm`] was dropped.
    Destroyed,
}

// SAFETY: an `ncclComm_t` is a handle NCCL lets any thread use, one call at a time; every use
// goes through the `Mutex` in `Core` (or `Drop`, which has `&mut self`).
unsafe impl Send for Raw {}

/// A communicator's handle and what its watchdog needs, shared by the [`NcclComm`] and, while
/// calls of it are in flight, the watchdog.
struct Core {
    raw: Mutex<Raw>,
    shared: Arc<CudaDeviceShared>,
    lib: &'static Nccl,
    /// Whether a capture recorded a call of this communicator (then it is never destroyed, and
    /// never aborted).
    captured: AtomicBool,
    rank: usize,
    /// How long a call may stay unfinished before the communicator is aborted (see
    /// [`watchdog`] for when its clock starts).
    timeout: Duration,
    /// The eager groups of calls not seen finished yet (see [`watchdog`]).
    flights: Mutex<watchdog::Flights>,
    /// Whether the watchdog holds this communicator.
    watched: AtomicBool,
}

/// One rank's NCCL communicator.
pub(crate) struct NcclComm {
    core: Arc<Core>,
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

impl Core {
    /// Aborts the communicator after a call of it ran past its deadline (`reason`): its
    /// kernels in flight return, and every later call is refused. Returns whether the
    /// communicator is out of use now (aborted, by this call or before); `false` while another
    /// thread's NCCL call holds it (the watchdog tries again) or when a capture recorded one of
    /// its calls (never aborted).
    fn abort(&self, reason: &str) -> bool {
        if self.captured.load(Ordering::Acquire) {
            return false;
        }
        let Some(mut raw) = self.raw.try_lock_for(Duration::from_millis(200)) else {
            return false;
        };
        // Checked again under the lock: a capture sets the flag before it takes the lock.
        if self.captured.load(Ordering::Acquire) {
            return false;
        }
        let Raw::Live(comm) = *raw else {
            return true;
        };
        match self.shared.bind() {
            Ok(_bound) => {
                // SAFETY: the communicator is locked, so no call of it is being issued; it is
                // live (never aborted or destroyed: `Raw::Live`), and no graph can replay its
                // calls (not captured, checked under the lock); the context is current. After
                // this call the handle is never used again (`Raw::Aborted`).
                let status = unsafe { (self.lib.comm_abort)(comm) };
                if let Err(e) = self.lib.check("ncclCommAbort", status) {
                    tracing::warn!(error = %e, "aborting an NCCL communicator failed");
                }
            }
            // The device faulted or was reset: its kernels are gone with its context.
            Err(e) => tracing::debug!(error = %e, "an NCCL communicator of a lost device"),
        }
        *raw = Raw::Aborted(reason.to_string());
        true
    }
}

impl Drop for NcclComm {
    /// Destroys the communicator in the dropping thread, after its calls in flight finished
    /// (or, past the deadline, aborts it): never from the watchdog's thread, which may still
    /// hold the [`Core`] and must not race with the process's exit.
    fn drop(&mut self) {
        self.core.settle();
        if self.core.captured.load(Ordering::Acquire) {
            tracing::debug!("an NCCL communicator used in a capture is kept for the process");
            return;
        }
        let mut raw = self.core.raw.lock();
        let Raw::Live(comm) = *raw else {
            return;
        };
        *raw = Raw::Destroyed;
        let Ok(_bound) = self.core.shared.bind() else {
            tracing::debug!("an NCCL communicator of a reset device is not destroyed");
            return;
        };
        // SAFETY: the communicator is locked and was live; it is marked destroyed, so it is
        // never used again (the watchdog may still hold the `Core`, but finds it not live); no
        // graph replays its calls (not captured); the context is current.
        let status = unsafe { (self.core.lib.comm_destroy)(comm) };
        if let Err(e) = self.core.lib.check("ncclCommDestroy", status) {
            tracing::warn!(error = %e, "destroying an NCCL communicator failed");
        }
    }
}

impl NcclComm {
    fn wrap(
        raw: RawComm,
        shared: Arc<CudaDeviceShared>,
        lib: &'static Nccl,
        rank: usize,
        timeout: Duration,
    ) -> NcclComm {
        NcclComm {
            core: Arc::new(Core {
                raw: Mutex::new(Raw::Live(raw)),
                shared,
                lib,
                captured: AtomicBool::new(false),
                rank,
                timeout,
                flights: Mutex::new(watchdog::Flights::default()),
                watched: AtomicBool::new(false),
            }),
            oneshot: OnceLock::new(),
            side: OnceLock::new(),
            captured_sides: Mutex::new(Vec::new()),
        }
    }

    /// Rank `rank` of `world_size` of the communicator `unique_id` names, on the device of
    /// `shared`, whose calls may stay unfinished for `timeout`. Blocks until every rank joined.
    pub(crate) fn new(
        shared: &Arc<CudaDeviceShared>,
        unique_id: &[u8],
        rank: usize,
        world_size: usize,
        timeout: Duration,
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
        let (world, rank_int) = (to_int("world size", world_size)?, to_int("rank", rank)?);
        let _bound = shared.bind()?;
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the device's context is current on this
        // thread, so NCCL makes the communicator on this device.
        lib.check("ncclCommInitRank", unsafe {
            (lib.comm_init_rank)(&mut raw, world, id, rank_int)
        })?;
        Ok(NcclComm::wrap(raw, shared.clone(), lib, rank, timeout))
    }

    /// One communicator per device of `shared`, rank `i` on `shared[i]`, whose calls may stay
    /// unfinished for `timeout`.
    pub(crate) fn init_all(
        shared: &[Arc<CudaDeviceShared>],
        timeout: Duration,
    ) -> Result<Vec<NcclComm>> {
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
            .enumerate()
            .map(|(rank, (raw, s))| NcclComm::wrap(raw, s.clone(), lib, rank, timeout))
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
        let shared: Vec<Arc<CudaDeviceShared>> =
            comms.iter().map(|c| c.core.shared.clone()).collect();
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
        let (side, _) = CudaStreamHandle::new(&self.core.shared, None)?;
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
        watched: &crate::Stream,
        stream: &CudaStreamHandle,
        calls: &[&CollectiveCall<'_>],
        capturing: bool,
    ) -> Result<()> {
        if capturing {
            self.core.captured.store(true, Ordering::Release);
        }
        let raw = self.core.raw.lock();
        let comm = match &*raw {
            Raw::Live(comm) => *comm,
            Raw::Destroyed => {
                return Err(DeviceError::internal(
                    "a call of a destroyed NCCL communicator",
                ))
            }
            Raw::Aborted(reason) => {
                return Err(DeviceError::Collective {
                    op: CallKind::group_name(calls.iter().map(|c| c.kind)),
                    rank: self.core.rank,
                    reason: format!(
                        "{reason}; this rank's communicator was aborted then, so it takes no \
                         more calls: make a new communicator"
                    ),
                })
            }
        };
        let Some((state, rank)) = self.oneshot.get() else {
            return self.nccl_group(comm, (watched, stream), calls, capturing);
        };
        let (small, rest): (Vec<&CollectiveCall<'_>>, Vec<&CollectiveCall<'_>>) =
            calls.iter().copied().partition(|c| self.takes_oneshot(c));
        if small.is_empty() {
            return self.nccl_group(comm, (watched, stream), &rest, capturing);
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
            Some(CudaStreamHandle::new(&self.core.shared, None)?.0)
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
        let rest_done = self.nccl_group(comm, (watched, stream), &rest, capturing);
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

    /// Issues `calls` through NCCL, as one group on `stream` (the CUDA backend of `watched`,
    /// whose gate the caller holds), on the locked communicator `comm`; outside a capture, the
    /// group is watched (see [`watchdog`]).
    fn nccl_group(
        &self,
        comm: RawComm,
        (watched, stream): (&crate::Stream, &CudaStreamHandle),
        calls: &[&CollectiveCall<'_>],
        capturing: bool,
    ) -> Result<()> {
        if capturing {
            return self.issue_group(comm, stream, calls);
        }
        let sink = stream.error_sink();
        self.issue_group(comm, stream, calls)?;
        watchdog::watch(
            &self.core,
            watched,
            CallKind::group_name(calls.iter().map(|c| c.kind)),
            sink,
        )
    }

    /// Issues `calls` through NCCL, as one group on `stream`, on the locked communicator
    /// `comm`.
    fn issue_group(
        &self,
        comm: RawComm,
        stream: &CudaStreamHandle,
        calls: &[&CollectiveCall<'_>],
    ) -> Result<()> {
        let lib = self.core.lib;
        let s = stream.raw() as *mut c_void;
        let _bound = self.core.shared.bind()?;
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

//! Collective communication between the ranks of a communicator, enqueued on a stream like a
//! kernel.
//!
//! A [`Comm`] is one rank's handle on a group of `world_size` ranks, each on its own device.
//! [`collective`] enqueues a group of [`CollectiveCall`]s (all-reduce, all-gather,
//! reduce-scatter, broadcast, send, recv) on a stream of that device. Like every other access,
//! a call orders itself after the conflicting accesses of other streams ([`crate::access`]): it
//! reads its send buffer and writes its receive buffer. It records the buffers it uses, so frees
//! wait for it and a capture keeps them, and it can be captured into a graph: a replay runs the
//! collective again.
//!
//! Every rank must enqueue the same collectives in the same order (within a group, calls of the
//! same kind in the same order), as with NCCL. A call returns once enqueued; it completes when
//! every rank reached it. The collectives of one communicator must also run in that order: enqueue
//! them on one stream (as `cuflow-dist`'s ops do, on the communicator's stream), or order their
//! streams with events. Two of them running at once on two streams can take each other's
//! messages on the host backend, and can deadlock under NCCL.
//!
//! - **host**: the ranks exchange bytes through a [`HostTransport`] (in one process, or over TCP
//!   across processes: see the `cuflow-dist` crate). The stream's worker thread runs the
//!   exchange; every wait for a peer has a deadline, so a rank that never arrives gives a
//!   [`DeviceError::Timeout`] instead of a hang. A failed exchange (a timeout, a peer gone, a
//!   peer's part of the wrong length) may leave messages behind that a later collective would
//!   take for its own, so it breaks the communicator for good: every later collective of it
//!   fails at once with [`DeviceError::Collective`], saying to make a new communicator, and
//!   the rank tells its peers ([`HostTransport::abort`]), whose collectives with it fail too.
//!   Reductions fold the ranks' contributions in rank order, so every rank gets bit-identical
//!   results.
//! - **cuda**: NCCL, loaded at run time (`$CUFLOW_NCCL_LIB`, the loader's path, or the
//!   `nvidia-nccl` wheels of the Python environments in sight); a missing library is
//!   [`DeviceError::NoNccl`]. NCCL's own kernels wait for the other ranks without a deadline,
//!   so cuflow watches every eager NCCL call: one that has been unfinished for the
//!   communicator's timeout (300 s unless [`Comm::nccl_with_timeout`] or
//!   [`Comm::nccl_local_with_timeout`] gives another) fails with [`DeviceError::Timeout`], and
//!   the rank's communicator is aborted (`ncclCommAbort`) so that its stream moves on; every
//!   later call of it is refused, saying to make a new communicator. A call's clock starts
//!   when it is issued, or when the communicator's call before it finished if that was later:
//!   back-to-back calls do not count each other's time, but other work queued on the stream
//!   ahead of a call counts towards its deadline (keep the timeout above the longest such
//!   wait). Not covered: a
//!   communicator that a capture recorded (a graph may replay its calls, so it is never
//!   aborted: its waits keep no deadline), and a call that NCCL blocks while issuing it
//!   (setting up connections to a peer that never comes). Communicators made together in
//!   one process ([`Comm::nccl_local`]) over devices that can all read each other's memory sum
//!   each `f32` all-reduce of up to 16,384 elements with a one-shot kernel instead (each rank
//!   stages its part, the ranks meet at flags in peer memory, each sums every part in rank
//!   order): one kernel, where NCCL's latency dominates such small sums. Which calls take it
//!   depends on the call alone, not on its group; in a group with other calls, the one-shot
//!   kernels run beside the group's NCCL calls, as the calls of one group do. Such a call also
//!   writes a staging area of the rank's own (about 130 KiB, kept for the process), which the
//!   access tracker orders like any buffer; it is refused once a rank's device faulted or was
//!   reset. Its waits trap the kernel after 300 s (a device fault) instead of hanging, or after
//!   the deadline given to [`Comm::nccl_local_with_timeout`], and so do ranks whose calls
//!   disagree on the element count. `CUFLOW_NCCL_ONESHOT=0` turns it off
//!   for communicators made afterwards.

mod call;
mod dtype;

pub(crate) use call::CallKind;
pub use call::CollectiveCall;
pub use dtype::{CollectiveDtype, CollectiveElem, ReduceOp};

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::access::{ordered, Access, Accesses};
use crate::backend::CommBackend;
use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::stream::Stream;

/// How long a call of a CUDA communicator waits for the other ranks unless told otherwise.
const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// How the host backend's ranks exchange bytes: point-to-point messages between ranks,
/// delivered in order per pair of ranks.
///
/// Implemented by the `cuflow-dist` crate (in one process, and over TCP); the runtime builds
/// every collective on [`send`](HostTransport::send) and [`recv`](HostTransport::recv).
pub trait HostTransport: Send + Sync + fmt::Debug {
    /// This rank's number, in `0..world_size`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// Hands `data`, tagged `tag`, to rank `peer`. Must not wait for `peer` to receive it (the
    /// ranks of one group send before they receive).
    ///
    /// # Errors
    ///
    /// [`DeviceError::Collective`] when `peer` cannot be reached.
    fn send(&self, peer: usize, tag: u64, data: Vec<u8>) -> Result<()>;

    /// The oldest message tagged `tag` from rank `peer`, waiting for it up to the transport's
    /// deadline.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Timeout`] when none arrives in time; [`DeviceError::Collective`] when
    /// `peer` is gone.
    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>>;

    /// Tells every peer that this rank's communicator failed (`reason` says how), once, at its
    /// first failed collective: from then on their receives from this rank fail at once,
    /// instead of taking this rank's messages of the failed collective for a later one's.
    /// Must not wait for the peers. The default tells no one: peers then find out by their
    /// own timeouts, and may take a stale message for a later collective's.
    fn abort(&self, reason: &str) {
        let _ = reason;
    }

    /// Tells every peer that this rank gave up a collective call before sending anything of
    /// it (`reason` says why; see [`Comm::abandon_call`]): what it sent before stands, so their
    /// receives from it fail once the messages it sent before are taken. Must not wait for the
    /// peers. The default is [`abort`](HostTransport::abort), which may also fail the peers'
    /// part of earlier collectives not yet received.
    fn close(&self, reason: &str) {
        self.abort(reason);
    }
}

/// One rank's handle on a communicator, at the runtime level: its device, rank and world size,
/// and the backend that moves the data (a [`HostTransport`] on host devices, an NCCL
/// communicator on CUDA devices). Cheap to clone.
///
/// Most programs build communicators with `cuflow::dist::Communicator` (in one process over
/// several devices, or from the `torchrun` environment) and run collectives as ops.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use cuflow_runtime::{collective, Comm, CollectiveCall, Device, DeviceBuffer, HostTransport};
/// # #[derive(Debug)] struct Alone;
/// # impl HostTransport for Alone {
/// #     fn rank(&self) -> usize { 0 }
/// #     fn world_size(&self) -> usize { 1 }
/// #     fn send(&self, _: usize, _: u64, _: Vec<u8>) -> cuflow_runtime::Result<()> { unreachable!() }
/// #     fn recv(&self, _: usize, _: u64) -> cuflow_runtime::Result<Vec<u8>> { unreachable!() }
/// # }
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let device = Device::host();
/// let comm = Comm::host(&device, Arc::new(Alone))?; // one rank: nothing to exchange
/// let stream = device.new_stream()?;
/// let x = DeviceBuffer::from_host(&stream, &[1.0f32, 2.0])?;
/// let y = DeviceBuffer::<f32>::alloc(&stream, 2)?;
/// collective(&stream, &comm, &[CollectiveCall::all_reduce(x.view(), y.view(), Default::default())])?;
/// assert_eq!(y.to_host_vec(&stream)?, vec![1.0, 2.0]);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Comm {
    inner: Arc<CommInner>,
}

struct CommInner {
    device: Device,
    rank: usize,
    world_size: usize,
    backend: CommBackend,
    /// The first collective call this rank refused before enqueueing it (see
    /// [`Comm::abandon_call`]): every later call is refused.
    abandoned: Mutex<Option<DeviceError>>,
    /// The stream of the last collective enqueued: the collectives of a communicator run in
    /// order, so work enqueued there after it runs after every one of them.
    last_stream: Mutex<Option<Stream>>,
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Comm")
            .field("device", &self.inner.device)
            .field("rank", &self.inner.rank)
            .field("world_size", &self.inner.world_size)
            .finish_non_exhaustive()
    }
}

impl Comm {
    /// A communicator of host device `device` whose data moves through `transport`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] when `device` is not a host device, when the transport's world
    /// is empty or its rank is outside it.
    pub fn host(device: &Device, transport: Arc<dyn HostTransport>) -> Result<Comm> {
        let (rank, world_size) = (transport.rank(), transport.world_size());
        check_rank(rank, world_size)?;
        let backend = CommBackend::host(device, transport)?;
        Ok(Comm::from_parts(device, rank, world_size, backend))
    }

    /// A communicator of CUDA device `device`, as rank `rank` of `world_size`, joining the
    /// NCCL communicator that `unique_id` names (made by [`Comm::nccl_unique_id`] on one rank
    /// and handed to the others). Blocks until every rank joined, as `ncclCommInitRank` does.
    /// A call left unfinished for 300 s fails and aborts the communicator (see the
    /// [module docs](crate::collective)); [`Comm::nccl_with_timeout`] gives another timeout.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] when `device` is not a CUDA device or the rank is outside the
    /// world; [`DeviceError::NoNccl`] when libnccl cannot be loaded; [`DeviceError::Nccl`] when
    /// NCCL refuses.
    pub fn nccl(device: &Device, unique_id: &[u8], rank: usize, world_size: usize) -> Result<Comm> {
        Self::nccl_with_timeout(device, unique_id, rank, world_size, DEFAULT_TIMEOUT)
    }

    /// [`Comm::nccl`] whose calls may stay unfinished for `timeout` (a rank that never makes
    /// its part of a collective, or crashed) before they fail with [`DeviceError::Timeout`] and
    /// the communicator is aborted.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// use std::time::Duration;
    /// use cuflow_runtime::{Comm, Device};
    ///
    /// // One rank alone: its unique id is its own.
    /// let id = Comm::nccl_unique_id()?;
    /// let comm = Comm::nccl_with_timeout(&Device::cuda(0)?, &id, 0, 1, Duration::from_secs(60))?;
    /// assert_eq!(comm.world_size(), 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Comm::nccl`]; [`DeviceError::Usage`] when `timeout` is 0.
    pub fn nccl_with_timeout(
        device: &Device,
        unique_id: &[u8],
        rank: usize,
        world_size: usize,
        timeout: std::time::Duration,
    ) -> Result<Comm> {
        check_rank(rank, world_size)?;
        if timeout.is_zero() {
            return Err(DeviceError::usage(
                "Comm::nccl_with_timeout: a timeout of 0 fails every call at once; give the \
                 ranks time to meet",
            ));
        }
        let backend = CommBackend::nccl(device, unique_id, rank, world_size, timeout)?;
        Ok(Comm::from_parts(device, rank, world_size, backend))
    }

    /// One NCCL communicator per device of `devices` (rank `i` on `devices[i]`), all in this
    /// process (`ncclCommInitAll`).
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] when a device is not a CUDA device; [`DeviceError::NoNccl`] when
    /// libnccl cannot be loaded; [`DeviceError::Nccl`] when NCCL refuses.
    pub fn nccl_local(devices: &[Device]) -> Result<Vec<Comm>> {
        Self::nccl_local_with_timeout(devices, DEFAULT_TIMEOUT)
    }

    /// [`Comm::nccl_local`] whose calls wait for the other ranks up to `timeout` instead of
    /// 300 s: a one-shot all-reduce (a small `f32` sum between devices that read each other's
    /// memory) then traps its kernel (a device fault), and an NCCL call fails with
    /// [`DeviceError::Timeout`] and aborts the rank's communicator (see the
    /// [module docs](crate::collective)).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// use std::time::Duration;
    /// use cuflow_runtime::{Comm, Device};
    ///
    /// let devices = [Device::cuda(0)?, Device::cuda(1)?];
    /// let comms = Comm::nccl_local_with_timeout(&devices, Duration::from_secs(30))?;
    /// assert_eq!(comms.len(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Comm::nccl_local`]; [`DeviceError::Usage`] when `timeout` is 0.
    pub fn nccl_local_with_timeout(
        devices: &[Device],
        timeout: std::time::Duration,
    ) -> Result<Vec<Comm>> {
        if timeout.is_zero() {
            return Err(DeviceError::usage(
                "Comm::nccl_local_with_timeout: a timeout of 0 traps every one-shot all-reduce \
                 at once; give the ranks time to meet",
            ));
        }
        let backends = CommBackend::nccl_local(devices, timeout)?;
        let world_size = backends.len();
        Ok(backends
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (backend, device))| Comm::from_parts(device, rank, world_size, backend))
            .collect())
    }

    /// A fresh NCCL unique id (`ncclGetUniqueId`): the bytes one rank makes and every rank
    /// passes to [`Comm::nccl`].
    ///
    /// # Errors
    ///
    /// [`DeviceError::NoNccl`] when libnccl cannot be loaded; [`DeviceError::Nccl`] when the
    /// call fails.
    pub fn nccl_unique_id() -> Result<Vec<u8>> {
        CommBackend::nccl_unique_id()
    }

    fn from_parts(device: &Device, rank: usize, world_size: usize, backend: CommBackend) -> Comm {
        Comm {
            inner: Arc::new(CommInner {
                device: device.clone(),
                rank,
                world_size,
                backend,
                abandoned: Mutex::new(None),
                last_stream: Mutex::new(None),
            }),
        }
    }

    /// Breaks this rank's communicator after a collective call (`op`, e.g. `all_reduce`) that
    /// this rank gave up before enqueueing it (`why` says why: a bad argument, an input that
    /// failed), which its peers may have enqueued: every later collective of this rank is
    /// refused at once, saying to make a new communicator, instead of pairing with the peers'
    /// call of the one given up and handing both sides each other's data. On the host backend
    /// the peers are told once the collectives this rank enqueued before have run
    /// ([`HostTransport::close`]), so that theirs of the call given up fail at once, and theirs
    /// of the earlier ones are not touched; under NCCL, a peer waits for the call given up as
    /// it would for a rank that never arrives, until its communicator's timeout. [`collective`]
    /// calls it for the calls it
    /// does not enqueue; crates that build collectives and give one up before calling it
    /// (`cuflow-dist`'s ops) call it themselves.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cuflow_runtime::{collective, Comm, CollectiveCall, Device, DeviceBuffer, DeviceError, HostTransport};
    /// # #[derive(Debug)] struct Alone;
    /// # impl HostTransport for Alone {
    /// #     fn rank(&self) -> usize { 0 }
    /// #     fn world_size(&self) -> usize { 1 }
    /// #     fn send(&self, _: usize, _: u64, _: Vec<u8>) -> cuflow_runtime::Result<()> { unreachable!() }
    /// #     fn recv(&self, _: usize, _: u64) -> cuflow_runtime::Result<Vec<u8>> { unreachable!() }
    /// # }
    /// # fn main() -> Result<(), DeviceError> {
    /// let device = Device::host();
    /// let comm = Comm::host(&device, Arc::new(Alone))?;
    /// let stream = device.new_stream()?;
    /// comm.abandon_call("all_reduce", &DeviceError::usage("its input failed"));
    /// let x = DeviceBuffer::from_host(&stream, &[1.0f32])?;
    /// let call = CollectiveCall::all_reduce(x.view(), x.view(), Default::default());
    /// let e = collective(&stream, &comm, &[call]).unwrap_err();
    /// assert!(e.to_string().contains("make a new communicator"));
    /// # Ok(()) }
    /// ```
    pub fn abandon_call(&self, op: &'static str, why: &DeviceError) {
        {
            let mut abandoned = self.inner.abandoned.lock();
            if abandoned.is_some() {
                return;
            }
            *abandoned = Some(why.clone());
        }
        let last = self.inner.last_stream.lock().clone();
        self.inner
            .backend
            .abandon(last.as_ref(), op, self.inner.rank, why);
    }

    /// This rank's number, in `0..world_size`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.inner.world_size
    }

    /// The device this rank's buffers live on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }
}

fn check_rank(rank: usize, world_size: usize) -> Result<()> {
    if world_size == 0 || rank >= world_size {
        return Err(DeviceError::usage(format!(
            "a communicator needs a rank in 0..world_size; got rank {rank} of world size \
             {world_size}"
        )));
    }
    Ok(())
}

/// Enqueues the collectives `calls` on `stream` as one group (NCCL's `ncclGroupStart` /
/// `ncclGroupEnd`): each reads its send buffer and writes its receive buffer, ordered after the
/// conflicting accesses of other streams. Every rank of `comm` must enqueue matching calls.
/// Does not wait; the stream's later work sees the results.
///
/// # Errors
///
/// [`DeviceError::Collective`] once this rank gave up an earlier call (see
/// [`Comm::abandon_call`], which every refusal below also makes);
/// [`DeviceError::DeviceMismatch`] when `stream` or a buffer is not of `comm`'s device;
/// [`DeviceError::InvalidShape`] when a buffer's length does not fit its call and the world
/// size; [`DeviceError::InvalidArgument`] for a peer or root outside the world, a send or recv
/// to this rank itself, or buffers that overlap where they must not; on CUDA,
/// [`DeviceError::Nccl`] when NCCL refuses the calls. Failures of the exchange itself (a
/// timeout, a peer gone, ranks calling different collectives) come back from the stream's next
/// synchronization, as for kernels.
pub fn collective(stream: &Stream, comm: &Comm, calls: &[CollectiveCall<'_>]) -> Result<()> {
    let name = CallKind::group_name(calls.iter().map(|c| c.kind));
    if let Some(first) = &*comm.inner.abandoned.lock() {
        return Err(DeviceError::Collective {
            op: name,
            rank: comm.rank(),
            reason: format!(
                "this rank gave up an earlier collective call before enqueueing it ({first}), \
                 which left it out of step with its peers; make a new communicator"
            ),
        });
    }
    let checked = (|| {
        if stream.device() != comm.device() {
            return Err(DeviceError::device_mismatch(
                "collective",
                "the stream",
                comm.device(),
                stream.device(),
            ));
        }
        for call in calls {
            call.validate(stream, comm.rank(), comm.world_size())?;
        }
        call::check_overlaps(calls)
    })();
    if let Err(e) = checked {
        comm.abandon_call(name, &e);
        return Err(e);
    }
    let keep_empty = comm.inner.backend.keeps_empty_calls();
    let calls: SmallVec<[&CollectiveCall<'_>; 4]> = calls
        .iter()
        .filter(|c| keep_empty || !c.is_empty())
        .collect();
    if calls.is_empty() {
        return Ok(());
    }
    let mut accesses: Accesses<'_> = SmallVec::new();
    for call in calls.iter().filter(|c| !c.is_empty()) {
        if let Some(send) = call.send {
            accesses.push((send.mem, Access::Read));
        }
        if let Some(recv) = call.recv {
            accesses.push((recv.mem, Access::Write));
        }
    }
    if let Some(area) = comm.inner.backend.extra_write(&calls) {
        accesses.push((area, Access::Write));
    }
    let name = CallKind::group_name(calls.iter().map(|c| c.kind));
    let enqueued = ordered(stream, name, accesses, || {
        // Under the capture gate `ordered` holds: whether this very call is captured.
        let capturing = stream.is_capturing();
        stream
            .backend()
            .collective(stream, &comm.inner.backend, comm.rank(), &calls, capturing)?;
        *comm.inner.last_stream.lock() = Some(stream.clone());
        Ok(())
    });
    if let Err(e) = &enqueued {
        // Not enqueued (refused by the ordering, the capture gate or the backend), or
        // enqueued with its bookkeeping failed: either way the rank may be out of step.
        comm.abandon_call(name, e);
    }
    enqueued
}

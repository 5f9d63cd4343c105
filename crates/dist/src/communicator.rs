//! [`Communicator`]: one rank of a group of devices that run collectives together.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cuflow_device_op::DeviceOpExt;
use cuflow_runtime::{BackendKind, Comm, Device, DeviceError, HostTransport, Stream};
use cuflow_tensor::api;

use crate::config::{default_timeout, DistConfig};
use crate::local::LocalTransport;
use crate::rendezvous::rendezvous;
use crate::tcp::TcpTransport;

/// One rank of a group of devices that run collectives together: its device, its rank and the
/// world size, and the stream its collectives run on.
///
/// Every collective of a communicator runs on that one stream, in the order the program
/// enqueues them, so that every rank issues them in the same order (as NCCL requires); it is
/// ordered against the work on other streams that uses the same buffers like every other
/// access. Cheap to clone; clones are the same rank.
///
/// Build one with [`Communicator::local`] (several devices of this process),
/// [`Communicator::from_env`] (one rank per process, under `torchrun` or Slurm), or
/// [`Communicator::connect`]. Every rank of a group must use the same backend: host devices
/// exchange data through the host backend's transports (in one process, or over TCP), CUDA
/// devices through NCCL.
///
/// # Examples
///
/// ```
/// use cuflow_dist::{all_reduce, Communicator, ReduceOp};
/// use cuflow_runtime::Device;
/// use cuflow_tensor::{api, Tensor};
/// use cuflow_device_op::DeviceOpExt;
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let devices = [Device::host_numbered(0), Device::host_numbered(1)];
/// let comms = Communicator::local(&devices)?;
/// // Each rank runs its part on its own thread; the all-reduce meets in the middle.
/// let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
///     let handles: Vec<_> = comms
///         .iter()
///         .map(|comm| {
///             s.spawn(move || -> Result<Vec<f32>, cuflow_runtime::DeviceError> {
///                 let rank = comm.rank() as f32;
///                 let x = api::from_slice(&[rank, 10.0 * rank], &[2]).sync_on(comm.stream())?;
///                 all_reduce(comm, x, ReduceOp::Sum).sync_on(comm.stream())?.to_host_vec()
///             })
///         })
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()
/// })?;
/// assert_eq!(sums, vec![vec![1.0, 10.0]; 2]);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Communicator {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    comm: Comm,
    stream: Stream,
    /// The ranks' channel through the host, beside the device's collectives (see
    /// [`Communicator::gather_words`]); `None` for ranks of several processes.
    host: Option<HostChannel>,
}

/// A channel between the ranks of one process through the host, with the communicator's
/// deadline on every wait for a peer.
#[derive(Debug)]
struct HostChannel {
    transport: Box<dyn HostTransport>,
    /// Gathers made so far: the tag of the next one's messages.
    gathers: AtomicU64,
}

impl HostChannel {
    fn new(transport: impl HostTransport + 'static) -> HostChannel {
        HostChannel {
            transport: Box::new(transport),
            gathers: AtomicU64::new(0),
        }
    }

    /// Every rank's `words`, in rank order. A failure tells the peers (their gathers with this
    /// rank fail at once from then on), since the ranks' gathers are out of step after it.
    fn gather(&self, words: &[u32]) -> Result<Vec<u32>, DeviceError> {
        let result = self.exchange(words);
        if let Err(e) = &result {
            self.transport.abort(&e.to_string());
        }
        result
    }

    fn exchange(&self, words: &[u32]) -> Result<Vec<u32>, DeviceError> {
        let (rank, world) = (self.transport.rank(), self.transport.world_size());
        let tag = self.gathers.fetch_add(1, Ordering::Relaxed);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        for peer in (0..world).filter(|&p| p != rank) {
            self.transport.send(peer, tag, bytes.clone())?;
        }
        let mut all = Vec::with_capacity(words.len().saturating_mul(world));
        for peer in 0..world {
            if peer == rank {
                all.extend_from_slice(words);
                continue;
            }
            let got = self.transport.recv(peer, tag)?;
            if got.len() != bytes.len() {
                return Err(DeviceError::usage(format!(
                    "rank {peer} gave {} words to Communicator::gather_words where rank {rank} \
                     gave {}: every rank gives as many",
                    got.len() / 4,
                    words.len()
                )));
            }
            all.extend(
                got.chunks_exact(4)
                    .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            );
        }
        Ok(all)
    }
}

impl Communicator {
    fn from_comm(comm: Comm, host: Option<HostChannel>) -> Result<Communicator, DeviceError> {
        let stream = comm.device().new_stream()?;
        Ok(Communicator {
            inner: Arc::new(Inner { comm, stream, host }),
        })
    }

    /// One communicator per device of `devices`, rank `i` on `devices[i]`, all in this
    /// process; waits for peers up to [`default_timeout`](crate::default_timeout).
    ///
    /// Host devices exchange through shared memory; their ranks progress independently (each
    /// stream has its own worker thread), so the program must enqueue every rank's
    /// collectives before it waits on any of them. A rank whose communicator is gone (every
    /// clone, pending collective and captured graph of it dropped) fails its peers'
    /// collectives with it at once. CUDA devices get an NCCL communicator each
    /// (`ncclCommInitAll`); enqueue each rank's collectives from its own thread there, since
    /// NCCL may hold an enqueueing thread until the other ranks of the process have enqueued
    /// theirs (the host backend needs no such care).
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] when `devices` is empty, mixes backends or names a device twice,
    /// or the timeout is 0;
    /// on CUDA, [`DeviceError::NoNccl`] when libnccl cannot be loaded and [`DeviceError::Nccl`]
    /// when NCCL refuses.
    pub fn local(devices: &[Device]) -> Result<Vec<Communicator>, DeviceError> {
        Self::local_with_timeout(devices, default_timeout())
    }

    /// [`Communicator::local`] with another deadline for every wait for a peer (host devices;
    /// on CUDA devices, the one-shot sums' waits, see [`all_reduce`](crate::all_reduce)); one
    /// past what the clock can represent (`Duration::MAX`) waits as long as it takes.
    ///
    /// # Errors
    ///
    /// As [`Communicator::local`].
    pub fn local_with_timeout(
        devices: &[Device],
        timeout: Duration,
    ) -> Result<Vec<Communicator>, DeviceError> {
        let Some(first) = devices.first() else {
            return Err(DeviceError::usage(
                "Communicator::local needs at least one device",
            ));
        };
        check_timeout(timeout)?;
        for (i, d) in devices.iter().enumerate() {
            if d.kind() != first.kind() {
                return Err(DeviceError::usage(format!(
                    "Communicator::local got {first} and {d}: every rank of a group must be of \
                     one backend"
                )));
            }
            if devices[..i].contains(d) {
                return Err(DeviceError::usage(format!(
                    "Communicator::local got {d} twice: give each rank its own device"
                )));
            }
        }
        let comms = match first.kind() {
            BackendKind::Cuda => Comm::nccl_local_with_timeout(devices, timeout)?,
            _ => LocalTransport::group(devices.len(), timeout)
                .into_iter()
                .zip(devices)
                .map(|(t, d)| Comm::host(d, Arc::new(t)))
                .collect::<Result<Vec<_>, _>>()?,
        };
        // A group of transports of its own for the host channel: its messages never meet
        // the host backend's collectives.
        let channels = LocalTransport::group(devices.len(), timeout);
        comms
            .into_iter()
            .zip(channels)
            .map(|(comm, channel)| Communicator::from_comm(comm, Some(HostChannel::new(channel))))
            .collect()
    }

    /// This process's rank of a multi-process group, on `device`, placed by the environment
    /// (see [`DistConfig::from_env`]): rank 0 listens at `MASTER_ADDR:MASTER_PORT`, the others
    /// connect to it.
    ///
    /// # Errors
    ///
    /// As [`DistConfig::from_env`] and [`Communicator::connect`].
    pub fn from_env(device: &Device) -> Result<Communicator, DeviceError> {
        Self::connect(device, &DistConfig::from_env()?)
    }

    /// Rank `config.rank` of a multi-process group, on `device`, after a TCP rendezvous with
    /// the other ranks (rank 0 binds `config.master_addr()`). On CUDA devices rank 0 makes the
    /// NCCL unique id and hands it to the others; on host devices the ranks connect into a
    /// mesh that carries the collectives' data. Blocks until every rank arrived.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for a rank outside the world, a world of more than `u32::MAX`
    /// ranks or a timeout of 0;
    /// [`DeviceError::Timeout`] when a rank does not arrive within `config.timeout`;
    /// [`DeviceError::Collective`] when the ranks disagree (world size, a rank taken twice) or
    /// a connection fails; on CUDA, the errors of NCCL as for [`Communicator::local`].
    pub fn connect(device: &Device, config: &DistConfig) -> Result<Communicator, DeviceError> {
        Self::connect_inner(device, config, None)
    }

    /// Rank 0 of a multi-process group, listening on `listener` (already bound, e.g. to port 0
    /// for an ephemeral port to hand to the other ranks) instead of binding the master address.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] when `config.rank` is not 0; otherwise as
    /// [`Communicator::connect`].
    pub fn serve(
        device: &Device,
        config: &DistConfig,
        listener: TcpListener,
    ) -> Result<Communicator, DeviceError> {
        if config.rank != 0 {
            return Err(DeviceError::usage(format!(
                "Communicator::serve is for rank 0; rank {} uses Communicator::connect",
                config.rank
            )));
        }
        Self::connect_inner(device, config, Some(listener))
    }

    fn connect_inner(
        device: &Device,
        config: &DistConfig,
        listener: Option<TcpListener>,
    ) -> Result<Communicator, DeviceError> {
        check_timeout(config.timeout)?;
        if config.world_size == 0 || config.rank >= config.world_size {
            return Err(DeviceError::usage(format!(
                "rank {} is outside a world of {} ranks",
                config.rank, config.world_size
            )));
        }
        if u32::try_from(config.world_size).is_err() {
            return Err(DeviceError::usage(format!(
                "a world of {} ranks is more than the rendezvous counts (at most {}); check \
                 WORLD_SIZE",
                config.world_size,
                u32::MAX
            )));
        }
        let comm = match device.kind() {
            BackendKind::Cuda => {
                let id = if config.rank == 0 {
                    Comm::nccl_unique_id()?
                } else {
                    Vec::new()
                };
                let links = rendezvous(config, listener, &id, false)?;
                Comm::nccl_with_timeout(
                    device,
                    &links.payload,
                    config.rank,
                    config.world_size,
                    config.timeout,
                )?
            }
            _ => {
                let links = rendezvous(config, listener, &[], true)?;
                let transport = TcpTransport::new(config.rank, links.peers, config.timeout)?;
                Comm::host(device, Arc::new(transport))?
            }
        };
        Communicator::from_comm(comm, None)
    }

    /// This rank's number, in `0..world_size`.
    pub fn rank(&self) -> usize {
        self.inner.comm.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.inner.comm.world_size()
    }

    /// The device this rank's tensors live on.
    pub fn device(&self) -> &Device {
        self.inner.comm.device()
    }

    /// The stream this rank's collectives run on.
    pub fn stream(&self) -> &Stream {
        &self.inner.stream
    }

    /// The runtime-level communicator (for [`cuflow_runtime::collective`] on raw buffers).
    pub fn comm(&self) -> &Comm {
        &self.inner.comm
    }

    /// Every rank's `words`, concatenated in rank order, gathered through the host and
    /// returned to this thread: for ranks to agree on what they are about to do before they
    /// enqueue collectives, so that a rank that does something else, or nothing, fails the
    /// others' calls instead of leaving their collectives waiting for it.
    ///
    /// Every rank calls it with as many words, at the same point of its sequence of gathers
    /// (like collectives, from one thread per rank or in an order the program fixes). Ranks
    /// of one process ([`Communicator::local`]) exchange through the host's memory, waiting
    /// for a peer up to the communicator's deadline, whatever the backend: a rank that does
    /// not come in time fails the others' gathers with [`DeviceError::Timeout`], without
    /// touching a device. Ranks of several processes gather with an [`all_gather`](crate::all_gather)
    /// on their devices instead, bounded by the deadline on both backends (on CUDA, by the
    /// NCCL communicator's, which aborts it).
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_dist::Communicator;
    /// use cuflow_runtime::Device;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let comms = Communicator::local(&[Device::host_numbered(0), Device::host_numbered(1)])?;
    /// let gathered = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms
    ///         .iter()
    ///         .map(|c| s.spawn(move || c.gather_words(&[c.rank() as u32, 7])))
    ///         .collect();
    ///     ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(gathered, vec![vec![0, 7, 1, 7]; 2]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`DeviceError::Timeout`] when a peer does not gather in time, after which every later
    /// gather of this communicator fails at once (the ranks are out of step: make a new
    /// communicator); [`DeviceError::Collective`] when a peer's communicator is gone or its
    /// gather failed; [`DeviceError::Usage`] when ranks give different numbers of words; on
    /// the devices' path, the all-gather's errors.
    pub fn gather_words(&self, words: &[u32]) -> Result<Vec<u32>, DeviceError> {
        match &self.inner.host {
            Some(channel) => channel.gather(words),
            None => crate::all_gather(self, api::from_vec(words.to_vec(), &[words.len()]))
                .sync_on(self.stream())
                .and_then(|t| t.to_host_vec()),
        }
    }
}

/// A deadline of 0 would fail every wait for a peer at once.
fn check_timeout(timeout: Duration) -> Result<(), DeviceError> {
    if timeout.is_zero() {
        return Err(DeviceError::usage(
            "a timeout of 0 fails every wait for a peer; give the ranks time to meet (seconds \
             or more)",
        ));
    }
    Ok(())
}

//! [`Communicator`]: one rank of a group of devices that run collectives together.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use cuflow_runtime::{BackendKind, Comm, Device, DeviceError, Stream};

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
}

impl Communicator {
    fn from_comm(comm: Comm) -> Result<Communicator, DeviceError> {
        let stream = comm.device().new_stream()?;
        Ok(Communicator {
            inner: Arc::new(Inner { comm, stream }),
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
        comms.into_iter().map(Communicator::from_comm).collect()
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
                Comm::nccl(device, &links.payload, config.rank, config.world_size)?
            }
            _ => {
                let links = rendezvous(config, listener, &[], true)?;
                let transport = TcpTransport::new(config.rank, links.peers, config.timeout)?;
                Comm::host(device, Arc::new(transport))?
            }
        };
        Communicator::from_comm(comm)
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

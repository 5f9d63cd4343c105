//! Collectives as device ops: all-reduce, all-gather, reduce-scatter, broadcast, send / recv
//! and grouped calls between the ranks of a [`Communicator`].
//!
//! A communicator spans several devices of one process ([`Communicator::local`]) or one device
//! per process across processes and machines ([`Communicator::from_env`], driven by the
//! `RANK` / `WORLD_SIZE` / `LOCAL_RANK` / `MASTER_ADDR` / `MASTER_PORT` variables that
//! `torchrun` and Slurm set). CUDA devices exchange through NCCL, loaded at run time (rank 0
//! of a multi-process group hands its unique id to the others through the rendezvous); host
//! devices through the host backend, in one process or over TCP, so that the semantics and the
//! rendezvous run anywhere.
//!
//! The collectives ([`all_reduce`], [`all_reduce_in_place`], [`all_gather`], [`reduce_scatter`], [`broadcast`], [`send`],
//! [`recv`], [`group`]) are device ops: they compose with `then` / `zip!`, order themselves
//! after the work that wrote their inputs and before the work that reads their outputs, on any
//! stream, and can be captured into a graph (a replay runs the collective again).
//!
//! No wait of cuflow's is unbounded: the rendezvous, [`Communicator::gather_words`] between
//! the ranks of one process (on any backend) and, on the host backend, every wait for a peer
//! give a
//! [`DeviceError::Timeout`](cuflow_runtime::DeviceError::Timeout) after
//! [`DistConfig::timeout`] (`CUFLOW_DIST_TIMEOUT_MS`, 300 s by default); a peer whose
//! connection broke is an error at once. On the host backend, ranks that call a collective
//! with different arguments (another reduction, root, element type or length) fail at once
//! with a [`DeviceError::Collective`](cuflow_runtime::DeviceError::Collective) naming both
//! calls; ranks that call collectives of different kinds time out. A failed exchange leaves the ranks out of step, so
//! on the host backend every later collective of that communicator fails at once, saying so:
//! make a new communicator. The failing rank tells its peers, whose collectives with it fail
//! at once too (never taking its part of the failed collective for a later one's). On CUDA
//! devices, an NCCL call left unfinished for that long fails with a
//! [`DeviceError::Timeout`](cuflow_runtime::DeviceError::Timeout) and the rank's communicator
//! is aborted, so that its stream moves on; later calls of it are refused (see
//! [`cuflow_runtime::collective`] for what this does not cover: communicators a graph
//! recorded).
//!
//! **One group of ranks at a time on the same GPUs.** NCCL's kernels, and the one-shot sums'
//! (see [`all_reduce`]), wait on the GPU for the other ranks of their group, and a call that
//! synchronizes a device (another communicator's setup, the first launch of a kernel, which
//! loads it) can wait for them in turn. Two groups whose collectives run at once on the same
//! GPUs, from different threads, can therefore deadlock, as NCCL's documentation warns: seen
//! here with four groups of two ranks on two GPUs, where a one-shot sum waited out its deadline
//! and NCCL's calls after it never returned, in 2 of 7 runs. Run one group at a time,
//! or give each group GPUs of its own.
//!
//! ```
//! use cuflow_dist::{all_gather, Communicator};
//! use cuflow_device_op::DeviceOpExt;
//! use cuflow_runtime::Device;
//! use cuflow_tensor::api;
//! # fn main() -> Result<(), cuflow_runtime::DeviceError> {
//! let devices: Vec<Device> = (0..4).map(Device::host_numbered).collect();
//! let comms = Communicator::local(&devices)?;
//! let gathered = std::thread::scope(|s| {
//!     let ranks: Vec<_> = comms.iter().map(|c| s.spawn(move || {
//!         let mine = api::full::<f32>(&[1, 2], c.rank() as f32).sync_on(c.stream())?;
//!         all_gather(c, mine).sync_on(c.stream())?.to_host_vec()
//!     })).collect();
//!     ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<Vec<_>, _>>()
//! })?;
//! assert!(gathered.iter().all(|g| g == &[0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]));
//! # Ok::<(), cuflow_runtime::DeviceError>(()) }
//! ```

#![forbid(unsafe_code)]

mod communicator;
mod config;
mod local;
mod mailbox;
mod ops;
mod rendezvous;
mod tcp;

pub use communicator::Communicator;
pub use config::{default_timeout, DistConfig};
pub use ops::{
    all_gather, all_reduce, all_reduce_in_place, broadcast, group, recv, reduce_scatter, send,
    CollectiveOp, CollectiveType, GroupCall, ReduceOp,
};

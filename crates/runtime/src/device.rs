//! Devices: the process-wide handle to one CUDA GPU or to the CPU host backend.
//!
//! A [`Device`] is cheap to clone (an `Arc`), `Send + Sync`, and unique per physical device in
//! the process: `Device::cuda(0)` returns the same device every time, so per-device state such
//! as the default scheduling policy, the kernel cache and the memory counters is shared by every
//! thread. Devices live for the whole process once opened.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::backend::{self, DeviceBackend, Retired, SyncWait};
use crate::error::{BackendKind, DeviceError, Result};
use crate::pool::PoolCounters;
use crate::stream::Stream;

/// A process-unique identifier of a [`Device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(pub(crate) u64);

impl DeviceId {
    /// The raw number.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

/// Launch limits of a device; launches are checked against them before they reach the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceLimits {
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most threads along each block dimension.
    pub max_block_dim: [u32; 3],
    /// Most blocks along each grid dimension.
    pub max_grid_dim: [u32; 3],
    /// Shared memory a block may use without opting in.
    pub max_shared_mem_per_block: u32,
    /// Shared memory a block may use after opting in (launches above the default opt in).
    pub max_shared_mem_per_block_optin: u32,
    /// Number of multiprocessors (host: worker threads available).
    pub multiprocessor_count: u32,
    /// Threads per warp.
    pub warp_size: u32,
}

impl DeviceLimits {
    /// The limits the host backend enforces: those of a CUDA device of compute capability 9.0,
    /// so that a launch that is valid on host is valid on a GPU too.
    pub(crate) fn host_default() -> Self {
        DeviceLimits {
            max_threads_per_block: 1024,
            max_block_dim: [1024, 1024, 64],
            max_grid_dim: [i32::MAX as u32, 65535, 65535],
            max_shared_mem_per_block: 48 * 1024,
            max_shared_mem_per_block_optin: 227 * 1024,
            multiprocessor_count: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
            warp_size: 32,
        }
    }
}

/// Free and total memory of a device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryInfo {
    /// Bytes free on the device (host: as reported by the system, or `total` if unknown).
    pub free: usize,
    /// Bytes the device has in all.
    pub total: usize,
}

pub(crate) struct DeviceInner {
    pub(crate) id: DeviceId,
    pub(crate) name: String,
    pub(crate) limits: DeviceLimits,
    pub(crate) backend: DeviceBackend,
    /// Bytes in live cuflow buffers on this device.
    pub(crate) bytes_in_use: AtomicUsize,
    /// The high-water mark of `bytes_in_use`, and the pool's release threshold as set.
    pub(crate) pool: PoolCounters,
    /// The device's streams, for `Device::synchronize`.
    pub(crate) streams: Mutex<Vec<std::sync::Weak<crate::stream::StreamInner>>>,
    /// What is left of the streams dropped with their work unfinished or their failure
    /// unreported, for `Device::synchronize`.
    pub(crate) retired: Mutex<RetiredStreams>,
    /// Held by the `Device::synchronize` waiting for `retired`'s work.
    pub(crate) retired_drain: Mutex<()>,
    /// The stream on which staged copies out of this device read its memory, created at the
    /// first such copy (see `DeviceBuffer::copy_from_device_staged`).
    pub(crate) staging_stream: Mutex<Option<Stream>>,
    /// Extension slots for crates above the runtime (e.g. the default scheduling policy).
    /// Each type's slot (a `OnceLock<Arc<T>>`), made at its first request; the lock is held
    /// only to find a slot, never while a value is made.
    pub(crate) extensions: Mutex<HashMap<std::any::TypeId, Arc<dyn std::any::Any + Send + Sync>>>,
}

/// What is left of a device's dropped streams (see [`Device::retire`]).
#[derive(Default)]
pub(crate) struct RetiredStreams {
    /// Synchronizations of their unfinished work.
    pending: Vec<SyncWait>,
    /// The first failure of their finished work that nothing reported.
    failed: Option<DeviceError>,
}

/// One CUDA GPU or the CPU host backend.
///
/// # Examples
///
/// ```
/// use cuflow_runtime::Device;
/// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
/// let device = Device::host();
/// let stream = device.new_stream()?;
/// stream.synchronize()?;
/// assert_eq!(device.kind(), cuflow_runtime::BackendKind::Host);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

fn next_device_id() -> DeviceId {
    DeviceId(NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed))
}

fn cuda_registry() -> &'static Mutex<HashMap<usize, Device>> {
    static REG: OnceLock<Mutex<HashMap<usize, Device>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Device {
    /// The CPU host backend (one per process); the same device as `Device::host_numbered(0)`.
    pub fn host() -> Device {
        static HOST: OnceLock<Device> = OnceLock::new();
        HOST.get_or_init(|| Device::new_host(0)).clone()
    }

    /// Host device number `index`: `0` is [`Device::host`], and every other index is a further
    /// device of the host backend, distinct from the others (its own streams, memory
    /// accounting, default policy), created on first use and the same device every time after.
    ///
    /// All host devices are run by CPU threads and share the machine's memory; they exist so
    /// that multi-device programs (copies between devices, [`DeviceError::DeviceMismatch`]
    /// checks, policies spreading work over several devices) can run and be tested where no
    /// GPU is present.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::Device;
    /// let (a, b) = (Device::host(), Device::host_numbered(1));
    /// assert_ne!(a, b);
    /// assert_eq!(Device::host_numbered(0), a);
    /// assert_eq!(b.to_string(), "host:1");
    /// ```
    pub fn host_numbered(index: usize) -> Device {
        if index == 0 {
            return Device::host();
        }
        static REG: OnceLock<Mutex<HashMap<usize, Device>>> = OnceLock::new();
        REG.get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .entry(index)
            .or_insert_with(|| Device::new_host(index))
            .clone()
    }

    fn new_host(index: usize) -> Device {
        let limits = DeviceLimits::host_default();
        let label = match index {
            0 => "host".to_string(),
            n => format!("host:{n}"),
        };
        Device {
            inner: Arc::new(DeviceInner {
                id: next_device_id(),
                name: format!("{label} ({} threads)", limits.multiprocessor_count),
                limits,
                backend: DeviceBackend::host(index),
                bytes_in_use: AtomicUsize::new(0),
                pool: PoolCounters::new(),
                streams: Mutex::new(Vec::new()),
                retired: Mutex::new(RetiredStreams::default()),
                retired_drain: Mutex::new(()),
                staging_stream: Mutex::new(None),
                extensions: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// CUDA device `ordinal` (one [`Device`] per ordinal per process).
    ///
    /// # Errors
    ///
    /// [`DeviceError::NoDriver`] when libcuda cannot be loaded, [`DeviceError::NoDevice`] when
    /// there is no such ordinal, [`DeviceError::Driver`] when the driver refuses the context.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        let mut reg = cuda_registry().lock();
        if let Some(d) = reg.get(&ordinal) {
            return Ok(d.clone());
        }
        let device = Device::open_cuda(ordinal)?;
        reg.insert(ordinal, device.clone());
        Ok(device)
    }

    fn open_cuda(ordinal: usize) -> Result<Device> {
        let (backend, name, limits) = DeviceBackend::open_cuda(ordinal)?;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                id: next_device_id(),
                name,
                limits,
                backend,
                bytes_in_use: AtomicUsize::new(0),
                pool: PoolCounters::new(),
                streams: Mutex::new(Vec::new()),
                retired: Mutex::new(RetiredStreams::default()),
                retired_drain: Mutex::new(()),
                staging_stream: Mutex::new(None),
                extensions: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// How many CUDA devices are visible (0 when there is no driver).
    pub fn cuda_count() -> usize {
        backend::cuda_device_count().unwrap_or(0)
    }

    /// The device named by `$CUFLOW_DEVICE` (`host`, `cuda` or `cuda:N`); when it is unset, CUDA
    /// device 0 if it is usable, else the host backend (said once on stderr).
    ///
    /// # Errors
    ///
    /// When `$CUFLOW_DEVICE` asks for a CUDA device that cannot be had, that error is returned:
    /// there is no silent fallback to the host. An unknown value is
    /// [`DeviceError::BadDeviceSelector`].
    pub fn auto() -> Result<Device> {
        match std::env::var("CUFLOW_DEVICE") {
            Ok(value) => Self::from_selector(&value),
            Err(_) => match Device::cuda(0) {
                Ok(d) => Ok(d),
                Err(e) => {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| {
                        // The fallback is part of the contract of `auto` ("said once on
                        // stderr"): it is logged, and printed only when the program installed
                        // no `tracing` subscriber that would show it.
                        tracing::warn!("no usable CUDA device ({e}); using the host backend");
                        if !tracing::dispatcher::has_been_set() {
                            eprintln!("cuflow: no usable CUDA device ({e}); using the host backend")
                        }
                    });
                    Ok(Device::host())
                }
            },
        }
    }

    /// Parses a device selector as `$CUFLOW_DEVICE` does: `host`, `host:N` (host device `N`,
    /// [`Device::host_numbered`]), `cuda` or `cuda:N`; `cpu` and `gpu` are accepted for
    /// `host` and `cuda`. A device's [`Display`](fmt::Display) form (`host:1`) parses back to
    /// that device.
    ///
    /// # Errors
    ///
    /// [`DeviceError::BadDeviceSelector`] for anything else, or the error of opening the device.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::Device;
    /// let second = Device::host_numbered(1);
    /// assert_eq!(Device::from_selector(&second.to_string())?, second);
    /// assert_eq!(Device::from_selector("host")?, Device::host());
    /// assert!(Device::from_selector("host:one").is_err());
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn from_selector(value: &str) -> Result<Device> {
        let v = value.trim();
        let numbered = |prefix: &str| v.strip_prefix(prefix).map(str::parse::<usize>);
        match v {
            "host" | "cpu" => Ok(Device::host()),
            "cuda" | "gpu" => Device::cuda(0),
            _ => match (numbered("cuda:"), numbered("host:")) {
                (Some(Ok(n)), _) => Device::cuda(n),
                (_, Some(Ok(n))) => Ok(Device::host_numbered(n)),
                _ => Err(DeviceError::BadDeviceSelector {
                    value: value.to_string(),
                }),
            },
        }
    }

    /// The process-unique id of this device.
    pub fn id(&self) -> DeviceId {
        self.inner.id
    }

    /// A human-readable name, e.g. `NVIDIA H100 80GB HBM3` or `host (16 threads)`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Which backend runs this device.
    pub fn kind(&self) -> BackendKind {
        self.inner.backend.kind()
    }

    /// Whether this device reads `peer`'s memory directly, so that
    /// [`DeviceBuffer::copy_from_device`](crate::DeviceBuffer::copy_from_device) into a buffer
    /// of this device from one of `peer` is a peer copy (over NVLink or PCIe) rather than
    /// staged through pinned host memory.
    ///
    /// The same device, and two host devices (one address space), give `true`; a host and a
    /// CUDA device give `false`. For two CUDA devices it is the driver's answer
    /// (`cuDeviceCanAccessPeer`); the access itself is enabled at the first copy that uses it.
    ///
    /// # Errors
    ///
    /// A driver error if the query fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::Device;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// assert!(Device::host().can_access_peer(&Device::host_numbered(1))?);
    /// # Ok(()) }
    /// ```
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        if self.same(peer) {
            return Ok(true);
        }
        self.inner.backend.can_access_peer(&peer.inner.backend)
    }

    /// Whether the device faulted: a kernel trapped, accessed memory out of bounds or hit
    /// another fault the CUDA context cannot survive, or this handle belongs to the device's
    /// state before a [`Device::recover`]. Every call on a faulted device fails at once with
    /// [`DeviceError::DeviceFaulted`]. Host devices never fault: the failure of host work is
    /// an error of the op that enqueued it.
    pub fn is_faulted(&self) -> bool {
        self.inner.backend.is_faulted()
    }

    /// Brings a faulted device back: resets its CUDA context and returns the device to use
    /// from now on (also what [`Device::cuda`] and [`Device::auto`] return afterwards).
    /// A device that is not faulted is returned as it is.
    ///
    /// Whether a process may use a device again after a fault is the driver's decision. Some
    /// drivers refuse every new context on that device for the rest of the process (the
    /// CUDA 13.0 driver 580 does, after a trapped kernel): `recover` then fails with
    /// [`DeviceError::DeviceFaulted`] saying so, and the service has to restart the process
    /// (e.g. run its GPU work in a worker process that a supervisor restarts).
    ///
    /// A fault ends the context's state: every stream, event, buffer, graph and kernel made on
    /// it is gone. Their handles stay safe to hold and drop, but every use of them fails with
    /// [`DeviceError::DeviceFaulted`]; make them again from the returned device. The futures of
    /// work that was in flight resolve with that error too. Waits for the driver calls other
    /// threads are making on the old state (they fail fast once the device faulted), and for
    /// the copies enqueued on other devices' streams that read the device's memory (copies
    /// between devices through peer access): the reset frees that memory.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] while page-locked buffers ([`PinnedBuffer`](crate::PinnedBuffer))
    /// of the device are alive (their memory goes away with the context: drop them first),
    /// when another thread keeps the device busy for more than a few seconds, or while a copy
    /// enqueued on another device's stream still reads the device's memory after a few
    /// seconds (synchronize that device's streams, or end what holds them, and recover
    /// again: the device is left as it was); the driver's
    /// error when the reset fails; [`DeviceError::DeviceFaulted`] when the driver does not let
    /// the process use the device again.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::Device;
    /// let device = Device::host();
    /// // After an error, a long-running service checks and, if needed, recovers its device.
    /// let device = if device.is_faulted() { device.recover()? } else { device };
    /// assert!(!device.is_faulted());
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn recover(&self) -> Result<Device> {
        let Some(ordinal) = self.inner.backend.ordinal() else {
            return Ok(self.clone());
        };
        {
            let mut reg = cuda_registry().lock();
            if let Some(current) = reg.get(&ordinal) {
                if !current.same(self) && !current.is_faulted() {
                    // Recovered already (by another handle or thread).
                    return Ok(current.clone());
                }
            }
            if !self.is_faulted() {
                return Ok(self.clone());
            }
            self.inner.backend.reset()?;
            // Until a new context opens, `Device::cuda` keeps giving the faulted device.
            let device = Device::open_cuda(ordinal).map_err(|e| DeviceError::DeviceFaulted {
                device: format!("cuda:{ordinal}"),
                cause: format!(
                    "the context was reset, but the driver does not let this process use the \
                     device again ({e}); restart the process to use it"
                ),
            })?;
            reg.insert(ordinal, device.clone());
            for other in reg.values() {
                other.inner.backend.forget_peer(ordinal);
            }
            Ok(device)
        }
    }

    /// The CUDA ordinal, or `None` for the host.
    pub fn ordinal(&self) -> Option<usize> {
        self.inner.backend.ordinal()
    }

    /// The compute capability `(major, minor)`, or `None` for the host.
    pub fn compute_capability(&self) -> Option<(u32, u32)> {
        self.inner.backend.compute_capability()
    }

    /// The launch limits of this device.
    pub fn limits(&self) -> &DeviceLimits {
        &self.inner.limits
    }

    /// Free and total device memory.
    ///
    /// # Errors
    ///
    /// A driver error if the query fails.
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        self.inner.backend.memory_info()
    }

    /// Bytes held by cuflow buffers on this device. A dropped buffer leaves this count when
    /// its stream-ordered free is enqueued (CUDA), or when the last queued work using it has run
    /// (host): after synchronizing, dropped buffers are no longer counted.
    pub fn bytes_in_use(&self) -> usize {
        self.inner.bytes_in_use.load(Ordering::Acquire)
    }

    /// The number of this device's streams alive now: held by a handle, by the default
    /// policy's pool, or by a buffer whose last use on the stream may still be running (a
    /// buffer forgets the idle streams that used it once it remembers a few: see
    /// [`Stream`]). A count that only grows in a program making streams as it goes means
    /// something holds on to them.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::Device;
    /// let device = Device::host_numbered(5);
    /// let before = device.stream_count();
    /// let stream = device.new_stream()?;
    /// assert_eq!(device.stream_count(), before + 1);
    /// drop(stream);
    /// assert_eq!(device.stream_count(), before);
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn stream_count(&self) -> usize {
        self.inner
            .streams
            .lock()
            .iter()
            .filter(|s| s.strong_count() > 0)
            .count()
    }

    /// Creates a new in-order stream.
    ///
    /// # Errors
    ///
    /// A driver error if the stream cannot be created.
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self, None, false)
    }

    /// Creates a new stream with a scheduling priority; lower numbers are higher priority, and
    /// [`Device::stream_priority_range`] gives the valid range (values outside it are clamped).
    ///
    /// # Errors
    ///
    /// A driver error if the stream cannot be created.
    pub fn new_stream_with_priority(&self, priority: i32) -> Result<Stream> {
        Stream::new(self, Some(priority), false)
    }

    /// Creates a stream for captures, with a scheduling priority as
    /// [`Device::new_stream_with_priority`]: a stream that may begin a capture at any moment,
    /// which [`DeviceBuffer::last_stream`](crate::DeviceBuffer::last_stream) therefore never
    /// picks, so that an eager read-back on another thread never lands on it while it records
    /// (and is refused). Otherwise an ordinary stream.
    ///
    /// # Errors
    ///
    /// A driver error if the stream cannot be created.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{Device, DeviceBuffer};
    ///
    /// let device = Device::host();
    /// let captures = device.new_stream_for_captures(0)?;
    /// let x = DeviceBuffer::from_host(&captures, &[1.0f32, 2.0])?;
    /// assert!(captures.is_for_captures());
    /// assert!(x.last_stream().is_none());
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn new_stream_for_captures(&self, priority: i32) -> Result<Stream> {
        Stream::new(self, Some(priority), true)
    }

    /// The valid stream priorities as `(least, greatest)`; greatest is numerically lowest.
    ///
    /// # Errors
    ///
    /// A driver error if the query fails.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.inner.backend.priority_range()
    }

    /// Waits until all work on all of this device's streams has finished, the work of streams
    /// whose handles were all dropped included (dropping a stream neither cancels its work nor
    /// loses its failure). Streams being captured are skipped (their work is recorded, not
    /// run).
    ///
    /// # Errors
    ///
    /// The first error any of the device's streams hit: of a dropped stream, an error nothing
    /// else reported, given once. [`DeviceError::Reentrant`] inside a host function or a
    /// host kernel, where the wait would wait for itself.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    ///
    /// let device = cuflow_runtime::Device::host();
    /// let stream = device.new_stream()?;
    /// let ran = Arc::new(AtomicBool::new(false));
    /// let flag = ran.clone();
    /// stream.enqueue_host_fn(move || flag.store(true, Ordering::SeqCst))?;
    /// drop(stream);
    /// device.synchronize()?;
    /// assert!(ran.load(Ordering::SeqCst));
    /// # Ok::<(), cuflow_runtime::DeviceError>(())
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        if crate::in_host_function() {
            return Err(DeviceError::Reentrant {
                what: "Device::synchronize inside a host kernel or host function",
            });
        }
        // One caller at a time waits for the dropped streams' work, and the others wait for it
        // to finish (each returns only once that work has run; its failure goes to one).
        let _draining = self.inner.retired_drain.lock();
        let live: Vec<Stream> = {
            let mut list = self.inner.streams.lock();
            list.retain(|w| w.strong_count() > 0);
            list.iter()
                .filter_map(|w| w.upgrade())
                .map(|inner| Stream { inner })
                .collect()
        };
        // After the live streams are held: a stream dropped before then was retired already,
        // and one dropped later is held here until this returns.
        let retired = std::mem::take(&mut *self.inner.retired.lock());
        let mut first = Ok(());
        for s in &live {
            let r = s.synchronize_unless_capturing();
            if first.is_ok() {
                first = r;
            }
        }
        for wait in retired.pending {
            let r = wait.wait();
            if first.is_ok() {
                first = r;
            }
        }
        match (first, retired.failed) {
            (Ok(()), Some(e)) => Err(e),
            (first, _) => first,
        }
    }

    /// Keeps what is left of a stream whose last handle was dropped for the next
    /// [`Device::synchronize`], and forgets what finished of the streams kept before (keeping
    /// the first failure among them): the list holds only unfinished work. Never blocks, and
    /// may be called with locks of the runtime held.
    pub(crate) fn retire(&self, left: Retired) {
        let mut retired = self.inner.retired.lock();
        let RetiredStreams { pending, failed } = &mut *retired;
        let mut i = 0;
        while i < pending.len() {
            if !pending[i].is_done() {
                i += 1;
                continue;
            }
            if let Err(e) = pending.swap_remove(i).done_result() {
                failed.get_or_insert(e);
            }
        }
        match left {
            Retired::Pending(wait) => pending.push(wait),
            Retired::Failed(e) => {
                failed.get_or_insert(e);
            }
        }
    }

    /// Returns the extension value of type `T` stored on this device, creating it with `init`
    /// the first time. Crates above the runtime keep per-device, process-wide state here.
    ///
    /// `init` may ask for extensions of other types (of this device or another): it runs
    /// while no lock of the device is held. Threads asking for a `T` at once while it is made
    /// wait for that `init`, which runs once; it must not ask for a `T` itself.
    pub fn extension<T: Send + Sync + 'static>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        let slot = {
            let mut map = self.inner.extensions.lock();
            let slot = map
                .entry(std::any::TypeId::of::<T>())
                .or_insert_with(|| Arc::new(OnceLock::<Arc<T>>::new()));
            Arc::clone(slot)
        };
        match slot.downcast::<OnceLock<Arc<T>>>() {
            Ok(cell) => Arc::clone(cell.get_or_init(|| Arc::new(init()))),
            // The map is keyed by TypeId, so the entry always holds a slot of T.
            Err(_) => unreachable!("extension map keyed by TypeId holds another type"),
        }
    }

    pub(crate) fn backend(&self) -> &DeviceBackend {
        &self.inner.backend
    }

    /// The device's staging stream (see the `staging_stream` field), created on first use.
    pub(crate) fn staging_stream(&self) -> Result<Stream> {
        let mut slot = self.inner.staging_stream.lock();
        if let Some(s) = &*slot {
            return Ok(s.clone());
        }
        let s = self.new_stream()?;
        *slot = Some(s.clone());
        Ok(s)
    }

    pub(crate) fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.same(other)
    }
}

impl Eq for Device {}

impl std::hash::Hash for Device {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.id.hash(state)
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.inner.id.0)
            .field("kind", &self.kind())
            .field("name", &self.inner.name)
            .finish()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.ordinal(), self.inner.backend.host_index()) {
            (Some(n), _) => write!(f, "cuda:{n} ({})", self.inner.name),
            (None, Some(i)) if i > 0 => write!(f, "host:{i}"),
            (None, _) => f.write_str("host"),
        }
    }
}

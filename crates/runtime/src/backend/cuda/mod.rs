//! The CUDA backend, on cudarc's driver and NVRTC bindings (loaded at run time).
//!
//! Layering follows cudarc's: raw calls return `Result` (cudarc's `result`/`sys` layers), and the
//! handles here wrap them safely for the backend-neutral runtime. All of cuflow's `unsafe`
//! lives in this folder.
//!
//! Invariants the `// SAFETY:` comments rely on:
//! - **Context**: every handle holds an `Arc<CudaContext>` of its device's primary context, so
//!   the context outlives every stream, event, module, allocation and graph made in it; each
//!   raw call is preceded by binding that context to the calling thread.
//! - **Ordering**: cudarc's per-buffer event tracking is off; cuflow orders work itself
//!   (streams, events, and the use lists of `Memory`), and frees are stream-ordered after the
//!   last use of an allocation. Work of another device's stream that reads this device's
//!   memory (a peer copy) is noted on this device (`foreign`), and a reset waits for it
//!   before it frees that memory.
//! - **Handles**: raw handles (`CUevent`, `CUgraph`, `CUgraphExec`, device pointers, pinned host
//!   pointers) are owned by exactly one wrapper, which destroys them once, in `Drop`.
//! - **Presence**: nothing here touches libcuda before `is_culib_present()` said it can be
//!   loaded (cudarc panics otherwise), nor libnvrtc before its own presence check. libcublas is
//!   loaded by `blas` itself, which reports a missing library as an error.

mod blas;
mod capture;
mod dylib;
mod foreign;
mod host_copy;
mod kernel;
mod memory;
mod nccl;
mod peer;
mod pool;
mod stream;
mod tools;

pub(crate) use blas::BlasWorkspace;
pub(crate) use capture::{CapturedEvents, CudaGraphExecHandle, CudaGraphHandle};
pub(crate) use kernel::CompiledKernel;
use memory::HostStaging;
pub(crate) use memory::{CudaMemory, CudaPinned};
pub(crate) use nccl::{nccl_unique_id, NcclComm, ONESHOT_AREA_BYTES};
pub(crate) use peer::copy_staged;
pub(crate) use stream::{
    CudaCopyToHost, CudaEventHandle, CudaStreamHandle, CudaSyncWait, StagedUpload,
};
pub(crate) use tools::{at_exit, nvtx_end, nvtx_start};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;

use cudarc::driver::{result, sys, CudaContext, DriverError};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::backend::memory::DeferredFree;
use crate::device::{DeviceLimits, MemoryInfo};
use crate::error::{DeviceError, Result};
use crate::kernel::SourceLayout;

/// Converts a driver error into a [`DeviceError::Driver`] naming the call; a fault the context
/// cannot survive marks the device bound on this thread faulted and is
/// [`DeviceError::DeviceFaulted`].
pub(crate) fn driver_err(call: &'static str, e: DriverError) -> DeviceError {
    let error = plain_driver_err(call, &e);
    match BOUND_ORDINAL.with(|b| b.get()) {
        Some(ordinal) if is_fatal(e.0) => faults().mark(ordinal, error.to_string()),
        _ => error,
    }
}

fn plain_driver_err(call: &'static str, e: &DriverError) -> DeviceError {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let message = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    DeviceError::Driver {
        call,
        code: e.0 as i32,
        name,
        message,
        source: *e,
    }
}

/// Whether a driver error leaves the context unusable: every later call of the context
/// returns it again until the context is reset.
fn is_fatal(code: sys::cudaError_enum) -> bool {
    use sys::cudaError_enum as E;
    matches!(
        code,
        E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_LAUNCH_FAILED
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_MISALIGNED_ADDRESS
            | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | E::CUDA_ERROR_INVALID_PC
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ASSERT
            | E::CUDA_ERROR_LAUNCH_TIMEOUT
            | E::CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

thread_local! {
    /// The ordinal of the device whose context this thread bound last (see
    /// [`CudaDeviceShared::bind`]): the device a fatal driver error belongs to.
    static BOUND_ORDINAL: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    /// Whether this thread is running a user's host function: the driver's thread for them,
    /// where the driver refuses every call (see [`HostFnScope`]).
    static IN_HOST_FN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is running a host function (see [`HostFnScope`]).
pub(crate) fn in_host_function() -> bool {
    IN_HOST_FN.with(|f| f.get())
}

/// [`DeviceError::Reentrant`] inside a host function, checked where an operation that reaches
/// the device begins, before it takes any lock of the runtime: another thread may hold that
/// lock while its own driver call waits (loading a module waits for the device's work in
/// flight, the host function included), so taking it there could deadlock.
pub(crate) fn refuse_in_host_function() -> Result<()> {
    if in_host_function() {
        return Err(refused_in_host_function());
    }
    Ok(())
}

/// Marks this thread as running a host function until dropped. Meanwhile
/// [`CudaDeviceShared::bind`], which every driver call of this backend goes through, refuses
/// with [`DeviceError::Reentrant`] without calling the driver: the driver would answer
/// `CUDA_ERROR_NOT_PERMITTED`, which tells the caller neither what went wrong nor what to do.
pub(super) struct HostFnScope(());

impl HostFnScope {
    pub(super) fn enter() -> HostFnScope {
        IN_HOST_FN.with(|f| f.set(true));
        HostFnScope(())
    }
}

impl Drop for HostFnScope {
    fn drop(&mut self) {
        IN_HOST_FN.with(|f| f.set(false));
    }
}

/// The refusal of a driver call made inside a host function.
#[cold]
#[inline(never)]
fn refused_in_host_function() -> DeviceError {
    DeviceError::Reentrant {
        what: "a call into the CUDA device (a launch, copy, event, wait or allocation) inside \
               a host function, whose thread the driver refuses",
    }
}

/// The faulted devices of the process, by ordinal, with the first fault seen. A fault belongs
/// to the device's primary context, which every handle of that device shares.
struct Faults {
    any: AtomicBool,
    by_ordinal: Mutex<HashMap<usize, String>>,
}

fn faults() -> &'static Faults {
    static FAULTS: OnceLock<Faults> = OnceLock::new();
    FAULTS.get_or_init(|| Faults {
        any: AtomicBool::new(false),
        by_ordinal: Mutex::new(HashMap::new()),
    })
}

impl Faults {
    /// Records the fault of device `ordinal` (the first one is kept) and returns its error.
    fn mark(&self, ordinal: usize, cause: String) -> DeviceError {
        let cause = self
            .by_ordinal
            .lock()
            .entry(ordinal)
            .or_insert_with(|| {
                tracing::error!("device cuda:{ordinal} faulted: {cause}");
                cause
            })
            .clone();
        self.any.store(true, Ordering::Release);
        faulted(ordinal, cause)
    }

    fn get(&self, ordinal: usize) -> Option<String> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.by_ordinal.lock().get(&ordinal).cloned()
    }

    fn clear(&self, ordinal: usize) {
        let mut map = self.by_ordinal.lock();
        map.remove(&ordinal);
        self.any.store(!map.is_empty(), Ordering::Release);
    }
}

fn faulted(ordinal: usize, cause: String) -> DeviceError {
    DeviceError::DeviceFaulted {
        device: format!("cuda:{ordinal}"),
        cause,
    }
}

/// How long a reset waits for other threads' calls on the device, and then for other devices'
/// copies still reading its memory, before it is refused.
const FOREIGN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The lifetime of one state of a device's primary context, from its creation to the reset
/// that [`CudaDevice::reset`] makes after a fault.
///
/// Every driver call on the state's handles runs under a read lock of `gate` (taken by
/// [`CudaDeviceShared::bind`], or by [`Life::release`] for the calls that free resources);
/// the reset takes it for writing and marks the state retired first. So no call on a handle
/// of the old state reaches the driver after the reset, where the handle's value could name
/// a resource of the new state: such calls fail with [`DeviceError::DeviceFaulted`], and
/// releases are skipped (the reset freed everything).
pub(crate) struct Life {
    ordinal: usize,
    gate: RwLock<()>,
    retired: AtomicBool,
    /// Page-locked buffers handed to users: their host memory goes away with a reset, so a
    /// reset is refused while any is alive.
    user_pinned: AtomicUsize,
}

impl Life {
    fn new(ordinal: usize) -> Arc<Life> {
        Arc::new(Life {
            ordinal,
            gate: RwLock::new(()),
            retired: AtomicBool::new(false),
            user_pinned: AtomicUsize::new(0),
        })
    }

    /// `DeviceFaulted` once the device faulted or this state was reset.
    pub(crate) fn check(&self) -> Result<()> {
        if self.retired.load(Ordering::Acquire) {
            return Err(faulted(
                self.ordinal,
                "this handle was made before Device::recover reset the device; \
                 make it again from the recovered device"
                    .into(),
            ));
        }
        match faults().get(self.ordinal) {
            Some(cause) => Err(faulted(self.ordinal, cause)),
            None => Ok(()),
        }
    }

    /// Runs `free` (driver calls that release a resource of this state) unless the state was
    /// reset, which released it already. Returns whether it ran.
    pub(crate) fn release(&self, free: impl FnOnce()) -> bool {
        let _gate = self.gate.read_recursive();
        if self.retired.load(Ordering::Acquire) {
            return false;
        }
        free();
        true
    }

    pub(crate) fn pinned_created(&self) {
        self.user_pinned.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn pinned_dropped(&self) {
        self.user_pinned.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Proof that the device's context is bound on this thread and that its state stays alive
/// (no reset) while the proof is held.
#[must_use = "driver calls must be made while the binding is held"]
pub(crate) struct Bound<'a> {
    _gate: RwLockReadGuard<'a, ()>,
}

fn driver_state() -> &'static std::result::Result<(), DeviceError> {
    static STATE: OnceLock<std::result::Result<(), DeviceError>> = OnceLock::new();
    STATE.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to dlopen the candidate library names; it
        // touches no CUDA state.
        if !unsafe { sys::is_culib_present() } {
            return Err(DeviceError::NoDriver {
                reason: "libcuda.so could not be loaded".into(),
            });
        }
        match result::init() {
            Ok(()) => Ok(()),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => {
                Err(DeviceError::NoDevice {
                    ordinal: 0,
                    count: 0,
                })
            }
            Err(e) => Err(DeviceError::NoDriver {
                reason: format!("cuInit failed: {}", plain_driver_err("cuInit", &e)),
            }),
        }
    })
}

fn ensure_driver() -> Result<()> {
    driver_state().clone()
}

/// Number of CUDA devices.
pub(crate) fn device_count() -> Result<usize> {
    ensure_driver()?;
    let n = result::device::get_count().map_err(|e| driver_err("cuDeviceGetCount", e))?;
    Ok(n.max(0) as usize)
}

/// A raw event handle, owned by the device's pool or by one [`CudaEventHandle`].
pub(crate) struct RawEvent(pub(crate) sys::CUevent);

// SAFETY: a CUevent is a driver handle usable from any thread of the process once its context
// is bound; ownership is unique (Handles invariant), so moving it between threads is sound.
unsafe impl Send for RawEvent {}
// SAFETY: the driver's event calls are thread-safe; shared access only reads the handle value.
unsafe impl Sync for RawEvent {}

/// Device state shared by every stream, event, allocation and kernel of one CUDA device.
pub(crate) struct CudaDeviceShared {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) ordinal: usize,
    /// The lifetime of this state of the context (see [`Life`]).
    pub(crate) life: Arc<Life>,
    pub(crate) cc: (u32, u32),
    event_pool: Mutex<Vec<RawEvent>>,
    /// Every kernel loaded on this device, by (name, source, options). Modules stay loaded
    /// while the device lives: a captured graph keeps the functions it launches, and a
    /// `Kernel` declared again with the same source reuses the compiled module. A slot is
    /// filled once (see [`CudaDevice::compile`]).
    modules: Mutex<HashMap<ModuleKey, ModuleSlot>>,
    /// Idle cuBLAS handles of this device; a GEMM takes one for the length of its call.
    blas_handles: Mutex<Vec<blas::RawBlasHandle>>,
    /// Whether a cuBLAS handle was ever created here (then captures reserve GEMM workspaces).
    blas_ready: AtomicBool,
    /// A stream that never captures, on which allocations requested during a capture are made
    /// (see [`CudaMemory::alloc_outside_capture`]). Created at the first such allocation.
    alloc_stream: Mutex<Option<Arc<cudarc::driver::CudaStream>>>,
    /// Peer devices (by ordinal) whose memory this context was set up to read directly:
    /// `true` once access is enabled, `false` where the driver does not allow it.
    peers: Mutex<HashMap<usize, bool>>,
    /// The page-locked buffers that staged copies into this device go through, allocated at
    /// the first such copy (see `peer`).
    staging: Mutex<Option<peer::StagingRing>>,
    /// The page-locked buffers that read-backs from this device and copies into it are
    /// staged through (see `CudaCopyToHost` and `StagedUpload`), and the bytes of all of them.
    host_staging: Mutex<StagingPool>,
    /// Staging buffers of copies into this device that may still be in flight, each copy's
    /// with an event recorded after it: taken back into `host_staging` once the event
    /// completed (looked at whenever a staging buffer is taken), waited for when the state is
    /// dropped.
    uploads_in_flight: Mutex<Vec<(RawEvent, Vec<HostStaging>)>>,
    /// What a host function dropped last and the driver must release (device memory, pinned
    /// memory, streams, graphs, timed events), where the driver refuses every call: released
    /// by the next synchronization with this device made outside one (see
    /// [`CudaDeviceShared::release_host_fn_drops`]).
    host_fn_drops: Mutex<Vec<HostFnDrop>>,
    /// Held by the thread releasing `host_fn_drops` until it has enqueued the frees of the
    /// device memory among them, so that a synchronization which finds the list emptied by
    /// another thread still returns only after those frees are enqueued. Host functions never
    /// take it (they only push to the list).
    host_fn_release: Mutex<()>,
    /// Work of other devices' streams that reads this device's memory (peer copies), which a
    /// reset waits for (see `foreign`).
    foreign: Mutex<foreign::ForeignUses>,
}

/// A release held back from a host function (see `CudaDeviceShared::host_fn_drops`).
pub(crate) enum HostFnDrop {
    /// Device memory, freed in stream order after its uses.
    Memory(DeferredFree),
    /// A handle whose own drop makes the driver calls.
    Handle(Box<dyn Send>),
}

/// What identifies a compiled kernel on one device.
type ModuleKey = (String, String, Vec<String>);

/// A kernel's module on one device: empty while the first thread to need it compiles it, then
/// the compiled kernel or the error (an error is removed from the map once handed out).
type ModuleSlot = Arc<OnceLock<Result<Arc<CompiledKernel>>>>;

impl CudaDeviceShared {
    /// Keeps `drop` for the next synchronization with this device: a host function dropped it
    /// last, and its release needs the driver, which refuses calls there.
    pub(crate) fn defer_host_fn_drop(&self, drop: HostFnDrop) {
        self.host_fn_drops.lock().push(drop);
    }

    /// [`CudaDeviceShared::defer_host_fn_drop`] for a handle whose own drop makes the driver
    /// calls.
    pub(crate) fn defer_host_fn_handle(&self, handle: impl Send + 'static) {
        self.defer_host_fn_drop(HostFnDrop::Handle(Box::new(handle)));
    }

    /// Releases what host functions dropped since the last call (see
    /// [`CudaDeviceShared::defer_host_fn_drop`]). Called after a synchronization has waited,
    /// with no lock of the runtime held; does nothing inside a host function.
    ///
    /// Another thread's synchronization may have taken a drop this thread waited for: the
    /// release lock makes this call return only once that thread has enqueued the frees of the
    /// device memory it took (stream-ordered frees, which never wait for the device), so the
    /// caller's next wait on the stream that used the memory also waits for its free. The
    /// other handles are dropped after the lock is let go: dropping page-locked memory waits
    /// for the device, and so for host functions in flight, which must never wait for a
    /// thread that holds the lock.
    pub(crate) fn release_host_fn_drops(&self) {
        if in_host_function() {
            return;
        }
        let releasing = self.host_fn_release.lock();
        let drops = std::mem::take(&mut *self.host_fn_drops.lock());
        let mut handles = Vec::new();
        for d in drops {
            match d {
                HostFnDrop::Memory(free) => free.release(),
                HostFnDrop::Handle(handle) => handles.push(handle),
            }
        }
        drop(releasing);
        drop(handles);
    }

    /// The kernel compiled and loaded for this device: from the device's module cache, else
    /// compiled now and kept for the device's lifetime.
    ///
    /// `layout` (what the check against the source establishes, see [`SourceLayout`]) is a
    /// function of the name and source, which key the cache, so every kernel sharing a
    /// module shares it.
    pub(crate) fn compile(
        self: &Arc<Self>,
        name: &str,
        source: &str,
        options: &[String],
        layout: &SourceLayout,
    ) -> Result<Arc<CompiledKernel>> {
        let key: ModuleKey = (name.to_owned(), source.to_owned(), options.to_vec());
        // One compile per kernel: a thread that finds another compiling the same kernel waits
        // for it rather than loading a second module. NVRTC takes milliseconds, and loading a
        // module waits for the device's work in flight, so a duplicate load racing with a
        // stream held by a host function would stall this thread until that function returns.
        // The slot is filled outside the map's lock: other kernels load meanwhile.
        let slot = self.modules.lock().entry(key.clone()).or_default().clone();
        match slot
            .get_or_init(|| kernel::compile(self, name, source, options, layout).map(Arc::new))
        {
            Ok(compiled) => Ok(compiled.clone()),
            Err(e) => {
                // Not kept: a later launch compiles again (the cause may pass, e.g. memory).
                let mut modules = self.modules.lock();
                if modules.get(&key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                    modules.remove(&key);
                }
                Err(e.clone())
            }
        }
    }

    /// Binds the device's context to this thread for the driver calls that follow, which are
    /// made while the returned proof is held. Fails with [`DeviceError::DeviceFaulted`] once
    /// the device faulted or this state was reset, and with [`DeviceError::Reentrant`] inside a
    /// host function, without calling the driver.
    pub(crate) fn bind(&self) -> Result<Bound<'_>> {
        refuse_in_host_function()?;
        let gate = self.life.gate.read_recursive();
        self.life.check()?;
        BOUND_ORDINAL.with(|b| b.set(Some(self.ordinal)));
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("cuCtxSetCurrent", e))?;
        Ok(Bound { _gate: gate })
    }

    /// Notes work of another device that reads or writes this device's memory, which `done`
    /// (an event of that device's stream) follows: a reset waits for it. Called while this
    /// state's gate is held (see `foreign`).
    pub(crate) fn note_foreign_use(&self, done: CudaEventHandle) {
        self.foreign
            .lock()
            .note(done, |e| foreign::finished(e.is_complete()));
    }

    /// The device's allocation stream (see the `alloc_stream` field), created on first use.
    pub(crate) fn alloc_stream(&self) -> Result<Arc<cudarc::driver::CudaStream>> {
        let mut slot = self.alloc_stream.lock();
        if let Some(s) = &*slot {
            return Ok(s.clone());
        }
        let _bound = self.bind()?;
        let s = self
            .ctx
            .new_stream()
            .map_err(|e| driver_err("cuStreamCreate", e))?;
        *slot = Some(s.clone());
        Ok(s)
    }

    /// An event without timing, from the pool when one is free.
    pub(crate) fn take_event(&self) -> Result<RawEvent> {
        if let Some(e) = self.event_pool.lock().pop() {
            return Ok(e);
        }
        let _bound = self.bind()?;
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| driver_err("cuEventCreate", e))?;
        Ok(RawEvent(ev))
    }

    /// A staging buffer of at least `len` bytes for a copy to or from the host: the smallest
    /// kept one that is large enough, or a new one (a power of two of at least 64 KiB) while
    /// the device's staging buffers stay within [`HOST_STAGING_MAX`] bytes; `None` past that,
    /// or when the allocation fails (the caller copies without staging, and meets the
    /// device's error there if it has one).
    pub(crate) fn take_host_staging(&self, len: usize) -> Option<HostStaging> {
        self.reclaim_uploads();
        let bytes = len.max(64 << 10).next_power_of_two();
        {
            let mut pool = self.host_staging.lock();
            let fitting = pool
                .kept
                .iter()
                .enumerate()
                .filter(|(_, s)| s.bytes() >= len)
                .min_by_key(|(_, s)| s.bytes())
                .map(|(i, _)| i);
            if let Some(i) = fitting {
                return Some(pool.kept.swap_remove(i));
            }
            if pool.bytes + bytes > HOST_STAGING_MAX {
                return None;
            }
            pool.bytes += bytes;
        }
        let allocated = HostStaging::alloc(self, bytes).ok();
        if allocated.is_none() {
            self.host_staging.lock().bytes -= bytes;
        }
        allocated
    }

    /// Staging buffers for a copy of `len` bytes (> 0), one for each [`HOST_STAGING_PIECE`]
    /// bytes of it in order, the last for what is left: all of them, or `None` (nothing
    /// taken) when the copy is larger than [`HOST_STAGED_COPY_MAX`] or the pool cannot give
    /// them all (see `take_host_staging`).
    pub(crate) fn take_host_staging_pieces(&self, len: usize) -> Option<Vec<HostStaging>> {
        if len == 0 || len > HOST_STAGED_COPY_MAX {
            return None;
        }
        let mut pieces = Vec::with_capacity(len.div_ceil(HOST_STAGING_PIECE));
        let mut left = len;
        while left > 0 {
            let n = left.min(HOST_STAGING_PIECE);
            match self.take_host_staging(n) {
                Some(piece) => pieces.push(piece),
                None => {
                    self.give_back_host_staging(pieces);
                    return None;
                }
            }
            left -= n;
        }
        Some(pieces)
    }

    /// Takes back staging buffers that no copy uses any more, for later copies. They are not
    /// freed before the device's state is: freeing page-locked memory waits for the device's
    /// work in flight while it blocks other threads' calls to the driver, so a free on a
    /// copy's path would hang a program whose host function waits for another thread's work.
    pub(crate) fn give_back_host_staging(&self, staging: impl IntoIterator<Item = HostStaging>) {
        self.host_staging.lock().kept.extend(staging);
    }

    /// Keeps `staging`, which copies enqueued before `done` (recorded after them) may still be
    /// reading, until `done` has completed.
    pub(crate) fn park_upload(&self, done: RawEvent, staging: Vec<HostStaging>) {
        self.uploads_in_flight.lock().push((done, staging));
    }

    /// Takes back the staging buffers of copies into this device whose events have completed.
    /// One whose event failed (a faulted device) stays parked: the state's drop, or a reset,
    /// frees it.
    fn reclaim_uploads(&self) {
        let mut landed = Vec::new();
        {
            let mut flying = self.uploads_in_flight.lock();
            if flying.is_empty() {
                return;
            }
            let Ok(_bound) = self.bind() else {
                return;
            };
            let mut i = 0;
            while i < flying.len() {
                // SAFETY: the event is alive (owned by the list) and of this context.
                if unsafe { result::event::query(flying[i].0 .0) }.is_ok() {
                    landed.push(flying.swap_remove(i));
                } else {
                    i += 1;
                }
            }
        }
        for (ev, staging) in landed {
            self.return_event(ev);
            self.give_back_host_staging(staging);
        }
    }

    pub(crate) fn return_event(&self, ev: RawEvent) {
        let mut pool = self.event_pool.lock();
        // Inside a host function the driver refuses the destroy: the pool keeps it.
        if pool.len() < 1024 || in_host_function() {
            pool.push(ev);
        } else {
            drop(pool);
            destroy_event(self, ev);
        }
    }
}

/// The most bytes of page-locked staging buffers a device allocates for copies to and from
/// the host (see [`CudaDeviceShared::take_host_staging`]); kept until the device's state is
/// dropped. The largest copy staged is half of it ([`HOST_STAGED_COPY_MAX`]).
pub(crate) const HOST_STAGING_MAX: usize = 256 << 20;

/// The largest copy to or from the host that is staged: half the pool, so that the buffers
/// smaller copies leave in the pool (which are never freed, see
/// [`CudaDeviceShared::give_back_host_staging`]) never keep it from being staged.
pub(crate) const HOST_STAGED_COPY_MAX: usize = HOST_STAGING_MAX / 2;

/// The most bytes of one staging buffer: a larger copy is staged through several.
pub(crate) const HOST_STAGING_PIECE: usize = 16 << 20;

/// A device's page-locked staging buffers for copies to and from the host.
#[derive(Default)]
pub(crate) struct StagingPool {
    /// The buffers no copy uses.
    kept: Vec<HostStaging>,
    /// Bytes of all the buffers allocated: kept, lent to a copy, or in flight.
    bytes: usize,
}

pub(crate) fn destroy_event(shared: &CudaDeviceShared, ev: RawEvent) {
    shared.life.release(|| {
        let ctx = &shared.ctx;
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: the event is owned by `ev` alone (Handles invariant) and its context is
        // alive: the state was not reset (Life).
        ctx.record_err(unsafe { result::event::destroy(ev.0) });
    });
}

impl Drop for CudaDeviceShared {
    fn drop(&mut self) {
        for (ev, pieces) in std::mem::take(self.uploads_in_flight.get_mut()) {
            // The copy reading the staging buffers is waited for before they are freed (a
            // failed wait means the device faulted or was reset: its work runs no more).
            self.life.release(|| {
                self.ctx.record_err(self.ctx.bind_to_thread());
                // SAFETY: the event is alive (owned by the list) and of this context, which
                // was not reset (Life).
                let _ = unsafe { result::event::synchronize(ev.0) };
            });
            destroy_event(self, ev);
            for staging in pieces {
                staging.free(self);
            }
        }
        for staging in std::mem::take(&mut self.host_staging.get_mut().kept) {
            staging.free(self);
        }
        let events = std::mem::take(self.event_pool.get_mut());
        for ev in events {
            destroy_event(self, ev);
        }
        for handle in std::mem::take(self.blas_handles.get_mut()) {
            blas::destroy_handle(self, handle);
        }
        let mut parts = Some((
            self.staging.get_mut().take(),
            self.alloc_stream.get_mut().take(),
            std::mem::take(self.modules.get_mut()),
        ));
        self.life.release(|| drop(parts.take()));
        // After a reset the driver freed them already: their handles must not be released.
        std::mem::forget(parts);
    }
}

/// A CUDA device, as held by [`Device`](crate::Device).
pub(crate) struct CudaDevice {
    shared: Arc<CudaDeviceShared>,
}

impl CudaDevice {
    /// The device's shared state.
    pub(crate) fn shared(&self) -> &Arc<CudaDeviceShared> {
        &self.shared
    }

    pub(crate) fn open(ordinal: usize) -> Result<(CudaDevice, String, DeviceLimits)> {
        let count = device_count().map_err(|e| match e {
            DeviceError::NoDevice { .. } => DeviceError::NoDevice { ordinal, count: 0 },
            other => other,
        })?;
        if ordinal >= count {
            return Err(DeviceError::NoDevice { ordinal, count });
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| driver_err("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: cuflow never uses cudarc's `CudaSlice` views, whose synchronization the
        // tracking provides; it orders all work with its own streams and events (Ordering).
        unsafe { ctx.disable_event_tracking() };
        if !ctx.has_async_alloc() {
            return Err(DeviceError::Unsupported {
                what: format!("device {ordinal} without stream-ordered memory pools"),
                backend: crate::BackendKind::Cuda,
            });
        }
        let name = ctx.name().map_err(|e| driver_err("cuDeviceGetName", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_err("cuDeviceGetAttribute", e))?;
        let attr = |a: sys::CUdevice_attribute| -> Result<u32> {
            ctx.attribute(a)
                .map(|v| v.max(0) as u32)
                .map_err(|e| driver_err("cuDeviceGetAttribute", e))
        };
        use sys::CUdevice_attribute as A;
        let limits = DeviceLimits {
            max_threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_block_dim: [
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
            ],
            max_grid_dim: [
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ],
            max_shared_mem_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
            max_shared_mem_per_block_optin: attr(
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
            multiprocessor_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            warp_size: attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
        };
        memory::keep_pool_memory(&ctx)?;
        let shared = Arc::new(CudaDeviceShared {
            ctx,
            ordinal,
            life: Life::new(ordinal),
            cc: (major.max(0) as u32, minor.max(0) as u32),
            event_pool: Mutex::new(Vec::new()),
            modules: Mutex::new(HashMap::new()),
            blas_handles: Mutex::new(Vec::new()),
            blas_ready: AtomicBool::new(false),
            alloc_stream: Mutex::new(None),
            peers: Mutex::new(HashMap::new()),
            staging: Mutex::new(None),
            host_staging: Mutex::new(StagingPool::default()),
            uploads_in_flight: Mutex::new(Vec::new()),
            host_fn_drops: Mutex::new(Vec::new()),
            host_fn_release: Mutex::new(()),
            foreign: Mutex::new(foreign::ForeignUses::default()),
        });
        Ok((CudaDevice { shared }, name, limits))
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.shared.ordinal
    }

    pub(crate) fn compute_capability(&self) -> (u32, u32) {
        self.shared.cc
    }

    pub(crate) fn memory_info(&self) -> Result<MemoryInfo> {
        let (free, total) = self
            .shared
            .ctx
            .mem_get_info()
            .map_err(|e| driver_err("cuMemGetInfo", e))?;
        Ok(MemoryInfo { free, total })
    }

    pub(crate) fn priority_range(&self) -> Result<(i32, i32)> {
        let _bound = self.shared.bind()?;
        result::stream::get_priority_range()
            .map_err(|e| driver_err("cuCtxGetStreamPriorityRange", e))
    }

    pub(crate) fn new_stream(&self, priority: Option<i32>) -> Result<(CudaStreamHandle, i32)> {
        CudaStreamHandle::new(&self.shared, priority)
    }

    /// The kernel compiled and loaded for this device (see [`CudaDeviceShared::compile`]).
    pub(crate) fn compile(
        &self,
        name: &str,
        source: &str,
        options: &[String],
        layout: &SourceLayout,
    ) -> Result<Arc<CompiledKernel>> {
        self.shared.compile(name, source, options, layout)
    }

    /// Whether this device can read `peer`'s memory directly.
    pub(crate) fn can_access_peer(&self, peer: &CudaDevice) -> Result<bool> {
        peer::can_access_peer(&self.shared, &peer.shared)
    }

    pub(crate) fn alloc_pinned(&self, bytes: usize) -> Result<CudaPinned> {
        CudaPinned::alloc_for_user(&self.shared, bytes)
    }

    /// Whether the device faulted (or this state of it was reset).
    pub(crate) fn is_faulted(&self) -> bool {
        self.shared.life.check().is_err()
    }

    /// Resets the device's primary context after a fault: waits for the driver calls in
    /// progress on this state, then for the copies other devices' streams still make from its
    /// memory (see `foreign`), retires it (every handle of it fails with `DeviceFaulted` from
    /// then on, and releases nothing), resets the context and clears the fault. A new
    /// `CudaDevice` must be opened afterwards.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] while page-locked buffers of this device are alive (their memory
    /// goes away with the context), while another thread keeps the state busy for longer
    /// than a few seconds, or while a copy enqueued on another device still reads this
    /// device's memory after a few seconds (the state is then left as it was, and a later
    /// call tries again); the driver's error when the reset fails.
    pub(crate) fn reset(&self) -> Result<()> {
        let life = &self.shared.life;
        let Some(_gate) = life.gate.try_write_for(FOREIGN_WAIT) else {
            return Err(DeviceError::usage(
                "Device::recover: another thread kept using the device for 5 s; \
                 stop using it (and its streams and buffers) before recovering it",
            ));
        };
        if life.retired.load(Ordering::Acquire) {
            return Ok(());
        }
        let pinned = life.user_pinned.load(Ordering::Acquire);
        if pinned > 0 {
            return Err(DeviceError::usage(format!(
                "Device::recover: {pinned} page-locked buffer(s) of cuda:{} are alive; their \
                 memory goes away with the reset, so drop them first",
                self.shared.ordinal
            )));
        }
        // Peer copies of other devices still reading this device's memory: noted under the
        // gate, which is now held, so none is added while they are waited for.
        let mut foreign = self.shared.foreign.lock().take();
        let waited = foreign::wait_until_finished(&mut foreign, FOREIGN_WAIT, |e| {
            foreign::finished(e.is_complete())
        });
        if !matches!(waited, Ok(true)) {
            let mut devices: Vec<usize> = foreign.iter().map(CudaEventHandle::ordinal).collect();
            devices.sort_unstable();
            devices.dedup();
            self.shared.foreign.lock().restore(foreign);
            let devices: Vec<String> = devices.iter().map(|d| format!("cuda:{d}")).collect();
            return Err(match waited {
                Err(e) => DeviceError::usage(format!(
                    "Device::recover: cannot tell whether copies from cuda:{} on {} have \
                     finished ({e}); synchronize those devices' streams, then recover again",
                    self.shared.ordinal,
                    devices.join(", ")
                )),
                Ok(_) => DeviceError::usage(format!(
                    "Device::recover: copies from cuda:{} enqueued on {} still read its \
                     memory after {} s, which the reset would free; wait for those devices' \
                     streams (synchronize them, or drop what they wait for), then recover \
                     again",
                    self.shared.ordinal,
                    devices.join(", "),
                    FOREIGN_WAIT.as_secs()
                )),
            });
        }
        life.retired.store(true, Ordering::Release);
        let ctx = &self.shared.ctx;
        ctx.bind_to_thread()
            .map_err(|e| plain_driver_err("cuCtxSetCurrent", &e))?;
        // SAFETY: the state is retired and its gate is held for writing, so no other call on
        // any handle of this context is in progress or will reach the driver again (Life);
        // the memory the reset frees is not reachable from safe code (device memory is only
        // reached through the retired handles, and no page-locked buffer is alive).
        unsafe { sys::cuDevicePrimaryCtxReset_v2(ctx.cu_device()) }
            .result()
            .map_err(|e| plain_driver_err("cuDevicePrimaryCtxReset", &e))?;
        faults().clear(self.shared.ordinal);
        tracing::info!("cuda:{} was reset after a fault", self.shared.ordinal);
        Ok(())
    }

    /// Forgets that this device could read `ordinal`'s memory directly (after that device
    /// was reset, access has to be set up again with its new context).
    pub(crate) fn forget_peer(&self, ordinal: usize) {
        self.shared.peers.lock().remove(&ordinal);
    }
}

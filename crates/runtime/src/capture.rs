//! Capture primitives: record a stream's work into a [`Graph`], instantiate it into a
//! [`GraphExec`], launch (replay) it, and update it in place.
//!
//! Invariants: every buffer touched by captured work is kept alive by the graph and by every
//! executable instantiated from it, and a launch records a use of each such buffer on the
//! launching stream, so that a buffer's stream-ordered free waits for the last replay.
//! Allocations requested during a capture are made at once, outside the graph (on CUDA from the
//! device's pool through a stream that never captures), and belong to the graph like every
//! other buffer it touches: the pointer baked into the graph stays valid for every replay, and
//! the memory is freed only after the graph, its executables and every tensor holding it are
//! gone. Such memory is not reused between the steps of one graph; each replay rewrites it.
//!
//! Captured work that waits for eager work (a capturing stream waiting on an event recorded
//! outside any capture, as a consumer of an eagerly produced `shared` op does) cannot hold
//! that dependency inside the graph: the graph keeps the event, and every launch waits for it
//! before the replay, on both backends.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

use parking_lot::Mutex;

use crate::access::{ordered_traced, Access, Accesses};
use crate::backend::{CaptureBackend, DeferredFree, GraphBackend, GraphExecBackend};
use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::event::Event;
use crate::memory::Memory;
use crate::stream::{Stream, StreamId};
use crate::trace::Work;

/// The state shared by the streams taking part in one capture.
pub(crate) struct CaptureSession {
    /// Process-unique: scopes the access state of captured work (see [`crate::access`]).
    pub(crate) id: u64,
    /// The thread that began the capture: the only one whose work enters the graph.
    owner: ThreadId,
    pub(crate) origin: StreamId,
    pub(crate) members: Mutex<Vec<Stream>>,
    pub(crate) backend: CaptureBackend,
    pub(crate) error: Mutex<Option<DeviceError>>,
    open: AtomicBool,
    keep_alive: Mutex<Vec<(Arc<Memory>, Access)>>,
    /// Events of eager work that captured work waited for: every launch of the graph waits
    /// for them (see [`CaptureSession::add_prerequisite`]).
    prerequisites: Mutex<Vec<Event>>,
    /// `None` once the capture has ended and its held frees have run.
    deferred_frees: Mutex<Option<Vec<DeferredFree>>>,
    /// The cuBLAS workspace of each member stream (see `crate::blas::capture_workspace`);
    /// those that captured GEMMs used are also in `keep_alive`.
    blas_workspaces: Mutex<Vec<(StreamId, Arc<Memory>)>>,
}

/// The ids of the captures open now, with the thread capturing each: a buffer's access state
/// keeps the hazards of each open capture that touched it, and forgets those of closed ones
/// (see [`crate::access`]).
static OPEN_CAPTURES: Mutex<Vec<(u64, ThreadId)>> = Mutex::new(Vec::new());

/// Whether the capture `id` is still open (begun and not yet ended).
pub(crate) fn capture_is_open(id: u64) -> bool {
    OPEN_CAPTURES.lock().iter().any(|(open, _)| *open == id)
}

/// Whether the capture `id` is open and the calling thread is the one capturing.
pub(crate) fn capture_is_open_here(id: u64) -> bool {
    let here = std::thread::current().id();
    OPEN_CAPTURES
        .lock()
        .iter()
        .any(|(open, owner)| *open == id && *owner == here)
}

impl Drop for CaptureSession {
    /// A session dropped without being closed (its capture abandoned) is closed here.
    fn drop(&mut self) {
        self.close();
    }
}

impl CaptureSession {
    pub(crate) fn new(origin: StreamId, backend: CaptureBackend) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let owner = std::thread::current().id();
        OPEN_CAPTURES.lock().push((id, owner));
        CaptureSession {
            id,
            owner,
            origin,
            members: Mutex::new(Vec::new()),
            backend,
            error: Mutex::new(None),
            open: AtomicBool::new(true),
            keep_alive: Mutex::new(Vec::new()),
            prerequisites: Mutex::new(Vec::new()),
            deferred_frees: Mutex::new(Some(Vec::new())),
            blas_workspaces: Mutex::new(Vec::new()),
        }
    }

    /// Gives `stream`, which is about to take part in the capture, its GEMM workspace.
    pub(crate) fn add_blas_workspace(&self, stream: StreamId, workspace: Arc<Memory>) {
        self.blas_workspaces.lock().push((stream, workspace));
    }

    /// The GEMM workspace of member `stream`, if it has one.
    pub(crate) fn blas_workspace(&self, stream: StreamId) -> Option<Arc<Memory>> {
        self.blas_workspaces
            .lock()
            .iter()
            .find(|(id, _)| *id == stream)
            .map(|(_, mem)| mem.clone())
    }

    /// Drops the session's hold on the GEMM workspaces (call once every member left the
    /// capture): those no captured GEMM used are freed now, the others with the graph.
    pub(crate) fn release_blas_workspaces(&self) {
        drop(std::mem::take(&mut *self.blas_workspaces.lock()));
    }

    /// Holds a free that would otherwise be ordered after a capturing stream, until the capture
    /// ends; hands it back when the capture has ended already (its held frees have run).
    pub(crate) fn defer_free(&self, free: DeferredFree) -> Option<DeferredFree> {
        let mut held = self.deferred_frees.lock();
        match &mut *held {
            Some(frees) => {
                frees.push(free);
                None
            }
            None => Some(free),
        }
    }

    /// Runs the frees held during the capture (call once every member left the capture); a free
    /// offered later is handed back.
    pub(crate) fn run_deferred_frees(&self) {
        let frees = self.deferred_frees.lock().take().unwrap_or_default();
        for free in frees {
            free.release();
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    pub(crate) fn close(&self) {
        if self.open.swap(false, Ordering::AcqRel) {
            OPEN_CAPTURES.lock().retain(|(id, _)| *id != self.id);
        }
    }

    /// Refuses work that a thread other than the one capturing aims at a stream of this
    /// capture: it would be recorded into someone else's graph and never run.
    pub(crate) fn check_owner(&self, op: &'static str, stream: StreamId) -> Result<()> {
        if std::thread::current().id() == self.owner {
            return Ok(());
        }
        Err(DeviceError::Capture {
            op: op.to_string(),
            reason: format!(
                "stream {stream} is being captured into a graph by another thread; work from \
                 other threads never enters a graph: enqueue it on another stream (the \
                 scheduling policies skip streams that are capturing)"
            ),
        })
    }

    /// Refuses to end the capture from a thread other than the one that began it: that thread
    /// may still be enqueuing work meant for the graph, which would run eagerly instead.
    pub(crate) fn check_ended_by_owner(&self) -> Result<()> {
        if std::thread::current().id() == self.owner {
            return Ok(());
        }
        Err(DeviceError::Capture {
            op: "Stream::end_capture".into(),
            reason: format!(
                "stream {} is being captured by another thread; only the thread that began a \
                 capture ends it",
                self.origin
            ),
        })
    }

    /// Keeps `mem` alive for as long as the graph; a replay accesses it as `access` (a write
    /// when any captured work wrote it).
    pub(crate) fn keep_alive(&self, mem: &Arc<Memory>, access: Access) {
        let mut list = self.keep_alive.lock();
        match list.iter_mut().find(|(m, _)| Arc::ptr_eq(m, mem)) {
            Some((_, a)) => {
                if access == Access::Write {
                    *a = Access::Write;
                }
            }
            None => list.push((mem.clone(), access)),
        }
    }

    pub(crate) fn take_keep_alive(&self) -> Vec<(Arc<Memory>, Access)> {
        std::mem::take(&mut *self.keep_alive.lock())
    }

    /// Orders the captured work after the eager work before `event`: a dependency on work
    /// outside the capture cannot be a node of the graph (the driver refuses the wait), so
    /// each launch of the graph waits for the event first. An event stands for a fixed point
    /// of its stream, so waiting for it again at a later launch costs nothing once it passed.
    pub(crate) fn add_prerequisite(&self, event: &Event) {
        let mut list = self.prerequisites.lock();
        if !list.iter().any(|e| Arc::ptr_eq(&e.inner, &event.inner)) {
            list.push(event.clone());
        }
    }

    pub(crate) fn take_prerequisites(&self) -> Vec<Event> {
        std::mem::take(&mut *self.prerequisites.lock())
    }

    pub(crate) fn record_error(&self, err: DeviceError) {
        let mut slot = self.error.lock();
        if slot.is_none() {
            *slot = Some(err);
        }
    }
}

/// Work recorded from one or more streams by [`Stream::begin_capture`] /
/// [`Stream::end_capture`]: nodes and the dependencies between them.
///
/// `Send + Sync`: one graph and the executables instantiated from it may be used from any
/// number of threads at once. The CUDA driver does not synchronize a graph with its
/// executables, so each call on one of them (instantiation, a launch, an update, a query, a
/// drop) is made while no other call on the same graph or its executables runs; calls on
/// unrelated graphs run in parallel.
pub struct Graph {
    device: Device,
    backend: GraphBackend,
    keep_alive: Arc<Vec<(Arc<Memory>, Access)>>,
    prerequisites: Arc<Vec<Event>>,
}

impl Graph {
    pub(crate) fn new(
        device: Device,
        backend: GraphBackend,
        keep_alive: Vec<(Arc<Memory>, Access)>,
        prerequisites: Vec<Event>,
    ) -> Self {
        Graph {
            device,
            backend,
            keep_alive: Arc::new(keep_alive),
            prerequisites: Arc::new(prerequisites),
        }
    }

    /// The device the graph runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The graph in Graphviz DOT. On CUDA, the driver's own dump (`cuGraphDebugDotPrint`,
    /// verbose: kernel names, launch and copy parameters); on the host backend, the recorded
    /// work, one node per task (`test_fill (kernel) grid 4x1x1 block 256x1x1`), with its
    /// dependencies.
    ///
    /// # Errors
    ///
    /// A driver error, or [`DeviceError::Usage`] when the driver's dump cannot be written to
    /// and read back from the temporary directory.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::{Device, DeviceBuffer};
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let stream = Device::host().new_stream()?;
    /// let buf = DeviceBuffer::<u8>::zeroed(&stream, 64)?;
    /// stream.begin_capture()?;
    /// buf.view().fill_bytes(&stream, 7)?;
    /// let graph = stream.end_capture()?;
    /// assert!(graph.to_dot()?.contains("memset 64 bytes"));
    /// # Ok(()) }
    /// ```
    pub fn to_dot(&self) -> Result<String> {
        self.backend.to_dot()
    }

    /// How many nodes (kernels, copies, memsets, event waits) the graph holds.
    ///
    /// # Errors
    ///
    /// A driver error if the query fails.
    pub fn node_count(&self) -> Result<usize> {
        self.backend.node_count()
    }

    /// The dependency edges `(from, to)` between nodes, by node index in
    /// `0..node_count()`: `to` runs only after `from` has finished.
    ///
    /// # Errors
    ///
    /// A driver error if the query fails.
    pub fn edges(&self) -> Result<Vec<(usize, usize)>> {
        self.backend.edges()
    }

    /// The number of nodes with no dependencies: more than one means the graph starts with
    /// parallel branches.
    ///
    /// # Errors
    ///
    /// A driver error if the query fails.
    pub fn root_count(&self) -> Result<usize> {
        let n = self.node_count()?;
        let mut has_dep = vec![false; n];
        for (_, to) in self.edges()? {
            if let Some(slot) = has_dep.get_mut(to) {
                *slot = true;
            }
        }
        Ok(has_dep.iter().filter(|d| !**d).count())
    }

    /// The largest number of nodes that may run at once (the width of the widest antichain
    /// layer by longest-path depth): 1 for a chain, `k` for `k` independent branches.
    ///
    /// # Errors
    ///
    /// A driver error if the query fails.
    pub fn max_parallelism(&self) -> Result<usize> {
        let n = self.node_count()?;
        let edges = self.edges()?;
        let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut indeg = vec![0usize; n];
        let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in &edges {
            if a < n && b < n {
                preds[b].push(a);
                succ[a].push(b);
                indeg[b] += 1;
            }
        }
        let mut depth = vec![0usize; n];
        let mut queue: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
        let mut head = 0;
        while head < queue.len() {
            let v = queue[head];
            head += 1;
            for &w in &succ[v] {
                depth[w] = depth[w].max(depth[v] + 1);
                indeg[w] -= 1;
                if indeg[w] == 0 {
                    queue.push(w);
                }
            }
        }
        let mut per_layer = std::collections::HashMap::<usize, usize>::new();
        for d in depth {
            *per_layer.entry(d).or_default() += 1;
        }
        Ok(per_layer.values().copied().max().unwrap_or(0))
    }

    /// Instantiates the graph into an executable that can be launched many times.
    ///
    /// # Errors
    ///
    /// A driver error if instantiation fails.
    pub fn instantiate(&self) -> Result<GraphExec> {
        let backend = self.backend.instantiate()?;
        Ok(GraphExec {
            device: self.device.clone(),
            backend,
            keep_alive: self.keep_alive.clone(),
            prerequisites: self.prerequisites.clone(),
        })
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.device)
            .field("nodes", &self.node_count().ok())
            .finish()
    }
}

/// An instantiated [`Graph`]: launch it on a stream as many times as needed. `Send + Sync`
/// (see [`Graph`] for how calls from several threads are ordered).
pub struct GraphExec {
    device: Device,
    backend: GraphExecBackend,
    keep_alive: Arc<Vec<(Arc<Memory>, Access)>>,
    /// Eager work the captured work waited for: each launch waits for it first.
    prerequisites: Arc<Vec<Event>>,
}

impl GraphExec {
    /// Enqueues one replay of the graph on `stream`; it does not wait for the replay.
    ///
    /// # Errors
    ///
    /// [`DeviceError::DeviceMismatch`] for a stream of another device;
    /// [`DeviceError::Capture`] while `stream` is being captured (which fails that capture, on
    /// every backend: the driver cannot record a replay); or a driver error.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        crate::backend::refuse_in_host_function()?;
        if stream.device() != &self.device {
            return Err(DeviceError::device_mismatch(
                "GraphExec::launch",
                "the stream",
                &self.device,
                stream.device(),
            ));
        }
        // Without the gate: only this thread can begin a capture that this launch would be
        // recorded into, and another thread's capture is refused by `ordered_traced` below.
        stream.refuse_in_capture(
            "GraphExec::launch",
            "a graph cannot be replayed on a stream being captured (the driver refuses it); \
             replay it before or after the capture, or capture the op it was made from",
        )?;
        // The eager work that the captured work waited for, then the buffers.
        for event in self.prerequisites.iter() {
            stream.wait_event(event)?;
        }
        // A replay is one access of every buffer the graph touches, ordered like any other.
        let accesses: Accesses<'_> = self.keep_alive.iter().map(|(m, a)| (m, *a)).collect();
        ordered_traced(
            stream,
            "GraphExec::launch",
            || Work::Replay,
            accesses,
            || self.backend.launch(stream.backend()),
        )
    }

    /// Replaces the executable's work with `graph`'s when the two have the same topology
    /// (CUDA's exec update: kernel arguments, copy addresses and sizes may differ). Returns
    /// `Ok(true)` when updated in place and `Ok(false)` when the topology differs, in which case
    /// the executable is unchanged and the caller should instantiate `graph` instead.
    ///
    /// # Errors
    ///
    /// [`DeviceError::DeviceMismatch`] for a graph of another device (the executable is
    /// unchanged), or a driver error other than a topology mismatch.
    pub fn update(&mut self, graph: &Graph) -> Result<bool> {
        if graph.device != self.device {
            return Err(DeviceError::device_mismatch(
                "GraphExec::update",
                "the graph",
                &self.device,
                &graph.device,
            ));
        }
        let updated = self.backend.update(&graph.backend)?;
        if updated {
            self.keep_alive = graph.keep_alive.clone();
            self.prerequisites = graph.prerequisites.clone();
        }
        Ok(updated)
    }

    /// The device the executable runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphExec")
            .field("device", &self.device)
            .finish()
    }
}

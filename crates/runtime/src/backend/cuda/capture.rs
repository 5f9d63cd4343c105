//! CUDA graphs captured from streams, and their executables.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{result, sys};
use parking_lot::Mutex;

use super::stream::CudaStreamHandle;
use super::{destroy_event, driver_err, CudaDeviceShared, RawEvent};
use crate::error::Result;

/// What one graph and every executable instantiated from it share (see [`CudaGraphHandle`]).
type Family = Arc<FamilyState>;

pub(crate) struct FamilyState {
    /// Held by every driver call on the graph or one of its executables.
    lock: Mutex<()>,
    /// The events recorded during the capture that made the graph, destroyed once the graph,
    /// its executables and the events' own handles are all gone.
    _events: Arc<CapturedEvents>,
}

impl FamilyState {
    fn lock(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.lock.lock()
    }
}

/// The events recorded on streams while they took part in one capture.
///
/// The driver ties an event recorded during a capture to that capture and its graph: such an
/// event, back in the device's pool and recorded again by eager work of another thread while
/// the graph was instantiated or its executables destroyed, crashed inside the driver (and
/// nothing says destroying it then is safe either). So it never goes back to the pool: when
/// its handle is dropped it is kept here, and destroyed only when the capture's graph, every
/// executable instantiated from it and every handle of these events are gone (each holds this
/// value).
pub(crate) struct CapturedEvents {
    /// The device of the stream that began the capture (where a drop inside a host function
    /// is deferred to).
    shared: Arc<CudaDeviceShared>,
    /// Each with its own device: streams of other devices may join a capture.
    events: Mutex<Vec<(Arc<CudaDeviceShared>, RawEvent)>>,
}

impl CapturedEvents {
    pub(crate) fn new(shared: Arc<CudaDeviceShared>) -> Arc<Self> {
        Arc::new(CapturedEvents {
            shared,
            events: Mutex::new(Vec::new()),
        })
    }

    /// Keeps `ev`, recorded during the capture on a stream of `shared`'s device, until the
    /// capture's graph and executables are gone.
    pub(crate) fn keep(&self, shared: Arc<CudaDeviceShared>, ev: RawEvent) {
        self.events.lock().push((shared, ev));
    }
}

impl Drop for CapturedEvents {
    fn drop(&mut self) {
        let events = std::mem::take(self.events.get_mut());
        if events.is_empty() {
            return;
        }
        if super::in_host_function() {
            // The driver refuses the destroys here: they are made at the next synchronization.
            let moved = CapturedEvents {
                shared: self.shared.clone(),
                events: Mutex::new(events),
            };
            self.shared.defer_host_fn_handle(moved);
            return;
        }
        for (shared, ev) in events {
            destroy_event(&shared, ev);
        }
    }
}

/// A captured `CUgraph`, destroyed on drop.
///
/// The driver does not synchronize graph objects internally: calls on one graph, even those
/// that look read-only (instantiation, node and edge queries, the DOT dump), must not overlap.
/// Nor are a graph and its executables independent objects: the driver keeps per-graph state
/// that instantiating from the graph and destroying one of its executables both change, and
/// the two made at once from two threads crash inside the driver. So one lock, `family`, is
/// shared by the graph and every executable instantiated from it, and every driver call on any
/// of them holds it (launches, updates and destruction included).
pub(crate) struct CudaGraphHandle {
    graph: sys::CUgraph,
    shared: Arc<CudaDeviceShared>,
    family: Family,
}

// SAFETY: a CUgraph is a driver handle owned uniquely by this value (Handles); the driver
// allows using it from any thread once the context is bound.
unsafe impl Send for CudaGraphHandle {}
// SAFETY: every driver call on the graph (drop included) holds `family`, so no two calls on
// one graph, or on the graph and one of its executables, overlap (the driver's rule for graph
// objects).
unsafe impl Sync for CudaGraphHandle {}

impl CudaGraphHandle {
    /// The graph a capture ended with; `events` are those recorded during the capture.
    pub(crate) fn new(
        graph: sys::CUgraph,
        shared: Arc<CudaDeviceShared>,
        events: Arc<CapturedEvents>,
    ) -> Self {
        CudaGraphHandle {
            graph,
            shared,
            family: Arc::new(FamilyState {
                lock: Mutex::new(()),
                _events: events,
            }),
        }
    }

    fn nodes(&self) -> Result<Vec<sys::CUgraphNode>> {
        let _bound = self.shared.bind()?;
        let _serial = self.family.lock();
        let mut n = 0usize;
        // SAFETY: the graph is alive; a null node array asks only for the count.
        unsafe { sys::cuGraphGetNodes(self.graph, std::ptr::null_mut(), &mut n) }
            .result()
            .map_err(|e| driver_err("cuGraphGetNodes", e))?;
        if n == 0 {
            // The driver refuses a node array with a zero count.
            return Ok(Vec::new());
        }
        let mut nodes = vec![std::ptr::null_mut(); n];
        // SAFETY: `nodes` has room for the `n` nodes the driver reported.
        unsafe { sys::cuGraphGetNodes(self.graph, nodes.as_mut_ptr(), &mut n) }
            .result()
            .map_err(|e| driver_err("cuGraphGetNodes", e))?;
        nodes.truncate(n);
        Ok(nodes)
    }

    /// The graph in Graphviz DOT, as the driver prints it (`cuGraphDebugDotPrint`, verbose:
    /// kernel names and launch parameters, copy and memset parameters), through a file in a
    /// directory of its own: made fresh (never one that exists, so no other user's link is
    /// followed), readable by this user only, removed afterwards.
    pub(crate) fn debug_dot(&self) -> Result<String> {
        let dir = private_temp_dir()?;
        let path = dir.join("graph.dot");
        let io = |e: std::io::Error| {
            crate::error::DeviceError::usage(format!(
                "Graph::to_dot: the driver's dump could not go through {}: {e}",
                path.display()
            ))
        };
        let dot = (|| {
            let c_path = std::ffi::CString::new(path.to_string_lossy().as_bytes())
                .map_err(|e| io(std::io::Error::other(e)))?;
            let _bound = self.shared.bind()?;
            let _serial = self.family.lock();
            // SAFETY: the graph is alive; `c_path` is a NUL-terminated path alive for the
            // call; the driver only writes that file.
            unsafe {
                sys::cuGraphDebugDotPrint(
                    self.graph,
                    c_path.as_ptr(),
                    sys::CUgraphDebugDot_flags_enum::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE as u32,
                )
            }
            .result()
            .map_err(|e| driver_err("cuGraphDebugDotPrint", e))?;
            std::fs::read_to_string(&path).map_err(io)
        })();
        let _ = std::fs::remove_dir_all(&dir);
        dot
    }

    pub(crate) fn node_count(&self) -> Result<usize> {
        Ok(self.nodes()?.len())
    }

    pub(crate) fn edges(&self) -> Result<Vec<(usize, usize)>> {
        let nodes = self.nodes()?;
        let _serial = self.family.lock();
        let index: HashMap<usize, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (*n as usize, i))
            .collect();
        let mut m = 0usize;
        // The `_v2` entry point on purpose: CUDA 13 drivers export the unsuffixed name with the
        // five-argument signature, so the four-argument CUDA 12 binding would hand the driver a
        // garbage count pointer.
        // SAFETY: the graph is alive; null arrays ask only for the edge count.
        unsafe {
            sys::cuGraphGetEdges_v2(
                self.graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut m,
            )
        }
        .result()
        .map_err(|e| driver_err("cuGraphGetEdges", e))?;
        if m == 0 {
            // The driver refuses arrays with a zero count.
            return Ok(Vec::new());
        }
        let mut from = vec![std::ptr::null_mut(); m];
        let mut to = vec![std::ptr::null_mut(); m];
        // SAFETY: both arrays have room for the `m` edges the driver reported; no edge data.
        unsafe {
            sys::cuGraphGetEdges_v2(
                self.graph,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                std::ptr::null_mut(),
                &mut m,
            )
        }
        .result()
        .map_err(|e| driver_err("cuGraphGetEdges", e))?;
        Ok(from
            .iter()
            .zip(to.iter())
            .take(m)
            .filter_map(|(a, b)| Some((*index.get(&(*a as usize))?, *index.get(&(*b as usize))?)))
            .collect())
    }

    pub(crate) fn instantiate(&self) -> Result<CudaGraphExecHandle> {
        let _bound = self.shared.bind()?;
        let _serial = self.family.lock();
        // SAFETY: the graph is alive and complete (capture ended).
        let exec = unsafe {
            result::graph::instantiate(self.graph, sys::CUgraphInstantiate_flags_enum(0))
        }
        .map_err(|e| driver_err("cuGraphInstantiateWithFlags", e))?;
        Ok(CudaGraphExecHandle {
            exec,
            shared: self.shared.clone(),
            family: self.family.clone(),
            updated_from: None,
        })
    }
}

impl Drop for CudaGraphHandle {
    fn drop(&mut self) {
        if self.graph.is_null() {
            return;
        }
        if super::in_host_function() {
            // The driver refuses the destroy here: it is made at the next synchronization.
            let moved = CudaGraphHandle {
                graph: std::mem::replace(&mut self.graph, std::ptr::null_mut()),
                shared: self.shared.clone(),
                family: self.family.clone(),
            };
            self.shared.defer_host_fn_handle(moved);
            return;
        }
        let (graph, ctx) = (self.graph, &self.shared.ctx);
        self.shared.life.release(|| {
            ctx.record_err(ctx.bind_to_thread());
            let _serial = self.family.lock();
            // SAFETY: the graph is owned by `self` and destroyed once, in the state of the
            // context it was made in (not reset: Life), while no call on one of its executables
            // runs (`family`); executables instantiated from it do not depend on it.
            if let Err(e) = unsafe { result::graph::destroy(graph) } {
                tracing::warn!("cuGraphDestroy failed: {}", driver_err("cuGraphDestroy", e));
            }
        });
    }
}

/// An instantiated `CUgraphExec`, destroyed on drop (the driver defers the destruction of an
/// executable that is still running until it completes).
///
/// Like graphs, executables are not synchronized by the driver: every driver call on one holds
/// the lock of its graph's family (see [`CudaGraphHandle`]).
pub(crate) struct CudaGraphExecHandle {
    exec: sys::CUgraphExec,
    shared: Arc<CudaDeviceShared>,
    family: Family,
    /// The family of the graph of the last successful update, whose captured events stay
    /// alive while the executable runs that graph's work.
    updated_from: Option<Family>,
}

// SAFETY: owned uniquely (Handles); the driver allows using it from any thread once the
// context is bound.
unsafe impl Send for CudaGraphExecHandle {}
// SAFETY: every driver call on the executable (launch, update, drop) holds `family`, so no two
// calls on one executable, or on it and its graph or sibling executables, overlap.
unsafe impl Sync for CudaGraphExecHandle {}

impl CudaGraphExecHandle {
    pub(crate) fn launch(&self, stream: &CudaStreamHandle) -> Result<()> {
        let _bound = self.shared.bind()?;
        let _serial = self.family.lock();
        // SAFETY: the executable and the stream are alive; the buffers the graph uses are kept
        // alive by the runtime's `GraphExec`, which recorded their use on this stream.
        unsafe { result::graph::launch(self.exec, stream.raw()) }
            .map_err(|e| driver_err("cuGraphLaunch", e))
    }

    pub(crate) fn update(&mut self, graph: &CudaGraphHandle) -> Result<bool> {
        let _bound = self.shared.bind()?;
        // Both families: the update reads `graph` and writes this executable.
        let _serial = lock_both(&self.family, &graph.family);
        let mut info = sys::CUgraphExecUpdateResultInfo_st {
            result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            errorNode: std::ptr::null_mut(),
            errorFromNode: std::ptr::null_mut(),
        };
        // SAFETY: both handles are alive; `info` is a valid out-pointer.
        let r = unsafe { sys::cuGraphExecUpdate_v2(self.exec, graph.graph, &mut info) };
        match r {
            sys::cudaError_enum::CUDA_SUCCESS => {
                self.updated_from =
                    (!Arc::ptr_eq(&self.family, &graph.family)).then(|| graph.family.clone());
                Ok(true)
            }
            sys::cudaError_enum::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => Ok(false),
            other => Err(driver_err(
                "cuGraphExecUpdate",
                cudarc::driver::DriverError(other),
            )),
        }
    }
}

impl Drop for CudaGraphExecHandle {
    fn drop(&mut self) {
        if self.exec.is_null() {
            return;
        }
        if super::in_host_function() {
            // The driver refuses the destroy here: it is made at the next synchronization.
            let moved = CudaGraphExecHandle {
                exec: std::mem::replace(&mut self.exec, std::ptr::null_mut()),
                shared: self.shared.clone(),
                family: self.family.clone(),
                updated_from: self.updated_from.take(),
            };
            self.shared.defer_host_fn_handle(moved);
            return;
        }
        let (exec, ctx) = (self.exec, &self.shared.ctx);
        self.shared.life.release(|| {
            ctx.record_err(ctx.bind_to_thread());
            let _serial = self.family.lock();
            // SAFETY: owned by `self`, destroyed once, in the state of the context it was made
            // in (not reset: Life), while no other call on its graph's family runs (`family`).
            if let Err(e) = unsafe { result::graph::exec_destroy(exec) } {
                tracing::warn!(
                    "cuGraphExecDestroy failed: {}",
                    driver_err("cuGraphExecDestroy", e)
                );
            }
        });
    }
}

/// Locks two families, the same one once, two in the order of their addresses so that two
/// threads locking the same pair cannot each wait for the other.
fn lock_both<'a>(
    a: &'a Family,
    b: &'a Family,
) -> (
    parking_lot::MutexGuard<'a, ()>,
    Option<parking_lot::MutexGuard<'a, ()>>,
) {
    if Arc::ptr_eq(a, b) {
        return (a.lock(), None);
    }
    let (first, second) = if Arc::as_ptr(a) < Arc::as_ptr(b) {
        (a, b)
    } else {
        (b, a)
    };
    let held = first.lock();
    (held, Some(second.lock()))
}

/// A new directory under the system's temporary directory that did not exist before (creating
/// one fails rather than reuse a path someone else made), readable by this user only.
fn private_temp_dir() -> Result<std::path::PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    let mut last = None;
    for _ in 0..16 {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "cuflow-graph-{}-{n}-{nanos:08x}",
            std::process::id()
        ));
        match builder.create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => last = Some(e),
        }
    }
    Err(crate::error::DeviceError::usage(format!(
        "Graph::to_dot: no private directory could be made under {} for the driver's dump: {}",
        std::env::temp_dir().display(),
        last.map_or_else(|| "unknown error".to_string(), |e| e.to_string())
    )))
}

#[cfg(test)]
mod tests {
    use super::private_temp_dir;

    #[test]
    fn each_dump_directory_is_new_and_private() {
        let (a, b) = (private_temp_dir().unwrap(), private_temp_dir().unwrap());
        assert_ne!(a, b);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&a).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "group and others have no access: {mode:o}");
        }
        for d in [a, b] {
            std::fs::remove_dir(d).unwrap();
        }
    }
}

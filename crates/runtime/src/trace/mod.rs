//! Timeline tracing: what ran on which stream, when, and inside which op.
//!
//! Tracing is off unless a program asks for it, with [`start`] (and [`stop`], which returns
//! the [`Trace`]) or by setting `CUFLOW_TRACE=path.json` (the trace starts with the first
//! stream and is written to that file by [`stop`], or when the process exits).
//!
//! While it is on, the runtime records, per stream: every kernel launch (name, grid, block),
//! copy (bytes), memset, GEMM, graph replay and host function, as a span between two timed
//! events recorded around the work (device timestamps on CUDA, the worker thread's clock on
//! the host); every event record and wait (the wait's end is when the stream went on); on
//! the host threads: op spans ([`op_span`], entered by the executor for each execution, `zip!`
//! branch, `shared` producer and named op) and host waits (`synchronize`). Timestamps are
//! resolved lazily, by [`stop`], after the traced work has completed. Work recorded into a
//! graph during a capture is not traced; its replays are.
//!
//! Off, the cost on every enqueue is one relaxed atomic load and a branch not taken
//! ([`is_enabled`]). On, each traced work item costs two extra event records and two short
//! locks, and threads enqueuing on one stream take turns (each item is recorded whole, so the
//! spans of a stream never overlap and list in the stream's order).
//! A trace keeps every entry, and on CUDA the events that time it, until [`stop`]: memory
//! grows with the traced work (a few hundred bytes and two CUDA events per item), so trace a
//! bounded stretch of a program (a few iterations), not a whole long run.
//!
//! A trace is written as Chrome / Perfetto trace-event JSON ([`Trace::to_chrome_json`]: one
//! process per device and one for the host threads, one thread lane per stream), and its
//! execution as a graph ([`Trace::to_dot`], and as text by `Display`).
//!
//! ```
//! use cuflow_runtime::{trace, Device, DeviceBuffer};
//! # fn main() -> Result<(), cuflow_runtime::DeviceError> {
//! # let _lock = trace::tests_serial();
//! let stream = Device::host().new_stream()?;
//! trace::start()?;
//! let buf = DeviceBuffer::from_host(&stream, &[1.0f32; 256])?;
//! buf.view().fill_bytes(&stream, 0)?;
//! stream.synchronize()?;
//! let trace = trace::stop()?;
//! assert!(trace.entries().iter().any(|e| e.name == "fill_bytes"));
//! let json: String = trace.to_chrome_json();
//! assert!(json.starts_with('{'));
//! # Ok(()) }
//! ```

mod chrome;
mod dag;
mod entry;
mod recorder;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

pub use entry::{EntryKind, Lane, Trace, TraceEntry};
pub(crate) use recorder::{
    event_number, note_event_record, note_event_wait, traced_enqueue, HostWait,
};
pub use recorder::{op_span, start, stop, OpSpan};

/// Whether tracing is on. The one check on the enqueue path when it is off.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether a trace is being recorded ([`start`] or `CUFLOW_TRACE`).
///
/// ```
/// assert!(!cuflow_runtime::trace::is_enabled() || std::env::var_os("CUFLOW_TRACE").is_some());
/// ```
#[inline(always)]
pub fn is_enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// What a traced work item is, built only when tracing is on.
#[derive(Debug, Clone)]
pub(crate) enum Work {
    /// A kernel launch.
    Kernel {
        name: std::sync::Arc<str>,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
    },
    /// A copy of `bytes` (`what` says from where to where).
    Copy { what: &'static str, bytes: usize },
    /// A memset of `bytes`.
    Fill { bytes: usize },
    /// A matrix multiply `m × n × k`.
    Gemm { m: usize, n: usize, k: usize },
    /// A graph replay.
    Replay,
    /// A host function.
    HostFn,
    /// Anything else, by the name of the call.
    Other(&'static str),
}

impl Work {
    pub(crate) fn kind(&self) -> EntryKind {
        match self {
            Work::Kernel { .. } => EntryKind::Kernel,
            Work::Copy { .. } => EntryKind::Copy,
            Work::Fill { .. } => EntryKind::Fill,
            Work::Gemm { .. } => EntryKind::Gemm,
            Work::Replay => EntryKind::GraphReplay,
            Work::HostFn => EntryKind::HostFn,
            Work::Other(_) => EntryKind::Work,
        }
    }

    pub(crate) fn name(&self) -> Cow<'static, str> {
        match self {
            Work::Kernel { name, .. } => Cow::Owned(name.to_string()),
            Work::Copy { what, .. } => Cow::Borrowed(what),
            Work::Fill { .. } => Cow::Borrowed("fill_bytes"),
            Work::Gemm { .. } => Cow::Borrowed("gemm"),
            Work::Replay => Cow::Borrowed("graph replay"),
            Work::HostFn => Cow::Borrowed("host function"),
            Work::Other(what) => Cow::Borrowed(what),
        }
    }

    pub(crate) fn args(&self) -> Vec<(&'static str, String)> {
        let dim = |d: (u32, u32, u32)| format!("{}x{}x{}", d.0, d.1, d.2);
        match self {
            Work::Kernel {
                grid,
                block,
                shared_bytes,
                ..
            } => vec![
                ("grid", dim(*grid)),
                ("block", dim(*block)),
                ("shared_bytes", shared_bytes.to_string()),
            ],
            Work::Copy { bytes, .. } | Work::Fill { bytes } => vec![("bytes", bytes.to_string())],
            Work::Gemm { m, n, k } => vec![("mnk", format!("{m}x{n}x{k}"))],
            Work::Replay | Work::HostFn | Work::Other(_) => Vec::new(),
        }
    }
}

/// Serializes the tests and doctests that start traces: a trace is process-wide, so two
/// traces recorded at once would each see the other's work.
#[doc(hidden)]
pub fn tests_serial() -> parking_lot::MutexGuard<'static, ()> {
    static LOCK: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    LOCK.lock()
}

/// Starts the trace `CUFLOW_TRACE` asks for, once per process (called as streams are made).
pub(crate) fn start_from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(recorder::start_from_env);
}

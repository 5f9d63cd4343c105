//! A finished trace: its entries, with timestamps resolved, and the lanes they sit on.

use std::fmt;

use crate::stream::StreamId;

/// What a [`TraceEntry`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EntryKind {
    /// A kernel launch (args: `grid`, `block`, `shared_bytes`).
    Kernel,
    /// A copy (args: `bytes`).
    Copy,
    /// A memset (args: `bytes`).
    Fill,
    /// A GEMM (args: `mnk`).
    Gemm,
    /// A graph replay.
    GraphReplay,
    /// A host function enqueued on a stream.
    HostFn,
    /// Other stream work, named by the call that enqueued it.
    Work,
    /// An event recorded on a stream (a point: no duration).
    EventRecord,
    /// A stream waiting for an event (its time is when the stream went on).
    EventWait,
    /// The host blocked until a stream or an event completed.
    HostWait,
    /// An op's execution on a host thread ([`crate::trace::op_span`]).
    Op,
}

impl EntryKind {
    /// A short lower-case name, used as the trace-event category.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Kernel => "kernel",
            EntryKind::Copy => "copy",
            EntryKind::Fill => "fill",
            EntryKind::Gemm => "gemm",
            EntryKind::GraphReplay => "graph",
            EntryKind::HostFn => "host_fn",
            EntryKind::Work => "work",
            EntryKind::EventRecord => "event_record",
            EntryKind::EventWait => "event_wait",
            EntryKind::HostWait => "host_wait",
            EntryKind::Op => "op",
        }
    }

    /// Whether it is stream work (a span on a stream lane).
    pub fn is_stream_work(self) -> bool {
        matches!(
            self,
            EntryKind::Kernel
                | EntryKind::Copy
                | EntryKind::Fill
                | EntryKind::Gemm
                | EntryKind::GraphReplay
                | EntryKind::HostFn
                | EntryKind::Work
        )
    }
}

/// Where an entry happened: on a stream of a device, or on a host thread.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    /// A stream; `device` is the device's display name (`host`, `cuda:0`).
    Stream {
        /// The device's display name.
        device: String,
        /// The stream.
        stream: StreamId,
    },
    /// A host thread, numbered in the order the trace first saw it.
    Thread {
        /// The thread's number in this trace (from 1).
        id: u64,
        /// The thread's name, if it has one.
        name: String,
    },
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lane::Stream { device, stream } => write!(f, "{device} stream {stream}"),
            Lane::Thread { id, name } => write!(f, "thread {id} ({name})"),
        }
    }
}

/// One recorded thing. Times are microseconds since the trace started; `None` when the
/// work's timestamps could not be resolved (it failed).
#[derive(Debug, Clone)]
pub struct TraceEntry {
    /// What it is.
    pub kind: EntryKind,
    /// The kernel's name, the copy's call, the op's name, or the event's number (`e12`).
    pub name: String,
    /// Where it happened.
    pub lane: Lane,
    /// When it began.
    pub start_us: Option<f64>,
    /// How long it took (0 for points).
    pub dur_us: Option<f64>,
    /// Details (`grid`, `block`, `bytes`, `event`, `from_stream`, ...).
    pub args: Vec<(&'static str, String)>,
    /// This entry's number in the trace (op spans are referred to by it).
    pub id: u64,
    /// For op spans, the enclosing op span; for stream work, event records and waits, the op
    /// span the enqueuing thread was in.
    pub parent: Option<u64>,
    /// For event records and waits, the event's number.
    pub event: Option<u64>,
}

impl TraceEntry {
    /// The value of argument `key`, if present.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    /// When it ended (`start_us + dur_us`).
    pub fn end_us(&self) -> Option<f64> {
        Some(self.start_us? + self.dur_us?)
    }
}

/// A recorded trace: what [`crate::trace::stop`] returns.
///
/// Entries are in the order they were enqueued on each lane. See the module docs of
/// [`crate::trace`] for an example.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub(crate) entries: Vec<TraceEntry>,
}

impl Trace {
    /// Every entry, in the order recorded (by [`TraceEntry::id`]).
    pub fn entries(&self) -> &[TraceEntry] {
        &self.entries
    }

    /// The stream lanes that ran work, in order of first use.
    pub fn stream_lanes(&self) -> Vec<&Lane> {
        let mut lanes: Vec<&Lane> = Vec::new();
        for e in &self.entries {
            if e.kind.is_stream_work() && !lanes.contains(&&e.lane) {
                lanes.push(&e.lane);
            }
        }
        lanes
    }

    /// The op spans (kind [`EntryKind::Op`]).
    pub fn op_spans(&self) -> impl Iterator<Item = &TraceEntry> {
        self.entries.iter().filter(|e| e.kind == EntryKind::Op)
    }

    /// The entry numbered `id`.
    pub fn entry(&self, id: u64) -> Option<&TraceEntry> {
        // Entries are kept in id order.
        self.entries
            .binary_search_by_key(&id, |e| e.id)
            .ok()
            .map(|i| &self.entries[i])
    }

    /// The names of the op spans enclosing `entry`, outermost first (`sync > zip branch 1`).
    pub fn op_path(&self, entry: &TraceEntry) -> Vec<&str> {
        let mut path = Vec::new();
        let mut at = entry.parent;
        while let Some(id) = at {
            match self.entry(id) {
                Some(op) => {
                    path.push(op.name.as_str());
                    at = op.parent;
                }
                None => break,
            }
        }
        path.reverse();
        path
    }
}

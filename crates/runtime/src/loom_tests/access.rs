//! The access tracker ([`order_enqueue_record`], [`order_enqueue_record_across`],
//! [`AccessClock`], [`AccessState`]) under loom.
//!
//! Model streams stand in for a backend: each is a queue of entries, the work of a tracked
//! access or a wait on an event of another stream, and an event is a prefix of its stream's
//! queue. Each model stream has a real [`AccessClock`], driven as [`Stream`](crate::Stream)
//! drives its own: stamped when an event is recorded, noted when one is waited on. After the
//! threads have run, the queues say what follows what: the work at a point of a queue follows
//! everything before it in that queue and, transitively, the prefix of every event it waits on.
//!
//! The models check, in every interleaving of two threads accessing buffers from two streams:
//! of two conflicting accesses (a write and any other access), the one enqueued second follows
//! the one enqueued first; two reads never follow each other. A copy staged between devices
//! (work on two streams, a read on one and a write on the other) is ordered the same way.

use std::collections::HashMap;

use loom::model;
use smallvec::SmallVec;

use crate::access::{
    order_enqueue_record, order_enqueue_record_across, Access, AccessClock, AccessState,
    TrackedBuffer, TrackedStream,
};
use crate::error::Result;
use crate::stream::StreamId;
use crate::sync::{Arc, AtomicUsize, Mutex, Ordering};

#[derive(Clone, Copy, Debug)]
enum Entry {
    /// The work of the tracked access `label`, the `ticket`-th enqueued in the model.
    Work { label: &'static str, ticket: usize },
    /// A wait for the first `covers` entries of `stream`'s queue.
    Wait { stream: StreamId, covers: usize },
}

struct ModelStreamInner {
    id: StreamId,
    clock: AccessClock,
    queue: Mutex<Vec<Entry>>,
}

#[derive(Clone)]
struct ModelStream(Arc<ModelStreamInner>);

/// An event of a model stream: the prefix of its queue it covers, and its stamp.
struct ModelEvent {
    stream: StreamId,
    covers: usize,
    seq: u64,
}

impl ModelStream {
    fn new(id: u64) -> Self {
        ModelStream(Arc::new(ModelStreamInner {
            id: StreamId(id),
            clock: AccessClock::new(StreamId(id)),
            queue: Mutex::new(Vec::new()),
        }))
    }

    fn record(&self) -> Result<ModelEvent> {
        let (covers, seq) = self.0.clock.stamp(|| Ok(self.0.queue.lock().len()))?;
        Ok(ModelEvent {
            stream: self.0.id,
            covers,
            seq,
        })
    }

    fn wait(&self, event: &ModelEvent) -> Result<()> {
        self.0.queue.lock().push(Entry::Wait {
            stream: event.stream,
            covers: event.covers,
        });
        self.0.clock.note_waited(event.stream, event.seq);
        Ok(())
    }
}

impl TrackedStream for ModelStream {
    fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    fn clock(&self) -> &AccessClock {
        &self.0.clock
    }

    fn order_after(&self, other: &Self, seq: u64) -> Result<()> {
        self.0.clock.order_after(
            other.0.id,
            seq,
            || other.record().map(Some),
            |event| self.wait(event),
        )
    }

    /// Model streams run nothing while the threads run (their queues are read afterwards):
    /// none is ever idle, and no access is forgotten.
    fn is_idle(&self) -> bool {
        false
    }
}

#[derive(Default)]
struct ModelBuffer {
    state: Mutex<AccessState<ModelStream>>,
}

impl TrackedBuffer for ModelBuffer {
    type Stream = ModelStream;
    type State = AccessState<ModelStream>;

    fn state(&self) -> &Mutex<Self::State> {
        &self.state
    }

    fn access_state(state: &mut Self::State) -> &mut AccessState<ModelStream> {
        state
    }

    fn note_enqueued(&self, _: &mut Self::State, _: &ModelStream, _: Access, _: Option<u64>) {}

    /// Every capture of a model stays open.
    fn capture_open(_: u64) -> bool {
        true
    }

    fn capture_open_here(_: u64) -> bool {
        false
    }
}

/// The streams and buffers of one model, shared by its threads.
struct World {
    streams: Vec<ModelStream>,
    buffers: Vec<ModelBuffer>,
    tickets: AtomicUsize,
}

impl World {
    fn new(streams: u64, buffers: usize) -> Arc<World> {
        Arc::new(World {
            streams: (0..streams).map(ModelStream::new).collect(),
            buffers: (0..buffers).map(|_| ModelBuffer::default()).collect(),
            tickets: AtomicUsize::new(0),
        })
    }

    /// Enqueues the work `label` on stream `stream` through the tracker, using the buffers
    /// `uses` (index, access).
    fn access(&self, stream: usize, uses: &[(usize, Access)], label: &'static str) {
        let stream = &self.streams[stream];
        let accesses: SmallVec<[(&ModelBuffer, Access); 4]> = uses
            .iter()
            .map(|&(buffer, access)| (&self.buffers[buffer], access))
            .collect();
        order_enqueue_record(stream, "model work", None, accesses, || {
            let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
            stream.0.queue.lock().push(Entry::Work { label, ticket });
            Ok(())
        })
        .expect("model streams never fail");
    }

    /// [`World::access`] as captured work of the capture `capture`.
    fn access_in(
        &self,
        capture: u64,
        stream: usize,
        uses: &[(usize, Access)],
        label: &'static str,
    ) {
        let stream = &self.streams[stream];
        let accesses: SmallVec<[(&ModelBuffer, Access); 4]> = uses
            .iter()
            .map(|&(buffer, access)| (&self.buffers[buffer], access))
            .collect();
        order_enqueue_record(stream, "model work", Some(capture), accesses, || {
            let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
            stream.0.queue.lock().push(Entry::Work { label, ticket });
            Ok(())
        })
        .expect("model streams never fail");
    }

    /// Enqueues a copy staged between two devices through the tracker, as `copy.rs` does: a
    /// read of buffer `src` on stream `src_stream` (its work `read`), then, after an event of
    /// it, a write of buffer `dst` on stream `dst_stream` (its work `write`).
    fn staged_copy(
        &self,
        (src_stream, src): (usize, usize),
        (dst_stream, dst): (usize, usize),
        (read, write): (&'static str, &'static str),
    ) {
        let (ss, ds) = (&self.streams[src_stream], &self.streams[dst_stream]);
        let enqueue = || {
            let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
            let mut queue = ss.0.queue.lock();
            queue.push(Entry::Work {
                label: read,
                ticket,
            });
            let staged = queue.len();
            drop(queue);
            // The join of the two halves is the copy's own event, unknown to the clocks.
            let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
            let mut queue = ds.0.queue.lock();
            queue.push(Entry::Wait {
                stream: ss.0.id,
                covers: staged,
            });
            queue.push(Entry::Work {
                label: write,
                ticket,
            });
            Ok(())
        };
        order_enqueue_record_across(
            (ss, &self.buffers[src]),
            (ds, &self.buffers[dst]),
            "model copy",
            enqueue,
        )
        .expect("model streams never fail");
    }

    fn queues(&self) -> Queues {
        Queues(
            self.streams
                .iter()
                .map(|s| (s.0.id, s.0.queue.lock().clone()))
                .collect(),
        )
    }
}

/// The queues of the model streams once every thread has finished.
struct Queues(Vec<(StreamId, Vec<Entry>)>);

impl Queues {
    /// The stream, position and ticket of the work `label`.
    fn find(&self, label: &str) -> (StreamId, usize, usize) {
        for (id, queue) in &self.0 {
            for (at, entry) in queue.iter().enumerate() {
                if let Entry::Work { label: l, ticket } = entry {
                    if *l == label {
                        return (*id, at, *ticket);
                    }
                }
            }
        }
        panic!("no work {label} in {:?}", self.0)
    }

    /// Whether the work `later` follows the work `earlier`: `earlier` lies in a prefix of some
    /// queue that `later` waits for, directly or through other waits.
    fn follows(&self, later: &str, earlier: &str) -> bool {
        let (stream, at, _) = self.find(later);
        let (e_stream, e_at, _) = self.find(earlier);
        // Per stream, how long a prefix of its queue `later` follows.
        let mut covered: HashMap<StreamId, usize> = HashMap::from([(stream, at)]);
        let mut grew = true;
        while grew {
            grew = false;
            for (id, queue) in &self.0 {
                let prefix = covered.get(id).copied().unwrap_or(0);
                for entry in &queue[..prefix] {
                    if let Entry::Wait { stream, covers } = *entry {
                        let c = covered.entry(stream).or_insert(0);
                        if *c < covers {
                            *c = covers;
                            grew = true;
                        }
                    }
                }
            }
        }
        covered.get(&e_stream).is_some_and(|&c| c > e_at)
    }

    /// Asserts that of the conflicting accesses `a` and `b`, the one enqueued second follows
    /// the one enqueued first.
    fn assert_ordered(&self, a: &str, b: &str) {
        let (first, second) = if self.find(a).2 < self.find(b).2 {
            (a, b)
        } else {
            (b, a)
        };
        assert!(
            self.follows(second, first),
            "{second} was enqueued after {first} without following it: {:?}",
            self.0
        );
    }
}

#[test]
fn a_write_follows_a_write_of_another_stream() {
    model(|| {
        let world = World::new(2, 1);
        let other = world.clone();
        let t = loom::thread::spawn(move || other.access(1, &[(0, Access::Write)], "w1"));
        world.access(0, &[(0, Access::Write)], "w0");
        t.join().unwrap();
        world.queues().assert_ordered("w0", "w1");
    });
}

#[test]
fn a_read_and_a_write_of_two_streams_follow_each_other_in_enqueue_order() {
    model(|| {
        let world = World::new(2, 1);
        let other = world.clone();
        let t = loom::thread::spawn(move || other.access(1, &[(0, Access::Read)], "r1"));
        world.access(0, &[(0, Access::Write)], "w0");
        t.join().unwrap();
        world.queues().assert_ordered("w0", "r1");
    });
}

#[test]
fn reads_of_two_streams_follow_the_last_write_not_each_other() {
    model(|| {
        let world = World::new(3, 1);
        world.access(2, &[(0, Access::Write)], "w2");
        let other = world.clone();
        let t = loom::thread::spawn(move || other.access(1, &[(0, Access::Read)], "r1"));
        world.access(0, &[(0, Access::Read)], "r0");
        t.join().unwrap();
        let queues = world.queues();
        assert!(queues.follows("r0", "w2") && queues.follows("r1", "w2"));
        assert!(
            !queues.follows("r0", "r1") && !queues.follows("r1", "r0"),
            "two reads were ordered: {:?}",
            queues.0
        );
    });
}

/// The "already waited up to" bookkeeping: stream 1 waits on an event of stream 0 (for x)
/// while stream 0 enqueues a write of y; the event's stamp must not cover that write, or
/// stream 1's read of y would skip the wait it needs.
#[test]
fn an_event_stamp_covers_only_work_enqueued_before_the_event() {
    model(|| {
        let world = World::new(2, 2);
        world.access(0, &[(0, Access::Write)], "wx");
        let other = world.clone();
        let t = loom::thread::spawn(move || other.access(0, &[(1, Access::Write)], "wy"));
        world.access(1, &[(0, Access::Read)], "rx");
        world.access(1, &[(1, Access::Read)], "ry");
        t.join().unwrap();
        let queues = world.queues();
        queues.assert_ordered("wx", "rx");
        queues.assert_ordered("wy", "ry");
    });
}

/// Two accesses naming two buffers in opposite orders lock them in one (address) order: no
/// deadlock, and both conflicts are ordered the same way.
#[test]
fn accesses_of_several_buffers_lock_them_in_one_order() {
    model(|| {
        let world = World::new(2, 2);
        let other = world.clone();
        let t = loom::thread::spawn(move || {
            other.access(1, &[(1, Access::Write), (0, Access::Read)], "b");
        });
        world.access(0, &[(0, Access::Write), (1, Access::Read)], "a");
        t.join().unwrap();
        world.queues().assert_ordered("a", "b");
    });
}

/// A copy staged between two devices reads its source on one stream and writes its
/// destination on another: a write of the source on a third stream, made while the copy is
/// being enqueued, follows the copy's read or precedes it, and so does a later write of that
/// stream, made once the copy was enqueued.
#[test]
fn a_staged_copy_and_a_write_of_its_source_follow_each_other() {
    model(|| {
        let world = World::new(3, 2);
        let other = world.clone();
        let t = loom::thread::spawn(move || other.access(2, &[(0, Access::Write)], "w"));
        world.staged_copy((0, 0), (1, 1), ("read", "write"));
        t.join().unwrap();
        world.access(2, &[(0, Access::Write)], "w2");
        let queues = world.queues();
        queues.assert_ordered("read", "w");
        queues.assert_ordered("read", "w2");
        assert!(queues.follows("write", "read"));
    });
}

/// Two copies staged in opposite directions between two buffers lock them in one order: no
/// deadlock, and each copy's read follows the other's write or precedes it.
#[test]
fn staged_copies_in_opposite_directions_lock_in_one_order() {
    model(|| {
        let world = World::new(4, 2);
        let other = world.clone();
        let t = loom::thread::spawn(move || {
            other.staged_copy((2, 1), (3, 0), ("b.read", "b.write"));
        });
        world.staged_copy((0, 0), (1, 1), ("a.read", "a.write"));
        t.join().unwrap();
        let queues = world.queues();
        queues.assert_ordered("a.read", "b.write");
        queues.assert_ordered("a.write", "b.read");
    });
}

/// Two captures open at once touch one buffer: the second capture's read, on another stream,
/// does not erase what the first capture recorded, so the first capture's later read on a
/// third stream still follows the first capture's write.
#[test]
fn two_open_captures_keep_their_own_hazards() {
    model(|| {
        let w = World::new(3, 1);
        w.access_in(1, 0, &[(0, Access::Write)], "write in capture 1");
        w.access_in(2, 1, &[(0, Access::Read)], "read in capture 2");
        w.access_in(1, 2, &[(0, Access::Read)], "read in capture 1");
        w.queues()
            .assert_ordered("write in capture 1", "read in capture 1");
    });
}

//! A rank's mailbox: the messages other ranks sent it, queued per sender, and the receive with
//! a deadline that every host transport shares.
//!
//! Messages from one sender are matched by tag in the order they arrived. A sender whose link
//! broke is marked closed: a receive from it fails at once instead of waiting out its deadline.
//! A receive that failed leaves the ranks out of step (a late message would be taken for the
//! next collective's), so the mailbox is then broken for good: every later receive fails at
//! once, saying why, and the program makes a new communicator. A sender whose communicator
//! broke so says with a message of [`ABORT_TAG`]: its messages still queued here (its part of
//! the collective that failed there among them) are dropped, and receives from it fail at once.
//! A sender that gave up a call before sending anything of it says so with [`CLOSE_TAG`]: what
//! it sent before is still taken, and only receives that find nothing more fail.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use cuflow_runtime::DeviceError;
use parking_lot::{Condvar, Mutex};

#[derive(Default)]
struct Slot {
    queue: VecDeque<(u64, Vec<u8>)>,
    closed: Option<String>,
}

/// The tag of the message a rank sends its peers when its communicator broke (the runtime's
/// tags never reach it); its bytes say why.
pub(crate) const ABORT_TAG: u64 = u64::MAX;

/// The tag of the message a rank sends its peers when it gave up a collective call before
/// sending anything of it: what it sent before stands, and receives from it fail once that
/// is taken.
pub(crate) const CLOSE_TAG: u64 = u64::MAX - 1;

/// The messages sent to one rank.
pub(crate) struct Mailbox {
    rank: usize,
    slots: Mutex<Vec<Slot>>,
    arrived: Condvar,
    /// The first failed receive, after which every receive fails.
    broken: Mutex<Option<DeviceError>>,
}

impl Mailbox {
    pub(crate) fn new(rank: usize, world_size: usize) -> Mailbox {
        Mailbox {
            rank,
            slots: Mutex::new((0..world_size).map(|_| Slot::default()).collect()),
            arrived: Condvar::new(),
            broken: Mutex::new(None),
        }
    }

    /// Queues a message from rank `from`; one of [`ABORT_TAG`] drops the queue and fails
    /// every later receive from `from`, one of [`CLOSE_TAG`] fails the receives from `from`
    /// that find no message queued.
    pub(crate) fn deliver(&self, from: usize, tag: u64, data: Vec<u8>) {
        if let Some(slot) = self.slots.lock().get_mut(from) {
            if tag == CLOSE_TAG {
                let why = String::from_utf8_lossy(&data);
                slot.closed.get_or_insert_with(|| {
                    format!("{why}, which left the ranks out of step; make a new communicator")
                });
            } else if tag == ABORT_TAG {
                slot.queue.clear();
                let why = String::from_utf8_lossy(&data);
                slot.closed = Some(format!(
                    "a collective failed there ({why}), which left the ranks out of step; make \
                     a new communicator"
                ));
            } else {
                slot.queue.push_back((tag, data));
            }
        }
        self.arrived.notify_all();
    }

    /// Marks rank `from` as gone: receives from it fail with `reason`.
    pub(crate) fn close(&self, from: usize, reason: String) {
        if let Some(slot) = self.slots.lock().get_mut(from) {
            slot.closed.get_or_insert(reason);
        }
        self.arrived.notify_all();
    }

    /// The oldest message tagged `tag` from rank `from`, waiting up to `timeout` for it.
    pub(crate) fn take(
        &self,
        from: usize,
        tag: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, DeviceError> {
        if let Some(first) = &*self.broken.lock() {
            return Err(DeviceError::Collective {
                op: "receive",
                rank: self.rank,
                reason: format!(
                    "an earlier collective of this communicator failed ({first}), which left \
                     its ranks out of step; make a new communicator"
                ),
            });
        }
        let result = self.wait_for(from, tag, timeout);
        if let Err(e) = &result {
            self.broken.lock().get_or_insert_with(|| e.clone());
        }
        result
    }

    fn wait_for(&self, from: usize, tag: u64, timeout: Duration) -> Result<Vec<u8>, DeviceError> {
        // A timeout past what the clock can represent waits as long as it takes.
        let deadline = Instant::now().checked_add(timeout);
        let mut slots = self.slots.lock();
        loop {
            let Some(slot) = slots.get_mut(from) else {
                return Err(DeviceError::internal(
                    "a receive from a rank outside the world",
                ));
            };
            if let Some(i) = slot.queue.iter().position(|(t, _)| *t == tag) {
                if let Some((_, data)) = slot.queue.remove(i) {
                    return Ok(data);
                }
            }
            if let Some(reason) = &slot.closed {
                return Err(DeviceError::Collective {
                    op: "receive",
                    rank: self.rank,
                    reason: format!("rank {from}: {reason}"),
                });
            }
            let timed_out = match deadline {
                Some(deadline) => self.arrived.wait_until(&mut slots, deadline).timed_out(),
                None => {
                    self.arrived.wait(&mut slots);
                    false
                }
            };
            if timed_out {
                return Err(DeviceError::Timeout {
                    what: format!("rank {} waiting for a message from rank {from}", self.rank),
                    waited_ms: crate::config::millis(timeout),
                });
            }
        }
    }
}

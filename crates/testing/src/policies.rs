//! Scheduling policies that misbehave on purpose, for the tests of what the library does with
//! a user's policy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError, Event, Stream};
use cuflow_scheduler::{Placement, SchedulingPolicy, StreamPoolRoundRobin};

/// Where a [`Panicking`] policy panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanicAt {
    /// In `device()`, from its second call on (the first lets the policy be handed over).
    Device,
    /// Placing the root of an op.
    Root,
    /// Placing a branch.
    Branch,
    /// Hearing of enqueued work.
    OnEnqueued,
}

impl PanicAt {
    /// Every place, in the order above.
    pub const ALL: [PanicAt; 4] = [
        PanicAt::Device,
        PanicAt::Root,
        PanicAt::Branch,
        PanicAt::OnEnqueued,
    ];
}

/// A round-robin policy over a pool of streams that panics at one place ([`PanicAt`]); each
/// panic message starts with "the policy panics".
#[derive(Clone, Debug)]
pub struct Panicking {
    inner: StreamPoolRoundRobin,
    at: PanicAt,
    device_calls: Arc<AtomicUsize>,
}

impl Panicking {
    /// A policy over `streams` new streams of `device` that panics at `at`.
    ///
    /// # Errors
    ///
    /// The error of creating the streams.
    pub fn new(device: &Device, streams: usize, at: PanicAt) -> Result<Panicking, DeviceError> {
        Ok(Panicking {
            inner: StreamPoolRoundRobin::new(device, streams)?,
            at,
            device_calls: Arc::default(),
        })
    }
}

impl SchedulingPolicy for Panicking {
    fn device(&self) -> &Device {
        let n = self.device_calls.fetch_add(1, Ordering::SeqCst);
        if self.at == PanicAt::Device && n >= 1 {
            panic!("the policy panics naming its device");
        }
        self.inner.device()
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        match (self.at, request.branch) {
            (PanicAt::Root, None) | (PanicAt::Branch, Some(_)) => {
                panic!("the policy panics placing work")
            }
            _ => self.inner.place(request),
        }
    }

    fn on_enqueued(&self, stream: &Stream, done: &Event) {
        if self.at == PanicAt::OnEnqueued {
            panic!("the policy panics hearing of work");
        }
        self.inner.on_enqueued(stream, done);
    }
}

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

/// A policy that places the root on one of its streams at random, and each branch on its
/// parent's stream or on one of its streams at random: every shape of placement (branches kept
/// on their parent's stream, nested branches on their grandparent's, siblings sharing a
/// stream) comes up, from a seed. Streams that are being captured are skipped, as the library's
/// policies do.
#[derive(Clone, Debug)]
pub struct RandomPlacement {
    device: Device,
    streams: Vec<Stream>,
    rng: Arc<std::sync::Mutex<rand::rngs::StdRng>>,
}

impl RandomPlacement {
    /// A policy over `streams` new streams of `device`, drawing from `seed`.
    ///
    /// # Errors
    ///
    /// The error of creating the streams.
    pub fn new(device: &Device, streams: usize, seed: u64) -> Result<RandomPlacement, DeviceError> {
        Ok(RandomPlacement {
            device: device.clone(),
            streams: crate::device::new_streams(device, streams.max(1))?,
            rng: Arc::new(std::sync::Mutex::new(crate::rng::seeded_rng(seed))),
        })
    }
}

impl SchedulingPolicy for RandomPlacement {
    fn device(&self) -> &Device {
        &self.device
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        use rand::Rng;
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(parent) = request.parent {
            if rng.gen_bool(0.4) {
                return Ok(parent.clone());
            }
        }
        let free: Vec<&Stream> = self.streams.iter().filter(|s| !s.is_capturing()).collect();
        match free.len() {
            0 => self.device.new_stream(),
            n => Ok(free[rng.gen_range(0..n)].clone()),
        }
    }
}

//! Capture isolation: a capture records exactly the op being captured.
//!
//! A capture never runs on a stream that anyone else is handed. The op is captured on private
//! streams: each stream the policy in force picks (the root included) is mirrored by a stream
//! of the same device and priority that only this capture uses, taken from a per-device
//! reserve and given back when the capture ends. The policy still decides the shape of the
//! graph (how many streams, which priorities), but no other thread's work can land on a
//! capturing stream, and no other thread's op can be placed on one, so nothing of theirs is
//! recorded, and nothing of theirs waits on work that never runs.
//!
//! On CUDA the capture itself runs in the driver's *relaxed* capture mode (see the runtime's
//! CUDA backend): the runtime refuses what cannot be captured (host waits, pageable copies)
//! itself, on the capturing thread only, and other threads' driver calls, including module
//! loads and allocations, are never refused because some thread is capturing. As a last line,
//! the runtime refuses work that a thread other than the capturing one aims at a capturing
//! stream (`DeviceError::Capture`).

use std::fmt;
use std::sync::Arc;

use cuflow_runtime::{Device, DeviceError, Event, Stream};
use cuflow_scheduler::{Placement, SchedulingPolicy};
use parking_lot::Mutex;

/// Streams of one device kept for captures, given out to one capture at a time.
#[derive(Default)]
struct CaptureReserve {
    free: Mutex<Vec<Stream>>,
}

impl CaptureReserve {
    fn take(device: &Device, priority: i32) -> Result<Stream, DeviceError> {
        let reserve = device.extension(CaptureReserve::default);
        let mut free = reserve.free.lock();
        if let Some(pos) = free.iter().position(|s| s.priority() == priority) {
            return Ok(free.swap_remove(pos));
        }
        drop(free);
        device.new_stream_for_captures(priority)
    }

    fn give_back(stream: Stream) {
        if stream.is_capturing() {
            // Still part of a capture that failed to end: never hand it out again.
            return;
        }
        let reserve = stream.device().extension(CaptureReserve::default);
        reserve.free.lock().push(stream);
    }
}

/// The policy a capture runs under: the user's policy, with every stream it picks replaced by
/// the capture's private mirror of it.
pub(crate) struct IsolatedPolicy {
    inner: Arc<dyn SchedulingPolicy>,
    /// (stream the inner policy picked, private mirror) pairs.
    mirrors: Mutex<Vec<(Stream, Stream)>>,
}

impl IsolatedPolicy {
    pub(crate) fn new(inner: Arc<dyn SchedulingPolicy>) -> Arc<Self> {
        Arc::new(IsolatedPolicy {
            inner,
            mirrors: Mutex::new(Vec::new()),
        })
    }

    /// The private stream standing for `public` in this capture.
    pub(crate) fn mirror(&self, public: &Stream) -> Result<Stream, DeviceError> {
        let mut mirrors = self.mirrors.lock();
        if let Some((_, private)) = mirrors.iter().find(|(p, _)| p == public) {
            return Ok(private.clone());
        }
        // A private stream asked for again (a policy given the private parent back).
        if mirrors.iter().any(|(_, private)| private == public) {
            return Ok(public.clone());
        }
        let private = CaptureReserve::take(public.device(), public.priority())?;
        mirrors.push((public.clone(), private.clone()));
        Ok(private)
    }

    /// Gives the private streams back to their devices' reserves.
    pub(crate) fn release(&self) {
        for (_, private) in std::mem::take(&mut *self.mirrors.lock()) {
            CaptureReserve::give_back(private);
        }
    }
}

impl SchedulingPolicy for IsolatedPolicy {
    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn place(&self, request: &Placement<'_>) -> Result<Stream, DeviceError> {
        let public = self.inner.place(request)?;
        self.mirror(&public)
    }

    fn on_enqueued(&self, _stream: &Stream, _done: &Event) {
        // The private streams are not the inner policy's: its load figures stay its own.
    }
}

impl fmt::Debug for IsolatedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IsolatedPolicy")
            .field("inner", &self.inner)
            .field("streams", &self.mirrors.lock().len())
            .finish()
    }
}

//! [`Event`]: a point in a stream's work, recorded by [`Stream::record_event`] and waited
//! for by [`Stream::wait_event`] (another stream) or [`Event::synchronize`] (the host).
//!
//! An event also carries what the runtime's ordering needs: the stream it was recorded on, that
//! stream's access count at the time (see [`crate::access`]), and the capture it was recorded
//! in, if any (such an event only orders captured work and never completes by itself).

use std::fmt;
use std::sync::Arc;

use crate::backend::EventBackend;
use crate::capture::CaptureSession;
use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::stream::{Stream, StreamId};

pub(crate) struct EventInner {
    pub(crate) device: Device,
    pub(crate) stream: StreamId,
    /// The recording stream's access count when the event was recorded.
    pub(crate) seq: u64,
    pub(crate) timed: bool,
    pub(crate) capture: Option<Arc<CaptureSession>>,
    pub(crate) backend: EventBackend,
    /// The event's number in the trace being recorded when it was recorded; 0 when untraced.
    pub(crate) trace_id: u64,
}

/// A point in a stream's work. Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Event {
    pub(crate) inner: Arc<EventInner>,
}

impl Event {
    /// Whether all work before the event has finished.
    ///
    /// # Errors
    ///
    /// The error that work hit, if it failed; [`DeviceError::Capture`] for an event recorded
    /// during a capture (its work runs only in replays of the graph, so it never completes by
    /// itself), as [`Event::synchronize`].
    pub fn is_complete(&self) -> Result<bool> {
        if self.inner.capture.is_some() {
            return Err(captured("Event::is_complete"));
        }
        self.inner.backend.is_complete()
    }

    /// Blocks until the event has completed. Like [`Stream::synchronize`], it then releases
    /// what host functions on the event's device dropped (see [`Stream::enqueue_host_fn`]).
    ///
    /// # Errors
    ///
    /// The error the work before the event hit, or [`DeviceError::Capture`] for an event
    /// recorded during a capture (it never completes on its own).
    pub fn synchronize(&self) -> Result<()> {
        if self.inner.capture.is_some() {
            return Err(captured("Event::synchronize"));
        }
        let _traced = crate::trace::HostWait::begin("Event::synchronize");
        self.inner.backend.synchronize()
    }

    /// Milliseconds between `self` and a later event `end`; both must be timed
    /// ([`Stream::record_timed_event`]) and complete.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] when an event is not timed or not complete,
    /// [`DeviceError::Capture`] when an event was recorded during a capture (it stands for work
    /// that runs only in the graph's replays), [`DeviceError::DeviceMismatch`] when the events
    /// belong to different devices, or a driver error.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        if self.inner.capture.is_some() || end.inner.capture.is_some() {
            return Err(captured("Event::elapsed_ms"));
        }
        if !self.inner.timed || !end.inner.timed {
            return Err(DeviceError::usage(
                "Event::elapsed_ms needs two timed events: record them with \
                 Stream::record_timed_event",
            ));
        }
        // CUDA refuses events of two contexts; two host devices are refused alike.
        if self.inner.device != end.inner.device {
            return Err(DeviceError::device_mismatch(
                "Event::elapsed_ms",
                "the end event",
                &self.inner.device,
                &end.inner.device,
            ));
        }
        self.inner.backend.elapsed_ms(&end.inner.backend)
    }

    /// Whether the event was recorded during a capture: it then stands for captured work,
    /// orders only the work of that capture, and never completes by itself.
    pub fn is_captured(&self) -> bool {
        self.inner.capture.is_some()
    }

    /// Whether the event was recorded during the capture that `stream` takes part in now:
    /// only that capture's work can be ordered after it.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_runtime::Device;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let device = Device::host();
    /// let (s, t) = (device.new_stream()?, device.new_stream()?);
    /// s.begin_capture()?;
    /// let event = s.record_event()?;
    /// assert!(event.is_captured_with(&s) && !event.is_captured_with(&t));
    /// s.end_capture()?;
    /// assert!(!event.is_captured_with(&s), "that capture has ended");
    /// # Ok(()) }
    /// ```
    pub fn is_captured_with(&self, stream: &Stream) -> bool {
        match (&self.inner.capture, stream.capture_session()) {
            (Some(ours), Some(theirs)) => Arc::ptr_eq(ours, &theirs),
            _ => false,
        }
    }

    /// The device the event belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The stream the event was recorded on.
    pub fn stream_id(&self) -> StreamId {
        self.inner.stream
    }
}

/// The error of a host wait or query `op` on an event recorded during a capture.
fn captured(op: &str) -> DeviceError {
    DeviceError::Capture {
        op: op.into(),
        reason: "the event was recorded during a capture and only orders captured work".into(),
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.inner.device)
            .field("stream", &self.inner.stream.0)
            .field("timed", &self.inner.timed)
            .finish()
    }
}

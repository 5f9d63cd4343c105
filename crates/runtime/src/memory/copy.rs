//! Copies between devices: peer-to-peer between CUDA devices that can reach each other,
//! staged through pinned host memory otherwise, and through the host backend's storage between
//! a host device and a CUDA device. Each is ordered like every other access
//! ([`crate::access`]).

use smallvec::smallvec;

use super::{check_len, BufferView, DeviceCopy};
use crate::access::{ordered_copy, ordered_copy_across, Access, Accesses};
#[cfg(doc)]
use crate::error::DeviceError;
use crate::error::Result;
use crate::stream::Stream;

impl<T: DeviceCopy> BufferView<'_, T> {
    /// Copies `src` (same length), which may live on another device, into this view on
    /// `stream`, a stream of this view's device.
    ///
    /// The copy is ordered after all work enqueued so far that used `src` or this view's
    /// buffer, on any stream of either device, and both buffers record it, so that later
    /// reads wait for it and neither is freed before it has finished. How it runs depends on
    /// the two devices:
    ///
    /// - **the same device**: a device copy on `stream`, as [`BufferView::copy_from`];
    /// - **two CUDA devices that can access each other** ([`Device::can_access_peer`](crate::Device::can_access_peer)): a peer
    ///   copy (`cuMemcpyPeerAsync`) on `stream`, over NVLink or PCIe; peer access is enabled
    ///   at the first such copy between the two devices (where the driver then refuses it, for
    ///   too many peers, the copy is staged);
    /// - **two CUDA devices without peer access**: staged through pinned host memory, chunk by
    ///   chunk: device to host on a stream of `src`'s device, then host to device on `stream`,
    ///   joined by events (as [`BufferView::copy_from_device_staged`]);
    /// - **two host devices**: a copy on `stream`'s worker;
    /// - **a host device and a CUDA device**: through the host backend's storage. This one
    ///   waits: for `src`'s pending work and, from a CUDA buffer, for the copy out of it.
    ///
    /// Except between host and CUDA devices, it does not wait: the calling thread returns as
    /// soon as the copy is enqueued.
    ///
    /// # Errors
    ///
    /// [`DeviceError::DeviceMismatch`] when `stream` is not of this view's device,
    /// [`DeviceError::LengthMismatch`] when lengths differ, [`DeviceError::Capture`] for a copy
    /// between two devices on a stream being captured (it cannot be recorded into a graph:
    /// copy before or after the capture), or a driver error.
    pub fn copy_from_device(&self, stream: &Stream, src: BufferView<'_, T>) -> Result<()> {
        self.copy_between_devices(stream, src, false, "copy_from_device")
    }

    /// Like [`BufferView::copy_from_device`], but a copy between two CUDA devices is always
    /// staged through pinned host memory, even where a peer copy is possible: to compare the
    /// two paths, or where peer copies misbehave. Other pairs of devices copy as with
    /// [`BufferView::copy_from_device`].
    ///
    /// The staging buffers (two of a few MiB, page-locked) belong to the destination device
    /// and are allocated at its first staged copy; staged copies into one device take turns
    /// using them.
    ///
    /// # Errors
    ///
    /// As [`BufferView::copy_from_device`].
    pub fn copy_from_device_staged(&self, stream: &Stream, src: BufferView<'_, T>) -> Result<()> {
        self.copy_between_devices(stream, src, true, "copy_from_device_staged")
    }

    fn copy_between_devices(
        &self,
        stream: &Stream,
        src: BufferView<'_, T>,
        force_staged: bool,
        op: &'static str,
    ) -> Result<()> {
        self.mem.check_device(stream, op, "the destination")?;
        check_len(op, self.len, src.len)?;
        if src.mem.device == self.mem.device {
            return self.copy_from(stream, src);
        }
        stream.forbid_in_capture(op)?;
        let (from, to) = (src.region(), self.region());
        if src.device().kind() == self.device().kind() {
            // Two devices of one backend: a direct copy where this device reads the source's
            // memory (host devices always; CUDA devices with peer access), else staged.
            if stream
                .backend()
                .copies_directly_from(src.mem, force_staged)?
            {
                let accesses: Accesses<'_> =
                    smallvec![(self.mem, Access::Write), (src.mem, Access::Read)];
                return ordered_copy(stream, op, to.len, accesses, || {
                    stream.backend().copy_device(from, to)
                });
            }
            let staging = src.mem.device.staging_stream()?;
            // The source is read on the staging stream, the destination written on `stream`;
            // the staged copy joins the two with events, and both accesses are recorded with
            // its chunks enqueued on both streams.
            return ordered_copy_across(
                (&staging, src.mem),
                (stream, self.mem),
                op,
                to.len,
                || stream.backend().copy_staged(staging.backend(), from, to),
            );
        }
        // Across backends, through host memory.
        match src.mem.backend.host() {
            // The host backend's storage is host memory: once the work using it is done, the
            // stream copies straight from it (the copy has taken the bytes when it returns).
            Some(storage) => {
                src.mem.wait_for_uses()?;
                ordered_copy(
                    stream,
                    op,
                    to.len,
                    smallvec![(self.mem, Access::Write)],
                    || {
                        let words = storage.read();
                        let bytes: &[u8] = bytemuck::cast_slice(&words[..]);
                        stream
                            .backend()
                            .copy_from_host(to, &bytes[from.offset..from.offset + from.len])
                    },
                )
            }
            // A GPU's memory is read into host memory first, on a stream of its device.
            None => {
                let reader = src.mem.device.staging_stream()?;
                let mut data = vec![T::zeroed(); src.len];
                src.copy_to_host(&reader, &mut data)?;
                let staged = stream
                    .backend()
                    .stage_from_host(bytemuck::cast_slice(&data))?;
                ordered_copy(
                    stream,
                    op,
                    to.len,
                    smallvec![(self.mem, Access::Write)],
                    || stream.backend().upload(to, staged),
                )
            }
        }
    }
}

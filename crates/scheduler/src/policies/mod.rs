//! The policies cuflow ships, one per file. Users can write their own by implementing
//! [`SchedulingPolicy`](crate::SchedulingPolicy).

mod least_loaded;
mod multi_device;
mod priority;
mod round_robin;
mod single_stream;

pub use least_loaded::LeastLoaded;
pub use multi_device::{DeviceSpread, MultiDevice};
pub use priority::Priority;
pub use round_robin::StreamPoolRoundRobin;
pub use single_stream::SingleStream;

use cuflow_runtime::{Device, DeviceError, Stream};

/// Creates `n` streams on `device` (at least one).
pub(crate) fn make_pool(
    device: &Device,
    n: usize,
    priority: Option<i32>,
) -> Result<Vec<Stream>, DeviceError> {
    if n == 0 {
        return Err(DeviceError::usage(
            "a stream pool needs at least one stream; pass n >= 1",
        ));
    }
    (0..n)
        .map(|_| match priority {
            Some(p) => device.new_stream_with_priority(p),
            None => device.new_stream(),
        })
        .collect()
}

/// The first stream of `streams`, from index `start` on (wrapping), that is not being captured
/// into a graph: a capture records the work enqueued on its streams, so no policy hands one to
/// other work. When every stream is capturing, the one at `start` (work enqueued there is then
/// refused with a clear error rather than recorded).
pub(crate) fn skip_capturing(streams: &[Stream], start: usize) -> Option<&Stream> {
    let n = streams.len();
    (0..n)
        .map(|k| &streams[(start + k) % n])
        .find(|s| !s.is_capturing())
        .or_else(|| streams.get(start % n.max(1)))
}

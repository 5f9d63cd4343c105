//! Work of other devices that reads or writes this device's memory: a peer copy enqueued on a
//! stream of another device reads this device's memory through peer access, where no stream
//! of this device orders it.
//!
//! A reset of this device (`CudaDevice::reset`, after a fault) frees all of its memory, and a
//! later allocation of the new context may reuse the addresses, so such work must have
//! finished before the reset. Each piece of it is noted here, as an event recorded right after
//! it on its own stream, while this device's state is held (its `Life::gate`, read), so that
//! a reset (which takes the gate for writing) sees every piece enqueued before it, and none
//! is enqueued after it (the state is retired, and the copy refused). The reset then waits for
//! them, for a bounded time, and is refused while any is still running.
//!
//! An event whose device faulted or was reset counts as finished: that device runs none of
//! its work again.

use std::time::{Duration, Instant};

use super::stream::CudaEventHandle;
use crate::error::{DeviceError, Result};

/// The pieces of other devices' work noted on one device (see the [module](self)), each by a
/// value `T` that says whether it finished (an event of its stream).
pub(crate) struct ForeignUses<T = CudaEventHandle> {
    pending: Vec<T>,
    /// The length at which finished entries are dropped next: twice the length left by the
    /// last pruning, so that each note looks at a bounded number of entries on average.
    prune_at: usize,
}

/// The fewest entries worth pruning.
const PRUNE_MIN: usize = 8;

impl<T> Default for ForeignUses<T> {
    fn default() -> Self {
        ForeignUses {
            pending: Vec::new(),
            prune_at: PRUNE_MIN,
        }
    }
}

impl<T> ForeignUses<T> {
    /// Notes `work`; drops the entries `finished` says have finished, now and then (an entry
    /// it cannot tell about is kept).
    pub(crate) fn note(&mut self, work: T, mut finished: impl FnMut(&T) -> Result<bool>) {
        self.pending.push(work);
        if self.pending.len() >= self.prune_at {
            self.pending.retain(|w| !matches!(finished(w), Ok(true)));
            self.prune_at = (2 * self.pending.len()).max(PRUNE_MIN);
        }
    }

    /// Takes every entry noted so far, leaving none.
    pub(crate) fn take(&mut self) -> Vec<T> {
        self.prune_at = PRUNE_MIN;
        std::mem::take(&mut self.pending)
    }

    /// Puts back entries taken with [`ForeignUses::take`] that have not finished.
    pub(crate) fn restore(&mut self, unfinished: Vec<T>) {
        self.pending.extend(unfinished);
        self.prune_at = (2 * self.pending.len()).max(PRUNE_MIN);
    }

    /// How many entries are noted.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.pending.len()
    }
}

/// Whether the work an event follows has finished: a query's answer (`Ok`), where an event of
/// a device that faulted or was reset counts as finished, since that device runs none of its
/// work again.
pub(crate) fn finished(query: Result<bool>) -> Result<bool> {
    match query {
        Err(DeviceError::DeviceFaulted { .. }) => Ok(true),
        other => other,
    }
}

/// Waits until `finished` says every entry of `pending` has finished, for at most `timeout`,
/// removing those that have. Returns whether all have (`false`: time ran out, and `pending`
/// holds the rest); the first error of `finished` ends the wait (the entry it concerns is
/// kept).
pub(crate) fn wait_until_finished<T>(
    pending: &mut Vec<T>,
    timeout: Duration,
    mut finished: impl FnMut(&T) -> Result<bool>,
) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(20);
    loop {
        let mut error = None;
        pending.retain(|w| {
            if error.is_some() {
                return true;
            }
            match finished(w) {
                Ok(done) => !done,
                Err(e) => {
                    error = Some(e);
                    true
                }
            }
        });
        if let Some(e) = error {
            return Err(e);
        }
        if pending.is_empty() {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn fault() -> DeviceError {
        DeviceError::DeviceFaulted {
            device: "cuda:1".into(),
            cause: "a trapped kernel".into(),
        }
    }

    #[test]
    fn work_of_a_faulted_or_reset_device_counts_as_finished() {
        assert!(matches!(finished(Ok(true)), Ok(true)));
        assert!(matches!(finished(Ok(false)), Ok(false)));
        assert!(matches!(finished(Err(fault())), Ok(true)));
        assert!(matches!(
            finished(Err(DeviceError::usage("another error"))),
            Err(DeviceError::Usage { .. })
        ));
    }

    #[test]
    fn the_wait_returns_once_every_piece_has_finished() {
        // Each entry finishes after its number of looks.
        let looks: Vec<Cell<u32>> = (0..4).map(Cell::new).collect();
        let mut pending: Vec<&Cell<u32>> = looks.iter().collect();
        let all = wait_until_finished(&mut pending, Duration::from_secs(60), |left| {
            let n = left.get();
            left.set(n.saturating_sub(1));
            Ok(n == 0)
        });
        assert!(matches!(all, Ok(true)));
        assert!(pending.is_empty());
    }

    #[test]
    fn the_wait_is_bounded_and_keeps_what_has_not_finished() {
        // One piece never finishes: the wait ends when its time runs out, keeping it.
        let mut pending = vec![0, 1, 2];
        let all = wait_until_finished(&mut pending, Duration::from_millis(20), |w| Ok(*w != 1));
        assert!(matches!(all, Ok(false)));
        assert_eq!(pending, vec![1]);
    }

    #[test]
    fn an_error_ends_the_wait_and_keeps_the_piece_it_concerns() {
        let mut pending = vec![0, 1, 2];
        let all = wait_until_finished(&mut pending, Duration::from_secs(60), |w| match w {
            1 => Err(DeviceError::usage("a query failed")),
            _ => Ok(true),
        });
        assert!(matches!(all, Err(DeviceError::Usage { .. })));
        assert!(pending.contains(&1));
    }

    #[test]
    fn noted_work_that_finished_is_dropped_and_the_rest_kept() {
        let mut uses = ForeignUses::default();
        for i in 0..1000 {
            uses.note(i, |_| Ok(true));
        }
        assert!(uses.len() < PRUNE_MIN, "{}", uses.len());
        let mut uses = ForeignUses::default();
        for i in 0..100 {
            // Unfinished, or of unknown state: kept.
            uses.note(i, |w| {
                if w % 2 == 0 {
                    Ok(false)
                } else {
                    Err(DeviceError::usage("a query failed"))
                }
            });
        }
        assert_eq!(uses.len(), 100);
        let taken = uses.take();
        assert_eq!(taken.len(), 100);
        assert_eq!(uses.len(), 0);
        uses.restore(taken[..3].to_vec());
        assert_eq!(uses.len(), 3);
    }
}

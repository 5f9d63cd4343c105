//! The host side of copies staged through page-locked memory: the bytes of a staged copy go
//! through the host once more than those of an unstaged one, and one thread moves them at 6 to
//! 10 GB/s on the hosts of H100 and H200 GPUs, several times less than the copy engines. So
//! copies of a megabyte or more are cut into parts, which the calling thread and a few threads
//! kept for the purpose copy at once.
//!
//! The helper threads are a `rayon` pool of the runtime's own, started at the first such copy.
//! The caller does not join that pool's work (`install` or `scope` would have a caller that is
//! itself a worker of another pool run that pool's other work while it waits, and that work
//! might need a lock the caller holds): it hands out helper jobs, copies parts itself, and
//! waits until every part has been copied. The parts sit in one queue, so a helper that starts
//! late finds fewer parts, or none, and the caller waits only for the parts being copied, not
//! for helpers still asleep: at worst the copy takes about as long as on the caller alone.

use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use crate::error::{DeviceError, Result};

/// Copies of at least this many bytes in all are spread over threads.
pub(super) const PARALLEL_HOST_COPY: usize = 1 << 20;

/// The parts a spread copy is cut into.
pub(super) const HOST_COPY_PART: usize = 256 << 10;

/// At most this many threads copy the parts of one copy, the caller included: the host's
/// memory bandwidth is reached with about that many.
const HOST_COPY_THREADS: usize = 8;

/// The helper threads (one fewer than [`HOST_COPY_THREADS`], fewer on a smaller host), started
/// at the first spread copy; `None` on a host of one core, or when they could not be started
/// (every copy is then made by its caller alone).
fn helpers() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(HOST_COPY_THREADS).saturating_sub(1);
        if threads == 0 {
            return None;
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("cuflow-host-copy-{i}"))
            .build()
            .map_err(|e| tracing::warn!("host copies stay on one thread: {e}"))
            .ok()
    })
    .as_ref()
}

/// One part of a spread copy: `len` bytes from `from` to `to`.
struct Part {
    to: *mut u8,
    from: *const u8,
    len: usize,
}

// SAFETY: a part is the address of `len` bytes borrowed uniquely for writing (`to`) and of
// `len` bytes borrowed for reading (`from`) by the `copy_host_bytes` call that made it, which
// does not return before every part has been copied, and so taken from its queue (see there);
// sending it to another thread only moves who copies them.
unsafe impl Send for Part {}

impl Part {
    /// Copies the part.
    fn copy(self) {
        // SAFETY: both ranges are valid for `len` bytes for as long as the `copy_host_bytes`
        // call that made the part runs, which outlasts this copy (see there); `to` is a range
        // of a `&mut` slice, so nothing else reads or writes it meanwhile, and it does not
        // overlap `from` (a shared borrow of other memory).
        unsafe { std::ptr::copy_nonoverlapping(self.from, self.to, self.len) }
    }
}

/// Copies each pair's source into its destination. From [`PARALLEL_HOST_COPY`] bytes in all,
/// the pairs are cut into parts of [`HOST_COPY_PART`] bytes, copied by this thread and by up to
/// [`HOST_COPY_THREADS`]` - 1` helper threads (see the module docs).
///
/// # Errors
///
/// An internal error, before anything is copied, when a pair's lengths differ.
pub(super) fn copy_host_bytes(pairs: Vec<(&mut [u8], &[u8])>) -> Result<()> {
    if pairs.iter().any(|(to, from)| to.len() != from.len()) {
        return Err(DeviceError::internal(
            "a staged copy's host bytes and its staging buffer differ in length",
        ));
    }
    let total: usize = pairs.iter().map(|(_, from)| from.len()).sum();
    let pool = match helpers() {
        Some(pool) if total >= PARALLEL_HOST_COPY => pool,
        _ => {
            for (to, from) in pairs {
                to.copy_from_slice(from);
            }
            return Ok(());
        }
    };
    // The last parts first out of the queue's end: the caller takes the first ones.
    let mut parts: Vec<Part> = pairs
        .into_iter()
        .flat_map(|(to, from)| {
            to.chunks_mut(HOST_COPY_PART)
                .zip(from.chunks(HOST_COPY_PART))
        })
        .map(|(to, from)| Part {
            to: to.as_mut_ptr(),
            from: from.as_ptr(),
            len: to.len(),
        })
        .collect();
    parts.reverse();
    let count = parts.len();
    let spread = Arc::new(Spread {
        queue: Mutex::new(parts),
        left: Mutex::new(count),
        all_copied: Condvar::new(),
    });
    for _ in 0..pool.current_num_threads().min(count - 1) {
        let spread = spread.clone();
        pool.spawn(move || spread.take_all());
    }
    spread.take_all();
    // Every part has been taken; wait until the helpers have copied the ones they took. A
    // helper that starts later finds no part and touches none of the borrowed bytes. Nothing
    // between the spawns above and this wait can unwind (copies of raw bytes, locks that do
    // not poison, a pop), so the borrowed bytes outlive every part's copy.
    let mut left = spread.left.lock();
    while *left > 0 {
        spread.all_copied.wait(&mut left);
    }
    Ok(())
}

/// The parts of one spread copy, shared by its caller and its helpers.
struct Spread {
    /// The parts no one has taken yet.
    queue: Mutex<Vec<Part>>,
    /// The parts not yet copied, taken or not.
    left: Mutex<usize>,
    /// Signalled when `left` reaches 0.
    all_copied: Condvar,
}

impl Spread {
    /// Copies parts until none is left to take.
    fn take_all(&self) {
        loop {
            let next = self.queue.lock().pop();
            let Some(part) = next else {
                return;
            };
            part.copy();
            let mut left = self.left.lock();
            *left -= 1;
            if *left == 0 {
                self.all_copied.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_host_bytes, HOST_COPY_PART, PARALLEL_HOST_COPY};

    /// `len` bytes that differ from their neighbours and from any fill.
    fn pattern(len: usize, salt: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) ^ salt).rotate_left(13) as u8)
            .collect()
    }

    /// Copies `sizes` (one pair each) through `copy_host_bytes` into buffers poisoned with
    /// 0xee, and checks every byte.
    fn copies_each_pair(sizes: &[usize]) {
        let sources: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(n, i as u32 + 1))
            .collect();
        let mut targets: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xee; n]).collect();
        copy_host_bytes(
            targets
                .iter_mut()
                .zip(&sources)
                .map(|(to, from)| (to.as_mut_slice(), from.as_slice()))
                .collect(),
        )
        .expect("equal lengths");
        for (i, (to, from)) in targets.iter().zip(&sources).enumerate() {
            let wrong = to.iter().zip(from).filter(|(a, b)| a != b).count();
            assert_eq!(wrong, 0, "pair {i} of {sizes:?}: bytes differ");
        }
    }

    #[test]
    fn small_copies_land_whole() {
        copies_each_pair(&[0, 1, 4096, PARALLEL_HOST_COPY - 1]);
    }

    /// Large copies are cut into parts copied on several threads: every byte lands where it
    /// belongs, across the cuts between parts and between pairs (sizes that are not multiples
    /// of a part included).
    #[test]
    fn large_copies_spread_over_threads_land_whole() {
        copies_each_pair(&[PARALLEL_HOST_COPY]);
        copies_each_pair(&[16 << 20, 16 << 20, 3 * HOST_COPY_PART + 12_345, 7]);
    }

    /// Copies made from several threads at once share the helpers, and each lands whole.
    #[test]
    fn copies_from_several_threads_at_once_land_whole() {
        std::thread::scope(|scope| {
            for t in 0..4 {
                scope.spawn(move || {
                    for _ in 0..8 {
                        copies_each_pair(&[(t + 1) << 20, 5 * HOST_COPY_PART + t]);
                    }
                });
            }
        });
    }

    #[test]
    fn pairs_of_different_lengths_are_refused_before_anything_is_copied() {
        let from = pattern(PARALLEL_HOST_COPY, 9);
        let mut a = vec![0u8; PARALLEL_HOST_COPY];
        let mut b = vec![0u8; 10];
        let r = copy_host_bytes(vec![(&mut a, &from), (&mut b, &from[..11])]);
        assert!(r.is_err(), "{r:?}");
        assert!(a.iter().chain(&b).all(|&v| v == 0), "bytes were copied");
    }
}

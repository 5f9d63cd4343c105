//! Shared by the tensor-parallel model tests: every rank run on its own thread.

use cuflow_dist::Communicator;
use cuflow_runtime::DeviceError;

/// Runs `make` on every rank of `comms`, each on its own thread, and what it gives.
pub(crate) fn on_ranks<T: Send>(
    comms: &[Communicator],
    make: impl Fn(&Communicator) -> Result<T, DeviceError> + Sync,
) -> Vec<Result<T, DeviceError>> {
    std::thread::scope(|s| {
        let ranks: Vec<_> = comms.iter().map(|c| s.spawn(|| make(c))).collect();
        ranks
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

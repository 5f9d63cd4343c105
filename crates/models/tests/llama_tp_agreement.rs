//! The ranks of a tensor-parallel model agree before any of them has a model: a rank whose
//! load failed fails every rank's load, naming it, and ranks given different models (another
//! config, another seed) are refused, instead of the others going on to collectives that
//! wait for it (for the communicator's timeout, or for ever under NCCL) or that sum the slices
//! of different models into wrong tokens.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cuflow_dist::Communicator;
use cuflow_models::llama::{testing, Llama, LlamaConfig};
use cuflow_runtime::DeviceError;
use cuflow_testing::device::rank_devices;

/// Well below the default of 300 s: a rank left waiting fails the test instead of hanging it.
const TIMEOUT: Duration = Duration::from_secs(20);

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cuflow-tp-agree-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs `load(rank, comm)` on every rank of two, each on its own thread; the results in rank
/// order (`Ok` carries nothing: the models are dropped on their threads).
fn on_two_ranks(
    load: impl Fn(usize, &Communicator) -> Result<Llama, DeviceError> + Sync,
) -> Option<Vec<Result<(), DeviceError>>> {
    let devices = rank_devices(2)?;
    let comms = Communicator::local_with_timeout(&devices, TIMEOUT).expect("communicators");
    Some(cuflow_testing::thread::on_each(&comms, |c| {
        load(c.rank(), c).map(drop)
    }))
}

/// Every result is an error whose text holds each of `says`.
fn assert_all_fail_saying(results: &[Result<(), DeviceError>], says: &[&str]) {
    for (rank, r) in results.iter().enumerate() {
        let err = match r {
            Ok(()) => panic!("rank {rank} loaded a model"),
            Err(e) => e.to_string(),
        };
        for s in says {
            assert!(err.contains(s), "rank {rank}: {err}");
        }
    }
}

#[test]
fn a_rank_whose_load_failed_fails_every_ranks_load() {
    let dir = temp_dir("one-fails");
    testing::write_tiny_checkpoint(&dir, &LlamaConfig::tiny(), 3).expect("checkpoint");
    let missing = dir.join("missing");
    let Some(results) = on_two_ranks(|rank, c| match rank {
        0 => Llama::load_tp(c, &dir),
        _ => Llama::load_tp(c, &missing),
    }) else {
        return;
    };
    // Rank 1 has its own error; rank 0 is told that rank 1 failed.
    assert!(results[1].is_err());
    assert_all_fail_saying(&results[..1], &["rank 1"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranks_loading_checkpoints_of_different_configs_are_refused() {
    let (a, b) = (temp_dir("config-a"), temp_dir("config-b"));
    let cfg = LlamaConfig::tiny();
    // The same shapes, so every collective would pair: another rotary base.
    let other = LlamaConfig {
        rope_theta: cfg.rope_theta * 2.0,
        ..cfg.clone()
    };
    testing::write_tiny_checkpoint(&a, &cfg, 3).expect("checkpoint");
    testing::write_tiny_checkpoint(&b, &other, 3).expect("checkpoint");
    let dir = |rank: usize| -> &Path { [&a, &b][rank] };
    let Some(results) = on_two_ranks(|rank, c| Llama::load_tp(c, dir(rank))) else {
        return;
    };
    assert_all_fail_saying(&results, &["rank 1", "rank 0"]);
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
}

#[test]
fn ranks_making_synthetic_models_of_different_seeds_are_refused() {
    let Some(results) =
        on_two_ranks(|rank, c| Llama::synthetic_tp(c, LlamaConfig::tiny(), 3 + rank as u64))
    else {
        return;
    };
    assert_all_fail_saying(&results, &["rank 1", "rank 0"]);
}

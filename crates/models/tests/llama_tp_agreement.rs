//! The ranks of a tensor-parallel model agree before any of them has a model: a rank whose
//! load failed fails every rank's load, naming it, and ranks given different models (another
//! config, another seed) are refused, instead of the others going on to collectives that
//! wait for it (for the communicator's timeout, or for ever under NCCL) or that sum the slices
//! of different models into wrong tokens. They agree on each request the same way: ranks
//! given different prompts, token counts or options, or a rank whose own request is refused,
//! fail every rank's request before any collective of it, and the ranks go on to the next.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cuflow_device_op::DeviceOpExt;
use cuflow_dist::Communicator;
use cuflow_models::llama::{testing, GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::DeviceError;
use cuflow_tensor::api;
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
fn assert_all_fail_saying<T: std::fmt::Debug>(results: &[Result<T, DeviceError>], says: &[&str]) {
    for (rank, r) in results.iter().enumerate() {
        let err = match r {
            Ok(v) => panic!("rank {rank}'s call succeeded: {v:?}"),
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

/// Each rank of two runs `request(rank, model, comm)` on one synthetic model; then, on the
/// same models, both generate from the same prompt (ranks left out of step by a refused
/// request would fail or hang here). The first requests' results in rank order.
fn requests_on_two_ranks(
    request: impl Fn(usize, &Llama, &Communicator) -> Result<Vec<u32>, DeviceError> + Sync,
) -> Option<Vec<Result<Vec<u32>, DeviceError>>> {
    let devices = rank_devices(2)?;
    let comms = Communicator::local_with_timeout(&devices, TIMEOUT).expect("communicators");
    let results = cuflow_testing::thread::on_each(&comms, |c| {
        let model = Llama::synthetic_tp(c, LlamaConfig::tiny(), 3).expect("the model");
        let first = request(c.rank(), &model, c);
        let next = model.generate(c.stream(), &[5, 17, 42], 3, &GenerateOptions::greedy());
        (first, next)
    });
    let next: Vec<_> = results.iter().map(|(_, n)| n.clone()).collect();
    let next = next
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .expect("a matching request after the refused one");
    assert_eq!(next[0], next[1], "the ranks' tokens differ");
    Some(results.into_iter().map(|(first, _)| first).collect())
}

#[test]
fn ranks_given_different_prompts_are_refused() {
    // The same length (every collective would pair, over partial sums of different tokens),
    // and another length (collectives of other sizes).
    let prompts: [&[&[u32]]; 2] = [&[&[5, 17, 42], &[5, 17, 43]], &[&[5, 17, 42], &[5, 17]]];
    let opts = GenerateOptions::greedy();
    for p in prompts {
        let Some(results) =
            requests_on_two_ranks(|rank, m, c| m.generate(c.stream(), p[rank], 4, &opts))
        else {
            return;
        };
        assert_all_fail_saying(&results, &["rank 1", "rank 0", "request"]);
        // A decoder's own prefill and generate agree too.
        let Some(results) = requests_on_two_ranks(|rank, m, c| {
            let mut step = m.decoder(c.stream(), opts.max_seq(16))?;
            step.prefill(p[rank])?;
            step.tokens()
        }) else {
            return;
        };
        assert_all_fail_saying(&results, &["rank 1", "request"]);
        let Some(results) = requests_on_two_ranks(|rank, m, c| {
            m.decoder(c.stream(), opts.max_seq(16))?
                .generate(p[rank], 4)
        }) else {
            return;
        };
        assert_all_fail_saying(&results, &["rank 1", "request"]);
    }
}

#[test]
fn ranks_given_different_token_counts_or_options_are_refused() {
    let prompt = [5, 17, 42];
    let greedy = GenerateOptions::greedy();
    let Some(results) =
        requests_on_two_ranks(|rank, m, c| m.generate(c.stream(), &prompt, 3 + rank, &greedy))
    else {
        return;
    };
    assert_all_fail_saying(&results, &["rank 1", "request"]);
    let Some(results) = requests_on_two_ranks(|rank, m, c| {
        let opts = GenerateOptions::sampled(0.8).seed(rank as u64);
        m.generate(c.stream(), &prompt, 4, &opts)
    }) else {
        return;
    };
    assert_all_fail_saying(&results, &["rank 1", "request"]);
    // Logits by prefill on one rank, by a decode step on the other.
    let Some(results) = requests_on_two_ranks(|rank, m, c| {
        let logits = match rank {
            0 => m.prefill_logits(c.stream(), &prompt)?,
            _ => m.decode_logits(c.stream(), &prompt)?,
        };
        Ok(vec![logits.len() as u32])
    }) else {
        return;
    };
    assert_all_fail_saying(&results, &["rank 1", "request"]);
}

#[test]
fn a_rank_whose_request_is_refused_fails_every_ranks_request() {
    let vocab = LlamaConfig::tiny().vocab_size as u32;
    let Some(results) = requests_on_two_ranks(|rank, m, c| {
        let prompt = [5, 17, if rank == 1 { vocab } else { 42 }];
        m.generate(c.stream(), &prompt, 4, &GenerateOptions::greedy())
    }) else {
        return;
    };
    // Rank 1 has its own error; rank 0 is told that rank 1 refused the request.
    let own = results[1]
        .as_ref()
        .expect_err("rank 1's prompt is refused")
        .to_string();
    assert!(own.contains("outside the vocabulary"), "{own}");
    let other = results[0]
        .as_ref()
        .expect_err("rank 0 is refused too")
        .to_string();
    assert!(
        other.contains("rank 1") && other.contains("request"),
        "{other}"
    );
}

/// A rank that never makes the request: the others' agreement waits for it up to the
/// communicator's deadline and fails with a timeout, on every backend, before any of them
/// enqueued a collective (so no device waits, and none faults, as a lone collective would).
#[test]
fn a_request_that_one_rank_never_makes_times_out_without_touching_the_devices() {
    let Some(devices) = rank_devices(2) else {
        return;
    };
    let comms =
        Communicator::local_with_timeout(&devices, Duration::from_secs(2)).expect("communicators");
    // Rank 1 keeps its communicator until rank 0 is done: dropped, it would fail rank 0's
    // agreement at once rather than by its deadline.
    let done = std::sync::Barrier::new(2);
    let results = cuflow_testing::thread::on_each(&comms, |c| {
        let model = Llama::synthetic_tp(c, LlamaConfig::tiny(), 3).expect("the model");
        let out = match c.rank() {
            0 => {
                let mut step = model
                    .decoder(c.stream(), GenerateOptions::greedy().max_seq(16))
                    .expect("a decoder");
                let prefilled = step.prefill(&[5, 17, 42]);
                // The device runs work as before: nothing of the request reached it.
                let after = api::full::<f32>(&[4], 1.5)
                    .sync_on(c.stream())
                    .and_then(|t| t.to_host_vec());
                Some((prefilled, after))
            }
            _ => None,
        };
        done.wait();
        out
    });
    let (prefilled, after) = results[0].as_ref().expect("rank 0's result");
    match prefilled {
        Err(DeviceError::Timeout { .. }) => {}
        other => panic!("rank 0's prefill: {other:?}, want a timeout"),
    }
    assert_eq!(
        after.as_ref().expect("work after the timeout"),
        &vec![1.5; 4]
    );
}

/// A replay of a captured step that fails after it was enqueued (here rank 1 makes no decode
/// steps, so rank 0's replayed all-reduces time out) fails every later `synchronize`,
/// `tokens` and `decode` of the sequence, not only the first: `tokens` never returns ids that
/// the failed replays did not write. A new prefill starts clean. On host ranks: under NCCL, a
/// communicator that a graph recorded is never aborted, so its waits keep no deadline.
#[test]
fn a_failed_replay_fails_the_sequence_until_the_next_prefill() {
    let devices = [
        cuflow_runtime::Device::host_numbered(40),
        cuflow_runtime::Device::host_numbered(41),
    ];
    let comms = Communicator::local_with_timeout(&devices, Duration::from_millis(300)).unwrap();
    let mut cfg = LlamaConfig::tiny();
    cfg.num_key_value_heads = Some(cfg.num_attention_heads);
    let prompt = [3u32, 141, 59, 26, 200];
    std::thread::scope(|s| {
        for c in &comms {
            let cfg = cfg.clone();
            s.spawn(move || {
                let model = Llama::synthetic_tp(c, cfg, 11).unwrap();
                let mut step = model
                    .capture(c.stream(), GenerateOptions::greedy().max_seq(32))
                    .unwrap();
                step.prefill(&prompt).unwrap();
                if c.rank() == 1 {
                    // No decode steps here: rank 0's replayed all-reduces wait for none.
                    return;
                }
                step.decode(3).unwrap();
                for what in ["synchronize", "tokens", "tokens again", "synchronize again"] {
                    let r = match what {
                        "synchronize" | "synchronize again" => step.synchronize().map(|()| vec![]),
                        _ => step.tokens(),
                    };
                    assert!(r.is_err(), "{what} after a failed replay: {r:?}");
                }
                let r = step.decode(1);
                assert!(r.is_err(), "decode after a failed replay: {r:?}");
            });
        }
    });
}

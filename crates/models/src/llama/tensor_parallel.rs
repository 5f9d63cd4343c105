//! Tensor parallelism, Megatron-style: each of `tp` ranks holds a slice of every layer and the
//! ranks sum their partial results with one all-reduce after the attention output projection
//! and one after the MLP down projection.
//!
//! Rank `r` holds query heads `r · h/tp ..`, key/value heads `r · kv/tp ..` (the rows of the
//! query, key and value projections: column-parallel), the matching columns of the output
//! projection (row-parallel), rows `r · i/tp ..` of the gate and up projections and the
//! matching columns of the down projection. Embeddings, norms and the head are replicated. So
//! a rank's weights are exactly those of a *local* config (`h/tp` heads, `kv/tp` key/value
//! heads, `i/tp` MLP width, the same hidden size and head width), and the decode step runs
//! unchanged on them, but for its two residual adds: rank 0 adds its partial product to the
//! residual stream, the other ranks store theirs, and the all-reduce leaves the sum of the
//! stream and every partial on every rank.
//!
//! One [`Split`] says which part of each checkpoint tensor a rank holds, and the loader's
//! staging reads that part (from a checkpoint's files for [`Llama::load_tp`], from the seeded
//! tensors in memory for [`Llama::synthetic_tp`]), so both build a rank's slice the same way.

use std::path::Path;
use std::time::Instant;

use cuflow_dist::Communicator;
use cuflow_runtime::{BackendKind, DeviceError};

use super::checkpoint::Checkpoint;
use super::config::LlamaConfig;
use super::loader::{Part, Source};
use super::model::{ensure_fits, Built, Llama};
use super::testing::synthetic_map;

/// The config of one rank's slice of `cfg` split over `tp` ranks.
///
/// # Errors
///
/// [`DeviceError::Usage`] when the query heads, key/value heads or MLP width do not divide by
/// `tp` (or the slice's MLP width is not a multiple of 8).
pub(crate) fn local_config(cfg: &LlamaConfig, tp: usize) -> Result<LlamaConfig, DeviceError> {
    let split = |what: &str, n: usize| -> Result<usize, DeviceError> {
        if tp == 0 || !n.is_multiple_of(tp) {
            return Err(DeviceError::usage(format!(
                "tensor parallelism over {tp} ranks splits {what} ({n}) evenly; choose a \
                 number of ranks that divides it"
            )));
        }
        Ok(n / tp)
    };
    let mut local = cfg.clone();
    local.head_dim = Some(cfg.head_dim());
    local.num_attention_heads = split("num_attention_heads", cfg.num_attention_heads)?;
    local.num_key_value_heads = Some(split("num_key_value_heads", cfg.kv_heads())?);
    local.intermediate_size = split("intermediate_size", cfg.intermediate_size)?;
    if !local.intermediate_size.is_multiple_of(8) {
        return Err(DeviceError::usage(format!(
            "tensor parallelism over {tp} ranks leaves each an MLP width of {}, which the \
             kernels need to be a multiple of 8",
            local.intermediate_size
        )));
    }
    Ok(local)
}

/// Which slice of the checkpoint a rank reads: rank `rank` of `tp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) rank: usize,
    pub(crate) tp: usize,
}

impl Split {
    /// The rank of `comm` among its ranks.
    pub(crate) fn of(comm: &Communicator) -> Split {
        Split {
            rank: comm.rank(),
            tp: comm.world_size(),
        }
    }

    /// The shape in the checkpoint of tensor `name`, whose slice on this rank has shape
    /// `local` (the shape the local config gives it), and which part of it that slice is:
    /// rows of the query, key, value, gate and up projections, columns of the output and
    /// down projections, all of every other tensor.
    pub(crate) fn part(&self, name: &str, local: &[usize]) -> (Vec<usize>, Part) {
        let (rank, tp) = (self.rank, self.tp);
        let kind = name.rsplit('.').nth(1).unwrap_or("");
        match (kind, local) {
            ("q_proj" | "k_proj" | "v_proj" | "gate_proj" | "up_proj", &[n, d]) => {
                (vec![n * tp, d], Part::Rows(rank * n..(rank + 1) * n))
            }
            ("o_proj" | "down_proj", &[d, n]) => {
                (vec![d, n * tp], Part::Columns(rank * n..(rank + 1) * n))
            }
            _ => (local.to_vec(), Part::Whole),
        }
    }
}

impl Llama {
    /// Rank `comm.rank()`'s slice of the model of `cfg` with seeded random weights (those of
    /// [`Llama::synthetic`] for the same config and seed), split Megatron-style over the
    /// `comm.world_size()` ranks of `comm`, on `comm`'s device: query, key/value and MLP rows
    /// column-parallel, the output and down projections row-parallel, one all-reduce after
    /// each of those. Every rank runs the same calls (`generate`, `capture`, ...) at once, each
    /// on its own thread, and gets the same tokens.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_dist::Communicator;
    /// use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
    /// use cuflow_runtime::Device;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let comms = Communicator::local(&[Device::host_numbered(0), Device::host_numbered(1)])?;
    /// let tokens = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms.iter().map(|c| s.spawn(move || {
    ///         let model = Llama::synthetic_tp(c, LlamaConfig::tiny(), 3)?;
    ///         model.generate(c.stream(), &[5, 17, 42], 4, &GenerateOptions::greedy())
    ///     })).collect();
    ///     ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(tokens[0], tokens[1]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for an unsupported config, or one whose query heads, key/value
    /// heads or MLP width do not divide by the world size; [`DeviceError::OutOfMemory`] before
    /// anything is allocated when this rank's slice (2 bytes a weight) is larger than the
    /// device's memory, or the whole model's weights times the world size (every rank makes
    /// them all while it takes its slice, the host's ranks at once; on the host backend, with
    /// every rank's slice) larger than the host's; [`DeviceError::Usage`] naming the ranks
    /// whose slice failed, or that were given another config or seed than rank 0 (the ranks
    /// agree before any has a model, so a rank alone waits for the others up to the
    /// communicator's timeout); device and collective errors.
    pub fn synthetic_tp(
        comm: &Communicator,
        cfg: LlamaConfig,
        seed: u64,
    ) -> Result<Llama, DeviceError> {
        let model = fingerprint(format!("{cfg:?} seed {seed}").as_bytes());
        agree(
            comm,
            Agreement::Model,
            model,
            Llama::synthetic_slice(comm, cfg, seed),
        )
    }

    /// This rank's part of [`Llama::synthetic_tp`], before the ranks agree.
    fn synthetic_slice(
        comm: &Communicator,
        cfg: LlamaConfig,
        seed: u64,
    ) -> Result<Llama, DeviceError> {
        cfg.validate()?;
        let local = local_config(&cfg, comm.world_size())?;
        // Every rank makes the whole model's weights on the host before taking its slice, and
        // the ranks of one host do so at once.
        let host_bytes = cfg.bf16_weight_bytes()?.saturating_mul(comm.world_size());
        // Host devices' slices share the host's memory too, every rank's at once.
        let mut device_bytes = local.bf16_weight_bytes()?;
        if comm.device().kind() == BackendKind::Host {
            device_bytes = device_bytes.saturating_mul(comm.world_size());
        }
        ensure_fits(comm.device(), device_bytes, host_bytes)?;
        let tensors = synthetic_map(&cfg, seed)?;
        let source = Source::Memory(&tensors);
        Ok(Llama::new_slice(comm.device(), cfg, local, source, Some(comm.clone()))?.0)
    }

    /// Rank `comm.rank()`'s slice of the Hugging Face checkpoint folder `path` (as
    /// [`Llama::load`] reads it), split over the `comm.world_size()` ranks of `comm` as
    /// [`Llama::synthetic_tp`] splits its weights, on `comm`'s device: the same slice, bit
    /// for bit, that `synthetic_tp` makes of the same weights. Every rank calls it at once
    /// (each on its own thread or process) and then runs the same calls.
    ///
    /// Each rank reads only what its slice needs, but for the row-parallel output and down
    /// projections: their slices are columns, so a rank reads the whole rows that each 16 MiB
    /// staging chunk of its slice covers and picks the columns out on the host. Each rank
    /// thus reads the embeddings, norms and head, `1/tp` of the query, key, value, gate and up
    /// projections, and all of the output and down projections, and holds at most about `tp`
    /// staging chunks of the file's bytes (`tp · 16 MiB` of `bf16`, twice that of `f32`) in
    /// host memory beyond its two 16 MiB pinned staging buffers. [`Llama::load_stats`] counts
    /// the bytes each rank read.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_dist::Communicator;
    /// use cuflow_models::llama::{testing, GenerateOptions, Llama, LlamaConfig};
    /// use cuflow_runtime::Device;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let dir = std::env::temp_dir().join(format!("cuflow-doc-load-tp-{}", std::process::id()));
    /// testing::write_tiny_checkpoint(&dir, &LlamaConfig::tiny(), 3)?;
    /// let comms = Communicator::local(&[Device::host_numbered(0), Device::host_numbered(1)])?;
    /// let tokens = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = comms.iter().map(|c| s.spawn(|| {
    ///         let model = Llama::load_tp(c, &dir)?;
    ///         model.generate(c.stream(), &[5, 17, 42], 4, &GenerateOptions::greedy())
    ///     })).collect();
    ///     ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(tokens[0], tokens[1]);
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Llama::load`] (naming the file or the tensor, with the whole tensor's shape), and
    /// [`DeviceError::Usage`] when the config's query heads, key/value heads or MLP width do
    /// not divide by the world size; [`DeviceError::OutOfMemory`] before anything is
    /// allocated when this rank's slice is larger than its device's memory, or, on the host
    /// backend, every rank's slice together larger than the host's; [`DeviceError::Usage`]
    /// naming the ranks whose slice failed, or whose checkpoint differs from rank 0's: another
    /// config, or other weights, told apart by the tensors' names, shapes and dtypes and a
    /// sample of each tensor's bytes (the ranks agree before any has a model, as for
    /// [`Llama::synthetic_tp`]); device and collective errors.
    pub fn load_tp(comm: &Communicator, path: impl AsRef<Path>) -> Result<Llama, DeviceError> {
        let start = Instant::now();
        let dir = path.as_ref();
        let cfg = LlamaConfig::from_file(&dir.join("config.json"));
        // A rank whose load failed takes part in the agreement all the same, as failed.
        let loaded = cfg.and_then(|cfg| Llama::load_slice(comm, dir, cfg));
        let (model, loaded) = match loaded {
            Ok((slice, model)) => (model, Ok(slice)),
            Err(e) => (0, Err(e)),
        };
        let (mut model, built) = agree(comm, Agreement::Model, model, loaded)?;
        model.load = Some(built.stats(start));
        Ok(model)
    }

    /// This rank's part of [`Llama::load_tp`] of the checkpoint `dir` of config `cfg`, before
    /// the ranks agree, with the fingerprint of the model it loaded (the config and the
    /// checkpoint's weights: see `Checkpoint::fingerprint`).
    fn load_slice(
        comm: &Communicator,
        dir: &Path,
        cfg: LlamaConfig,
    ) -> Result<((Llama, Built), u64), DeviceError> {
        cfg.validate()?;
        let local = local_config(&cfg, comm.world_size())?;
        let checkpoint = Checkpoint::open(dir)?;
        let model =
            fingerprint(format!("{cfg:?} weights {:016x}", checkpoint.fingerprint()?).as_bytes());
        // Host devices' slices share the host's memory, every rank's at once (each rank checks
        // its own slice against its device as it builds it).
        if comm.device().kind() == BackendKind::Host {
            let all = local.bf16_weight_bytes()?.saturating_mul(comm.world_size());
            ensure_fits(comm.device(), all, 0)?;
        }
        let source = Source::Files(&checkpoint);
        let slice = Llama::new_slice(comm.device(), cfg, local, source, Some(comm.clone()))?;
        Ok((slice, model))
    }
}

/// A 64-bit FNV-1a hash of `bytes`: the same in every process of every rank.
pub(crate) fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What the ranks of a tensor-parallel model agree on before they go on to collectives that
/// every rank must make alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Agreement {
    /// Each rank built its slice of the same model.
    Model,
    /// Each rank was given the same request (the same prompt, tokens and options), and
    /// accepted it.
    Request,
}

/// Every rank's outcome of its part, agreed on by all of them before any goes on, with one
/// [`Communicator::gather_words`] (through the host, bounded by the communicator's deadline,
/// for the ranks of one process): `result` (this rank's) and `fingerprint` (of what it was
/// asked for: the model, or the request) against every other rank's. Each rank takes part
/// whether its own part failed or not, so none is left waiting for it in collectives that it
/// will not make.
///
/// # Errors
///
/// This rank's own error; [`DeviceError::Usage`] naming the ranks whose part failed, or that
/// were asked for another model or request than rank 0 (slices of different models, or
/// collectives of different requests, would be summed into wrong results or never pair);
/// the gather's errors ([`DeviceError::Timeout`] for a rank that does not take part in time).
pub(crate) fn agree<T>(
    comm: &Communicator,
    what: Agreement,
    fingerprint: u64,
    result: Result<T, DeviceError>,
) -> Result<T, DeviceError> {
    let mine = [
        u32::from(result.is_ok()),
        fingerprint as u32,
        (fingerprint >> 32) as u32,
    ];
    let gathered = comm.gather_words(&mine);
    let done = result?;
    let all = gathered?;
    let world = comm.world_size();
    let ranks = |pick: &dyn Fn(&[u32]) -> bool| -> Vec<String> {
        all.chunks_exact(3)
            .enumerate()
            .filter(|(_, r)| pick(r))
            .map(|(rank, _)| format!("rank {rank}"))
            .collect()
    };
    let failed = ranks(&|r| r[0] == 0);
    if !failed.is_empty() {
        let failed = failed.join(", ");
        return Err(DeviceError::usage(match what {
            Agreement::Model => format!(
                "{failed} of the {world} ranks failed to build its slice of the model (its own \
                 error says why); no rank has a model until every rank has its slice"
            ),
            Agreement::Request => format!(
                "{failed} of the {world} ranks refused this request (its own error says why); \
                 the ranks of a tensor-parallel model run each request together, so none ran \
                 it"
            ),
        }));
    }
    let first = all.get(1..3).unwrap_or_default().to_vec();
    let differ = ranks(&|r| r[1..] != first[..]);
    if !differ.is_empty() {
        let differ = differ.join(", ");
        return Err(DeviceError::usage(match what {
            Agreement::Model => format!(
                "the model {differ} asked for differs from rank 0's (another config.json, other \
                 weights, or another seed); every rank of a tensor-parallel model loads the \
                 same model"
            ),
            Agreement::Request => format!(
                "the request {differ} was given differs from rank 0's (another prompt, number \
                 of tokens, call or options); every rank of a tensor-parallel model makes the \
                 same calls with the same arguments, in the same order, so none ran it"
            ),
        }));
    }
    Ok(done)
}

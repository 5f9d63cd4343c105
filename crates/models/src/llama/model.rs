//! The model: weights and rotary table on a device, construction from a checkpoint or a
//! seed, and the forward passes (prefill over a prompt, one decode step).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cuflow_device_op::{from_fn, DeviceOp, DeviceOpExt, ExecutionContext};
use cuflow_dist::{all_reduce, all_reduce_in_place, Communicator, ReduceOp};
use cuflow_runtime::{BackendKind, Device, DeviceError, Stream};
use cuflow_tensor::kernels::decode::GemvEpilogue::{Accumulate, Store, SwiGlu};
use cuflow_tensor::kernels::decode::{self, AttentionShape, GemvInput, SampleParams};
use cuflow_tensor::{api, bf16, kernels, Tensor};

use super::checkpoint::Checkpoint;
use super::config::LlamaConfig;
use super::loader::{Source, Stager};
use super::options::GenerateOptions;
use super::step::{agree_request, LlamaStep, Request, State};
use super::tensor_parallel::Split;
use super::testing::synthetic_map;
use super::weights::{build, Weights};

/// Partition length of prefill attention (decode uses 64).
const PREFILL_CHUNK: usize = 512;

/// Workspace of one block of prefill rows: a prompt is prefilled in blocks of as many rows
/// as this many bytes of intermediates hold (at least one), so that its workspace does not
/// grow with its length (attention's partial results alone are the rows times `max_seq`).
const PREFILL_BLOCK_BYTES: usize = 256 << 20;

/// How a checkpoint was loaded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadStats {
    /// Bytes read from the files.
    pub bytes: usize,
    /// Seconds from opening the folder until the weights were on the device.
    pub seconds: f64,
    /// Seconds spent after that compiling the decode kernels for the device (not part of
    /// `seconds`; about zero on the host backend, and where this process compiled them before).
    pub compile_seconds: f64,
}

impl LoadStats {
    /// Gigabytes (10⁹ bytes) per second of reading the weights onto the device.
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-12) / 1e9
    }
}

/// What building a model's weights measured: the bytes read, when they were all on the
/// device, and how long compiling the kernels took after that.
pub(super) struct Built {
    bytes: usize,
    weights_done: Instant,
    compile_seconds: f64,
}

impl Built {
    /// The load's figures, for a load that began at `start`.
    pub(super) fn stats(&self, start: Instant) -> LoadStats {
        LoadStats {
            bytes: self.bytes,
            seconds: self.weights_done.duration_since(start).as_secs_f64(),
            compile_seconds: self.compile_seconds,
        }
    }
}

/// What every forward pass reads: the config (of this rank's slice, under tensor
/// parallelism), the weights and the rotary frequencies, and the communicator of the ranks
/// that hold the other slices.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) cfg: LlamaConfig,
    pub(crate) weights: Weights,
    pub(crate) inv_freq: Tensor<f32>,
    pub(crate) tp: Option<Communicator>,
}

impl Core {
    pub(crate) fn shape(&self, max_seq: usize) -> AttentionShape {
        AttentionShape {
            heads: self.cfg.num_attention_heads,
            kv_heads: self.cfg.kv_heads(),
            head_dim: self.cfg.head_dim(),
            max_seq,
        }
    }

    fn eps(&self) -> f32 {
        self.cfg.rms_norm_eps as f32
    }

    /// How a layer's row-parallel projection meets the residual stream: rank 0 (and a model
    /// without tensor parallelism) adds its product, the other ranks store theirs, so that the
    /// all-reduce after it leaves the stream plus every rank's product on every rank.
    fn residual(&self) -> decode::GemvEpilogue {
        match &self.tp {
            Some(c) if c.rank() != 0 => Store,
            _ => Accumulate,
        }
    }

    /// The all-reduce of the residual stream after a row-parallel projection (nothing without
    /// tensor parallelism).
    fn reduce_residual(
        &self,
        x: &mut Tensor<f32>,
        ctx: &mut ExecutionContext,
    ) -> Result<(), DeviceError> {
        match &self.tp {
            Some(c) => all_reduce_in_place(c, x, ReduceOp::Sum).execute(ctx),
            None => Ok(()),
        }
    }

    /// The sum over the ranks of a row-parallel projection's product (itself without tensor
    /// parallelism).
    fn reduce_product(
        &self,
        y: Tensor<f32>,
        ctx: &mut ExecutionContext,
    ) -> Result<Tensor<f32>, DeviceError> {
        match &self.tp {
            Some(c) => all_reduce(c, y, ReduceOp::Sum).execute(ctx),
            None => Ok(y),
        }
    }

    /// One decode step over `state`: embeds `token` at position `pos`, runs every layer
    /// (appending to the caches), computes the logits and samples the next token, which the
    /// sampling kernel feeds back (`token`, `generated[pos + 1]`, `pos + 1`). The norms are
    /// fused into the GEMVs that read them, the residual adds and SwiGLU into the GEMVs that
    /// produce them, RoPE and the cache append into attention: five kernels per layer.
    pub(crate) fn step<'a>(
        &'a self,
        s: &'a mut State,
        params: SampleParams,
    ) -> impl DeviceOp<Output = ()> + 'a {
        from_fn(move |ctx: &mut ExecutionContext| {
            let (w, eps, shape) = (&self.weights, self.eps(), self.shape(s.max_seq));
            let norm = |weight| GemvInput::RmsNorm { weight, eps };
            decode::embed_rows(&mut s.x, &w.embed, &s.token).execute(ctx)?;
            for (l, lw) in w.layers.iter().enumerate() {
                // Each GEMV that reads the residual stream `x` is a kernel of its own, after
                // the one that last added to it.
                decode::gemv_fused(&mut s.qkv, &lw.wqkv, &s.x, norm(&lw.attn_norm), Store)
                    .execute(ctx)?;
                // RoPE, the cache append and attention: one kernel.
                decode::rope_attention(
                    &mut s.attn,
                    &mut s.scratch,
                    &mut s.attn_counts,
                    &mut s.caches[l],
                    &s.qkv,
                    &self.inv_freq,
                    &s.pos,
                    shape,
                )
                .execute(ctx)?;
                let residual = self.residual();
                decode::gemv_fused(&mut s.x, &lw.wo, &s.attn, GemvInput::Plain, residual)
                    .execute(ctx)?;
                self.reduce_residual(&mut s.x, ctx)?;
                decode::gemv_fused(&mut s.act, &lw.w_gate_up, &s.x, norm(&lw.mlp_norm), SwiGlu)
                    .execute(ctx)?;
                decode::gemv_fused(&mut s.x, &lw.w_down, &s.act, GemvInput::Plain, residual)
                    .execute(ctx)?;
                self.reduce_residual(&mut s.x, ctx)?;
            }
            decode::gemv_fused(&mut s.logits, &w.lm_head, &s.x, norm(&w.final_norm), Store)
                .execute(ctx)?;
            s.sample(params).execute(ctx)
        })
    }

    /// Bytes of the `f32` intermediates of [`prefill`](Self::prefill) per prompt row over
    /// caches of `max_seq` positions, with checked arithmetic: attention's partial results grow
    /// with `max_seq`.
    fn prefill_row_bytes(&self, max_seq: usize) -> Option<usize> {
        let cfg = &self.cfg;
        let (heads, hd, d) = (cfg.num_attention_heads, cfg.head_dim(), cfg.hidden_size);
        let parts = decode::attention_partitions(max_seq, PREFILL_CHUNK);
        let qd = heads.checked_mul(hd)?;
        let scratch = [heads, parts, hd.checked_add(2)?]
            .iter()
            .try_fold(1usize, |n, &k| n.checked_mul(k))?;
        // x, h and a projection's output (d each); q and attention (qd each); the fused
        // query/key/value rows; the MLP's gate/up product and activation (3 × its width).
        [d, d, d, qd, qd, cfg.qkv_rows(), scratch]
            .iter()
            .try_fold(cfg.intermediate_size.checked_mul(3)?, |n, &k| {
                n.checked_add(k)
            })?
            .checked_mul(4)
    }

    /// The prompt rows one block of [`prefill`](Self::prefill) runs over caches of `max_seq`
    /// positions: as many as [`PREFILL_BLOCK_BYTES`] of workspace hold, at least one.
    fn prefill_block_rows(&self, max_seq: usize) -> usize {
        self.prefill_row_bytes(max_seq)
            .map_or(1, |b| (PREFILL_BLOCK_BYTES / b.max(1)).max(1))
    }

    /// Refuses a prefill of `rows` prompt tokens over caches of `max_seq` positions whose
    /// workspace the memory of `device` cannot hold, before anything is allocated. The prompt
    /// is prefilled in blocks of rows (see [`prefill`](Self::prefill)), so the workspace is
    /// one block's: at most [`PREFILL_BLOCK_BYTES`], unless a single row is larger. Its bytes
    /// are counted with checked arithmetic; a memory whose size is unknown (reported as 0) is
    /// not checked.
    pub(crate) fn ensure_prefill_fits(
        &self,
        device: &Device,
        rows: usize,
        max_seq: usize,
    ) -> Result<(), DeviceError> {
        let block = rows.min(self.prefill_block_rows(max_seq));
        let bytes = self
            .prefill_row_bytes(max_seq)
            .and_then(|b| b.checked_mul(block));
        let total = device.memory_info()?.total;
        if total > 0 && bytes.is_none_or(|b| b > total) {
            return Err(DeviceError::usage(format!(
                "prefilling a prompt of {rows} tokens over caches of max_seq {max_seq} \
                 positions needs {} bytes of workspace for a block of {block} rows, more than \
                 the {total} bytes of {device}; lower GenerateOptions::max_seq",
                bytes.map_or("more than usize::MAX".into(), |b| b.to_string()),
            )));
        }
        Ok(())
    }

    /// The forward pass over all `prompt` rows at positions `0..len` with matrix products,
    /// writing the caches and the logits of the last row into `s.logits`. The rows are run
    /// in blocks of [`prefill_block_rows`](Self::prefill_block_rows), one after the other,
    /// each attending the cache the blocks before it wrote: the workspace is one block's,
    /// whatever the prompt's length. Allocates its intermediates (it is not captured).
    pub(crate) fn prefill<'a>(
        &'a self,
        s: &'a mut State,
        prompt: &'a [u32],
    ) -> impl DeviceOp<Output = ()> + 'a {
        from_fn(move |ctx: &mut ExecutionContext| {
            if prompt.is_empty() {
                return Err(DeviceError::internal("a prefill of an empty prompt"));
            }
            let block = self.prefill_block_rows(s.max_seq);
            // Every block but the last has `block` rows: they share one workspace.
            let mut full: Option<PrefillWorkspace> = None;
            let mut chunks = prompt.chunks(block).enumerate().peekable();
            while let Some((i, ids)) = chunks.next() {
                let start = u32::try_from(i * block).map_err(|_| {
                    DeviceError::internal("a prefill past the kernels' 32-bit positions")
                })?;
                let last = chunks.peek().is_none();
                let mut partial;
                let ws = if ids.len() == block {
                    match &mut full {
                        Some(ws) => ws,
                        None => {
                            full.insert(PrefillWorkspace::new(&self.cfg, block, s.max_seq, ctx)?)
                        }
                    }
                } else {
                    partial = PrefillWorkspace::new(&self.cfg, ids.len(), s.max_seq, ctx)?;
                    &mut partial
                };
                self.prefill_block(s, ws, ids, start, last).execute(ctx)?;
            }
            Ok(())
        })
    }

    /// The forward pass over the prompt rows `ids` at positions `start..start + len`, after
    /// the blocks before them wrote the caches at `0..start`, in `ws` (of `len` rows); the
    /// last block also writes the logits of its last row into `s.logits`.
    fn prefill_block<'a>(
        &'a self,
        s: &'a mut State,
        ws: &'a mut PrefillWorkspace,
        ids: &'a [u32],
        start: u32,
        last: bool,
    ) -> impl DeviceOp<Output = ()> + 'a {
        from_fn(move |ctx: &mut ExecutionContext| {
            let (w, eps, shape) = (&self.weights, self.eps(), self.shape(s.max_seq));
            let rows = ids.len();
            let PrefillWorkspace {
                x,
                h,
                q,
                attn,
                scratch,
                counts,
                act,
            } = ws;
            api::memcpy(&mut s.pos, api::from_vec(vec![start], &[1])).execute(ctx)?;
            let prompt = api::from_vec(ids.to_vec(), &[rows]).execute(ctx)?;
            decode::embed_rows(x, &w.embed, &prompt).execute(ctx)?;
            let mut down: Option<Tensor<f32>> = None;
            for (l, lw) in w.layers.iter().enumerate() {
                match &down {
                    None => decode::rms_norm_rows(h, x, &lw.attn_norm, eps).execute(ctx)?,
                    Some(dn) => {
                        decode::residual_rms_norm(x, h, dn, &lw.attn_norm, eps).execute(ctx)?
                    }
                }
                let qkv = project(h, &lw.wqkv).execute(ctx)?;
                let cache = &mut s.caches[l];
                decode::rope_kv_append(q, cache, &qkv, &self.inv_freq, &s.pos, shape)
                    .execute(ctx)?;
                decode::attention(attn, scratch, counts, q, cache, &s.pos, shape).execute(ctx)?;
                let o = project(attn, &lw.wo).execute(ctx)?;
                let o = self.reduce_product(o, ctx)?;
                decode::residual_rms_norm(x, h, &o, &lw.mlp_norm, eps).execute(ctx)?;
                let gu = project(h, &lw.w_gate_up).execute(ctx)?;
                decode::silu_mul(act, &gu).execute(ctx)?;
                let dn = project(act, &lw.w_down).execute(ctx)?;
                down = Some(self.reduce_product(dn, ctx)?);
            }
            let dn = down.ok_or_else(|| DeviceError::internal("a model without layers"))?;
            if !last {
                // The caches are written; only the last block's last row has logits to give.
                return Ok(());
            }
            decode::residual_rms_norm(x, h, &dn, &w.final_norm, eps).execute(ctx)?;
            decode::gemv(&mut s.logits, &w.lm_head, h, rows - 1).execute(ctx)
        })
    }
}

/// The intermediates of one block of prefill rows.
struct PrefillWorkspace {
    x: Tensor<f32>,
    h: Tensor<f32>,
    q: Tensor<f32>,
    attn: Tensor<f32>,
    scratch: Tensor<f32>,
    counts: decode::AttentionCounters,
    act: Tensor<f32>,
}

impl PrefillWorkspace {
    /// The intermediates of `rows` prompt rows over caches of `max_seq` positions.
    fn new(
        cfg: &LlamaConfig,
        rows: usize,
        max_seq: usize,
        ctx: &mut ExecutionContext,
    ) -> Result<PrefillWorkspace, DeviceError> {
        let (d, qd) = (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim());
        let mut zeros = |shape: &[usize]| api::zeros::<f32>(shape).execute(ctx);
        let parts = decode::attention_partitions(max_seq, PREFILL_CHUNK);
        Ok(PrefillWorkspace {
            x: zeros(&[rows, d])?,
            h: zeros(&[rows, d])?,
            q: zeros(&[rows, qd])?,
            attn: zeros(&[rows, qd])?,
            scratch: zeros(&[rows, cfg.num_attention_heads, parts, cfg.head_dim() + 2])?,
            act: zeros(&[rows, cfg.intermediate_size])?,
            counts: decode::AttentionCounters::zeroed(rows, cfg.kv_heads()).execute(ctx)?,
        })
    }
}

/// `x · wᵀ` in `bf16` through the runtime's GEMM (cuBLAS on CUDA), `f32` in and out.
fn project<'a>(
    x: &'a Tensor<f32>,
    w: &'a Tensor<bf16>,
) -> impl DeviceOp<Output = Tensor<f32>> + 'a {
    api::cast::<bf16, f32, _>(kernels::linear(api::cast::<f32, bf16, _>(x), w))
}

/// A Llama model on a device. See the [module docs](super) for what it computes.
#[derive(Debug)]
pub struct Llama {
    core: Arc<Core>,
    /// The whole model's config (the core holds this rank's slice's).
    config: LlamaConfig,
    device: Device,
    pub(super) load: Option<LoadStats>,
}

impl Llama {
    fn new(
        device: &Device,
        cfg: LlamaConfig,
        source: Source<'_>,
    ) -> Result<(Llama, Built), DeviceError> {
        Llama::new_slice(device, cfg.clone(), cfg, source, None)
    }

    /// A model whose weights on `device` are those of `local` (the whole model `config`, or
    /// one rank's slice of it under the tensor parallelism of `tp`).
    pub(super) fn new_slice(
        device: &Device,
        config: LlamaConfig,
        cfg: LlamaConfig,
        source: Source<'_>,
        tp: Option<Communicator>,
    ) -> Result<(Llama, Built), DeviceError> {
        cfg.validate()?;
        let stream = device.new_stream()?;
        let mut stager = Stager::new(&stream, source, tp.as_ref().map(Split::of))?;
        let weights = build(&stream, &cfg, &mut stager)?;
        let inv_freq: Vec<f32> = cfg.inv_freq()?.iter().map(|&f| f as f32).collect();
        let n = inv_freq.len();
        let inv_freq = api::from_vec(inv_freq, &[n]).sync_on(&stream)?;
        let weights_done = Instant::now();
        let core = Core {
            cfg,
            weights,
            inv_freq,
            tp,
        };
        decode::compile_all(device, core.shape(1))?;
        let built = Built {
            bytes: stager.bytes_read,
            weights_done,
            compile_seconds: weights_done.elapsed().as_secs_f64(),
        };
        let model = Llama {
            core: Arc::new(core),
            config,
            device: device.clone(),
            load: None,
        };
        Ok((model, built))
    }

    /// Loads a Hugging Face checkpoint folder: `config.json` and the `*.safetensors` files
    /// with the usual parameter names (`model.layers.N.self_attn.q_proj.weight`, ...), in
    /// `f32`, `f16` or `bf16` (stored as `bf16` on the device). Tensors are read in chunks
    /// through pinned staging buffers, overlapping file reads with copies to the device.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] naming the file or the tensor when the folder has no
    /// `config.json` or `*.safetensors`, the config is unreadable or unsupported, or a tensor
    /// is missing or has another shape than the config implies or an unsupported dtype;
    /// [`DeviceError::OutOfMemory`] before anything is allocated when the weights (2 bytes
    /// each) are larger than the device's memory; device errors.
    ///
    /// # Examples
    ///
    /// ```
    /// use cuflow_models::llama::{testing, Llama, LlamaConfig};
    /// use cuflow_runtime::Device;
    /// # fn main() -> Result<(), cuflow_runtime::DeviceError> {
    /// let dir = std::env::temp_dir().join(format!("cuflow-doc-load-{}", std::process::id()));
    /// testing::write_tiny_checkpoint(&dir, &LlamaConfig::tiny(), 1)?;
    /// let model = Llama::load(&Device::host(), &dir)?;
    /// assert!(model.load_stats().is_some_and(|s| s.bytes == model.weight_bytes()));
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok(()) }
    /// ```
    pub fn load(device: &Device, path: impl AsRef<Path>) -> Result<Llama, DeviceError> {
        let start = Instant::now();
        let dir = path.as_ref();
        let cfg = LlamaConfig::from_file(&dir.join("config.json"))?;
        let checkpoint = Checkpoint::open(dir)?;
        let (mut model, built) = Llama::new(device, cfg, Source::Files(&checkpoint))?;
        model.load = Some(built.stats(start));
        Ok(model)
    }

    /// A model of `cfg` with seeded random weights (the ones
    /// [`testing::write_tiny_checkpoint`](super::testing::write_tiny_checkpoint) writes for
    /// the same config and seed).
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for an unsupported config; [`DeviceError::OutOfMemory`] before
    /// anything is allocated when the weights (2 bytes each) are larger than the device's
    /// memory, or than the host's, which holds them all while they are made (on the host
    /// backend, beside the device's copy); device errors.
    pub fn synthetic(device: &Device, cfg: LlamaConfig, seed: u64) -> Result<Llama, DeviceError> {
        cfg.validate()?;
        let bytes = cfg.bf16_weight_bytes()?;
        ensure_fits(device, bytes, bytes)?;
        let tensors = synthetic_map(&cfg, seed)?;
        Ok(Llama::new(device, cfg, Source::Memory(&tensors))?.0)
    }

    /// The model's config (of the whole model, under tensor parallelism too).
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of the weights on the device (a decode step reads each once).
    pub fn weight_bytes(&self) -> usize {
        self.core.weights.bytes()
    }

    /// How [`Llama::load`] (or [`Llama::load_tp`]) went; `None` for synthetic models.
    pub fn load_stats(&self) -> Option<LoadStats> {
        self.load
    }

    /// Generates `n` tokens after `prompt` eagerly (prefill, then one step op per token) and
    /// returns them.
    ///
    /// Under tensor parallelism every rank makes the same call at once; the ranks agree on the
    /// request (prompt, `n`, options) before any enqueues work, so that ranks given different
    /// ones, or a rank that refuses its own, fail every rank's call instead of leaving the
    /// others' collectives waiting (see [`LlamaStep::prefill`]).
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for an empty prompt, an id outside the vocabulary, a prompt
    /// and generation longer than `options`' `max_seq`, options out of range (a NaN
    /// temperature, a `top_p` outside `(0, 1]`, a `max_seq` of 0), or caches of more
    /// positions than the device's memory holds beside the weights, and, under tensor
    /// parallelism, naming the ranks that refused the request or were given another;
    /// [`DeviceError::DeviceMismatch`] for a stream of another device than the model's;
    /// device errors.
    pub fn generate(
        &self,
        stream: &Stream,
        prompt: &[u32],
        n: usize,
        options: &GenerateOptions,
    ) -> Result<Vec<u32>, DeviceError> {
        let mut opts = *options;
        if opts.max_seq.is_none() {
            let positions = prompt.len().checked_add(n.max(1)).ok_or_else(|| {
                DeviceError::usage(format!(
                    "a prompt of {} tokens and {n} generated tokens need more positions than \
                     any max_seq holds",
                    prompt.len()
                ))
            })?;
            opts.max_seq = Some(positions);
        }
        self.on_own_step(stream, opts, Request::Generate(prompt, n), |step| {
            step.generate_eager(prompt, n)
        })
    }

    /// Captures one decode step into a graph on `stream`, with caches of `options`' `max_seq`
    /// positions and its sampling choices: the returned step prefills and replays it.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for options out of range (a NaN temperature, a `top_p` outside
    /// `(0, 1]`, a `max_seq` of 0) or caches of more positions than the device's memory holds
    /// beside the weights; [`DeviceError::DeviceMismatch`] for a stream of another device
    /// than the model's; [`DeviceError::Capture`] and device errors of the capture.
    pub fn capture(
        &self,
        stream: &Stream,
        options: GenerateOptions,
    ) -> Result<LlamaStep, DeviceError> {
        self.new_step(stream, options, true)
    }

    /// A decoder with the state of a capture but no graph: its steps run eagerly.
    ///
    /// # Errors
    ///
    /// As [`capture`](Self::capture): the same options are refused here; device errors.
    pub fn decoder(
        &self,
        stream: &Stream,
        options: GenerateOptions,
    ) -> Result<LlamaStep, DeviceError> {
        self.new_step(stream, options, false)
    }

    /// A decoder over `options` with the default `max_seq`, its step captured when `capture`.
    fn new_step(
        &self,
        stream: &Stream,
        options: GenerateOptions,
        capture: bool,
    ) -> Result<LlamaStep, DeviceError> {
        LlamaStep::new(
            self.core.clone(),
            stream,
            self.with_default_seq(options),
            capture,
        )
    }

    fn with_default_seq(&self, mut options: GenerateOptions) -> GenerateOptions {
        if options.max_seq.is_none() {
            // At least one position, for a config that claims a context of none.
            options.max_seq = Some(self.core.cfg.max_position_embeddings.clamp(1, 4096));
        }
        options
    }

    /// The logits (`vocab` values) after the last token of `prompt`, computed by the prefill
    /// path (matrix products over all rows).
    ///
    /// # Errors
    ///
    /// As [`Llama::generate`].
    pub fn prefill_logits(&self, stream: &Stream, prompt: &[u32]) -> Result<Vec<f32>, DeviceError> {
        self.logits(stream, prompt, false)
    }

    /// The logits after the last token of `prompt`, computed by the decode step (the prompt
    /// but its last token prefilled, then one step).
    ///
    /// # Errors
    ///
    /// As [`Llama::generate`].
    pub fn decode_logits(&self, stream: &Stream, prompt: &[u32]) -> Result<Vec<f32>, DeviceError> {
        self.logits(stream, prompt, true)
    }

    /// The logits after `prompt`, by prefill or by a decode step, on a decoder of its own.
    fn logits(
        &self,
        stream: &Stream,
        prompt: &[u32],
        by_step: bool,
    ) -> Result<Vec<f32>, DeviceError> {
        let opts = GenerateOptions::greedy().max_seq(prompt.len().max(1));
        self.on_own_step(stream, opts, Request::Logits(prompt, by_step), |step| {
            step.logits(prompt, by_step)
        })
    }

    /// `run` (which makes `request`, agreeing on it first) on a decoder of its own with
    /// `opts`. A decoder this rank cannot make is its refusal of `request`: under tensor
    /// parallelism it takes part in the ranks' agreement on it all the same, so the other
    /// ranks fail at once instead of waiting for this one.
    fn on_own_step<T>(
        &self,
        stream: &Stream,
        opts: GenerateOptions,
        request: Request<'_>,
        run: impl FnOnce(&mut LlamaStep) -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        match LlamaStep::new(self.core.clone(), stream, opts, false) {
            Ok(mut step) => run(&mut step),
            Err(e) => agree_request(&self.core, request, &opts, Err(e)),
        }
    }
}

/// Refuses weights that the memory of `device` (`device_bytes` of them), or of the host that
/// makes and stages them (`host_bytes`), cannot hold; a host device's memory is the host's,
/// which holds both at once. A memory whose size is unknown, reported as 0, is not checked.
pub(super) fn ensure_fits(
    device: &Device,
    device_bytes: usize,
    host_bytes: usize,
) -> Result<(), DeviceError> {
    let checks = if device.kind() == BackendKind::Host {
        vec![(device.clone(), device_bytes.saturating_add(host_bytes))]
    } else {
        vec![(device.clone(), device_bytes), (Device::host(), host_bytes)]
    };
    for (d, bytes) in checks {
        let total = d.memory_info()?.total;
        if total > 0 && bytes > total {
            return Err(DeviceError::OutOfMemory {
                bytes,
                device: d.name().to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use cuflow_runtime::{Device, DeviceError};

    use super::ensure_fits;

    /// On the host backend the weights on the device and the ones the host makes to stage
    /// them share one memory: weights that fit it once but not twice are refused (each
    /// allocation would succeed, and the process run out of memory filling them).
    #[test]
    fn host_weights_and_their_staging_share_the_host_memory() -> Result<(), DeviceError> {
        let host = Device::host();
        let total = host.memory_info()?.total;
        if total == 0 {
            return Ok(()); // An unknown size is not checked.
        }
        let most = total / 10 * 6;
        assert!(ensure_fits(&host, most, most).is_err());
        assert!(ensure_fits(&host, most, 0).is_ok());
        assert!(ensure_fits(&host, total / 3, total / 3).is_ok());
        Ok(())
    }
}

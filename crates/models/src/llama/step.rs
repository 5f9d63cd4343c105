//! A decoder: the key/value caches and the workspace of one sequence, and the decode step
//! over them, run eagerly or replayed from a captured graph.

use std::sync::Arc;

use cuflow_device_op::{enqueue_on, DeviceOp, DeviceOpExt};
use cuflow_graph_capture::{CudaGraph, GraphCaptureExt};
use cuflow_runtime::{DeviceError, ErrorScope, Stream};
use cuflow_scheduler::{default_policy, SchedulingPolicy};
use cuflow_tensor::kernels::decode::{self, SampleParams};
use cuflow_tensor::{api, bf16, Tensor};

use super::model::Core;
use super::options::GenerateOptions;
use super::tensor_parallel::{agree, fingerprint, Agreement};

/// Partition length of decode attention. Measured on an H100 with the 1B shape, replayed:
/// partitions of 128 or 256 positions gave 724–726 tokens/s over 4,000 tokens against 701 for
/// 64 and 702 for 512 (long contexts: fewer blocks, each with more to do), and 256 was as fast
/// as 64 over the first 256 tokens (760 against 755).
const DECODE_CHUNK: usize = 256;

/// Everything a decode step reads and writes besides the weights, allocated once.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) max_seq: usize,
    /// Per layer, `[2, kv_heads, max_seq, head_dim]`.
    pub(crate) caches: Vec<Tensor<bf16>>,
    /// The token the next step embeds, `[1]`.
    pub(crate) token: Tensor<u32>,
    /// The position of that token, `[1]`.
    pub(crate) pos: Tensor<u32>,
    /// Seed (two words) and counter of the sampling generator, `[3]`.
    pub(crate) rng: Tensor<u32>,
    /// `generated[p + 1]` is the token chosen after position `p`, `[max_seq + 1]`.
    pub(crate) generated: Tensor<u32>,
    /// The sampling kernels' partial results.
    pub(crate) sample_scratch: Tensor<u32>,
    pub(crate) x: Tensor<f32>,
    pub(crate) qkv: Tensor<f32>,
    pub(crate) attn: Tensor<f32>,
    pub(crate) scratch: Tensor<f32>,
    /// The attention kernel's finished-partition counters, zero between launches.
    pub(crate) attn_counts: decode::AttentionCounters,
    pub(crate) act: Tensor<f32>,
    pub(crate) logits: Tensor<f32>,
}

impl State {
    fn new(core: &Core, stream: &Stream, max_seq: usize) -> Result<State, DeviceError> {
        let cfg = &core.cfg;
        let shape = core.shape(max_seq);
        // Intermediates start as NaN, so a kernel that failed to write one shows.
        let f = |shape: &[usize]| api::full::<f32>(shape, f32::NAN).sync_on(stream);
        let (d, qd) = (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim());
        let parts = decode::attention_partitions(max_seq, DECODE_CHUNK);
        Ok(State {
            max_seq,
            caches: (0..cfg.num_hidden_layers)
                .map(|_| api::zeros::<bf16>(&[shape.cache_len()]).sync_on(stream))
                .collect::<Result<_, _>>()?,
            token: api::zeros::<u32>(&[1]).sync_on(stream)?,
            pos: api::zeros::<u32>(&[1]).sync_on(stream)?,
            rng: api::zeros::<u32>(&[3]).sync_on(stream)?,
            generated: api::full::<u32>(&[max_seq + 1], u32::MAX).sync_on(stream)?,
            sample_scratch: api::zeros::<u32>(&[decode::SAMPLE_SCRATCH_LEN]).sync_on(stream)?,
            x: f(&[1, d])?,
            qkv: f(&[1, cfg.qkv_rows()])?,
            attn: f(&[1, qd])?,
            scratch: f(&[1, cfg.num_attention_heads, parts, cfg.head_dim() + 2])?,
            attn_counts: decode::AttentionCounters::zeroed(1, cfg.kv_heads()).sync_on(stream)?,
            act: f(&[1, cfg.intermediate_size])?,
            logits: f(&[cfg.vocab_size])?,
        })
    }

    /// Refuses a state of `max_seq` positions that the device's memory cannot hold beside the
    /// weights, before anything is allocated: the caches grow with `max_seq`, and each layer's
    /// may fit where all of them do not. Its bytes are counted with checked arithmetic; a
    /// memory whose size is unknown (reported as 0) is not checked.
    fn ensure_fits(core: &Core, stream: &Stream, max_seq: usize) -> Result<(), DeviceError> {
        let cfg = &core.cfg;
        let (heads, hd) = (cfg.num_attention_heads, cfg.head_dim());
        let parts = decode::attention_partitions(max_seq, DECODE_CHUNK);
        // Key/value caches (bf16), the generated ids (u32), attention's partial results (f32),
        // and the per-token vectors (f32).
        let bytes = || {
            let caches = [cfg.num_hidden_layers, 2, cfg.kv_heads(), max_seq, hd, 2]
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))?;
            let generated = max_seq.checked_add(1)?.checked_mul(4)?;
            let scratch = [heads, parts, hd.checked_add(2)?, 4]
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))?;
            let vectors = [
                cfg.hidden_size,
                cfg.qkv_rows(),
                heads.checked_mul(hd)?,
                cfg.intermediate_size,
                cfg.vocab_size,
            ]
            .iter()
            .try_fold(0usize, |n, &d| n.checked_add(d))?
            .checked_mul(4)?;
            caches
                .checked_add(generated)?
                .checked_add(scratch)?
                .checked_add(vectors)
        };
        let device = stream.device();
        let total = device.memory_info()?.total;
        let weights = core.weights.bytes();
        let needed = bytes().and_then(|b| b.checked_add(weights));
        if total > 0 && needed.is_none_or(|n| n > total) {
            return Err(DeviceError::usage(format!(
                "caches of max_seq {max_seq} positions need {} bytes beside the {weights} bytes \
                 of weights, more than the {total} bytes of {device}; lower \
                 GenerateOptions::max_seq (or the tokens asked for)",
                bytes().map_or("more than usize::MAX".into(), |b| b.to_string()),
            )));
        }
        Ok(())
    }

    /// Samples the next token from `logits` with `params` and feeds it back: `token`,
    /// `generated[pos + 1]`, `pos + 1`.
    pub(crate) fn sample(&mut self, params: SampleParams) -> impl DeviceOp<Output = ()> + '_ {
        decode::sample(
            &mut self.token,
            &mut self.generated,
            &mut self.pos,
            &mut self.rng,
            &mut self.sample_scratch,
            &self.logits,
            params,
        )
    }
}

/// A decoder of one sequence at a time, with caches of `max_seq` positions, and (from
/// [`Llama::capture`](super::Llama::capture)) its decode step captured into a graph.
///
/// [`generate`](Self::generate) replays the graph; [`generate_eager`](Self::generate_eager)
/// runs the same step op eagerly over the same state, and gives the same tokens.
#[derive(Debug)]
pub struct LlamaStep {
    core: Arc<Core>,
    state: State,
    options: GenerateOptions,
    stream: Stream,
    policy: Arc<dyn SchedulingPolicy>,
    graph: Option<CudaGraph<()>>,
    /// Length of the prompt last prefilled, and tokens generated since.
    prompt_len: usize,
    produced: usize,
    /// The failures of the sequence's eager work (its prefill, its eager steps) after it was
    /// enqueued: reported by [`synchronize`](Self::synchronize) and
    /// [`tokens`](Self::tokens) until the next prefill starts a sequence with a scope of
    /// its own. (Replays report theirs through the graph.)
    scope: ErrorScope,
    /// The first failure of the sequence's replays: the graph reports each failure once, and
    /// the sequence keeps it, for every later call until the next prefill.
    replay_failure: std::sync::Mutex<Option<DeviceError>>,
}

impl LlamaStep {
    pub(crate) fn new(
        core: Arc<Core>,
        stream: &Stream,
        options: GenerateOptions,
        capture: bool,
    ) -> Result<LlamaStep, DeviceError> {
        options.check()?;
        let device = core.weights.embed.device();
        if stream.device() != device {
            // Before the caches are allocated on the stream's device.
            return Err(DeviceError::device_mismatch(
                "Llama",
                "the stream given (a model runs on streams of the device its weights are on)",
                device,
                stream.device(),
            ));
        }
        let max_seq = options.max_seq.unwrap_or(1);
        if max_seq >= u32::MAX as usize / 2 {
            return Err(DeviceError::usage(format!(
                "max_seq {max_seq} does not fit the kernels' 32-bit positions; lower \
                 GenerateOptions::max_seq (or the tokens asked for) below {}",
                u32::MAX / 2
            )));
        }
        State::ensure_fits(&core, stream, max_seq)?;
        let mut state = State::new(&core, stream, max_seq)?;
        let policy = default_policy(stream.device())?;
        let graph = if capture {
            decode::compile_all(stream.device(), core.shape(max_seq))?;
            Some(
                core.step(&mut state, options.sample)
                    .graph_on(stream.clone())?,
            )
        } else {
            None
        };
        Ok(LlamaStep {
            core,
            state,
            options,
            stream: stream.clone(),
            policy,
            graph,
            prompt_len: 0,
            produced: 0,
            scope: ErrorScope::new(),
            replay_failure: std::sync::Mutex::new(None),
        })
    }

    /// The failure of the sequence's replays: the one kept, or the graph's report of the
    /// replays enqueued so far (waiting for them), kept from then on.
    fn replays(&self) -> Result<(), DeviceError> {
        let mut kept = self
            .replay_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(e) = &*kept {
            return Err(e.clone());
        }
        if let Some(graph) = &self.graph {
            if let Err(e) = graph.synchronize() {
                *kept = Some(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }

    /// Positions the caches hold: prompt plus generated tokens must fit.
    pub fn max_seq(&self) -> usize {
        self.state.max_seq
    }

    /// Whether the step is captured (else [`decode`](Self::decode) runs eagerly).
    pub fn is_captured(&self) -> bool {
        self.graph.is_some()
    }

    /// Kernels and copies in the captured graph (0 when not captured).
    ///
    /// # Errors
    ///
    /// A driver error.
    pub fn node_count(&self) -> Result<usize, DeviceError> {
        self.graph
            .as_ref()
            .map_or(Ok(0), |g| g.graph().node_count())
    }

    fn check(&self, prompt: &[u32], n: usize) -> Result<(), DeviceError> {
        let vocab = self.core.cfg.vocab_size;
        if prompt.is_empty() {
            return Err(DeviceError::usage(
                "the prompt is empty; give at least one token id",
            ));
        }
        if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(DeviceError::usage(format!(
                "prompt id {bad} is outside the vocabulary of {vocab} tokens"
            )));
        }
        let positions = prompt.len().checked_add(n);
        if positions.is_none_or(|p| p > self.state.max_seq) {
            return Err(DeviceError::usage(format!(
                "a prompt of {} tokens and {n} generated tokens need {} positions, but the \
                 caches hold max_seq = {}; raise GenerateOptions::max_seq",
                prompt.len(),
                positions.map_or("more than usize::MAX".into(), |p| p.to_string()),
                self.state.max_seq
            )));
        }
        Ok(())
    }

    fn enqueue<O: cuflow_device_op::DeviceOp>(
        stream: &Stream,
        policy: &Arc<dyn SchedulingPolicy>,
        op: O,
    ) -> Result<O::Output, DeviceError> {
        Ok(enqueue_on(op, stream, policy.clone())?.0)
    }

    /// This rank's acceptance of a request of `prompt` and `n` tokens: the checks of
    /// [`check`](Self::check), and, when a prefill will run (`n > 0`), that the device holds
    /// its workspace.
    fn check_request(&self, prompt: &[u32], n: usize) -> Result<(), DeviceError> {
        self.check(prompt, n)?;
        if n == 0 {
            return Ok(());
        }
        self.core
            .ensure_prefill_fits(self.stream.device(), prompt.len(), self.state.max_seq)
    }

    /// Resets the sequence to `prompt`: prefills it (matrix products over all its tokens),
    /// then chooses the first generated token. Waits for nothing (but, under tensor
    /// parallelism, for the ranks' agreement on the request).
    ///
    /// Under tensor parallelism every rank prefills the same prompt at once: the ranks agree
    /// on it (one `Communicator::gather_words`, through the host) before any enqueues work,
    /// so that ranks given different prompts or options, or a rank that refuses its prompt,
    /// fail every rank's prefill instead of leaving the others' collectives waiting or
    /// summing the products of different tokens.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for an empty prompt, an id outside the vocabulary, a prompt
    /// that leaves no position free, or a workspace the device's memory cannot hold (the
    /// prompt is prefilled in blocks of rows, whose workspace grows with `max_seq`), and, under
    /// tensor parallelism, naming the ranks that refused the prompt or were given another
    /// (the sequence before it is kept in each case); device errors, after which there is no
    /// sequence: decoding needs a new prefill.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<(), DeviceError> {
        let checked = self.check_request(prompt, 1);
        agree_request(&self.core, Request::Prefill(prompt), &self.options, checked)?;
        self.prefill_agreed(prompt)
    }

    /// [`prefill`](Self::prefill) of a prompt that this rank checked and the ranks agreed on.
    fn prefill_agreed(&mut self, prompt: &[u32]) -> Result<(), DeviceError> {
        // The work below overwrites the sequence before it; until it has all been enqueued
        // there is no sequence to decode.
        self.end_sequence();
        self.scope = ErrorScope::new();
        *self
            .replay_failure
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        let _entered = self.scope.enter();
        let (stream, policy) = (&self.stream, &self.policy);
        let s = &mut self.state;
        let seed = self.options.seed;
        Self::enqueue(
            stream,
            policy,
            api::memcpy(
                &mut s.rng,
                api::from_vec(vec![seed as u32, (seed >> 32) as u32, 0], &[3]),
            ),
        )?;
        Self::enqueue(stream, policy, self.core.prefill(s, prompt))?;
        let last = (prompt.len() - 1) as u32;
        Self::enqueue(
            stream,
            policy,
            api::memcpy(&mut s.pos, api::from_vec(vec![last], &[1])),
        )?;
        Self::enqueue(stream, policy, s.sample(self.options.sample))?;
        self.prompt_len = prompt.len();
        self.produced = 1;
        Ok(())
    }

    fn check_room(&self, n: usize) -> Result<(), DeviceError> {
        if self.prompt_len == 0 {
            return Err(DeviceError::usage(
                "decode before prefill: call prefill(prompt) first",
            ));
        }
        let positions = (self.prompt_len + self.produced).checked_add(n);
        if positions.is_none_or(|p| p > self.state.max_seq) {
            return Err(DeviceError::usage(format!(
                "{n} more tokens after {} prompt and {} generated tokens exceed max_seq = {}",
                self.prompt_len, self.produced, self.state.max_seq
            )));
        }
        Ok(())
    }

    /// Generates `n` more tokens by replaying the captured step (eagerly when the step was
    /// not captured); waits for nothing.
    ///
    /// Under tensor parallelism every rank decodes the same `n` after the same prefill. The
    /// ranks do not agree on each `decode` (that would wait for them all at every call, where
    /// this waits for nothing): a rank that makes fewer steps leaves the others' all-reduces
    /// of the next step waiting, up to the communicator's timeout on host devices, in the
    /// one-shot sums of small activations and in NCCL's calls of an eager step, without end in
    /// NCCL's calls replayed from the step's graph (a communicator a graph recorded is never
    /// aborted). [`generate`](Self::generate) agrees on its whole request.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] before [`prefill`](Self::prefill) or past `max_seq` (the
    /// sequence is kept); device errors, after which decoding needs a new prefill.
    pub fn decode(&mut self, n: usize) -> Result<(), DeviceError> {
        self.check_room(n)?;
        if let Some(e) = &*self
            .replay_failure
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            // The sequence's replays failed: its position on the device is unknown.
            return Err(e.clone());
        }
        let Some(graph) = &mut self.graph else {
            return self.decode_eager(n);
        };
        let launched = (0..n).try_for_each(|_| graph.launch());
        self.advance(n, launched)
    }

    /// Counts `n` more generated tokens when their steps were all enqueued; after a failure
    /// part of the way, ends the sequence (its position on the device is unknown).
    fn advance(&mut self, n: usize, enqueued: Result<(), DeviceError>) -> Result<(), DeviceError> {
        match enqueued {
            Ok(()) => {
                self.produced += n;
                Ok(())
            }
            Err(e) => {
                self.end_sequence();
                Err(e)
            }
        }
    }

    /// Forgets the sequence: decoding needs a prefill, and there are no tokens.
    fn end_sequence(&mut self) {
        self.prompt_len = 0;
        self.produced = 0;
    }

    /// Generates `n` more tokens running the step op eagerly (one op per token); waits for
    /// nothing.
    ///
    /// # Errors
    ///
    /// As [`decode`](Self::decode).
    pub fn decode_eager(&mut self, n: usize) -> Result<(), DeviceError> {
        self.check_room(n)?;
        let enqueued = {
            let _entered = self.scope.enter();
            (0..n).try_for_each(|_| {
                let op = self.core.step(&mut self.state, self.options.sample);
                Self::enqueue(&self.stream, &self.policy, op)
            })
        };
        self.advance(n, enqueued)
    }

    /// Waits for the work enqueued so far.
    ///
    /// # Errors
    ///
    /// Device errors of that work, the failure of a replay of the captured step among them
    /// (a replay's failure is reported by its graph, not by the stream), and the failure of
    /// the sequence's prefill or eager steps (a collective that timed out, say), at every
    /// call until the next prefill; not the failures of other work on the stream.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.replays()?;
        let _entered = self.scope.enter();
        self.stream.synchronize()
    }

    /// The tokens generated since the last prefill (one read of the device buffer).
    ///
    /// # Errors
    ///
    /// As [`synchronize`](Self::synchronize): tokens whose work failed are never returned.
    pub fn tokens(&self) -> Result<Vec<u32>, DeviceError> {
        // A failed replay leaves tokens unwritten: the sequence keeps its failure.
        self.replays()?;
        // Read in the sequence's scope: a failure of its prefill or eager steps is reported.
        let all = {
            let _entered = self.scope.enter();
            self.state.generated.to_host_vec_on(&self.stream)?
        };
        Ok(all
            .get(self.prompt_len..self.prompt_len + self.produced)
            .unwrap_or_default()
            .to_vec())
    }

    /// Prefills `prompt` and generates `n` tokens by replaying the captured step `n - 1`
    /// times; returns the `n` tokens.
    ///
    /// Under tensor parallelism the ranks agree on the request (prompt, `n` and options)
    /// first, as [`prefill`](Self::prefill) does.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Usage`] for an empty prompt, an id outside the vocabulary, or more
    /// than `max_seq` positions, and, under tensor parallelism, naming the ranks that refused
    /// the request or were given another; device errors.
    pub fn generate(&mut self, prompt: &[u32], n: usize) -> Result<Vec<u32>, DeviceError> {
        self.generate_with(prompt, n, Self::decode)
    }

    /// [`generate`](Self::generate) with the step run eagerly: the same tokens.
    ///
    /// # Errors
    ///
    /// As [`generate`](Self::generate).
    pub fn generate_eager(&mut self, prompt: &[u32], n: usize) -> Result<Vec<u32>, DeviceError> {
        self.generate_with(prompt, n, Self::decode_eager)
    }

    /// Checks and agrees on the request, prefills `prompt`, decodes `n - 1` tokens with
    /// `decode` and reads the `n` tokens.
    fn generate_with(
        &mut self,
        prompt: &[u32],
        n: usize,
        decode: fn(&mut Self, usize) -> Result<(), DeviceError>,
    ) -> Result<Vec<u32>, DeviceError> {
        let checked = self.check_request(prompt, n);
        agree_request(
            &self.core,
            Request::Generate(prompt, n),
            &self.options,
            checked,
        )?;
        if n == 0 {
            return Ok(Vec::new());
        }
        self.prefill_agreed(prompt)?;
        decode(self, n - 1)?;
        self.tokens()
    }

    /// The logits after `prompt` by prefill (`by_step == false`) or by one decode step after
    /// prefilling all but the last token.
    pub(crate) fn logits(
        &mut self,
        prompt: &[u32],
        by_step: bool,
    ) -> Result<Vec<f32>, DeviceError> {
        let checked = self.check(prompt, 0).and_then(|()| {
            let rows = prompt.len() - usize::from(by_step);
            self.core
                .ensure_prefill_fits(self.stream.device(), rows, self.state.max_seq)
        });
        agree_request(
            &self.core,
            Request::Logits(prompt, by_step),
            &self.options,
            checked,
        )?;
        let _entered = self.scope.enter();
        let (stream, policy) = (&self.stream, &self.policy);
        if !by_step {
            Self::enqueue(stream, policy, self.core.prefill(&mut self.state, prompt))?;
        } else {
            let (head, last) = prompt.split_at(prompt.len() - 1);
            if !head.is_empty() {
                Self::enqueue(stream, policy, self.core.prefill(&mut self.state, head))?;
            }
            let s = &mut self.state;
            Self::enqueue(
                stream,
                policy,
                api::memcpy(&mut s.token, api::from_vec(last.to_vec(), &[1])),
            )?;
            let p = vec![head.len() as u32];
            Self::enqueue(
                stream,
                policy,
                api::memcpy(&mut s.pos, api::from_vec(p, &[1])),
            )?;
            Self::enqueue(stream, policy, self.core.step(s, self.options.sample))?;
        }
        self.state.logits.to_host_vec_on(stream)
    }
}

/// A request whose collectives every rank of a tensor-parallel model must make alike, so
/// that the ranks agree on it first.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Request<'p> {
    /// [`LlamaStep::prefill`] of a prompt.
    Prefill(&'p [u32]),
    /// A prompt and the number of tokens to generate from it.
    Generate(&'p [u32], usize),
    /// The logits after a prompt, by prefill (`false`) or by a decode step (`true`).
    Logits(&'p [u32], bool),
}

impl Request<'_> {
    /// A fingerprint of the request made with `options`: the same on every rank given the
    /// same call, prompt, count and options, and on no rank given others but by a hash
    /// collision.
    fn fingerprint(&self, options: &GenerateOptions) -> u64 {
        let (call, prompt, count) = match *self {
            Request::Prefill(p) => (0u8, p, 0),
            Request::Generate(p, n) => (1, p, n as u64),
            Request::Logits(p, by_step) => (2, p, u64::from(by_step)),
        };
        let sample = options.sample;
        let mut bytes = Vec::with_capacity(48 + 4 * prompt.len());
        bytes.push(call);
        bytes.extend(count.to_le_bytes());
        bytes.extend(sample.temperature.to_bits().to_le_bytes());
        bytes.extend(sample.top_k.to_le_bytes());
        bytes.extend(sample.top_p.to_bits().to_le_bytes());
        bytes.extend(options.seed.to_le_bytes());
        bytes.extend(options.max_seq.map_or(u64::MAX, |m| m as u64).to_le_bytes());
        bytes.extend((prompt.len() as u64).to_le_bytes());
        bytes.extend(prompt.iter().flat_map(|id| id.to_le_bytes()));
        fingerprint(&bytes)
    }
}

/// `checked`, this rank's acceptance of `request` (made with `options`), agreed on by every
/// rank of `core`'s tensor-parallel model before any of them enqueues a collective of it (see
/// `tensor_parallel::agree`); `checked` itself without tensor parallelism.
///
/// # Errors
///
/// This rank's own error, and [`DeviceError::Usage`] naming the ranks that refused the
/// request or were given another; the agreement's collective errors.
pub(crate) fn agree_request<T>(
    core: &Core,
    request: Request<'_>,
    options: &GenerateOptions,
    checked: Result<T, DeviceError>,
) -> Result<T, DeviceError> {
    match &core.tp {
        Some(comm) => agree(
            comm,
            Agreement::Request,
            request.fingerprint(options),
            checked,
        ),
        None => checked,
    }
}

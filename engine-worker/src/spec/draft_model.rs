//! Model drafters: a smaller draft model with the target's vocabulary (speculative decoding as
//! in Leviathan et al. 2023, <https://arxiv.org/abs/2211.17192>, and Chen et al. 2023,
//! <https://arxiv.org/abs/2302.01318>), or the target's own first layers with its final norm and
//! LM head (self-speculation by early exit: LayerSkip, Elhoushi et al. 2024,
//! <https://arxiv.org/abs/2404.16710>; Draft & Verify, Zhang et al. 2023,
//! <https://arxiv.org/abs/2309.08168>).
//!
//! Unlike a lookup, drafting costs forwards, so the policy decides each sequence's draft length
//! first and the drafter then runs exactly those: one batched forward per draft position over
//! every sequence still drafting at it. Each draft token is drawn from the draft's distribution
//! with the request's own random stream for that output position, the same draw the verifier
//! makes from the target's (greedy: both take the argmax), so the draft agrees with the target
//! whenever their distributions put the draw on the same token. What is accepted is decided by
//! the verifier alone; nothing here can change a request's tokens.

use std::time::Instant;

use proto::api_worker::SamplingParams;

use super::cost::StepCost;
use super::draft_kv::DraftKv;
use super::drafter::Drafter;
use super::proposer::SeqKey;
use crate::backend::{Backend, LogitsFor, SeqForward};
use crate::sampling::{argmax, is_greedy, position_rng, Distribution};
use crate::EngineError;

/// Where a model drafter's tokens come from.
pub enum ModelSource {
    /// A separate model with the target's vocabulary. Its paged KV cache has the target's
    /// block size and block count, and every sequence's block table indexes both.
    Model(Box<dyn Backend>),
    /// The target's first `layers` layers (early exit), in the target's own KV cache.
    TargetLayers(usize),
}

impl std::fmt::Debug for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Model(b) => write!(f, "Model({})", b.config().name),
            ModelSource::TargetLayers(n) => write!(f, "TargetLayers({n})"),
        }
    }
}

/// One sequence's drafting this step.
#[derive(Debug, Clone, Copy)]
pub struct DraftJob<'a> {
    pub seq: SeqKey,
    /// Prompt and output so far.
    pub tokens: &'a [u32],
    /// Blocks for every position up to `tokens.len() + drafts - 1`.
    pub block_table: &'a [u32],
    /// Draft tokens to produce.
    pub drafts: usize,
    pub sampling: &'a SamplingParams,
    pub seed: u64,
    /// Output index the first draft would take (it keys the request's random stream).
    pub first_position: usize,
}

/// A model drafter and what it knows of its cache and its cost.
#[derive(Debug)]
pub struct ModelDrafter {
    source: ModelSource,
    name: String,
    /// Validity of the draft model's own cache (unused for early exit).
    kv: DraftKv,
    /// Seconds of one draft forward by sequences in it.
    cost: StepCost,
}

impl ModelDrafter {
    /// A drafter for a target with `vocab_size` tokens, `num_layers` layers and a KV cache of
    /// `num_blocks` blocks of `block_size`; `cost` is the calibrated draft forward cost.
    pub fn new<B: Backend + ?Sized>(
        source: ModelSource,
        target: &B,
        cost: StepCost,
    ) -> Result<Self, EngineError> {
        let t = target.config();
        let name = match &source {
            ModelSource::Model(draft) => {
                let d = draft.config();
                if d.vocab_size != t.vocab_size {
                    return Err(EngineError::InvalidConfig(format!(
                        "draft model {} has {} tokens, the target {} has {}",
                        d.name, d.vocab_size, t.name, t.vocab_size
                    )));
                }
                if draft.block_size() != target.block_size()
                    || draft.num_blocks() < target.num_blocks()
                {
                    return Err(EngineError::InvalidConfig(format!(
                        "draft KV cache ({} blocks of {}) must mirror the target's ({} of {})",
                        draft.num_blocks(),
                        draft.block_size(),
                        target.num_blocks(),
                        target.block_size()
                    )));
                }
                format!("draft:{}", d.name)
            }
            ModelSource::TargetLayers(n) => {
                if *n == 0 || *n >= t.num_layers {
                    return Err(EngineError::InvalidConfig(format!(
                        "--draft-layers {n}: self-speculation needs 1 to {} of the target's {} layers",
                        t.num_layers.saturating_sub(1),
                        t.num_layers
                    )));
                }
                format!("layers:{n}")
            }
        };
        Ok(Self {
            source,
            name,
            kv: DraftKv::new(target.num_blocks(), target.block_size()),
            cost,
        })
    }

    /// Where the forward of draft position `position` starts for `job`: after what the draft
    /// cache holds for the first, at the previous draft for the rest.
    fn chunk_start(&mut self, job: &DraftJob<'_>, position: usize) -> usize {
        let len = job.tokens.len();
        if position > 0 {
            return len + position - 1;
        }
        match self.source {
            ModelSource::Model(_) => self.kv.start(job.seq, job.tokens, job.block_table),
            // The target's cache holds every position before the last token.
            ModelSource::TargetLayers(_) => len - 1,
        }
    }

    /// Runs one draft forward and learns what it cost.
    fn forward<B: Backend + ?Sized>(
        &mut self,
        target: &mut B,
        forwards: &[SeqForward<'_>],
    ) -> Result<Vec<f32>, EngineError> {
        let started = Instant::now();
        let logits = self.run_forward(target, forwards)?;
        // The curve is per sequence of a one-token-each forward; catch-up chunks are prompt-like
        // and would only blur it.
        if forwards.iter().all(|f| f.tokens.len() == 1) {
            self.cost
                .observe(forwards.len(), started.elapsed().as_secs_f64());
        }
        Ok(logits)
    }

    /// One draft forward of `forwards` (`[rows, vocab]` logits), as a step or a calibration runs
    /// it.
    pub fn run_forward<B: Backend + ?Sized>(
        &mut self,
        target: &mut B,
        forwards: &[SeqForward<'_>],
    ) -> Result<Vec<f32>, EngineError> {
        match &mut self.source {
            ModelSource::Model(draft) => {
                for f in forwards {
                    self.kv
                        .will_write(f.block_table, f.start_pos, f.start_pos + f.tokens.len());
                }
                draft.forward(forwards)
            }
            ModelSource::TargetLayers(layers) => target.forward_first_layers(forwards, *layers),
        }
    }
}

/// The tokens of `job`'s forward at a chunk starting at `start`: its tokens from there on for
/// the first draft position, the latest draft after that.
fn chunk(job: &DraftJob<'_>, drafted: &[u32], start: usize) -> Vec<u32> {
    match drafted.last() {
        None => job.tokens[start..].to_vec(),
        Some(&last) => vec![last],
    }
}

/// The draft token at output index `position`: the argmax for greedy requests, else a draw
/// with the request's random stream for that position (the draw the verifier makes from the
/// target's distribution).
pub(super) fn choose(row: &[f32], sampling: &SamplingParams, seed: u64, position: usize) -> u32 {
    if is_greedy(sampling) {
        argmax(row)
    } else {
        Distribution::new(row, sampling).sample(&mut position_rng(seed, position))
    }
}

impl Drafter for ModelDrafter {
    /// `draft:<model name>` or `layers:<N>`.
    fn name(&self) -> &str {
        &self.name
    }

    fn cost(&self) -> &StepCost {
        &self.cost
    }

    /// Replaces the draft forward's cost curve (after a calibration).
    fn set_cost(&mut self, cost: StepCost) {
        self.cost = cost;
    }

    /// Bytes of the drafter's own KV cache (0 for early exit, which uses the target's).
    fn kv_cache_bytes(&self, _target: &dyn Backend) -> u64 {
        match &self.source {
            ModelSource::Model(draft) => draft.kv_cache_bytes(),
            ModelSource::TargetLayers(_) => 0,
        }
    }

    /// Sequences whose cache state is kept (each is forgotten when it ends).
    fn tracked(&self) -> usize {
        self.kv.tracked()
    }

    /// Tokens of `seq` (with `tokens` and block table `table`) the drafter must run through
    /// before its next draft beyond the one a draft forward always takes: what its own cache
    /// lacks (a draft model's cache fills only when the sequence drafts). The target's layers
    /// read the target's cache, which is always current.
    fn catch_up(&mut self, seq: SeqKey, tokens: &[u32], table: &[u32]) -> usize {
        match self.source {
            ModelSource::Model(_) => {
                let last = tokens.len().saturating_sub(1);
                last.saturating_sub(self.kv.start(seq, tokens, table))
            }
            ModelSource::TargetLayers(_) => 0,
        }
    }

    /// Drafts `job.drafts` tokens for every job: one batched forward per draft position.
    /// Returns each job's drafts, in order.
    fn draft(
        &mut self,
        target: &mut dyn Backend,
        jobs: &[DraftJob<'_>],
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut drafts: Vec<Vec<u32>> = jobs.iter().map(|j| Vec::with_capacity(j.drafts)).collect();
        let depth = jobs.iter().map(|j| j.drafts).max().unwrap_or(0);
        for position in 0..depth {
            let active: Vec<usize> = (0..jobs.len())
                .filter(|&i| jobs[i].drafts > position)
                .collect();
            // [active] chunk start positions and tokens; one logits row each.
            let starts: Vec<usize> = active
                .iter()
                .map(|&i| self.chunk_start(&jobs[i], position))
                .collect();
            let chunks: Vec<Vec<u32>> = active
                .iter()
                .zip(&starts)
                .map(|(&i, &start)| chunk(&jobs[i], &drafts[i], start))
                .collect();
            let forwards: Vec<SeqForward<'_>> = active
                .iter()
                .zip(&starts)
                .zip(&chunks)
                .map(|((&i, &start), tokens)| SeqForward {
                    tokens,
                    start_pos: start,
                    block_table: jobs[i].block_table,
                    logits: LogitsFor::Last,
                })
                .collect();
            let logits = self.forward(target, &forwards)?; // [active, vocab]
            let vocab = target.config().vocab_size;
            if logits.len() != active.len() * vocab {
                return Err(EngineError::InvalidBatch(format!(
                    "draft forward returned {} logits for {} rows",
                    logits.len(),
                    active.len()
                )));
            }
            for (row, &i) in logits.chunks_exact(vocab).zip(&active) {
                let job = &jobs[i];
                drafts[i].push(choose(
                    row,
                    job.sampling,
                    job.seed,
                    job.first_position + position,
                ));
            }
        }
        Ok(drafts)
    }

    /// After verification of `drafted` drafts of which `accepted` were, for a sequence that had
    /// `len_before` tokens and now has `tokens` in blocks `table`.
    fn verified(
        &mut self,
        seq: SeqKey,
        tokens: &[u32],
        table: &[u32],
        len_before: usize,
        drafted: usize,
        accepted: usize,
    ) {
        if drafted == 0 || !matches!(self.source, ModelSource::Model(_)) {
            return;
        }
        // Forwards wrote up to the last draft but one; the accepted drafts among them hold.
        let valid = len_before + accepted.min(drafted - 1);
        self.kv.settle(seq, tokens, table, valid);
    }

    /// `seq` lost its blocks.
    fn preempted(&mut self, seq: SeqKey) {
        self.kv.preempted(seq);
    }

    /// `seq` ended.
    fn forget(&mut self, seq: SeqKey) {
        self.kv.forget(seq);
    }

    /// Tokens that share one pass of the drafting kernels over the weights.
    fn token_group(&self, target: &dyn Backend) -> usize {
        match &self.source {
            ModelSource::Model(draft) => draft.token_group(),
            ModelSource::TargetLayers(_) => target.token_group(),
        }
    }

    fn calibration_forward(
        &mut self,
        target: &mut dyn Backend,
        forwards: &[SeqForward<'_>],
    ) -> Result<(), EngineError> {
        self.run_forward(target, forwards).map(drop)
    }
}

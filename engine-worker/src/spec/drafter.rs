//! The seam model drafters share: a drafter that costs forwards drafts exactly the lengths the
//! policy planned, learns from each verdict, and rolls back what was rejected. Draft models and
//! early exit ([`super::ModelDrafter`]) and EAGLE-3 heads ([`super::HeadDrafter`]) are
//! implementations; the engine only plans, calls and reports.

use super::cost::StepCost;
use super::draft_model::{DraftJob, ModelDrafter, ModelSource};
use super::head::HeadDrafter;
use super::proposer::SeqKey;
use crate::backend::{Backend, SeqForward};
use crate::EngineError;

/// One sequence of a target forward, as a drafter that reads the target's states sees it.
#[derive(Debug, Clone, Copy)]
pub struct TargetRows {
    pub seq: SeqKey,
    /// Position of the forward's first token.
    pub start_pos: usize,
    /// Tokens the forward ran for this sequence.
    pub len: usize,
    /// Every token it ran is the sequence's already (a prompt or a recompute); otherwise the
    /// verdict says which hold.
    pub settled: bool,
}

/// A drafter whose drafts cost forwards.
pub trait Drafter: Send + std::fmt::Debug {
    /// `draft:<model>`, `layers:<N>` or `head:<name>`.
    fn name(&self) -> &str;
    /// Seconds of one draft forward by sequences in it.
    fn cost(&self) -> &StepCost;
    fn set_cost(&mut self, cost: StepCost);
    /// Bytes of the drafter's own KV cache.
    fn kv_cache_bytes(&self, target: &dyn Backend) -> u64;
    /// Sequences whose state is kept (each is forgotten when it ends).
    fn tracked(&self) -> usize;
    /// Tokens of `seq` the drafter must run through before its next draft beyond the one a
    /// draft forward always takes.
    fn catch_up(&mut self, seq: SeqKey, tokens: &[u32], table: &[u32]) -> usize;
    /// Drafts `job.drafts` tokens for every job; returns each job's drafts, in order.
    fn draft(
        &mut self,
        target: &mut dyn Backend,
        jobs: &[DraftJob<'_>],
    ) -> Result<Vec<Vec<u32>>, EngineError>;
    /// The target just ran a full forward of `rows` (in batch order): a drafter that reads the
    /// target's hidden states takes them now.
    fn target_forward(&mut self, target: &mut dyn Backend, rows: &[TargetRows]) {
        let _ = (target, rows);
    }
    /// After verification of `drafted` drafts of which `accepted` were (a prefill has none),
    /// for a sequence that had `len_before` tokens and now has `tokens` in blocks `table`.
    fn verified(
        &mut self,
        seq: SeqKey,
        tokens: &[u32],
        table: &[u32],
        len_before: usize,
        drafted: usize,
        accepted: usize,
    );
    /// `seq` lost its blocks.
    fn preempted(&mut self, seq: SeqKey);
    /// `seq` ended.
    fn forget(&mut self, seq: SeqKey);
    /// Whether it reads the target's hidden states (then a prefix-cache hit computes its last
    /// block again, so the drafter gets the states there).
    fn reads_target_states(&self) -> bool {
        false
    }
    /// Tokens that share one pass of the drafting kernels over the weights.
    fn token_group(&self, target: &dyn Backend) -> usize;
    /// One draft forward of one-token sequences, as a calibration times it.
    fn calibration_forward(
        &mut self,
        target: &mut dyn Backend,
        forwards: &[SeqForward<'_>],
    ) -> Result<(), EngineError>;
}

/// Where draft tokens come from, when they cost forwards.
pub enum DraftSource {
    /// A separate model with the target's vocabulary. Its paged KV cache has the target's
    /// block size and block count, and every sequence's block table indexes both.
    Model(Box<dyn Backend>),
    /// The target's first `layers` layers (early exit), in the target's own KV cache.
    TargetLayers(usize),
    /// An EAGLE-3 head over the target's hidden states, with a KV cache of the target's layout.
    Head(Box<crate::model::HeadWeights>),
}

impl std::fmt::Debug for DraftSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftSource::Model(b) => write!(f, "Model({})", b.config().name),
            DraftSource::TargetLayers(n) => write!(f, "TargetLayers({n})"),
            DraftSource::Head(h) => write!(f, "Head({})", h.config.name),
        }
    }
}

impl DraftSource {
    /// The drafter for `target`, its cost not yet measured (`cost`).
    pub fn into_drafter(
        self,
        target: &mut dyn Backend,
        cost: StepCost,
    ) -> Result<Box<dyn Drafter>, EngineError> {
        Ok(match self {
            DraftSource::Model(b) => {
                Box::new(ModelDrafter::new(ModelSource::Model(b), target, cost)?)
            }
            DraftSource::TargetLayers(n) => Box::new(ModelDrafter::new(
                ModelSource::TargetLayers(n),
                target,
                cost,
            )?),
            DraftSource::Head(w) => Box::new(HeadDrafter::new(*w, target, cost)?),
        })
    }
}

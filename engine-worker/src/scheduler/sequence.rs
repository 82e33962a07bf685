//! One request's state inside the engine.

use proto::api_worker::{SamplingParams, StopConditions};
use proto::RequestId;

use crate::kv::{BlockLink, BlockTable};
use crate::spec::RequestAcceptance;

#[derive(Debug)]
pub struct Sequence {
    pub id: RequestId,
    pub owner: String,
    pub arrival_unix_ms: u64,
    pub prompt_len: usize,
    /// Prompt positions the prefix cache held when the request was first admitted.
    pub cached_prompt_tokens: usize,
    /// Prompt followed by the output so far.
    pub tokens: Vec<u32>,
    pub sampling: SamplingParams,
    /// The request's seed, or one drawn at admission when it gave none.
    pub seed: u64,
    pub stop: StopConditions,
    /// Tokens that end it (EOS unless ignored, its stop tokens): what `min_tokens` masks.
    pub stop_ids: Vec<u32>,
    pub max_tokens: usize,
    /// Positions whose keys/values are in the cache (0 after a preemption).
    pub num_computed: usize,
    pub blocks: BlockTable,
    /// Leading full blocks of its computed tokens already offered to the prefix cache, and the
    /// cached content the last of them continues from (the next block's parent).
    pub offered_blocks: usize,
    pub offered_link: Option<BlockLink>,
    /// The prefill step ran (a preemption does not undo it: resumption is a verify step).
    pub prefilled: bool,
    /// `(drafted, accepted)` of every verification step, for resyncs.
    pub drafted: Vec<u8>,
    pub accepted: Vec<u8>,
    /// Per verification step, the tokens offered and the accepted tokens predicted (the
    /// policy's figures), for resyncs.
    pub offered: Vec<u8>,
    pub predicted_milli: Vec<u16>,
    /// The request's class, passed through to the token-processor.
    pub class: String,
    /// How this request's drafts fared against the worker's acceptance table.
    pub acceptance: RequestAcceptance,
    /// The request already appeared in a step batch (its start facts were sent).
    pub announced: bool,
    /// Decoded bytes of the output, kept only when the request has stop strings.
    pub output_bytes: Vec<u8>,
    /// One per output token when the request asked for logprobs (a resync sends them again).
    pub logprobs: Vec<proto::TokenLogprob>,
    /// One per prompt token after the first, once prefilled, when the request asked for
    /// prompt logprobs (a resync sends them again).
    pub prompt_logprobs: Vec<proto::TokenLogprob>,
    /// Where the output is in the request's `response_format`, when it has one.
    pub grammar: Option<Box<grammar::Grammar>>,
    /// Its grammar, while it compiles off the step loop: the sequence is not admitted yet.
    pub grammar_job: Option<crate::engine::GrammarJob>,
}

/// What a scheduled sequence runs this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequencePhase {
    /// First forward over the prompt; yields one token.
    Prefill,
    /// Resumed after preemption: recompute the cache for all but the last token, then verify.
    Recompute,
    /// Verify `[last, drafts..]`.
    Verify,
}

impl Sequence {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn num_generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    pub fn phase(&self) -> SequencePhase {
        if !self.prefilled {
            SequencePhase::Prefill
        } else if self.num_computed + 1 < self.tokens.len() {
            SequencePhase::Recompute
        } else {
            SequencePhase::Verify
        }
    }
}

//! One step's outcome per request, and its wire form ([`StepBatch`]).

use proto::worker_tp::{RequestStart, StepBatch, StepRow, VerifyTiming};

use proto::{FinishReason, RequestId, TokenLogprob};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// The prefill step: one token, not a verification step.
    Prefill,
    /// A verification step: `accepted + 1` tokens, fewer when a stop condition cut it short.
    Verify,
    /// Preempted (recompute) this step; no tokens.
    Preempted,
    /// Aborted; no tokens, finish `abort` (or `error` when the engine failed it).
    Abort,
}

/// Facts sent with a request's first row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartInfo {
    pub owner: String,
    pub prompt_tokens: u32,
    /// Of them, those the prefix cache held.
    pub cached_prompt_tokens: u32,
    pub arrival_unix_ms: u64,
    pub class: String,
}

/// One row's draft as the policy saw it: the proposer's whole offer (the verified draft is its
/// prefix, unless a grammar replaced it) and the accepted tokens predicted for what is verified.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowPolicy {
    /// Tokens offered, never fewer than the verified draft, never more than the row may carry.
    pub offered: u8,
    /// Expected accepted tokens of the verified draft, in thousandths.
    pub predicted_milli: u16,
    /// The offered tokens themselves (a model drafter offers what it drafted).
    pub offer: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RowOut {
    pub id: RequestId,
    pub kind: RowKind,
    pub tokens: Vec<u32>,
    /// One per token when the request asked for logprobs, else empty.
    pub logprobs: Vec<TokenLogprob>,
    /// On a prefill row whose request asked for prompt logprobs, one per prompt token after
    /// the first; else empty.
    pub prompt_logprobs: Vec<TokenLogprob>,
    pub drafted: u8,
    pub accepted: u8,
    /// What the drafting policy was offered and predicted (defaults on rows that verify
    /// nothing).
    pub policy: RowPolicy,
    pub finish: Option<FinishReason>,
    pub start: Option<StartInfo>,
}

/// Packs a step's rows, and its verify forward's timing, into the numbered batch the
/// token-processor reads.
pub fn to_step_batch(
    rows: &[RowOut],
    verify_timing: Option<VerifyTiming>,
    worker_id: &str,
    epoch: u64,
    seq: u64,
) -> StepBatch {
    let mut batch = StepBatch::new(worker_id.to_owned(), epoch, seq);
    for (i, row) in rows.iter().enumerate() {
        if let Some(start) = &row.start {
            batch.starts.push(RequestStart {
                row: i as u32,
                owner: start.owner.clone(),
                prompt_tokens: start.prompt_tokens,
                cached_prompt_tokens: start.cached_prompt_tokens,
                arrival_unix_ms: start.arrival_unix_ms,
                class: start.class.clone(),
            });
        }
        batch.push(StepRow {
            id: row.id,
            tokens: &row.tokens,
            drafted: row.drafted,
            accepted: row.accepted,
            offered: row.policy.offered,
            predicted_milli: row.policy.predicted_milli,
            prefill: row.kind == RowKind::Prefill,
            preempted: row.kind == RowKind::Preempted,
            finish: row.finish,
            logprobs: &row.logprobs,
            prompt_logprobs: &row.prompt_logprobs,
        });
    }
    batch.verify_timing = verify_timing;
    batch
}

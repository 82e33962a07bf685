//! The proposer boundary: n-gram and suffix trees today, a draft model or MTP heads later.

use proto::RequestId;

/// The sequence a proposal is for: stateful proposers keep per-sequence state under it.
pub type SeqKey = RequestId;

/// Drafts continuation tokens for one sequence. A proposal must be valid given only `tokens`
/// (any state a proposer keeps is a cache of them, rebuilt when it does not match); how many of
/// the drafts are verified is the drafting policy's decision.
pub trait Proposer: Send {
    /// Name reported in hellos and traces, e.g. "ngram".
    fn name(&self) -> &str;
    /// Appends at most `max_drafts` draft tokens continuing `tokens` (prompt + output) of
    /// sequence `seq` to `out` and returns the strength of the match they come from (0 when none
    /// was found; larger means the proposer trusts the draft more, e.g. the matched n-gram's
    /// length).
    fn propose(
        &mut self,
        seq: SeqKey,
        tokens: &[u32],
        max_drafts: usize,
        out: &mut Vec<u32>,
    ) -> usize;
    /// Sequence `seq` finished normally with `output` (its generated tokens): a proposer may
    /// learn from it, and drops the sequence's own state.
    fn finished(&mut self, seq: SeqKey, output: &[u32]) {
        let _ = output;
        self.forget(seq);
    }
    /// Sequence `seq` is gone (aborted, failed): drop any state kept for it.
    fn forget(&mut self, seq: SeqKey) {
        let _ = seq;
    }
}

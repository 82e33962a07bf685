//! The proposer boundary: n-gram today, a draft model or MTP heads later.

/// Drafts continuation tokens for one sequence. A proposal depends only on the sequence's own
/// tokens; how many of them are verified is the drafting policy's decision.
pub trait Proposer: Send {
    /// Name reported in hellos and traces, e.g. "ngram".
    fn name(&self) -> &str;
    /// Appends at most `max_drafts` draft tokens continuing `tokens` (prompt + output) to `out`
    /// and returns the strength of the match they come from (0 when none was found; larger
    /// means the proposer trusts the draft more, e.g. the matched n-gram's length).
    fn propose(&self, tokens: &[u32], max_drafts: usize, out: &mut Vec<u32>) -> usize;
}

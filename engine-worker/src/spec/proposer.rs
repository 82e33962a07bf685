//! The proposer boundary: n-gram today, a draft model or MTP heads later.

/// Drafts continuation tokens for one sequence. A proposal must depend only on the sequence's
/// own tokens, so a request's `(drafted, accepted)` sequence does not depend on the batch.
pub trait Proposer: Send {
    /// Name reported in hellos and traces, e.g. "ngram".
    fn name(&self) -> &str;
    /// Appends at most `max_drafts` draft tokens continuing `tokens` (prompt + output) to `out`.
    fn propose(&self, tokens: &[u32], max_drafts: usize, out: &mut Vec<u32>);
}

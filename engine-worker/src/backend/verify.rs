//! Token choice after a forward, on the host: the default behind
//! [`Backend::forward_and_verify`](super::Backend::forward_and_verify), and the reference a
//! backend that chooses on its device must match token for token.

use proto::api_worker::SamplingParams;

use super::SeqForward;
use crate::sampling::History;
use crate::spec::{verify_masked, Verification};
use crate::EngineError;
use grammar::Mask;

/// How one sequence of a forward picks its tokens from its logits rows.
#[derive(Debug, Clone, Copy)]
pub struct TokenChoice<'a> {
    pub sampling: &'a SamplingParams,
    /// The request's RNG seed.
    pub seed: u64,
    /// Output index of the first new token (it keys the request's RNG stream).
    pub first_position: usize,
    /// What the request's logits processors count (its prompt and output so far).
    pub history: History<'a>,
    /// Per row, the tokens the request's grammar allows there (empty without a grammar; see
    /// [`verify_masked`]).
    pub masks: &'a [Mask],
}

impl TokenChoice<'_> {
    /// Whether the choice is a plain argmax of the raw logits with nothing else to report
    /// (what a device may do itself; logprobs need the whole row on the host).
    pub fn is_plain_greedy(&self) -> bool {
        crate::sampling::is_greedy(self.sampling)
            && !self.sampling.processors.changes_logits()
            && self.sampling.logprobs.is_none()
            && self.masks.is_empty()
    }
}

/// Verifies each sequence's drafts against its rows of `logits` (`[sum of logit_rows, vocab]`,
/// as [`Backend::forward`](super::Backend::forward) returns them) and picks its next token.
pub fn verify_on_host(
    logits: &[f32],
    vocab: usize,
    seqs: &[SeqForward<'_>],
    choices: &[TokenChoice<'_>],
) -> Result<Vec<Verification>, EngineError> {
    check_choices(seqs, choices)?;
    let expected = seqs.iter().map(SeqForward::logit_rows).sum::<usize>() * vocab;
    if logits.len() != expected {
        return Err(EngineError::InvalidBatch(format!(
            "backend returned {} logits, expected {expected}",
            logits.len()
        )));
    }
    let mut offset = 0;
    let verdicts = seqs
        .iter()
        .zip(choices)
        .map(|(seq, choice)| {
            let rows = &logits[offset..offset + seq.logit_rows() * vocab];
            offset += rows.len();
            verify_masked(
                rows,
                vocab,
                seq.drafts(),
                choice.sampling,
                choice.seed,
                choice.first_position,
                &choice.history,
                choice.masks,
            )
        })
        .collect();
    Ok(verdicts)
}

/// The host path of [`Backend::forward_and_verify`](super::Backend::forward_and_verify): the
/// backend's forward, then [`verify_on_host`]. The trait's default, and the fallback of a
/// backend that chooses on its device only some of the time.
pub fn forward_then_verify_on_host<B: super::Backend + ?Sized>(
    backend: &mut B,
    seqs: &[SeqForward<'_>],
    choices: &[TokenChoice<'_>],
) -> Result<Vec<Verification>, EngineError> {
    check_choices(seqs, choices)?;
    let logits = backend.forward(seqs)?;
    verify_on_host(&logits, backend.config().vocab_size, seqs, choices)
}

/// One choice per sequence.
pub fn check_choices(
    seqs: &[SeqForward<'_>],
    choices: &[TokenChoice<'_>],
) -> Result<(), EngineError> {
    if choices.len() != seqs.len() {
        return Err(EngineError::InvalidBatch(format!(
            "{} token choices for {} sequences",
            choices.len(),
            seqs.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LogitsFor;

    #[test]
    fn a_prefill_gets_one_token_and_a_verify_chunk_checks_its_drafts() {
        let vocab = 4;
        // Sequence 0 (prefill, last row only) prefers 2; sequence 1 verifies [last, 3, 0]
        // against rows preferring 3, 1, 2: one draft accepted, then the correction 1.
        let logits = [
            0.0, 0.0, 1.0, 0.0, //
            0.0, 0.0, 0.0, 1.0, //
            0.0, 1.0, 0.0, 0.0, //
            0.0, 0.0, 1.0, 0.0,
        ];
        let (prompt, chunk, table) = ([1u32, 2, 3], [2u32, 3, 0], [0u32]);
        let seqs = [
            SeqForward::new(&prompt, 0, &table, LogitsFor::Last),
            SeqForward::new(&chunk, 3, &table, LogitsFor::All),
        ];
        let choice = TokenChoice {
            sampling: &SamplingParams::GREEDY,
            seed: 0,
            first_position: 0,
            history: History::EMPTY,
            masks: &[],
        };
        let verdicts = verify_on_host(&logits, vocab, &seqs, &[choice, choice]).unwrap();
        assert_eq!(
            verdicts,
            vec![
                Verification::new(0, 0, vec![2]),
                Verification::new(2, 1, vec![3, 1]),
            ]
        );
        assert!(verify_on_host(&logits[..8], vocab, &seqs, &[choice, choice]).is_err());
        assert!(verify_on_host(&logits, vocab, &seqs, &[choice]).is_err());
    }
}

//! Prompt logprobs (vLLM's `prompt_logprobs`; what OpenAI completions' `echo` with `logprobs`
//! reports): for a new sequence that asked for them, its prompt runs first with logits at
//! every position, in chunks, and position `i`'s row scores prompt token `i + 1`. The step's
//! prefill then runs only the prompt's last token, from the cache this wrote, so the request's
//! first output token comes from the same forward path as any other prefill's.
//!
//! The figures are the raw model's (log-softmax of the logits, no processors), as vLLM reports
//! prompt logprobs; speculation never touches the prompt, so they do not depend on it.

use crate::backend::{Backend, LogitsFor, SeqForward};
use crate::sampling::token_logprob;
use crate::scheduler::{Sequence, SequencePhase};

/// Prompt positions per forward: bounds the logits buffer (`[CHUNK, vocab]` f32, 12.6 MB for a
/// 49,152-token vocabulary) while keeping the weight pass shared by many rows.
const CHUNK: usize = 64;

/// Computes the prompt logprobs of every running sequence about to be prefilled that asked for
/// them, leaving its last prompt token for the step's prefill.
/// `ran(backend, seq, start, len)` follows each forward (a draft head takes its states).
pub fn compute_prompt_logprobs<B: Backend>(
    backend: &mut B,
    running: &mut [Sequence],
    mut ran: impl FnMut(&mut B, proto::RequestId, usize, usize),
) -> Result<(), crate::EngineError> {
    let vocab = backend.config().vocab_size;
    for seq in running
        .iter_mut()
        .filter(|s| s.phase() == SequencePhase::Prefill)
    {
        let Some(top) = seq.sampling.prompt_logprobs else {
            continue;
        };
        // The scheduler gives such a prompt no cached prefix: every position needs its row.
        let last = seq.prompt_len - 1;
        let mut scored = Vec::with_capacity(last);
        for start in (seq.num_computed..last).step_by(CHUNK) {
            let end = (start + CHUNK).min(last);
            let forward = SeqForward::new(
                &seq.tokens[start..end],
                start,
                seq.blocks.blocks(),
                LogitsFor::All,
            );
            // [end - start, vocab]: row r predicts the token at position start + r + 1.
            let logits = backend.forward(&[forward])?;
            ran(backend, seq.id, start, end - start);
            scored.extend(
                logits
                    .chunks_exact(vocab)
                    .zip(&seq.tokens[start + 1..=end])
                    .map(|(row, &next)| token_logprob(row, next, usize::from(top))),
            );
            seq.num_computed = end;
        }
        seq.prompt_logprobs = scored;
    }
    Ok(())
}

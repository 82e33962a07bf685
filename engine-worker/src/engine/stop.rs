//! Stop conditions, checked token by token as a step's tokens are appended.

use proto::FinishReason;
use vocab::{find_completed_stop, TokenBytes};

use crate::scheduler::Sequence;

pub struct StopRules<'a> {
    pub eos_token_ids: &'a [u32],
    pub vocab: Option<&'a TokenBytes>,
    pub max_model_len: usize,
}

impl StopRules<'_> {
    /// Appends `new` to `seq` up to and including the first token that ends it; returns how many
    /// were appended and why it ended, if it did.
    pub fn append(&self, seq: &mut Sequence, new: &[u32]) -> (usize, Option<FinishReason>) {
        for (i, &token) in new.iter().enumerate() {
            seq.tokens.push(token);
            if let Some(reason) = self.check(seq, token) {
                return (i + 1, Some(reason));
            }
        }
        (new.len(), None)
    }

    fn check(&self, seq: &mut Sequence, token: u32) -> Option<FinishReason> {
        // Before min_tokens outputs nothing but the length ends a request (vLLM's rule; EOS and
        // the stop tokens were masked, stop strings are not looked for).
        if seq.num_generated() < seq.sampling.processors.min_tokens as usize {
            if !seq.stop.stop_strings.is_empty() {
                if let Some(vocab) = self.vocab {
                    seq.output_bytes.extend_from_slice(vocab.get(token));
                }
            }
            return self.length_reached(seq);
        }
        if !seq.stop.ignore_eos && self.eos_token_ids.contains(&token) {
            return Some(FinishReason::Stop);
        }
        if seq.stop.stop_token_ids.contains(&token) {
            return Some(FinishReason::Stop);
        }
        if !seq.stop.stop_strings.is_empty() {
            if let Some(vocab) = self.vocab {
                let before = seq.output_bytes.len();
                seq.output_bytes.extend_from_slice(vocab.get(token));
                if find_completed_stop(&seq.output_bytes, before, &seq.stop.stop_strings).is_some()
                {
                    return Some(FinishReason::Stop);
                }
            }
        }
        self.length_reached(seq)
    }

    fn length_reached(&self, seq: &Sequence) -> Option<FinishReason> {
        (seq.num_generated() >= seq.max_tokens || seq.len() >= self.max_model_len)
            .then_some(FinishReason::Length)
    }
}

//! The boundary between the engine (scheduler, proposer, verifier, step driver) and the
//! hardware. A backend owns the weights and the paged KV cache's memory; the engine owns the
//! block bookkeeping and hands each sequence's block table in with every forward.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::model::ModelConfig;
use crate::EngineError;

/// Which positions of a sequence's chunk need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last position (prefill, plain decode).
    Last,
    /// Every position (verification of `[last, d_1..d_k]`: K+1 rows).
    All,
}

/// One sequence's share of a forward batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqForward<'a> {
    /// Tokens to run: a prompt (or prompt chunk) for prefill, `[last, d_1..d_k]` when verifying.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in the sequence = tokens already in the KV cache.
    pub start_pos: usize,
    /// Physical KV-cache blocks holding positions `0..start_pos + tokens.len()`, in order.
    pub block_table: &'a [u32],
    pub logits: LogitsFor,
}

impl SeqForward<'_> {
    pub fn logit_rows(&self) -> usize {
        match self.logits {
            LogitsFor::Last => 1,
            LogitsFor::All => self.tokens.len(),
        }
    }
}

/// A model on a device with its paged KV cache.
pub trait Backend: Send {
    fn config(&self) -> &ModelConfig;
    /// Tokens per KV block.
    fn block_size(&self) -> usize;
    /// KV blocks the cache holds.
    fn num_blocks(&self) -> usize;
    /// Runs one batched forward. Writes the new tokens' keys/values into the blocks named by
    /// each block table and returns f32 logits, `[sum of logit_rows, vocab_size]` row-major, in
    /// sequence order. Each sequence's result does not depend on the others in the batch.
    fn forward(&mut self, seqs: &[SeqForward<'_>]) -> Result<Vec<f32>, EngineError>;
}

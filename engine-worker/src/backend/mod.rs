//! The boundary between the engine (scheduler, proposer, verifier, step driver) and the
//! hardware. A backend owns the weights and the paged KV cache's memory; the engine owns the
//! block bookkeeping and hands each sequence's block table in with every forward.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod verify;

pub use verify::{check_choices, forward_then_verify_on_host, verify_on_host, TokenChoice};

use crate::model::ModelConfig;
use crate::spec::Verification;
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

impl<'a> SeqForward<'a> {
    pub fn new(
        tokens: &'a [u32],
        start_pos: usize,
        block_table: &'a [u32],
        logits: LogitsFor,
    ) -> Self {
        Self {
            tokens,
            start_pos,
            block_table,
            logits,
        }
    }

    pub fn logit_rows(&self) -> usize {
        match self.logits {
            LogitsFor::Last => 1,
            LogitsFor::All => self.tokens.len(),
        }
    }

    /// The drafts this chunk verifies: `tokens[1..]` when every position gets logits (a verify
    /// chunk `[last, d_1..d_k]`), none when only the last does.
    pub fn drafts(&self) -> &'a [u32] {
        match self.logits {
            LogitsFor::Last => &[],
            LogitsFor::All => self.tokens.get(1..).unwrap_or(&[]),
        }
    }
}

/// What a draft head reads beside each token's embedding (see [`HeadForward`]).
#[derive(Debug, Clone, Copy)]
pub enum HeadInput<'a> {
    /// The target's captured states, `[tokens, layers * target hidden]`
    /// ([`Backend::take_hidden`]'s rows): fused by the head's `fc`.
    Target(&'a [f32]),
    /// The head's own pre-norm output at the previous position, `[tokens, head hidden]`.
    Own(&'a [f32]),
}

/// One sequence's share of a draft head's forward. The head's position `p` reads the token at
/// `p + 1` with the target's state at `p`: it predicts the token at `p + 2`.
#[derive(Debug, Clone, Copy)]
pub struct HeadForward<'a> {
    /// The tokens at positions `start_pos + 1 ..`, one per head position.
    pub tokens: &'a [u32],
    /// Head position of `tokens[0]`.
    pub start_pos: usize,
    /// The sequence's blocks (the head's cache has the target's layout).
    pub block_table: &'a [u32],
    pub input: HeadInput<'a>,
    /// Rows that get draft logits and hand back their state.
    pub logits: LogitsFor,
}

/// A draft head forward's result, for the rows that asked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeadOutput {
    /// `[rows, draft vocab]`.
    pub logits: Vec<f32>,
    /// `[rows, head hidden]`: each row's pre-norm output, the next position's [`HeadInput::Own`].
    pub hidden: Vec<f32>,
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

    /// Tokens that share one pass of the kernels over the weights (the CPU kernels decode each
    /// weight block once per group of this many tokens): a forward's cost steps up each time its
    /// tokens start a new group, which the drafting policy's cost curve models. 1 where the
    /// cost has no such steps.
    fn token_group(&self) -> usize {
        1
    }

    /// Runs one batched forward like [`Backend::forward`] and, per sequence, verifies its
    /// [drafts](SeqForward::drafts) and picks one token of the model's own
    /// ([`crate::spec::verify`]); `choices` has one entry per sequence. The default verifies on
    /// the host; a backend may override it to choose on its device, as long as every token is
    /// the one the host would choose.
    fn forward_and_verify(
        &mut self,
        seqs: &[SeqForward<'_>],
        choices: &[TokenChoice<'_>],
    ) -> Result<Vec<Verification>, EngineError> {
        forward_then_verify_on_host(self, seqs, choices)
    }

    /// Early exit, for self-speculation (LayerSkip, Elhoushi et al. 2024; Draft & Verify,
    /// Zhang et al. 2023): a forward like [`Backend::forward`] through only the first `layers`
    /// decoder layers, then the final norm and the LM head. It writes those layers' keys and
    /// values at the chunk's positions, which a full forward of the same tokens at the same
    /// positions writes again, identically, before it reads them: drafting this way needs no
    /// cache of its own and leaves the target's exactly as verification expects it.
    fn forward_first_layers(
        &mut self,
        seqs: &[SeqForward<'_>],
        layers: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let _ = (seqs, layers);
        Err(EngineError::BackendUnavailable {
            backend: self.config().name.clone(),
            reason: "this backend cannot run a forward through its first layers only".into(),
        })
    }

    /// Bytes the KV cache takes (0 where unknown).
    fn kv_cache_bytes(&self) -> u64 {
        0
    }

    /// From now on, every full forward keeps the residual stream entering each of `layers`
    /// (layer indices, in the order given) for every token it runs: the hidden states an
    /// EAGLE-3 draft head reads (Li et al. 2025, <https://arxiv.org/abs/2503.01840>). Taken
    /// from the forward the model runs anyway; no second pass. Empty `layers` stops capturing.
    fn capture_hidden(&mut self, layers: &[usize]) -> Result<(), EngineError> {
        if layers.is_empty() {
            return Ok(());
        }
        Err(EngineError::BackendUnavailable {
            backend: self.config().name.clone(),
            reason: "this backend cannot hand a draft head the target's hidden states".into(),
        })
    }

    /// Loads an EAGLE-3 draft head beside the model, with a KV cache of the model's layout
    /// (same block size and count; every sequence's block table indexes both).
    fn attach_draft_head(&mut self, head: crate::model::HeadWeights) -> Result<(), EngineError> {
        Err(EngineError::BackendUnavailable {
            backend: self.config().name.clone(),
            reason: format!("this backend cannot run draft head {}", head.config.name),
        })
    }

    /// Runs the attached draft head over `seqs`: writes each position's keys and values into
    /// the head's cache through the block table and returns the asked rows' draft logits and
    /// states.
    fn head_forward(&mut self, seqs: &[HeadForward<'_>]) -> Result<HeadOutput, EngineError> {
        let _ = seqs;
        Err(EngineError::BackendUnavailable {
            backend: self.config().name.clone(),
            reason: "no draft head is attached".into(),
        })
    }

    /// Bytes of the draft head's KV cache (0 without one).
    fn head_kv_cache_bytes(&self) -> u64 {
        0
    }

    /// The hidden states the last full forward captured (see [`Backend::capture_hidden`]):
    /// `[tokens of that forward in batch order, layers * hidden]`, row-major, each row the
    /// captured layers' states side by side. Taking them leaves the buffer empty.
    fn take_hidden(&mut self) -> Vec<f32> {
        Vec::new()
    }
}

/// Lets the step driver hold whichever backend `--device` chose.
impl Backend for Box<dyn Backend> {
    fn config(&self) -> &ModelConfig {
        (**self).config()
    }
    fn block_size(&self) -> usize {
        (**self).block_size()
    }
    fn num_blocks(&self) -> usize {
        (**self).num_blocks()
    }
    fn forward(&mut self, seqs: &[SeqForward<'_>]) -> Result<Vec<f32>, EngineError> {
        (**self).forward(seqs)
    }
    fn token_group(&self) -> usize {
        (**self).token_group()
    }
    fn forward_and_verify(
        &mut self,
        seqs: &[SeqForward<'_>],
        choices: &[TokenChoice<'_>],
    ) -> Result<Vec<Verification>, EngineError> {
        (**self).forward_and_verify(seqs, choices)
    }
    fn forward_first_layers(
        &mut self,
        seqs: &[SeqForward<'_>],
        layers: usize,
    ) -> Result<Vec<f32>, EngineError> {
        (**self).forward_first_layers(seqs, layers)
    }
    fn kv_cache_bytes(&self) -> u64 {
        (**self).kv_cache_bytes()
    }
    fn capture_hidden(&mut self, layers: &[usize]) -> Result<(), EngineError> {
        (**self).capture_hidden(layers)
    }
    fn take_hidden(&mut self) -> Vec<f32> {
        (**self).take_hidden()
    }
    fn attach_draft_head(&mut self, head: crate::model::HeadWeights) -> Result<(), EngineError> {
        (**self).attach_draft_head(head)
    }
    fn head_forward(&mut self, seqs: &[HeadForward<'_>]) -> Result<HeadOutput, EngineError> {
        (**self).head_forward(seqs)
    }
    fn head_kv_cache_bytes(&self) -> u64 {
        (**self).head_kv_cache_bytes()
    }
}

/// Where the model runs (`--device`): `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self, EngineError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("cpu") {
            return Ok(Device::Cpu);
        }
        if s.eq_ignore_ascii_case("cuda") {
            return Ok(Device::Cuda(0));
        }
        match s.split_once(':') {
            Some((prefix, n)) if prefix.eq_ignore_ascii_case("cuda") => n
                .parse()
                .map(Device::Cuda)
                .map_err(|_| EngineError::BackendUnavailable {
                    backend: s.to_owned(),
                    reason: "expected cuda:N with N a device ordinal".into(),
                }),
            _ => Err(EngineError::BackendUnavailable {
                backend: s.to_owned(),
                reason: "unknown device; use cpu, cuda or cuda:N".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Device;

    #[test]
    fn device_names_parse() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("CUDA:3".parse::<Device>().unwrap(), Device::Cuda(3));
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("tpu".parse::<Device>().is_err());
    }
}

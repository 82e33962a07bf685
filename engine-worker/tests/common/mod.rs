//! Test support: a tiny deterministic "model" behind the real `Backend` trait, and request
//! helpers. Not every test binary uses every item.
#![allow(dead_code)]

use engine_worker::backend::{Backend, LogitsFor, SeqForward};
pub use engine_worker::engine::ProposerKind;
use engine_worker::engine::{Engine, EngineConfig, RowKind, RowOut};
use engine_worker::model::ModelConfig;
pub use engine_worker::spec::{SpecPolicy, SuffixConfig};
use engine_worker::EngineError;
use proto::api_worker::{AddRequest, SamplingParams, StopConditions};
use proto::{FinishReason, RequestId};
use std::collections::HashMap;

/// A toy language model whose paged "KV cache" stores, per position, the token and a hash chain
/// over the whole prefix (like real keys/values, a function of every earlier token). Reading a
/// position re-derives the chain through the block table, so a wrong table, a block shared by
/// two sequences or a stale slot is an error, not a silently different answer. The next-token
/// logits depend on the last two tokens only, so greedy text turns periodic and n-gram drafts
/// get accepted.
pub struct ToyBackend {
    config: ModelConfig,
    block_size: usize,
    num_blocks: usize,
    /// `(token, chain)` per slot `block * block_size + offset`.
    slots: Vec<Option<(u32, u64)>>,
    /// Logit scale: larger is peakier.
    pub sharpness: f32,
    pub forwards: usize,
    /// A draft's distance from the toy model: its logits blend this much of another toy model
    /// (keyed by `noise_salt`) into the toy's own. 0: the toy model itself.
    pub noise: f32,
    pub noise_salt: u64,
}

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x
}

/// The toy model's logits after `prev, cur`.
pub fn toy_logits(vocab: usize, sharpness: f32, prev: Option<u32>, cur: u32) -> Vec<f32> {
    toy_logits_salted(vocab, sharpness, prev, cur, 0)
}

/// Another toy model's logits (`salt` 0: the toy model).
pub fn toy_logits_salted(
    vocab: usize,
    sharpness: f32,
    prev: Option<u32>,
    cur: u32,
    salt: u64,
) -> Vec<f32> {
    let ctx = mix(u64::from(prev.map_or(u32::MAX, |p| p)), u64::from(cur) + 1);
    // Salt 0 leaves the toy model's own logits exactly as they were before drafts existed.
    let ctx = if salt == 0 { ctx } else { mix(ctx, salt) };
    (0..vocab)
        .map(|v| {
            let h = mix(ctx, v as u64 + 17);
            sharpness * ((h >> 11) as f32 / (1u64 << 53) as f32)
        })
        .collect()
}

impl ToyBackend {
    pub fn new(vocab: usize, eos: Vec<u32>, num_blocks: usize, block_size: usize) -> Self {
        let mut config = ModelConfig::tiny();
        config.name = "toy".into();
        config.vocab_size = vocab;
        config.eos_token_ids = eos;
        config.max_position_embeddings = 1 << 20;
        // Room for early exits (the toy has no weights; layers only name exits).
        config.num_layers = 8;
        Self {
            config,
            block_size,
            num_blocks,
            slots: vec![None; num_blocks * block_size],
            sharpness: 8.0,
            forwards: 0,
            noise: 0.0,
            noise_salt: 0,
        }
    }

    /// A draft model for this toy: the same vocabulary and cache layout, logits `noise` away.
    pub fn draft(&self, noise: f32, noise_salt: u64) -> Self {
        let mut draft = Self::new(
            self.config.vocab_size,
            self.config.eos_token_ids.clone(),
            self.num_blocks,
            self.block_size,
        );
        draft.config.name = format!("toy-draft-{noise}");
        draft.sharpness = self.sharpness;
        draft.noise = noise;
        draft.noise_salt = noise_salt;
        draft
    }

    fn slot(&self, table: &[u32], pos: usize) -> Result<usize, EngineError> {
        let block = *table.get(pos / self.block_size).ok_or_else(|| {
            EngineError::InvalidBatch(format!("position {pos} past the block table"))
        })? as usize;
        if block >= self.num_blocks {
            return Err(EngineError::InvalidBatch(format!(
                "block {block} out of range"
            )));
        }
        Ok(block * self.block_size + pos % self.block_size)
    }

    fn read(&self, table: &[u32], pos: usize) -> Result<(u32, u64), EngineError> {
        self.slots[self.slot(table, pos)?]
            .ok_or_else(|| EngineError::InvalidBatch(format!("position {pos} never written")))
    }

    /// Checks the chain up to `pos` and returns the logits after it, `noise` of them from the
    /// toy model keyed by `salt`.
    fn logits_at(
        &self,
        table: &[u32],
        pos: usize,
        noise: f32,
        salt: u64,
    ) -> Result<Vec<f32>, EngineError> {
        let mut chain = 0u64;
        let mut prev = None;
        let mut cur = 0;
        for p in 0..=pos {
            let (token, stored) = self.read(table, p)?;
            chain = mix(chain, u64::from(token));
            if chain != stored {
                return Err(EngineError::InvalidBatch(format!(
                    "cache corrupt at position {p}"
                )));
            }
            prev = (p > 0).then_some(cur);
            cur = token;
        }
        let own = toy_logits(self.config.vocab_size, self.sharpness, prev, cur);
        if noise == 0.0 {
            return Ok(own);
        }
        let other = toy_logits_salted(self.config.vocab_size, self.sharpness, prev, cur, salt);
        Ok(own
            .iter()
            .zip(other)
            .map(|(a, b)| (1.0 - noise) * a + noise * b)
            .collect())
    }

    /// Writes the chunks' slots and returns their logits rows, `noise` away from the toy's.
    fn run(
        &mut self,
        seqs: &[SeqForward<'_>],
        noise: f32,
        salt: u64,
    ) -> Result<Vec<f32>, EngineError> {
        self.forwards += 1;
        let mut out = Vec::new();
        for s in seqs {
            if s.tokens.is_empty() {
                return Err(EngineError::InvalidBatch("empty sequence".into()));
            }
            for (i, &token) in s.tokens.iter().enumerate() {
                let pos = s.start_pos + i;
                let chain = if pos == 0 {
                    0
                } else {
                    self.read(s.block_table, pos - 1)?.1
                };
                let slot = self.slot(s.block_table, pos)?;
                self.slots[slot] = Some((token, mix(chain, u64::from(token))));
            }
            let end = s.start_pos + s.tokens.len();
            let rows = match s.logits {
                LogitsFor::Last => end - 1..end,
                LogitsFor::All => s.start_pos..end,
            };
            for pos in rows {
                out.extend(self.logits_at(s.block_table, pos, noise, salt)?);
            }
        }
        Ok(out)
    }
}

impl Backend for ToyBackend {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    fn forward(&mut self, seqs: &[SeqForward<'_>]) -> Result<Vec<f32>, EngineError> {
        self.run(seqs, self.noise, self.noise_salt)
    }
    /// Early exit: the shallower the exit, the farther from the toy's own logits.
    fn forward_first_layers(
        &mut self,
        seqs: &[SeqForward<'_>],
        layers: usize,
    ) -> Result<Vec<f32>, EngineError> {
        if layers == 0 || layers >= self.config.num_layers {
            return Err(EngineError::InvalidBatch(format!(
                "no early exit at {layers}"
            )));
        }
        self.run(seqs, 1.0 / (1.0 + layers as f32), 1000 + layers as u64)
    }
}

pub fn request(
    id: RequestId,
    prompt: Vec<u32>,
    max_tokens: u32,
    sampling: SamplingParams,
) -> AddRequest {
    AddRequest {
        id,
        prompt_token_ids: prompt,
        sampling,
        stop: StopConditions {
            ignore_eos: false,
            ..StopConditions::default()
        },
        max_tokens,
        arrival_unix_ms: 0,
        owner: "test-api".into(),
        class: "other".into(),
    }
}

/// A request's outcome as the token-processor would see it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    /// `(drafted, accepted)` of each verify step.
    pub steps: Vec<(u8, u8)>,
    pub finish: Option<FinishReason>,
    pub preemptions: usize,
    /// One per token when the request asked for logprobs.
    pub logprobs: Vec<proto::TokenLogprob>,
}

/// Applies rows to outcomes, checking the row contract on the way.
pub fn collect(rows: &[RowOut], k: usize, outcomes: &mut HashMap<RequestId, Outcome>) {
    for row in rows {
        let o = outcomes.entry(row.id).or_default();
        assert!(o.finish.is_none(), "row for finished request {}", row.id);
        assert!(
            row.accepted <= row.drafted && row.drafted as usize <= k,
            "{row:?}"
        );
        match row.kind {
            RowKind::Prefill => {
                assert_eq!(row.tokens.len(), 1, "{row:?}");
                assert!(o.tokens.is_empty());
            }
            RowKind::Verify => {
                assert!(!row.tokens.is_empty() && row.tokens.len() <= row.accepted as usize + 1);
                if row.finish.is_none() {
                    assert_eq!(row.tokens.len(), row.accepted as usize + 1);
                }
                o.steps.push((row.drafted, row.accepted));
            }
            RowKind::Preempted => {
                assert!(row.tokens.is_empty());
                o.preemptions += 1;
            }
            RowKind::Abort => assert!(row.tokens.is_empty()),
        }
        assert!(
            row.logprobs.is_empty() || row.logprobs.len() == row.tokens.len(),
            "{row:?}"
        );
        o.tokens.extend_from_slice(&row.tokens);
        o.logprobs.extend_from_slice(&row.logprobs);
        o.finish = row.finish;
    }
}

/// Runs the engine until every request finished.
pub fn run_to_completion<B: Backend>(
    engine: &mut Engine<B>,
    outcomes: &mut HashMap<RequestId, Outcome>,
) {
    let k = engine.config().num_spec_tokens;
    let mut steps = 0;
    while engine.has_work() {
        let rows = engine.step();
        collect(&rows, k, outcomes);
        engine.scheduler().check_invariants().unwrap();
        steps += 1;
        assert!(steps < 100_000, "engine does not terminate");
    }
    assert_eq!(
        engine.scheduler().allocator().num_free(),
        engine.scheduler().allocator().num_blocks()
    );
}

/// An engine with the fixed drafting policy: every proposed token is verified, so a request's
/// `(drafted, accepted)` sequence does not depend on the batch or the machine's speed.
pub fn engine_config(k: usize, max_num_seqs: usize) -> EngineConfig {
    EngineConfig {
        num_spec_tokens: k,
        spec_policy: SpecPolicy::Fixed,
        proposer: ProposerKind::Ngram,
        ngram_min: 1,
        ngram_max: 3,
        suffix: SuffixConfig::default(),
        max_num_seqs,
        max_num_batched_tokens: 512,
        max_model_len: 4096,
        max_waiting: 100_000,
        prefix_caching: true,
    }
}

/// `n` seeded random prompts of 1 to `max_len - 1` tokens from ids `1..vocab`.
pub fn random_prompts(n: usize, seed: u64, vocab: usize, max_len: usize) -> Vec<Vec<u32>> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            // i32, as the suites drew it before this helper: the same prompts for a seed.
            let len = rng.gen_range(1..max_len as i32);
            (0..len).map(|_| rng.gen_range(1..vocab as u32)).collect()
        })
        .collect()
}

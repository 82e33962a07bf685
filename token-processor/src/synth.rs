//! Synthetic step batches for the benchmarks (criterion bench, `tp-bench`, and the Python
//! reference via [`Synth::to_json`]): a worker with a fixed number of running requests, each
//! prefilled, then decoded with `(d, a)` drawn like an n-gram/MTP proposer, finishing after a
//! random length and replaced by a new request. Deterministic for a seed: ChaCha8, whose stream
//! `rand_chacha` keeps stable across versions and platforms, so a seed names the same workload.

use proto::worker_tp::{RequestStart, StepBatch, StepRow};
use proto::{FinishReason, RequestId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// True with probability `p`. Not `Rng::gen_bool`, which panics on a `p` outside `0..=1`
/// (`SynthConfig::accept_p` is public): here such a `p` is simply never or always true.
fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    rng.gen::<f64>() < p
}

#[derive(Debug, Clone)]
pub struct SynthConfig {
    pub worker_id: String,
    pub epoch: u64,
    /// Rows per batch (running requests).
    pub rows: usize,
    /// K.
    pub num_spec_tokens: u8,
    /// Output length of a request, in tokens, drawn from `min_len..=max_len`.
    pub min_len: u32,
    pub max_len: u32,
    /// Probability that each further draft position is accepted.
    pub accept_p: f64,
    pub owner: String,
    pub seed: u64,
}

#[derive(Debug, Clone)]
struct Live {
    id: RequestId,
    remaining: u32,
    prefilled: bool,
}

#[derive(Debug, Clone)]
pub struct Synth {
    cfg: SynthConfig,
    rng: ChaCha8Rng,
    next_id: RequestId,
    seq: u64,
    live: Vec<Option<Live>>,
    finished: u64,
    tokens: Vec<u32>,
}

impl Synth {
    pub fn new(cfg: SynthConfig) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let live = vec![None; cfg.rows];
        Self {
            cfg,
            rng,
            next_id: 1,
            seq: 0,
            live,
            finished: 0,
            tokens: Vec::new(),
        }
    }

    /// Requests finished so far.
    pub fn finished(&self) -> u64 {
        self.finished
    }

    /// The next step: one row per running request; finished requests are replaced next step.
    pub fn next_batch(&mut self) -> StepBatch {
        let mut batch = StepBatch::new(self.cfg.worker_id.clone(), self.cfg.epoch, self.seq);
        self.seq += 1;
        let k = self.cfg.num_spec_tokens;
        for slot in 0..self.cfg.rows {
            let live = match &mut self.live[slot] {
                Some(live) => live,
                empty => {
                    let (min, max) = (self.cfg.min_len, self.cfg.max_len);
                    let len = self.rng.gen_range(min..=max.max(min));
                    let id = self.next_id;
                    self.next_id += 1;
                    empty.insert(Live {
                        id,
                        remaining: len.max(1),
                        prefilled: false,
                    })
                }
            };
            let (drafted, accepted, n_tokens, prefill) = if !live.prefilled {
                live.prefilled = true;
                batch.starts.push(RequestStart {
                    row: batch.len() as u32,
                    owner: self.cfg.owner.clone(),
                    prompt_tokens: self.rng.gen_range(32..544),
                    cached_prompt_tokens: 0,
                    arrival_unix_ms: 0,
                    class: String::new(),
                });
                (0, 0, 1, true)
            } else {
                let d = if k == 0 || chance(&mut self.rng, 0.1) {
                    self.rng.gen_range(0..=k)
                } else {
                    k
                };
                let mut a = 0;
                while a < d && chance(&mut self.rng, self.cfg.accept_p) {
                    a += 1;
                }
                (d, a, u32::from(a) + 1, false)
            };
            let n_tokens = n_tokens.min(live.remaining);
            live.remaining -= n_tokens;
            self.tokens.clear();
            for _ in 0..n_tokens {
                self.tokens.push(self.rng.gen_range(0..49_152));
            }
            let finish = (live.remaining == 0).then(|| {
                if chance(&mut self.rng, 0.5) {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                }
            });
            batch.push(StepRow {
                id: live.id,
                tokens: &self.tokens,
                drafted,
                accepted,
                offered: drafted,
                predicted_milli: u16::from(accepted) * 1000,
                prefill,
                preempted: false,
                finish,
                logprobs: &[],
                prompt_logprobs: &[],
            });
            if finish.is_some() {
                self.finished += 1;
                self.live[slot] = None;
            }
        }
        batch
    }

    /// One batch as a JSON line for `scripts/bench/fd_reference.py`.
    pub fn to_json(batch: &StepBatch) -> String {
        let starts: Vec<(u32, &str, u32)> = batch
            .starts
            .iter()
            .map(|s| (s.row, s.owner.as_str(), s.prompt_tokens))
            .collect();
        serde_json::json!({
            "ids": batch.ids,
            "token_offsets": batch.token_offsets,
            "tokens": batch.tokens,
            "drafted": batch.drafted,
            "accepted": batch.accepted,
            "flags": batch.flags,
            "finish": batch.finish,
            "starts": starts,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_batches_are_valid_and_requests_finish() {
        let mut synth = Synth::new(SynthConfig {
            worker_id: "w".into(),
            epoch: 1,
            rows: 64,
            num_spec_tokens: 4,
            min_len: 4,
            max_len: 40,
            accept_p: 0.7,
            owner: "api".into(),
            seed: 7,
        });
        for seq in 0..200 {
            let batch = synth.next_batch();
            assert_eq!(batch.seq, seq);
            assert_eq!(batch.len(), 64);
            batch.validate(4).unwrap();
        }
        assert!(synth.finished() > 64);
    }
}

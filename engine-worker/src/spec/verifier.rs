//! Verification of a draft against the target model's logits.
//!
//! Greedy (temperature 0): accept drafts while each equals the target's argmax, then add the
//! argmax after the last accepted one.
//!
//! Sampled: speculative sampling (Leviathan et al. 2023, Chen et al. 2023) accepts draft `x`
//! with probability `min(1, p(x)/q(x))` for a draft distribution `q` and target `p`, and on
//! rejection draws from `norm(max(0, p - q))`. Both proposers draft deterministically, so `q` is
//! a point mass on `x`: accept with probability `p(x)`, else draw from `p` without `x`. This
//! module runs it coupled: each position draws its token from `p` with the request's RNG for
//! that position, as a step without drafts does, and a draft is accepted iff it equals that
//! draw. The draw equals `x` with probability `p(x)`, and given that it does not, it follows
//! `p` without `x`: the same law as the textbook form, and, beyond it, the same tokens as
//! decoding without speculation for the same seed, whatever was drafted. Greedy and sampled
//! output are therefore both independent of the drafting policy and of the load it follows.

use grammar::Mask;
use proto::api_worker::SamplingParams;
use proto::TokenLogprob;

use crate::sampling::{
    argmax, is_greedy, position_rng, token_logprob, Distribution, History, Processing,
};

/// The verifier's decision for one sequence and step.
#[derive(Debug, Clone, PartialEq)]
pub struct Verification {
    /// Drafts verified.
    pub drafted: usize,
    /// Drafts accepted (the longest valid prefix).
    pub accepted: usize,
    /// The accepted drafts followed by the target's own token: `accepted + 1` tokens.
    pub tokens: Vec<u32>,
    /// One per token when the request asked for logprobs (from the row it was chosen from, so
    /// the same as a step without drafts gives), else empty.
    pub logprobs: Vec<TokenLogprob>,
}

impl Verification {
    /// A verdict without logprobs.
    pub fn new(drafted: usize, accepted: usize, tokens: Vec<u32>) -> Self {
        Self {
            drafted,
            accepted,
            tokens,
            logprobs: Vec::new(),
        }
    }
}

/// Verifies `drafts` given `logits`: `drafts.len() + 1` rows of `vocab` logits, row `i` being the
/// target's prediction after the sequence extended by `drafts[..i]`. `first_position` is the
/// output index the first new token gets (it keys the request's RNG stream). Without drafts
/// that is the plain choice of one token from one row (prefill, decode). The request's logits
/// processors see each row with the history it would have in a sequential decode: `history`
/// and the drafts before it.
pub fn verify(
    logits: &[f32],
    vocab: usize,
    drafts: &[u32],
    params: &SamplingParams,
    seed: u64,
    first_position: usize,
    history: &History<'_>,
) -> Verification {
    verify_masked(
        logits,
        vocab,
        drafts,
        params,
        seed,
        first_position,
        history,
        &[],
    )
}

/// [`verify`] under a grammar: row `i`'s tokens outside `masks[i]` are ruled out, after the
/// processors. `masks` has a row for every draft the grammar allows and the one after the last
/// of them (a draft it rules out cannot be the row's choice, so no later row is read); empty
/// when the request has no grammar.
#[allow(clippy::too_many_arguments)]
pub fn verify_masked(
    logits: &[f32],
    vocab: usize,
    drafts: &[u32],
    params: &SamplingParams,
    seed: u64,
    first_position: usize,
    history: &History<'_>,
    masks: &[Mask],
) -> Verification {
    assert_eq!(logits.len(), (drafts.len() + 1) * vocab);
    let mut processing = Processing::new(&params.processors, history);
    let mut processed = Vec::new();
    let greedy = is_greedy(params);
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    let mut logprobs = Vec::new();
    for i in 0..=drafts.len() {
        let raw = &logits[i * vocab..(i + 1) * vocab];
        let mask = masks.get(i);
        let row = match (&processing, mask) {
            (None, None) => raw,
            (state, mask) => {
                processed.clear();
                processed.extend_from_slice(raw);
                if let Some(state) = state {
                    state.apply(&mut processed);
                }
                if let Some(mask) = mask {
                    mask.apply(&mut processed);
                }
                &processed[..]
            }
        };
        let target = match greedy {
            true => argmax(row),
            false => {
                Distribution::new(row, params).sample(&mut position_rng(seed, first_position + i))
            }
        };
        tokens.push(target);
        if let Some(top) = params.logprobs {
            logprobs.push(token_logprob(row, target, usize::from(top)));
        }
        if drafts.get(i) != Some(&target) {
            // Row `drafts.len()` has no draft: its token is the step's own.
            return Verification {
                drafted: drafts.len(),
                accepted: i,
                tokens,
                logprobs,
            };
        }
        if let Some(state) = &mut processing {
            state.push(target);
        }
    }
    unreachable!("the row after the last draft has no draft to match")
}

#[cfg(test)]
mod tests {
    use super::*;
    use grammar::Mask;

    const GREEDY: SamplingParams = SamplingParams::GREEDY;

    fn one_hot_rows(targets: &[u32], vocab: usize) -> Vec<f32> {
        let mut logits = vec![0.0; targets.len() * vocab];
        for (i, &t) in targets.iter().enumerate() {
            logits[i * vocab + t as usize] = 1.0;
        }
        logits
    }

    #[test]
    fn greedy_accepts_the_matching_prefix_then_corrects() {
        let logits = one_hot_rows(&[3, 1, 4, 1], 8);
        let v = verify(&logits, 8, &[3, 1, 5], &GREEDY, 0, 0, &History::EMPTY);
        assert_eq!(v, Verification::new(3, 2, vec![3, 1, 4]));
        let v = verify(&logits, 8, &[3, 1, 4], &GREEDY, 0, 0, &History::EMPTY);
        assert_eq!(v, Verification::new(3, 3, vec![3, 1, 4, 1]));
        let v = verify(&logits[..8], 8, &[], &GREEDY, 0, 0, &History::EMPTY);
        assert_eq!(v, Verification::new(0, 0, vec![3]));
    }

    #[test]
    fn sampling_accepts_a_certain_draft_and_rejects_an_impossible_one() {
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 1,
            seed: Some(1),
            processors: proto::api_worker::LogitsProcessors::NONE,
            logprobs: None,
            prompt_logprobs: None,
            structured: None,
        };
        let logits = one_hot_rows(&[3, 1], 8);
        let v = verify(&logits, 8, &[3], &params, 5, 0, &History::EMPTY);
        assert_eq!(v, Verification::new(1, 1, vec![3, 1]));
        let v = verify(&logits, 8, &[2], &params, 5, 0, &History::EMPTY);
        assert_eq!(v, Verification::new(1, 0, vec![3]));
    }

    #[test]
    fn without_drafts_it_is_the_plain_choice_of_one_token() {
        use crate::sampling::{position_rng, Distribution};
        let row = [0.5f32, 2.0, 1.0, 1.9];
        let greedy = verify(&row, 4, &[], &GREEDY, 0, 0, &History::EMPTY);
        assert_eq!(greedy.tokens, vec![argmax(&row)]);
        let params = SamplingParams {
            temperature: 1.3,
            top_p: 0.9,
            top_k: 0,
            seed: Some(4),
            processors: proto::api_worker::LogitsProcessors::NONE,
            logprobs: None,
            prompt_logprobs: None,
            structured: None,
        };
        for position in 0..50 {
            let plain = Distribution::new(&row, &params).sample(&mut position_rng(4, position));
            let v = verify(&row, 4, &[], &params, 4, position, &History::EMPTY);
            assert_eq!((v.drafted, v.accepted, v.tokens), (0, 0, vec![plain]));
        }
    }

    /// The coupled form: whatever is drafted, position `i`'s token is what plain sampling draws
    /// there with the same seed; drafts are accepted up to the first that differs from it.
    #[test]
    fn sampled_verification_emits_the_draws_of_plain_sampling() {
        use crate::sampling::{position_rng, Distribution};
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (vocab, k) = (6, 4);
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: Some(3),
            processors: proto::api_worker::LogitsProcessors::NONE,
            logprobs: None,
            prompt_logprobs: None,
            structured: None,
        };
        let (mut accepted_some, mut rejected_some) = (false, false);
        for trial in 0..400 {
            let logits: Vec<f32> = (0..(k + 1) * vocab)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let drafts: Vec<u32> = (0..rng.gen_range(0..=k))
                .map(|_| rng.gen_range(0..3))
                .collect();
            let first = trial * 10;
            let plain: Vec<u32> = (0..=drafts.len())
                .map(|i| {
                    let row = &logits[i * vocab..(i + 1) * vocab];
                    Distribution::new(row, &params).sample(&mut position_rng(3, first + i))
                })
                .collect();
            let rows = &logits[..(drafts.len() + 1) * vocab];
            let v = verify(rows, vocab, &drafts, &params, 3, first, &History::EMPTY);
            let agree = drafts
                .iter()
                .zip(&plain)
                .take_while(|(d, p)| d == p)
                .count();
            assert_eq!(v.accepted, agree, "trial {trial}");
            assert_eq!(v.tokens, plain[..=agree], "trial {trial}");
            accepted_some |= agree > 0;
            rejected_some |= agree < drafts.len();
        }
        assert!(accepted_some && rejected_some);
    }

    /// With penalties, each draft position sees the counts that a sequential decode would: a
    /// draft that repeats a token the previous draft emitted is penalized at its own row.
    #[test]
    fn processors_see_each_draft_position_as_decode_would() {
        let vocab = 4;
        let mut params = GREEDY;
        params.processors.presence_penalty = 2.0;
        // Every row is the same. Decode: 1 (nothing penalized), then 2 (1 is now at −1), then
        // 0 (2 is now at −1.5).
        let row = [0.0, 1.0, 0.5, -5.0];
        let logits: Vec<f32> = row.iter().cycle().take(3 * vocab).copied().collect();
        let history = History {
            tokens: &[3],
            prompt_len: 1,
            stop_ids: &[],
        };
        // Sequential decode, one row at a time with the history grown by each token.
        let mut sequential = Vec::new();
        let mut grown = vec![3u32];
        for _ in 0..3 {
            let h = History {
                tokens: &grown,
                prompt_len: 1,
                stop_ids: &[],
            };
            let v = verify(&row, vocab, &[], &params, 0, grown.len() - 1, &h);
            sequential.push(v.tokens[0]);
            grown.push(v.tokens[0]);
        }
        assert_eq!(sequential, vec![1, 2, 0]);
        // The same tokens drafted are all accepted; a draft that ignores the penalty is not.
        let v = verify(&logits, vocab, &[1, 2], &params, 0, 0, &history);
        assert_eq!((v.accepted, v.tokens), (2, vec![1, 2, 0]));
        let v = verify(&logits, vocab, &[1, 1], &params, 0, 0, &history);
        assert_eq!((v.accepted, v.tokens), (1, vec![1, 2]));
    }

    /// Logprobs of a verified step are those of the same tokens decoded one step at a time: each
    /// comes from its own row after the processors, with the counts of its position.
    #[test]
    fn logprobs_with_drafts_equal_those_of_sequential_steps() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let vocab = 7;
        let mut params = GREEDY;
        params.logprobs = Some(3);
        params.processors.frequency_penalty = 0.7;
        params.processors.repetition_penalty = 1.3;
        for _ in 0..100 {
            let logits: Vec<f32> = (0..4 * vocab).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let prompt = [1u32, 2];
            let history = History {
                tokens: &prompt,
                prompt_len: 2,
                stop_ids: &[],
            };
            // The sequential decode, row by row.
            let mut grown = prompt.to_vec();
            let mut sequential = Vec::new();
            for i in 0..4 {
                let h = History {
                    tokens: &grown,
                    prompt_len: 2,
                    stop_ids: &[],
                };
                let row = &logits[i * vocab..(i + 1) * vocab];
                let v = verify(row, vocab, &[], &params, 0, i, &h);
                assert_eq!(v.logprobs.len(), 1);
                assert_eq!(v.logprobs[0].top.len(), 3);
                grown.push(v.tokens[0]);
                sequential.push(v);
            }
            let drafts: Vec<u32> = sequential[..3].iter().map(|v| v.tokens[0]).collect();
            let v = verify(&logits, vocab, &drafts, &params, 0, 0, &history);
            assert_eq!(v.accepted, 3);
            let expected: Vec<_> = sequential.iter().map(|v| v.logprobs[0].clone()).collect();
            assert_eq!(v.logprobs, expected);
            // A rejected draft: the logprobs stop with the tokens.
            let mut wrong = drafts.clone();
            wrong[1] = (wrong[1] + 1) % vocab as u32;
            let v = verify(&logits, vocab, &wrong, &params, 0, 0, &history);
            assert_eq!(v.logprobs, expected[..2]);
        }
    }

    /// A grammar's masks rule tokens out row by row: the row's choice is the best allowed
    /// token, so a draft the mask rules out is rejected there and no later row is read; the
    /// logprobs are those of the masked row.
    #[test]
    fn masks_constrain_each_row_and_end_the_drafts_they_rule_out() {
        let logits = one_hot_rows(&[3, 1, 4], 8);
        let masks = [Mask::only(3), Mask::only(5)];
        let mut params = GREEDY;
        params.logprobs = Some(1);
        let v = verify_masked(&logits, 8, &[3, 1], &params, 0, 0, &History::EMPTY, &masks);
        assert_eq!((v.drafted, v.accepted, &v.tokens[..]), (2, 1, &[3, 5][..]));
        assert_eq!(
            v.logprobs[1].logprob, 0.0,
            "the only allowed token is certain"
        );
        assert_eq!(v.logprobs[1].top, vec![(5, 0.0)]);
        // Without masks the same drafts are judged by the logits alone.
        let v = verify(&logits, 8, &[3, 1], &params, 0, 0, &History::EMPTY);
        assert_eq!((v.accepted, v.tokens), (2, vec![3, 1, 4]));
    }
}

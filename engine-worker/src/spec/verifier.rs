//! Verification of a draft against the target model's logits.
//!
//! Greedy (temperature 0): accept drafts while each equals the target's argmax, then add the
//! argmax after the last accepted one. Otherwise speculative sampling (Leviathan et al. 2023,
//! Chen et al. 2023): with a draft distribution `q` and target `p`, accept draft `x` with
//! probability `min(1, p(x)/q(x))`, on rejection draw from `norm(max(0, p - q))`. An n-gram
//! proposer's `q` is a point mass on `x`, so that is: accept with probability `p(x)`, else draw
//! from `p` with `x` removed and renormalized. Either way the output follows `p` exactly.

use proto::api_worker::SamplingParams;
use rand::Rng;

use crate::sampling::{argmax, is_greedy, position_rng, Distribution};

/// The verifier's decision for one sequence and step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Drafts verified.
    pub drafted: usize,
    /// Drafts accepted (the longest valid prefix).
    pub accepted: usize,
    /// The accepted drafts followed by the target's own token: `accepted + 1` tokens.
    pub tokens: Vec<u32>,
}

/// Verifies `drafts` given `logits`: `drafts.len() + 1` rows of `vocab` logits, row `i` being the
/// target's prediction after the sequence extended by `drafts[..i]`. `first_position` is the
/// output index the first new token gets (it keys the request's RNG stream). Without drafts
/// that is the plain choice of one token from one row (prefill, decode).
pub fn verify(
    logits: &[f32],
    vocab: usize,
    drafts: &[u32],
    params: &SamplingParams,
    seed: u64,
    first_position: usize,
) -> Verdict {
    debug_assert_eq!(logits.len(), (drafts.len() + 1) * vocab);
    let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    if is_greedy(params) {
        for (i, &draft) in drafts.iter().enumerate() {
            let target = argmax(row(i));
            tokens.push(target);
            if target != draft {
                return Verdict {
                    drafted: drafts.len(),
                    accepted: i,
                    tokens,
                };
            }
        }
        tokens.push(argmax(row(drafts.len())));
        return Verdict {
            drafted: drafts.len(),
            accepted: drafts.len(),
            tokens,
        };
    }
    for (i, &draft) in drafts.iter().enumerate() {
        let dist = Distribution::new(row(i), params);
        let mut rng = position_rng(seed, first_position + i);
        if rng.gen::<f64>() < dist.prob(draft) {
            tokens.push(draft);
        } else {
            tokens.push(dist.sample_excluding(Some(draft), &mut rng));
            return Verdict {
                drafted: drafts.len(),
                accepted: i,
                tokens,
            };
        }
    }
    let dist = Distribution::new(row(drafts.len()), params);
    let mut rng = position_rng(seed, first_position + drafts.len());
    tokens.push(dist.sample(&mut rng));
    Verdict {
        drafted: drafts.len(),
        accepted: drafts.len(),
        tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let v = verify(&logits, 8, &[3, 1, 5], &GREEDY, 0, 0);
        assert_eq!(
            v,
            Verdict {
                drafted: 3,
                accepted: 2,
                tokens: vec![3, 1, 4]
            }
        );
        let v = verify(&logits, 8, &[3, 1, 4], &GREEDY, 0, 0);
        assert_eq!(
            v,
            Verdict {
                drafted: 3,
                accepted: 3,
                tokens: vec![3, 1, 4, 1]
            }
        );
        let v = verify(&logits[..8], 8, &[], &GREEDY, 0, 0);
        assert_eq!(
            v,
            Verdict {
                drafted: 0,
                accepted: 0,
                tokens: vec![3]
            }
        );
    }

    #[test]
    fn sampling_accepts_a_certain_draft_and_rejects_an_impossible_one() {
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 1,
            seed: Some(1),
        };
        let logits = one_hot_rows(&[3, 1], 8);
        let v = verify(&logits, 8, &[3], &params, 5, 0);
        assert_eq!(
            v,
            Verdict {
                drafted: 1,
                accepted: 1,
                tokens: vec![3, 1]
            }
        );
        let v = verify(&logits, 8, &[2], &params, 5, 0);
        assert_eq!(
            v,
            Verdict {
                drafted: 1,
                accepted: 0,
                tokens: vec![3]
            }
        );
    }

    #[test]
    fn without_drafts_it_is_the_plain_choice_of_one_token() {
        use crate::sampling::{position_rng, Distribution};
        let row = [0.5f32, 2.0, 1.0, 1.9];
        let greedy = verify(&row, 4, &[], &GREEDY, 0, 0);
        assert_eq!(greedy.tokens, vec![argmax(&row)]);
        let params = SamplingParams {
            temperature: 1.3,
            top_p: 0.9,
            top_k: 0,
            seed: Some(4),
        };
        for position in 0..50 {
            let plain = Distribution::new(&row, &params).sample(&mut position_rng(4, position));
            let v = verify(&row, 4, &[], &params, 4, position);
            assert_eq!((v.drafted, v.accepted, v.tokens), (0, 0, vec![plain]));
        }
    }
}

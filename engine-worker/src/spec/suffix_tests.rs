//! The suffix proposer against a brute-force reference that scans the texts for every count.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// What followed `pattern` in `texts`, counted within the tries' depth.
fn followers(texts: &[Vec<u32>], pattern: &[u32], depth: usize) -> BTreeMap<u32, u64> {
    let mut counts = BTreeMap::new();
    if pattern.len() + 1 > depth {
        return counts;
    }
    for text in texts {
        for end in pattern.len()..text.len() {
            if &text[end - pattern.len()..end] == pattern {
                *counts.entry(text[end]).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// The reference draft of `tokens` from `texts`: (drafts, match length, score).
fn reference(
    texts: &[Vec<u32>],
    tokens: &[u32],
    depth: usize,
    max_match: usize,
    max_drafts: usize,
) -> Option<(Vec<u32>, usize, f64)> {
    let match_len = (1..=max_match.min(tokens.len()))
        .rev()
        .find(|&l| !followers(texts, &tokens[tokens.len() - l..], depth).is_empty())?;
    let limit = ((MAX_SPEC_FACTOR * match_len as f64).ceil() as usize).clamp(1, max_drafts);
    let mut pattern = tokens[tokens.len() - match_len..].to_vec();
    let (mut drafts, mut chance, mut score) = (Vec::new(), 1.0, 0.0);
    while drafts.len() < limit {
        let f = followers(texts, &pattern, depth);
        let total: u64 = f.values().sum();
        // Most frequent; among equals the smallest token (BTreeMap order, strict >).
        let Some((&token, &count)) = f.iter().fold(None, |best, e| match best {
            Some((_, c)) if e.1 <= c => best,
            _ => Some(e),
        }) else {
            break;
        };
        chance *= count as f64 / total as f64;
        if chance < MIN_TOKEN_PROB {
            break;
        }
        drafts.push(token);
        score += chance;
        pattern.push(token);
    }
    (!drafts.is_empty()).then_some((drafts, match_len, score))
}

fn max_match(depth: usize, max_drafts: usize) -> usize {
    depth.saturating_sub(max_drafts).max(depth / 2).max(1)
}

fn random_text(rng: &mut ChaCha8Rng, len: std::ops::Range<usize>, alphabet: u32) -> Vec<u32> {
    let len = rng.gen_range(len);
    (0..len).map(|_| rng.gen_range(0..alphabet)).collect()
}

#[test]
fn own_drafts_match_the_brute_force_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for _ in 0..40 {
        let depth = rng.gen_range(2..10);
        let alphabet = rng.gen_range(2..6);
        let text = random_text(&mut rng, 1..120, alphabet);
        let mut p = SuffixProposer::new(SuffixConfig {
            max_depth: depth,
            max_cached_outputs: 0,
        });
        let mut at = 0;
        while at < text.len() {
            at = (at + rng.gen_range(1..4)).min(text.len());
            let k = rng.gen_range(1..7);
            let tokens = &text[..at];
            let mut out = Vec::new();
            let strength = p.propose(5, tokens, k, &mut out);
            let want = reference(&[tokens.to_vec()], tokens, depth, max_match(depth, k), k);
            match want {
                Some((drafts, len, _)) => {
                    assert_eq!(
                        (out, strength),
                        (drafts, len),
                        "{tokens:?} k={k} depth={depth}"
                    )
                }
                None => assert_eq!((out.len(), strength), (0, 0), "{tokens:?}"),
            }
        }
    }
}

#[test]
fn the_better_of_own_and_shared_drafts_is_proposed() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for _ in 0..40 {
        let depth = rng.gen_range(2..10);
        let alphabet = rng.gen_range(2..5);
        let mut p = SuffixProposer::new(SuffixConfig {
            max_depth: depth,
            max_cached_outputs: 16,
        });
        let outputs: Vec<Vec<u32>> = (0..rng.gen_range(1..5))
            .map(|_| random_text(&mut rng, 1..40, alphabet))
            .collect();
        for (i, o) in outputs.iter().enumerate() {
            p.propose(100 + i as u64, o, 3, &mut Vec::new());
            p.finished(100 + i as u64, o);
        }
        assert_eq!(p.num_requests(), 0);
        let text = random_text(&mut rng, 1..60, alphabet);
        for at in 1..=text.len() {
            let tokens = &text[..at];
            let k = rng.gen_range(1..7);
            let m = max_match(depth, k);
            let own = reference(&[tokens.to_vec()], tokens, depth, m, k);
            let shared = reference(&outputs, tokens, depth, m, k);
            let want = match (own, shared) {
                (Some(a), Some(b)) => Some(if b.2 > a.2 { b } else { a }),
                (a, b) => a.or(b),
            };
            let mut out = Vec::new();
            let strength = p.propose(1, tokens, k, &mut out);
            let want = want.map_or((Vec::new(), 0), |w| (w.0, w.1));
            assert_eq!((out, strength), want, "{tokens:?} k={k} depth={depth}");
        }
    }
}

#[test]
fn a_repeated_answer_is_drafted_from_the_shared_trie() {
    let mut p = SuffixProposer::new(SuffixConfig::default());
    let answer: Vec<u32> = (10..40).collect();
    p.finished(1, &answer);
    assert_eq!(p.num_cached_outputs(), 1);
    // A new request that has started the same answer drafts its continuation.
    let tokens = [7, 8, 10, 11, 12, 13];
    let mut out = Vec::new();
    assert_eq!(p.propose(2, &tokens, 4, &mut out), 4);
    assert_eq!(out, [14, 15, 16, 17]);
}

#[test]
fn request_state_is_dropped_when_a_request_ends() {
    let mut p = SuffixProposer::new(SuffixConfig::default());
    p.propose(1, &[1, 2, 1], 4, &mut Vec::new());
    p.propose(2, &[3, 4, 3], 4, &mut Vec::new());
    assert_eq!(p.num_requests(), 2);
    p.forget(1);
    p.finished(2, &[3]);
    p.forget(9);
    assert_eq!(p.num_requests(), 0);
}

#[test]
fn the_request_tries_have_a_backstop_bound() {
    let mut p = SuffixProposer::new(SuffixConfig::default());
    for id in 0..(MAX_REQUEST_TRIES as u64 + 10) {
        p.propose(id, &[1, 2], 2, &mut Vec::new());
    }
    assert_eq!(p.num_requests(), MAX_REQUEST_TRIES);
}

#[test]
fn any_sequence_is_safe_to_propose_for() {
    let mut p = SuffixProposer::new(SuffixConfig {
        max_depth: 0,
        max_cached_outputs: 1,
    });
    let mut out = Vec::new();
    assert_eq!(p.propose(1, &[], 4, &mut out), 0);
    assert_eq!(
        p.propose(1, &[u32::MAX, u32::MAX, u32::MAX], 0, &mut out),
        0
    );
    p.propose(1, &[u32::MAX, u32::MAX, u32::MAX], 8, &mut out);
    assert!(out.len() <= 8 && out.iter().all(|&t| t == u32::MAX));
    // A shorter, different sequence under the same key (a rebuilt request) is fine too.
    out.clear();
    p.propose(1, &[5, 5], 3, &mut out);
    assert_eq!(out, [5]);
    p.finished(1, &[]);
}

//! Automatic prefix caching through the engine on the toy model, whose cache reads re-derive a
//! hash chain over the whole prefix through the block table (a block shared with the wrong
//! prefix, or overwritten while shared, is an error): requests that start alike share blocks
//! and give the tokens and `(drafted, accepted)` they give with caching off, with a roomy cache
//! and with one small enough to preempt and evict; a chat's next turn finds the previous
//! answer's blocks.

mod common;

use std::collections::HashMap;

use common::*;
use engine_worker::engine::{Engine, EngineConfig};
use engine_worker::scheduler::PrefixCacheStats;
use proto::api_worker::SamplingParams;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const VOCAB: usize = 48;

/// Prompts from three stems (up to 40 tokens) with random tails, some a stem exactly.
fn prompts(n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let stems: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            let len = rng.gen_range(4..40);
            (0..len).map(|_| rng.gen_range(1..VOCAB as u32)).collect()
        })
        .collect();
    (0..n)
        .map(|_| {
            let mut p = stems[rng.gen_range(0..stems.len())].clone();
            let tail = rng.gen_range(0..12);
            p.extend((0..tail).map(|_| rng.gen_range(1..VOCAB as u32)));
            p
        })
        .collect()
}

/// Runs the requests in waves of `wave` (each wave added once the previous one finished, so
/// later waves find the earlier prompts cached).
fn run(
    cfg: EngineConfig,
    num_blocks: usize,
    block_size: usize,
    reqs: &[(Vec<u32>, u32, SamplingParams)],
    wave: usize,
) -> (Vec<Outcome>, PrefixCacheStats, usize) {
    let backend = ToyBackend::new(VOCAB, vec![0], num_blocks, block_size);
    let mut engine = Engine::new(backend, cfg, None);
    let mut outcomes = HashMap::new();
    for (w, chunk) in reqs.chunks(wave).enumerate() {
        for (i, (prompt, max_tokens, sampling)) in chunk.iter().enumerate() {
            let id = (w * wave + i) as u64;
            engine
                .add_request(request(id, prompt.clone(), *max_tokens, sampling.clone()))
                .unwrap();
        }
        run_to_completion(&mut engine, &mut outcomes);
    }
    let preemptions = outcomes.values().map(|o| o.preemptions).sum();
    let outs = (0..reqs.len() as u64)
        .map(|i| outcomes[&i].clone())
        .collect();
    (outs, engine.scheduler().prefix_stats(), preemptions)
}

fn config(k: usize, prefix_caching: bool) -> EngineConfig {
    let mut cfg = engine_config(k, 8);
    cfg.prefix_caching = prefix_caching;
    cfg
}

fn requests(n: usize, seed: u64) -> Vec<(Vec<u32>, u32, SamplingParams)> {
    let seeded = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 20,
        seed: Some(seed),
        processors: proto::api_worker::LogitsProcessors::NONE,
        logprobs: None,
        prompt_logprobs: None,
        structured: None,
    };
    prompts(n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let sampling = if i % 4 == 3 {
                seeded.clone()
            } else {
                SamplingParams::GREEDY
            };
            (p, 1 + (i as u32 * 7) % 40, sampling)
        })
        .collect()
}

#[test]
fn shared_prefixes_are_computed_once_and_change_no_token() {
    for (seed, k, block_size) in [(1, 0, 4), (2, 4, 4), (3, 4, 1), (4, 2, 16), (5, 4, 2)] {
        let reqs = requests(32, seed);
        let (off, off_stats, _) = run(config(k, false), 4096, block_size, &reqs, 8);
        let (on, on_stats, _) = run(config(k, true), 4096, block_size, &reqs, 8);
        assert_eq!(off_stats.hit_tokens, 0);
        assert_eq!(on_stats.queried_tokens, off_stats.queried_tokens);
        assert!(
            on_stats.hit_tokens * 4 > on_stats.queried_tokens,
            "seed {seed}: only {on_stats:?} came from the cache"
        );
        for i in 0..reqs.len() {
            assert_eq!(on[i].tokens, off[i].tokens, "seed {seed}, request {i}");
            assert_eq!(on[i].steps, off[i].steps, "seed {seed}, request {i}");
        }
    }
}

#[test]
fn a_cache_too_small_for_the_prefixes_evicts_them_and_changes_no_token() {
    let reqs = requests(48, 9);
    let mut cfg = config(4, false);
    cfg.max_num_seqs = 16;
    let (roomy, _, none) = run(cfg.clone(), 4096, 4, &reqs, 16);
    assert_eq!(none, 0);
    // 40 blocks of 4 tokens hold neither 16 running sequences nor every prompt seen.
    cfg.prefix_caching = true;
    let (tight, stats, preemptions) = run(cfg, 40, 4, &reqs, 16);
    assert!(preemptions > 0, "the tight cache should force preemptions");
    assert!(stats.hit_tokens > 0, "{stats:?}");
    for i in 0..reqs.len() {
        assert_eq!(roomy[i].tokens, tight[i].tokens, "request {i}");
        assert_eq!(roomy[i].steps, tight[i].steps, "request {i}");
    }
}

/// The next turn of a chat: the new prompt is the last prompt, its answer and a new message.
/// The answer's blocks were cached as it was generated, so the new prompt finds all of them.
#[test]
fn the_next_turn_finds_the_previous_answer_cached() {
    let block_size = 4;
    for k in [0, 4] {
        let first = prompts(1, 11).remove(0);
        let turn = |prefix_caching: bool| {
            let backend = ToyBackend::new(VOCAB, vec![0], 4096, block_size);
            let mut engine = Engine::new(backend, config(k, prefix_caching), None);
            let mut outcomes = HashMap::new();
            engine
                .add_request(request(0, first.clone(), 30, SamplingParams::GREEDY))
                .unwrap();
            run_to_completion(&mut engine, &mut outcomes);
            let history: Vec<u32> = first.iter().chain(&outcomes[&0].tokens).copied().collect();
            let second: Vec<u32> = history.iter().copied().chain([5, 6, 7]).collect();
            let before = engine.scheduler().prefix_stats().hit_tokens;
            engine
                .add_request(request(1, second, 20, SamplingParams::GREEDY))
                .unwrap();
            run_to_completion(&mut engine, &mut outcomes);
            let hits = engine.scheduler().prefix_stats().hit_tokens - before;
            (outcomes[&1].clone(), hits, history.len())
        };
        let (cached, hits, history) = turn(true);
        let (full, no_hits, _) = turn(false);
        assert_eq!(no_hits, 0);
        // Every whole block of the first turn but the one holding its last token's next slot.
        let want = (history - 1) / block_size * block_size;
        assert!(
            hits as usize >= want,
            "K={k}: {hits} of {history} tokens cached"
        );
        assert_eq!(cached.tokens, full.tokens, "K={k}");
        assert_eq!(cached.steps, full.steps, "K={k}");
    }
}

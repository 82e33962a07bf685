//! Seeded randomized runs of the scheduler and KV allocator through the engine: random
//! arrivals, aborts (waiting or running), preemptions forced by a small cache, and finishes.
//! Half the prompts share a start, so prefix-cache blocks are shared, released and evicted.
//! Every step the invariants hold; at the end every block is free again.

mod common;

use std::collections::HashMap;

use common::*;
use engine_worker::engine::Engine;
use proto::api_worker::SamplingParams;
use proto::FinishReason;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random_run(seed: u64, k: usize) -> (usize, usize, usize, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let block_size = [1, 2, 4, 16][rng.gen_range(0..4)];
    // At least one full-length sequence fits; a few more do not.
    let min_blocks = 96usize.div_ceil(block_size);
    let num_blocks = rng.gen_range(min_blocks..min_blocks * 3);
    let backend = ToyBackend::new(40, vec![0], num_blocks, block_size);
    let mut cfg = engine_config(k, rng.gen_range(1..10));
    cfg.max_num_batched_tokens = rng.gen_range(8..200);
    cfg.max_model_len = 96;
    let mut engine = Engine::new(backend, cfg, None);
    let mut outcomes = HashMap::new();
    let mut next_id = 0u64;
    let mut live: Vec<u64> = Vec::new();
    let (mut aborted, mut preempted) = (0, 0);
    for _ in 0..400 {
        if rng.gen_bool(0.3) {
            let len = rng.gen_range(1..30);
            // Half the prompts start alike, so the prefix cache is shared and evicted too.
            let stem = if rng.gen_bool(0.5) { len / 2 } else { 0 };
            let prompt = (0..len)
                .map(|i| {
                    if i < stem {
                        i as u32 + 1
                    } else {
                        rng.gen_range(1..40)
                    }
                })
                .collect();
            let sampling = if rng.gen_bool(0.5) {
                SamplingParams::GREEDY
            } else {
                SamplingParams {
                    temperature: 0.8,
                    top_p: 0.9,
                    top_k: 10,
                    seed: Some(next_id),
                    processors: proto::api_worker::LogitsProcessors::NONE,
                    logprobs: None,
                    prompt_logprobs: None,
                    structured: None,
                }
            };
            let max_tokens = rng.gen_range(1..60);
            engine
                .add_request(request(next_id, prompt, max_tokens, sampling))
                .unwrap();
            live.push(next_id);
            next_id += 1;
        }
        if !live.is_empty() && rng.gen_bool(0.05) {
            let id = live.swap_remove(rng.gen_range(0..live.len()));
            if engine.abort(id) {
                aborted += 1;
            }
        }
        let rows = engine.step();
        collect(&rows, k, &mut outcomes);
        engine.scheduler().check_invariants().unwrap();
        live.retain(|id| outcomes.get(id).is_none_or(|o| o.finish.is_none()));
    }
    run_to_completion(&mut engine, &mut outcomes);
    let hit_tokens = engine.scheduler().prefix_stats().hit_tokens;
    for o in outcomes.values() {
        preempted += o.preemptions;
        assert!(o.finish.is_some(), "every request ends");
        if o.finish != Some(FinishReason::Abort) {
            assert!(!o.tokens.is_empty());
        }
    }
    assert_eq!(outcomes.len() as u64, next_id, "every request got rows");
    (next_id as usize, aborted, preempted, hit_tokens)
}

#[test]
fn random_admit_abort_preempt_finish_never_leaks_blocks() {
    let (mut total, mut aborted, mut preempted, mut hit_tokens) = (0, 0, 0, 0);
    for seed in 0..40 {
        let k = [0, 2, 4][seed as usize % 3];
        let (n, a, p, h) = random_run(seed, k);
        hit_tokens += h;
        total += n;
        aborted += a;
        preempted += p;
    }
    // The runs must actually exercise what they claim to.
    assert!(
        total > 1000 && aborted > 20 && preempted > 20 && hit_tokens > 1000,
        "{total} {aborted} {preempted} {hit_tokens}"
    );
}

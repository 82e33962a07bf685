//! Logits processors under speculation, on the toy model: with each of presence, frequency and
//! repetition penalties, logit bias, min_tokens and min-p, greedy and seeded outputs with drafts
//! (K = 4 from the suffix proposer, every proposed token verified, at batch 1 and 8, and under
//! preemption) equal those
//! of K = 0, with the same logprobs (each token's and its top 3, from the processed row), and
//! each processor changes the output (so the comparison is not of two unprocessed runs).

mod common;

use std::collections::HashMap;

use common::*;
use engine_worker::engine::Engine;
use proto::api_worker::{LogitsProcessors, SamplingParams};

const VOCAB: usize = 48;
const MAX_TOKENS: u32 = 48;

fn prompts(n: usize, seed: u64) -> Vec<Vec<u32>> {
    random_prompts(n, seed, VOCAB, 30)
}

/// Outcomes of `reqs`, each sent twice (the copies after all the originals), on a toy backend
/// whose EOS is `eos`, with `k` drafts from the suffix proposer, `batch` sequences and a cache of
/// `blocks` blocks. A copy drafts from its original's output (the shared suffix trie), so its
/// drafts are what the processed decode emits and are mostly accepted: every draft position
/// of a verify sees the processors.
fn run(k: usize, batch: usize, blocks: usize, eos: u32, reqs: &[SamplingParams]) -> Vec<Outcome> {
    let backend = ToyBackend::new(VOCAB, vec![eos], blocks, 4);
    let mut cfg = engine_config(k, batch);
    cfg.proposer = ProposerKind::Suffix;
    let mut engine = Engine::new(backend, cfg, None);
    let prompts = prompts(reqs.len(), 17);
    let twice = prompts.iter().zip(reqs).chain(prompts.iter().zip(reqs));
    for (i, (prompt, sampling)) in twice.enumerate() {
        engine
            .add_request(request(
                i as u64,
                prompt.clone(),
                MAX_TOKENS,
                sampling.clone(),
            ))
            .unwrap();
    }
    let mut outcomes = HashMap::new();
    run_to_completion(&mut engine, &mut outcomes);
    (0..2 * reqs.len() as u64)
        .map(|i| outcomes[&i].clone())
        .collect()
}

fn sampling(temperature: f32, seed: u64, processors: &LogitsProcessors) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p: 1.0,
        top_k: 0,
        seed: Some(seed),
        processors: processors.clone(),
        logprobs: Some(3),
        prompt_logprobs: None,
        structured: None,
    }
}

/// (name, processors, whether greedy choices are affected at all)
fn settings(eos: u32, frequent: u32) -> Vec<(&'static str, LogitsProcessors, bool)> {
    let with = |f: &dyn Fn(&mut LogitsProcessors)| {
        let mut p = LogitsProcessors::NONE;
        f(&mut p);
        p
    };
    vec![
        ("presence", with(&|p| p.presence_penalty = 1.5), true),
        ("frequency", with(&|p| p.frequency_penalty = 0.6), true),
        (
            "negative frequency",
            with(&|p| p.frequency_penalty = -0.4),
            true,
        ),
        ("repetition", with(&|p| p.repetition_penalty = 1.8), true),
        (
            "logit bias",
            with(&|p| p.logit_bias = vec![(frequent, -100.0), (5, 3.0)]),
            true,
        ),
        ("min_tokens", with(&|p| p.min_tokens = 30), true),
        (
            "bad words",
            with(&|p| p.bad_words = vec![vec![frequent], vec![5, 6], vec![1, 2, 3]]),
            true,
        ),
        ("min_p", with(&|p| p.min_p = 0.3), false),
        (
            "all together",
            with(&|p| {
                p.presence_penalty = 0.5;
                p.frequency_penalty = 0.3;
                p.repetition_penalty = 1.3;
                p.min_p = 0.1;
                p.min_tokens = 10;
                p.logit_bias = vec![(eos, 1.0)];
            }),
            true,
        ),
    ]
}

#[test]
fn every_processor_keeps_greedy_and_seeded_output_identical_to_k0() {
    // EOS is a token the unprocessed greedy runs emit early, so min_tokens has work to do.
    let plain_greedy = run(0, 8, 4096, VOCAB as u32, &vec![SamplingParams::GREEDY; 8]);
    let eos = plain_greedy[0].tokens[3];
    let mut counts = HashMap::new();
    for t in plain_greedy.iter().flat_map(|o| &o.tokens) {
        *counts.entry(*t).or_insert(0) += 1;
    }
    let frequent = *counts.iter().max_by_key(|(t, c)| (**c, **t)).unwrap().0;
    for (temperature, what) in [(0.0, "greedy"), (1.0, "seeded")] {
        let unprocessed: Vec<_> = (0..8)
            .map(|i| sampling(temperature, i, &LogitsProcessors::NONE))
            .collect();
        let baseline = run(0, 8, 4096, eos, &unprocessed);
        let mut preemptions = 0;
        for (name, processors, greedy_visible) in settings(eos, frequent) {
            let reqs: Vec<_> = (0..8)
                .map(|i| sampling(temperature, i, &processors))
                .collect();
            let plain = run(0, 8, 4096, eos, &reqs);
            let spec = run(4, 8, 4096, eos, &reqs);
            let alone = run(4, 1, 4096, eos, &reqs);
            let tight = run(4, 8, 40, eos, &reqs);
            preemptions += tight.iter().map(|o| o.preemptions).sum::<usize>();
            for i in 0..2 * reqs.len() {
                assert_eq!(
                    spec[i].tokens, plain[i].tokens,
                    "{what} {name}: request {i}"
                );
                assert_eq!(
                    alone[i].tokens, plain[i].tokens,
                    "{what} {name}: request {i} alone"
                );
                assert_eq!(
                    tight[i].tokens, plain[i].tokens,
                    "{what} {name}: request {i} preempted"
                );
                assert_eq!(plain[i].logprobs.len(), plain[i].tokens.len());
                for other in [&spec, &alone, &tight] {
                    assert_eq!(
                        other[i].logprobs, plain[i].logprobs,
                        "{what} {name}: request {i}'s logprobs"
                    );
                }
            }
            let drafted: usize = spec
                .iter()
                .flat_map(|o| &o.steps)
                .map(|s| s.0 as usize)
                .sum();
            let accepted: usize = spec
                .iter()
                .flat_map(|o| &o.steps)
                .map(|s| s.1 as usize)
                .sum();
            eprintln!("{what} {name}: {drafted} drafted, {accepted} accepted");
            // Many of the copies' drafts are accepted: draft positions past the first were
            // verified with the processors at their own counts.
            assert!(
                accepted * 6 > drafted,
                "{what} {name}: {accepted} of {drafted} drafts accepted"
            );
            if temperature > 0.0 || greedy_visible {
                assert!(
                    (0..reqs.len()).any(|i| plain[i].tokens != baseline[i].tokens),
                    "{what} {name}: the processor changed no output"
                );
            }
            if name == "min_tokens" {
                assert!(
                    plain.iter().all(|o| o.tokens.len() >= 30),
                    "{what}: a request ended before min_tokens"
                );
                assert!(
                    baseline.iter().any(|o| o.tokens.len() < 30),
                    "{what}: EOS never came early without min_tokens"
                );
            }
        }
        assert!(preemptions > 0, "{what}: the tight cache never preempted");
    }
}

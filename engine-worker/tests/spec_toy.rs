//! Speculative decoding on the toy model: equivalence with plain decoding, batch and
//! preemption invariance, reproducible seeded sampling, stop conditions.

mod common;

use std::collections::HashMap;

use common::*;
use engine_worker::engine::{Engine, TokenBytes, VocabKind};
use proto::api_worker::SamplingParams;
use proto::FinishReason;

const VOCAB: usize = 48;

fn prompts(n: usize, seed: u64) -> Vec<Vec<u32>> {
    random_prompts(n, seed, VOCAB, 40)
}

fn run(
    k: usize,
    max_num_seqs: usize,
    num_blocks: usize,
    reqs: &[(Vec<u32>, u32, SamplingParams)],
) -> (Vec<Outcome>, usize) {
    run_with(SpecPolicy::Fixed, k, max_num_seqs, num_blocks, reqs)
}

fn run_with(
    policy: SpecPolicy,
    k: usize,
    max_num_seqs: usize,
    num_blocks: usize,
    reqs: &[(Vec<u32>, u32, SamplingParams)],
) -> (Vec<Outcome>, usize) {
    let mut cfg = engine_config(k, max_num_seqs);
    cfg.spec_policy = policy;
    run_cfg(cfg, num_blocks, reqs)
}

fn run_cfg(
    cfg: engine_worker::engine::EngineConfig,
    num_blocks: usize,
    reqs: &[(Vec<u32>, u32, SamplingParams)],
) -> (Vec<Outcome>, usize) {
    let backend = ToyBackend::new(VOCAB, vec![0], num_blocks, 4);
    let mut engine = Engine::new(backend, cfg, None);
    let mut outcomes = HashMap::new();
    for (i, (prompt, max_tokens, sampling)) in reqs.iter().enumerate() {
        engine
            .add_request(request(
                i as u64,
                prompt.clone(),
                *max_tokens,
                sampling.clone(),
            ))
            .unwrap();
    }
    run_to_completion(&mut engine, &mut outcomes);
    let preemptions = outcomes.values().map(|o| o.preemptions).sum();
    (
        (0..reqs.len() as u64)
            .map(|i| outcomes[&i].clone())
            .collect(),
        preemptions,
    )
}

fn greedy_reqs(n: usize, seed: u64) -> Vec<(Vec<u32>, u32, SamplingParams)> {
    prompts(n, seed)
        .into_iter()
        .map(|p| (p, 60, SamplingParams::GREEDY))
        .collect()
}

#[test]
fn greedy_with_speculation_matches_plain_greedy_at_batch_1_and_8() {
    let reqs = greedy_reqs(24, 1);
    let (plain, _) = run(0, 8, 4096, &reqs);
    let (spec_b8, _) = run(4, 8, 4096, &reqs);
    let (spec_b1, _) = run(4, 1, 4096, &reqs);
    for i in 0..reqs.len() {
        assert_eq!(plain[i].tokens, spec_b8[i].tokens, "request {i}");
        assert_eq!(
            spec_b1[i], spec_b8[i],
            "request {i}: batch size changed the outcome"
        );
        assert!(plain[i].steps.iter().all(|&s| s == (0, 0)));
    }
    let accepted: usize = spec_b8
        .iter()
        .flat_map(|o| &o.steps)
        .map(|s| s.1 as usize)
        .sum();
    let steps: usize = spec_b8.iter().map(|o| o.steps.len()).sum();
    let plain_steps: usize = plain.iter().map(|o| o.steps.len()).sum();
    assert!(
        accepted > 0,
        "the toy model's periodic text should accept drafts"
    );
    assert!(
        steps < plain_steps,
        "speculation should need fewer steps ({steps} vs {plain_steps})"
    );
}

#[test]
fn the_goodput_policy_keeps_greedy_output_exact_also_under_preemption() {
    let reqs = greedy_reqs(16, 9);
    let (plain, _) = run(0, 16, 4096, &reqs);
    let (roomy, _) = run_with(SpecPolicy::Goodput, 4, 16, 4096, &reqs);
    let (tight, preemptions) = run_with(SpecPolicy::Goodput, 4, 16, 40, &reqs);
    assert!(preemptions > 0, "the tight cache should force preemptions");
    for i in 0..reqs.len() {
        assert_eq!(roomy[i].tokens, plain[i].tokens, "request {i}");
        assert_eq!(tight[i].tokens, plain[i].tokens, "request {i} (preempted)");
        assert!(roomy[i].steps.iter().all(|&(d, a)| a <= d && d <= 4));
    }
}

/// The suffix proposer, with each policy, at batch 1 and 16, and under preemption (its
/// per-request tries must follow sequences that are recomputed, and its shared trie fills with
/// finished outputs as the run goes).
#[test]
fn the_suffix_proposer_keeps_greedy_output_exact() {
    let mut reqs = greedy_reqs(16, 21);
    // Requests that repeat an earlier one, so the shared trie drafts.
    reqs.extend(reqs[..4].to_vec());
    let (plain, _) = run(0, 16, 4096, &reqs);
    let suffix = |policy, max_num_seqs, num_blocks| {
        let mut cfg = engine_config(4, max_num_seqs);
        cfg.spec_policy = policy;
        cfg.proposer = ProposerKind::Suffix;
        run_cfg(cfg, num_blocks, &reqs)
    };
    let (fixed_b1, _) = suffix(SpecPolicy::Fixed, 1, 4096);
    let (fixed_b16, _) = suffix(SpecPolicy::Fixed, 16, 4096);
    let (goodput, _) = suffix(SpecPolicy::Goodput, 16, 4096);
    let (tight, preemptions) = suffix(SpecPolicy::Goodput, 16, 40);
    assert!(preemptions > 0, "the tight cache should force preemptions");
    for i in 0..reqs.len() {
        assert_eq!(fixed_b1[i].tokens, plain[i].tokens, "request {i} (batch 1)");
        assert_eq!(
            fixed_b16[i].tokens, plain[i].tokens,
            "request {i} (batch 16)"
        );
        assert_eq!(goodput[i].tokens, plain[i].tokens, "request {i} (goodput)");
        assert_eq!(tight[i].tokens, plain[i].tokens, "request {i} (preempted)");
        assert!(fixed_b16[i].steps.iter().all(|&(d, a)| a <= d && d <= 4));
    }
    let accepted =
        |o: &[Outcome]| -> usize { o.iter().flat_map(|o| &o.steps).map(|s| s.1 as usize).sum() };
    assert!(
        accepted(&fixed_b16) > 0,
        "the toy model's periodic text should accept drafts"
    );
    // At batch 1 the repeats run after their originals finished: the shared trie drafts them
    // from the first generated token on.
    let repeats = &fixed_b1[16..];
    assert!(repeats.iter().all(|o| o.steps.iter().any(|s| s.1 > 0)));
}

#[test]
fn preemption_does_not_change_tokens_or_acceptance() {
    let mut reqs = greedy_reqs(12, 2);
    let seeded = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 20,
        seed: Some(5),
        processors: proto::api_worker::LogitsProcessors::NONE,
        logprobs: None,
        prompt_logprobs: None,
        structured: None,
    };
    reqs.extend(prompts(4, 3).into_iter().map(|p| (p, 60, seeded.clone())));
    let (roomy, none) = run(4, 16, 4096, &reqs);
    assert_eq!(none, 0);
    // 40 blocks of 4 tokens cannot hold 16 sequences of up to 100 tokens.
    let (tight, preemptions) = run(4, 16, 40, &reqs);
    assert!(preemptions > 0, "the tight cache should force preemptions");
    for i in 0..reqs.len() {
        assert_eq!(roomy[i].tokens, tight[i].tokens, "request {i}");
        assert_eq!(roomy[i].steps, tight[i].steps, "request {i}");
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_batch_invariant() {
    let sampling = |seed| SamplingParams {
        temperature: 1.0,
        top_p: 0.9,
        top_k: 0,
        seed: Some(seed),
        processors: proto::api_worker::LogitsProcessors::NONE,
        logprobs: None,
        prompt_logprobs: None,
        structured: None,
    };
    let reqs: Vec<_> = prompts(8, 4)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p, 40, sampling(i as u64)))
        .collect();
    let (a, _) = run(4, 8, 4096, &reqs);
    let (b, _) = run(4, 8, 4096, &reqs);
    assert_eq!(a, b);
    for (i, req) in reqs.iter().enumerate() {
        let (alone, _) = run(4, 1, 4096, std::slice::from_ref(req));
        assert_eq!(alone[0], a[i], "request {i} alone vs in a batch");
    }
    let (other_seed, _) = run(4, 8, 4096, &[(reqs[0].0.clone(), 40, sampling(99))]);
    assert_ne!(
        other_seed[0].tokens, a[0].tokens,
        "a different seed should give different text"
    );
}

#[test]
fn stop_conditions_cut_a_step_short_but_keep_its_figures() {
    // Prompts that already contain the toy model's cycle, so drafts come from the prompt.
    let seeds: Vec<_> = (1..24u32)
        .map(|t| (vec![t], 150, SamplingParams::GREEDY))
        .collect();
    let (warm, _) = run(0, 8, 4096, &seeds);
    let reqs: Vec<_> = seeds
        .iter()
        .zip(&warm)
        .map(|(s, o)| {
            (
                [s.0.clone(), o.tokens.clone()].concat(),
                30,
                SamplingParams::GREEDY,
            )
        })
        .collect();
    let (outcomes, _) = run(4, 8, 4096, &reqs);
    // A step that accepted two drafts, whose first token is new in the output: stopping on that
    // token cuts the step to one delivered token.
    let (i, step, before) = outcomes
        .iter()
        .enumerate()
        .find_map(|(i, o)| {
            let mut before = 1;
            for (s, &(_, a)) in o.steps.iter().enumerate() {
                if a >= 2 && !o.tokens[..before].contains(&o.tokens[before]) {
                    return Some((i, s, before));
                }
                before += a as usize + 1;
            }
            None
        })
        .expect("some step accepts two drafts");
    let full = &outcomes[i];
    let backend = ToyBackend::new(VOCAB, vec![0], 4096, 4);
    let mut engine = Engine::new(backend, engine_config(4, 8), None);
    let mut req = request(1, reqs[i].0.clone(), 30, SamplingParams::GREEDY);
    req.stop.stop_token_ids = vec![full.tokens[before]];
    engine.add_request(req).unwrap();
    let mut out = HashMap::new();
    run_to_completion(&mut engine, &mut out);
    assert_eq!(out[&1].tokens, full.tokens[..=before]);
    assert_eq!(out[&1].finish, Some(FinishReason::Stop));
    // The cut step still reports the verifier's (drafted, accepted).
    assert_eq!(out[&1].steps, full.steps[..=step]);

    // max_tokens ends a request exactly there, and drafts never run past it.
    let (capped, _) = run(
        4,
        8,
        4096,
        &[(reqs[i].0.clone(), before as u32 + 1, SamplingParams::GREEDY)],
    );
    assert_eq!(capped[0].tokens, full.tokens[..=before]);
    assert_eq!(capped[0].finish, Some(FinishReason::Length));
}

#[test]
fn stop_strings_match_decoded_bytes_across_tokens() {
    // Token t decodes to the two letters "a"+t/26, "a"+t%26 (byte-level vocabulary).
    let vocab: Vec<String> = (0..VOCAB)
        .map(|t| {
            format!(
                "{}{}",
                (b'a' + (t / 26) as u8) as char,
                (b'a' + (t % 26) as u8) as char
            )
        })
        .collect();
    let bytes = TokenBytes::new(&vocab, None, VocabKind::ByteLevel);
    let reqs = greedy_reqs(1, 7);
    let (full, _) = run(4, 1, 4096, &reqs);
    let text = bytes.decode(&full[0].tokens);
    // A stop string straddling tokens 4 and 5.
    let stop = String::from_utf8(text[9..11].to_vec()).unwrap();
    let first_end = text.windows(2).position(|w| w == stop.as_bytes()).unwrap() + 2;
    let backend = ToyBackend::new(VOCAB, vec![0], 4096, 4);
    let mut engine = Engine::new(backend, engine_config(4, 1), Some(bytes.clone()));
    let mut req = request(1, reqs[0].0.clone(), 60, SamplingParams::GREEDY);
    req.stop.stop_strings = vec![stop];
    engine.add_request(req).unwrap();
    let mut out = HashMap::new();
    run_to_completion(&mut engine, &mut out);
    assert_eq!(out[&1].finish, Some(FinishReason::Stop));
    assert_eq!(out[&1].tokens.len(), first_end.div_ceil(2));
    assert_eq!(out[&1].tokens, full[0].tokens[..first_end.div_ceil(2)]);
}

#[test]
fn eos_ends_unless_ignored() {
    // Make EOS the model's favourite continuation somewhere: use a token the greedy run emits.
    let reqs = greedy_reqs(1, 8);
    let (full, _) = run(0, 1, 4096, &reqs);
    let eos = full[0].tokens[2];
    let first = full[0].tokens.iter().position(|&t| t == eos).unwrap();
    for (ignore, expected_len, finish) in [
        (false, first + 1, FinishReason::Stop),
        (true, 60, FinishReason::Length),
    ] {
        let backend = ToyBackend::new(VOCAB, vec![eos, 0], 4096, 4);
        let mut engine = Engine::new(backend, engine_config(4, 1), None);
        let mut req = request(1, reqs[0].0.clone(), 60, SamplingParams::GREEDY);
        req.stop.ignore_eos = ignore;
        engine.add_request(req).unwrap();
        let mut out = HashMap::new();
        run_to_completion(&mut engine, &mut out);
        assert_eq!(out[&1].tokens.len(), expected_len, "ignore_eos={ignore}");
        assert_eq!(out[&1].finish, Some(finish));
        let common = expected_len.min(full[0].tokens.len());
        assert_eq!(out[&1].tokens[..common], full[0].tokens[..common]);
    }
}

/// A finished request stays in the resync (with its finish, tokens and history) until its
/// api-server acknowledges it, so a token-processor that missed the end can replay it exactly.
#[test]
fn finished_requests_stay_in_the_resync_until_acknowledged() {
    let backend = ToyBackend::new(VOCAB, vec![0], 256, 4);
    let mut engine = Engine::new(backend, engine_config(4, 4), None);
    let reqs = greedy_reqs(3, 11);
    for (i, (prompt, max_tokens, sampling)) in reqs.iter().enumerate() {
        engine
            .add_request(request(
                i as u64,
                prompt.clone(),
                *max_tokens,
                sampling.clone(),
            ))
            .unwrap();
    }
    let mut outcomes = HashMap::new();
    run_to_completion(&mut engine, &mut outcomes);
    let resync = engine.resync_requests();
    assert_eq!(resync.len(), 3, "every finished request is kept");
    for r in &resync {
        let o = &outcomes[&r.id];
        assert_eq!(r.tokens, o.tokens);
        assert_eq!(Some(r.finish), o.finish.map(FinishReason::code));
        let steps: Vec<(u8, u8)> = r
            .drafted
            .iter()
            .copied()
            .zip(r.accepted.iter().copied())
            .collect();
        assert_eq!(steps, o.steps);
    }
    assert!(
        engine.not_held(&[0, 1, 2, 99]) == vec![99],
        "kept requests count as held"
    );
    engine.delivered("another-api", &[0]);
    assert!(
        engine.not_held(&[0]).is_empty(),
        "another api-server's acknowledgement forgets nothing"
    );
    assert!(!engine.abort_of("another-api", 0), "nor does its abort");
    engine.delivered("test-api", &[0]);
    assert_eq!(engine.not_held(&[0]), vec![0]);
    assert!(
        engine.abort_of("test-api", 1),
        "an abort forgets a kept request"
    );
    assert_eq!(engine.abort_owner("test-api"), 1);
    assert!(engine.resync_requests().is_empty());
    assert_eq!(engine.retained_stats(), (0, 0, 0));
}

//! Speculative decoding on the real default model (SmolLM2-135M-Instruct Q4_1, CPU backend):
//! greedy with K=4 n-gram drafts gives exactly the tokens of greedy without speculation, on the
//! golden prompts and 20 more, at batch sizes 1 and 8; a request's tokens and (drafted,
//! accepted) sequence do not depend on the batch; seeded sampling draws the tokens it draws
//! without speculation. Suffix-tree drafts are lossless too.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use common::*;
use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions};
use engine_worker::engine::{Engine, EngineConfig};
use engine_worker::model::{LoadFormat, Model, TokenizerData, WeightType};
use proto::api_worker::SamplingParams;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn model() -> Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = root().join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
            assert!(
                path.exists(),
                "{} missing: run scripts/fetch-model.sh",
                path.display()
            );
            Model::load(&path, LoadFormat::Gguf, WeightType::Q4_1, 0).expect("model loads")
        })
        .clone()
}

fn engine(k: usize, max_num_seqs: usize) -> Engine<CpuBackend> {
    engine_with(k, max_num_seqs, SpecPolicy::Fixed)
}

fn engine_with(k: usize, max_num_seqs: usize, policy: SpecPolicy) -> Engine<CpuBackend> {
    let mut cfg = engine_config(k, max_num_seqs);
    cfg.spec_policy = policy;
    engine_from(cfg)
}

fn engine_with_suffix(k: usize, max_num_seqs: usize, policy: SpecPolicy) -> Engine<CpuBackend> {
    let mut cfg = engine_config(k, max_num_seqs);
    cfg.spec_policy = policy;
    cfg.proposer = ProposerKind::Suffix;
    engine_from(cfg)
}

fn engine_from(cfg: EngineConfig) -> Engine<CpuBackend> {
    let model = model();
    let vocab = model.tokenizer.as_ref().map(TokenizerData::token_bytes);
    let backend = CpuBackend::new(model, CpuBackendOptions::new(256)).expect("backend");
    Engine::new(backend, cfg, vocab)
}

fn golden_dir() -> PathBuf {
    root().join("../../shared/golden/smollm2")
}

/// `(prompt ids, max_tokens)`: the four golden prompts, then 20 varied ones built from the
/// golden tokenizer cases and pieces of the golden prompts (chat-formatted and raw).
fn prompts() -> Vec<(Vec<u32>, u32)> {
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(golden_dir().join(name)).unwrap()).unwrap()
    };
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut golden = Vec::new();
    for name in ["capital.json", "code.json", "list.json", "story.json"] {
        golden.push(ids(&read(name)["prompt_ids"]));
    }
    let mut out: Vec<(Vec<u32>, u32)> = golden.iter().map(|p| (p.clone(), 24)).collect();
    for case in read("tokenizer.json")["cases"].as_array().unwrap() {
        let p = ids(&case["ids"]);
        if !p.is_empty() {
            out.push((p, 16));
        }
    }
    for (i, p) in golden.iter().enumerate() {
        for cut in [3, p.len() / 2, p.len() - 4] {
            if out.len() < 24 {
                out.push((p[..cut.max(1)].to_vec(), 12 + i as u32));
            }
        }
    }
    assert_eq!(out.len(), 24);
    out
}

/// [`prompts`], each greedy.
fn greedy_prompts() -> Vec<(Vec<u32>, u32, SamplingParams)> {
    prompts()
        .into_iter()
        .map(|(p, n)| (p, n, SamplingParams::GREEDY))
        .collect()
}

fn run(engine: &mut Engine<CpuBackend>, reqs: &[(Vec<u32>, u32, SamplingParams)]) -> Vec<Outcome> {
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
    run_to_completion(engine, &mut outcomes);
    (0..reqs.len() as u64)
        .map(|i| outcomes.remove(&i).unwrap())
        .collect()
}

/// Every run gave each prompt the tokens `plain` gave it.
fn assert_same_tokens(plain: &[Outcome], runs: &[(&str, &[Outcome])]) {
    for (label, run) in runs {
        assert_eq!(run.len(), plain.len(), "{label}");
        for (i, (got, want)) in run.iter().zip(plain).enumerate() {
            assert_eq!(got.tokens, want.tokens, "prompt {i}: {label} vs K=0");
        }
    }
}

#[test]
fn greedy_speculation_matches_plain_greedy_and_is_batch_invariant() {
    let reqs = greedy_prompts();
    let plain = run(&mut engine(0, 8), &reqs);
    let spec_b8 = run(&mut engine(4, 8), &reqs);
    let spec_b1 = run(&mut engine(4, 1), &reqs);
    assert_same_tokens(
        &plain,
        &[("K=4 batch 8", &spec_b8), ("K=4 batch 1", &spec_b1)],
    );
    for i in 0..reqs.len() {
        assert_eq!(
            spec_b1[i].steps, spec_b8[i].steps,
            "prompt {i}: (drafted, accepted) depend on the batch"
        );
    }
    let accepted: usize = spec_b8
        .iter()
        .flat_map(|o| &o.steps)
        .map(|s| s.1 as usize)
        .sum();
    assert!(accepted > 0, "n-gram drafts should be accepted somewhere");
}

/// The suffix proposer: every proposed draft verified (fixed policy) at batch 8, and the goodput
/// policy for a lone stream, give plain greedy's tokens; the golden prompts run twice, so the
/// second time the shared trie holds their first answers.
#[test]
fn greedy_with_suffix_drafts_matches_plain_greedy() {
    let mut reqs = greedy_prompts();
    reqs.extend(reqs[..4].to_vec());
    let suffix = |max_num_seqs, policy| {
        let e = engine_with_suffix(4, max_num_seqs, policy);
        assert_eq!(e.proposer_name(), "suffix");
        e
    };
    let plain = run(&mut engine(0, 8), &reqs);
    let fixed_b8 = run(&mut suffix(8, SpecPolicy::Fixed), &reqs);
    let goodput_b1 = run(&mut suffix(1, SpecPolicy::Goodput), &reqs);
    assert_same_tokens(&plain, &[("batch 8", &fixed_b8), ("batch 1", &goodput_b1)]);
    let accepted: usize = fixed_b8
        .iter()
        .flat_map(|o| &o.steps)
        .map(|s| s.1 as usize)
        .sum();
    assert!(accepted > 0, "suffix drafts should be accepted somewhere");
}

#[test]
fn the_goodput_policy_is_lossless_and_drafts_for_a_lone_stream() {
    let reqs = greedy_prompts();
    let plain = run(&mut engine(0, 8), &reqs);
    let mut lone = engine_with(4, 1, SpecPolicy::Goodput);
    let goodput_b1 = run(&mut lone, &reqs);
    let goodput_b8 = run(&mut engine_with(4, 8, SpecPolicy::Goodput), &reqs);
    assert_same_tokens(
        &plain,
        &[("batch 1", &goodput_b1), ("batch 8", &goodput_b8)],
    );
    for o in &goodput_b8 {
        assert!(o.steps.iter().all(|&(d, a)| a <= d && d <= 4));
    }
    let cost = lone.planner().cost();
    assert!(cost.seconds(1.0) > 0.0 && cost.marginal(1.0) > 0.0);
    let drafted: usize = goodput_b1
        .iter()
        .flat_map(|o| &o.steps)
        .map(|s| s.0 as usize)
        .sum();
    assert!(drafted > 0, "a lone stream on this CPU should draft");
}

/// Prefix caching on the real model: the prompts that start like an earlier one (the chat
/// system prompt, the golden prompts' cut copies), and next turns that carry an earlier answer,
/// reuse the cached blocks and get the tokens and `(drafted, accepted)` that computing every
/// position again gives.
#[test]
fn prompts_that_share_cached_blocks_get_the_tokens_of_a_full_computation() {
    let reqs = greedy_prompts();
    let engine_caching = |on: bool| {
        let mut cfg = engine_config(4, 8);
        cfg.prefix_caching = on;
        engine_from(cfg)
    };
    let mut off = engine_caching(false);
    let full = run(&mut off, &reqs);
    let mut on = engine_caching(true);
    let cached = run(&mut on, &reqs);
    // Twice: the second time every prompt finds its own blocks.
    let again = run(&mut on, &reqs);
    let stats = on.scheduler().prefix_stats();
    assert_eq!(off.scheduler().prefix_stats().hit_tokens, 0);
    assert!(
        stats.hit_tokens * 3 > stats.queried_tokens,
        "too little came from the cache: {stats:?}"
    );
    // A next turn: each prompt, its answer, then the prompt's last tokens again. The answer's
    // cache came from verify steps; the next turn's tokens must not see the difference.
    let next_turns: Vec<_> = reqs
        .iter()
        .zip(&full)
        .map(|((p, n, sampling), o)| {
            let mut next = p.clone();
            next.extend_from_slice(&o.tokens);
            next.extend_from_slice(&p[p.len().saturating_sub(6)..]);
            (next, *n, sampling.clone())
        })
        .collect();
    let before = on.scheduler().prefix_stats().hit_tokens;
    let next_cached = run(&mut on, &next_turns);
    let next_hits = on.scheduler().prefix_stats().hit_tokens - before;
    let answers_blocks: u64 = reqs
        .iter()
        .zip(&full)
        .map(|((p, _, _), o)| ((p.len() + o.tokens.len() - 1) / 16 * 16) as u64)
        .sum();
    assert!(
        next_hits >= answers_blocks,
        "{next_hits} < {answers_blocks}"
    );
    let next_full = run(&mut off, &next_turns);
    for (label, got, want) in [
        ("cached", &cached, &full),
        ("cached again", &again, &full),
        ("next turn", &next_cached, &next_full),
    ] {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.tokens, w.tokens, "prompt {i}: {label}");
            assert_eq!(g.steps, w.steps, "prompt {i}: {label}");
        }
    }
}

/// Sampled requests with a seed: with drafts (n-gram and suffix, every proposed token verified)
/// a request draws exactly the tokens it draws without speculation, so what the drafting
/// policy picks under load never shows in the output; and the tokens do not depend on the
/// batch.
#[test]
fn seeded_sampling_draws_the_tokens_of_plain_sampling_whatever_is_drafted() {
    let all = prompts();
    let sampling = |seed| SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 50,
        seed: Some(seed),
        processors: proto::api_worker::LogitsProcessors::NONE,
        logprobs: None,
        prompt_logprobs: None,
        structured: None,
    };
    let reqs: Vec<_> = all[..12]
        .iter()
        .enumerate()
        .map(|(i, (p, _))| (p.clone(), 24, sampling(i as u64)))
        .collect();
    let plain = run(&mut engine(0, 8), &reqs);
    let ngram = run(&mut engine_with(4, 8, SpecPolicy::Fixed), &reqs);
    let suffix = run(&mut engine_with_suffix(4, 8, SpecPolicy::Fixed), &reqs);
    assert_same_tokens(&plain, &[("n-gram", &ngram), ("suffix", &suffix)]);
    let (drafted, accepted) = ngram
        .iter()
        .flat_map(|o| &o.steps)
        .fold((0, 0), |(d, a), s| (d + s.0 as usize, a + s.1 as usize));
    assert!(
        accepted > 0 && accepted < drafted,
        "drafts must be both accepted and rejected: {drafted} drafted, {accepted} accepted"
    );
    let alone = run(&mut engine(4, 1), &reqs[2..3]);
    assert_eq!(alone[0].tokens, plain[2].tokens);
}

/// The logits processors on the real model: penalties, bias and (sampled) min-p, greedy and
/// seeded, give K=0's tokens with suffix drafts (the golden prompts run twice, so the second
/// copies draft from the first answers and most of their drafts are accepted), and change what
/// the model says.
#[test]
fn logits_processors_keep_speculation_lossless() {
    let mut processors = proto::api_worker::LogitsProcessors::NONE;
    processors.presence_penalty = 0.6;
    processors.frequency_penalty = 0.4;
    processors.repetition_penalty = 1.3;
    // " the" (260) and "," (28) made unlikely, 30 favoured.
    processors.logit_bias = vec![(260, -8.0), (28, -4.0), (30, 2.0)];
    for (temperature, min_p) in [(0.0, 0.0), (0.8, 0.05)] {
        let mut p = processors.clone();
        p.min_p = min_p;
        let sampling = |processors: &proto::api_worker::LogitsProcessors, seed| SamplingParams {
            temperature,
            top_p: 1.0,
            top_k: 0,
            seed: Some(seed),
            processors: processors.clone(),
            logprobs: None,
            prompt_logprobs: None,
            structured: None,
        };
        let golden: Vec<_> = prompts().into_iter().take(4).collect();
        let reqs_with = |processors: &proto::api_worker::LogitsProcessors| -> Vec<_> {
            let once = golden
                .iter()
                .enumerate()
                .map(|(i, (prompt, n))| (prompt.clone(), *n, sampling(processors, i as u64)));
            once.clone().chain(once).collect()
        };
        let reqs = reqs_with(&p);
        let unprocessed = run(
            &mut engine(0, 8),
            &reqs_with(&proto::api_worker::LogitsProcessors::NONE),
        );
        let plain = run(&mut engine(0, 8), &reqs);
        // Batch 4: the copies start once the originals have finished and fed the shared trie.
        let spec = run(&mut engine_with_suffix(4, 4, SpecPolicy::Fixed), &reqs);
        assert_same_tokens(&plain, &[("K=4 suffix, processors", &spec)]);
        let (drafted, accepted) = spec
            .iter()
            .flat_map(|o| &o.steps)
            .fold((0, 0), |(d, a), s| (d + s.0 as usize, a + s.1 as usize));
        eprintln!("temperature {temperature}: {drafted} drafted, {accepted} accepted");
        assert!(
            accepted * 4 > drafted,
            "{accepted} of {drafted} drafts accepted"
        );
        assert!(
            (0..reqs.len()).any(|i| plain[i].tokens != unprocessed[i].tokens),
            "temperature {temperature}: the processors changed nothing"
        );
    }
}

/// A request's grammar compiles off the step loop (the worker's api link starts the job): the
/// engine keeps the request queued, producing nothing for it, while its job runs, then serves
/// it exactly as a request whose grammar was compiled inline; a failed compile ends the
/// request with an error. Plain requests beside it run meanwhile.
#[test]
fn a_grammar_compiled_off_the_loop_waits_in_the_queue_then_serves_the_same_tokens() {
    use engine_worker::engine::{GrammarJob, RowKind};
    use proto::api_worker::StructuredOutput;
    use proto::FinishReason;
    let (prompt, _) = prompts().remove(0);
    let mut constrained = SamplingParams::GREEDY;
    constrained.structured = Some(StructuredOutput::JsonObject);
    let ask =
        |id: u64, sampling: &SamplingParams| request(id, prompt.clone(), 24, sampling.clone());

    // Inline: the reference.
    let mut inline = engine(4, 4);
    inline.add_request(ask(1, &constrained)).unwrap();
    let mut reference = HashMap::new();
    run_to_completion(&mut inline, &mut reference);

    let mut e = engine(4, 4);
    let compiler = e.grammars().expect("the model has a vocabulary").clone();
    let (done, job) = GrammarJob::pending();
    e.add_prepared(ask(1, &constrained), Some(job)).unwrap();
    e.add_request(ask(2, &SamplingParams::GREEDY)).unwrap();
    let (failing_done, failing) = GrammarJob::pending();
    e.add_prepared(ask(3, &constrained), Some(failing)).unwrap();
    let mut outcomes = HashMap::new();
    for _ in 0..3 {
        let rows = e.step();
        assert!(
            rows.iter().all(|r| r.id == 2),
            "only the plain request runs: {rows:?}"
        );
        collect(&rows, 4, &mut outcomes);
    }
    assert!(outcomes.get(&2).is_some_and(|o| !o.tokens.is_empty()));
    let grammar = compiler.compile(&grammar::Constraint::JsonObject).unwrap();
    done.send(Ok(grammar)).unwrap();
    failing_done.send(Err("too costly".into())).unwrap();
    let rows = e.step();
    let failed = rows
        .iter()
        .find(|r| r.id == 3)
        .expect("the failed request's row");
    assert_eq!(
        (failed.kind, failed.finish),
        (RowKind::Abort, Some(FinishReason::Error))
    );
    collect(&rows, 4, &mut outcomes);
    run_to_completion(&mut e, &mut outcomes);
    assert_eq!(outcomes[&1].tokens, reference[&1].tokens);
    assert_eq!(outcomes[&1].steps, reference[&1].steps);
}

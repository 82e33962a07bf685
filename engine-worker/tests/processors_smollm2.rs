//! The logits processors on the real default model (SmolLM2-135M-Instruct Q4_1, CPU backend):
//! each one changes greedy output the way its definition says (the repetition, frequency and
//! presence penalties repeat less, a logit bias forces or forbids its token, a bad word is
//! never written, `min_tokens`
//! outlasts EOS, `min_p` keeps only tokens near the top one), and with each, greedy and seeded
//! outputs and their logprobs are the same with K = 4 suffix drafts (every proposed token
//! verified) as with K = 0. `tests/spec_processors.rs` checks the same identity on the toy model
//! under preemption and at batch 8.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use common::*;
use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions};
use engine_worker::engine::Engine;
use engine_worker::model::{LoadFormat, Model, TokenizerData, WeightType};
use proto::api_worker::{LogitsProcessors, SamplingParams};

const MAX_TOKENS: u32 = 64;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden(name: &str) -> serde_json::Value {
    let path = root().join("../../shared/golden/smollm2").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn engine(k: usize) -> Engine<CpuBackend> {
    let path = root().join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} missing: run scripts/fetch-model.sh",
        path.display()
    );
    let model = Model::load(&path, LoadFormat::Gguf, WeightType::Q4_1, 0).expect("model loads");
    let vocab = model.tokenizer.as_ref().map(TokenizerData::token_bytes);
    let mut cfg = engine_config(k, 8);
    cfg.proposer = ProposerKind::Suffix;
    let backend = CpuBackend::new(model, CpuBackendOptions::new(512)).expect("backend");
    Engine::new(backend, cfg, vocab)
}

/// Each request twice (the copies after all the originals: a copy's suffix drafts come from
/// its original's output, so they are mostly accepted), EOS ignored unless `min_tokens` is
/// tested. Returns the outcomes in request order, originals then copies.
fn run(k: usize, reqs: &[(Vec<u32>, SamplingParams, bool)]) -> Vec<Outcome> {
    let mut engine = engine(k);
    let twice = reqs.iter().chain(reqs);
    for (i, (prompt, sampling, ignore_eos)) in twice.enumerate() {
        let mut req = request(i as u64, prompt.clone(), MAX_TOKENS, sampling.clone());
        req.stop.ignore_eos = *ignore_eos;
        engine.add_request(req).unwrap();
    }
    let mut outcomes = HashMap::new();
    run_to_completion(&mut engine, &mut outcomes);
    (0..2 * reqs.len() as u64)
        .map(|i| outcomes[&i].clone())
        .collect()
}

/// Output tokens that already occurred earlier in the output.
fn repeats(tokens: &[u32]) -> usize {
    tokens.len() - tokens.iter().collect::<HashSet<_>>().len()
}

#[test]
fn each_processor_moves_the_output_its_way_and_speculation_changes_nothing() {
    let prompt = ids(&golden("story.json")["prompt_ids"]);
    let capital = golden("capital.json");
    let short_prompt = ids(&capital["prompt_ids"]);
    // Where the capital answer ends without min_tokens (its EOS).
    let natural_len = ids(&capital["greedy_ids"]).len();
    let with = |f: &dyn Fn(&mut LogitsProcessors)| {
        let mut s = SamplingParams {
            logprobs: Some(3),
            ..SamplingParams::GREEDY
        };
        f(&mut s.processors);
        s
    };
    let plain = with(&|_| {});
    // The plain run's first token, to forbid it; and a token to force.
    let reqs_plain = vec![(prompt.clone(), plain.clone(), true)];
    let base = run(0, &reqs_plain).remove(0);
    let first = base.tokens[0];
    let forced = 504;
    // A pair of tokens the plain output writes, to forbid as a bad word.
    let bigram = [base.tokens[1], base.tokens[2]];
    let settings: Vec<(&str, SamplingParams, Vec<u32>, bool)> = vec![
        ("plain", plain.clone(), prompt.clone(), true),
        (
            "repetition_penalty 1.6",
            with(&|p| p.repetition_penalty = 1.6),
            prompt.clone(),
            true,
        ),
        (
            "frequency_penalty 1.5",
            with(&|p| p.frequency_penalty = 1.5),
            prompt.clone(),
            true,
        ),
        (
            "presence_penalty 2",
            with(&|p| p.presence_penalty = 2.0),
            prompt.clone(),
            true,
        ),
        (
            "bias +100",
            with(&|p| p.logit_bias = vec![(forced, 100.0)]),
            prompt.clone(),
            true,
        ),
        (
            "bias -100",
            with(&|p| p.logit_bias = vec![(first, -100.0)]),
            prompt.clone(),
            true,
        ),
        (
            "bad words",
            with(&|p| p.bad_words = vec![bigram.to_vec()]),
            prompt.clone(),
            true,
        ),
        (
            "min_tokens",
            with(&|p| p.min_tokens = natural_len as u32 + 6),
            short_prompt.clone(),
            false,
        ),
        ("no min_tokens", plain.clone(), short_prompt.clone(), false),
    ];
    // Sampled at temperature 1 with a seed, with and without min_p.
    let sampled = |min_p: f32| SamplingParams {
        temperature: 1.0,
        seed: Some(36),
        logprobs: Some(1),
        processors: LogitsProcessors {
            min_p,
            ..LogitsProcessors::NONE
        },
        ..SamplingParams::GREEDY
    };
    let mut reqs: Vec<(Vec<u32>, SamplingParams, bool)> = settings
        .iter()
        .map(|(_, s, p, ignore)| (p.clone(), s.clone(), *ignore))
        .collect();
    reqs.push((prompt.clone(), sampled(0.3), true));
    reqs.push((prompt.clone(), sampled(0.0), true));

    let k0 = run(0, &reqs);
    let k4 = run(4, &reqs);
    let accepted: usize = k4.iter().flat_map(|o| &o.steps).map(|s| s.1 as usize).sum();
    assert!(accepted > 0, "no draft was accepted: nothing was verified");
    let names: Vec<&str> = (settings.iter().map(|s| s.0))
        .chain(["min_p 0.3 sampled", "sampled"])
        .collect();
    for (i, name) in names.iter().enumerate() {
        for copy in [i, i + reqs.len()] {
            assert_eq!(k4[copy].tokens, k0[copy].tokens, "{name}: tokens with K=4");
            assert_eq!(
                k4[copy].logprobs, k0[copy].logprobs,
                "{name}: logprobs with K=4"
            );
        }
    }
    eprintln!("{accepted} drafts accepted with K=4");

    let out = |name: &str| &k0[names.iter().position(|n| *n == name).unwrap()];
    let plain_repeats = repeats(&out("plain").tokens);
    for penalty in [
        "repetition_penalty 1.6",
        "frequency_penalty 1.5",
        "presence_penalty 2",
    ] {
        let r = repeats(&out(penalty).tokens);
        eprintln!("{penalty}: {r} repeated tokens, {plain_repeats} without");
        assert!(
            r < plain_repeats,
            "{penalty}: {r} repeats, not fewer than {plain_repeats}"
        );
    }
    assert_eq!(out("bias +100").tokens[0], forced);
    assert_ne!(out("bias -100").tokens[0], first);
    assert!(!out("bias -100").tokens.contains(&first));
    let writes_bigram = |o: &Outcome| o.tokens.windows(2).any(|w| w == bigram);
    assert!(writes_bigram(out("plain")) && !writes_bigram(out("bad words")));
    let natural = out("no min_tokens").tokens.len();
    let longer = out("min_tokens").tokens.len();
    eprintln!("min_tokens: {longer} tokens, {natural} without");
    assert!(natural < natural_len + 6 && longer >= natural_len + 6);
    // min_p: every sampled token is within a factor 0.3 of the top one (the logprobs are the
    // distribution's before min_p); without it, some is not.
    let far = |o: &Outcome| {
        o.logprobs
            .iter()
            .filter(|t| t.logprob < t.top[0].1 + 0.3f32.ln() - 1e-5)
            .count()
    };
    assert_eq!(far(out("min_p 0.3 sampled")), 0);
    assert!(
        far(out("sampled")) > 0,
        "the plain draw never left the top: min_p untested"
    );
}

//! Model drafters on the real default model (SmolLM2-135M-Instruct Q4_1, CPU backend): a draft
//! model (the target's own first layers, or the whole target, loaded as a second model with its
//! own KV cache) and self-speculation (`--draft-layers`: early exit in the target's cache).
//! Greedy and seeded outputs equal K = 0's at batch 1, 8 and 16, with prefix-cache hits and with
//! a cache small enough to preempt; the target drafting for itself has every draft accepted,
//! which only holds if the draft's cache follows every sequence exactly.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use common::*;
use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions};
use engine_worker::backend::Backend;
use engine_worker::engine::{Engine, EngineConfig, RowKind};
use engine_worker::model::{LoadFormat, Model, TokenizerData, WeightType};
use engine_worker::spec::DraftSource;
use proto::api_worker::SamplingParams;
use proto::FinishReason;

/// A KV cache (16-token blocks) too small for 12 of these prompts with their answers at once.
const TIGHT_BLOCKS: usize = 20;

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

/// What drafts.
#[derive(Clone, Copy, Debug)]
enum Drafter {
    /// The target's first N layers as a separate draft model.
    Model(usize),
    /// Early exit after N layers.
    Layers(usize),
}

fn engine(cfg: EngineConfig, drafter: Option<Drafter>, num_blocks: usize) -> Engine<CpuBackend> {
    let target = model();
    let vocab = target.tokenizer.as_ref().map(TokenizerData::token_bytes);
    let source = drafter.map(|d| match d {
        Drafter::Model(n) => {
            let draft = target.first_layers(n);
            let backend =
                CpuBackend::new(draft, CpuBackendOptions::new(num_blocks)).expect("draft backend");
            DraftSource::Model(Box::new(backend))
        }
        Drafter::Layers(n) => DraftSource::TargetLayers(n),
    });
    let backend = CpuBackend::new(target, CpuBackendOptions::new(num_blocks)).expect("backend");
    Engine::with_drafter(backend, cfg, vocab, source).expect("engine")
}

/// Prompts from the golden set: four chat prompts, then cut copies of them (which hit the
/// first ones' cached blocks).
fn prompts(n: usize) -> Vec<Vec<u32>> {
    let dir = root().join("../../shared/golden/smollm2");
    let mut golden = Vec::new();
    for name in ["capital.json", "code.json", "list.json", "story.json"] {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap();
        let ids: Vec<u32> = v["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        golden.push(ids);
    }
    let mut out = golden.clone();
    let mut cut = 0;
    while out.len() < n {
        let p = &golden[cut % golden.len()];
        let keep = p.len() - 1 - (cut * 7) % (p.len() / 2);
        out.push(p[..keep].to_vec());
        cut += 1;
    }
    out.truncate(n);
    out
}

/// Runs the four golden prompts first, then the rest (whose cut copies of them then hit the
/// prefix cache).
fn run(engine: &mut Engine<CpuBackend>, reqs: &[(Vec<u32>, u32, SamplingParams)]) -> Vec<Outcome> {
    run_with(engine, reqs, false)
}

/// [`run`], with every request running to `max_tokens` past EOS when `ignore_eos`.
fn run_with(
    engine: &mut Engine<CpuBackend>,
    reqs: &[(Vec<u32>, u32, SamplingParams)],
    ignore_eos: bool,
) -> Vec<Outcome> {
    let mut outcomes = HashMap::new();
    let first_wave = reqs.len().min(4);
    for wave in [0..first_wave, first_wave..reqs.len()] {
        for i in wave {
            let (prompt, max_tokens, sampling) = &reqs[i];
            let mut req = request(i as u64, prompt.clone(), *max_tokens, sampling.clone());
            req.stop.ignore_eos = ignore_eos;
            engine.add_request(req).unwrap();
        }
        run_to_completion(engine, &mut outcomes);
    }
    if let Some(d) = engine.drafter() {
        assert_eq!(d.tracked(), 0, "draft state outlived its sequences");
    }
    let out: Vec<Outcome> = (0..reqs.len() as u64)
        .map(|i| outcomes.remove(&i).unwrap())
        .collect();
    for (i, o) in out.iter().enumerate() {
        assert_ne!(o.finish, Some(FinishReason::Error), "request {i}: {o:?}");
    }
    out
}

fn drafted_accepted(run: &[Outcome]) -> (usize, usize) {
    run.iter()
        .flat_map(|o| &o.steps)
        .fold((0, 0), |(d, a), s| (d + s.0 as usize, a + s.1 as usize))
}

fn greedy(n: usize, max_tokens: u32) -> Vec<(Vec<u32>, u32, SamplingParams)> {
    prompts(n)
        .into_iter()
        .map(|p| (p, max_tokens, SamplingParams::GREEDY))
        .collect()
}

#[test]
fn greedy_with_model_drafters_matches_plain_greedy_at_batch_1_8_and_16() {
    let reqs = greedy(16, 20);
    let plain = run(&mut engine(engine_config(0, 16), None, 512), &reqs);
    for (drafter, batches) in [
        (Drafter::Model(10), &[1, 8, 16][..]),
        (Drafter::Layers(10), &[1, 8, 16][..]),
        (Drafter::Layers(20), &[16][..]),
    ] {
        for &batch in batches {
            let mut e = engine(engine_config(4, batch), Some(drafter), 512);
            let spec = run(&mut e, &reqs);
            for i in 0..reqs.len() {
                assert_eq!(
                    spec[i].tokens, plain[i].tokens,
                    "{drafter:?} batch {batch}: prompt {i}"
                );
            }
            let (drafted, accepted) = drafted_accepted(&spec);
            assert!(drafted > 0, "{drafter:?} batch {batch} drafted nothing");
            assert!(accepted > 0, "{drafter:?} batch {batch}: no draft accepted");
            assert!(
                e.scheduler().prefix_stats().hit_tokens > 0,
                "cut prompts hit the cache"
            );
        }
    }
}

/// The whole target as its own draft model: every draft is the target's own greedy choice,
/// computed in a separate cache that must follow each sequence (catch-up, prefix hits,
/// preemption), so every draft is accepted.
#[test]
fn the_target_drafting_for_itself_has_every_draft_accepted() {
    let reqs = greedy(12, 24);
    let layers = model().config.num_layers;
    for num_blocks in [512, TIGHT_BLOCKS] {
        let mut e = engine(
            engine_config(4, 12),
            Some(Drafter::Model(layers)),
            num_blocks,
        );
        let out = run_with(&mut e, &reqs, true);
        let (drafted, accepted) = drafted_accepted(&out);
        let preempted: usize = out.iter().map(|o| o.preemptions).sum();
        assert!(drafted > 100, "{num_blocks} blocks: drafted {drafted}");
        assert_eq!(
            accepted, drafted,
            "{num_blocks} blocks ({preempted} preemptions)"
        );
        if num_blocks == TIGHT_BLOCKS {
            assert!(preempted > 0, "{TIGHT_BLOCKS} blocks should preempt");
        }
    }
}

#[test]
fn seeded_sampling_with_model_drafters_draws_the_tokens_of_plain_sampling() {
    let reqs: Vec<_> = prompts(8)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let sampling = SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                top_k: 50,
                seed: Some(i as u64),
                processors: proto::api_worker::LogitsProcessors::NONE,
                logprobs: None,
                prompt_logprobs: None,
                structured: None,
            };
            (p, 20, sampling)
        })
        .collect();
    let plain = run(&mut engine(engine_config(0, 8), None, 512), &reqs);
    for drafter in [Drafter::Model(10), Drafter::Layers(10)] {
        let spec = run(&mut engine(engine_config(4, 8), Some(drafter), 512), &reqs);
        for i in 0..reqs.len() {
            assert_eq!(spec[i].tokens, plain[i].tokens, "{drafter:?}: prompt {i}");
        }
        let (drafted, accepted) = drafted_accepted(&spec);
        assert!(
            drafted > 0 && accepted > 0,
            "{drafter:?}: {drafted} drafted, {accepted} accepted"
        );
    }
}

/// A cache too small for the batch: sequences are preempted and resume while both drafters
/// run; the output stays exact.
#[test]
fn preemption_keeps_model_drafted_output_exact() {
    let reqs = greedy(12, 24);
    let plain = run_with(&mut engine(engine_config(0, 12), None, 512), &reqs, true);
    for drafter in [Drafter::Model(10), Drafter::Layers(10)] {
        let spec = run_with(
            &mut engine(engine_config(4, 12), Some(drafter), TIGHT_BLOCKS),
            &reqs,
            true,
        );
        let preempted: usize = spec.iter().map(|o| o.preemptions).sum();
        assert!(
            preempted > 0,
            "{drafter:?}: {TIGHT_BLOCKS} blocks should preempt"
        );
        for i in 0..reqs.len() {
            assert_eq!(spec[i].tokens, plain[i].tokens, "{drafter:?}: prompt {i}");
        }
    }
}

/// Greedy drafts of the first `layers` layers for `tokens`, computed from nothing (a fresh
/// cache): what the draft model must propose whatever it proposed and had rejected before.
fn draft_from_scratch(layers: usize, tokens: &[u32], k: usize) -> Vec<u32> {
    let draft = model().first_layers(layers);
    let blocks = (tokens.len() + k).div_ceil(16) + 1;
    let mut backend = CpuBackend::new(draft, CpuBackendOptions::new(blocks)).unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let vocab = backend.config().vocab_size;
    let mut seq = tokens.to_vec();
    let mut out = Vec::new();
    let mut start = 0;
    for _ in 0..k {
        let forward = engine_worker::backend::SeqForward {
            tokens: &seq[start..],
            start_pos: start,
            block_table: &table,
            logits: engine_worker::backend::LogitsFor::Last,
        };
        let logits = backend.forward(&[forward]).unwrap();
        let row = &logits[..vocab];
        let next = (0..vocab)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .unwrap();
        start = seq.len();
        seq.push(next as u32);
        out.push(next as u32);
    }
    out
}

/// A draft model's cache holds the keys and values of drafts the verifier rejected until they
/// are written over: every draft it proposes, step after step, through rejections and
/// preemption, equals the draft computed from nothing for the same tokens (the draft model
/// here is the target's first 8 layers, which the target often overrules). Before this test,
/// keeping the rejected positions as valid left every test green: the toy model accepts
/// self-consistent slots and the target drafting for itself is never rejected.
#[test]
fn a_draft_models_drafts_equal_drafts_from_scratch_through_rejections_and_preemption() {
    const LAYERS: usize = 8;
    for num_blocks in [256, 12] {
        let mut cfg = engine_config(4, 4);
        cfg.spec_policy = SpecPolicy::Fixed;
        let mut e = engine(cfg, Some(Drafter::Model(LAYERS)), num_blocks);
        let mut tokens: Vec<Vec<u32>> = prompts(4);
        for (i, prompt) in tokens.iter().enumerate() {
            let mut req = request(i as u64, prompt.clone(), 40, SamplingParams::GREEDY);
            req.stop.ignore_eos = true;
            e.add_request(req).unwrap();
        }
        let (mut checked, mut rejected, mut preempted) = (0, 0, 0);
        while e.has_work() {
            for row in e.step() {
                let seq = &mut tokens[row.id as usize];
                preempted += usize::from(row.kind == RowKind::Preempted);
                if row.kind == RowKind::Verify && row.drafted > 0 {
                    let drafts = &row.policy.offer[..usize::from(row.drafted)];
                    assert_eq!(
                        drafts,
                        draft_from_scratch(LAYERS, seq, drafts.len()),
                        "request {} at {} tokens, {num_blocks} blocks",
                        row.id,
                        seq.len()
                    );
                    checked += 1;
                    rejected += usize::from(row.accepted < row.drafted);
                }
                seq.extend_from_slice(&row.tokens);
            }
        }
        assert!(
            checked > 20 && rejected > 5,
            "{checked} drafts checked, {rejected} with rejections"
        );
        if num_blocks < 256 {
            assert!(preempted > 0, "no preemption in {num_blocks} blocks");
        }
    }
}

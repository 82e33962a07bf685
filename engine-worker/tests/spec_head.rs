//! EAGLE-3 draft heads on the CPU backend: the forward matches the PyTorch reference of
//! `scripts/draft_head/model.py` (a fixture in the published tensor names and shapes); a head
//! that does not fit its target is refused naming what differs; the drafter's drafts, step after
//! step with random verdicts and preemptions, are exactly those of a head run from scratch over
//! the sequence (so rejected positions are rolled back and the target's states are aligned with
//! the tokens); and greedy and seeded outputs with the head equal K = 0's.

use std::path::{Path, PathBuf};

use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions};
use engine_worker::backend::{Backend, HeadForward, HeadInput, LogitsFor, SeqForward};
use engine_worker::engine::{Engine, EngineConfig, RowKind};
use engine_worker::model::{HeadWeights, Model, ModelConfig, RopeStyle, WeightType};
use engine_worker::spec::{
    DraftJob, DraftSource, Drafter, HeadDrafter, SpecPolicy, StepCost, TargetRows,
};
use proto::api_worker::{AddRequest, SamplingParams, StopConditions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

const BLOCK: usize = 16;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/eagle3-fixture")
}

/// A random target the fixture head fits: its vocabulary, hidden size, and layers 1..3.
fn target_config() -> ModelConfig {
    ModelConfig {
        name: "toy-target".into(),
        vocab_size: 300,
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 4,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        rope_theta: 10_000.0,
        rope_style: RopeStyle::HalfSplit,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 2048,
        attention_bias: false,
        tie_word_embeddings: true,
        bos_token_id: None,
        eos_token_ids: vec![299],
    }
}

fn backend(num_blocks: usize) -> CpuBackend {
    let model = Model::dummy(target_config(), WeightType::F32, 5).unwrap();
    let mut options = CpuBackendOptions::new(num_blocks);
    options.block_size = BLOCK;
    options.threads = Some(1);
    options.kv_dtype = engine_worker::kv::KvDtype::F32;
    CpuBackend::new(model, options).unwrap()
}

fn head() -> HeadWeights {
    HeadWeights::load(&fixture(), &target_config(), WeightType::F32).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    let mut out = Vec::new();
    flatten(v, &mut out);
    out
}

fn flatten(v: &Value, out: &mut Vec<f32>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        Value::Number(n) => out.push(n.as_f64().unwrap() as f32),
        other => panic!("not a number: {other}"),
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}[{i}]: {g} against the reference's {w} (scale {scale})"
        );
    }
}

#[test]
fn the_cpu_head_matches_the_pytorch_reference() {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap())
            .unwrap();
    let tol = 1e-4;
    let mut backend = backend(4);
    let weights = head();
    let d2t = weights.draft_to_target.clone();
    backend.attach_draft_head(weights).unwrap();
    let table: Vec<u32> = (0..4).collect();
    let tokens: Vec<u32> = reference["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let g = floats(&reference["target_hidden"]);
    let catch_up = &reference["catch_up"];
    let out = backend
        .head_forward(&[HeadForward {
            tokens: &tokens,
            start_pos: 0,
            block_table: &table,
            input: HeadInput::Target(&g),
            logits: LogitsFor::All,
        }])
        .unwrap();
    assert_close(
        "catch-up logits",
        &out.logits,
        &floats(&catch_up["logits"]),
        tol,
    );
    assert_close(
        "catch-up states",
        &out.hidden,
        &floats(&catch_up["out"]),
        tol,
    );
    let dv = d2t.len();
    let last = &out.logits[11 * dv..];
    let mut token = d2t[argmax(last)];
    assert_eq!(
        u64::from(token),
        catch_up["argmax_target"][11].as_u64().unwrap()
    );
    let mut state = out.hidden[11 * 64..].to_vec();
    for draft in reference["drafts"].as_array().unwrap() {
        let pos = draft["position"].as_u64().unwrap() as usize;
        assert_eq!(u64::from(token), draft["input_token"].as_u64().unwrap());
        let out = backend
            .head_forward(&[HeadForward {
                tokens: &[token],
                start_pos: pos,
                block_table: &table,
                input: HeadInput::Own(&state),
                logits: LogitsFor::Last,
            }])
            .unwrap();
        assert_close(
            &format!("draft at {pos}: logits"),
            &out.logits,
            &floats(&draft["logits"]),
            tol,
        );
        assert_close(
            &format!("draft at {pos}: state"),
            &out.hidden,
            &floats(&draft["out"]),
            tol,
        );
        token = d2t[argmax(&out.logits)];
        assert_eq!(u64::from(token), draft["argmax_target"].as_u64().unwrap());
        state = out.hidden;
    }
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

#[test]
fn a_head_that_does_not_fit_is_refused_naming_what_differs() {
    let mut other = target_config();
    other.vocab_size = 301;
    other.num_layers = 3;
    let err = HeadWeights::load(&fixture(), &other, WeightType::F32).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("vocab_size is 300 in the head, 301 in the target"),
        "{text}"
    );
    assert!(
        text.contains("auxiliary layer 3 is past the target's 3 layers"),
        "{text}"
    );
    // Not a head at all.
    let dir = tempdir("not-a-head");
    std::fs::write(dir.join("config.json"), r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 300}"#).unwrap();
    let err = HeadWeights::load(&dir, &target_config(), WeightType::F32).unwrap_err();
    assert!(err.to_string().contains("LlamaForCausalLMEagle3"), "{err}");
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specula-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The drafts a head run from scratch gives for `tokens`, written out here rather than through
/// the drafter: the target over every token but the last (its states captured), then the head
/// over positions `0..len - 1`, position `p` reading token `p + 1` with the target's states at
/// `p`, then each draft at the next position with the head's own previous state.
fn drafts_from_scratch(tokens: &[u32], k: usize) -> Vec<u32> {
    let mut target = backend(64);
    let table: Vec<u32> = (0..64).collect();
    let weights = head();
    let d2t = weights.draft_to_target.clone();
    target.capture_hidden(&weights.config.aux_layers).unwrap();
    target.attach_draft_head(weights).unwrap();
    let prefix = &tokens[..tokens.len() - 1];
    target
        .forward(&[SeqForward::new(prefix, 0, &table, LogitsFor::Last)])
        .unwrap();
    let states = target.take_hidden();
    let mut out = target
        .head_forward(&[HeadForward {
            tokens: &tokens[1..],
            start_pos: 0,
            block_table: &table,
            input: HeadInput::Target(&states),
            logits: LogitsFor::Last,
        }])
        .unwrap();
    let mut drafts = vec![d2t[argmax(&out.logits)]];
    for pos in tokens.len() - 1..tokens.len() + k - 2 {
        out = target
            .head_forward(&[HeadForward {
                tokens: &drafts[drafts.len() - 1..],
                start_pos: pos,
                block_table: &table,
                input: HeadInput::Own(&out.hidden),
                logits: LogitsFor::Last,
            }])
            .unwrap();
        drafts.push(d2t[argmax(&out.logits)]);
    }
    drafts
}

/// Steps the drafter the way the engine does (verify forward of `[last, drafts]`, a verdict,
/// sometimes a preemption and recompute into other blocks) with verdicts drawn at random, and
/// checks every draft against a head run from scratch over the same tokens. A head that kept a
/// rejected draft's keys and values, or read the target's states one position off, drafts
/// differently.
#[test]
fn drafts_depend_on_the_sequence_alone_through_rejections_and_preemptions() {
    let k = 4;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut target = backend(64);
    let mut drafter =
        HeadDrafter::new(head(), &mut target, StepCost::from_calibration(&[], 1)).unwrap();
    let mut table: Vec<u32> = (0..32).collect();
    let mut tokens: Vec<u32> = (0..9).map(|_| rng.gen_range(0..299)).collect();
    // Prefill: the prompt, then its first token.
    target
        .forward(&[SeqForward::new(&tokens, 0, &table, LogitsFor::Last)])
        .unwrap();
    let rows = [TargetRows {
        seq: 7,
        start_pos: 0,
        len: tokens.len(),
        settled: false,
    }];
    drafter.target_forward(&mut target, &rows);
    let len_before = tokens.len();
    tokens.push(rng.gen_range(0..299));
    drafter.verified(7, &tokens, &table, len_before, 0, 0);
    let mut accepted_counts = [0usize; 5];
    for step in 0..40 {
        if step % 13 == 12 {
            // Preempted, then recomputed into other blocks.
            drafter.preempted(7);
            table = (32..64).collect();
            let prefix = &tokens[..tokens.len() - 1];
            target
                .forward(&[SeqForward::new(prefix, 0, &table, LogitsFor::Last)])
                .unwrap();
            let rows = [TargetRows {
                seq: 7,
                start_pos: 0,
                len: prefix.len(),
                settled: true,
            }];
            drafter.target_forward(&mut target, &rows);
        }
        let job = DraftJob {
            seq: 7,
            tokens: &tokens,
            block_table: &table,
            drafts: k,
            sampling: &SamplingParams::GREEDY,
            seed: 0,
            first_position: 0,
        };
        let drafts = drafter.draft(&mut target, &[job]).unwrap().remove(0);
        assert_eq!(
            drafts,
            drafts_from_scratch(&tokens, k),
            "step {step}: drafts differ from the head's over the same {} tokens",
            tokens.len()
        );
        let mut chunk = vec![*tokens.last().unwrap()];
        chunk.extend_from_slice(&drafts);
        let start = tokens.len() - 1;
        target
            .forward(&[SeqForward::new(&chunk, start, &table, LogitsFor::All)])
            .unwrap();
        let rows = [TargetRows {
            seq: 7,
            start_pos: start,
            len: chunk.len(),
            settled: false,
        }];
        drafter.target_forward(&mut target, &rows);
        let accepted = rng.gen_range(0..=k);
        accepted_counts[accepted] += 1;
        let len_before = tokens.len();
        tokens.extend_from_slice(&drafts[..accepted]);
        tokens.push(rng.gen_range(0..299));
        drafter.verified(7, &tokens, &table, len_before, k, accepted);
    }
    assert!(
        accepted_counts.iter().all(|&n| n > 0),
        "{accepted_counts:?}"
    );
}

fn request(id: u64, prompt: Vec<u32>, max_tokens: u32, sampling: SamplingParams) -> AddRequest {
    AddRequest {
        id,
        owner: "test".into(),
        arrival_unix_ms: 0,
        prompt_token_ids: prompt,
        max_tokens,
        sampling,
        stop: StopConditions {
            ignore_eos: true,
            ..StopConditions::default()
        },
        class: String::new(),
    }
}

/// Every request's tokens, with their logprobs, running `reqs` with the head at K (0: no
/// speculation); and how many rows were preempted and tokens drafted.
type Outputs = Vec<(Vec<u32>, Vec<proto::TokenLogprob>)>;

fn outputs(k: usize, num_blocks: usize, reqs: &[AddRequest]) -> (Outputs, usize, usize) {
    let cfg = EngineConfig {
        num_spec_tokens: k,
        spec_policy: SpecPolicy::Fixed,
        max_num_seqs: 16,
        ..EngineConfig::default()
    };
    let source = (k > 0).then(|| DraftSource::Head(Box::new(head())));
    let mut engine = Engine::with_drafter(backend(num_blocks), cfg, None, source).unwrap();
    for r in reqs {
        engine.add_request(r.clone()).unwrap();
    }
    let mut out: Outputs = vec![(Vec::new(), Vec::new()); reqs.len()];
    let (mut preempted, mut drafted) = (0, 0);
    while engine.has_work() {
        for row in engine.step() {
            let (tokens, logprobs) = &mut out[row.id as usize];
            tokens.extend_from_slice(&row.tokens);
            logprobs.extend_from_slice(&row.logprobs);
            preempted += usize::from(row.kind == RowKind::Preempted);
            drafted += usize::from(row.drafted);
        }
    }
    (out, preempted, drafted)
}

/// Greedy and seeded sampling with the head give K = 0's tokens and logprobs, at batch 1, 8 and
/// 16, with prefix-cache hits (shared prompt stems) and, in a small cache, preemption.
#[test]
fn the_head_never_changes_what_a_request_generates() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let stem: Vec<u32> = (0..40).map(|_| rng.gen_range(0..299)).collect();
    for (batch, num_blocks) in [(1, 64), (8, 64), (16, 64), (16, 14)] {
        let reqs: Vec<AddRequest> = (0..batch as u64)
            .map(|id| {
                let mut prompt = stem.clone();
                prompt.extend((0..rng.gen_range(1..20)).map(|_| rng.gen_range(0..299)));
                let sampling = match id % 3 {
                    0 => SamplingParams::GREEDY,
                    1 => SamplingParams {
                        logprobs: Some(3),
                        ..SamplingParams::GREEDY
                    },
                    _ => SamplingParams {
                        temperature: 0.8,
                        seed: Some(id),
                        logprobs: Some(2),
                        ..SamplingParams::GREEDY
                    },
                };
                request(id, prompt, 24, sampling)
            })
            .collect();
        let (k0, _, _) = outputs(0, num_blocks, &reqs);
        let (k4, preempted, drafted) = outputs(4, num_blocks, &reqs);
        assert!(drafted > 0, "batch {batch}: the head drafted nothing");
        if num_blocks < 64 {
            assert!(
                preempted > 0,
                "batch {batch}: no preemption in {num_blocks} blocks"
            );
        }
        assert!(
            batch == 1 || k4.iter().any(|(_, l)| !l.is_empty()),
            "batch {batch}: no logprobs were asked for"
        );
        assert_eq!(k0, k4, "batch {batch}, {num_blocks} blocks");
    }
}

/// In the engine, with prefix-cache hits (a second wave of requests shares the first's prompt
/// stem), a batch of 8 and preemption in a small cache: every verified draft is the draft a head
/// run from scratch over the request's tokens gives, so a cached block's head cache is the new
/// sequence's own (the last matched block is computed again) and nothing stale is read.
#[test]
fn engine_drafts_equal_a_head_run_from_scratch_with_prefix_hits_and_preemption() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let stem: Vec<u32> = (0..32).map(|_| rng.gen_range(0..299)).collect();
    for num_blocks in [64, 20] {
        let cfg = EngineConfig {
            num_spec_tokens: 4,
            spec_policy: SpecPolicy::Fixed,
            max_num_seqs: 8,
            prefix_caching: true,
            ..EngineConfig::default()
        };
        let source = DraftSource::Head(Box::new(head()));
        let mut engine =
            Engine::with_drafter(backend(num_blocks), cfg, None, Some(source)).unwrap();
        let mut tokens: Vec<Vec<u32>> = Vec::new();
        let (mut checked, mut preempted) = (0, 0);
        for wave in 0..2 {
            for _ in 0..8 {
                let id = tokens.len() as u64;
                let mut prompt = stem.clone();
                prompt.extend((0..rng.gen_range(1..12)).map(|_| rng.gen_range(0..299)));
                tokens.push(prompt.clone());
                engine
                    .add_request(request(id, prompt, 20, SamplingParams::GREEDY))
                    .unwrap();
            }
            while engine.has_work() {
                for row in engine.step() {
                    let seq = &mut tokens[row.id as usize];
                    preempted += usize::from(row.kind == RowKind::Preempted);
                    if row.kind == RowKind::Verify && row.drafted > 0 {
                        let drafts = &row.policy.offer[..usize::from(row.drafted)];
                        assert_eq!(
                            drafts,
                            drafts_from_scratch(seq, drafts.len()),
                            "wave {wave}, request {}, at {} tokens, {num_blocks} blocks",
                            row.id,
                            seq.len()
                        );
                        checked += 1;
                    }
                    seq.extend_from_slice(&row.tokens);
                }
            }
        }
        assert!(checked > 50, "{checked} drafts checked");
        if num_blocks < 64 {
            assert!(preempted > 0, "no preemption in {num_blocks} blocks");
        }
    }
}

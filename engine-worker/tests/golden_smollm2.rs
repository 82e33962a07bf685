//! The CPU forward pass against `../shared/golden/smollm2/` (a float32 numpy reference over
//! the dequantized GGUF tensors): first-step top-20 logits within 1e-3, and the greedy
//! continuation token for token through the paged KV cache.

use std::path::{Path, PathBuf};

use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions, Isa};
use engine_worker::backend::{Backend, LogitsFor, SeqForward};
use engine_worker::kv::KvDtype;
use engine_worker::model::load_gguf;
use serde_json::Value;

/// A top-2 margin below this may legitimately flip between faithful implementations.
const MIN_MARGIN: f64 = 0.01;
const LOGIT_TOLERANCE: f64 = 1e-3;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn model_path() -> PathBuf {
    let path = manifest().join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} missing: run scripts/fetch-model.sh",
        path.display()
    );
    path
}

fn golden_cases() -> Vec<(String, Value)> {
    let dir = manifest().join("../../shared/golden/smollm2");
    let mut cases: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| p.file_stem().is_some_and(|s| s != "tokenizer"))
        .map(|p| {
            (
                name(&p),
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap(),
            )
        })
        .collect();
    cases.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        cases.len() >= 4,
        "expected the golden prompts in {}",
        dir.display()
    );
    cases
}

fn name(p: &Path) -> String {
    p.file_stem().unwrap().to_string_lossy().into_owned()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn smollm2_matches_the_golden_logits_and_greedy_tokens() {
    let model = load_gguf(&model_path()).unwrap();
    let vocab = model.config.vocab_size;
    let mut backend = CpuBackend::new(model, CpuBackendOptions::new(64)).unwrap();
    let table: Vec<u32> = (0..16).collect();
    for (name, case) in golden_cases() {
        let prompt = ids(&case["prompt_ids"]);
        let greedy = ids(&case["greedy_ids"]);
        let margins = floats(&case["top2_margins"]);
        let top = &case["first_step_top20"];

        let mut logits = backend
            .forward(&[SeqForward {
                tokens: &prompt,
                start_pos: 0,
                block_table: &table,
                logits: LogitsFor::Last,
            }])
            .unwrap();
        assert_eq!(logits.len(), vocab);
        let mut worst: f64 = 0.0;
        for (id, want) in ids(&top["top_ids"]).iter().zip(floats(&top["top_logits"])) {
            let err = (f64::from(logits[*id as usize]) - want).abs();
            worst = worst.max(err);
            assert!(
                err < LOGIT_TOLERANCE,
                "{name}: logit of {id} is {} vs {want}",
                logits[*id as usize]
            );
        }
        eprintln!("{name}: first-step top-20 max |error| {worst:.2e}");

        let mut checked = 0;
        for (step, &want) in greedy.iter().enumerate() {
            if margins[step] < MIN_MARGIN {
                break;
            }
            assert_eq!(argmax(&logits), want, "{name}: greedy step {step}");
            checked += 1;
            if step + 1 == greedy.len() {
                break;
            }
            logits = backend
                .forward(&[SeqForward {
                    tokens: &[want],
                    start_pos: prompt.len() + step,
                    block_table: &table,
                    logits: LogitsFor::Last,
                }])
                .unwrap();
        }
        eprintln!("{name}: {checked}/{} greedy tokens checked", greedy.len());
        assert!(checked > 0, "{name}: no greedy step compared");
    }
}

fn seq<'a>(tokens: &'a [u32], start_pos: usize, table: &'a [u32], all: bool) -> SeqForward<'a> {
    let logits = if all { LogitsFor::All } else { LogitsFor::Last };
    SeqForward::new(tokens, start_pos, table, logits)
}

#[test]
fn smollm2_prefill_decode_and_verify_chunks_agree() {
    let (_, case) = golden_cases().remove(0);
    let mut tokens = ids(&case["prompt_ids"]);
    tokens.extend(ids(&case["greedy_ids"]));
    let model = load_gguf(&model_path()).unwrap();
    let vocab = model.config.vocab_size;
    let table: Vec<u32> = (0..8).collect();

    let mut one_go = CpuBackend::new(model.clone(), CpuBackendOptions::new(8)).unwrap();
    let full = one_go.forward(&[seq(&tokens, 0, &table, true)]).unwrap();

    // Prompt in one chunk, then token-by-token decode, then K+1 = 3-token verify chunks.
    let mut stepwise = CpuBackend::new(model, CpuBackendOptions::new(8)).unwrap();
    let split = tokens.len() - 8;
    let mut pos = 0;
    let mut rows = stepwise
        .forward(&[seq(&tokens[..split], 0, &table, true)])
        .unwrap();
    pos += split;
    while pos < split + 3 {
        rows.extend(
            stepwise
                .forward(&[seq(&tokens[pos..pos + 1], pos, &table, false)])
                .unwrap(),
        );
        pos += 1;
    }
    while pos < tokens.len() {
        let end = (pos + 3).min(tokens.len());
        rows.extend(
            stepwise
                .forward(&[seq(&tokens[pos..end], pos, &table, true)])
                .unwrap(),
        );
        pos = end;
    }
    assert_eq!(rows.len(), full.len());
    let worst = rows
        .iter()
        .zip(&full)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst < 1e-4,
        "max |difference| {worst} over {} positions",
        full.len() / vocab
    );
}

#[test]
fn smollm2_logits_do_not_depend_on_the_batch() {
    let cases = golden_cases();
    let model = load_gguf(&model_path()).unwrap();
    let vocab = model.config.vocab_size;
    let mut alone = CpuBackend::new(model.clone(), CpuBackendOptions::new(64)).unwrap();
    let mut crowd = CpuBackend::new(model, CpuBackendOptions::new(64)).unwrap();

    // Eight sequences (golden prompts and their shifted variants), each with its own blocks.
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|i| {
            let p = ids(&cases[i % cases.len()].1["prompt_ids"]);
            p[i / cases.len() * 3..].to_vec()
        })
        .collect();
    let tables: Vec<Vec<u32>> = (0..8u32).map(|i| (i * 8..i * 8 + 8).collect()).collect();
    let target = 5;

    let want_prefill = alone
        .forward(&[seq(&prompts[target], 0, &tables[target], true)])
        .unwrap();
    let batch: Vec<SeqForward<'_>> = (0..8)
        .map(|i| seq(&prompts[i], 0, &tables[i], true))
        .collect();
    let got = crowd.forward(&batch).unwrap();
    let offset: usize = prompts[..target].iter().map(Vec::len).sum::<usize>() * vocab;
    assert!(
        want_prefill
            .iter()
            .zip(&got[offset..offset + want_prefill.len()])
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "prefill logits differ between alone and batched"
    );

    // One decode step for everyone, the target verifying 4 draft tokens.
    let draft = [504u32, 3575, 282, 4649, 314];
    let want_verify = alone
        .forward(&[seq(&draft, prompts[target].len(), &tables[target], true)])
        .unwrap();
    let batch: Vec<SeqForward<'_>> = (0..8)
        .map(|i| {
            if i == target {
                seq(&draft, prompts[i].len(), &tables[i], true)
            } else {
                seq(&draft[..1], prompts[i].len(), &tables[i], false)
            }
        })
        .collect();
    let got = crowd.forward(&batch).unwrap();
    let offset = target * vocab;
    assert!(
        want_verify
            .iter()
            .zip(&got[offset..offset + want_verify.len()])
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "verify logits differ between alone and batched"
    );
}

#[test]
fn smollm2_first_step_logits_match_on_every_instruction_set() {
    let model = load_gguf(&model_path()).unwrap();
    let table: Vec<u32> = (0..4).collect();
    let cases = golden_cases();
    for isa in Isa::testable(&Isa::ALL, "golden_smollm2 (first-step logits)") {
        let mut options = CpuBackendOptions::new(4);
        options.isa = Some(isa);
        let mut backend = CpuBackend::new(model.clone(), options).unwrap();
        assert_eq!(backend.isa(), isa);
        for (name, case) in &cases {
            let prompt = ids(&case["prompt_ids"]);
            let logits = backend.forward(&[seq(&prompt, 0, &table, false)]).unwrap();
            let top = &case["first_step_top20"];
            for (id, want) in ids(&top["top_ids"]).iter().zip(floats(&top["top_logits"])) {
                let got = f64::from(logits[*id as usize]);
                assert!(
                    (got - want).abs() < LOGIT_TOLERANCE,
                    "{isa:?} {name}: logit of {id} is {got} vs {want}"
                );
            }
        }
    }
}

/// One KV precision against one golden prompt.
struct PrecisionResult {
    /// Largest |error| of the first step's top-20 logits.
    top20_error: f64,
    /// Leading greedy tokens equal to the golden continuation, generating freely.
    agree: usize,
    /// Steps before the golden continuation's first near-tie (top-2 margin below
    /// [`MIN_MARGIN`]), where faithful implementations must agree.
    must_agree: usize,
    total: usize,
}

/// Greedy generation from the prompt on the backend's own tokens, compared with the golden ones.
fn against_golden(backend: &mut CpuBackend, case: &Value) -> PrecisionResult {
    let table: Vec<u32> = (0..16).collect();
    let prompt = ids(&case["prompt_ids"]);
    let greedy = ids(&case["greedy_ids"]);
    let margins = floats(&case["top2_margins"]);
    let mut logits = backend.forward(&[seq(&prompt, 0, &table, false)]).unwrap();
    let top = &case["first_step_top20"];
    let top20_error = ids(&top["top_ids"])
        .iter()
        .zip(floats(&top["top_logits"]))
        .map(|(id, want)| (f64::from(logits[*id as usize]) - want).abs())
        .fold(0.0, f64::max);
    let mut agree = 0;
    for (step, &want) in greedy.iter().enumerate() {
        let got = argmax(&logits);
        if got != want {
            break;
        }
        agree += 1;
        if step + 1 < greedy.len() {
            let at = prompt.len() + step;
            logits = backend.forward(&[seq(&[got], at, &table, false)]).unwrap();
        }
    }
    PrecisionResult {
        top20_error,
        agree,
        must_agree: margins
            .iter()
            .position(|&m| m < MIN_MARGIN)
            .unwrap_or(greedy.len()),
        total: greedy.len(),
    }
}

/// Every KV precision against the golden data, printed as the table in docs/history/benchmarks-notebook.md
/// (`cargo test --release -p engine-worker --test golden_smollm2 precisions -- --nocapture`).
/// f32 must agree everywhere it must; the worker's default precision is the cheapest that
/// does, so every cheaper one must fail somewhere (else the default is wrong: this says so).
#[test]
fn kv_cache_precisions_against_the_golden_continuations() {
    let model = load_gguf(&model_path()).unwrap();
    let cases = golden_cases();
    let default = KvDtype::SERVING_DEFAULT;
    let bytes = |d: KvDtype| d.row_bytes(model.config.head_dim);
    println!("| KV precision | bytes a token | prompt | top-20 max abs error | greedy tokens equal | before the first near-tie |");
    println!("|---|---:|---|---:|---:|---:|");
    let mut holds = Vec::new();
    for dtype in KvDtype::ALL {
        let mut options = CpuBackendOptions::new(16);
        options.kv_dtype = dtype;
        let mut backend = CpuBackend::new(model.clone(), options).unwrap();
        let per_token = 2 * model.config.num_layers * model.config.num_kv_heads * bytes(dtype);
        let mut all_hold = true;
        for (name, case) in &cases {
            let r = against_golden(&mut backend, case);
            let held = r.agree >= r.must_agree;
            all_hold &= held;
            println!(
                "| {dtype} | {per_token} | {name} | {:.1e} | {}/{} | {} |",
                r.top20_error,
                r.agree,
                r.total,
                if held {
                    "all".to_string()
                } else {
                    format!("{}/{}", r.agree, r.must_agree)
                }
            );
        }
        holds.push((dtype, all_hold));
    }
    assert!(
        holds[0] == (KvDtype::F32, true),
        "f32 must agree with the golden continuations"
    );
    let default_holds = holds.iter().any(|&(d, h)| d == default && h);
    assert!(
        default_holds,
        "the default KV precision {default} breaks a golden continuation"
    );
    for (dtype, held) in holds {
        if bytes(dtype) < bytes(default) {
            assert!(
                !held,
                "{dtype} is cheaper than the default {default} and agrees with every golden \
                 continuation: it should be the default"
            );
        }
    }
}

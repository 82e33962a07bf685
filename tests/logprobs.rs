//! Logprobs end to end, on the default model: greedy completions asking for each token's
//! logprob and its top 5 give, with K = 0 and with the default speculation, the same tokens
//! and logprobs, and those equal a full-vocabulary log-softmax of the CPU backend's logits
//! computed here from the same weights (the stack's default f16 KV cache, the reference's
//! too). Chat's shape (`logprobs.content`, bytes, `top_logprobs`) and its stream, whose
//! pieces add up to the whole answer, are checked on the speculating stack.

mod common;

use std::collections::HashMap;

use common::openai::{complete, stream, MODEL};
use common::stack::{Stack, StackConfig};
use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions};
use engine_worker::backend::{Backend, LogitsFor, SeqForward};
use engine_worker::kv::KvDtype;
use engine_worker::model::load_gguf;
use serde_json::{json, Value};

const MAX_TOKENS: usize = 24;
const TOP: usize = 5;

/// One generated token as the completions route reported it: id, logprob, and its top
/// alternatives (the chosen token among them, as the legacy shape adds it).
#[derive(Debug, Clone, PartialEq)]
struct Reported {
    id: u32,
    logprob: f64,
    top: HashMap<u32, f64>,
}

fn token_id(name: &str) -> u32 {
    name.strip_prefix("token_id:")
        .unwrap_or_else(|| panic!("{name} is not named by id"))
        .parse()
        .unwrap()
}

fn golden_prompts() -> Vec<(String, Vec<u32>)> {
    let dir = common::shared_dir().join("golden/smollm2");
    let mut cases: Vec<(String, Vec<u32>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| p.file_stem().is_some_and(|s| s != "tokenizer"))
        .map(|p| {
            let case: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let ids = case["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            (p.file_stem().unwrap().to_string_lossy().into_owned(), ids)
        })
        .collect();
    cases.sort();
    assert!(cases.len() >= 4, "golden prompts in {}", dir.display());
    cases
}

/// A greedy completion of `prompt` (token ids) with logprobs; the choice's tokens and the
/// speculative figures' accepted drafts.
async fn completion(stack: &Stack, prompt: &[u32]) -> (Vec<Reported>, u64) {
    let body = json!({
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": true,
        "logprobs": TOP,
        "return_tokens_as_token_ids": true,
    });
    let (status, resp) = complete(stack.client(), &stack.api("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{resp}");
    let choice = &resp["choices"][0];
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), MAX_TOKENS, "{lp}");
    let reported = (0..tokens.len())
        .map(|i| Reported {
            id: token_id(tokens[i].as_str().unwrap()),
            logprob: lp["token_logprobs"][i].as_f64().unwrap(),
            top: lp["top_logprobs"][i]
                .as_object()
                .unwrap()
                .iter()
                .map(|(name, v)| (token_id(name), v.as_f64().unwrap()))
                .collect(),
        })
        .collect();
    let accepted = choice["speculate_metrics"]["num_accepted_draft_tokens"]
        .as_u64()
        .unwrap_or(0);
    (reported, accepted)
}

/// Every golden prompt twice (the second time the suffix proposer drafts from the first's
/// output, so drafts are accepted).
async fn completions(config: StackConfig) -> (Vec<Vec<Reported>>, u64) {
    let stack = Stack::start(config).await;
    let mut all = Vec::new();
    let mut accepted = 0;
    for _ in 0..2 {
        for (_, prompt) in golden_prompts() {
            let (reported, a) = completion(&stack, &prompt).await;
            all.push(reported);
            accepted += a;
        }
    }
    (all, accepted)
}

/// `log_softmax(row)` in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// The reference: the CPU backend's logits after the prompt and after each generated token, one
/// step at a time, as log-softmax rows.
fn reference_rows(backend: &mut CpuBackend, prompt: &[u32], generated: &[u32]) -> Vec<Vec<f64>> {
    let table: Vec<u32> = (0..16).collect();
    let mut rows = vec![log_softmax(
        &backend
            .forward(&[SeqForward::new(prompt, 0, &table, LogitsFor::Last)])
            .unwrap(),
    )];
    for (i, t) in generated[..generated.len() - 1].iter().enumerate() {
        let logits = backend
            .forward(&[SeqForward::new(
                std::slice::from_ref(t),
                prompt.len() + i,
                &table,
                LogitsFor::Last,
            )])
            .unwrap();
        rows.push(log_softmax(&logits));
    }
    rows
}

fn max_difference(a: &[Vec<Reported>], b: &[Vec<Reported>]) -> f64 {
    let mut worst: f64 = 0.0;
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        assert_eq!(x.id, y.id);
        worst = worst.max((x.logprob - y.logprob).abs());
        let mut xs: Vec<_> = x.top.keys().collect();
        let mut ys: Vec<_> = y.top.keys().collect();
        xs.sort();
        ys.sort();
        assert_eq!(xs, ys, "top tokens differ");
        for (id, lp) in &x.top {
            worst = worst.max((lp - y.top[id]).abs());
        }
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_logprobs_equal_k0_and_the_cpu_reference() {
    let (plain, _) = completions(StackConfig {
        num_spec_tokens: 0,
        ..StackConfig::default()
    })
    .await;
    let (spec, accepted) = completions(StackConfig::default()).await;
    assert!(accepted > 0, "no draft was accepted: nothing was verified");
    let tokens = |runs: &[Vec<Reported>]| -> Vec<Vec<u32>> {
        runs.iter()
            .map(|r| r.iter().map(|t| t.id).collect())
            .collect()
    };
    assert_eq!(tokens(&spec), tokens(&plain), "greedy texts differ");
    let spec_vs_plain = max_difference(&spec, &plain);
    eprintln!("{accepted} drafts accepted; max |logprob difference| with K=0: {spec_vs_plain:.2e}");
    assert_eq!(spec, plain, "logprobs with speculation differ from K=0");

    let model = load_gguf(&common::default_model()).unwrap();
    let mut options = CpuBackendOptions::new(16);
    options.kv_dtype = KvDtype::F16;
    let mut backend = CpuBackend::new(model, options).unwrap();
    let mut worst: f64 = 0.0;
    for ((name, prompt), reported) in golden_prompts().iter().zip(&plain) {
        let generated: Vec<u32> = reported.iter().map(|t| t.id).collect();
        let rows = reference_rows(&mut backend, prompt, &generated);
        for (step, (t, row)) in reported.iter().zip(&rows).enumerate() {
            worst = worst.max((t.logprob - row[t.id as usize]).abs());
            // The top 5 are the reference's 5 most likely (plus the chosen token).
            let mut ranked: Vec<usize> = (0..row.len()).collect();
            ranked.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            let margin = row[ranked[TOP - 1]] - row[ranked[TOP]];
            for &id in &ranked[..TOP] {
                let lp = t.top.get(&(id as u32));
                if margin > 1e-3 {
                    assert!(lp.is_some(), "{name} step {step}: {id} not in the top");
                }
                if let Some(lp) = lp {
                    worst = worst.max((lp - row[id]).abs());
                }
            }
        }
    }
    eprintln!("max |logprob - reference log-softmax|: {worst:.2e}");
    assert!(
        worst < 1e-4,
        "logprobs differ from the reference by {worst}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs_have_openai_shape_and_stream_the_same() {
    let stack = Stack::start(StackConfig::default()).await;
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "List three colors."}],
        "max_tokens": 16,
        "temperature": 0,
        "logprobs": true,
        "top_logprobs": 3,
    });
    let (status, whole) = complete(stack.client(), &stack.api("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{whole}");
    let choice = &whole["choices"][0];
    let content = choice["logprobs"]["content"].as_array().unwrap();
    let completion_tokens = whole["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(content.len(), completion_tokens, "{whole}");
    let mut text_bytes = Vec::new();
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{entry}");
        let lp = entry["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], entry["token"], "{entry}");
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-9);
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        let bytes: Vec<u8> = entry["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        text_bytes.extend(bytes);
    }
    // The bytes of the tokens spell the answer (EOS, if it came, adds its own text).
    let text = choice["message"]["content"].as_str().unwrap();
    assert!(
        String::from_utf8_lossy(&text_bytes).starts_with(text),
        "{text:?} vs {:?}",
        String::from_utf8_lossy(&text_bytes)
    );

    let mut streamed_body = body.clone();
    streamed_body["stream"] = true.into();
    let streamed = stream(
        stack.client(),
        &stack.api("/v1/chat/completions"),
        &streamed_body,
        |_| true,
    )
    .await;
    assert!(streamed.done, "{:?}", streamed.error);
    let pieces: Vec<Value> = streamed
        .chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(
        &pieces, content,
        "streamed logprobs differ from the whole answer's"
    );

    // Without logprobs asked for, none are sent.
    let mut plain = body;
    plain.as_object_mut().unwrap().remove("logprobs");
    plain.as_object_mut().unwrap().remove("top_logprobs");
    let (_, resp) = complete(stack.client(), &stack.api("/v1/chat/completions"), &plain).await;
    assert!(resp["choices"][0]["logprobs"].is_null(), "{resp}");
}

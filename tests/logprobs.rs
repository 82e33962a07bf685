//! Logprobs end to end, on the default model: greedy completions asking for each token's
//! logprob and its top 5 give, with K = 0 and with the default speculation, the same tokens
//! and logprobs, and those equal a full-vocabulary log-softmax of the CPU backend's logits
//! computed here from the same weights (the stack's default f16 KV cache, the reference's
//! too). The same for the prompt's logprobs of an echoed completion (`echo`, `logprobs`,
//! `max_tokens` 1: what lm-evaluation-harness sends for a log-likelihood). Chat's shape (`logprobs.content`, bytes, `top_logprobs`) and its stream, whose
//! pieces add up to the whole answer, are checked on the speculating stack.

mod common;

use std::collections::HashMap;

use common::openai::{complete, stream, MODEL};
use common::reference::{self, log_softmax};
use common::stack::{Stack, StackConfig};
use engine_worker::backend::cpu::CpuBackend;
use engine_worker::backend::{Backend, LogitsFor, SeqForward};
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

/// An echoed completion of `prompt` with logprobs and one output token: the prompt's tokens
/// as reported, the first one with no logprob (None) and the rest with theirs.
async fn echoed(stack: &Stack, prompt: &[u32]) -> Vec<Option<Reported>> {
    let body = json!({
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0,
        "echo": true,
        "logprobs": TOP,
        "return_tokens_as_token_ids": true,
    });
    let (status, resp) = complete(stack.client(), &stack.api("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{resp}");
    let lp = &resp["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.len(),
        prompt.len() + 1,
        "prompt and one output token: {lp}"
    );
    assert!(
        lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null(),
        "{lp}"
    );
    let offsets = lp["text_offset"].as_array().unwrap();
    assert!(
        offsets.windows(2).all(|w| w[0].as_u64() <= w[1].as_u64()),
        "{lp}"
    );
    (0..prompt.len())
        .map(|i| {
            let id = token_id(tokens[i].as_str().unwrap());
            assert_eq!(id, prompt[i], "the echoed tokens are the prompt's");
            let logprob = lp["token_logprobs"][i].as_f64()?;
            let top = lp["top_logprobs"][i].as_object().unwrap();
            Some(Reported {
                id,
                logprob,
                top: top
                    .iter()
                    .map(|(name, v)| (token_id(name), v.as_f64().unwrap()))
                    .collect(),
            })
        })
        .collect()
}

/// What one stack reported: every golden prompt's greedy completion twice (the second time the
/// suffix proposer drafts from the first's output, so drafts are accepted), the accepted
/// drafts, and every golden prompt's echoed logprobs.
struct Runs {
    generated: Vec<Vec<Reported>>,
    accepted: u64,
    echoed: Vec<Vec<Option<Reported>>>,
}

async fn completions(config: StackConfig) -> Runs {
    let stack = Stack::start(config).await;
    let mut runs = Runs {
        generated: Vec::new(),
        accepted: 0,
        echoed: Vec::new(),
    };
    for _ in 0..2 {
        for (_, prompt) in golden_prompts() {
            let (reported, a) = completion(&stack, &prompt).await;
            runs.generated.push(reported);
            runs.accepted += a;
        }
    }
    for (_, prompt) in golden_prompts() {
        runs.echoed.push(echoed(&stack, &prompt).await);
    }
    runs
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

/// The largest difference of a reported logprob (the token's and its top alternatives') from
/// the reference row; asserts that the top `TOP` are the reference's where its ranking is clear.
fn difference_from(what: &str, t: &Reported, row: &[f64]) -> f64 {
    let mut worst = (t.logprob - row[t.id as usize]).abs();
    let mut ranked: Vec<usize> = (0..row.len()).collect();
    ranked.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    let margin = row[ranked[TOP - 1]] - row[ranked[TOP]];
    for &id in &ranked[..TOP] {
        let lp = t.top.get(&(id as u32));
        if margin > 1e-3 {
            assert!(lp.is_some(), "{what}: {id} not in the top");
        }
        if let Some(lp) = lp {
            worst = worst.max((lp - row[id]).abs());
        }
    }
    worst
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
async fn greedy_and_prompt_logprobs_equal_k0_and_the_cpu_reference() {
    let plain = completions(StackConfig {
        num_spec_tokens: 0,
        ..StackConfig::default()
    })
    .await;
    let spec = completions(StackConfig::default()).await;
    assert!(
        spec.accepted > 0,
        "no draft was accepted: nothing was verified"
    );
    let tokens = |runs: &[Vec<Reported>]| -> Vec<Vec<u32>> {
        runs.iter()
            .map(|r| r.iter().map(|t| t.id).collect())
            .collect()
    };
    assert_eq!(
        tokens(&spec.generated),
        tokens(&plain.generated),
        "greedy texts differ"
    );
    let spec_vs_plain = max_difference(&spec.generated, &plain.generated);
    eprintln!(
        "{} drafts accepted; max |logprob difference| with K=0: {spec_vs_plain:.2e}",
        spec.accepted
    );
    assert_eq!(
        spec.generated, plain.generated,
        "logprobs with speculation differ from K=0"
    );
    assert_eq!(
        spec.echoed, plain.echoed,
        "prompt logprobs with speculation differ from K=0"
    );

    let mut backend = reference::backend();
    let mut worst: f64 = 0.0;
    for ((name, prompt), reported) in golden_prompts().iter().zip(&plain.generated) {
        let generated: Vec<u32> = reported.iter().map(|t| t.id).collect();
        let rows = reference_rows(&mut backend, prompt, &generated);
        for (step, (t, row)) in reported.iter().zip(&rows).enumerate() {
            worst = worst.max(difference_from(&format!("{name} step {step}"), t, row));
        }
    }
    eprintln!("max |logprob - reference log-softmax|: {worst:.2e}");
    assert!(
        worst < 1e-4,
        "logprobs differ from the reference by {worst}"
    );

    // The prompt's: position i's row of one forward over the whole prompt scores token i + 1.
    let mut worst: f64 = 0.0;
    for ((name, prompt), echoed) in golden_prompts().iter().zip(&plain.echoed) {
        let rows = reference::prompt_rows(&mut backend, prompt);
        assert!(
            echoed[0].is_none(),
            "{name}: the first prompt token has a logprob"
        );
        for (i, t) in echoed.iter().enumerate().skip(1) {
            let t = t
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: token {i} has none"));
            worst = worst.max(difference_from(
                &format!("{name} prompt {i}"),
                t,
                &rows[i - 1],
            ));
        }
    }
    eprintln!("max |prompt logprob - reference log-softmax|: {worst:.2e}");
    assert!(
        worst < 1e-4,
        "prompt logprobs differ from the reference by {worst}"
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

    // An echoed completion streams its prompt first: the pieces add up to the whole answer.
    let body = json!({
        "model": MODEL,
        "prompt": "The three primary colors are",
        "max_tokens": 6,
        "temperature": 0,
        "echo": true,
        "logprobs": 2,
    });
    let (status, whole) = complete(stack.client(), &stack.api("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{whole}");
    let text = whole["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("The three primary colors are") && text.len() > 28,
        "{text:?}"
    );
    let mut streamed_body = body.clone();
    streamed_body["stream"] = true.into();
    let streamed = stream(
        stack.client(),
        &stack.api("/v1/completions"),
        &streamed_body,
        |_| true,
    )
    .await;
    assert!(streamed.done, "{:?}", streamed.error);
    let choices = || streamed.chunks.iter().map(|c| &c["choices"][0]);
    let streamed_text: String = choices().filter_map(|c| c["text"].as_str()).collect();
    assert_eq!(streamed_text, text);
    for column in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        let pieces: Vec<Value> = choices()
            .filter_map(|c| c["logprobs"][column].as_array().cloned())
            .flatten()
            .collect();
        assert_eq!(
            &Value::Array(pieces),
            &whole["choices"][0]["logprobs"][column],
            "streamed {column} differ from the whole answer's"
        );
    }
}

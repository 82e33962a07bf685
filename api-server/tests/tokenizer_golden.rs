//! The GGUF tokenizer and chat template reproduce the golden data made from the model file.

use std::path::PathBuf;
use std::sync::Arc;

use api_server::model::ModelAssets;
use api_server::template::TemplateMessage;
use api_server::tokenizer::detok::IncrementalDecoder;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn model() -> ModelAssets {
    let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    ModelAssets::load(&path).expect("default model present (scripts/fetch-model.sh)")
}

fn golden(name: &str) -> Value {
    let path = root().join("../shared/golden/smollm2").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn gguf_tokenizer_reproduces_every_golden_case() {
    let m = model();
    let cases = golden("tokenizer.json");
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 9);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(m.tokenizer.encode(text).unwrap(), want, "encode({text:?})");
        assert_eq!(m.tokenizer.decode(&want, false), text, "decode of {text:?}");
    }
}

#[test]
fn gguf_tokenizer_reproduces_golden_prompt_ids() {
    let m = model();
    for name in ["capital.json", "code.json", "list.json", "story.json"] {
        let g = golden(name);
        let prompt = g["prompt"].as_str().unwrap();
        assert_eq!(
            m.tokenizer.encode_prompt(prompt).unwrap(),
            ids(&g["prompt_ids"]),
            "{name}"
        );
    }
}

#[test]
fn gguf_metadata_gives_specials_and_context() {
    let m = model();
    assert_eq!(m.tokenizer.bos_id(), Some(1));
    assert_eq!(m.tokenizer.eos_id(), Some(2));
    assert_eq!(m.tokenizer.vocab_size(), 49152);
    assert_eq!(m.context_length, Some(8192));
    assert!(m.tokenizer.is_special(2) && !m.tokenizer.is_special(504));
}

#[test]
fn chat_template_renders_the_golden_capital_prompt() {
    let m = model();
    let g = golden("capital.json");
    let template = m
        .chat_template
        .as_ref()
        .expect("GGUF carries a chat template");
    let system = TemplateMessage {
        role: "system".into(),
        content: "You are a helpful AI assistant named SmolLM, trained by Hugging Face".into(),
    };
    let user = TemplateMessage {
        role: "user".into(),
        content: "What is the capital of France?".into(),
    };
    let want = g["prompt"].as_str().unwrap();
    assert_eq!(
        template.render(&[system, user.clone()], true).unwrap(),
        want
    );
    // The template supplies the same system prompt when none is given.
    assert_eq!(template.render(&[user], true).unwrap(), want);
}

#[test]
fn incremental_decoding_never_splits_a_character() {
    let m = model();
    let text = "naïve café résumé — “quotes” and emoji 🚀🔥 日本語のテキストと中文";
    let ids = m.tokenizer.encode(text).unwrap();
    let mut dec = IncrementalDecoder::new(Arc::clone(&m.tokenizer), vec![]);
    let mut out = String::new();
    for id in &ids {
        // Every piece is valid UTF-8 by type; also never a U+FFFD from a split character.
        let piece = dec.push(&[*id]);
        assert!(
            !piece.contains('\u{FFFD}'),
            "split character after token {id}"
        );
        out.push_str(&piece);
    }
    out.push_str(&dec.finish());
    assert_eq!(out, text);
}

#[test]
fn stop_strings_and_what_follows_are_never_returned() {
    let m = model();
    let text = "The capital of France is Paris. It is lovely.";
    let ids = m.tokenizer.encode(text).unwrap();
    for stop in [
        " Paris",
        "is P",
        ".",
        "lovely.",
        "France is Paris. It is lovely.",
    ] {
        let mut dec = IncrementalDecoder::new(Arc::clone(&m.tokenizer), vec![stop.to_owned()]);
        let mut out = String::new();
        for id in &ids {
            out.push_str(&dec.push(&[*id]));
        }
        out.push_str(&dec.finish());
        let want = &text[..text.find(stop).unwrap()];
        assert_eq!(out, want, "stop {stop:?}");
        assert_eq!(dec.matched_stop(), Some(stop));
    }
    // Without a match nothing is held back at the end.
    let mut dec = IncrementalDecoder::new(Arc::clone(&m.tokenizer), vec!["zzz".into()]);
    let mut out = dec.push(&ids);
    out.push_str(&dec.finish());
    assert_eq!(out, text);
    assert_eq!(dec.matched_stop(), None);
}

#[test]
fn special_tokens_are_skipped_in_output() {
    let m = model();
    let mut dec = IncrementalDecoder::new(Arc::clone(&m.tokenizer), vec![]);
    let mut out = dec.push(&[504, 3575, 2]);
    out.push_str(&dec.finish());
    assert_eq!(out, "The capital");
}

#[test]
fn hf_directory_loads_the_same_tokenizer_and_template() {
    let m = model();
    let dir = std::env::temp_dir().join(format!("specula-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        m.tokenizer.to_hf_json().unwrap(),
    )
    .unwrap();
    let gguf = gguf::GgufFile::open(root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let template = gguf
        .metadata()
        .get_str("tokenizer.chat_template")
        .unwrap()
        .to_owned();
    let config = serde_json::json!({
        "chat_template": template,
        "bos_token": {"content": "<|im_start|>"},
        "eos_token": "<|im_end|>",
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"max_position_embeddings": 8192}"#,
    )
    .unwrap();

    let hf = ModelAssets::load(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(hf.context_length, Some(8192));
    assert_eq!(hf.tokenizer.bos_id(), Some(1));
    assert_eq!(hf.tokenizer.eos_id(), Some(2));
    for case in golden("tokenizer.json")["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(
            hf.tokenizer.encode(text).unwrap(),
            want,
            "HF encode({text:?})"
        );
        assert_eq!(hf.tokenizer.decode(&want, false), text);
    }
    let g = golden("capital.json");
    let user = TemplateMessage {
        role: "user".into(),
        content: "What is the capital of France?".into(),
    };
    let prompt = hf
        .chat_template
        .as_ref()
        .unwrap()
        .render(&[user], true)
        .unwrap();
    assert_eq!(prompt, g["prompt"].as_str().unwrap());
    assert_eq!(
        hf.tokenizer.encode_prompt(&prompt).unwrap(),
        ids(&g["prompt_ids"])
    );
}

/// Reference for the incremental decoder: after each token, re-decode the whole prefix (complete
/// characters only); at the first token where any stop string appears, cut at the earliest one.
fn reference_output(m: &ModelAssets, ids: &[u32], stops: &[String]) -> String {
    let mut bytes = Vec::new();
    for &id in ids {
        bytes.extend_from_slice(m.tokenizer.token_bytes(id).unwrap());
        let valid = match std::str::from_utf8(&bytes) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = std::str::from_utf8(&bytes[..valid]).unwrap();
        if let Some(at) = stops.iter().filter_map(|s| text.find(s.as_str())).min() {
            return text[..at].to_owned();
        }
    }
    String::from_utf8(bytes).unwrap()
}

#[test]
fn incremental_decoding_matches_a_from_scratch_reference_on_random_inputs() {
    use rand::{Rng, SeedableRng};
    let m = model();
    let pieces = [
        "a", "b", "ab", " the", " ", "\n", "é", "日本", "🚀", "1", "23", ".", "—",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for case in 0..300 {
        let text: String = (0..rng.gen_range(0..25))
            .map(|_| pieces[rng.gen_range(0..pieces.len())])
            .collect();
        let stops: Vec<String> = (0..rng.gen_range(0..3))
            .map(|_| {
                if !text.is_empty() && rng.gen_bool(0.5) {
                    // A substring of the text (on char boundaries), so stops often hit.
                    let chars: Vec<char> = text.chars().collect();
                    let from = rng.gen_range(0..chars.len());
                    let len = rng.gen_range(1..=3.min(chars.len() - from));
                    chars[from..from + len].iter().collect()
                } else {
                    (0..rng.gen_range(1..3))
                        .map(|_| pieces[rng.gen_range(0..pieces.len())])
                        .collect()
                }
            })
            .collect();
        let ids = m.tokenizer.encode(&text).unwrap();
        let mut dec = IncrementalDecoder::new(Arc::clone(&m.tokenizer), stops.clone());
        let mut out = String::new();
        let mut rest = ids.as_slice();
        while !rest.is_empty() {
            let n = rng.gen_range(1..=rest.len().min(4));
            out.push_str(&dec.push(&rest[..n]));
            rest = &rest[n..];
        }
        out.push_str(&dec.finish());
        let want = reference_output(&m, &ids, &stops);
        assert_eq!(out, want, "case {case}: text {text:?} stops {stops:?}");
        assert_eq!(
            dec.matched_stop().is_some(),
            want.len() < text.len(),
            "case {case}"
        );
    }
}

//! Every golden acceptance case, through the live ingest's state machine: each event becomes a
//! step-batch row of a synthetic worker (one row per batch, and packed like engine steps).

mod common;

use std::collections::HashMap;

use proto::FinishReason;
use serde_json::Value;
use token_processor::replay::{self, Batching, Trace};

#[test]
fn every_golden_case_matches_through_the_ingest() {
    for path in common::golden_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let case: Value = serde_json::from_str(&text).unwrap();
        let trace = Trace::parse(&text).unwrap();
        for batching in [Batching::PerEvent, Batching::Packed] {
            let result = replay::run(&trace, batching);
            let got = serde_json::to_value(&result).unwrap();
            common::assert_close(
                &case["expected"],
                &got,
                &format!("{}({batching:?})", path.display()),
            );

            // The outputs are a gapless stream per request ending in exactly one final output,
            // whose usage counts the tokens delivered.
            let mut next_index: HashMap<u64, u32> = HashMap::new();
            let mut finals = 0;
            for out in &result.outputs {
                let next = next_index.entry(out.id).or_insert(0);
                assert_eq!(
                    out.first_index,
                    *next,
                    "{}: request {} stream",
                    path.display(),
                    out.id
                );
                *next += out.tokens.len() as u32;
                if let Some(reason) = out.finish {
                    finals += 1;
                    assert_eq!(out.usage.as_ref().unwrap().completion_tokens, *next);
                    assert_ne!(reason, FinishReason::Error);
                }
            }
            let expected_finals = case["expected"]["requests"]
                .as_object()
                .unwrap()
                .values()
                .filter(|r| !r["finish_reason"].is_null())
                .count();
            assert_eq!(finals, expected_finals, "{}", path.display());
        }
    }
}

#[test]
fn json_lines_traces_give_the_same_result_as_golden_files() {
    for path in common::golden_files() {
        let case: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut jsonl = serde_json::json!({"num_spec_tokens": case["num_spec_tokens"], "model": "m", "worker": "w"}).to_string();
        for event in case["events"].as_array().unwrap() {
            jsonl.push('\n');
            jsonl.push_str(&event.to_string());
        }
        let result = replay::run(&Trace::parse(&jsonl).unwrap(), Batching::Packed);
        common::assert_close(
            &case["expected"],
            &serde_json::to_value(&result).unwrap(),
            &path.display().to_string(),
        );
    }
}

#[test]
fn bad_traces_are_clear_errors() {
    let over_k = "{\"num_spec_tokens\": 2}\n{\"type\": \"verify\", \"request\": \"a\", \"drafted\": 3, \"accepted\": 1}";
    let err = Trace::parse(over_k).unwrap_err().to_string();
    assert!(err.contains("accepted <= drafted <= 2"), "{err}");
    let after_finish = "{\"num_spec_tokens\": 2}\n{\"type\": \"prefill\", \"request\": \"a\", \"finish\": \"stop\"}\n{\"type\": \"prefill\", \"request\": \"a\"}";
    assert!(Trace::parse(after_finish)
        .unwrap_err()
        .to_string()
        .contains("after the request finished"));
    assert!(Trace::parse("").is_err());
    assert!(
        Trace::parse("{\"num_spec_tokens\": 2}\n{\"type\": \"teleport\", \"request\": \"a\"}")
            .is_err()
    );
}

#[test]
fn unfinished_requests_are_reported_with_a_null_finish_reason() {
    let trace = Trace::parse("{\"num_spec_tokens\": 2}\n{\"type\": \"prefill\", \"request\": \"a\"}\n{\"type\": \"verify\", \"request\": \"a\", \"drafted\": 2, \"accepted\": 1}").unwrap();
    let got = serde_json::to_value(replay::run(&trace, Batching::Packed)).unwrap();
    assert!(got["requests"]["a"]["finish_reason"].is_null());
    assert_eq!(got["requests"]["a"]["num_steps"], 1);
    assert_eq!(got["global"]["num_steps_total"], 1);
}

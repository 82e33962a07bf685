//! The golden cases of the drafting policy's figures (`tests/data/policy_cases.json`, whose
//! meaning `docs/metrics.md` defines): per request `num_offered_tokens` and
//! `predicted_accepted_tokens`, per class the summed counters and finished-request
//! observations, driven through the tracker as step batches.

use std::collections::HashMap;
use std::sync::Arc;

use proto::classes::RequestClasses;
use proto::worker_tp::{RequestStart, StepBatch, StepRow};
use proto::FinishReason;
use serde_json::Value;
use token_processor::tracker::{Clock, Observations, Outbox, Tracker};

const NOW: Clock = Clock {
    mono_ns: 1,
    unix_ms: 1,
};

fn row(id: u64, tokens: &[u32], step: [u64; 4], finish: Option<FinishReason>) -> StepRow<'_> {
    StepRow {
        id,
        tokens,
        drafted: step[0] as u8,
        accepted: step[1] as u8,
        offered: step[2] as u8,
        predicted_milli: step[3] as u16,
        prefill: false,
        preempted: false,
        finish,
        logprobs: &[],
        prompt_logprobs: &[],
    }
}

fn run_case(case: &Value) {
    let name = case["name"].as_str().unwrap();
    let k = case["num_spec_tokens"].as_u64().unwrap() as u32;
    let configured: Vec<String> = serde_json::from_value(case["classes"].clone()).unwrap();
    let classes = Arc::new(RequestClasses::new(&configured).unwrap());
    let mut tracker = Tracker::new(k, 1024).with_classes(classes.clone());
    let mut obs = Observations::new(k as usize, classes.len());
    let mut out = Outbox::default();
    let requests = case["requests"].as_array().unwrap();
    let mut names = HashMap::new();
    // One batch per request: its prefill, then one batch per step, the last one finishing it.
    for (id, r) in requests.iter().enumerate() {
        let id = id as u64;
        names.insert(id, r["name"].as_str().unwrap().to_owned());
        let mut batch = StepBatch::new("w".into(), 1, 0);
        batch.starts.push(RequestStart {
            row: 0,
            owner: "api".into(),
            prompt_tokens: 3,
            cached_prompt_tokens: 0,
            arrival_unix_ms: 0,
            class: r["class"].as_str().unwrap().into(),
        });
        let mut prefill = row(id, &[1], [0; 4], None);
        prefill.prefill = true;
        batch.push(prefill);
        tracker.apply_batch(&batch, NOW, &mut out, &mut obs);
        let steps: Vec<[u64; 4]> = serde_json::from_value(r["steps"].clone()).unwrap();
        for (i, step) in steps.iter().enumerate() {
            let tokens = vec![7; step[1] as usize + 1];
            let finish = (i + 1 == steps.len()).then_some(FinishReason::Length);
            let mut batch = StepBatch::new("w".into(), 1, 0);
            batch.push(row(id, &tokens, *step, finish));
            batch.validate(k).unwrap();
            tracker.apply_batch(&batch, NOW, &mut out, &mut obs);
        }
    }
    let expected = &case["expected"];
    for (_, output) in out.drain_outputs() {
        let Some(m) = output.speculate_metrics else {
            continue;
        };
        let want = &expected["requests"][&names[&output.id]];
        assert_eq!(
            m.num_offered_tokens,
            want["num_offered_tokens"].as_u64(),
            "{name}: {}",
            names[&output.id]
        );
        assert_eq!(
            m.predicted_accepted_tokens,
            want["predicted_accepted_tokens"].as_f64(),
            "{name}: {}",
            names[&output.id]
        );
    }
    let by_class = expected["classes"].as_object().unwrap();
    for (i, class) in classes.names().iter().enumerate() {
        let f = &obs.figures[i];
        let finished = obs
            .finished_acceptance
            .iter()
            .filter(|a| usize::from(a.class) == i)
            .count() as u64;
        match by_class.get(class) {
            Some(want) => {
                assert_eq!(
                    f.offered_tokens(),
                    want["offered"].as_u64().unwrap(),
                    "{name}: {class}"
                );
                assert_eq!(
                    f.predicted_milli() as f64 / 1e3,
                    want["predicted"].as_f64().unwrap(),
                    "{name}: {class}"
                );
                assert_eq!(
                    f.steps(),
                    want["steps"].as_u64().unwrap(),
                    "{name}: {class}"
                );
                assert_eq!(
                    finished,
                    want["finished"].as_u64().unwrap(),
                    "{name}: {class}"
                );
            }
            None => assert!(f.is_zero() && finished == 0, "{name}: {class} counted"),
        }
    }
}

#[test]
fn policy_figures_match_the_golden_cases() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/policy_cases.json");
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 2);
    for case in cases {
        run_case(case);
    }
}

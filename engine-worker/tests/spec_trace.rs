//! `--trace-acceptance` files: a header line, then one golden-format event per row.

mod common;

use std::collections::HashMap;

use common::*;
use engine_worker::engine::Engine;
use engine_worker::trace::{TraceRun, TraceWriter};
use proto::api_worker::SamplingParams;

/// `(type, drafted, accepted, finish)` of one trace line.
type Event = (String, Option<u64>, Option<u64>, Option<String>);

#[test]
fn trace_lines_follow_the_golden_event_format() {
    let dir = std::env::temp_dir().join(format!("specula-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    let cost = [proto::worker_tp::CostPoint {
        tokens: 1,
        seconds: 0.004,
    }];
    let run = TraceRun {
        num_spec_tokens: 4,
        model: "toy",
        worker_id: "worker-a",
        proposer: "ngram",
        verify_cost: &cost,
    };
    let mut trace = TraceWriter::create(&path, &run, 1 << 30).unwrap();
    // A tight cache forces preemptions; one request is aborted mid-way.
    let backend = ToyBackend::new(32, vec![0], 20, 4);
    let mut engine = Engine::new(backend, engine_config(4, 8), None);
    for id in 0..6u64 {
        let prompt = vec![1, 2, 3, 4, 1, 2, 3, 4, (id as u32) + 5];
        engine
            .add_request(request(id + (1 << 40), prompt, 30, SamplingParams::GREEDY))
            .unwrap();
    }
    let mut outcomes = HashMap::new();
    let mut step = 0;
    while engine.has_work() {
        if step == 3 {
            assert!(engine.abort(2 + (1 << 40)));
        }
        let rows = engine.step();
        collect(&rows, 4, &mut outcomes);
        trace.record(&rows, engine.last_verify_timing()).unwrap();
        step += 1;
    }
    drop(trace);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap());
    let header = lines.next().unwrap();
    assert_eq!(header["num_spec_tokens"], 4);
    assert_eq!(header["model"], "toy");
    assert_eq!(header["worker_id"], "worker-a");
    assert_eq!(header["proposer"], "ngram");
    assert_eq!(header["verify_cost"], serde_json::json!([[1, 0.004]]));
    let mut last_step = 0;
    let mut seen: HashMap<String, Vec<Event>> = HashMap::new();
    for ev in lines {
        let obj = ev.as_object().unwrap();
        let kind = obj["type"].as_str().unwrap().to_string();
        for key in obj.keys() {
            assert!(
                [
                    "type",
                    "request",
                    "drafted",
                    "accepted",
                    "finish",
                    "offered",
                    "step",
                    "t_us",
                    "tokens",
                    "verify_us"
                ]
                .contains(&key.as_str()),
                "{key}"
            );
        }
        // Steps count up from 0; a verify carries the proposer's whole offer, which starts with
        // the verified drafts: the accepted ones are the first emitted tokens.
        let step = obj["step"].as_u64().unwrap();
        assert!(step >= last_step);
        last_step = step;
        assert!(obj["t_us"].is_u64());
        if kind == "verify" {
            let offered: Vec<u64> = serde_json::from_value(obj["offered"].clone()).unwrap();
            let tokens: Vec<u64> = serde_json::from_value(obj["tokens"].clone()).unwrap();
            let (d, a) = (
                obj["drafted"].as_u64().unwrap(),
                obj["accepted"].as_u64().unwrap(),
            );
            assert!(offered.len() as u64 >= d);
            // (A stop condition may cut the step's tokens short.)
            let n = (a as usize).min(tokens.len());
            assert_eq!(tokens[..n], offered[..n]);
            if a < d && tokens.len() > a as usize {
                assert_ne!(
                    tokens[a as usize], offered[a as usize],
                    "the first rejected draft"
                );
            }
        }
        assert_eq!(obj.contains_key("drafted"), kind == "verify");
        let id = obj["request"].as_str().unwrap().to_string();
        assert!(id.parse::<u64>().is_ok(), "request ids are decimal strings");
        seen.entry(id).or_default().push((
            kind,
            obj.get("drafted").and_then(|v| v.as_u64()),
            obj.get("accepted").and_then(|v| v.as_u64()),
            obj.get("finish").and_then(|v| v.as_str()).map(String::from),
        ));
    }
    assert_eq!(seen.len(), 6);
    let mut preempted = 0;
    for (id, events) in &seen {
        let o = &outcomes[&id.parse::<u64>().unwrap()];
        let verifies: Vec<(u8, u8)> = events
            .iter()
            .filter(|e| e.0 == "verify")
            .map(|e| (e.1.unwrap() as u8, e.2.unwrap() as u8))
            .collect();
        assert_eq!(verifies, o.steps);
        preempted += events.iter().filter(|e| e.0 == "preempted").count();
        assert_eq!(
            events.iter().filter(|e| e.3.is_some()).count(),
            1,
            "one finish per request"
        );
        assert!(
            events.last().unwrap().3.is_some(),
            "finish on the last event"
        );
        if id != &(2u64 + (1 << 40)).to_string() {
            assert_eq!(events[0].0, "prefill", "a request starts with its prefill");
        }
    }
    assert!(preempted > 0);
    let aborted = &seen[&(2u64 + (1 << 40)).to_string()];
    assert_eq!(aborted.last().unwrap().0, "abort");
    assert_eq!(aborted.last().unwrap().3.as_deref(), Some("abort"));
    std::fs::remove_dir_all(&dir).unwrap();
}

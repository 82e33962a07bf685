//! A real Prometheus server scrapes a running stack; through the PromQL HTTP API,
//! `increase(specula_spec_decode_num_accepted_tokens_total[...])` equals the sum of the
//! requests' `num_accepted_draft_tokens` over the same traffic.

mod common;

use std::time::Duration;

use common::prometheus::Prometheus;
use common::stack::{metric_sum, Stack, StackConfig};
use common::wait_until;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promql_increase_equals_sum_of_request_figures() {
    let stack = Stack::start(StackConfig::default()).await;
    let Some(prom) = Prometheus::start(stack.metrics_port) else {
        return;
    };
    let counter = "specula_spec_decode_num_accepted_tokens_total";

    // Prometheus must have scraped the counter at 0 before any traffic.
    wait_until(Duration::from_secs(60), "first scrape", || async {
        !prom.query(counter, None).await.is_empty()
    })
    .await;

    let prompts = [
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
        "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
        "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
        "Write a sentence about the sea.",
    ];
    let mut expected = 0u64;
    for prompt in prompts {
        let resp: Value = stack
            .client()
            .post(stack.api("/v1/completions"))
            .json(&json!({"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 24, "temperature": 0}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let m = &resp["choices"][0]["speculate_metrics"];
        expected += m["num_accepted_draft_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("{resp}"));
    }
    assert!(
        expected > 0,
        "n-gram drafts on repetitive prompts should be accepted sometimes"
    );

    // The token-processor's own counter is final once the last response arrived.
    let direct = metric_sum(&stack.metrics_text().await, counter);
    assert_eq!(direct as u64, expected);

    // Evaluate increase() at exactly the timestamp of the sample holding the final value: no
    // extrapolation past the last sample, and none before the first (the counter starts at 0).
    let last_ts = prom
        .settled_at(counter, direct, Duration::from_secs(60))
        .await;
    let inc = prom
        .query(&format!("sum(increase({counter}[10m]))"), Some(last_ts))
        .await;
    let value: f64 = inc[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(
        (value - expected as f64).abs() < 1e-9,
        "PromQL increase() = {value}, requests' num_accepted_draft_tokens sum = {expected}"
    );
}

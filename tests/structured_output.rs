//! Structured output on the default model, driven by the official `openai` client
//! (`tests/py/structured_output.py`): 50 JSON schemas of varied shape, each output parsed and
//! validated against its schema with the `jsonschema` package, plus `json_object` and a schema
//! that cannot compile (a 400 naming `response_format`). The grammar masks every row a verify
//! step scores, drafts included, so greedy outputs are the same with speculation as with K = 0:
//! the two runs' texts are compared here.

mod common;

use common::python;
use common::stack::{metric_sum, Proc, Stack, StackConfig};

/// Runs the client against a fresh stack with `num_spec_tokens`; returns every output text.
async fn run(num_spec_tokens: u32) -> Vec<String> {
    let stack = Stack::start(StackConfig {
        num_spec_tokens,
        ..StackConfig::default()
    })
    .await;
    let dump = python::dump_path(&format!("structured-k{num_spec_tokens}"));
    let args = vec![
        "--base-url".to_owned(),
        stack.api("/v1"),
        "--dump".to_owned(),
        dump.display().to_string(),
    ];
    let out = python::run("structured_output.py", args).await;
    eprintln!("K={num_spec_tokens}: {}", out.stdout);
    assert!(
        out.success && out.stdout.contains("all 50 schemas validated"),
        "structured output checks failed (K={num_spec_tokens}):\n{}\n{}\napi-server log:\n{}",
        out.stdout,
        out.stderr,
        stack.log(Proc::ApiServer)
    );
    if num_spec_tokens > 0 {
        // The comparison with K = 0 means something only if this run drafted.
        let metrics = stack.metrics_text().await;
        let drafted = metric_sum(&metrics, "specula_spec_decode_num_draft_tokens_total");
        let accepted = metric_sum(&metrics, "specula_spec_decode_num_accepted_tokens_total");
        eprintln!("K={num_spec_tokens}: {drafted} draft tokens, {accepted} accepted");
        assert!(
            drafted > 0.0 && accepted > 0.0,
            "the K={num_spec_tokens} run drafted nothing"
        );
    }
    python::take_dump(&dump)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_schemas_validate_and_speculation_changes_no_output() {
    let spec = run(4).await;
    let plain = run(0).await;
    assert_eq!(spec.len(), 51);
    for (i, (a, b)) in spec.iter().zip(&plain).enumerate() {
        assert_eq!(a, b, "output {i} differs between K=4 and K=0");
    }
}

//! Structured output on the default model, driven by the official `openai` client
//! (`tests/py/structured_output.py`): 50 JSON schemas of varied shape, each output parsed and
//! validated against its schema with the `jsonschema` package, plus `json_object` and a schema
//! that cannot compile (a 400 naming `response_format`). The grammar masks every row a verify
//! step scores, drafts included, so greedy outputs are the same with speculation as with K = 0:
//! the two runs' texts are compared here.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::stack::{Proc, Stack, StackConfig};

fn python() -> PathBuf {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        py.exists(),
        "{} missing: run scripts/setup-python.sh (scripts/test.sh does)",
        py.display()
    );
    py
}

/// Runs the client against a fresh stack with `num_spec_tokens`; returns every output text.
async fn run(num_spec_tokens: u32) -> Vec<String> {
    let stack = Stack::start(StackConfig {
        num_spec_tokens,
        ..StackConfig::default()
    })
    .await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/structured_output.py");
    let dump = std::env::temp_dir().join(format!(
        "specula-structured-{}-k{num_spec_tokens}.json",
        std::process::id()
    ));
    let (base, dump_arg) = (stack.api("/v1"), dump.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .args(["--base-url", &base, "--dump"])
            .arg(dump_arg)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("K={num_spec_tokens}: {stdout}");
    assert!(
        out.status.success() && stdout.contains("all 50 schemas validated"),
        "structured output checks failed (K={num_spec_tokens}):\n{stdout}\n{stderr}\napi-server log:\n{}",
        stack.log(Proc::ApiServer)
    );
    let texts = std::fs::read_to_string(&dump).unwrap();
    let _ = std::fs::remove_file(&dump);
    serde_json::from_str(&texts).unwrap()
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

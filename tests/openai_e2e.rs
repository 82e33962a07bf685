//! The three real binaries with the default model, driven by the official `openai` Python
//! client (`tests/py/openai_e2e.py`, run from the venv `scripts/setup-python.sh` makes):
//! completions, chat, streaming, n=2, stop strings, and `speculate_metrics` equal to the
//! token-processor's figures for the same request.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::stack::{Stack, StackConfig};

fn python() -> PathBuf {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        py.exists(),
        "{} missing: run scripts/setup-python.sh (scripts/test.sh does)",
        py.display()
    );
    py
}

/// One stack at a time: each runs the model on the machine's cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run_client(num_spec_tokens: u32) {
    let _serial = SERIAL.lock().await;
    let python = python();
    let stack = Stack::start(StackConfig {
        num_spec_tokens,
        ..StackConfig::default()
    })
    .await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/openai_e2e.py");
    let golden = common::shared_dir().join("golden/smollm2");
    let base = stack.api("/v1");
    let metrics = stack.metrics_url();
    let k = num_spec_tokens.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args([
                "--base-url",
                &base,
                "--metrics-url",
                &metrics,
                "--num-spec-tokens",
                &k,
            ])
            .arg("--golden-dir")
            .arg(golden)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openai client checks failed (K={num_spec_tokens}):\n{stdout}\n{stderr}\napi-server log:\n{}",
        stack.log(common::stack::Proc::ApiServer)
    );
    assert!(stdout.contains("all checks passed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_client_against_the_real_stack_with_speculation() {
    run_client(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_client_against_the_real_stack_without_speculation() {
    run_client(0).await;
}

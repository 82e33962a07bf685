//! The three real binaries with the default model, driven by the official `openai` Python
//! client (`tests/py/openai_e2e.py`, run from the venv `scripts/setup-python.sh` makes):
//! completions, chat, streaming, n=2, stop strings, `speculate_metrics` equal to the
//! token-processor's figures for the same request, and logprobs. The log-likelihood request an
//! evaluation harness sends (`echo`, `logprobs=1`, `max_tokens=1`) gives the same prompt
//! logprobs with K = 0 and with speculation, and they equal a full-vocabulary log-softmax of the
//! CPU backend's logits computed here.

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

/// What the client dumped of its log-likelihood request.
#[derive(Debug, PartialEq, serde::Deserialize)]
struct Dump {
    prompt: Vec<u32>,
    token_logprobs: Vec<Option<f64>>,
    top_logprobs: Vec<Option<std::collections::BTreeMap<String, f64>>>,
}

async fn run_client(num_spec_tokens: u32) -> Dump {
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
    let dump = std::env::temp_dir().join(format!(
        "specula-openai-e2e-{}-k{k}.json",
        std::process::id()
    ));
    let dump_arg = dump.clone();
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
            .arg("--dump-logprobs")
            .arg(dump_arg)
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
    let text = std::fs::read_to_string(&dump).unwrap();
    let _ = std::fs::remove_file(&dump);
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_client_against_the_real_stack_with_and_without_speculation() {
    let spec = run_client(4).await;
    let plain = run_client(0).await;
    assert_eq!(spec, plain, "prompt logprobs differ between K=4 and K=0");

    let mut backend = common::reference::backend();
    let rows = common::reference::prompt_rows(&mut backend, &plain.prompt);
    let mut worst: f64 = 0.0;
    for i in 1..plain.prompt.len() {
        let reported = plain.token_logprobs[i].expect("a prompt token after the first");
        worst = worst.max((reported - rows[i - 1][plain.prompt[i] as usize]).abs());
        // Its one alternative is the reference's most likely token.
        let row = &rows[i - 1];
        let best = (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap();
        let top = plain.top_logprobs[i].as_ref().unwrap();
        let alt = top
            .get(&format!("token_id:{best}"))
            .unwrap_or_else(|| panic!("prompt token {i}: {best} not in {top:?}"));
        worst = worst.max((alt - row[best]).abs());
    }
    eprintln!(
        "{} prompt logprobs; max |difference| from the reference: {worst:.2e}",
        plain.prompt.len() - 1
    );
    assert!(
        worst < 1e-4,
        "prompt logprobs differ from the reference by {worst}"
    );
}

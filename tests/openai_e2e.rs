//! The three real binaries with the default model, driven by the official `openai` Python
//! client (`tests/py/openai_e2e.py`, run from the venv `scripts/setup-python.sh` makes):
//! completions, chat, streaming, n=2, stop strings, `speculate_metrics` equal to the
//! token-processor's figures for the same request, and logprobs. The log-likelihood request an
//! evaluation harness sends (`echo`, `logprobs=1`, `max_tokens=1`) gives the same prompt
//! logprobs with K = 0 and with speculation, and they equal a full-vocabulary log-softmax of the
//! CPU backend's logits computed here.

mod common;

use common::python;
use common::stack::{Stack, StackConfig};

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
    let stack = Stack::start(StackConfig {
        num_spec_tokens,
        ..StackConfig::default()
    })
    .await;
    let golden = common::shared_dir().join("golden/smollm2");
    let dump = python::dump_path(&format!("openai-e2e-k{num_spec_tokens}"));
    let args = vec![
        "--base-url".to_owned(),
        stack.api("/v1"),
        "--metrics-url".to_owned(),
        stack.metrics_url(),
        "--num-spec-tokens".to_owned(),
        num_spec_tokens.to_string(),
        "--golden-dir".to_owned(),
        golden.display().to_string(),
        "--dump-logprobs".to_owned(),
        dump.display().to_string(),
    ];
    let out = python::run("openai_e2e.py", args).await;
    assert!(
        out.success && out.stdout.contains("all checks passed"),
        "openai client checks failed (K={num_spec_tokens}):\n{}\n{}\napi-server log:\n{}",
        out.stdout,
        out.stderr,
        stack.log(common::stack::Proc::ApiServer)
    );
    python::take_dump(&dump)
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

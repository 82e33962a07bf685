//! Helpers shared by the cross-process tests: locate the workspace's binaries, pick free
//! loopback ports, wait on conditions (never on fixed sleeps).

#![allow(dead_code)]

pub mod openai;
pub mod prometheus;
pub mod python;
pub mod reference;
pub mod stack;
pub mod timing;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Path of a workspace binary built next to this test executable (`target/<profile>/<name>`),
/// built from the current sources first: a test run alone (`cargo test --test faults`) never
/// starts a stale binary.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_binaries);
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// `cargo build --workspace --bins --tests` in this test's profile: a no-op after
/// `scripts/test.sh`'s build or `cargo test --workspace`. With `--bins` alone the dependencies
/// resolve other features (no dev-dependencies), and this rebuilt much of the workspace inside
/// the first test that started a stack (4 to 5 minutes on the 2-core machine).
fn build_binaries() {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let mut cmd = std::process::Command::new(env!("CARGO"));
    cmd.args(["build", "--workspace", "--bins", "--tests", "--quiet"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo build");
    assert!(
        status.success(),
        "cargo build --workspace --bins --tests failed"
    );
}

/// A loopback TCP port that was free a moment ago.
/// Resident set size of a process in KiB (0 once it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `cond` until it holds or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// `n` greedy-friendly prompts of four kinds (counting, repetition, a question, a story), the
/// same in every cross-process test.
pub fn prompts(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 4 {
            0 => format!("Count from {i}: {i}, {}, {},", i + 1, i + 2),
            1 => format!(
                "Item {i}: the red box. Item {}: the red box. Item {}:",
                i + 1,
                i + 2
            ),
            2 => format!("Question {i}: what is the capital of France? Answer:"),
            _ => format!("Write a short story about robot number {i}."),
        })
        .collect()
}

/// The shared golden/spec folder beside the checkout.
pub fn shared_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

/// The default model, fetched by scripts/fetch-model.sh.
pub fn default_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// `speculate_metrics` without `predicted_accepted_tokens`: the policy's prediction comes from
/// the worker-wide acceptance table, which every earlier request of the worker taught, so it
/// differs between a run and its reference by design; every counted figure must not.
pub fn without_prediction(metrics: &serde_json::Value) -> serde_json::Value {
    let mut metrics = metrics.clone();
    if let Some(fields) = metrics.as_object_mut() {
        fields.remove("predicted_accepted_tokens");
    }
    metrics
}

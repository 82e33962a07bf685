//! The README's curl examples run as written (ports swapped for the test stack's) against the
//! real binaries and get real answers.

mod common;

use std::process::Command;

use common::stack::{Stack, StackConfig};

/// Every `curl` command in the README's shell blocks, continuation lines joined.
fn readme_curls() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut commands = Vec::new();
    let mut in_shell = false;
    let mut pending = String::new();
    for line in readme.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_shell = !in_shell && matches!(trimmed, "```sh" | "```bash" | "```shell");
            continue;
        }
        if !in_shell {
            continue;
        }
        if pending.is_empty() && !trimmed.starts_with("curl ") {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                pending.push_str(part);
                pending.push(' ');
            }
            None => {
                pending.push_str(trimmed);
                commands.push(std::mem::take(&mut pending));
            }
        }
    }
    commands
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_curl_examples_run() {
    let curls = readme_curls();
    assert!(
        curls.iter().any(|c| c.contains("/v1/")),
        "README shows no API curl example"
    );
    let stack = Stack::start(StackConfig::default()).await;
    for cmd in curls {
        let cmd = cmd
            .replace("127.0.0.1:8000", &format!("127.0.0.1:{}", stack.api_port))
            .replace("localhost:8000", &format!("127.0.0.1:{}", stack.api_port))
            .replace(
                "127.0.0.1:9400",
                &format!("127.0.0.1:{}", stack.metrics_port),
            )
            .replace(
                "localhost:9400",
                &format!("127.0.0.1:{}", stack.metrics_port),
            );
        let run = cmd.clone();
        let out = tokio::task::spawn_blocking(move || {
            Command::new("bash")
                .args(["-c", &format!("set -o pipefail; {run}")])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "`{cmd}` failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!stdout.trim().is_empty(), "`{cmd}` printed nothing");
        if cmd.contains("/v1/") && !cmd.contains("\"stream\": true") {
            let v: serde_json::Value = serde_json::from_str(&stdout)
                .unwrap_or_else(|e| panic!("`{cmd}` did not print JSON ({e}): {stdout}"));
            assert!(
                v.get("error").is_none(),
                "`{cmd}` answered an error: {stdout}"
            );
            assert!(
                v["choices"].as_array().is_some_and(|c| !c.is_empty()) || v["data"].is_array(),
                "{stdout}"
            );
        }
    }
}

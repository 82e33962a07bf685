//! `token-processor replay FILE` prints exactly each golden case's `expected` (as numbers).

mod common;

use std::process::Command;

use serde_json::Value;

#[test]
fn replay_prints_the_expected_json_for_every_golden_case() {
    for path in common::golden_files() {
        let out = Command::new(env!("CARGO_BIN_EXE_token-processor"))
            .arg("replay")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
        let case: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        common::assert_close(&case["expected"], &got, &path.display().to_string());
    }
}

#[test]
fn replay_of_a_bad_trace_fails_with_a_message() {
    let dir = std::env::temp_dir().join(format!("tp-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.jsonl");
    std::fs::write(&file, "{\"num_spec_tokens\": 2}\n{\"type\": \"verify\", \"request\": \"a\", \"drafted\": 1, \"accepted\": 2}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_token-processor"))
        .arg("replay")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("accepted <= drafted"));
    let missing = Command::new(env!("CARGO_BIN_EXE_token-processor"))
        .args(["replay", "/nonexistent/trace.json"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

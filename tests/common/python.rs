//! The Python clients under `tests/py`, run from the venv `scripts/setup-python.sh` makes (the
//! official `openai` client, `jsonschema`).

use std::path::PathBuf;
use std::process::Command;

fn python() -> PathBuf {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        py.exists(),
        "{} missing: run scripts/setup-python.sh (scripts/test.sh does)",
        py.display()
    );
    py
}

/// What a script printed, and whether it exited 0.
pub struct ScriptOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `tests/py/<script>` with `args`, off the async runtime's threads.
pub async fn run(script: &str, args: Vec<String>) -> ScriptOutput {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(script);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    ScriptOutput {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A file for a script to write what it saw, unique to this test process and `tag`.
pub fn dump_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("specula-{tag}-{}.json", std::process::id()))
}

/// Reads and removes what a script wrote at `path`.
pub fn take_dump<T: serde::de::DeserializeOwned>(path: &PathBuf) -> T {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let _ = std::fs::remove_file(path);
    serde_json::from_str(&text).unwrap()
}

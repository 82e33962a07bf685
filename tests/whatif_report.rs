//! `token-processor replay --what-if` on a trace a real worker recorded: re-scoring at the
//! recorded K and policy reproduces the recorded verdicts, and the HTML report renders in
//! headless Chromium (Debian's `chromium`) with every plot drawn and no script error.

mod common;

use std::path::Path;
use std::process::Command;

use common::openai::{complete, completion_body};
use common::stack::{Stack, StackConfig};
use serde_json::Value;

const K: u32 = 4;

const PROMPTS: [&str; 4] = [
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "Write a sentence about the sea.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_if_rescores_a_recorded_trace_and_its_report_renders() {
    let dir = std::env::temp_dir().join(format!("specula-whatif-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.jsonl");
    let stack = Stack::start(StackConfig {
        num_spec_tokens: K,
        spec_policy: "fixed",
        worker_args: vec!["--trace-acceptance".into(), trace.display().to_string()],
        ..StackConfig::default()
    })
    .await;
    let (mut accepted, mut drafted) = (0, 0);
    for prompt in PROMPTS {
        let (status, body) = complete(
            stack.client(),
            &stack.api("/v1/completions"),
            &completion_body(prompt, 48, false),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let figures = &body["choices"][0]["speculate_metrics"];
        accepted += figures["num_accepted_draft_tokens"].as_u64().unwrap();
        drafted += figures["num_draft_tokens"].as_u64().unwrap();
    }
    assert!(accepted > 0, "repetitive prompts should accept some drafts");
    drop(stack);
    // The trace is what the responses reported: every verify step of every request, whole.
    let text = std::fs::read_to_string(&trace).unwrap();
    let events: Vec<Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sum = |field: &str| -> u64 { events.iter().filter_map(|e| e[field].as_u64()).sum() };
    assert_eq!((sum("accepted"), sum("drafted")), (accepted, drafted));

    let out = dir.join("report");
    let run = Command::new(common::binary("token-processor"))
        .args(["replay", "--what-if"])
        .arg(&trace)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    check_rescoring(&report);
    render_in_chromium(&out.join("report.html"));
    std::fs::remove_dir_all(&dir).ok();
}

/// The fixed policy at the recorded K re-scores to exactly the recorded steps and verdicts, and
/// every K' and both policies are reported.
fn check_rescoring(report: &Value) {
    let recorded = &report["recorded"];
    assert_eq!(recorded["num_spec_tokens"], K);
    assert_eq!(recorded["accepted_per_step"], {
        let same = find(report, "fixed", K);
        same["accepted_per_step"].clone()
    });
    let same = find(report, "fixed", K);
    assert_eq!(same["steps"], recorded["steps"]);
    assert_eq!(
        same["accepted_length_histogram"],
        recorded["accepted_length_histogram"]
    );
    assert_eq!(
        report["what_if"].as_array().unwrap().len(),
        2 * (K as usize + 1)
    );
    // K' = 0 emits one token a step: as many steps as verified tokens.
    let none = find(report, "fixed", 0);
    assert_eq!(none["tokens_per_step"], 1.0);
    assert_eq!(none["accepted_per_step"], 0.0);
    let times: Vec<f64> = report["what_if"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["predicted_tokens_per_s"].as_f64().unwrap())
        .collect();
    assert!(times.iter().all(|t| t.is_finite() && *t > 0.0), "{times:?}");
}

fn find<'a>(report: &'a Value, policy: &str, k: u32) -> &'a Value {
    report["what_if"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == policy && p["num_spec_tokens"] == k)
        .unwrap_or_else(|| panic!("no {policy} K'={k} in {report}"))
}

/// Loads the page in headless Chromium: its script counts the plots that have marks; the DOM
/// after it ran must say 3, and the console must show no error. Skipped without Chromium
/// outside the README's test command (SPECULA_REQUIRE_TOOLS makes it a failure).
fn render_in_chromium(page: &Path) {
    let run = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
        ])
        .arg(format!("file://{}", page.display()))
        .output();
    let run = match run {
        Ok(run) => run,
        Err(e) => {
            assert!(
                std::env::var_os("SPECULA_REQUIRE_TOOLS").is_none(),
                "chromium not installed ({e}; scripts/install-test-deps.sh installs it)"
            );
            eprintln!("chromium not installed; skipping the render check");
            return;
        }
    };
    let dom = String::from_utf8_lossy(&run.stdout);
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "chromium failed: {log}");
    assert!(
        dom.contains("data-plots=\"3\""),
        "not every plot was drawn:\n{dom}\n{log}"
    );
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") && (l.contains("Uncaught") || l.contains("Error")))
        .collect();
    assert!(errors.is_empty(), "script errors: {errors:#?}");
}

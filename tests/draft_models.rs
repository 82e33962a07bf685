//! A good draft model and a bad one, told apart within 20 requests by every figure an operator
//! has: per request (`accept_ratio_per_head`), in `/metrics` (the `proposer` label), in
//! `/health`, and by the alert `SpeculaDraftHeadOneAcceptanceLow`, replayed with promtool on the
//! counters each run produced. Both drafts are made here from the default model by
//! `scripts/make-draft.py` (a Q4_0 copy of all 30 layers: good; the layers mirrored: bad), and
//! the real binaries serve them. Greedy texts are the same with either draft.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::openai::{complete, completion_body};
use common::stack::{Stack, StackConfig};
use common::{default_model, prompts};

const REQUESTS: usize = 20;
const MAX_TOKENS: u32 = 24;
const K: u32 = 4;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python that `scripts/setup-python.sh` prepared (with `gguf`), or None where it is missing
/// outside the README's test command (which makes it and sets SPECULA_REQUIRE_TOOLS=1, so that a
/// missing one fails instead).
fn draft_python() -> Option<PathBuf> {
    let python = repo().join(".venv/bin/python");
    let ok = python.exists()
        && Command::new(&python)
            .args(["-c", "import gguf, numpy"])
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("SPECULA_REQUIRE_TOOLS").is_none(),
            "{} cannot import gguf: run scripts/setup-python.sh",
            python.display()
        );
        eprintln!("no .venv with gguf; skipping (run scripts/setup-python.sh)");
        return None;
    }
    Some(python)
}

fn make_draft(python: &Path, out: &Path, args: &[&str]) {
    let status = Command::new(python)
        .arg(repo().join("scripts/make-draft.py"))
        .arg(default_model())
        .arg(out)
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "make-draft.py {args:?} failed");
}

/// What one draft's run showed.
struct Run {
    texts: Vec<String>,
    /// Head-1 acceptance of each request.
    head_one: Vec<f64>,
    /// Verification steps of each request that drafted.
    num_drafts: Vec<u64>,
    metrics: String,
    health: String,
}

async fn serve(draft: &Path) -> Run {
    let stack = Stack::start(StackConfig {
        num_spec_tokens: K,
        // Every step drafts K, so the figures describe the draft, not the policy's choices.
        spec_policy: "fixed",
        worker_args: vec!["--draft-model".into(), draft.display().to_string()],
        ..StackConfig::default()
    })
    .await;
    let url = stack.api("/v1/completions");
    let mut run = Run {
        texts: vec![],
        head_one: vec![],
        num_drafts: vec![],
        metrics: String::new(),
        health: String::new(),
    };
    for prompt in prompts(REQUESTS) {
        let (status, body) = complete(
            stack.client(),
            &url,
            &completion_body(&prompt, MAX_TOKENS, false),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        run.texts.push(choice["text"].as_str().unwrap().to_owned());
        let per_head = choice["speculate_metrics"]["accept_ratio_per_head"]
            .as_array()
            .unwrap_or_else(|| panic!("no accept_ratio_per_head: {choice}"));
        assert_eq!(per_head.len(), K as usize, "{choice}");
        run.head_one.push(per_head[0].as_f64().unwrap());
        run.num_drafts
            .push(choice["speculate_metrics"]["num_drafts"].as_u64().unwrap());
    }
    // The token-processor has every batch once the last response came back through it.
    run.metrics = stack.metrics_text().await;
    run.health = stack.tp_health_text().await;
    run
}

/// The value of the series `name` whose labels include every one of `labels`.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (head, value) = rest.rsplit_once(' ')?;
        (head.starts_with('{') && labels.iter().all(|l| head.contains(l)))
            .then(|| value.parse().ok())
            .flatten()
    })
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The alert rule replayed on one run's figures: promtool gets the run's counters as a worker
/// that keeps drafting at that acceptance for 15 minutes, and says whether the alert fires.
fn alert_fires(run: &Run, proposer: &str, dir: &Path) -> Option<bool> {
    let pos0 = format!(
        "{}",
        sample(
            &run.metrics,
            "specula_spec_decode_num_accepted_tokens_per_pos_total",
            &["position=\"0\"", proposer]
        )
        .expect("position 0 series")
    );
    let drafts = format!(
        "{}",
        sample(
            &run.metrics,
            "specula_spec_decode_num_drafts_total",
            &[proposer]
        )
        .expect("num_drafts series")
    );
    let labels = format!("model=\"m\", worker=\"w\", proposer=\"{proposer}\"");
    let test = format!(
        r#"rule_files:
  - {rules}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'specula_spec_decode_num_accepted_tokens_per_pos_total{{{labels}, position="0"}}'
        values: '0+{pos0}x15'
      - series: 'specula_spec_decode_num_drafts_total{{{labels}}}'
        values: '0+{drafts}x15'
    alert_rule_test:
      - eval_time: 15m
        alertname: SpeculaDraftHeadOneAcceptanceLow
        exp_alerts: []
"#,
        rules = repo().join("scripts/prometheus/alerts.yml").display(),
    );
    let file = dir.join(format!("{}.yml", proposer.replace(':', "_")));
    std::fs::write(&file, test).unwrap();
    let out = match Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            assert!(
                std::env::var_os("SPECULA_REQUIRE_TOOLS").is_none(),
                "promtool not installed ({e}; scripts/install-test-deps.sh installs it)"
            );
            return None;
        }
    };
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    // The test expects no alert: it passes when the alert stays quiet and fails (naming the
    // alert it got) when it fires.
    match out.status.success() {
        true => Some(false),
        false => {
            assert!(
                text.contains("SpeculaDraftHeadOneAcceptanceLow") && text.contains("got:"),
                "promtool failed for another reason:\n{text}"
            );
            Some(true)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_and_a_bad_draft_model_are_told_apart_within_20_requests() {
    let Some(python) = draft_python() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("specula-drafts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good-draft.gguf");
    let bad = dir.join("bad-draft.gguf");
    make_draft(&python, &good, &["--quant", "q4_0"]);
    make_draft(&python, &bad, &["--bad"]);

    let good_run = tokio::time::timeout(Duration::from_secs(600), serve(&good))
        .await
        .expect("good draft run");
    let bad_run = tokio::time::timeout(Duration::from_secs(600), serve(&bad))
        .await
        .expect("bad draft run");

    // Lossless: the draft changes how fast, never what.
    assert_eq!(good_run.texts, bad_run.texts);

    // Per request.
    let (good_med, bad_med) = (median(&good_run.head_one), median(&bad_run.head_one));
    assert!(
        good_med >= 0.4 && bad_med <= 0.15,
        "head-1 acceptance per request: good median {good_med} ({:?}), bad median {bad_med} ({:?})",
        good_run.head_one,
        bad_run.head_one
    );
    // Request by request (the same prompt and text under both drafts), where both drafted.
    let both: Vec<usize> = (0..REQUESTS)
        .filter(|&i| good_run.num_drafts[i] > 0 && bad_run.num_drafts[i] > 0)
        .collect();
    assert!(
        both.len() >= REQUESTS / 2,
        "drafted: good {:?}, bad {:?}",
        good_run.num_drafts,
        bad_run.num_drafts
    );
    for &i in &both {
        assert!(
            good_run.head_one[i] >= bad_run.head_one[i],
            "request {i}: good {} < bad {}",
            good_run.head_one[i],
            bad_run.head_one[i]
        );
    }

    // In /metrics and /health, under each draft's name.
    for (run, name) in [(&good_run, "good-draft"), (&bad_run, "bad-draft")] {
        let proposer = format!("proposer=\"draft:{name}\"");
        let drafts = sample(
            &run.metrics,
            "specula_spec_decode_num_drafts_total",
            &[&proposer],
        )
        .unwrap_or_else(|| panic!("no {proposer} series:\n{}", run.metrics));
        assert!(drafts >= REQUESTS as f64, "{drafts} drafts");
        assert!(
            run.health.contains(&format!("proposer=draft:{name} ")),
            "{}",
            run.health
        );
        let kv: u64 = run
            .health
            .split("draft_kv_bytes=")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no draft_kv_bytes in {}", run.health));
        assert!(kv > 0, "{}", run.health);
    }
    let head_one = |run: &Run, name: &str| {
        let proposer = format!("proposer=\"draft:{name}\"");
        sample(
            &run.metrics,
            "specula_spec_decode_num_accepted_tokens_per_pos_total",
            &["position=\"0\"", &proposer],
        )
        .unwrap()
            / sample(
                &run.metrics,
                "specula_spec_decode_num_drafts_total",
                &[&proposer],
            )
            .unwrap()
    };
    let (good_m, bad_m) = (
        head_one(&good_run, "good-draft"),
        head_one(&bad_run, "bad-draft"),
    );
    assert!(
        good_m >= 0.4 && bad_m <= 0.15,
        "/metrics head 1: good {good_m}, bad {bad_m}"
    );

    // The alert, on each run's own counters.
    if let Some(good_fires) = alert_fires(&good_run, "draft:good-draft", &dir) {
        let bad_fires = alert_fires(&bad_run, "draft:bad-draft", &dir).unwrap();
        assert!(
            bad_fires && !good_fires,
            "alert: bad fires {bad_fires}, good fires {good_fires}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

//! The shipped alerting rules: `promtool check rules` on `scripts/prometheus/alerts.yml`,
//! `promtool check config` on the scrape config that loads them, and `promtool test rules` on
//! `scripts/prometheus/alerts_test.yml` (a bad draft model fires, a good one, and one with too
//! little traffic to judge, stay quiet).

use std::path::PathBuf;
use std::process::Command;

fn prometheus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/prometheus")
}

/// Runs `promtool args...` in `scripts/prometheus` and fails the test unless it succeeds. None
/// when promtool is missing: skipped outside the README's test command (which runs
/// `scripts/install-test-deps.sh` and sets SPECULA_REQUIRE_TOOLS=1, so a missing promtool fails
/// the test instead).
fn promtool(args: &[&str]) -> Option<String> {
    let out = match Command::new("promtool")
        .args(args)
        .current_dir(prometheus_dir())
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            assert!(
                std::env::var_os("SPECULA_REQUIRE_TOOLS").is_none(),
                "promtool not installed ({e}; scripts/install-test-deps.sh installs it)"
            );
            eprintln!(
                "promtool not installed; skipping `promtool {}` (run scripts/install-test-deps.sh)",
                args.join(" ")
            );
            return None;
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    Some(text)
}

#[test]
fn the_alerting_rules_are_valid_and_loaded_by_the_scrape_config() {
    let Some(rules) = promtool(&["check", "rules", "alerts.yml"]) else {
        return;
    };
    assert!(rules.contains("SUCCESS: 1 rules found"), "{rules}");
    let config = promtool(&["check", "config", "prometheus.yml"]).unwrap();
    assert!(config.contains("1 rule files found"), "{config}");
}

#[test]
fn a_bad_draft_model_fires_and_a_good_or_idle_one_stays_quiet() {
    let Some(out) = promtool(&["test", "rules", "alerts_test.yml"]) else {
        return;
    };
    assert!(out.contains("SUCCESS"), "{out}");
}

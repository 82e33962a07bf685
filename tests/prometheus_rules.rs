//! The shipped alerting rules: `promtool check rules` on `scripts/prometheus/alerts.yml`,
//! `promtool check config` on the scrape config that loads them, and `promtool test rules` on
//! `scripts/prometheus/alerts_test.yml` (a bad draft model fires, a good one, and one with too
//! little traffic to judge, stay quiet); and that every alert has a case that fires and one
//! that stays quiet.

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
    let alerts = std::fs::read_to_string(prometheus_dir().join("alerts.yml")).unwrap();
    let declared = alerts
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    assert!(
        rules.contains(&format!("SUCCESS: {declared} rules found")),
        "{rules}"
    );
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

/// Every alert of `alerts.yml` has, in `alerts_test.yml`, a case where it fires and one where it
/// stays quiet: an alert added without them fails here, before anyone is paged by it (or never
/// is). Read line by line (`- alert: NAME`; `alertname: NAME` then its `exp_alerts:`), the
/// layout both files keep; no YAML parser needed.
#[test]
fn every_alert_has_a_firing_and_a_quiet_rule_test() {
    let read = |name: &str| std::fs::read_to_string(prometheus_dir().join(name)).unwrap();
    let rules = read("alerts.yml");
    let tests = read("alerts_test.yml");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(str::trim)
        .collect();
    assert!(!alerts.is_empty(), "no alert in alerts.yml");
    let cases = rule_test_cases(&tests);
    for alert in alerts {
        let fires = cases.iter().any(|(a, fires)| *a == alert && *fires);
        let quiet = cases.iter().any(|(a, fires)| *a == alert && !*fires);
        assert!(fires, "alerts_test.yml has no case where {alert} fires");
        assert!(
            quiet,
            "alerts_test.yml has no case where {alert} stays quiet"
        );
    }
}

/// `(alertname, fires)` for each `alert_rule_test` case: fires unless `exp_alerts: []`.
fn rule_test_cases(tests: &str) -> Vec<(&str, bool)> {
    let mut cases = Vec::new();
    let mut alert = None;
    for line in tests.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("alertname:") {
            alert = Some(name.trim());
        } else if let Some(expected) = line.strip_prefix("exp_alerts:") {
            let name = alert
                .take()
                .expect("exp_alerts without an alertname before it");
            cases.push((name, expected.trim() != "[]"));
        }
    }
    cases
}

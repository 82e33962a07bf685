//! The Grafana dashboard (`scripts/prometheus/grafana-dashboard.json`) proven against a real
//! Prometheus scraping a running stack: every target of every panel, its template variables
//! filled in as Grafana would with "All" selected, is evaluated through Prometheus' HTTP API and
//! must return series with exactly the values the test's own requests imply (their
//! `speculate_metrics` and `usage`). A panel the expectation table does not cover fails the test,
//! so a new panel cannot ship untested; and a copy of the dashboard with one metric name
//! misspelt fails on that panel, so the check does notice a panel that shows nothing.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::openai::{complete, completion_body};
use common::prometheus::{scripts_dir, unix_now, Prometheus, SCRAPE_INTERVAL};
use common::stack::{metric_sum, Stack, StackConfig};
use common::timing::{self, PATIENCE};
use common::wait_until;
use serde_json::Value;

/// The worker's `--num-spec-tokens`, and the token-processor's `--max-spec-tokens`, so that the
/// per-step histograms have exactly the buckets `le="0".."K"`.
const K: usize = 4;
/// The worker's KV cache, in blocks: what the three block states must add up to.
const KV_BLOCKS: u32 = 256;
/// What `$__rate_interval` and `$__range` stand for: a window holding every sample Prometheus
/// took, from before the first request (the counters at 0) on. The test checks that it does.
const WINDOW: &str = "10m";
const WINDOW_S: f64 = 600.0;
/// Largest relative difference between a panel's value and the expected one where both are
/// exact: the counters are integers, and every ratio of two `rate()`s over the same window
/// divides the same extrapolation factor out (numerator and denominator come from the same
/// scrapes), so only float rounding differs; any miscount is off by far more.
const EXACT: f64 = 1e-9;
const STEPS: &str = "specula_spec_decode_num_steps_total";

/// The panel the broken copy of the dashboard spoils, and how.
const BROKEN_PANEL: &str = "Acceptance per position by proposer (accepted_i / drafting steps)";
const BROKEN_FROM: &str = "specula_spec_decode_num_drafts_total";
const BROKEN_TO: &str = "specula_spec_decode_num_drafts_typo_total";

/// Greedy prompts that repeat themselves, so the suffix proposer's drafts are accepted at every
/// position; the first is sent twice, so the second finds its whole blocks in the prefix cache.
/// The classes the stack is configured with, and each prompt's (`poetry` is not configured, so
/// it counts as `other`).
const CLASSES: &str = "code,chat";
const PROMPT_CLASSES: [&str; 6] = ["chat", "chat", "code", "chat", "code", "poetry"];

const PROMPTS: [&str; 6] = [
    "Count slowly: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, \
     thirteen, fourteen, fifteen, sixteen, seventeen, eighteen, nineteen.",
    "Count slowly: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, \
     thirteen, fourteen, fifteen, sixteen, seventeen, eighteen, nineteen.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "Item 1: the red box. Item 2: the red box. Item 3: the red box. Item 4:",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_shows_what_the_requests_imply() {
    let began = Instant::now();
    let stack = Stack::start(stack_config()).await;
    let Some(prom) = Prometheus::start(stack.metrics_port) else {
        return;
    };
    let prom_began = unix_now();
    // Every series exists at 0 from the worker's hello (token-processor/src/metrics.rs: also
    // each position's counter and each histogram bucket), so one scrape before any traffic
    // gives every series a first sample of 0 and rate() extrapolates nothing before it.
    wait_until(PATIENCE, "Prometheus' first scrape", || async {
        !prom.query(STEPS, None).await.is_empty()
    })
    .await;

    let traffic = send_traffic(&stack).await;
    traffic.assert_reaches_every_panel();
    let (settled, kv_cached) = settle(&stack, &traffic).await;
    let at = prom.scrape_after(STEPS, settled, PATIENCE).await;
    assert!(
        at - prom_began < WINDOW_S - 2.0 * SCRAPE_INTERVAL.as_secs_f64(),
        "the {WINDOW} window no longer holds Prometheus' first samples"
    );
    let eval = Evaluation {
        prom: &prom,
        at,
        window: WINDOW,
        identity: identity(&stack).await,
    };
    let policy = policy_readings(&stack.metrics_text().await);
    let expected = expectations(&traffic, kv_cached, &policy);

    let dashboard = shipped_dashboard();
    let failures = check_dashboard(&dashboard, &eval, &expected).await;
    assert!(
        failures.is_empty(),
        "the shipped dashboard:\n{}",
        failures.join("\n")
    );

    let broken = with_metric_renamed(&dashboard, BROKEN_PANEL, BROKEN_FROM, BROKEN_TO);
    let failures = check_dashboard(&broken, &eval, &expected).await;
    eprintln!(
        "a dashboard with {BROKEN_TO} in one panel fails:\n{}",
        failures.join("\n")
    );
    assert!(!failures.is_empty(), "the misspelt metric went unnoticed");
    assert!(
        failures.iter().all(|f| f.contains(BROKEN_PANEL)),
        "failures beyond the broken panel: {failures:#?}"
    );
    eprintln!("dashboard test took {:.1?}", began.elapsed());
}

/// K drafts at most and drafting independent of load (`fixed`), a cache of known size, and
/// per-step histogram buckets `0..=K`.
fn stack_config() -> StackConfig {
    StackConfig {
        num_spec_tokens: K as u32,
        spec_policy: "fixed",
        worker_args: vec!["--num-kv-blocks".into(), KV_BLOCKS.to_string()],
        tp_args: vec![
            "--max-spec-tokens".into(),
            K.to_string(),
            "--request-classes".into(),
            CLASSES.into(),
        ],
        api_args: vec!["--request-classes".into(), CLASSES.into()],
        ..StackConfig::default()
    }
}

fn shipped_dashboard() -> Value {
    let path = scripts_dir().join("grafana-dashboard.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The test's requests' figures, summed over them: what every counter must have grown by.
#[derive(Debug, Default)]
struct Traffic {
    steps: u64,
    drafts: u64,
    draft_tokens: u64,
    /// Accepted draft tokens (the bonus token excluded).
    accepted: u64,
    /// Tokens produced by verification steps (`speculate_metrics.accepted_tokens`).
    emitted: u64,
    accepted_per_pos: [u64; K],
    accept_length_histogram: [u64; K + 1],
    draft_length_histogram: [u64; K + 1],
    prompt_tokens: u64,
    cached_prompt_tokens: u64,
    /// The policy's additions: offered tokens, predicted accepted tokens.
    offered: u64,
    predicted: f64,
    /// Per class: accepted and drafted tokens, and each request's draft acceptance rate.
    by_class: BTreeMap<String, ClassTraffic>,
}

#[derive(Debug, Default)]
struct ClassTraffic {
    accepted: u64,
    draft_tokens: u64,
    request_rates: Vec<f64>,
}

impl Traffic {
    /// Adds one completion's `speculate_metrics` and `usage`, sent as class `class`.
    fn add(&mut self, response: &Value, class: &str) {
        let m = &response["choices"][0]["speculate_metrics"];
        let n = |field: &str| {
            m[field]
                .as_u64()
                .unwrap_or_else(|| panic!("no {field}: {response}"))
        };
        self.steps += n("num_steps");
        self.drafts += n("num_drafts");
        self.draft_tokens += n("num_draft_tokens");
        self.accepted += n("num_accepted_draft_tokens");
        self.emitted += n("accepted_tokens");
        self.offered += n("num_offered_tokens");
        self.predicted += m["predicted_accepted_tokens"]
            .as_f64()
            .unwrap_or_else(|| panic!("no predicted_accepted_tokens: {response}"));
        let class = match CLASSES.split(',').any(|c| c == class) {
            true => class,
            false => "other",
        };
        let c = self.by_class.entry(class.to_owned()).or_default();
        c.accepted += n("num_accepted_draft_tokens");
        c.draft_tokens += n("num_draft_tokens");
        if n("num_draft_tokens") > 0 {
            c.request_rates
                .push(m["draft_acceptance_rate"].as_f64().unwrap());
        }
        // `[n, accepted_0, ..., accepted_{K-1}]`: the spec's FastDeploy per-head counts.
        add_counts(
            &mut self.accepted_per_pos,
            &m["accepted_tokens_per_head"],
            1,
        );
        add_counts(
            &mut self.accept_length_histogram,
            &m["accept_length_histogram"],
            0,
        );
        add_counts(
            &mut self.draft_length_histogram,
            &m["draft_length_histogram"],
            0,
        );
        let usage = &response["usage"];
        self.prompt_tokens += usage["prompt_tokens"].as_u64().unwrap();
        self.cached_prompt_tokens += usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no cached_tokens: {response}"));
    }

    /// Every ratio on the dashboard has a denominator above 0, and the prefix-cache panel has
    /// something to show: otherwise a panel could pass by showing nothing worth checking.
    fn assert_reaches_every_panel(&self) {
        assert!(self.drafts > 0 && self.steps > 0, "{self:?}");
        assert!(
            self.accepted_per_pos[0] > 0,
            "no first draft token accepted: {self:?}"
        );
        assert!(
            self.cached_prompt_tokens > 0,
            "the repeated prompt found nothing in the prefix cache: {self:?}"
        );
    }
}

/// Adds `counts[skip..]` (a JSON array of integers) into `into`, which it must fill exactly.
fn add_counts(into: &mut [u64], counts: &Value, skip: usize) {
    let counts = counts.as_array().unwrap();
    assert_eq!(counts.len() - skip, into.len(), "{counts:?}");
    for (sum, c) in into.iter_mut().zip(&counts[skip..]) {
        *sum += c.as_u64().unwrap();
    }
}

/// Sends [`PROMPTS`] one after another (greedy, 32 tokens) and sums their figures.
async fn send_traffic(stack: &Stack) -> Traffic {
    let mut traffic = Traffic::default();
    for (prompt, class) in PROMPTS.iter().zip(PROMPT_CLASSES) {
        let mut request = completion_body(prompt, 32, false);
        request["metadata"] = serde_json::json!({ "class": class });
        let (status, body) =
            complete(stack.client(), &stack.api("/v1/completions"), &request).await;
        assert_eq!(status, 200, "{body}");
        traffic.add(&body, class);
    }
    traffic
}

/// Waits until the token-processor itself shows the traffic's final figures and the worker's
/// heartbeat reports no block in use (every request finished), then returns the Unix time just
/// after, and the cached blocks it reported: with no traffic, what any later scrape holds.
///
/// The blocks come from heartbeats, the steps from step batches: a heartbeat taken just before
/// the last request was admitted also shows no block in use, with that request's prompt not yet
/// cached. So the reading must hold across more than two heartbeat intervals after the steps
/// matched: by then a heartbeat taken after the last request finished has arrived.
async fn settle(stack: &Stack, traffic: &Traffic) -> (f64, f64) {
    let heartbeats = 2 * timing::liveness().interval + Duration::from_millis(100);
    let deadline = Instant::now() + PATIENCE;
    let mut held: Option<(Instant, [f64; 3])> = None;
    loop {
        let text = stack.metrics_text().await;
        let blocks @ [used, cached, free] = ["used", "cached", "free"].map(|s| kv_blocks(&text, s));
        let final_figures = metric_sum(&text, STEPS) == traffic.steps as f64
            && used == 0.0
            && used + cached + free == f64::from(KV_BLOCKS);
        held = match held {
            Some((since, seen)) if final_figures && seen == blocks => Some((since, seen)),
            _ if final_figures => Some((Instant::now(), blocks)),
            _ => None,
        };
        if held.is_some_and(|(since, _)| since.elapsed() >= heartbeats) {
            return (unix_now(), cached);
        }
        assert!(
            Instant::now() < deadline,
            "the token-processor never showed the final figures and no block in use:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `specula_kv_cache_blocks{state="<state>"}` in an exposition text (the stack's one worker).
fn kv_blocks(text: &str, state: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("specula_kv_cache_blocks{"))
        .find(|l| l.contains(&format!("state=\"{state}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The stack's worker as its series label it (`model`, `worker`, `proposer`), from the
/// token-processor's `/health` line for it.
async fn identity(stack: &Stack) -> Vec<(String, String)> {
    let health = stack.tp_health_text().await;
    let line = health
        .lines()
        .find(|l| l.starts_with("worker="))
        .unwrap_or_else(|| panic!("no worker line in /health: {health}"));
    line.split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .filter(|(k, _)| ["model", "worker", "proposer"].contains(k))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// What each series of one panel target must show.
#[derive(Debug, Clone)]
struct Expected {
    /// Value by series key ([`series_key`]).
    series: BTreeMap<String, f64>,
    /// Largest relative difference accepted ([`EXACT`] unless a comment says why not).
    tolerance: f64,
}

/// The expectation table: by panel title, then target `refId`.
#[derive(Debug, Default)]
struct Expectations(BTreeMap<(String, String), Expected>);

impl Expectations {
    /// A target that shows one series (per worker: the stack has one).
    fn one(&mut self, panel: &str, ref_id: &str, value: f64) {
        self.each(panel, ref_id, [(String::from("{}"), value)]);
    }

    /// A target that shows one series per key.
    fn each(&mut self, panel: &str, ref_id: &str, series: impl IntoIterator<Item = (String, f64)>) {
        let expected = Expected {
            series: series.into_iter().collect(),
            tolerance: EXACT,
        };
        let old = self
            .0
            .insert((panel.to_owned(), ref_id.to_owned()), expected);
        assert!(old.is_none(), "{panel} {ref_id} expected twice");
    }

    fn get(&self, panel: &str, ref_id: &str) -> Option<&Expected> {
        self.0.get(&(panel.to_owned(), ref_id.to_owned()))
    }
}

/// What every panel must show after `t`'s traffic, with `kv_cached` blocks holding cached
/// prefixes. One entry per panel target: a new panel adds its own here.
fn expectations(t: &Traffic, kv_cached: f64, policy: &PolicyReadings) -> Expectations {
    let ratio = |a: u64, b: u64| a as f64 / b as f64;
    let acc = &t.accepted_per_pos;
    let mut e = Expectations::default();
    let accept_rate = ratio(t.accepted, t.draft_tokens);
    e.one(
        "Draft acceptance rate (accepted / drafted)",
        "A",
        accept_rate,
    );
    e.one(
        "Draft acceptance rate by proposer (accepted / drafted)",
        "A",
        accept_rate,
    );
    let tokens_per_step = ratio(t.emitted, t.steps);
    e.one(
        "Mean accepted length (tokens per target forward)",
        "A",
        tokens_per_step,
    );
    e.one(
        "Mean accepted length by proposer (tokens per target forward)",
        "A",
        tokens_per_step,
    );
    e.one("Tokens per step and steps/s", "A", tokens_per_step);
    // rate() at the last sample, first sample 0: the growth over the whole window's seconds.
    e.one(
        "Tokens per step and steps/s",
        "B",
        t.steps as f64 / WINDOW_S,
    );
    e.each(
        "Acceptance per position, unconditional (accepted_i / steps)",
        "A",
        positions(0..K, |i| ratio(acc[i], t.steps)),
    );
    let relative =
        "Acceptance per position, relative (pos 0 over drafting steps; accepted_i / accepted_0)";
    e.each(relative, "A", positions(0..1, |_| ratio(acc[0], t.drafts)));
    e.each(relative, "B", positions(1..K, |i| ratio(acc[i], acc[0])));
    e.each(
        "Acceptance per position by proposer (accepted_i / drafting steps)",
        "A",
        positions(0..K, |i| ratio(acc[i], t.drafts)),
    );
    let lengths = "Accepted and drafted lengths per step (cumulative step counts)";
    e.each(lengths, "A", buckets(&t.accept_length_histogram));
    e.each(lengths, "B", buckets(&t.draft_length_histogram));
    e.one(
        "Prefix cache hit rate (prompt tokens whose KV was cached / prompt tokens)",
        "A",
        ratio(t.cached_prompt_tokens, t.prompt_tokens),
    );
    // No block is in use once every request finished, and the three states add up to the
    // cache; how many blocks the prompts left cached is the worker's own account (its blocks
    // hold generated tokens too), read from the token-processor at the same time.
    e.each(
        "KV cache blocks by state (used, cached prefixes, free)",
        "A",
        [
            (series_key(&[("state", "used")]), 0.0),
            (series_key(&[("state", "cached")]), kv_cached),
            (
                series_key(&[("state", "free")]),
                f64::from(KV_BLOCKS) - kv_cached,
            ),
        ],
    );
    policy_expectations(&mut e, t, policy);
    e
}

/// What the worker reported that no response carries, read from the token-processor's own
/// `/metrics` once the traffic settled: the fitted cost curve, and the verify steps' tokens
/// against the K = 0 estimate.
#[derive(Debug)]
struct PolicyReadings {
    verify_cost: Vec<(String, f64)>,
    verify_tokens: f64,
    k0_tokens: f64,
}

fn policy_readings(text: &str) -> PolicyReadings {
    let verify_cost: Vec<(String, f64)> = text
        .lines()
        .filter(|l| l.starts_with("specula_spec_policy_verify_cost_seconds{"))
        .map(|l| {
            let tokens = l
                .split("tokens=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let value: f64 = l.rsplit(' ').next().unwrap().parse().unwrap();
            (tokens.to_owned(), value)
        })
        .collect();
    assert_eq!(verify_cost.len(), 7, "one gauge per reported size:\n{text}");
    let mut by_size: Vec<(u32, f64)> = verify_cost
        .iter()
        .map(|(t, v)| (t.parse().unwrap(), *v))
        .collect();
    by_size.sort_by_key(|p| p.0);
    assert!(
        by_size.windows(2).all(|w| w[0].1 > 0.0 && w[0].1 <= w[1].1),
        "the cost curve rises with the tokens: {by_size:?}"
    );
    PolicyReadings {
        verify_cost,
        verify_tokens: metric_sum(text, "specula_spec_policy_verify_tokens_total"),
        k0_tokens: metric_sum(text, "specula_spec_policy_k0_tokens_estimate_total"),
    }
}

/// The drafting policy's panels and the per-class ones.
fn policy_expectations(e: &mut Expectations, t: &Traffic, policy: &PolicyReadings) {
    e.one(
        "Drafting policy: verified share of offered draft tokens (verified / offered)",
        "A",
        t.draft_tokens as f64 / t.offered as f64,
    );
    e.one(
        "Drafting policy calibration (predicted / accepted draft tokens)",
        "A",
        t.predicted / t.accepted as f64,
    );
    e.each(
        "Verify cost the policy weighs (fitted seconds per verify forward, by tokens)",
        "A",
        policy
            .verify_cost
            .iter()
            .map(|(tokens, v)| (series_key(&[("tokens", tokens)]), *v)),
    );
    assert!(
        policy.verify_tokens > 0.0 && policy.k0_tokens > 0.0,
        "{policy:?}"
    );
    e.one(
        "Gain over K=0 in verify steps (tokens emitted / tokens K=0 would have emitted)",
        "A",
        policy.verify_tokens / policy.k0_tokens,
    );
    e.each(
        "Draft acceptance rate by request class (accepted / drafted)",
        "A",
        t.by_class.iter().map(|(class, c)| {
            (
                series_key(&[("class", class)]),
                c.accepted as f64 / c.draft_tokens as f64,
            )
        }),
    );
    // Every configured class has its series from the worker's hello; a class no request drafted
    // in shows 0 in every bucket.
    let bounds = [
        "0.05", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "0.95", "1", "+Inf",
    ];
    let mut buckets = Vec::new();
    for class in ["other", "code", "chat"] {
        let rates = t
            .by_class
            .get(class)
            .map_or(&[][..], |c| &c.request_rates[..]);
        for le in bounds {
            let bound: f64 = le.parse().unwrap_or(f64::INFINITY);
            let count = rates.iter().filter(|&&r| r <= bound).count();
            buckets.push((series_key(&[("class", class), ("le", le)]), count as f64));
        }
    }
    e.each(
        "Finished requests by their draft acceptance rate, by class (cumulative count)",
        "A",
        buckets,
    );
}

/// One series per draft position in `range`, valued `value(i)`.
fn positions(
    range: std::ops::Range<usize>,
    value: impl Fn(usize) -> f64,
) -> impl Iterator<Item = (String, f64)> {
    range.map(move |i| (series_key(&[("position", &i.to_string())]), value(i)))
}

/// A cumulative histogram's buckets `le="0".."K"` and `+Inf` from per-length counts.
fn buckets(counts: &[u64; K + 1]) -> Vec<(String, f64)> {
    let mut cumulative = 0;
    let mut out: Vec<(String, f64)> = counts
        .iter()
        .enumerate()
        .map(|(j, n)| {
            cumulative += n;
            (series_key(&[("le", &j.to_string())]), cumulative as f64)
        })
        .collect();
    out.push((series_key(&[("le", "+Inf")]), cumulative as f64));
    out
}

/// `{name="value",...}` sorted by name: what tells a target's series apart. The labels every
/// series of the stack's one worker shares (`model`, `worker`, `proposer`) are left out and
/// checked on their own ([`Evaluation::identity`]).
fn series_key(pairs: &[(&str, &str)]) -> String {
    let sorted: BTreeMap<&str, &str> = pairs.iter().copied().collect();
    let inner: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{{{}}}", inner.join(","))
}

/// Where and how a dashboard's queries are evaluated.
struct Evaluation<'a> {
    prom: &'a Prometheus,
    /// The instant (Unix seconds): a scrape's own timestamp, so nothing is extrapolated past it.
    at: f64,
    /// What `$__rate_interval` and `$__range` stand for.
    window: &'a str,
    /// The stack's `model`, `worker` and `proposer` labels: a series carrying one of them must
    /// carry the stack's value.
    identity: Vec<(String, String)>,
}

/// Evaluates every target of every panel of `dashboard` (rows' nested panels included) and
/// returns what is wrong, each line naming its panel: a query Prometheus refuses or that
/// returns no series, a panel target without an expectation, a series missing, unexpected or
/// off its expected value; and an expectation no panel target matches (a panel renamed or
/// removed).
async fn check_dashboard(
    dashboard: &Value,
    eval: &Evaluation<'_>,
    expectations: &Expectations,
) -> Vec<String> {
    let variables = template_variables(dashboard);
    let mut failures = Vec::new();
    let mut seen = BTreeSet::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("<untitled>");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let ref_id = target["refId"].as_str().unwrap_or("<no refId>");
            let what = format!("panel {title:?} target {ref_id}");
            if !seen.insert((title.to_owned(), ref_id.to_owned())) {
                failures.push(format!("{what}: two targets share the title and refId"));
            }
            let expr = target["expr"].as_str().unwrap_or_default();
            let expected = expectations.get(title, ref_id);
            failures.extend(check_target(eval, &what, expr, &variables, expected).await);
        }
    }
    for (title, ref_id) in expectations.0.keys() {
        if !seen.contains(&(title.clone(), ref_id.clone())) {
            failures.push(format!(
                "expected value for panel {title:?} target {ref_id}: no such panel target"
            ));
        }
    }
    failures
}

/// Every panel with targets, those inside rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in panels.as_array().into_iter().flatten() {
            if panel.get("targets").is_some() {
                out.push(panel);
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The names of the dashboard's template variables (`model`, `worker`, ...).
fn template_variables(dashboard: &Value) -> Vec<String> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(str::to_owned))
        .collect()
}

/// The query Grafana sends with "All" selected in every variable (regex `.*`, the variables
/// being matched with `=~`) and a time range covering all the traffic; Err names a variable
/// left over, which the test does not know how to fill in.
fn substitute(expr: &str, variables: &[String], window: &str) -> Result<String, String> {
    let mut out = expr
        .replace("$__rate_interval", window)
        .replace("${__rate_interval}", window)
        .replace("$__range", window)
        .replace("${__range}", window);
    // Longest names first, so that `$model` does not eat the start of `$model_family`.
    let mut names: Vec<&String> = variables.iter().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out
            .replace(&format!("${{{name}}}"), ".*")
            .replace(&format!("${name}"), ".*");
    }
    match out.find('$') {
        Some(at) => Err(format!("unknown variable at {:?}", &out[at..])),
        None => Ok(out),
    }
}

/// One panel target's failures (empty when it shows what `expected` says).
async fn check_target(
    eval: &Evaluation<'_>,
    what: &str,
    expr: &str,
    variables: &[String],
    expected: Option<&Expected>,
) -> Vec<String> {
    let query = match substitute(expr, variables, eval.window) {
        Ok(q) => q,
        Err(e) => return vec![format!("{what}: {e} in {expr}")],
    };
    let result = match eval.prom.try_query(&query, Some(eval.at)).await {
        Ok(r) => r,
        Err(e) => return vec![format!("{what}: {e}\n    query: {query}")],
    };
    if result.is_empty() {
        return vec![format!("{what} returned no series\n    query: {query}")];
    }
    let mut failures = Vec::new();
    let mut got = BTreeMap::new();
    for series in &result {
        let (key, wrong) = key_of(series, &eval.identity);
        failures.extend(
            wrong
                .into_iter()
                .map(|w| format!("{what}: series {key}: {w}")),
        );
        let value = series["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN);
        got.insert(key, value);
    }
    match expected {
        None => failures.push(format!("{what} has no expected value (got {got:?})")),
        Some(expected) => failures.extend(compare(what, &got, expected)),
    }
    failures
}

/// A result series' [`series_key`], and its identity labels that are not the stack's.
fn key_of(series: &Value, identity: &[(String, String)]) -> (String, Vec<String>) {
    let labels = series["metric"].as_object().cloned().unwrap_or_default();
    let mut pairs = Vec::new();
    let mut wrong = Vec::new();
    for (name, value) in &labels {
        let value = value.as_str().unwrap_or_default();
        match identity.iter().find(|(n, _)| n == name) {
            Some((_, own)) if own != value => {
                wrong.push(format!("{name}={value:?}, the stack's is {own:?}"))
            }
            Some(_) => {}
            None if name == "__name__" => {}
            None => pairs.push((name.as_str(), value)),
        }
    }
    (series_key(&pairs), wrong)
}

/// Each expected series present with its value (within the tolerance), and nothing else.
fn compare(what: &str, got: &BTreeMap<String, f64>, expected: &Expected) -> Vec<String> {
    let mut failures = Vec::new();
    for (key, &want) in &expected.series {
        match got.get(key) {
            None => failures.push(format!("{what}: no series {key} (expected {want})")),
            Some(&v) if !close(v, want, expected.tolerance) => {
                failures.push(format!("{what}: series {key} = {v}, expected {want}"))
            }
            Some(_) => {}
        }
    }
    for (key, v) in got {
        if !expected.series.contains_key(key) {
            failures.push(format!("{what}: unexpected series {key} = {v}"));
        }
    }
    failures
}

/// `a` and `b` within `tolerance` of each other, relative to the larger (absolute near 0).
fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * a.abs().max(b.abs()).max(1.0)
}

/// A copy of `dashboard` whose panel titled `title` names metric `to` where it named `from`.
fn with_metric_renamed(dashboard: &Value, title: &str, from: &str, to: &str) -> Value {
    fn walk(panels: &mut Value, title: &str, from: &str, to: &str) -> bool {
        let mut found = false;
        for panel in panels.as_array_mut().into_iter().flatten() {
            // `get_mut`, not `[]`, which would add the keys it does not find.
            if panel["title"] == title {
                let targets = panel.get_mut("targets").and_then(Value::as_array_mut);
                for target in targets.into_iter().flatten() {
                    if let Some(expr) = target.get_mut("expr") {
                        *expr = expr.as_str().unwrap_or_default().replace(from, to).into();
                    }
                }
                found = true;
            }
            if let Some(nested) = panel.get_mut("panels") {
                found |= walk(nested, title, from, to);
            }
        }
        found
    }
    let mut copy = dashboard.clone();
    assert!(
        walk(&mut copy["panels"], title, from, to),
        "no panel {title:?}"
    );
    assert_ne!(&copy, dashboard, "panel {title:?} does not name {from}");
    copy
}

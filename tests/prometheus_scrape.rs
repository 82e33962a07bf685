//! A real Prometheus server scrapes a running stack; through the PromQL HTTP API,
//! `increase(specula_spec_decode_num_accepted_tokens_total[...])` equals the sum of the
//! requests' `num_accepted_draft_tokens` over the same traffic.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::stack::{metric_sum, Stack, StackConfig};
use common::{free_port, wait_until};
use serde_json::{json, Value};

struct Prometheus {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Prometheus {
    fn start(target_port: u16) -> Prometheus {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("specula-prom-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        // The project's scrape config, pointed at this test's token-processor, scraped fast.
        let shipped = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("scripts/prometheus/prometheus.yml"),
        )
        .unwrap()
        .replace("127.0.0.1:9400", &format!("127.0.0.1:{target_port}"))
        .replace("scrape_interval: 5s", "scrape_interval: 1s");
        std::fs::write(&config, shipped).unwrap();
        // Its rule file, beside it where the config names it, so the server runs as shipped.
        std::fs::copy(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/prometheus/alerts.yml"),
            dir.join("alerts.yml"),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus not installed: run scripts/install-test-deps.sh");
        Prometheus { child, port, dir }
    }

    async fn query(&self, http: &reqwest::Client, q: &str, time: Option<f64>) -> Vec<Value> {
        let mut params = vec![("query", q.to_string())];
        if let Some(t) = time {
            params.push(("time", format!("{t:.3}")));
        }
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        // Until Prometheus listens there is simply no data yet; until its storage is ready it
        // answers 503 with a plain-text body (slow on a cold machine), which is no data either.
        let Ok(resp) = http.get(url).query(&params).send().await else {
            return vec![];
        };
        if resp.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return vec![];
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("Prometheus answered {status} with non-JSON ({e}): {text}"));
        assert_eq!(body["status"], "success", "{body}");
        body["data"]["result"].as_array().unwrap().clone()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promql_increase_equals_sum_of_request_figures() {
    let stack = Stack::start(StackConfig::default()).await;
    let prom = Prometheus::start(stack.metrics_port);
    // Straight to loopback, whatever proxy the environment names.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let counter = "specula_spec_decode_num_accepted_tokens_total";

    // Prometheus must have scraped the counter at 0 before any traffic.
    wait_until(Duration::from_secs(60), "first scrape", || async {
        !prom.query(&http, counter, None).await.is_empty()
    })
    .await;

    let prompts = [
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
        "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
        "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
        "Write a sentence about the sea.",
    ];
    let mut expected = 0u64;
    for prompt in prompts {
        let resp: Value = stack
            .client()
            .post(stack.api("/v1/completions"))
            .json(&json!({"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 24, "temperature": 0}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let m = &resp["choices"][0]["speculate_metrics"];
        expected += m["num_accepted_draft_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("{resp}"));
    }
    assert!(
        expected > 0,
        "n-gram drafts on repetitive prompts should be accepted sometimes"
    );

    // The token-processor's own counter is final once the last response arrived.
    let direct = metric_sum(&stack.metrics_text().await, counter);
    assert_eq!(direct as u64, expected);

    // Wait until Prometheus holds a sample with the final value, then evaluate increase() at
    // exactly that sample's timestamp: no extrapolation past the last sample, and none before
    // the first (the counter starts at 0).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let last_ts = loop {
        // Every raw sample of the last 10 minutes, per label set; the newest one per series.
        let raw = prom.query(&http, &format!("{counter}[10m]"), None).await;
        let newest: Vec<(f64, f64)> = raw
            .iter()
            .filter_map(|s| {
                let v = s["values"].as_array()?.last()?;
                Some((v[0].as_f64()?, v[1].as_str()?.parse::<f64>().ok()?))
            })
            .collect();
        let total: f64 = newest.iter().map(|(_, v)| v).sum();
        if total == direct {
            break newest.iter().map(|(t, _)| *t).fold(0.0, f64::max);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Prometheus never scraped the final value"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let inc = prom
        .query(
            &http,
            &format!("sum(increase({counter}[10m]))"),
            Some(last_ts),
        )
        .await;
    let value: f64 = inc[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(
        (value - expected as f64).abs() < 1e-9,
        "PromQL increase() = {value}, requests' num_accepted_draft_tokens sum = {expected}"
    );
}

//! Scale-out as a tested topology: 2 engine-workers, 2 api-servers and 1 token-processor over tcp
//! on loopback. Requests through both api-servers spread over both workers; every request's
//! figures are right; the counters per `worker` label add up; `kill -9` of one worker ends its
//! requests with explicit errors while the other keeps serving, and the restarted one rejoins
//! and serves. Every completed request's text is a K=0 run's (no drafting at all) of its prompt.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::openai::{completion_body, stream, Streamed};
use common::stack::{metric_sum, Stack, StackConfig};
use common::timing::{self, detection_bound, PATIENCE};
use common::{binary, default_model, free_port, wait_until};
use serde_json::Value;

struct Cluster {
    dir: std::path::PathBuf,
    tp_ingest: String,
    tp_api: String,
    metrics_port: u16,
    worker_endpoints: [String; 2],
    api_ports: [u16; 2],
    workers: [Option<Child>; 2],
    others: Vec<Child>,
    http: reqwest::Client,
}

const WORKER_IDS: [&str; 2] = ["w-a", "w-b"];
const API_IDS: [&str; 2] = ["api-a", "api-b"];

impl Cluster {
    async fn start() -> Cluster {
        let tcp = || format!("tcp://127.0.0.1:{}", free_port());
        let dir = std::env::temp_dir().join(format!("specula-scale-{}", free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Cluster {
            dir,
            tp_ingest: tcp(),
            tp_api: tcp(),
            metrics_port: free_port(),
            worker_endpoints: [tcp(), tcp()],
            api_ports: [free_port(), free_port()],
            workers: [None, None],
            others: Vec::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
        };
        let tp = c.spawn(
            "token-processor",
            "tp",
            &[
                "--ingest-endpoint",
                &c.tp_ingest.clone(),
                "--api-endpoint",
                &c.tp_api.clone(),
                "--metrics-port",
                &c.metrics_port.to_string(),
            ],
        );
        c.others.push(tp);
        for i in 0..2 {
            c.start_worker(i);
        }
        let workers = c.worker_endpoints.join(",");
        for (id, port) in API_IDS.iter().zip(c.api_ports) {
            let api = c.spawn(
                "api-server",
                id,
                &[
                    "--model",
                    &default_model().display().to_string(),
                    "--port",
                    &port.to_string(),
                    "--api-server-id",
                    id,
                    "--worker-endpoints",
                    &workers,
                    "--tp-endpoint",
                    &c.tp_api.clone(),
                ],
            );
            c.others.push(api);
        }
        c.wait_both_workers_serving().await;
        c
    }

    fn spawn(&self, binary_name: &str, log: &str, args: &[&str]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{log}.log")))
            .unwrap();
        Command::new(binary(binary_name))
            // The liveness rule the bounds below derive from (`timing`).
            .args(["--heartbeat-interval-ms", &timing::heartbeat_arg()])
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    fn start_worker(&mut self, i: usize) {
        let child = self.spawn(
            "engine-worker",
            WORKER_IDS[i],
            &[
                "--model",
                &default_model().display().to_string(),
                "--worker-id",
                WORKER_IDS[i],
                "--api-endpoint",
                &self.worker_endpoints[i].clone(),
                "--tp-endpoint",
                &self.tp_ingest.clone(),
                "--threads",
                "1",
                // The same prompt must give the same figures on either worker: drafts that
                // depend on neither the load nor other requests' outputs.
                "--spec-policy",
                "fixed",
                "--proposer",
                "ngram",
            ],
        );
        self.workers[i] = Some(child);
    }

    fn kill_worker(&mut self, i: usize) {
        let mut child = self.workers[i].take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn api(&self, i: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.api_ports[i])
    }

    async fn get(&self, url: &str) -> Option<Value> {
        let r = self.http.get(url).send().await.ok()?;
        r.json().await.ok()
    }

    async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        match self.http.get(url).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Both api-servers see both workers alive and the token-processor takes both.
    async fn wait_both_workers_serving(&self) {
        wait_until(
            Duration::from_secs(120),
            "both workers serving via both api-servers",
            || async {
                let mut ok = metric_sum(&self.metrics().await, "specula_workers_connected") == 2.0;
                for i in 0..2 {
                    let health = self
                        .get(&self.api(i, "/health"))
                        .await
                        .unwrap_or(Value::Null);
                    // Servable: alive, loaded and accepting, its batches taken by the TP.
                    ok &= health["status"] == "ok"
                        && health["workers"]
                            .as_array()
                            .is_some_and(|w| w.iter().filter(|w| servable(w)).count() == 2);
                }
                ok
            },
        )
        .await;
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for name in ["tp", "w-a", "w-b", "api-a", "api-b"] {
                let log = self.log(name);
                let tail: Vec<&str> = log.lines().rev().take(25).collect();
                eprintln!("--- last lines of {name} ---");
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        for child in self
            .workers
            .iter_mut()
            .flatten()
            .chain(self.others.iter_mut())
        {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn servable(worker: &Value) -> bool {
    [
        "alive",
        "ready",
        "accepting",
        "token_processor_takes_its_batches",
    ]
    .iter()
    .all(|k| worker[*k] == true)
}

/// Per-worker sums of a counter, by `worker` label.
fn per_worker(text: &str, name: &str) -> [f64; 2] {
    WORKER_IDS.map(|w| {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(&format!("worker=\"{w}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    })
}

/// Streams one greedy completion per prompt through api-server `api`, all at once.
async fn streams(
    c: &Cluster,
    api: usize,
    prompts: &[String],
    max_tokens: u32,
    ignore_eos: bool,
) -> Vec<tokio::task::JoinHandle<Streamed>> {
    prompts
        .iter()
        .map(|p| {
            let mut body = completion_body(p, max_tokens, true);
            body["ignore_eos"] = ignore_eos.into();
            let (http, url) = (c.http.clone(), c.api(api, "/v1/completions"));
            tokio::spawn(async move { stream(&http, &url, &body, |_| true).await })
        })
        .collect()
}

/// The greedy texts of a one-worker stack with K=0 (no drafting at all) for `prompts`, `max_tokens`
/// each (past EOS with `ignore_eos`): what the cluster must answer, whichever worker serves.
async fn k0_texts(
    stack: &Stack,
    prompts: &[String],
    max_tokens: u32,
    ignore_eos: bool,
) -> Vec<String> {
    stack
        .reference_choices_with(prompts, max_tokens, ignore_eos)
        .await
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_two_api_servers_one_token_processor() {
    let prompts: Vec<String> = (0..4)
        .map(|i| {
            format!(
                "Item {i}: the red box. Item {}: the red box. Item {}:",
                i + 1,
                i + 2
            )
        })
        .collect();
    let long: Vec<String> = (0..4)
        .map(|i| format!("Write a long story about robot {i}."))
        .collect();
    // The reference, computed before the cluster starts (one stack at a time on 2 cores).
    let (want_24, want_200, want_8, want_16) = {
        let k0 = Stack::start(StackConfig {
            num_spec_tokens: 0,
            ..StackConfig::default()
        })
        .await;
        (
            k0_texts(&k0, &prompts, 24, false).await,
            k0_texts(&k0, &long, 200, true).await,
            k0_texts(&k0, &prompts[..1], 8, false).await,
            k0_texts(&k0, &prompts, 16, false).await,
        )
    };
    let mut c = Cluster::start().await;

    // The same prompts through both api-servers at once: 8 requests over both workers.
    let mut tasks = streams(&c, 0, &prompts, 24, false).await;
    tasks.extend(streams(&c, 1, &prompts, 24, false).await);
    let mut results = Vec::new();
    for t in tasks {
        let s = tokio::time::timeout(2 * PATIENCE, t)
            .await
            .unwrap()
            .unwrap();
        assert!(s.done && s.error.is_none(), "{s:?}");
        results.push(s);
    }
    // Greedy and batch-invariant: the same prompt gives K=0's text and the same figures,
    // whichever api-server and worker served it.
    for (i, s) in results.iter().enumerate() {
        assert_eq!(s.text, want_24[i % 4], "request {i}: text differs from K=0");
    }
    for i in 0..4 {
        // The policy's prediction depends on what the serving worker learned before.
        assert_eq!(
            results[i]
                .speculate_metrics
                .as_ref()
                .map(common::without_prediction),
            results[i + 4]
                .speculate_metrics
                .as_ref()
                .map(common::without_prediction),
            "prompt {i}"
        );
    }
    let text = c.metrics().await;
    let steps = per_worker(&text, "specula_spec_decode_num_steps_total");
    assert!(
        steps[0] > 0.0 && steps[1] > 0.0,
        "requests spread over both workers: {steps:?}\n{}\n{:?}\n{:?}",
        text.lines()
            .filter(|l| l.contains("num_steps") || l.contains("connected"))
            .collect::<Vec<_>>()
            .join("\n"),
        c.get(&c.api(0, "/health")).await,
        c.get(&c.api(1, "/health")).await,
    );
    // Each worker's counters are the sum over its requests; together, the sum over all.
    for (field, counter) in [
        ("num_steps", "specula_spec_decode_num_steps_total"),
        (
            "num_draft_tokens",
            "specula_spec_decode_num_draft_tokens_total",
        ),
        (
            "num_accepted_draft_tokens",
            "specula_spec_decode_num_accepted_tokens_total",
        ),
    ] {
        let total: f64 = results
            .iter()
            .map(|s| {
                s.speculate_metrics.as_ref().unwrap()[field]
                    .as_f64()
                    .unwrap()
            })
            .sum();
        let [a, b] = per_worker(&text, counter);
        assert_eq!(a + b, total, "{counter}: {a} + {b}");
    }

    // kill -9 of w-a while both serve long streams: w-a's requests end with explicit errors,
    // w-b's complete, and new requests go to w-b.
    let tasks = streams(&c, 0, &long, 200, true).await;
    wait_until(PATIENCE, "steps on both workers", || async {
        let now = per_worker(&c.metrics().await, "specula_spec_decode_num_steps_total");
        now[0] > steps[0] && now[1] > steps[1]
    })
    .await;
    let lost_before_kill = per_worker(&c.metrics().await, "specula_workers_lost_total");
    c.kill_worker(0);
    let killed = Instant::now();
    // When each stream ended, measured as it ends (not in the order they are awaited).
    let ended = futures::future::join_all(tasks.into_iter().map(|t| async move {
        let s = t.await.unwrap();
        (s, killed.elapsed())
    }));
    let ended = tokio::time::timeout(2 * PATIENCE, ended)
        .await
        .expect("streams hung after the kill");
    let (mut complete, mut errors, mut slowest_error) = (0, 0, Duration::ZERO);
    for (i, (s, after)) in ended.into_iter().enumerate() {
        assert!(s.done, "every stream ends with [DONE]: {s:?}");
        match &s.error {
            None => {
                assert_eq!(
                    s.text, want_200[i],
                    "w-b's stream {i}: text differs from K=0"
                );
                complete += 1
            }
            Some(e) => {
                assert!(
                    e.get("transport").is_none(),
                    "server error, not a broken client: {e}"
                );
                errors += 1;
                slowest_error = slowest_error.max(after);
            }
        }
    }
    eprintln!(
        "w-a kill -9: {complete} streams complete, {errors} explicit errors (the last \
         {slowest_error:?} after the kill)"
    );
    assert!(
        errors >= 1,
        "the killed worker's requests ended with errors"
    );
    assert!(complete >= 1, "the other worker's requests completed");
    assert!(
        slowest_error < detection_bound(),
        "the killed worker's requests ended {slowest_error:?} after the kill (bound {:?})",
        detection_bound()
    );
    for api in 0..2 {
        let tasks = streams(&c, api, &prompts[..1], 8, false).await;
        for t in tasks {
            let s = t.await.unwrap();
            assert!(
                s.done && s.error.is_none(),
                "served by w-b through api {api}: {s:?}"
            );
            assert_eq!(
                s.text, want_8[0],
                "served by w-b through api {api}: text differs from K=0"
            );
        }
    }

    // The restarted w-a rejoins and takes requests again. Its steps are told from the killed
    // one's by when they are counted: only after the token-processor ended the killed epoch
    // (nothing of it is counted after that) and took the new one's hello.
    wait_until(
        detection_bound(),
        "the token-processor to end the killed w-a's epoch",
        || async {
            per_worker(&c.metrics().await, "specula_workers_lost_total")[0] > lost_before_kill[0]
        },
    )
    .await;
    c.start_worker(0);
    c.wait_both_workers_serving().await;
    let steps_of_the_killed = per_worker(&c.metrics().await, "specula_spec_decode_num_steps_total");
    let mut tasks = streams(&c, 0, &prompts, 16, false).await;
    tasks.extend(streams(&c, 1, &prompts, 16, false).await);
    for (i, t) in tasks.into_iter().enumerate() {
        let s = t.await.unwrap();
        assert!(s.done && s.error.is_none(), "{s:?}");
        assert_eq!(
            s.text,
            want_16[i % 4],
            "request {i} after the restart: text differs from K=0"
        );
    }
    let after = per_worker(&c.metrics().await, "specula_spec_decode_num_steps_total");
    eprintln!(
        "restarted w-a: {} steps of the 8 requests after it rejoined; every text K=0's",
        after[0] - steps_of_the_killed[0]
    );
    assert!(
        after[0] > steps_of_the_killed[0],
        "the restarted w-a served none of the requests: its steps {steps_of_the_killed:?} -> {after:?}"
    );
}

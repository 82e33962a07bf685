//! The cluster heals itself: after any process is paused, the stack serves again within 3 s of it
//! running again, without restarting anything; health says why it cannot serve; the context
//! length is the worker's. On the three real binaries with the default model.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::openai::{complete, completion_body};
use common::stack::{Proc, Stack, StackConfig};
use common::timing::{
    detection_bound, exit_after_drain, exit_after_kill, pause_past_the_window, PATIENCE, RECOVERY,
};
use common::{binary, default_model};
use serde_json::{json, Value};

/// One stack at a time: the tests measure timings on a 2-core machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sends small greedy completions until one succeeds; returns how long it took, or the last
/// answer when none succeeded within `bound`.
async fn first_success_within(stack: &Stack, bound: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last = String::from("no attempt");
    while start.elapsed() < bound {
        let left = bound.saturating_sub(start.elapsed());
        let attempt = stack
            .client()
            .post(stack.api("/v1/completions"))
            .timeout(left)
            .json(&completion_body("1, 2, 3,", 4, false))
            .send()
            .await;
        match attempt {
            Ok(r) if r.status().as_u16() == 200 => return Ok(start.elapsed()),
            Ok(r) => last = format!("{} {}", r.status(), r.text().await.unwrap_or_default()),
            Err(e) => last = format!("transport: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_3s_pause_of_each_process_then_a_request_succeeds_within_3s() {
    let _g = SERIAL.lock().await;
    let stack = Stack::start(StackConfig::default()).await;
    let started: Vec<Option<u64>> = Proc::ALL.iter().map(|p| stack.start_time(*p)).collect();
    for p in [Proc::ApiServer, Proc::TokenProcessor, Proc::EngineWorker] {
        stack.signal(p, "STOP");
        // The fault itself: a pause that every peer takes for a death.
        tokio::time::sleep(pause_past_the_window()).await;
        stack.signal(p, "CONT");
        match first_success_within(&stack, RECOVERY).await {
            Ok(took) => eprintln!(
                "{p:?} paused {:?}: serving again {took:?} after SIGCONT",
                pause_past_the_window()
            ),
            Err(last) => panic!(
                "{p:?} paused: no request succeeded within {RECOVERY:?} of SIGCONT; last answer: {last}"
            ),
        }
    }
    // Nothing was restarted: the three processes started at the top are alive (a crash leaves
    // a zombie, which `kill -0` still reaches; its state in /proc says it is dead), are the
    // same processes (a pid given to another process has another start time), and serve.
    for (p, started) in Proc::ALL.iter().zip(&started) {
        assert!(
            stack.is_running(*p),
            "{p:?} exited during the pauses:\n{}",
            stack.log(*p)
        );
        assert!(started.is_some(), "{p:?}: no start time in /proc");
        assert_eq!(
            stack.start_time(*p),
            *started,
            "{p:?} is not the process started at the top"
        );
    }
    // Each serves: the api-server's and the token-processor's own health endpoints, and the
    // worker (which has none) through the api-server's view of it and a request.
    assert_eq!(stack.status(&stack.api("/health")).await, Some(200));
    assert!(stack.tp_health_text().await.starts_with("ok:"));
    let health: Value = stack
        .client()
        .get(stack.api("/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let worker = &health["workers"][0];
    for key in [
        "alive",
        "ready",
        "accepting",
        "token_processor_takes_its_batches",
    ] {
        assert_eq!(worker[key], true, "worker {key}: {health}");
    }
    let (status, body) = complete(
        stack.client(),
        &stack.api("/v1/completions"),
        &completion_body("1, 2, 3,", 4, false),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// 2,000 idle connections to the token-processor's HTTP port (a scraper gone wrong, or a
/// flood): `/metrics` still answers at once, and a worker paused past the liveness window
/// reconnects and serves, because HTTP connections are capped below the descriptors the
/// ZeroMQ links need and idle ones are cut at the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_on_the_metrics_port_starve_nothing() {
    let _g = SERIAL.lock().await;
    let stack = Stack::start(StackConfig::default()).await;
    const IDLE: usize = 2000;
    let addr = format!("127.0.0.1:{}", stack.metrics_port);
    let idle: Vec<std::net::TcpStream> = (0..IDLE)
        .map(|_| std::net::TcpStream::connect(&addr).expect("connect"))
        .collect();
    let sent = Instant::now();
    let metrics = stack
        .client()
        .get(stack.metrics_url())
        .send()
        .await
        .unwrap();
    let answered_in = sent.elapsed();
    assert_eq!(metrics.status(), 200);
    assert!(metrics.text().await.unwrap().contains("specula_"));
    // The product's target is 1 s (measured on release builds: docs/faults.md); a debug
    // build on a loaded machine gets the slack.
    assert!(
        answered_in <= Duration::from_secs(1) + common::timing::LOADED_MACHINE_SLACK,
        "/metrics took {answered_in:?} with {IDLE} idle connections"
    );
    stack.signal(Proc::EngineWorker, "STOP");
    tokio::time::sleep(pause_past_the_window()).await;
    stack.signal(Proc::EngineWorker, "CONT");
    let took = first_success_within(&stack, RECOVERY)
        .await
        .unwrap_or_else(|last| panic!("no request served after the pause: {last}"));
    eprintln!(
        "{IDLE} idle connections on the metrics port: /metrics in {answered_in:?}; a worker \
         paused {:?} served again {took:?} after SIGCONT",
        pause_past_the_window()
    );
    assert!(
        !stack.log(Proc::TokenProcessor).contains("accept failed"),
        "the token-processor ran out of descriptors"
    );
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_without_max_tokens_uses_the_workers_context_length() {
    let _g = SERIAL.lock().await;
    let stack = Stack::start(StackConfig::default()).await;
    let (status, models) = get_json(&stack, "/v1/models").await;
    assert_eq!(status, 200, "{models}");
    // The worker's --max-model-len default (2048), not the GGUF's 8192.
    assert_eq!(models["data"][0]["max_model_len"], 2048, "{models}");

    let body = json!({
        "messages": [{"role": "user", "content": "Say hello."}],
        "temperature": 0,
    });
    let (status, answer) =
        complete(stack.client(), &stack.api("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "a chat request without max_tokens: {answer}");
    assert!(answer["choices"][0]["message"]["content"].is_string());
    // The longest prompt the worker takes, plus one token, is refused by the api-server itself
    // with the worker's figure in the message.
    let long = "hello ".repeat(2100);
    let (status, refused) = complete(
        stack.client(),
        &stack.api("/v1/completions"),
        &completion_body(&long, 1, false),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2048"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_worker_with_k_above_the_limit_refuses_to_start_and_says_why() {
    let out = tokio::time::timeout(
        PATIENCE,
        tokio::process::Command::new(binary("engine-worker"))
            .args(["--model", &default_model().display().to_string()])
            .args(["--num-spec-tokens", "65"])
            .args(["--api-endpoint", "tcp://127.0.0.1:0"])
            .env_remove("NOTIFY_SOCKET")
            // A worker that does start (the bug this guards against) ends with the test.
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the worker exits at once")
    .unwrap();
    assert!(!out.status.success(), "K=65 must not start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--num-spec-tokens 65") && stderr.contains("64"),
        "names the option and the limit: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_names_what_keeps_a_request_from_completing() {
    let _g = SERIAL.lock().await;
    let mut stack = Stack::start(StackConfig::default()).await;
    let (status, health) = get_json(&stack, "/health").await;
    assert_eq!(status, 200, "{health}");

    // The worker gone: not healthy, and the reason names the worker.
    stack.signal(Proc::EngineWorker, "KILL");
    stack.wait_exit(Proc::EngineWorker, exit_after_kill()).await;
    let reason = wait_unhealthy(&stack).await;
    assert!(reason.contains("engine-worker"), "{reason}");
    stack.spawn(Proc::EngineWorker);
    stack.wait_healthy(PATIENCE).await;

    // The token-processor gone: not healthy, and the reason names it.
    stack.signal(Proc::TokenProcessor, "KILL");
    stack
        .wait_exit(Proc::TokenProcessor, exit_after_kill())
        .await;
    let reason = wait_unhealthy(&stack).await;
    assert!(reason.contains("token-processor"), "{reason}");
    stack.spawn(Proc::TokenProcessor);
    stack.wait_healthy(PATIENCE).await;
    assert!(first_success_within(&stack, RECOVERY).await.is_ok());
}

async fn get_json(stack: &Stack, path: &str) -> (u16, Value) {
    let r = stack.client().get(stack.api(path)).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Waits (bounded by the detection of a death) for the api-server's /health to turn 503;
/// returns its reason.
async fn wait_unhealthy(stack: &Stack) -> String {
    let deadline = Instant::now() + detection_bound();
    loop {
        let (status, body) = get_json(stack, "/health").await;
        if status == 503 {
            return body.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "/health stayed {status} after a peer died: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A process started beside the stack, killed when dropped.
struct Extra(std::process::Child);

impl Drop for Extra {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn extra(stack: &Stack, name: &str, args: &[&str]) -> Extra {
    let log = std::fs::File::create(stack.dir.join(format!("{name}.log"))).unwrap();
    Extra(
        Command::new(binary(name))
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_process_with_a_live_ones_id_is_refused_and_the_first_keeps_serving() {
    let _g = SERIAL.lock().await;
    let stack = Stack::start(StackConfig {
        worker_args: vec![
            "--worker-id".into(),
            "w-same".into(),
            "--threads".into(),
            "1".into(),
        ],
        api_args: vec!["--api-server-id".into(), "api-same".into()],
        ..StackConfig::default()
    })
    .await;
    let model = default_model().display().to_string();

    // A second worker with the first one's id, pushing to the same token-processor.
    let worker_api = stack.endpoint("worker-dup");
    let tp_ingest = stack.endpoint("tp-ingest");
    let _worker = extra(
        &stack,
        "engine-worker",
        &[
            "--model",
            &model,
            "--worker-id",
            "w-same",
            "--threads",
            "1",
            "--api-endpoint",
            &worker_api,
            "--tp-endpoint",
            &tp_ingest,
        ],
    );
    // A second api-server with the first one's id, on the same worker and token-processor.
    let port = common::free_port().to_string();
    let _api = extra(
        &stack,
        "api-server",
        &[
            "--model",
            &model,
            "--api-server-id",
            "api-same",
            "--port",
            &port,
            "--worker-endpoints",
            &stack.endpoint("worker-0"),
            "--tp-endpoint",
            &stack.endpoint("tp-api"),
        ],
    );
    let second_health = format!("http://127.0.0.1:{port}/health");
    let deadline = Instant::now() + PATIENCE;
    let refused_api = loop {
        let metrics = stack.metrics_text().await;
        let counted =
            common::stack::metric_sum(&metrics, "specula_hellos_refused_duplicate_id_total");
        let health = match stack.client().get(&second_health).send().await {
            Ok(r) => Some((r.status().as_u16(), r.text().await.unwrap_or_default())),
            Err(_) => None,
        };
        if counted >= 2.0 {
            if let Some((503, body)) = health.clone().filter(|(_, b)| b.contains("refused")) {
                break body;
            }
        }
        assert!(
            Instant::now() < deadline,
            "duplicates not refused: counter {counted}, second api-server health {health:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        refused_api.contains("api-same"),
        "names the id: {refused_api}"
    );
    let tp_log = stack.log(Proc::TokenProcessor);
    assert!(
        tp_log.contains("another live worker holds this id"),
        "the token-processor names the refused worker"
    );
    // The first of each keeps serving.
    assert!(first_success_within(&stack, PATIENCE).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_workers_drain_deadline_ends_a_stream_with_an_explicit_error() {
    let _g = SERIAL.lock().await;
    let drain = Duration::from_secs(1);
    let mut stack = Stack::start(StackConfig {
        worker_args: vec!["--drain-timeout-secs".into(), drain.as_secs().to_string()],
        ..StackConfig::default()
    })
    .await;
    let mut body = completion_body("Write a very long story about a lighthouse.", 1500, true);
    body["ignore_eos"] = true.into();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (http, url) = (stack.client().clone(), stack.api("/v1/completions"));
    let task = tokio::spawn(async move {
        let mut started = Some(started_tx);
        common::openai::stream(&http, &url, &body, |_| {
            if let Some(tx) = started.take() {
                let _ = tx.send(());
            }
            true
        })
        .await
    });
    started_rx.await.expect("the stream started");
    stack.signal(Proc::EngineWorker, "TERM");
    let s = tokio::time::timeout(exit_after_drain(drain), task)
        .await
        .expect("the stream ends soon after the drain deadline")
        .unwrap();
    assert_eq!(s.http_status, 200);
    assert!(s.done, "the stream is closed with [DONE]: {s:?}");
    let error = s
        .error
        .as_ref()
        .expect("an error event, not a short answer");
    assert!(
        error.get("transport").is_none(),
        "a server error event: {error}"
    );
    assert_eq!(error["code"], "engine_unavailable", "{error}");
    assert_ne!(s.finish_reason.as_deref(), Some("abort"), "{s:?}");
    assert_eq!(
        stack
            .wait_exit(Proc::EngineWorker, exit_after_drain(drain))
            .await,
        Some(0)
    );
}

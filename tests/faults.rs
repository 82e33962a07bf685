//! Defined outcomes under faults, on the three real binaries with the default model. Each test
//! prints what it measured (time to detect, time to recover, requests lost) for the notes.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::openai::{complete, completion_body, stream, Streamed};
use common::stack::{metric_sum, Proc, Stack, StackConfig};
use common::timing::{
    detection_bound, exit_after_drain, exit_after_kill, outage_bound, PATIENCE, TP_OUTAGE_WINDOW,
};
use common::{prompts, wait_until};

/// One stack at a time: the tests measure timings on a 2-core machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// In-flight streaming completions and how many of them have received their first chunk.
struct Streams {
    tasks: Vec<tokio::task::JoinHandle<Streamed>>,
    started: Arc<AtomicUsize>,
}

impl Streams {
    /// Starts one streaming greedy completion per prompt (`ignore_eos` keeps long ones going).
    fn spawn(stack: &Stack, prompts: &[String], max_tokens: u32, ignore_eos: bool) -> Streams {
        let bodies = prompts.iter().map(|p| {
            let mut body = completion_body(p, max_tokens, true);
            body["ignore_eos"] = ignore_eos.into();
            body
        });
        Streams::spawn_bodies(stack, bodies)
    }

    /// Starts one streaming completion per request body.
    fn spawn_bodies(stack: &Stack, bodies: impl Iterator<Item = serde_json::Value>) -> Streams {
        let started = Arc::new(AtomicUsize::new(0));
        // Streams outlive a 30 s outage: no total timeout (each test bounds its waits).
        let http = reqwest::Client::new();
        let tasks = bodies
            .map(|body| {
                let (http, url, started) =
                    (http.clone(), stack.api("/v1/completions"), started.clone());
                tokio::spawn(async move {
                    let mut first = true;
                    stream(&http, &url, &body, |_| {
                        if std::mem::take(&mut first) {
                            started.fetch_add(1, Ordering::SeqCst);
                        }
                        true
                    })
                    .await
                })
            })
            .collect();
        Streams { tasks, started }
    }

    async fn wait_started(&self, at_least: usize) {
        wait_until(PATIENCE, "streams under way", || async {
            self.started.load(Ordering::SeqCst) >= at_least
        })
        .await;
    }
}

/// The server ended the request with an OpenAI error (a status with the error envelope, or an
/// error event on the stream). A transport failure of the test client is not one: it fails the
/// test.
fn is_explicit_error(s: &Streamed) -> bool {
    if let Some(e) = &s.error {
        assert!(
            e.get("transport").is_none(),
            "the test client's connection failed, not the server's answer: {s:?}"
        );
    }
    let envelope = s.error.as_ref().is_some_and(|e| {
        // A non-200 answer carries the whole envelope, a stream event its `error` object.
        e["message"].is_string() || e["error"]["message"].is_string()
    });
    envelope || s.finish_reason.as_deref() == Some("error")
}

/// Every stream of `streams` completes with the text and `speculate_metrics` of `want` (an
/// undisturbed run), within `bound`.
async fn assert_all_exact(
    streams: Streams,
    want: &[serde_json::Value],
    bound: Duration,
    what: &str,
) {
    for (i, t) in streams.tasks.into_iter().enumerate() {
        let s = tokio::time::timeout(bound, t)
            .await
            .unwrap_or_else(|_| panic!("{what}: stream {i} hung"))
            .unwrap();
        assert!(
            s.error.is_none() && s.done,
            "{what}: stream {i} did not complete: {s:?}"
        );
        assert_eq!(
            s.text,
            want[i]["text"].as_str().unwrap(),
            "{what}: stream {i} text differs"
        );
        assert_eq!(
            s.speculate_metrics.as_ref().map(common::without_prediction),
            Some(common::without_prediction(&want[i]["speculate_metrics"])),
            "{what}: stream {i} speculate_metrics differ"
        );
    }
}

/// Sum of `num_steps` over reference choices: what a token-processor counts for them, each step
/// once.
fn reference_steps(want: &[serde_json::Value]) -> f64 {
    want.iter()
        .map(|c| c["speculate_metrics"]["num_steps"].as_f64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_processor_kill9_and_restart_loses_nothing() {
    let _g = SERIAL.lock().await;
    let mut stack = Stack::start(exact_figures()).await;
    let prompts = prompts(16);
    // Long enough (and past EOS) that all 16 are still running when the kill lands.
    let max_tokens = 48;
    let want = stack
        .reference_choices_with(&prompts, max_tokens, true)
        .await;
    let most_steps = reference_steps(&want);
    for down_for in [
        Duration::from_millis(200),
        Duration::from_secs(2),
        Duration::from_secs(10),
    ] {
        let streams = Streams::spawn(&stack, &prompts, max_tokens, true);
        streams.wait_started(prompts.len()).await;
        stack.signal(Proc::TokenProcessor, "KILL");
        let killed_at = Instant::now();
        let in_flight = streams.tasks.iter().filter(|t| !t.is_finished()).count();
        assert_eq!(
            in_flight,
            prompts.len(),
            "every request in flight when the kill hit"
        );
        stack
            .wait_exit(Proc::TokenProcessor, exit_after_kill())
            .await;
        // The restart delay is the fault under test (systemd's RestartSec), not a wait.
        tokio::time::sleep(down_for.saturating_sub(killed_at.elapsed())).await;
        stack.spawn(Proc::TokenProcessor);
        let what = format!("tp down {down_for:?}");
        assert_all_exact(streams, &want, PATIENCE, &what).await;
        let done_after = killed_at.elapsed();
        // The restarted token-processor counts from 0 and each replayed step once: exactly the
        // steps of the 16 requests (a double count would exceed it, a lost step fall short).
        let steps = metric_sum(
            &stack.metrics_text().await,
            "specula_spec_decode_num_steps_total",
        );
        eprintln!(
            "tp kill -9, restarted after {down_for:?}: 16/16 exact {done_after:?} after the kill \
             ({in_flight} in flight at the kill); steps counter {steps} (reference total {most_steps})"
        );
        assert_eq!(
            steps, most_steps,
            "every step counted exactly once: {steps} against the reference total {most_steps}"
        );
        stack.wait_healthy(PATIENCE).await;
    }
}

/// The race the replay exists for: the restarted token-processor gets the worker's resync before
/// the api-server has said hello to it, so the replayed outputs have nowhere to go and are
/// dropped. The api-server, resumed, sees the new token-processor and asks for a replay; the
/// token-processor sends every token again from index 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_processor_restart_while_the_api_server_is_paused_loses_nothing() {
    let _g = SERIAL.lock().await;
    let mut stack = Stack::start(exact_figures()).await;
    let prompts = prompts(16);
    let max_tokens = 40;
    let want = stack.reference_choices(&prompts, max_tokens).await;
    let streams = Streams::spawn(&stack, &prompts, max_tokens, false);
    streams.wait_started(8).await;
    stack.signal(Proc::ApiServer, "STOP");
    stack.signal(Proc::TokenProcessor, "KILL");
    stack
        .wait_exit(Proc::TokenProcessor, exit_after_kill())
        .await;
    stack.spawn(Proc::TokenProcessor);
    wait_until(
        PATIENCE,
        "the worker's resync dropped for want of its api-server",
        || async {
            let text = stack.metrics_text_if_up().await;
            metric_sum(&text, "specula_worker_resyncs_total") >= 1.0
                && metric_sum(&text, "specula_outputs_dropped_total") > 0.0
        },
    )
    .await;
    stack.signal(Proc::ApiServer, "CONT");
    assert_all_exact(
        streams,
        &want,
        PATIENCE,
        "tp restarted while the api-server was paused",
    )
    .await;
    eprintln!("tp restarted while the api-server was paused: 16/16 exact after the replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engine_worker_kill9_fails_requests_within_5s_then_503_then_recovers() {
    let _g = SERIAL.lock().await;
    let mut stack = Stack::start(exact_figures()).await;
    let want = complete_text(&stack, "Hello", 4).await;
    let streams = Streams::spawn(&stack, &prompts(8), 1500, true);
    streams.wait_started(4).await;
    stack.signal(Proc::EngineWorker, "KILL");
    let killed_at = Instant::now();
    let mut detect = Duration::ZERO;
    for t in streams.tasks {
        let left = detection_bound().saturating_sub(killed_at.elapsed());
        let s = tokio::time::timeout(left, t)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "an in-flight request was not ended within {:?} of the worker's death",
                    detection_bound()
                )
            })
            .unwrap();
        assert!(
            is_explicit_error(&s),
            "request ended without an explicit error: {s:?}"
        );
        detect = detect.max(killed_at.elapsed());
    }
    stack.wait_exit(Proc::EngineWorker, exit_after_kill()).await;
    let (status, body) = complete(
        stack.client(),
        &stack.api("/v1/completions"),
        &completion_body("Hello", 4, false),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");

    stack.spawn(Proc::EngineWorker);
    let restarted = Instant::now();
    stack.wait_healthy(PATIENCE).await;
    assert_eq!(
        complete_text(&stack, "Hello", 4).await,
        want,
        "served by the restarted worker: text differs from an undisturbed run"
    );
    eprintln!(
        "worker kill -9: all 8 in-flight requests failed explicitly within {detect:?}; \
         serving again {:?} after restart",
        restarted.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_server_kill9_stops_generation_within_5s_then_recovers() {
    let _g = SERIAL.lock().await;
    let mut stack = Stack::start(exact_figures()).await;
    let want = complete_text(&stack, "Hello", 4).await;
    let running = "specula_requests_running";
    let streams = Streams::spawn(&stack, &prompts(4), 1500, true);
    wait_until(PATIENCE, "4 requests running", || async {
        metric_sum(&stack.metrics_text().await, running) >= 4.0
    })
    .await;
    stack.signal(Proc::ApiServer, "KILL");
    let killed_at = Instant::now();
    stack.wait_exit(Proc::ApiServer, exit_after_kill()).await;
    // Stopped, not merely unlisted: with 1,500 tokens each still to go, a worker still
    // generating for them would hold their KV blocks; its heartbeat (which the token-processor
    // shows) reports none used. (The streams themselves died with the api-server's sockets:
    // nothing to learn from them.)
    wait_until(
        detection_bound().saturating_sub(killed_at.elapsed()),
        "the worker to stop the dead api-server's requests and free their KV blocks",
        || async {
            metric_sum(&stack.metrics_text().await, running) == 0.0
                && kv_blocks_used(&stack.tp_health_text().await) == Some(0)
        },
    )
    .await;
    let stopped = killed_at.elapsed();
    for t in streams.tasks {
        t.await.unwrap();
    }
    stack.spawn(Proc::ApiServer);
    stack.wait_healthy(PATIENCE).await;
    assert_eq!(
        complete_text(&stack, "Hello", 4).await,
        want,
        "served by the restarted api-server: text differs from an undisturbed run"
    );
    eprintln!("api-server kill -9: worker stopped its requests {stopped:?} after the kill");
}

/// The worker's KV blocks in use at its latest heartbeat, from the token-processor's `/health`
/// line for it (None while it lists no worker).
fn kv_blocks_used(tp_health: &str) -> Option<u64> {
    tp_health
        .split_whitespace()
        .find_map(|field| field.strip_prefix("kv_blocks_used="))
        .and_then(|v| v.parse().ok())
}

/// A draining worker or api-server refuses new work while `in_flight` still runs: the worker's
/// api-server answers 503, the api-server itself accepts no connection. The token-processor has
/// no work of its own to refuse.
async fn refuses_new_work_while_draining(
    stack: &Stack,
    victim: Proc,
    in_flight: &tokio::task::JoinHandle<Streamed>,
) {
    let refused = || async {
        match victim {
            Proc::EngineWorker => {
                let (status, _) = complete(
                    stack.client(),
                    &stack.api("/v1/completions"),
                    &completion_body("Hello", 1, false),
                )
                .await;
                // A request sent before the worker saw the signal may still be served.
                assert!(status == 200 || status == 503, "status {status}");
                status == 503
            }
            Proc::ApiServer => {
                let url = stack.api("/health");
                let refused = stack.client().get(&url).send().await.is_err();
                if refused {
                    // No connection at all, not merely an error answer.
                    let addr = url
                        .trim_start_matches("http://")
                        .trim_end_matches("/health");
                    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
                }
                refused
            }
            Proc::TokenProcessor => true,
        }
    };
    // The api-server hears that its worker drains from the worker's next heartbeat.
    wait_until(detection_bound(), "new work refused", refused).await;
    assert!(
        !in_flight.is_finished(),
        "{victim:?}: the request in flight ended before new work was refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_each_process_and_exits_0() {
    let _g = SERIAL.lock().await;
    for victim in [Proc::EngineWorker, Proc::ApiServer, Proc::TokenProcessor] {
        let mut stack = Stack::start(exact_figures()).await;
        let prompt = "Count: 1, 2, 3, 4,";
        let want = stack.reference_choices(&[prompt.to_owned()], 48).await;
        let (http, url) = (stack.client().clone(), stack.api("/v1/completions"));
        let task = tokio::spawn(async move {
            stream(&http, &url, &completion_body(prompt, 48, true), |_| true).await
        });
        wait_until(PATIENCE, "a request running", || async {
            metric_sum(&stack.metrics_text().await, "specula_requests_running") >= 1.0
        })
        .await;
        stack.signal(victim, "TERM");
        refuses_new_work_while_draining(&stack, victim, &task).await;
        let code = stack
            .wait_exit(victim, exit_after_drain(victim.drain_deadline()))
            .await;
        assert_eq!(
            code,
            Some(0),
            "{victim:?} did not exit 0 on SIGTERM:\n{}",
            stack.log(victim)
        );
        if victim == Proc::TokenProcessor {
            // The api-server waits out a token-processor outage; a restarted one gets the
            // request replayed by the worker.
            stack.spawn(Proc::TokenProcessor);
        }
        let s = tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
        // A draining worker or api-server finishes the request in flight; so does the stack
        // whose token-processor stopped and came back.
        assert!(
            s.done && s.error.is_none(),
            "the request did not complete after {victim:?} got SIGTERM: {s:?}"
        );
        assert_eq!(
            s.text,
            want[0]["text"].as_str().unwrap(),
            "{victim:?} SIGTERM: the drained request's text differs from an undisturbed run"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigstop_token_processor_30s_then_every_stream_completes_exactly() {
    let _g = SERIAL.lock().await;
    let stack = Stack::start(exact_figures()).await;
    let worker_pid = stack.pid(Proc::EngineWorker);
    let rss = move || -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{worker_pid}/status")).unwrap();
        let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let prompts = prompts(8);
    // Short enough that every request finishes during the stop (a debug build on 2 cores).
    let max_tokens = 40;
    let want = stack
        .reference_choices_with(&prompts, max_tokens, true)
        .await;
    let streams = Streams::spawn(&stack, &prompts, max_tokens, true);
    wait_until(PATIENCE, "requests running", || async {
        metric_sum(&stack.metrics_text().await, "specula_requests_running") >= 8.0
    })
    .await;
    let rss_before = rss();
    stack.signal(Proc::TokenProcessor, "STOP");
    let stopped_at = Instant::now();
    let mut rss_max = rss_before;
    let mut retained_max = 0;
    // When the worker reported (to the api-server) that the token-processor stopped
    // acknowledging its batches.
    let mut link_down_after = None;
    // As long as the api-server's outage window: the streams, which wait from the declared
    // death (a liveness window after the stop) for the window, outlast the stop.
    let stop_for = TP_OUTAGE_WINDOW;
    while stopped_at.elapsed() < stop_for {
        rss_max = rss_max.max(rss());
        let worker = worker_health(&stack).await;
        retained_max = retained_max.max(worker["retained_unacknowledged"].as_u64().unwrap_or(0));
        if link_down_after.is_none() && worker["token_processor_acknowledges"] == false {
            link_down_after = Some(stopped_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Within the api-server's outage window nothing ends: the streams wait.
    let ended = streams.tasks.iter().filter(|t| t.is_finished()).count();
    stack.signal(Proc::TokenProcessor, "CONT");
    assert_eq!(ended, 0, "streams ended during the stop");
    assert_all_exact(streams, &want, PATIENCE, "tp SIGSTOP 30 s").await;
    eprintln!(
        "tp SIGSTOP 30 s: 8/8 exact {:?} after the stop; worker saw its link stalled after \
         {link_down_after:?}; up to {retained_max} finished requests kept by the worker \
         meanwhile; worker RSS {rss_before} kB -> max {rss_max} kB",
        stopped_at.elapsed()
    );
    // The acknowledgements stop: the worker knows within its liveness window and tells the
    // api-server with its next heartbeat.
    let link_down_after = link_down_after.expect("the worker never reported its link stalled");
    assert!(
        link_down_after < detection_bound(),
        "stall seen only after {link_down_after:?} (bound {:?})",
        detection_bound()
    );
    assert!(
        retained_max > 0,
        "requests finished during the stop and were replayed"
    );
    assert!(
        rss_max < rss_before + 64 * 1024,
        "worker RSS grew by more than 64 MiB while stalled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_processor_gone_past_the_outage_window_ends_every_request_explicitly() {
    let _g = SERIAL.lock().await;
    let window = Duration::from_secs(8);
    let mut stack = Stack::start(StackConfig {
        api_args: vec![
            "--tp-outage-window-secs".into(),
            window.as_secs().to_string(),
        ],
        ..exact_figures()
    })
    .await;
    let want_hello_8 = complete_text(&stack, "Hello", 8).await;
    // Short: most finish on the worker during the window and are kept for a replay.
    let streams = Streams::spawn(&stack, &prompts(8), 16, true);
    streams.wait_started(8).await;
    stack.signal(Proc::TokenProcessor, "KILL");
    let killed_at = Instant::now();
    // When each stream ends, measured as it ends.
    let ends: Vec<tokio::task::JoinHandle<(Streamed, Duration)>> = (streams.tasks.into_iter())
        .map(|t| tokio::spawn(async move { (t.await.unwrap(), killed_at.elapsed()) }))
        .collect();
    stack
        .wait_exit(Proc::TokenProcessor, exit_after_kill())
        .await;

    // Once the api-server has declared the token-processor dead: new requests get a 503 with
    // the error envelope, and `/health` names the outage and how long requests wait for it.
    wait_until(detection_bound(), "/health to name the outage", || async {
        api_health(&stack).await.0 == 503
    })
    .await;
    let (status, health) = api_health(&stack).await;
    let reason = health["error"]["message"].as_str().unwrap_or_default();
    assert!(
        status == 503
            && reason.contains("token-processor has not said hello recently (gone ")
            && reason.contains(&format!(
                "in-flight requests wait up to {} s for it",
                window.as_secs()
            ))
            && health["engine"]["token_processor_outage_s"].is_f64(),
        "{status} {health}"
    );
    let refused = stack
        .client()
        .post(stack.api("/v1/completions"))
        .json(&completion_body("Hello", 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(
        refused.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(
        body["error"]["message"], "the token processor is not available",
        "{body}"
    );
    assert_eq!(body["error"]["code"], "engine_unavailable", "{body}");

    // Declared dead after the liveness window, then the outage window runs.
    let bound = outage_bound(window);
    let mut retained_max = 0;
    while !ends.iter().all(|t| t.is_finished()) {
        assert!(
            killed_at.elapsed() < bound,
            "streams still open {bound:?} after the kill"
        );
        let worker = worker_health(&stack).await;
        retained_max = retained_max.max(worker["retained_unacknowledged"].as_u64().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut first_end = bound;
    for (i, t) in ends.into_iter().enumerate() {
        let (s, ended_after) = t.await.unwrap();
        assert!(
            is_explicit_error(&s),
            "stream {i} did not end with an error: {s:?}"
        );
        // Every stream, not only the last, waited out the window.
        assert!(
            ended_after >= window,
            "stream {i} ended {ended_after:?} after the kill, inside the {window:?} window"
        );
        first_end = first_end.min(ended_after);
    }
    assert!(
        retained_max > 0,
        "requests finished during the outage were kept"
    );
    // The api-server's aborts make the worker forget what it kept.
    wait_until(detection_bound(), "worker keeps nothing", || async {
        worker_health(&stack).await["retained_unacknowledged"] == 0
    })
    .await;
    eprintln!(
        "tp gone past a {window:?} window: 8/8 explicit errors, the first {first_end:?} after \
         the kill; /health 503 \"{reason}\"; worker kept at most {retained_max} requests"
    );
    stack.spawn(Proc::TokenProcessor);
    stack.wait_healthy(PATIENCE).await;
    assert_eq!(
        complete_text(&stack, "Hello", 8).await,
        want_hello_8,
        "served after the restart: text differs from an undisturbed run"
    );
}

/// Requests and prompt tokens of the retention test: with its prompt's logprobs (20
/// alternatives, 192 B a token as the worker counts them) a finished request weighs some
/// 69 KB, so 16 of them fill the worker's 1 MiB retention bound and 20 overflow it.
const HEAVY_REQUESTS: u32 = 20;
const HEAVY_PROMPT_TOKENS: u32 = 360;

/// The worker keeps finished, unacknowledged requests only up to `--retain-max-mib`: past it
/// the oldest are dropped and counted, and when the token-processor is back their api-server's
/// probe ends them with an explicit error while the kept ones complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_keeps_finished_requests_only_up_to_its_retention_bound() {
    let _g = SERIAL.lock().await;
    let retain_bound: u64 = 1 << 20;
    let stack = Stack::start(StackConfig {
        // The outage outlasts computing 20 prompts' logprobs on a loaded 2-core machine: the
        // requests wait for the token-processor, however long that takes.
        api_args: vec!["--tp-outage-window-secs".into(), "600".into()],
        worker_args: vec![
            "--retain-max-mib".into(),
            (retain_bound >> 20).to_string(),
            // The byte bound alone, not the age bound, drops requests here.
            "--retain-max-age-secs".into(),
            "600".into(),
            // One prompt's logprobs per step: a step that computes several takes longer than
            // the worker's step-loop stall bound (10 s) on this machine, and the worker exits.
            "--max-num-batched-tokens".into(),
            "512".into(),
        ],
        ..exact_figures()
    })
    .await;
    let bodies = (0..HEAVY_REQUESTS).map(|i| {
        let prompt: Vec<u32> = (0..HEAVY_PROMPT_TOKENS)
            .map(|j| 1_000 + (i * 131 + j * 7) % 20_000)
            .collect();
        let mut body = completion_body("", 4, true);
        body["prompt"] = prompt.into();
        body["echo"] = true.into();
        body["logprobs"] = 20.into();
        body
    });
    let streams = Streams::spawn_bodies(&stack, bodies);
    // Paused once all are in the api-server's hands: a prompt's logprobs take the worker far
    // longer than that, so none has finished (and been acknowledged) yet.
    wait_until(PATIENCE, "every request in flight", || async {
        api_health(&stack).await.1["in_flight"] == HEAVY_REQUESTS
    })
    .await;
    stack.signal(Proc::TokenProcessor, "STOP");
    let stopped_at = Instant::now();
    // Every request finishes on the worker, unacknowledged; what is kept is sampled meanwhile.
    let (mut retained_bytes_max, mut retained_max) = (0, 0);
    let dropped = loop {
        assert!(
            stopped_at.elapsed() < 10 * PATIENCE,
            "requests still unfinished on the worker {:?} after the pause",
            stopped_at.elapsed()
        );
        let worker = worker_health(&stack).await;
        let kept = worker["retained_unacknowledged"].as_u64().unwrap_or(0);
        retained_max = retained_max.max(kept);
        retained_bytes_max = retained_bytes_max.max(worker["retained_bytes"].as_u64().unwrap_or(0));
        let dropped = worker["retained_dropped_total"].as_u64().unwrap_or(0);
        if worker["running_and_waiting"] == 0 && kept + dropped == u64::from(HEAVY_REQUESTS) {
            break dropped;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let computed_in = stopped_at.elapsed();
    stack.signal(Proc::TokenProcessor, "CONT");
    // The bound held, and was reached: the worker dropped the oldest rather than go past it.
    assert!(
        retained_bytes_max <= retain_bound,
        "retained {retained_bytes_max} B > {retain_bound} B"
    );
    assert!(
        dropped > 0 && retained_bytes_max > retain_bound * 3 / 4,
        "the retention bound was not reached: at most {retained_bytes_max} B kept, {dropped} dropped"
    );
    // Back, the token-processor replays what was kept; the api-server's probe ends the dropped
    // ones explicitly.
    let (mut complete, mut errors) = (0, 0);
    for (i, t) in streams.tasks.into_iter().enumerate() {
        let s = tokio::time::timeout(PATIENCE, t)
            .await
            .unwrap_or_else(|_| panic!("stream {i} hung after SIGCONT"))
            .unwrap();
        if s.done && s.error.is_none() {
            // The echoed prompt's logprobs came with the replay.
            let scored = (s.chunks.iter())
                .filter_map(|c| c["choices"][0]["logprobs"]["token_logprobs"].as_array())
                .map(Vec::len)
                .sum::<usize>();
            assert!(
                scored > HEAVY_PROMPT_TOKENS as usize,
                "stream {i}: {scored} logprobs"
            );
            complete += 1;
        } else {
            assert!(
                is_explicit_error(&s),
                "stream {i} ended without an explicit error: {s:?}"
            );
            errors += 1;
        }
    }
    eprintln!(
        "retention bound {retain_bound} B: {HEAVY_REQUESTS} requests finished during a \
         {computed_in:?} token-processor pause; the worker kept at most {retained_max} \
         ({retained_bytes_max} B) and dropped {dropped}; after SIGCONT {complete} completed, \
         {errors} explicit errors"
    );
    assert_eq!(
        errors, dropped,
        "the dropped requests, and only they, end with an error"
    );
    assert_eq!(complete + errors, u64::from(HEAVY_REQUESTS));
}

/// The api-server's `/health`: status and body.
async fn api_health(stack: &Stack) -> (u16, serde_json::Value) {
    let r = stack
        .client()
        .get(stack.api("/health"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// A greedy completion of `prompt` that must succeed; its text.
async fn complete_text(stack: &Stack, prompt: &str, max_tokens: u32) -> String {
    let (status, body) = complete(
        stack.client(),
        &stack.api("/v1/completions"),
        &completion_body(prompt, max_tokens, false),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["choices"][0]["text"].as_str().unwrap().to_owned()
}

/// The api-server's view of its (only) worker, from `/health` (a 503 carries it under `engine`).
async fn worker_health(stack: &Stack) -> serde_json::Value {
    let r = stack
        .client()
        .get(stack.api("/health"))
        .send()
        .await
        .unwrap();
    let health: serde_json::Value = r.json().await.unwrap();
    let status = health.get("engine").unwrap_or(&health);
    status["workers"][0].clone()
}

/// The fault tests compare every request's `speculate_metrics` with an undisturbed run's, so
/// drafting must depend on nothing but the request: the fixed policy (not the load) and the
/// n-gram proposer (not other requests' outputs, which the suffix proposer's shared trie holds).
fn exact_figures() -> StackConfig {
    StackConfig {
        spec_policy: "fixed",
        proposer: "ngram",
        ..StackConfig::default()
    }
}

//! 10k streaming requests whose clients disconnect mid-stream: afterwards every per-request map
//! in all three processes is empty, and no process's RSS grew by 5% or more.
//!
//! SPECULA_DISCONNECT_REQUESTS overrides the count (default 10,000).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use common::openai::{completion_body, stream};
use common::stack::{metric_sum, Proc, Stack, StackConfig};
use common::timing::PATIENCE;
use common::{rss_kib, wait_until};
use serde_json::Value;

/// The api-server's `/health` body (Null when it cannot be read).
async fn api_health(stack: &Stack) -> Value {
    match stack.client().get(stack.api("/health")).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// (api-server in-flight, workers' running + waiting, token-processor running).
async fn in_flight(stack: &Stack) -> (u64, u64, u64) {
    let health = api_health(stack).await;
    let api = health["in_flight"].as_u64().unwrap_or(u64::MAX);
    let workers = health["workers"].as_array().map_or(u64::MAX, |w| {
        w.iter()
            .filter_map(|w| w["running_and_waiting"].as_u64())
            .sum()
    });
    let tp = metric_sum(&stack.metrics_text().await, "specula_requests_running") as u64;
    (api, workers, tp)
}

/// Runs `n` requests, `concurrency` at a time, each dropped after its first streamed chunk;
/// returns how many really were dropped mid-stream (answered 200, a chunk read, no `[DONE]`).
async fn disconnect_wave(stack: &Stack, n: usize, concurrency: usize) -> usize {
    let next = Arc::new(AtomicUsize::new(0));
    let mid_stream = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (http, url, next, mid_stream) = (
            stack.client().clone(),
            stack.api("/v1/completions"),
            next.clone(),
            mid_stream.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                // A one-token prompt (a letter): the test is about the requests' state, and
                // the model's work per request (prompt, then the tokens generated until the abort
                // lands) is most of its time.
                let letter = char::from(b'a' + (i % 26) as u8);
                let mut body = completion_body(&letter.to_string(), 64, true);
                body["ignore_eos"] = true.into();
                let s = stream(&http, &url, &body, |_| false).await;
                assert!(
                    s.http_status == 200 || s.http_status == 429,
                    "request {i}: status {} {:?}",
                    s.http_status,
                    s.error
                );
                if s.http_status == 200 && !s.chunks.is_empty() && !s.done {
                    mid_stream.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    mid_stream.load(Ordering::Relaxed)
}

async fn wait_drained(stack: &Stack) {
    wait_until(PATIENCE, "every per-request map to empty", || async {
        in_flight(stack).await == (0, 0, 0)
    })
    .await;
    // The api-server hands freed heap back once it is idle (not while requests run): RSS is
    // read after that.
    wait_until(
        PATIENCE,
        "the api-server to trim its heap after the last request",
        || async { api_health(stack).await["idle_heap_trimmed"] == Value::Bool(true) },
    )
    .await;
}

/// The test is about clients leaving mid-stream: most of the `sent` requests must really have
/// done so (a run of 429s would test nothing), and each such request was aborted at the worker
/// (the token-processor counts it as finished by abort).
async fn assert_disconnects_were_aborts(stack: &Stack, sent: usize, disconnected: usize) {
    let aborted = metric_sum(
        &stack.metrics_text().await,
        "specula_requests_finished_abort_total",
    );
    eprintln!("{sent} requests, {disconnected} dropped mid-stream, {aborted} aborts seen by the token-processor");
    assert!(
        disconnected * 10 >= sent * 9,
        "only {disconnected} of {sent} requests were dropped mid-stream"
    );
    assert!(
        aborted >= disconnected as f64 * 0.9,
        "{aborted} aborts for {disconnected} mid-stream disconnects"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_disconnecting_clients_leave_no_state_behind() {
    let n: usize = std::env::var("SPECULA_DISCONNECT_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let stack = Stack::start(StackConfig {
        // The KV cache backed at start: what grows here is request state, not cache pages
        // first written by new prompts (their growth is measured in docs/benchmarks.md).
        worker_args: vec![
            "--max-num-seqs".into(),
            "64".into(),
            "--kv-cache-prefault".into(),
            "true".into(),
        ],
        ..StackConfig::default()
    })
    .await;
    let pids: Vec<(Proc, u32)> = Proc::ALL.iter().map(|p| (*p, stack.pid(*p))).collect();

    // Warm-up: allocator arenas, KV blocks, connection pools reach their working size first.
    let warm = (n / 10).clamp(100, 1000);
    let warm_disconnected = disconnect_wave(&stack, warm, 32).await;
    wait_drained(&stack).await;
    // Checked already here: without aborts, the 10k requests would each run their 64 tokens and
    // the test would take most of an hour before failing at the end.
    assert_disconnects_were_aborts(&stack, warm, warm_disconnected).await;
    let before: Vec<u64> = pids.iter().map(|(_, pid)| rss_kib(*pid)).collect();

    // In five waves, so a failure shows whether RSS climbs steadily (a leak) or jumps once.
    let started = Instant::now();
    const WAVES: usize = 5;
    let mut after = before.clone();
    let mut disconnected = 0;
    for wave in 0..WAVES {
        let count = n / WAVES + usize::from(wave < n % WAVES);
        disconnected += disconnect_wave(&stack, count, 32).await;
        wait_drained(&stack).await;
        after = pids.iter().map(|(_, pid)| rss_kib(*pid)).collect();
        eprintln!("RSS kB after wave {}: {after:?}", wave + 1);
    }

    eprintln!(
        "{n} disconnects in {:?}; RSS kB before/after: {:?}",
        started.elapsed(),
        pids.iter()
            .zip(before.iter().zip(&after))
            .map(|((p, _), (b, a))| (*p, *b, *a))
            .collect::<Vec<_>>()
    );
    assert_disconnects_were_aborts(&stack, warm + n, warm_disconnected + disconnected).await;
    for (((p, _), b), a) in pids.iter().zip(&before).zip(&after) {
        // The worker's RSS holds its whole KV cache (~1.6 GB, prefaulted): bound its growth in
        // bytes, not in percent of that reservation. Measured growth over 10k: 14–20 MB (allocator state).
        let limit_kib = match p {
            Proc::EngineWorker => b + 32 * 1024,
            _ => b + b / 20,
        };
        assert!(
            *a < limit_kib,
            "{p:?} RSS grew from {b} kB to {a} kB (limit {limit_kib} kB)"
        );
    }
}

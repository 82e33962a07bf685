//! A fair front door on the default stack: one client's 64-sequence request (4 prompts × n 16,
//! `max_tokens` 1900, `ignore_eos`) holds at most its share (a quarter of the worker's batch
//! slots), so 8 other
//! clients each get their 200 within the stack's status bound while it runs, whether its client
//! reads the stream or holds it open without reading; the one that does not read loses its
//! stream after the write timeout, and its sequences are given back.
//!
//! The write timeout counts from the client's last read, as the server's socket tells it (bytes
//! waiting, none acknowledged), so the stream is released within the write timeout plus the
//! product's 2 s (plus the loaded machine's slack) of its client going quiet: here, of sending.

mod common;

use std::time::{Duration, Instant};

use common::stack::{Stack, StackConfig};
use common::timing::{status_bound, LOADED_MACHINE_SLACK, PATIENCE};
use common::wait_until;
use serde_json::{json, Value};

const OTHERS: usize = 8;
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

fn big_request() -> Value {
    json!({
        "model": common::openai::MODEL,
        "prompt": ["Tell a long story.", "List every number.", "Describe the sea.", "Count up:"],
        "n": 16,
        "max_tokens": 1900,
        "ignore_eos": true,
        "temperature": 0.8,
        "stream": true,
    })
}

async fn admission(stack: &Stack) -> Value {
    let health: Value = stack
        .client()
        .get(stack.api("/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    health["admission"].clone()
}

/// 8 other clients' streamed requests, at once: each gets a 200 within the status bound and
/// its stream ends with `[DONE]`. Returns the slowest time to a status.
async fn others_are_served(stack: &Stack) -> Duration {
    let url = stack.api("/v1/completions");
    let tasks = (0..OTHERS).map(|i| {
        let (http, url) = (stack.client().clone(), url.clone());
        async move {
            let body = common::openai::completion_body(&format!("Say {i}:"), 8, true);
            let sent = Instant::now();
            let response = http.post(&url).json(&body).send().await.unwrap();
            let to_status = sent.elapsed();
            assert_eq!(response.status(), 200, "client {i}");
            let text = response.text().await.unwrap();
            assert!(text.ends_with("data: [DONE]\n\n"), "client {i}: {text}");
            to_status
        }
    });
    let times = futures::future::join_all(tasks).await;
    let slowest = times.into_iter().max().unwrap();
    assert!(
        slowest <= status_bound(),
        "a client waited {slowest:?} for its status (bound {:?})",
        status_bound()
    );
    slowest
}

/// Sends the big request on a socket with a small receive buffer and never reads from it.
async fn send_unread(stack: &Stack) -> tokio::net::TcpStream {
    common::openai::post_unread(stack.api_port, "/v1/completions", &big_request()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_client_holds_the_server_reading_or_not() {
    let stack = Stack::start(StackConfig {
        api_args: vec![
            "--stream-write-timeout-secs".into(),
            WRITE_TIMEOUT.as_secs().to_string(),
        ],
        ..StackConfig::default()
    })
    .await;
    let share = admission(&stack).await["per_request"].as_u64().unwrap();
    assert_eq!(
        share, 4,
        "a quarter of the worker's 16 batch slots by default"
    );

    // 1. The big request, read by its client.
    let reader = tokio::spawn({
        let (http, url) = (stack.client().clone(), stack.api("/v1/completions"));
        async move {
            let mut response = http.post(&url).json(&big_request()).send().await.unwrap();
            assert_eq!(response.status(), 200);
            while let Ok(Some(_)) = response.chunk().await {}
        }
    });
    wait_until(PATIENCE, "the big request to hold its share", || async {
        admission(&stack).await["sequences_in_flight"].as_u64() == Some(share)
    })
    .await;
    let slowest = others_are_served(&stack).await;
    println!("while a 64-sequence stream is read: slowest other status {slowest:?}");
    let held = admission(&stack).await["sequences_in_flight"]
        .as_u64()
        .unwrap();
    assert_eq!(
        held, share,
        "the big request never holds more than its share"
    );
    reader.abort();
    let _ = reader.await;
    wait_until(PATIENCE, "the aborted request's sequences back", || async {
        admission(&stack).await["sequences_in_flight"].as_u64() == Some(0)
    })
    .await;

    // 2. The same request from a client that never reads.
    let sent = Instant::now();
    let unread = send_unread(&stack).await;
    wait_until(PATIENCE, "the unread request to be admitted", || async {
        admission(&stack).await["sequences_in_flight"].as_u64() == Some(share)
    })
    .await;
    let slowest = others_are_served(&stack).await;
    println!("while a 64-sequence stream is not read: slowest other status {slowest:?}");
    // The request alone would run for minutes.
    let bound = WRITE_TIMEOUT + Duration::from_secs(2) + LOADED_MACHINE_SLACK;
    wait_until(
        PATIENCE,
        "the unread stream's sequences released",
        || async { admission(&stack).await["sequences_in_flight"].as_u64() == Some(0) },
    )
    .await;
    let released = sent.elapsed();
    assert!(
        released <= bound,
        "released {released:?} after the client went quiet (bound {bound:?})"
    );
    let log = stack.log(common::stack::Proc::ApiServer);
    assert!(
        log.contains("read nothing for the write timeout"),
        "released by the write timeout, not by something else"
    );
    println!(
        "unread stream released {released:?} after it was sent (write timeout {WRITE_TIMEOUT:?}, \
         slack {LOADED_MACHINE_SLACK:?})"
    );
    // Others are served at once afterwards, and the socket is closed by the server.
    others_are_served(&stack).await;
    drop(unread);
}

/// The product's bound on a newcomer's first token while one client holds as much as it may
/// (README, "No client can hold the server").
const NEWCOMER_FIRST_TOKEN: Duration = Duration::from_secs(2);

/// One client (its own API key) sends 16 streamed requests of 4 long prompts at once and reads
/// them: it holds the batch slots less one request's share (12 of the worker's 16), its other
/// requests wait their turn and get their 429. A newcomer with another key then gets its 200
/// and its first token within 2 s (plus the loaded machine's slack). Before, the one client
/// held all 64 sequences of the bound, and the newcomer got 429 after the admission wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_with_16_parallel_requests_leaves_a_newcomer_its_first_token() {
    let stack = Stack::start(StackConfig::default()).await;
    let url = stack.api("/v1/completions");
    let statuses = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let heavy: Vec<_> = (0..16)
        .map(|_| {
            let (http, url, statuses) = (stack.client().clone(), url.clone(), statuses.clone());
            tokio::spawn(async move {
                let mut body = big_request();
                body["n"] = json!(1);
                let sent = http
                    .post(&url)
                    .bearer_auth("heavy-client")
                    .json(&body)
                    .send();
                let mut response = sent.await.unwrap();
                statuses.lock().unwrap().push(response.status().as_u16());
                while let Ok(Some(_)) = response.chunk().await {}
            })
        })
        .collect();
    wait_until(PATIENCE, "every heavy request answered", || async {
        statuses.lock().unwrap().len() == 16
    })
    .await;
    let held = admission(&stack).await["sequences_in_flight"].as_u64();
    let admitted = statuses
        .lock()
        .unwrap()
        .iter()
        .filter(|&&s| s == 200)
        .count();
    assert_eq!(
        held,
        Some(12),
        "the worker's 16 slots less one request's share"
    );
    assert_eq!(admitted, 3, "{:?}", statuses.lock().unwrap());

    let sent = Instant::now();
    let mut response = stack
        .client()
        .post(&url)
        .bearer_auth("newcomer")
        .json(&common::openai::completion_body("Say hi:", 8, true))
        .send()
        .await
        .unwrap();
    let to_status = sent.elapsed();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let mut to_first_token = None;
    while let Some(chunk) = response.chunk().await.unwrap() {
        if to_first_token.is_none() && String::from_utf8_lossy(&chunk).contains("\"text\":\"") {
            to_first_token = Some(sent.elapsed());
        }
    }
    let to_first_token = to_first_token.expect("a token");
    println!(
        "newcomer beside a client holding 12 sequences: status {to_status:?}, first token \
         {to_first_token:?}"
    );
    let bound = NEWCOMER_FIRST_TOKEN + LOADED_MACHINE_SLACK;
    assert!(
        to_first_token <= bound,
        "first token after {to_first_token:?} (bound {bound:?})"
    );
    for task in heavy {
        task.abort();
    }
}

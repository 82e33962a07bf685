//! Holes a client can reach, each closed (issue 53): work is bounded before it is done, so no
//! request can make the api-server's runtime, which also sends the links' heartbeats, stall.
//! On the three real binaries with the default model.

mod common;

use std::time::{Duration, Instant};

use common::openai::{completion_body, stream, MODEL};
use common::stack::{Stack, StackConfig};
use common::timing::{liveness, PATIENCE};
use serde_json::{json, Value};

/// One stack at a time: the tests measure timings on a 2-core machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `count` distinct short words: two letters, then three (a `bad_words` list that fits
/// the light-body size, 64 KiB, with ten thousand entries).
fn short_words(count: usize) -> Vec<String> {
    let letters = || 'a'..='z';
    let two = letters().flat_map(move |a| letters().map(move |b| format!("{a}{b}")));
    let three = letters().flat_map(move |a| {
        letters().flat_map(move |b| letters().map(move |c| format!("{a}{b}{c}")))
    });
    two.chain(three).take(count).collect()
}

/// Polls `/health` every 50 ms until `stop`; returns the longest answer time seen.
async fn slowest_health(stack: &Stack, stop: &tokio::sync::watch::Receiver<bool>) -> Duration {
    let mut slowest = Duration::ZERO;
    while !*stop.borrow() {
        let start = Instant::now();
        let status = stack.status(&stack.api("/health")).await;
        slowest = slowest.max(start.elapsed());
        assert_eq!(status, Some(200), "/health while bad_words bodies arrive");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    slowest
}

/// Two clients send `bad_words` lists of 10,826 words (under 64 KiB, so handled on the
/// runtime) for 5 s while a stream runs: each is refused naming the limit, `/health` always
/// answers within the liveness window (a longer stall of the runtime is a missed heartbeat),
/// and the stream completes. Before the fix the list was tokenized and deduplicated first:
/// 920 ms per refusal on a release build, `/health` 1.99 s, the stream failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_bad_words_list_is_refused_before_any_work() {
    let _g = SERIAL.lock().await;
    let stack = Stack::start(StackConfig::default()).await;
    let words = short_words(10_826);
    let body = json!({
        "model": MODEL, "prompt": "Hi", "max_tokens": 4, "bad_words": words,
    });
    let bytes = body.to_string().len();
    assert!(bytes < 64 * 1024, "a light body: {bytes} bytes");

    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (http, url, body, stop) = (
                stack.client().clone(),
                stack.api("/v1/completions"),
                body.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut refused = 0;
                while !*stop.borrow() {
                    let r = http.post(&url).json(&body).send().await.unwrap();
                    let status = r.status().as_u16();
                    let v: Value = r.json().await.unwrap();
                    assert_eq!(status, 400, "{v}");
                    assert_eq!(v["error"]["param"], "bad_words", "{v}");
                    refused += 1;
                }
                refused
            })
        })
        .collect();
    let streamed = {
        let (http, url) = (stack.client().clone(), stack.api("/v1/completions"));
        tokio::spawn(async move {
            stream(
                &http,
                &url,
                &completion_body("Once upon a time", 48, true),
                |_| true,
            )
            .await
        })
    };
    let health = slowest_health(&stack, &stop);
    let stopper = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop_tx.send(true).unwrap();
    };
    let (slowest, ()) = tokio::join!(health, stopper);
    let mut refused = 0;
    for s in senders {
        refused += s.await.unwrap();
    }
    let streamed = tokio::time::timeout(PATIENCE, streamed)
        .await
        .unwrap()
        .unwrap();
    eprintln!("bad_words: {refused} refusals in 5 s, slowest /health {slowest:?}");
    assert!(refused >= 2, "each sender was answered");
    assert!(
        slowest < liveness().window(),
        "/health took {slowest:?}: the runtime stalled past the liveness window"
    );
    assert!(streamed.error.is_none(), "{:?}", streamed.error);
    assert_eq!(streamed.finish_reason.as_deref(), Some("length"));
}

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

/// Reads everything a connection delivers until it ends (or the patience runs out).
async fn read_to_end(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut all = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return all,
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
        }
    }
}

/// A whole (non-streamed) response is held for a client that reads nothing no longer than the
/// write timeout, as a stream is: a completion with `echo` and 20 logprobs (hundreds of KB of
/// JSON) to a client with a 4 KiB receive buffer is cut off, and the client that comes back to
/// read finds the connection ended short of the body. Before, the server held the response
/// (and its connection) for as long as the client did, and the late reader got all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_whole_response_is_not_held_for_a_client_that_reads_nothing() {
    let _g = SERIAL.lock().await;
    let write_timeout = Duration::from_secs(2);
    let stack = Stack::start(StackConfig {
        api_args: vec![
            "--stream-write-timeout-secs".into(),
            write_timeout.as_secs().to_string(),
        ],
        ..StackConfig::default()
    })
    .await;
    let body = json!({
        "model": MODEL, "prompt": "The cat sat on the mat. ".repeat(250), "max_tokens": 1,
        "echo": true, "logprobs": 20, "temperature": 0,
    });
    // A reading client: how long the answer takes, and how long it is.
    let started = Instant::now();
    let whole = stack
        .client()
        .post(stack.api("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(whole.status(), 200);
    let length = whole.bytes().await.unwrap().len();
    let took = started.elapsed();
    assert!(
        length > 512 * 1024,
        "a response larger than every buffer: {length} bytes"
    );

    let mut quiet = common::openai::post_unread(stack.api_port, "/v1/completions", &body).await;
    // Reads nothing while the answer is made, then for twice the write timeout and the slack.
    tokio::time::sleep(took * 2 + write_timeout * 2 + common::timing::LOADED_MACHINE_SLACK).await;
    let got = read_to_end(&mut quiet).await;
    println!(
        "whole response of {length} bytes: the quiet client got {} bytes before the server \
         ended the connection",
        got.len()
    );
    assert!(
        got.len() < length,
        "the server held the whole response for a client that read nothing"
    );
}

/// Costly schemas beside a plain stream: four requests whose field takes one of 4,000 words
/// are refused (400 naming the grammar's per-mask limit, the same on every try: fuel, not
/// time), two of 2,000 words are served (their output one of the words), and the plain stream
/// beside them ends whole. Before, the 4,000-word schemas were served, each of their masks
/// costing up to 7 ms on the worker's step loop (`bench-grammar`), and a neighbouring stream
/// fell from 109 to 40 tokens/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn costly_schemas_beside_a_plain_stream() {
    let _g = SERIAL.lock().await;
    let stack = Stack::start(StackConfig::default()).await;
    let url = stack.api("/v1/completions");
    let plain = {
        let (http, url) = (stack.client().clone(), url.clone());
        tokio::spawn(async move {
            stream(
                &http,
                &url,
                &completion_body("Once upon a time", 64, true),
                |_| true,
            )
            .await
        })
    };
    let schema_request = |n: usize| {
        let (http, url) = (stack.client().clone(), url.clone());
        let body = json!({
            "model": MODEL, "prompt": "Pick one word:", "max_tokens": 24, "temperature": 0,
            "response_format": grammar::samples::large_enum_response_format(n),
        });
        tokio::spawn(async move {
            let r = http.post(&url).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        })
    };
    let refused: Vec<_> = (0..4).map(|_| schema_request(4000)).collect();
    let served: Vec<_> = (0..2).map(|_| schema_request(2000)).collect();
    for task in refused {
        let (status, v) = task.await.unwrap();
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], "response_format", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("lexer fuel per mask"), "{message}");
    }
    let (_, words) = grammar::samples::large_enum(2000);
    for task in served {
        let (status, v) = task.await.unwrap();
        assert_eq!(status, 200, "{v}");
        let text = v["choices"][0]["text"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let finish = &v["choices"][0]["finish_reason"];
        if finish == "stop" {
            let choice = parsed["choice"].as_str().unwrap_or_default();
            assert!(words.iter().any(|w| w == choice), "{text}");
        }
    }
    let plain = tokio::time::timeout(PATIENCE, plain)
        .await
        .unwrap()
        .unwrap();
    assert!(plain.error.is_none(), "{:?}", plain.error);
    assert_eq!(plain.finish_reason.as_deref(), Some("length"));
}

//! Routes end to end over real ZeroMQ against a scripted fake engine: response shapes,
//! streaming, `speculate_metrics` placement, n, stop strings, aborts on disconnect and timeout,
//! dead peers.

mod support;

use std::time::Duration;

use futures::StreamExt;
use proto::FinishReason;
use serde_json::{json, Value};
use support::{fake_metrics, sse_data, Behaviour, FakeEngine};

const TEXT: &str = "The capital of France is Paris. It is lovely.";

fn tokens_of(text: &str, eos: bool) -> Vec<u32> {
    let mut ids = support::load_model().tokenizer.encode(text).unwrap();
    if eos {
        ids.push(2);
    }
    ids
}

fn complete(text: &str, finish: FinishReason) -> Behaviour {
    Behaviour::Complete {
        tokens: tokens_of(text, finish == FinishReason::Stop),
        finish,
    }
}

async fn post(base: &str, path: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn metrics_json(id: u64) -> Value {
    serde_json::to_value(fake_metrics(id & 0xFF)).unwrap()
}

#[tokio::test]
async fn completion_returns_text_usage_and_metrics() {
    let engine = FakeEngine::start(
        complete("The capital of France is Paris.", FinishReason::Stop),
        2,
    )
    .await;
    let (base, _client) = support::serve(&engine, Duration::from_secs(10)).await;
    let prompt = "What is the capital of France?";
    let r = post(
        &base,
        "/v1/completions",
        json!({"model": support::SERVED, "prompt": prompt, "max_tokens": 50, "temperature": 0}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], support::SERVED);
    assert!(v["created"].as_u64().unwrap() > 0);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["text"], "The capital of France is Paris.");
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());

    let adds = engine.adds();
    assert_eq!(adds.len(), 1);
    let add = &adds[0];
    let prompt_ids = support::load_model().tokenizer.encode(prompt).unwrap();
    assert_eq!(add.prompt_token_ids, prompt_ids);
    assert_eq!(add.max_tokens, 50);
    assert_eq!(add.sampling.temperature, 0.0);
    assert_eq!(add.owner, "api-test");
    assert_eq!(choice["speculate_metrics"], metrics_json(add.id));
    let completion = tokens_of("The capital of France is Paris.", true).len();
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt_ids.len(), "completion_tokens": completion, "total_tokens": prompt_ids.len() + completion,
               "prompt_tokens_details": {"cached_tokens": prompt_ids.len() / 3}})
    );
    // The worker is told that the final output arrived, so it can forget what it kept.
    support::wait_until(
        Duration::from_secs(5),
        "final output acknowledged to the worker",
        || async { engine.delivered() == vec![add.id] },
    )
    .await;
}

#[tokio::test]
async fn n_choices_are_separate_engine_requests_with_their_own_metrics() {
    let engine = FakeEngine::start(complete("Paris.", FinishReason::Stop), 2).await;
    let (base, _client) = support::serve(&engine, Duration::from_secs(10)).await;
    let r = post(
        &base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Capital?"}], "n": 2, "seed": 5}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    let adds = engine.adds();
    assert_eq!(adds.len(), 2);
    assert_ne!(adds[0].id, adds[1].id);
    assert_ne!(
        adds[0].sampling.seed, adds[1].sampling.seed,
        "choices sample independently"
    );
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    let mut seen_metrics = Vec::new();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["role"], "assistant");
        assert_eq!(c["message"]["content"], "Paris.");
        assert_eq!(c["finish_reason"], "stop");
        seen_metrics.push(c["speculate_metrics"].clone());
    }
    let mut want: Vec<Value> = adds.iter().map(|a| metrics_json(a.id)).collect();
    want.sort_by_key(|m| m["num_steps"].as_u64());
    seen_metrics.sort_by_key(|m| m["num_steps"].as_u64());
    assert_eq!(seen_metrics, want);
    let prompt_len = adds[0].prompt_token_ids.len();
    assert_eq!(
        v["usage"]["prompt_tokens"], prompt_len,
        "prompt counted once"
    );
    assert_eq!(
        v["usage"]["completion_tokens"],
        2 * tokens_of("Paris.", true).len()
    );
}

#[tokio::test]
async fn chat_stream_puts_metrics_only_in_each_choices_final_chunk() {
    let engine = FakeEngine::start(complete(TEXT, FinishReason::Length), 3).await;
    let (base, _client) = support::serve(&engine, Duration::from_secs(10)).await;
    let r = post(
        &base,
        "/v1/chat/completions",
        json!({
            "messages": [{"role": "user", "content": "Tell me"}],
            "stream": true, "stream_options": {"include_usage": true}, "n": 2, "max_tokens": 100
        }),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    let completion = 2 * tokens_of(TEXT, false).len();
    assert_eq!(usage_chunk["usage"]["completion_tokens"], completion);
    let adds = engine.adds();
    let mut texts = [String::new(), String::new()];
    let mut finals = [0, 0];
    for chunk in &chunks[..chunks.len() - 1] {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert!(chunk["usage"].is_null() && chunk.as_object().unwrap().contains_key("usage"));
        let choice = &chunk["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        texts[i].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        if choice["finish_reason"].is_null() {
            assert!(
                choice["speculate_metrics"].is_null(),
                "metrics only in the final chunk"
            );
        } else {
            finals[i] += 1;
            assert_eq!(choice["finish_reason"], "length");
            let m = &choice["speculate_metrics"];
            assert!(
                adds.iter().any(|a| metrics_json(a.id) == *m),
                "final chunk carries the request's own figures"
            );
        }
    }
    assert_eq!(finals, [1, 1]);
    assert_eq!(texts, [TEXT.to_owned(), TEXT.to_owned()]);
    // The first chunk of each choice announces the role.
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
}

#[tokio::test]
async fn completion_stream_without_usage_omits_the_field() {
    let engine = FakeEngine::start(complete(TEXT, FinishReason::Length), 2).await;
    let (base, _client) = support::serve(&engine, Duration::from_secs(10)).await;
    let r = post(
        &base,
        "/v1/completions",
        json!({"prompt": "Hi", "stream": true, "max_tokens": 100}),
    )
    .await;
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let mut text = String::new();
    for d in &data[..data.len() - 1] {
        let chunk: Value = serde_json::from_str(d).unwrap();
        assert_eq!(chunk["object"], "text_completion");
        assert!(!chunk.as_object().unwrap().contains_key("usage"));
        text.push_str(chunk["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(text, TEXT);
}

#[tokio::test]
async fn stop_strings_are_cut_and_the_request_stopped() {
    let engine = FakeEngine::start(complete(TEXT, FinishReason::Length), 2).await;
    let (base, _client) = support::serve(&engine, Duration::from_secs(10)).await;
    let r = post(
        &base,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 100, "stop": [" It", "zzz"]}),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["text"], "The capital of France is Paris.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], " It");
    let add = &engine.adds()[0];
    assert_eq!(
        add.stop.stop_strings,
        vec![" It".to_owned(), "zzz".to_owned()]
    );

    // Streaming: no chunk ever shows the stop string or what follows.
    let r = post(
        &base,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 100, "stop": ". It", "stream": true}),
    )
    .await;
    let data = sse_data(&r.text().await.unwrap());
    let text: String = data[..data.len() - 1]
        .iter()
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(text, "The capital of France is Paris");
}

#[tokio::test]
async fn metrics_are_null_when_speculation_is_off() {
    let engine = FakeEngine::start(complete("Paris.", FinishReason::Stop), 0).await;
    let (base, _client) = support::serve(&engine, Duration::from_secs(10)).await;
    let v: Value = post(&base, "/v1/completions", json!({"prompt": "Hi"}))
        .await
        .json()
        .await
        .unwrap();
    let choice = v["choices"][0].as_object().unwrap();
    assert!(choice.contains_key("speculate_metrics") && choice["speculate_metrics"].is_null());
}

#[tokio::test]
async fn streaming_client_disconnect_aborts_the_engine_request() {
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let (base, client) = support::serve(&engine, Duration::from_secs(30)).await;
    let r = post(
        &base,
        "/v1/completions",
        json!({"prompt": "Hi", "stream": true, "max_tokens": 1000}),
    )
    .await;
    let mut body = r.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    let id = engine.adds()[0].id;
    assert!(engine.aborts().is_empty());
    drop(body);
    support::wait_until(support::SLACK, "abort after disconnect", || async {
        engine.aborts().contains(&id)
    })
    .await;
    support::wait_until(support::SLACK, "request state cleaned up", || async {
        client.in_flight() == 0
    })
    .await;
}

#[tokio::test]
async fn non_streaming_client_disconnect_aborts_the_engine_request() {
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let (base, client) = support::serve(&engine, Duration::from_secs(30)).await;
    let request = tokio::spawn(
        reqwest::Client::new()
            .post(format!("{base}/v1/completions"))
            .json(&json!({"prompt": "Hi", "max_tokens": 1000}))
            .send(),
    );
    // The client leaves once its request reached the engine (waiting on that, not on a clock).
    support::wait_until(Duration::from_secs(10), "request at the engine", || async {
        !engine.adds().is_empty()
    })
    .await;
    request.abort();
    assert!(request.await.unwrap_err().is_cancelled(), "client gave up");
    let id = engine.adds()[0].id;
    support::wait_until(support::SLACK, "abort after disconnect", || async {
        engine.aborts().contains(&id)
    })
    .await;
    support::wait_until(support::SLACK, "request state cleaned up", || async {
        client.in_flight() == 0
    })
    .await;
}

#[tokio::test]
async fn request_timeout_aborts_and_answers_503() {
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let (base, _client) = support::serve(&engine, Duration::from_secs(1)).await;
    let r = post(
        &base,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 1000}),
    )
    .await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "request_timeout");
    let id = engine.adds()[0].id;
    support::wait_until(support::SLACK, "abort after timeout", || async {
        engine.aborts().contains(&id)
    })
    .await;
}

/// A 1,000-token request in flight at the worker when `fault` strikes it: the request gets a 503
/// naming the worker within the detection bound, nothing stays in flight, and `/health` is 503.
/// Returns `/health`'s body.
async fn a_worker_fault_fails_the_request_with_503(
    engine: &FakeEngine,
    base: &str,
    client: &api_server::engine::EngineClient,
    fault: impl FnOnce(&FakeEngine),
) -> Value {
    let pending = tokio::spawn({
        let base = base.to_owned();
        async move {
            post(
                &base,
                "/v1/completions",
                json!({"prompt": "Hi", "max_tokens": 1000}),
            )
            .await
        }
    });
    support::wait_until(support::SLACK, "request reached the worker", || async {
        !engine.adds().is_empty()
    })
    .await;
    fault(engine);
    let r = tokio::time::timeout(support::detection_bound(), pending)
        .await
        .expect("the request ends within the detection bound")
        .unwrap();
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "engine_unavailable");
    assert!(v["error"]["message"].as_str().unwrap().contains("worker"));
    assert_eq!(client.in_flight(), 0);
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status(), 503);
    health.json().await.unwrap()
}

#[tokio::test]
async fn worker_death_fails_in_flight_requests_with_503() {
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let (base, client) = support::serve(&engine, Duration::from_secs(30)).await;
    a_worker_fault_fails_the_request_with_503(&engine, &base, &client, FakeEngine::kill_worker)
        .await;
    // New requests are refused at once, not queued.
    let r = post(&base, "/v1/completions", json!({"prompt": "Hi"})).await;
    assert_eq!(r.status(), 503);
}

/// A worker that stops without closing its connection (SIGSTOP, a hung host) is declared dead
/// by this api-server's own liveness rule: the fake token-processor keeps streaming the
/// request's tokens and says nothing of the worker, so nothing else ends the request. Back, the
/// fake worker says nothing until it hears a hello: the api-server sends one instead of a
/// heartbeat while the worker is not alive for it, and on every reconnect (it reconnects a
/// connection silent past the window).
#[tokio::test]
async fn a_silent_worker_is_declared_dead_then_taken_back_by_a_hello() {
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let (base, client) = support::serve(&engine, Duration::from_secs(30)).await;
    let health = a_worker_fault_fails_the_request_with_503(
        &engine,
        &base,
        &client,
        FakeEngine::pause_worker,
    )
    .await;
    assert_eq!(health["engine"]["workers"][0]["alive"], false, "{health}");

    engine.resume_worker();
    support::wait_until(
        support::detection_bound(),
        "the worker taken back",
        || async {
            let health = reqwest::get(format!("{base}/health")).await.unwrap();
            health.status() == 200
        },
    )
    .await;
    *engine.behaviour.lock().unwrap() = complete("Hello there", FinishReason::Stop);
    let r = post(&base, "/v1/completions", json!({"prompt": "Hi"})).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn token_processor_gone_past_the_outage_window_ends_streams_with_an_error_event() {
    // The test client's outage window runs after the token-processor is declared dead.
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let (base, client) = support::serve(&engine, Duration::from_secs(30)).await;
    let r = post(&base, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true, "max_tokens": 1000})).await;
    let mut body = r.bytes_stream();
    let _ = body.next().await.unwrap().unwrap();
    engine.kill_tp();
    let killed = std::time::Instant::now();
    let rest = tokio::time::timeout(
        support::detection_bound() + support::TP_OUTAGE_WINDOW,
        async {
            let mut text = String::new();
            while let Some(chunk) = body.next().await {
                text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            }
            text
        },
    )
    .await
    .expect("stream ends instead of hanging");
    let ended = killed.elapsed();
    assert!(
        ended >= support::TP_OUTAGE_WINDOW,
        "the stream waited out the window, ended after {ended:?}"
    );
    let data = sse_data(&rest);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "engine_unavailable");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("token processor"));
    let id = engine.adds()[0].id;
    support::wait_until(support::SLACK, "abort sent to the worker", || async {
        engine.aborts().contains(&id)
    })
    .await;
    assert_eq!(client.in_flight(), 0);
}

#[tokio::test]
async fn engine_refusals_get_http_statuses_also_when_streaming() {
    use proto::api_worker::RejectReason;
    for (reason, status, code) in [
        (
            RejectReason::Invalid("prompt too long for this worker".into()),
            400,
            "invalid_value",
        ),
        (RejectReason::Overloaded, 429, "overloaded"),
        (RejectReason::NotAccepting, 503, "engine_unavailable"),
    ] {
        let engine = FakeEngine::start(Behaviour::Reject(reason), 2).await;
        let (base, client) = support::serve(&engine, Duration::from_secs(10)).await;
        for stream in [false, true] {
            let r = post(
                &base,
                "/v1/completions",
                json!({"prompt": "Hi", "stream": stream}),
            )
            .await;
            assert_eq!(r.status(), status, "stream={stream}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], code);
        }
        assert_eq!(client.in_flight(), 0);
    }
}

#[tokio::test]
async fn an_abort_the_server_did_not_ask_for_is_an_error_not_a_short_answer() {
    // The worker ends the request on its own (drain deadline, or it lost this server).
    let engine = FakeEngine::start(complete("Half an answ", FinishReason::Abort), 2).await;
    let (base, client) = support::serve(&engine, Duration::from_secs(10)).await;
    let r = post(
        &base,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 50}),
    )
    .await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "engine_unavailable", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stopped this request"),
        "{v}"
    );

    let r = post(
        &base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "stream": true, "max_tokens": 50}),
    )
    .await;
    assert_eq!(r.status(), 200, "the stream had started");
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "engine_unavailable", "{error}");
    assert!(
        data.iter()
            .all(|d| !d.contains("\"finish_reason\":\"abort\"")),
        "no chunk claims the answer ended: {data:?}"
    );
    assert_eq!(client.in_flight(), 0);
}

#[tokio::test]
async fn a_request_whose_output_was_lost_ends_with_an_error_after_the_stall_timeout() {
    // The stall timeout under test is short; the request timeout is far away.
    let engine = FakeEngine::start(Behaviour::Lost, 2).await;
    let (base, client) = support::serve(&engine, Duration::from_secs(120)).await;
    let started = std::time::Instant::now();
    // The stall is noticed, then the worker is asked (a round trip) and answers "not held".
    let r = tokio::time::timeout(
        support::STALL_TIMEOUT + support::detection_bound(),
        post(
            &base,
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 5}),
        ),
    )
    .await
    .expect("ends long before the request timeout");
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no longer holds"),
        "{v}"
    );
    assert!(
        started.elapsed() >= support::STALL_TIMEOUT,
        "not before the stall timeout"
    );
    let id = engine.adds()[0].id;
    assert!(
        engine.probes().iter().any(|p| p.contains(&id)),
        "the worker was asked"
    );
    assert_eq!(client.in_flight(), 0);
}

#[tokio::test]
async fn a_slow_request_the_worker_still_holds_is_not_ended() {
    // Output slower than the stall timeout, but the worker holds it.
    let engine = FakeEngine::start(
        Behaviour::Paced {
            tokens: tokens_of("Paris.", true),
            finish: FinishReason::Stop,
            delay: support::STALL_TIMEOUT * 3 / 2,
        },
        2,
    )
    .await;
    let (base, _client) = support::serve(&engine, Duration::from_secs(60)).await;
    let r = post(
        &base,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 5}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(!engine.probes().is_empty(), "it was probed, and kept");
}

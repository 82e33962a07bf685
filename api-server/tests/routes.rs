//! Routes through an in-process engine (no sockets): how engine events become HTTP output.

mod support;

use std::time::Duration;

use api_server::engine::{EngineEvent, EngineFailure, Finished};
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use proto::tp_api::TokenCounts;
use proto::FinishReason;
use serde_json::{json, Value};
use support::in_process::ScriptedEngine;
use support::{fake_metrics, sse_data};
use tower::ServiceExt;

const TEXT: &str = "Hello there, friend.";

fn text_tokens() -> Vec<u32> {
    support::load_model().tokenizer.encode(TEXT).unwrap()
}

/// Output of `TEXT`, then the end with `metrics`.
fn answer(metrics: Option<proto::SpeculateMetrics>) -> Vec<EngineEvent> {
    let tokens = text_tokens();
    let completion_tokens = tokens.len() as u32;
    vec![
        EngineEvent::Tokens(tokens),
        EngineEvent::Finished(Finished {
            reason: FinishReason::Length,
            usage: Some(TokenCounts {
                prompt_tokens: 0,
                cached_prompt_tokens: 0,
                completion_tokens,
            }),
            speculate_metrics: metrics,
        }),
    ]
}

async fn post(app: &Router, path: &str, body: Value) -> Response {
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    app.clone().oneshot(request).await.unwrap()
}

async fn body_text(response: Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// A streamed body's `data:` payloads: the JSON events, and whether `[DONE]` came last.
async fn sse_events(response: Response) -> (Vec<Value>, bool) {
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let data = sse_data(&body_text(response).await);
    let done_last = data.last().map(String::as_str) == Some("[DONE]");
    let events = data
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    (events, done_last)
}

fn chat_body(stream: bool) -> Value {
    json!({
        "model": support::SERVED,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 50,
        "stream": stream,
    })
}

#[tokio::test]
async fn chat_stream_passes_the_engines_figures_through() {
    let engine = ScriptedEngine::new(answer(Some(fake_metrics(7))), 64);
    let mut body = chat_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let response = post(&engine.router(), "/v1/chat/completions", body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (events, done_last) = sse_events(response).await;
    assert!(done_last);

    let prompt_tokens = engine.submitted()[0].prompt_token_ids.len();
    let usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": text_tokens().len(),
        "total_tokens": prompt_tokens + text_tokens().len(),
        "prompt_tokens_details": {"cached_tokens": 0},
    });
    let (usage_chunk, chunks) = events.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], usage);
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let mut text = String::new();
    for (i, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert!(chunk["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert!(chunk["usage"].is_null() && chunk.get("usage").is_some());
        let choice = &chunk["choices"][0];
        text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        if i + 1 < chunks.len() {
            assert!(choice["finish_reason"].is_null());
            assert!(choice["speculate_metrics"].is_null());
        }
    }
    assert_eq!(text, TEXT);
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "length");
    assert_eq!(
        last["speculate_metrics"],
        serde_json::to_value(fake_metrics(7)).unwrap()
    );
}

#[tokio::test]
async fn speculate_metrics_are_null_when_the_engine_sends_none() {
    let engine = ScriptedEngine::new(answer(None), 64);
    let app = engine.router();
    let response = post(
        &app,
        "/v1/completions",
        json!({"model": support::SERVED, "prompt": "Say hello.", "max_tokens": 50}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let v: Value = serde_json::from_str(&body_text(response).await).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    let choice = v["choices"][0].as_object().unwrap();
    assert_eq!(choice["text"], TEXT);
    assert_eq!(choice["finish_reason"], "length");
    assert!(choice.contains_key("speculate_metrics") && choice["speculate_metrics"].is_null());

    let response = post(&app, "/v1/chat/completions", chat_body(false)).await;
    let v: Value = serde_json::from_str(&body_text(response).await).unwrap();
    assert_eq!(v["object"], "chat.completion");
    let choice = v["choices"][0].as_object().unwrap();
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": TEXT})
    );
    assert!(choice.contains_key("speculate_metrics") && choice["speculate_metrics"].is_null());
}

#[tokio::test]
async fn an_engine_failure_mid_stream_is_an_error_event_then_done() {
    let script = vec![
        EngineEvent::Tokens(text_tokens()),
        EngineEvent::Failed(EngineFailure::WorkerLost),
    ];
    let engine = ScriptedEngine::new(script, 64);
    let response = post(
        &engine.router(),
        "/v1/completions",
        json!({"model": support::SERVED, "prompt": "Say hello.", "max_tokens": 50, "stream": true}),
    )
    .await;
    // The first output came before the failure: the status is sent already.
    assert_eq!(response.status(), StatusCode::OK);
    let (events, done_last) = sse_events(response).await;
    assert!(done_last);
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0]["choices"][0]["text"], TEXT);
    assert_eq!(
        events[1],
        json!({"error": {
            "message": "the engine worker running this request was lost",
            "type": "server_error",
            "param": null,
            "code": "engine_unavailable",
        }})
    );
}

#[tokio::test]
async fn a_refusal_before_any_output_gets_its_status() {
    let script = vec![EngineEvent::Failed(EngineFailure::Rejected(
        proto::api_worker::RejectReason::Overloaded,
    ))];
    let engine = ScriptedEngine::new(script, 64);
    let response = post(&engine.router(), "/v1/chat/completions", chat_body(true)).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    let v: Value = serde_json::from_str(&body_text(response).await).unwrap();
    assert_eq!(v["error"]["message"], "the engine is overloaded");
}

#[tokio::test]
async fn a_full_admission_bound_is_a_429_and_a_dropped_stream_makes_room() {
    // Output, then nothing: the request holds its place until its client goes.
    let engine = ScriptedEngine::new(vec![EngineEvent::Tokens(text_tokens())], 1);
    let app = engine.router();
    let held = post(&app, "/v1/chat/completions", chat_body(true)).await;
    assert_eq!(held.status(), StatusCode::OK);

    let refused = post(&app, "/v1/chat/completions", chat_body(true)).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
    let v: Value = serde_json::from_str(&body_text(refused).await).unwrap();
    assert_eq!(v["error"]["code"], "overloaded");
    assert_eq!(
        engine.submitted().len(),
        1,
        "a refused request reaches no engine"
    );

    drop(held);
    // The stream's task sees the body gone and drops the run.
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    while engine.abandoned() == 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        engine.abandoned(),
        1,
        "the dropped stream's request is aborted"
    );
    let admitted = post(&app, "/v1/chat/completions", chat_body(true)).await;
    assert_eq!(admitted.status(), StatusCode::OK);
}

/// With a quarter of a bound of 8, one request of n = 8 runs as 2 lanes: it holds 2 sequences,
/// never more, and still answers every choice.
#[tokio::test]
async fn a_request_past_its_share_runs_its_choices_through_its_lanes() {
    let engine = ScriptedEngine::with_share(answer(None), 8, 0.25);
    let app = engine.router();
    for stream in [false, true] {
        let mut body = chat_body(stream);
        body["n"] = json!(8);
        let response = post(&app, "/v1/chat/completions", body).await;
        assert_eq!(response.status(), StatusCode::OK);
        let mut indices: Vec<u64> = if stream {
            let (events, done_last) = sse_events(response).await;
            assert!(done_last);
            events
                .iter()
                .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
                .filter(|c| c["finish_reason"].is_string())
                .map(|c| c["index"].as_u64().unwrap())
                .collect()
        } else {
            let v: Value = serde_json::from_str(&body_text(response).await).unwrap();
            v["choices"]
                .as_array()
                .unwrap()
                .iter()
                .inspect(|c| assert_eq!(c["message"]["content"], TEXT))
                .map(|c| c["index"].as_u64().unwrap())
                .collect()
        };
        indices.sort_unstable();
        assert_eq!(indices, (0..8).collect::<Vec<_>>(), "stream: {stream}");
    }
    assert_eq!(engine.submitted().len(), 16);
    assert_eq!(engine.admitted(), 0);
}

/// A stream whose client reads nothing is dropped after the write timeout even though hyper
/// never polls its body: its engine request is aborted and its sequence given back, and the
/// body ends with an error instead of `[DONE]`.
#[tokio::test]
async fn an_unread_stream_is_dropped_after_the_write_timeout() {
    let write_timeout = Duration::from_millis(300);
    // More chunks than the stream's queue holds, then nothing.
    let script = vec![EngineEvent::Tokens(text_tokens()); 100];
    let engine = ScriptedEngine::new(script, 1);
    let app = engine.router_with_write_timeout(write_timeout);
    let unread = post(&app, "/v1/chat/completions", chat_body(true)).await;
    assert_eq!(unread.status(), StatusCode::OK);
    assert_eq!(engine.admitted(), 1);
    let until = tokio::time::Instant::now() + write_timeout + Duration::from_secs(2);
    while engine.admitted() > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(engine.admitted(), 0, "released within the write timeout");
    assert_eq!(engine.abandoned(), 1, "its engine request aborted");
    let next = post(&app, "/v1/chat/completions", chat_body(true)).await;
    assert_eq!(next.status(), StatusCode::OK, "its room is free again");
    let read = axum::body::to_bytes(unread.into_body(), 1 << 20).await;
    assert!(read.is_err(), "the body ends with an error, not [DONE]");
}

/// A web page can POST `text/plain` without a CORS preflight: such a body is refused, and so
/// is any request from an origin not allowed; a listed origin gets the CORS headers.
#[tokio::test]
async fn pages_cannot_drive_the_api_unless_their_origin_is_allowed() {
    let engine = ScriptedEngine::new(answer(None), 4);
    let app = engine.router();
    let send = |app: &Router, content_type: &str, origin: Option<&str>| {
        let mut request = Request::post("/v1/chat/completions")
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(chat_body(false).to_string()))
            .unwrap();
        if let Some(origin) = origin {
            request
                .headers_mut()
                .insert(header::ORIGIN, origin.parse().unwrap());
        }
        app.clone().oneshot(request)
    };
    let plain = send(&app, "text/plain", None).await.unwrap();
    assert_eq!(plain.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let v: Value = serde_json::from_str(&body_text(plain).await).unwrap();
    assert_eq!(v["error"]["code"], "unsupported_media_type");
    let foreign = send(&app, "application/json", Some("http://evil.example"))
        .await
        .unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
    let v: Value = serde_json::from_str(&body_text(foreign).await).unwrap();
    assert_eq!(v["error"]["code"], "forbidden_origin");
    assert!(engine.submitted().is_empty(), "neither reached the engine");
    // The normal client is unaffected.
    let normal = send(&app, "application/json; charset=utf-8", None)
        .await
        .unwrap();
    assert_eq!(normal.status(), StatusCode::OK);

    let mut state = support::state(engine.clone(), Duration::from_secs(10));
    state.allowed_origins =
        api_server::origin::AllowedOrigins(vec!["http://localhost:3000".to_owned()].into());
    let app = api_server::routes::router(state, api_server::auth::ApiKey(None));
    let listed = send(&app, "application/json", Some("http://localhost:3000"))
        .await
        .unwrap();
    assert_eq!(listed.status(), StatusCode::OK);
    assert_eq!(
        listed.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "http://localhost:3000"
    );
    let preflight = Request::options("/v1/chat/completions")
        .header(header::ORIGIN, "http://localhost:3000")
        .body(Body::empty())
        .unwrap();
    let preflight = app.clone().oneshot(preflight).await.unwrap();
    assert_eq!(preflight.status(), StatusCode::NO_CONTENT);
    let other = send(&app, "application/json", Some("http://localhost:3001"))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::FORBIDDEN);
}

//! Routes through an in-process engine (no sockets): how engine events become HTTP output.

mod support;

use api_server::engine::{EngineEvent, EngineFailure, Finished};
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use proto::tp_api::Usage as EngineUsage;
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
            usage: Some(EngineUsage {
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
    assert_eq!(
        engine.abandoned(),
        1,
        "the dropped stream's request is aborted"
    );
    let admitted = post(&app, "/v1/chat/completions", chat_body(true)).await;
    assert_eq!(admitted.status(), StatusCode::OK);
}

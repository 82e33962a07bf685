//! Bad input gets the OpenAI error envelope with a fitting 4xx status, never a 5xx or a crash.
//! In-process through the router; the engine is unreachable, which no bad request gets to.

mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

struct Case {
    name: &'static str,
    method: Method,
    path: &'static str,
    body: Body,
    content_length: Option<String>,
    auth: Option<&'static str>,
    want: StatusCode,
    code: Option<&'static str>,
}

fn post(name: &'static str, path: &'static str, body: impl Into<String>, want: StatusCode) -> Case {
    let body: String = body.into();
    Case {
        name,
        method: Method::POST,
        path,
        content_length: Some(body.len().to_string()),
        body: Body::from(body),
        auth: None,
        want,
        code: None,
    }
}

fn completion(name: &'static str, fields: Value, want: StatusCode) -> Case {
    let mut body = json!({"model": support::SERVED, "prompt": "Hello"});
    for (k, v) in fields.as_object().unwrap() {
        body[k] = v.clone();
    }
    post(name, "/v1/completions", body.to_string(), want)
}

fn chat(name: &'static str, body: Value, want: StatusCode) -> Case {
    post(name, "/v1/chat/completions", body.to_string(), want)
}

fn with_code(mut case: Case, code: &'static str) -> Case {
    case.code = Some(code);
    case
}

fn cases() -> Vec<Case> {
    let bad = StatusCode::BAD_REQUEST;
    let schema = StatusCode::BAD_REQUEST;
    let deep = format!("{{\"prompt\": {}1{}}}", "[".repeat(5000), "]".repeat(5000));
    let long_prompt: Vec<u32> = vec![504; 9000];
    let user = |c: &str| json!({"role": "user", "content": c});
    vec![
        with_code(
            post("invalid json", "/v1/completions", "{\"prompt\": ", bad),
            "invalid_json",
        ),
        post("empty body", "/v1/completions", "", bad),
        post("array body", "/v1/completions", "[1, 2]", bad),
        post("string body", "/v1/completions", "\"hello\"", bad),
        post("number body", "/v1/completions", "42", bad),
        post("null body", "/v1/completions", "null", bad),
        post(
            "NaN literal",
            "/v1/completions",
            r#"{"prompt": "x", "temperature": NaN}"#,
            bad,
        ),
        post(
            "overflowing number",
            "/v1/completions",
            r#"{"prompt": "x", "temperature": 1e999}"#,
            bad,
        ),
        post(
            "trailing garbage",
            "/v1/completions",
            r#"{"prompt": "x"} {}"#,
            bad,
        ),
        with_code(
            post("deeply nested", "/v1/completions", deep, bad),
            "invalid_json",
        ),
        Case {
            body: Body::from(vec![b'{', 0xff, 0xfe, b'}']),
            content_length: Some("4".into()),
            ..post("invalid utf-8", "/v1/completions", "", bad)
        },
        with_code(
            completion("missing prompt", json!({"prompt": null}), schema),
            "invalid_schema",
        ),
        completion("prompt is a number", json!({"prompt": 5}), schema),
        completion("prompt is an object", json!({"prompt": {"a": 1}}), schema),
        completion("empty prompt", json!({"prompt": ""}), bad),
        completion("empty prompt list", json!({"prompt": []}), bad),
        completion(
            "token id outside vocab",
            json!({"prompt": [1, 2, 999999]}),
            bad,
        ),
        completion("negative token id", json!({"prompt": [-1]}), bad),
        with_code(
            completion(
                "unknown model",
                json!({"model": "gpt-4"}),
                StatusCode::NOT_FOUND,
            ),
            "model_not_found",
        ),
        completion("model is a number", json!({"model": 3}), schema),
        with_code(
            completion("negative temperature", json!({"temperature": -0.5}), bad),
            "invalid_value",
        ),
        completion("temperature too high", json!({"temperature": 7.5}), bad),
        completion(
            "temperature as string",
            json!({"temperature": "hot"}),
            schema,
        ),
        completion("top_p zero", json!({"top_p": 0.0}), bad),
        completion("top_p above one", json!({"top_p": 1.5}), bad),
        completion("top_k negative", json!({"top_k": -5}), bad),
        completion("top_k fractional", json!({"top_k": 2.5}), schema),
        completion("n zero", json!({"n": 0}), bad),
        completion("n over the cap", json!({"n": 1000}), bad),
        completion("max_tokens zero", json!({"max_tokens": 0}), bad),
        // Every number at its type's limits: a 4xx with a sensible message, never an overflow.
        with_code(
            completion("max_tokens i64::MAX", json!({"max_tokens": i64::MAX}), bad),
            "context_length_exceeded",
        ),
        completion(
            "max_tokens u64::MAX",
            json!({"max_tokens": u64::MAX}),
            schema,
        ),
        completion("max_tokens i64::MIN", json!({"max_tokens": i64::MIN}), bad),
        completion("n i64::MAX", json!({"n": i64::MAX}), bad),
        completion(
            "prompts × n over the per-request cap",
            json!({"prompt": ["a", "b", "c", "d", "e"], "n": 16}),
            bad,
        ),
        completion("65 prompts", json!({"prompt": vec!["a"; 65]}), bad),
        completion("n i64::MIN", json!({"n": i64::MIN}), bad),
        completion("top_k i64::MAX", json!({"top_k": i64::MAX}), bad),
        completion("top_k i64::MIN", json!({"top_k": i64::MIN}), bad),
        completion(
            "temperature f64::MAX",
            json!({"temperature": f64::MAX}),
            bad,
        ),
        completion("top_p f64::MIN_POSITIVE", json!({"top_p": -f64::MAX}), bad),
        completion(
            "stop token id past u32",
            json!({"stop_token_ids": [u64::from(u32::MAX) + 1]}),
            bad,
        ),
        with_code(
            chat(
                "max_completion_tokens i64::MAX",
                json!({"messages": [user("Hi")], "max_completion_tokens": i64::MAX}),
                bad,
            ),
            "context_length_exceeded",
        ),
        completion("max_tokens negative", json!({"max_tokens": -3}), bad),
        with_code(
            completion(
                "max_tokens past the context",
                json!({"max_tokens": 100000}),
                bad,
            ),
            "context_length_exceeded",
        ),
        with_code(
            completion(
                "prompt longer than the context",
                json!({"prompt": long_prompt}),
                bad,
            ),
            "context_length_exceeded",
        ),
        completion("too many stop strings", json!({"stop": vec!["a"; 40]}), bad),
        completion(
            "stop string too long",
            json!({"stop": "x".repeat(1000)}),
            bad,
        ),
        completion("stop is a number", json!({"stop": 4}), schema),
        completion(
            "stop token outside vocab",
            json!({"stop_token_ids": [10_000_000]}),
            bad,
        ),
        completion("seed as string", json!({"seed": "abc"}), schema),
        completion("stream as string", json!({"stream": "yes"}), schema),
        completion(
            "stream_options without stream",
            json!({"stream_options": {"include_usage": true}}),
            bad,
        ),
        completion("logprobs past 20", json!({"logprobs": 21}), bad),
        completion("logprobs negative", json!({"logprobs": -1}), bad),
        completion("logprobs as string", json!({"logprobs": "3"}), bad),
        completion("echo as string", json!({"echo": "yes"}), schema),
        completion(
            "presence penalty past 2",
            json!({"presence_penalty": 2.5}),
            bad,
        ),
        completion("too many prompts", json!({"prompt": vec!["hi"; 100]}), bad),
        chat(
            "chat without messages",
            json!({"model": support::SERVED}),
            schema,
        ),
        chat("chat with empty messages", json!({"messages": []}), bad),
        chat(
            "chat top_logprobs without logprobs",
            json!({"messages": [user("hi")], "top_logprobs": 2}),
            bad,
        ),
        chat(
            "chat top_logprobs past 20",
            json!({"messages": [user("hi")], "logprobs": true, "top_logprobs": 21}),
            bad,
        ),
        chat(
            "chat messages not a list",
            json!({"messages": "hi"}),
            schema,
        ),
        chat(
            "chat message without role",
            json!({"messages": [{"content": "hi"}]}),
            schema,
        ),
        chat(
            "chat unknown role",
            json!({"messages": [{"role": "wizard", "content": "hi"}]}),
            bad,
        ),
        chat(
            "chat image part",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            bad,
        ),
        chat(
            "chat unknown model",
            json!({"model": "nope", "messages": [user("hi")]}),
            StatusCode::NOT_FOUND,
        ),
        chat(
            "chat max_completion_tokens past context",
            json!({"messages": [user("hi")], "max_completion_tokens": 9000}),
            bad,
        ),
        chat(
            "chat top_p negative",
            json!({"messages": [user("hi")], "top_p": -1}),
            bad,
        ),
        chat(
            "chat tools",
            json!({"messages": [user("hi")], "tools": [{"type": "function"}]}),
            bad,
        ),
        Case {
            content_length: Some((10 * 1024 * 1024).to_string()),
            ..with_code(
                post(
                    "declared body over the cap",
                    "/v1/completions",
                    "{}",
                    StatusCode::PAYLOAD_TOO_LARGE,
                ),
                "body_too_large",
            )
        },
        Case {
            content_length: None,
            body: Body::from_stream(futures::stream::iter(
                (0..200).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 1024]))),
            )),
            ..post(
                "chunked body over the cap",
                "/v1/completions",
                "",
                StatusCode::PAYLOAD_TOO_LARGE,
            )
        },
        with_code(
            Case {
                method: Method::GET,
                ..post(
                    "unknown route",
                    "/v1/nonexistent",
                    "",
                    StatusCode::NOT_FOUND,
                )
            },
            "unknown_url",
        ),
        Case {
            method: Method::GET,
            ..post(
                "wrong method",
                "/v1/completions",
                "",
                StatusCode::METHOD_NOT_ALLOWED,
            )
        },
    ]
}

async fn check(app: &axum::Router, case: Case) {
    let mut builder = Request::builder().method(case.method).uri(case.path);
    if let Some(len) = &case.content_length {
        builder = builder.header("content-length", len);
    }
    builder = builder.header("content-type", "application/json");
    if let Some(auth) = case.auth {
        builder = builder.header("authorization", auth);
    }
    let response = app
        .clone()
        .oneshot(builder.body(case.body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(
        status,
        case.want,
        "{}: {}",
        case.name,
        String::from_utf8_lossy(&body)
    );
    let v: Value =
        serde_json::from_slice(&body).unwrap_or_else(|_| panic!("{}: not JSON", case.name));
    let error = v["error"]
        .as_object()
        .unwrap_or_else(|| panic!("{}: no envelope", case.name));
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        case.name
    );
    assert!(error["type"].is_string(), "{}", case.name);
    assert!(
        error.contains_key("param") && error.contains_key("code"),
        "{}",
        case.name
    );
    if let Some(code) = case.code {
        assert_eq!(error["code"], code, "{}", case.name);
    }
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        !message.contains("-9223372036854775808") && !message.contains("-9223372036854775807"),
        "{}: the message shows an overflow: {message}",
        case.name
    );
}

#[tokio::test]
async fn malformed_requests_get_4xx_envelopes() {
    let app = support::offline_router(None);
    let cases = cases();
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    for case in cases {
        check(&app, case).await;
    }
}

#[tokio::test]
async fn api_key_guards_every_route_but_health() {
    let app = support::offline_router(Some("sk-secret"));
    let ok_body = json!({"prompt": "Hello"}).to_string();
    for (auth, want) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some("Bearer wrong"), StatusCode::UNAUTHORIZED),
        (Some("sk-secret"), StatusCode::UNAUTHORIZED),
        (Some("Bearer sk-secret-and-more"), StatusCode::UNAUTHORIZED),
        // Authorized: passes auth and reaches the (absent) engine.
        (Some("Bearer sk-secret"), StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let case = Case {
            auth,
            ..post("auth", "/v1/completions", ok_body.clone(), want)
        };
        check(&app, case).await;
    }
    let case = Case {
        method: Method::GET,
        ..post(
            "models without key",
            "/v1/models",
            "",
            StatusCode::UNAUTHORIZED,
        )
    };
    check(&app, case).await;
    // /health needs no key (and is not ready: no engine).
    let case = Case {
        method: Method::GET,
        ..post("health", "/health", "", StatusCode::SERVICE_UNAVAILABLE)
    };
    check(&app, case).await;
}

#[tokio::test]
async fn valid_request_without_engine_is_503_not_a_hang() {
    let app = support::offline_router(None);
    let case = completion("no engine", json!({}), StatusCode::SERVICE_UNAVAILABLE);
    check(&app, with_code(case, "engine_unavailable")).await;
    // The client is told when to come back.
    let response = app
        .clone()
        .oneshot(
            Request::builder()
                .method(Method::POST)
                .uri("/v1/completions")
                .header("content-type", "application/json")
                .body(Body::from(json!({"prompt": "Hi"}).to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
}

#[tokio::test]
async fn models_lists_the_served_model() {
    let app = support::offline_router(None);
    let response = app
        .oneshot(Request::get("/v1/models").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], support::SERVED);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["max_model_len"], 8192);
}

//! Minimal OpenAI-API client helpers over raw HTTP (the tests check raw JSON, not a client's
//! interpretation of it).

use futures::StreamExt;
use serde_json::{json, Value};

pub const MODEL: &str = "SmolLM2-135M-Instruct";

/// What one streamed completion delivered.
#[derive(Debug, Default, Clone)]
pub struct Streamed {
    pub text: String,
    pub chunks: Vec<Value>,
    pub finish_reason: Option<String>,
    pub speculate_metrics: Option<Value>,
    /// An `error` object sent on the stream.
    pub error: Option<Value>,
    pub done: bool,
    pub http_status: u16,
}

pub fn completion_body(prompt: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

/// A new client identity (API key) for each request the helpers send: the tests model many
/// users, and one client alone may hold only the batch slots less one request's share
/// (`tests/fair_admission.rs` tests that rule with its own keys).
fn user() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("test-user-{n}")
}

/// Non-streaming completion; returns (HTTP status, body).
pub async fn complete(http: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let resp = http
        .post(url)
        .bearer_auth(user())
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Streams a completion to its end (or `on_chunk` returning false, which drops the connection
/// as a disconnecting client would).
pub async fn stream(
    http: &reqwest::Client,
    url: &str,
    body: &Value,
    mut on_chunk: impl FnMut(&Value) -> bool,
) -> Streamed {
    let mut out = Streamed::default();
    let resp = match http.post(url).bearer_auth(user()).json(body).send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(json!({"transport": e.to_string()}));
            return out;
        }
    };
    out.http_status = resp.status().as_u16();
    if out.http_status != 200 {
        out.error = resp.json().await.ok();
        return out;
    }
    let mut bytes = resp.bytes_stream();
    let mut buf = String::new();
    while let Some(piece) = bytes.next().await {
        let Ok(piece) = piece else {
            out.error = Some(json!({"transport": "stream broke"}));
            return out;
        };
        buf.push_str(&String::from_utf8_lossy(&piece));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data: ") else {
                    continue;
                };
                if data.trim() == "[DONE]" {
                    out.done = true;
                    return out;
                }
                let v: Value = serde_json::from_str(data).unwrap();
                if v.get("error").is_some() {
                    out.error = Some(v["error"].clone());
                }
                if let Some(choice) = v["choices"].get(0) {
                    if let Some(t) = choice["text"].as_str() {
                        out.text.push_str(t);
                    }
                    if let Some(t) = choice["delta"]["content"].as_str() {
                        out.text.push_str(t);
                    }
                    if let Some(r) = choice["finish_reason"].as_str() {
                        out.finish_reason = Some(r.to_string());
                    }
                    if !choice["speculate_metrics"].is_null() {
                        out.speculate_metrics = Some(choice["speculate_metrics"].clone());
                    }
                }
                let keep_going = on_chunk(&v);
                out.chunks.push(v);
                if !keep_going {
                    return out;
                }
            }
        }
    }
    out
}

/// Posts `body` to `path` on `port` from a socket with a 4 KiB receive buffer, and reads nothing:
/// a client that stopped reading. Returns the socket (the caller decides when, if ever, to read).
pub async fn post_unread(port: u16, path: &str, body: &Value) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket
        .connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap();
    let text = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        text.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(text.as_bytes()).await.unwrap();
    stream
}

//! The api-server binary itself: options with env fallbacks, systemd readiness, and SIGTERM
//! draining in-flight requests before exiting 0. Runs against the fake engine.

mod support;

use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use proto::FinishReason;
use serde_json::{json, Value};
use support::{Behaviour, FakeEngine};

const BIN: &str = env!("CARGO_BIN_EXE_api-server");

fn spawn(
    engine: &FakeEngine,
    port: u16,
    extra: &[&str],
    notify: Option<&std::path::Path>,
) -> ApiServer {
    let mut cmd = Command::new(BIN);
    cmd.arg("--model")
        .arg(support::model_path())
        .args(["--port", &port.to_string()])
        .args(["--worker-endpoints", &engine.worker_endpoint])
        .args(["--tp-endpoint", &engine.tp_endpoint])
        .args([
            "--heartbeat-interval-ms",
            &support::INTERVAL.as_millis().to_string(),
        ])
        .args(extra)
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(path) = notify {
        cmd.env("NOTIFY_SOCKET", path);
    }
    ApiServer(cmd.spawn().unwrap())
}

/// The api-server under test, killed when dropped: a failing assertion leaves no process behind.
struct ApiServer(Child);

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The api-server with one setting in whole seconds (what a test derives its bounds from).
fn spawn_with(engine: &FakeEngine, port: u16, flag: &str, setting: Duration) -> ApiServer {
    spawn(engine, port, &[flag, &setting.as_secs().to_string()], None)
}

async fn wait_healthy(port: u16) {
    support::wait_until(
        Duration::from_secs(20),
        "api-server healthy",
        || async move {
            reqwest::get(format!("http://127.0.0.1:{port}/health"))
                .await
                .is_ok_and(|r| r.status() == 200)
        },
    )
    .await;
}

fn sigterm(child: &ApiServer) {
    assert!(Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap()
        .success());
}

async fn wait_exit(child: &mut ApiServer, timeout: Duration) -> Option<i32> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            return status.code();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "api-server did not exit within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn help_documents_env_fallbacks() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for env in [
        "SPECULA_API_PORT",
        "SPECULA_MODEL",
        "SPECULA_WORKER_ENDPOINTS",
        "SPECULA_TP_ENDPOINT",
        "SPECULA_API_KEY",
        "SPECULA_MAX_MODEL_LEN",
        "SPECULA_REQUEST_TIMEOUT_SECS",
        "SPECULA_API_SERVER_ID",
    ] {
        assert!(help.contains(&format!("[env: {env}")), "--help lacks {env}");
    }
}

#[tokio::test]
async fn notifies_systemd_ready_once_healthy() {
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let dir = std::env::temp_dir().join(format!("specula-api-notify-{}", support::free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let port = support::free_port();
    let child = spawn(&engine, port, &[], Some(&path));
    let message = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .unwrap();
    assert!(message.contains("READY=1"), "{message}");
    // Ready means healthy.
    let health = reqwest::get(format!("http://127.0.0.1:{port}/health"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_then_exits_zero() {
    let tokens = support::load_model()
        .tokenizer
        .encode("The capital of France is Paris.")
        .unwrap();
    let behaviour = Behaviour::Paced {
        tokens,
        finish: FinishReason::Length,
        delay: Duration::from_millis(100),
    };
    let engine = FakeEngine::start(behaviour, 2).await;
    let port = support::free_port();
    let grace = Duration::from_secs(20);
    let mut child = spawn_with(&engine, port, "--shutdown-grace-secs", grace);
    wait_healthy(port).await;
    let url = format!("http://127.0.0.1:{port}/v1/completions");
    let in_flight = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&json!({"prompt": "Hi", "max_tokens": 50}))
            .send()
            .await
    });
    support::wait_until(Duration::from_secs(5), "request at the engine", || async {
        !engine.adds().is_empty()
    })
    .await;
    sigterm(&child);
    let response = in_flight
        .await
        .unwrap()
        .expect("in-flight request answered");
    assert_eq!(response.status(), 200);
    let v: Value = response.json().await.unwrap();
    assert_eq!(v["choices"][0]["text"], "The capital of France is Paris.");
    // Nothing is left in flight: it exits long before the grace period would end.
    assert_eq!(wait_exit(&mut child, support::SLACK).await, Some(0));
}

#[tokio::test]
async fn sigterm_grace_period_bounds_a_request_that_never_ends() {
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let port = support::free_port();
    let grace = Duration::from_secs(1);
    let mut child = spawn_with(&engine, port, "--shutdown-grace-secs", grace);
    wait_healthy(port).await;
    let url = format!("http://127.0.0.1:{port}/v1/completions");
    let _in_flight = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&json!({"prompt": "Hi", "max_tokens": 2000}))
            .send()
            .await
    });
    support::wait_until(Duration::from_secs(5), "request at the engine", || async {
        !engine.adds().is_empty()
    })
    .await;
    sigterm(&child);
    assert_eq!(wait_exit(&mut child, grace + support::SLACK).await, Some(0));
    let id = engine.adds()[0].id;
    support::wait_until(support::SLACK, "abort sent on exit", || async {
        engine.aborts().contains(&id)
    })
    .await;
}

/// Reads until the server closes the connection; returns how long that took (None: still open
/// after `limit`).
fn time_to_close(stream: &mut std::net::TcpStream, limit: Duration) -> Option<Duration> {
    use std::io::Read;
    let started = std::time::Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(started.elapsed())
            }
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn slow_and_idle_clients_are_disconnected_and_others_still_served() {
    use std::io::Write;
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let port = support::free_port();
    let header_timeout = Duration::from_secs(1);
    let mut child = spawn_with(&engine, port, "--http-header-timeout-secs", header_timeout);
    wait_healthy(port).await;
    let addr = format!("127.0.0.1:{port}");

    // 300 idle connections (never a byte), and one client that sends half a request line.
    let idle: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /health HT").unwrap();

    // Others are still served at once.
    let started = std::time::Instant::now();
    let health = reqwest::get(format!("http://{addr}/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    assert!(started.elapsed() < support::SLACK);

    let closed = tokio::task::spawn_blocking(move || {
        let limit = header_timeout + support::SLACK;
        let slow_closed = time_to_close(&mut slow, limit);
        let idle_closed = idle
            .into_iter()
            .map(|mut s| time_to_close(&mut s, limit))
            .filter(Option::is_some)
            .count();
        (slow_closed, idle_closed)
    })
    .await
    .unwrap();
    assert!(
        closed
            .0
            .is_some_and(|t| t < header_timeout + support::SLACK),
        "a half-sent request line is cut off: {:?}",
        closed.0
    );
    assert_eq!(closed.1, 300, "idle connections are closed");
    sigterm(&child);
    assert_eq!(wait_exit(&mut child, support::SLACK).await, Some(0));
}

/// Writes `request` on a fresh connection and returns the status line of the answer (empty
/// when the server closed without one).
/// The whole response to `request` as text: until the server closes, or `limit` passes
/// without a byte.
fn response_text(addr: &str, request: &[u8], limit: Duration) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(limit)).unwrap();
    stream.write_all(request).unwrap();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test]
async fn a_trickled_body_gets_408_and_a_heavy_body_is_served() {
    let engine = FakeEngine::start(
        Behaviour::Complete {
            tokens: vec![504, 504],
            finish: FinishReason::Length,
        },
        2,
    )
    .await;
    let port = support::free_port();
    let body_timeout = Duration::from_secs(1);
    let mut child = spawn_with(&engine, port, "--http-body-timeout-secs", body_timeout);
    wait_healthy(port).await;
    let addr = format!("127.0.0.1:{port}");

    // Headers promise 1,000 bytes; ten come, then nothing: 408 once the body deadline passes.
    let started = std::time::Instant::now();
    let head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Content-Length: 1000\r\n\r\n{\"prompt\":";
    let addr_408 = addr.clone();
    let response = tokio::task::spawn_blocking(move || {
        response_text(&addr_408, head.as_bytes(), Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert!(response.starts_with("HTTP/1.1 408"), "{response:?}");
    // The OpenAI error object, as JSON, saying what happened: exactly its four fields.
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_default();
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("content-type: application/json")),
        "{head}"
    );
    let envelope: serde_json::Value = serde_json::from_str(body.trim())
        .unwrap_or_else(|e| panic!("408 body is not JSON ({e}): {response:?}"));
    assert_eq!(
        envelope,
        serde_json::json!({"error": {
            "message": "the request body did not arrive within 1 s",
            "type": "invalid_request_error",
            "param": null,
            "code": "body_timeout",
        }}),
        "{response:?}"
    );
    assert!(
        started.elapsed() < body_timeout + support::SLACK,
        "{:?}",
        started.elapsed()
    );

    // A body over the heavy threshold (padded with JSON whitespace) is parsed and tokenized off
    // the runtime, and answered like any other.
    let padding = " ".repeat(api_server::body::HEAVY_BODY_BYTES + 1);
    let body = format!(r#"{{"prompt": "Hello", "max_tokens": 2{padding}}}"#);
    let resp = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    sigterm(&child);
    assert_eq!(wait_exit(&mut child, support::SLACK).await, Some(0));
}

/// A client that writes its whole oversized body before reading (as Python's `http.client`
/// does) still reads the 413.
#[tokio::test]
async fn an_oversized_body_written_whole_still_gets_its_413() {
    let engine = FakeEngine::start(Behaviour::Trickle { token: 504 }, 2).await;
    let port = support::free_port();
    let mut child = spawn(&engine, port, &["--max-body-bytes", "65536"], None);
    wait_healthy(port).await;
    let addr = format!("127.0.0.1:{port}");
    let line = tokio::task::spawn_blocking(move || {
        use std::io::{BufRead, BufReader, Write};
        let len = 32 << 20;
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..len / chunk.len() {
            stream
                .write_all(&chunk)
                .expect("the server reads the body it refuses (no reset)");
        }
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    assert!(line.starts_with("HTTP/1.1 413"), "{line:?}");
    sigterm(&child);
    assert_eq!(wait_exit(&mut child, support::SLACK).await, Some(0));
}

//! A token-processor started in this process through the library (`TokenProcessor::start`):
//! `/metrics` answers on the address it reports, and `stop` ends it.

use std::io::{Read, Write};
use std::time::Duration;

use clap::Parser;
use token_processor::serve::{ServeConfig, TokenProcessor};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeConfig,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status line of `GET path`.
fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_token_processor_serves_metrics_and_stops() {
    let ingest = format!("tcp://127.0.0.1:{}", free_port());
    let api = format!("tcp://127.0.0.1:{}", free_port());
    let port = free_port().to_string();
    let config = Cli::parse_from([
        "token-processor",
        "--ingest-endpoint",
        &ingest,
        "--api-endpoint",
        &api,
        "--metrics-port",
        &port,
    ])
    .serve;
    let running = TokenProcessor::start(config).await.expect("starts");
    let addr = running.http_addr();
    let status = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
        .await
        .unwrap();
    assert!(status.contains("200"), "{status}");
    tokio::time::timeout(Duration::from_secs(10), running.stop())
        .await
        .expect("stops in time");
}

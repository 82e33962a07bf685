//! A worker started in this process through the library (`Worker::start`) on the default
//! model: it reaches ready, and a drain stops it, its links and its step loop.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use engine_worker::worker::{Worker, WorkerConfig};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    worker: WorkerConfig,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The options the binary would get, on free loopback ports (no token-processor listens).
fn config() -> WorkerConfig {
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let api = format!("tcp://127.0.0.1:{}", free_port());
    let tp = format!("tcp://127.0.0.1:{}", free_port());
    Cli::parse_from([
        "engine-worker",
        "--model",
        model.to_str().unwrap(),
        "--api-endpoint",
        &api,
        "--tp-endpoint",
        &tp,
        "--num-kv-blocks",
        "64",
        "--max-model-len",
        "256",
        "--drain-timeout-secs",
        "1",
    ])
    .worker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_worker_loads_serves_and_stops_on_drain() {
    let starting = Worker::start(config()).await.expect("starts");
    assert!(!starting.status().is_ready(), "ready before loading");
    let running = tokio::time::timeout(Duration::from_secs(120), starting.loaded())
        .await
        .expect("loads in time")
        .expect("loads");
    assert!(running.status().is_ready());
    assert!(running.status().accepting());
    let status = running.status().clone();
    tokio::time::timeout(Duration::from_secs(30), running.drain_and_stop())
        .await
        .expect("stops within the drain bound");
    assert!(!status.accepting(), "still takes requests after the drain");
}

#[tokio::test]
async fn options_at_odds_refuse_to_start() {
    let mut config = config();
    config.engine.ngram_min = 5;
    let err = Worker::start(config).await.err().expect("refused");
    assert!(err.to_string().contains("--ngram-min"), "{err}");
}

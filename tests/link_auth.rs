//! Links that require the shared secret (`--link-secret-file`, tcp on loopback here): the stack
//! serves through authenticated links; a stranger without the secret, or with a wrong one, is
//! dropped before its hello reaches the protocol (the refusing gate logs it, and nothing is
//! answered); one that proves the secret but says hello with
//! a live peer's id is refused; and a process whose endpoint is reachable from other hosts will
//! not start without a secret.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::openai::{complete, completion_body};
use common::stack::{Proc, Stack, StackConfig};
use common::timing::{self, PATIENCE};
use common::wait_until;
use link::auth::{Secret, DROPPED_FRAME_LOG};
use proto::api_worker::{ApiHello, ApiToWorker, WorkerToApi};
use proto::auth::LinkAuth;
use proto::tp_api::ApiToTp;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const LIVE_API_ID: &str = "api-live";

async fn stranger(endpoint: &str) -> DealerSocket {
    let mut s = DealerSocket::new();
    s.connect(endpoint).await.expect("connect");
    s
}

async fn send(s: &mut DealerSocket, frame: Vec<u8>) {
    s.send(ZmqMessage::from(frame)).await.unwrap();
}

/// The next frame within `wait`, if any.
async fn next(s: &mut DealerSocket, wait: Duration) -> Option<Vec<u8>> {
    let msg = tokio::time::timeout(wait, s.recv()).await.ok()?.ok()?;
    Some(msg.into_vec().pop()?.to_vec())
}

fn api_hello(id: &str) -> Vec<u8> {
    proto::encode(&ApiToWorker::Hello(ApiHello {
        protocol_version: proto::PROTOCOL_VERSION,
        api_server_id: id.into(),
        epoch: 42,
    }))
    .unwrap()
}

/// A stack whose links all require the secret (tcp on loopback); the secret file's directory.
async fn secret_stack(tag: &str) -> (Stack, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("specula-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("link.secret");
    std::fs::write(&secret_file, b"correct horse battery staple, twice\n").unwrap();
    let secret_arg = vec![
        "--link-secret-file".to_string(),
        secret_file.display().to_string(),
    ];
    let stack = Stack::start(StackConfig {
        tcp: true,
        worker_args: secret_arg.clone(),
        tp_args: secret_arg.clone(),
        api_args: [
            secret_arg.clone(),
            vec!["--api-server-id".into(), LIVE_API_ID.into()],
        ]
        .concat(),
        ..StackConfig::default()
    })
    .await;
    (stack, dir)
}

/// 5,000 connections that say `Begin` and never prove anything, to the worker's endpoint: the
/// api-server, admitted before them, is never forgotten by the worker's gate; `/health` stays
/// 200 throughout and a request succeeds afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_unproven_connections_push_out_no_admitted_peer() {
    const STRANGERS: usize = 5000;
    const AT_ONCE: usize = 100;
    let (stack, dir) = secret_stack("link-flood").await;
    let worker = stack.endpoint("worker-0");
    let url = stack.api("/v1/completions");
    let begin = proto::encode(&LinkAuth::Begin).unwrap();
    for round in 0..STRANGERS / AT_ONCE {
        let wave = (0..AT_ONCE).map(|_| {
            let (worker, begin) = (worker.clone(), begin.clone());
            async move {
                let mut s = stranger(&worker).await;
                send(&mut s, begin).await;
                // Wait for the challenge, so the gate holds this connection as unproven.
                next(&mut s, Duration::from_secs(5)).await
            }
        });
        let challenged = futures::future::join_all(wave).await;
        assert!(challenged.iter().all(Option::is_some), "round {round}");
        if round % 10 == 9 {
            assert_eq!(stack.status(&stack.api("/health")).await, Some(200));
        }
    }
    assert_eq!(stack.status(&stack.api("/health")).await, Some(200));
    let (status, v) = complete(stack.client(), &url, &completion_body("Count:", 4, false)).await;
    assert_eq!(status, 200, "{v}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_peers_that_prove_the_secret_are_heard() {
    let (stack, dir) = secret_stack("link-auth").await;
    let secret_file = dir.join("link.secret");
    // Served through authenticated links.
    let url = stack.api("/v1/completions");
    let (status, v) = complete(stack.client(), &url, &completion_body("Count:", 4, false)).await;
    assert_eq!(status, 200, "{v}");

    // A peer that answers a hello does so within a heartbeat round and a liveness window.
    let quiet = timing::liveness().window() + timing::liveness().interval;
    let worker = stack.endpoint("worker-0");
    let said = |p: Proc, line: &str| stack.log(p).matches(line).count();
    // No secret: the worker's gate drops the hello and says so (its first drop is logged at
    // once), and nothing comes back.
    let before = said(Proc::EngineWorker, DROPPED_FRAME_LOG);
    let mut s = stranger(&worker).await;
    send(&mut s, api_hello("stranger")).await;
    wait_until(PATIENCE, "the worker's gate to drop the hello", || async {
        said(Proc::EngineWorker, DROPPED_FRAME_LOG) > before
    })
    .await;
    assert_eq!(
        next(&mut s, quiet).await,
        None,
        "a hello without proof was answered"
    );
    // The token-processor's api endpoint likewise.
    let before = said(Proc::TokenProcessor, DROPPED_FRAME_LOG);
    let mut t = stranger(&stack.endpoint("tp-api")).await;
    let hello = ApiToTp::Hello(ApiHello {
        protocol_version: proto::PROTOCOL_VERSION,
        api_server_id: "stranger".into(),
        epoch: 1,
    });
    send(&mut t, proto::encode(&hello).unwrap()).await;
    wait_until(
        PATIENCE,
        "the token-processor's gate to drop the hello",
        || async { said(Proc::TokenProcessor, DROPPED_FRAME_LOG) > before },
    )
    .await;
    assert_eq!(
        next(&mut t, quiet).await,
        None,
        "the token-processor answered a stranger"
    );

    // A wrong secret: challenged, its proof refused (the worker says so), its hello dropped.
    let failed_proof = "a connection failed to prove the link secret";
    let before = said(Proc::EngineWorker, failed_proof);
    let mut w = stranger(&worker).await;
    send(&mut w, proto::encode(&LinkAuth::Begin).unwrap()).await;
    let challenge: LinkAuth =
        proto::decode(&next(&mut w, quiet).await.expect("a challenge")).unwrap();
    assert!(
        matches!(challenge, LinkAuth::Challenge { .. }),
        "{challenge:?}"
    );
    send(
        &mut w,
        proto::encode(&LinkAuth::Proof { mac: vec![0; 32] }).unwrap(),
    )
    .await;
    wait_until(PATIENCE, "the worker to refuse the wrong proof", || async {
        said(Proc::EngineWorker, failed_proof) > before
    })
    .await;
    send(&mut w, api_hello("stranger")).await;
    assert_eq!(
        next(&mut w, quiet).await,
        None,
        "a wrong proof was accepted"
    );

    // The right secret: heard. With the live api-server's id its hello is refused.
    let secret = Secret::load(&secret_file).unwrap();
    let mut ok = stranger(&worker).await;
    link::auth::prove(&mut ok, &secret).await.expect("proved");
    send(&mut ok, api_hello(LIVE_API_ID)).await;
    let mut refused = false;
    while let Some(frame) = next(&mut ok, timing::detection_bound()).await {
        if let Ok(WorkerToApi::Refused { reason }) = proto::decode::<WorkerToApi>(&frame) {
            assert!(reason.contains(LIVE_API_ID), "{reason}");
            refused = true;
            break;
        }
    }
    assert!(refused, "a hello with a live peer's id must be refused");
    // And with an id of its own it is answered with the worker's hello.
    send(&mut ok, api_hello("api-other")).await;
    let mut answered = false;
    while let Some(frame) = next(&mut ok, timing::detection_bound()).await {
        if matches!(
            proto::decode::<WorkerToApi>(&frame),
            Ok(WorkerToApi::Hello(_))
        ) {
            answered = true;
            break;
        }
    }
    assert!(answered, "a proved peer with its own id is heard");

    // The stack kept serving.
    let (status, v) = complete(stack.client(), &url, &completion_body("Count:", 4, false)).await;
    assert_eq!(status, 200, "{v}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_endpoint_reachable_from_other_hosts_needs_a_secret_to_start() {
    let port = common::free_port();
    let out = Command::new(common::binary("token-processor"))
        .args(["--ingest-endpoint", &format!("tcp://0.0.0.0:{port}")])
        .args([
            "--api-endpoint",
            &format!("tcp://127.0.0.1:{}", common::free_port()),
        ])
        .args(["--metrics-port", &common::free_port().to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--link-secret-file"), "{stderr}");
    assert!(
        stderr.contains(&format!("tcp://0.0.0.0:{port}")),
        "{stderr}"
    );
}

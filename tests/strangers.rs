//! A local process without the link secret, on the default stack's ipc endpoints (which need
//! none), tries to act for the peers it can reach while four greedy streams run: it says hello
//! to the worker as an api-server of its own (learning the worker's id and epoch), adds a
//! request owned by the live api-server, then on the token-processor's ingest endpoint sends a
//! goodbye for the worker, a heartbeat announcing a seq near 2^64, and a hello of the worker's
//! live epoch. Each attempt is refused or ignored: every stream ends as it would have, with the
//! text of a run without the stranger, and `/metrics` counts the foreign frames.

mod common;

use std::time::Duration;

use common::openai::{completion_body, stream};
use common::stack::{metric_sum, Stack, StackConfig};
use common::timing;
use proto::api_worker::{AddRequest, ApiHello, ApiToWorker, RejectReason, WorkerToApi};
use proto::worker_tp::{Heartbeat, TpToWorker, WorkerHello, WorkerToTp};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const LIVE_API_ID: &str = "api-live";

async fn send(s: &mut DealerSocket, frame: Vec<u8>) {
    s.send(ZmqMessage::from(frame)).await.unwrap();
}

/// Frames until `pick` takes one, within `wait`.
async fn next_matching<T: serde::de::DeserializeOwned, R>(
    s: &mut DealerSocket,
    wait: Duration,
    mut pick: impl FnMut(T) -> Option<R>,
) -> Option<R> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let msg = tokio::time::timeout_at(deadline, s.recv())
            .await
            .ok()?
            .ok()?;
        let frame = msg.into_vec().pop()?;
        if let Some(found) = proto::decode::<T>(&frame).ok().and_then(&mut pick) {
            return Some(found);
        }
    }
}

/// Says hello to the worker as api-server `intruder`; returns the worker's hello.
async fn worker_hello(worker: &mut DealerSocket) -> WorkerHello {
    let hello = ApiToWorker::Hello(ApiHello {
        protocol_version: proto::PROTOCOL_VERSION,
        api_server_id: "intruder".into(),
        epoch: 1,
    });
    send(worker, proto::encode(&hello).unwrap()).await;
    next_matching(
        worker,
        timing::detection_bound(),
        |m: WorkerToApi| match m {
            WorkerToApi::Hello(h) => Some(h),
            _ => None,
        },
    )
    .await
    .expect("the worker answers an api-server's hello")
}

/// Adds a request owned by the live api-server; returns why the worker refused it.
async fn foreign_add(worker: &mut DealerSocket) -> RejectReason {
    let add = ApiToWorker::Add(AddRequest {
        id: 77,
        prompt_token_ids: vec![1, 2, 3],
        sampling: proto::api_worker::SamplingParams::GREEDY,
        stop: Default::default(),
        max_tokens: 4,
        arrival_unix_ms: 0,
        owner: LIVE_API_ID.into(),
        class: "other".into(),
    });
    send(worker, proto::encode(&add).unwrap()).await;
    next_matching(
        worker,
        timing::detection_bound(),
        |m: WorkerToApi| match m {
            WorkerToApi::Rejected { id: 77, reason } => Some(reason),
            _ => None,
        },
    )
    .await
    .expect("a request with another api-server as owner is refused")
}

/// On the ingest endpoint: a goodbye, a heartbeat near 2^64 and a hello of the live epoch
/// without the session, each as the worker. Returns the answer to the hello.
async fn act_for_the_worker(stack: &Stack, hello: &WorkerHello) -> Option<TpToWorker> {
    let mut tp = DealerSocket::new();
    tp.connect(&stack.endpoint("tp-ingest")).await.unwrap();
    let goodbye = WorkerToTp::Goodbye {
        worker_id: hello.worker_id.clone(),
        epoch: hello.epoch,
    };
    send(&mut tp, proto::encode(&goodbye).unwrap()).await;
    let beat = WorkerToTp::Heartbeat(Heartbeat::idle(
        hello.worker_id.clone(),
        hello.epoch,
        u64::MAX - 1,
    ));
    send(&mut tp, proto::encode(&beat).unwrap()).await;
    send(
        &mut tp,
        proto::encode(&WorkerToTp::Hello(hello.clone())).unwrap(),
    )
    .await;
    next_matching(
        &mut tp,
        timing::detection_bound(),
        |m: TpToWorker| match m {
            TpToWorker::Refused { .. } => Some(m),
            _ => None,
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stranger_on_the_ipc_endpoints_cannot_end_stall_or_feed_a_workers_streams() {
    let stack = Stack::start(StackConfig {
        api_args: vec!["--api-server-id".into(), LIVE_API_ID.into()],
        spec_policy: "fixed",
        proposer: "ngram",
        ..StackConfig::default()
    })
    .await;
    let url = stack.api("/v1/completions");
    let prompts = common::prompts(4);
    let bodies: Vec<_> = prompts
        .iter()
        .map(|p| completion_body(p, 48, true))
        .collect();
    // Without the stranger: the reference texts.
    let mut reference = Vec::new();
    for body in &bodies {
        reference.push(stream(stack.client(), &url, body, |_| true).await.text);
    }

    let streams = bodies.iter().map(|body| {
        let (http, url, body) = (stack.client().clone(), url.clone(), body.clone());
        tokio::spawn(async move { stream(&http, &url, &body, |_| true).await })
    });
    let streams: Vec<_> = streams.collect();
    let mut worker = DealerSocket::new();
    worker.connect(&stack.endpoint("worker-0")).await.unwrap();
    let hello = worker_hello(&mut worker).await;
    assert_eq!(
        hello.session, 0,
        "api-servers never see the worker's session"
    );
    let refused = foreign_add(&mut worker).await;
    assert!(matches!(refused, RejectReason::Invalid(_)), "{refused:?}");
    let answer = act_for_the_worker(&stack, &hello).await;
    assert!(
        matches!(answer, Some(TpToWorker::Refused { .. })),
        "a hello of the live epoch from another connection: {answer:?}"
    );

    for (i, task) in streams.into_iter().enumerate() {
        let got = task.await.unwrap();
        assert!(got.error.is_none(), "stream {i}: {:?}", got.error);
        assert!(got.done, "stream {i} ended without [DONE]");
        assert_eq!(got.text, reference[i], "stream {i} changed");
    }
    let metrics = stack.metrics_text().await;
    assert!(
        metric_sum(&metrics, "specula_worker_frames_foreign_total") >= 3.0,
        "the goodbye, the heartbeat and the hello are counted"
    );
    assert_eq!(metric_sum(&metrics, "specula_workers_lost_total"), 0.0);
}

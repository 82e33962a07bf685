//! The real engine-worker binary on free loopback ports, with this test playing the
//! token-processor (ROUTER, acknowledging heartbeats) and an api-server (DEALER): readiness in
//! the hello, a request served and reported in numbered step batches, refusal of a bad request,
//! heartbeats while the model loads, a ready hello + resync after it, every batch acknowledged, a stalled link (acknowledgements stop)
//! detected and resynced, abort of a silent api-server's requests, and a SIGTERM drain that says
//! at once it takes no new requests and ends with a goodbye and exit status 0.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proto::api_worker::{
    AddRequest, ApiHello, ApiToWorker, RejectReason, SamplingParams, StopConditions, WorkerToApi,
};
use proto::worker_tp::{Heartbeat, TpToWorker, WorkerToTp};
use proto::FinishReason;
use zeromq::{DealerSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// The worker's heartbeat interval: the default, so silence is 1.5 s, far above how long a
/// saturated 2-core machine delays the worker's I/O thread (100 ms made it abort live requests).
const HEARTBEAT_MS: u64 = 500;
/// How long the worker may go unscheduled while it saturates both cores of a 2-core machine: the
/// margin every bound adds.
const SLACK: Duration = Duration::from_secs(3);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Inbox<T> = tokio::sync::mpsc::UnboundedReceiver<T>;

/// The token-processor: a ROUTER whose messages arrive through a channel (a receive loop of its
/// own, so no select! ever cancels a socket receive). Like the real one it acknowledges every
/// heartbeat, while `acking` holds.
async fn bind_tp(
    endpoint: &str,
    acking: Arc<AtomicBool>,
) -> (Inbox<WorkerToTp>, tokio::task::JoinHandle<()>) {
    let mut router = RouterSocket::new();
    let mut bound = false;
    for _ in 0..100 {
        if router.bind(endpoint).await.is_ok() {
            bound = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(bound, "cannot bind the token-processor endpoint");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok(msg) = router.recv().await {
            let frames = msg.into_vec();
            let decoded: WorkerToTp = proto::decode(frames.last().unwrap()).unwrap();
            if let WorkerToTp::Heartbeat(hb) = &decoded {
                if acking.load(Ordering::SeqCst) {
                    let ack = TpToWorker::Ack {
                        epoch: hb.epoch,
                        next_seq: hb.next_seq,
                    };
                    let mut reply = ZmqMessage::from(proto::encode(&ack).unwrap());
                    reply.push_front(frames[0].clone());
                    let _ = router.send(reply).await;
                }
            }
            if tx.send(decoded).is_err() {
                break;
            }
        }
    });
    (rx, task)
}

async fn recv_tp(inbox: &mut Inbox<WorkerToTp>) -> WorkerToTp {
    tokio::time::timeout(Duration::from_secs(30), inbox.recv())
        .await
        .expect("tp message in time")
        .unwrap()
}

struct Api {
    send: tokio::sync::mpsc::UnboundedSender<ApiToWorker>,
    inbox: Inbox<WorkerToApi>,
}

async fn connect_api(endpoint: &str) -> Api {
    let mut dealer = DealerSocket::new();
    dealer.connect(endpoint).await.unwrap();
    let (in_tx, inbox) = tokio::sync::mpsc::unbounded_channel();
    let (send, mut out_rx) = tokio::sync::mpsc::unbounded_channel::<ApiToWorker>();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                msg = dealer.recv() => {
                    let Ok(msg) = msg else { break };
                    let _ = in_tx.send(proto::decode(msg.into_vec().last().unwrap()).unwrap());
                }
                out = out_rx.recv() => {
                    let Some(out) = out else { break };
                    // Once the worker exited there is no one to send to; the caller waits
                    // on what it expected to hear.
                    let _ = dealer.send(ZmqMessage::from(proto::encode(&out).unwrap())).await;
                }
            }
        }
    });
    Api { send, inbox }
}

async fn recv_api(api: &mut Api, wait: Duration) -> Option<WorkerToApi> {
    tokio::time::timeout(wait, api.inbox.recv()).await.ok()?
}

/// Queues `msg` for the worker. Once the worker has exited (after its drain) the socket task has
/// ended and there is no one to send to: the caller still reads what the worker said last.
async fn send_api(api: &mut Api, msg: &ApiToWorker) {
    let _ = api.send.send(msg.clone());
}

/// Sends `heartbeat` until the worker's heartbeat reports `want` retained requests.
/// Heartbeats to the api-server until one satisfies `want` (named `what` in the failure).
async fn heartbeat_where(
    what: &str,
    want: impl Fn(&Heartbeat) -> bool,
    api: &mut Api,
    heartbeat: &ApiToWorker,
) -> Heartbeat {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "heartbeats never said {what}"
        );
        send_api(api, heartbeat).await;
        if let Some(WorkerToApi::Heartbeat(hb)) = recv_api(api, Duration::from_millis(100)).await {
            if want(&hb) {
                return hb;
            }
        }
    }
}

async fn retained_becomes(want: u32, api: &mut Api, heartbeat: &ApiToWorker) -> Heartbeat {
    let what = format!("retained = {want}");
    heartbeat_where(&what, |hb| hb.retained == want, api, heartbeat).await
}

/// The engine-worker binary on the default model, with its two endpoints.
fn worker_command(api_endpoint: &str, tp_endpoint: &str) -> Command {
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut command = Command::new(env!("CARGO_BIN_EXE_engine-worker"));
    command
        .arg("--model")
        .arg(model)
        .args(["--api-endpoint", api_endpoint])
        .args(["--tp-endpoint", tp_endpoint]);
    command
}

fn add(id: u64, prompt: Vec<u32>, max_tokens: u32) -> ApiToWorker {
    ApiToWorker::Add(AddRequest {
        id,
        prompt_token_ids: prompt,
        sampling: SamplingParams::GREEDY,
        stop: StopConditions {
            ignore_eos: true,
            ..StopConditions::default()
        },
        max_tokens,
        arrival_unix_ms: 1,
        owner: "api-test".into(),
        class: "other".into(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_serves_resyncs_aborts_and_drains() {
    let (api_port, tp_port) = (free_port(), free_port());
    let tp_endpoint = format!("tcp://127.0.0.1:{tp_port}");
    let acking = Arc::new(AtomicBool::new(true));
    let (mut pull, _tp_task) = bind_tp(&tp_endpoint, acking.clone()).await;
    let child = worker_command(&format!("tcp://127.0.0.1:{api_port}"), &tp_endpoint)
        .args([
            "--heartbeat-interval-ms",
            &HEARTBEAT_MS.to_string(),
            "--num-spec-tokens",
            "4",
            "--drain-timeout-secs",
            "20",
        ])
        .args(["--worker-id", "w-test", "--num-kv-blocks", "128"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let worker = Worker(child);

    // The api-server side: hello until the worker says it is ready, heartbeats meanwhile.
    let mut dealer = connect_api(&format!("tcp://127.0.0.1:{api_port}")).await;
    let hello = ApiToWorker::Hello(ApiHello {
        protocol_version: proto::PROTOCOL_VERSION,
        api_server_id: "api-test".into(),
        epoch: 7,
    });
    let heartbeat = ApiToWorker::Heartbeat {
        api_server_id: "api-test".into(),
        epoch: 7,
    };
    let mut ready = false;
    for _ in 0..300 {
        send_api(&mut dealer, &hello).await;
        if let Some(WorkerToApi::Hello(h)) = recv_api(&mut dealer, Duration::from_millis(200)).await
        {
            assert_eq!(h.worker_id, "w-test");
            if h.ready {
                assert_eq!(h.num_spec_tokens, 4);
                ready = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "worker never became ready");

    // A bad request is refused outright.
    send_api(&mut dealer, &add(1, vec![], 4)).await;
    loop {
        match recv_api(&mut dealer, Duration::from_secs(10))
            .await
            .expect("rejection")
        {
            WorkerToApi::Rejected { id, reason } => {
                assert_eq!(id, 1);
                assert!(matches!(reason, RejectReason::Invalid(_)));
                break;
            }
            _ => continue,
        }
    }

    // The token-processor side: a not-ready hello, heartbeats while the model loads (a silent
    // load longer than the liveness window got the worker declared dead), then a ready hello
    // and the resync.
    let mut epoch = None;
    let mut hello_ready = None;
    let mut beats_while_loading = 0;
    let mut resynced = false;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(3 * HEARTBEAT_MS) + SLACK;
    while !resynced {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no resync after the hello"
        );
        match recv_tp(&mut pull).await {
            WorkerToTp::Hello(h) => {
                epoch = Some(h.epoch);
                hello_ready = Some(h.ready);
            }
            WorkerToTp::Heartbeat(hb) if hello_ready == Some(false) => {
                assert_eq!(hb.next_seq, 0, "a batch numbered while loading");
                beats_while_loading += 1;
            }
            WorkerToTp::Resync(r) => {
                assert_eq!(Some(r.epoch), epoch, "resync follows a hello");
                assert_eq!(hello_ready, Some(true), "the resync's hello says ready");
                resynced = true;
            }
            _ => {}
        }
    }
    assert!(
        beats_while_loading > 0,
        "no heartbeat while the model loaded"
    );

    // A request runs to its max_tokens, reported in batches numbered without holes.
    let prompt = vec![1, 9690, 198, 2683, 359, 253, 5356, 2683, 359, 253, 5356];
    send_api(&mut dealer, &add(2, prompt.clone(), 12)).await;
    send_api(&mut dealer, &heartbeat).await;
    let mut tokens = Vec::new();
    let mut next_seq = None;
    let mut finish = None;
    let mut heartbeat_timer = tokio::time::interval(Duration::from_millis(100));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while finish.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "request 2 did not finish in time"
        );
        tokio::select! {
            _ = heartbeat_timer.tick() => send_api(&mut dealer, &heartbeat).await,
            msg = recv_tp(&mut pull) => if let WorkerToTp::Step(batch) = msg {
                batch.validate(4).unwrap();
                if let Some(n) = next_seq { assert_eq!(batch.seq, n) }
                next_seq = Some(batch.seq + 1);
                for row in batch.rows().filter(|r| r.id == 2) {
                    tokens.extend_from_slice(row.tokens);
                    finish = row.finish;
                }
            },
        }
    }
    assert_eq!(finish, Some(FinishReason::Length));
    assert_eq!(tokens.len(), 12);

    // The finished request is kept (heartbeats say so) until the api-server acknowledges it.
    let hb = retained_becomes(1, &mut dealer, &heartbeat).await;
    assert!(hb.retained_bytes >= 12 * 4, "{hb:?}");
    send_api(&mut dealer, &ApiToWorker::Delivered { ids: vec![2] }).await;
    let hb = retained_becomes(0, &mut dealer, &heartbeat).await;
    assert_eq!((hb.retained_bytes, hb.retained_evicted), (0, 0));

    // Every batch sent is acknowledged by the token-processor, and the heartbeats say so.
    let hb = heartbeat_where(
        "every batch acknowledged",
        |hb| hb.tp_link_up && hb.tp_acked_seq == hb.next_seq && hb.next_seq > 0,
        &mut dealer,
        &heartbeat,
    )
    .await;
    assert_eq!(Some(hb.next_seq), next_seq, "{hb:?}");

    // The token-processor stops acknowledging (paused or wedged, its socket still open): within
    // the liveness window plus a heartbeat the worker gives up the connection, reconnects, and
    // says hello and resyncs; its heartbeats report the link down meanwhile.
    acking.store(false, Ordering::SeqCst);
    let stalled_at = tokio::time::Instant::now();
    let window = Duration::from_millis(3 * HEARTBEAT_MS);
    let mut hello_again = None;
    while hello_again.is_none() {
        assert!(
            stalled_at.elapsed() < 2 * window + SLACK,
            "no reconnect after the acknowledgements stopped"
        );
        tokio::select! {
            _ = heartbeat_timer.tick() => send_api(&mut dealer, &heartbeat).await,
            msg = recv_tp(&mut pull) => if let WorkerToTp::Hello(_) = msg {
                hello_again = Some(stalled_at.elapsed());
            },
        }
    }
    let detected = hello_again.unwrap();
    // The last acknowledgement came up to one interval before `stalled_at`; the two processes'
    // timers may differ by a few milliseconds (seen: 1.3 ms), far below the interval.
    let interval = Duration::from_millis(HEARTBEAT_MS);
    let timer_skew = Duration::from_millis(20);
    assert!(
        detected + interval + timer_skew > window,
        "reconnected before the window passed: {detected:?}"
    );
    loop {
        match recv_tp(&mut pull).await {
            WorkerToTp::Resync(r) => {
                assert_eq!(r.next_seq, hb.next_seq, "nothing ran meanwhile");
                break;
            }
            WorkerToTp::Step(b) => panic!("a batch before the resync: {b:?}"),
            // Its counter would read as a gap to a token-processor that expects the old
            // connection's next batch (it failed every request so).
            WorkerToTp::Heartbeat(h) => panic!("a heartbeat before the resync: {h:?}"),
            _ => {}
        }
    }
    heartbeat_where(
        "the link down",
        |hb| !hb.tp_link_up,
        &mut dealer,
        &heartbeat,
    )
    .await;
    acking.store(true, Ordering::SeqCst);
    heartbeat_where(
        "the link up again",
        |hb| hb.tp_link_up,
        &mut dealer,
        &heartbeat,
    )
    .await;
    eprintln!("stall detected and resynced {detected:?} after the acknowledgements stopped");

    // A long request; then the api-server falls silent. Long enough to outlast the silence
    // with room to spare: the repetitive prompt drafts well, and 400 tokens finished within
    // the window (so there was nothing left to abort) once verify steps got faster. 2,000
    // tokens take over 6 s at 5 tokens a step; with the prompt they fill 126 of the 128 KV
    // blocks.
    send_api(&mut dealer, &add(3, prompt.clone(), 2000)).await;
    // Silence from the api-server for 3 intervals aborts its requests.
    let mut aborted = false;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(3 * HEARTBEAT_MS) + SLACK;
    while !aborted {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the silent api-server's request was not aborted in time"
        );
        if let WorkerToTp::Step(batch) = recv_tp(&mut pull).await {
            aborted = batch
                .rows()
                .any(|r| r.id == 3 && r.finish == Some(FinishReason::Abort));
        }
    }

    // Back from its silence, the api-server says hello again and is heard: the worker takes
    // requests.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no hello back after the api-server's silence"
        );
        send_api(&mut dealer, &hello).await;
        if let Some(WorkerToApi::Hello(_)) = recv_api(&mut dealer, Duration::from_millis(200)).await
        {
            break;
        }
    }
    heartbeat_where("accepting", |hb| hb.accepting, &mut dealer, &heartbeat).await;

    // SIGTERM: the api-server hears at once that the worker takes no new requests (so it routes
    // none there), then drain, goodbye, exit 0.
    let pid = worker.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    heartbeat_where(
        "not accepting (draining)",
        |hb| !hb.accepting,
        &mut dealer,
        &heartbeat,
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20) + SLACK;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no goodbye within the drain timeout"
        );
        if let WorkerToTp::Goodbye { worker_id, .. } = recv_tp(&mut pull).await {
            assert_eq!(worker_id, "w-test");
            break;
        }
    }
    let mut worker = worker;
    let status = tokio::task::spawn_blocking(move || {
        for _ in 0..200 {
            if let Some(status) = worker.0.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    })
    .await
    .unwrap()
    .expect("worker exits after its goodbye");
    assert!(status.success(), "{status:?}");
}

/// A `--kv-cache-memory` that cannot hold one sequence of the maximum context: the worker exits
/// non-zero at start, saying how much it has, how much one sequence needs, and what to give.
#[test]
fn a_kv_budget_below_one_full_sequence_refuses_to_start() {
    let (api_port, tp_port) = (free_port(), free_port());
    let output = worker_command(
        &format!("tcp://127.0.0.1:{api_port}"),
        &format!("tcp://127.0.0.1:{tp_port}"),
    )
    .args(["--kv-cache-memory", "32MiB", "--max-model-len", "2048"])
    .args(["--kv-cache-dtype", "f16"])
    .output()
    .unwrap();
    assert!(!output.status.success(), "the worker started");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // 32 MiB at 368,640 B an f16 block (16 tokens × 23,040 B) is 91 blocks; 2,048 tokens need
    // 128.
    for number in [
        "33554432 B",
        "91 KV blocks",
        "the 128",
        "2048 tokens",
        "47185920 B",
    ] {
        assert!(
            stderr.contains(number),
            "{number:?} missing from:\n{stderr}"
        );
    }
}

//! The real `token-processor` binary on free loopback ports, driven over real ZeroMQ by a fake
//! engine-worker and two fake api-servers: `/health` before and after the worker's hello,
//! per-owner forwarding, `/metrics` (checked by `promtool` when installed), heartbeat loss, and
//! SIGTERM.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::api_worker::ApiHello;
use proto::tp_api::{ApiToTp, OutputErrorKind, RequestOutput, TpToApi};
use proto::worker_tp::{
    Heartbeat, RequestStart, Resync, StepBatch, StepRow, TpToWorker, WorkerHello, WorkerToTp,
};
use proto::FinishReason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const WORKER: &str = "w-test";
const HEARTBEAT_MS: u32 = 200;

/// How long a process may go unscheduled on a loaded 2-core machine: the margin every bound adds.
const SLACK: Duration = Duration::from_secs(3);

/// From a fake worker's silence to the token-processor acting on it and a test seeing it: the
/// liveness window, a heartbeat, slack.
fn detection_bound() -> Duration {
    let rule = link::Liveness::new(Duration::from_millis(u64::from(HEARTBEAT_MS)));
    rule.window() + rule.interval + SLACK
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills the child if the test fails midway.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// Polls `/health` until it answers `want` (or fails the test after `within`).
async fn wait_health(port: u16, want: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some((status, body)) = http_get(port, "/health").await {
            if status == want {
                return body;
            }
        }
        assert!(Instant::now() < deadline, "/health never answered {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn send(socket: &mut impl SocketSend, msg: &impl serde::Serialize) {
    socket
        .send(ZmqMessage::from(proto::encode(msg).unwrap()))
        .await
        .unwrap();
}

/// A fake api-server: a task owns its DEALER socket, heartbeats every 50 ms as a real
/// api-server does (so the test's own pauses never make the token-processor forget it), and
/// hands every `Outputs` message to the test.
struct FakeApi {
    name: &'static str,
    outputs: tokio::sync::mpsc::Receiver<Vec<RequestOutput>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeApi {
    /// Connects and waits for the token-processor's hello in answer to ours.
    async fn connect(endpoint: &str, name: &'static str) -> FakeApi {
        let mut api = DealerSocket::new();
        api.connect(endpoint).await.unwrap();
        send(
            &mut api,
            &ApiToTp::Hello(ApiHello {
                protocol_version: proto::PROTOCOL_VERSION,
                api_server_id: name.into(),
                epoch: 1,
            }),
        )
        .await;
        let msg = tokio::time::timeout(Duration::from_secs(5), api.recv())
            .await
            .expect("TP hello")
            .unwrap();
        assert!(matches!(
            proto::decode::<TpToApi>(msg.get(0).unwrap()).unwrap(),
            TpToApi::Hello(_)
        ));
        let (tx, outputs) = tokio::sync::mpsc::channel(64);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let hb = ApiToTp::Heartbeat { api_server_id: name.into(), epoch: 1 };
                        send(&mut api, &hb).await;
                    }
                    msg = api.recv() => {
                        match proto::decode::<TpToApi>(msg.unwrap().get(0).unwrap()).unwrap() {
                            TpToApi::Outputs(out) => {
                                if tx.send(out).await.is_err() {
                                    return;
                                }
                            }
                            TpToApi::Hello(_) => {}
                            TpToApi::Refused { reason } => panic!("{name} refused: {reason}"),
                            TpToApi::AskHello => {
                                let hello = ApiToTp::Hello(ApiHello {
                                    protocol_version: proto::PROTOCOL_VERSION,
                                    api_server_id: name.into(),
                                    epoch: 1,
                                });
                                send(&mut api, &hello).await;
                            }
                        }
                    }
                }
            }
        });
        FakeApi {
            name,
            outputs,
            task,
        }
    }

    /// The next `Outputs` message this api-server receives.
    async fn next_outputs(&mut self) -> Vec<RequestOutput> {
        // Outputs follow a batch at once, or a worker's death once it is detected.
        tokio::time::timeout(detection_bound(), self.outputs.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no outputs for {} within {:?}",
                    self.name,
                    detection_bound()
                )
            })
            .expect("fake api-server task ended")
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One row: id, tokens, drafted, accepted, prefill, finish.
type Row<'a> = (u64, &'a [u32], u8, u8, bool, Option<FinishReason>);

fn batch(epoch: u64, seq: u64, rows: &[Row<'_>], starts: &[(u64, &str)]) -> WorkerToTp {
    let mut b = StepBatch::new(WORKER.into(), epoch, seq);
    for &(id, tokens, d, a, prefill, finish) in rows {
        if let Some(&(_, owner)) = starts.iter().find(|s| s.0 == id) {
            b.starts.push(RequestStart {
                row: b.len() as u32,
                owner: owner.into(),
                prompt_tokens: 5,
                cached_prompt_tokens: 2,
                arrival_unix_ms: 0,
                class: String::new(),
            });
        }
        b.push(StepRow {
            id,
            tokens,
            drafted: d,
            accepted: a,
            offered: d,
            predicted_milli: 0,
            prefill,
            preempted: false,
            finish,
            logprobs: &[],
            prompt_logprobs: &[],
        });
    }
    WorkerToTp::Step(b)
}

/// A fake engine-worker: its DEALER socket and next sequence number, shared with a task that
/// heartbeats as a live worker does until [`FakeWorker::fall_silent`]. Without it, any pause of
/// the test itself longer than three intervals (a cold `promtool` start on a loaded CI machine)
/// would look like a dead worker and fail the next step.
struct FakeWorker {
    epoch: u64,
    link: Arc<tokio::sync::Mutex<(DealerSocket, u64)>>,
    heartbeats: tokio::task::JoinHandle<()>,
}

/// The hello of process `epoch` of the fake worker, drafting with `proposer`.
fn worker_hello(epoch: u64, proposer: &str, draft_kv_bytes: u64) -> WorkerHello {
    WorkerHello {
        protocol_version: proto::PROTOCOL_VERSION,
        worker_id: WORKER.into(),
        epoch,
        model: "smol".into(),
        num_spec_tokens: 4,
        proposer: proposer.into(),
        ready: true,
        heartbeat_interval_ms: HEARTBEAT_MS,
        max_model_len: 2048,
        kv_capacity_tokens: 32_768,
        kv_bytes: 1_509_949_440,
        draft_kv_bytes,
        max_num_seqs: 16,
        session: 7,
    }
}

impl FakeWorker {
    /// Connects, says `hello` and resyncs (no requests), then starts heartbeating.
    async fn connect(endpoint: &str, hello: WorkerHello) -> FakeWorker {
        let (epoch, id) = (hello.epoch, hello.worker_id.clone());
        let mut socket = DealerSocket::new();
        socket.connect(endpoint).await.unwrap();
        send(&mut socket, &WorkerToTp::Hello(hello)).await;
        let resync = Resync {
            worker_id: id.clone(),
            epoch,
            next_seq: 0,
            requests: vec![],
        };
        send(&mut socket, &WorkerToTp::Resync(resync)).await;
        let link = Arc::new(tokio::sync::Mutex::new((socket, 0u64)));
        let beating = link.clone();
        let heartbeats = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(HEARTBEAT_MS as u64 / 2));
            loop {
                tick.tick().await;
                let mut guard = beating.lock().await;
                let (socket, next_seq) = &mut *guard;
                let hb = Heartbeat::idle(id.clone(), epoch, *next_seq);
                send(socket, &WorkerToTp::Heartbeat(hb)).await;
            }
        });
        FakeWorker {
            epoch,
            link,
            heartbeats,
        }
    }

    /// Pushes the next step batch; the sequence number and the send are one atomic step, so a
    /// heartbeat never announces a sequence number whose batch is not on the wire yet.
    async fn step(&self, rows: &[Row<'_>], starts: &[(u64, &str)]) {
        let mut guard = self.link.lock().await;
        let (socket, next_seq) = &mut *guard;
        send(socket, &batch(self.epoch, *next_seq, rows, starts)).await;
        *next_seq += 1;
    }

    /// Waits until the token-processor acknowledges every batch below `seq` (its answers to
    /// our heartbeats); the lock is taken per attempt so heartbeats go on meanwhile.
    async fn acked_through(&self, seq: u64) -> TpToWorker {
        // An acknowledgement answers our next heartbeat.
        let deadline = tokio::time::Instant::now() + detection_bound();
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no acknowledgement of batch {} within {:?}",
                seq.saturating_sub(1),
                detection_bound()
            );
            let mut guard = self.link.lock().await;
            let recv = tokio::time::timeout(Duration::from_millis(20), guard.0.recv()).await;
            drop(guard);
            let Ok(Ok(msg)) = recv else { continue };
            let reply: TpToWorker = proto::decode(msg.get(0).unwrap()).unwrap();
            if let TpToWorker::Ack { next_seq, .. } = reply {
                if next_seq >= seq {
                    return reply;
                }
            }
        }
    }

    /// Says goodbye, as a worker that shuts down does, and stops heartbeating.
    async fn goodbye(&self, worker_id: &str) {
        self.heartbeats.abort();
        let mut guard = self.link.lock().await;
        let goodbye = WorkerToTp::Goodbye {
            worker_id: worker_id.into(),
            epoch: self.epoch,
        };
        send(&mut guard.0, &goodbye).await;
    }

    /// Stops heartbeating, as a hung or killed worker does.
    async fn fall_silent(&self) {
        self.heartbeats.abort();
        // Take the lock once so a heartbeat in progress has finished before we return.
        let _ = self.link.lock().await;
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .unwrap_or_else(|| panic!("series {series} missing from:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_tracks_forwards_exports_and_shuts_down() {
    let (ingest_port, api_port, http_port) = (free_port(), free_port(), free_port());
    let ingest = format!("tcp://127.0.0.1:{ingest_port}");
    let api_endpoint = format!("tcp://127.0.0.1:{api_port}");
    let child = Command::new(env!("CARGO_BIN_EXE_token-processor"))
        .args([
            "--ingest-endpoint",
            &ingest,
            "--api-endpoint",
            &api_endpoint,
        ])
        .args([
            "--metrics-port",
            &http_port.to_string(),
            "--max-spec-tokens",
            "4",
            "--heartbeat-interval-ms",
            "100",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn token-processor");
    let mut guard = Guard(child);

    // Before any worker: serving, but not healthy.
    let body = wait_health(http_port, 503, Duration::from_secs(20)).await;
    assert!(body.contains("no engine-worker"), "{body}");
    let (status, text) = http_get(http_port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        text.contains("specula_step_batches_unknown_worker_total 0"),
        "process-wide counters exported at 0 from startup:\n{text}"
    );
    assert!(
        !text.contains("specula_spec_decode"),
        "no acceptance series before a worker said hello (they carry model and worker):\n{text}"
    );

    let mut api_a = FakeApi::connect(&api_endpoint, "api-a").await;
    let mut api_b = FakeApi::connect(&api_endpoint, "api-b").await;

    let worker = FakeWorker::connect(&ingest, worker_hello(1, "ngram", 0)).await;
    let body = wait_health(http_port, 200, Duration::from_secs(5)).await;
    assert_eq!(
        body,
        format!("ok: 1 worker(s) alive\nworker={WORKER} model=smol proposer=ngram num_spec_tokens=4 kv_capacity_tokens=32768 kv_bytes=1509949440 draft_kv_bytes=0 \
                 kv_blocks_used=0 kv_blocks_cached=0 kv_blocks_free=0\n")
    );

    // Request 1 (api-a) and 2 (api-b): prefill, two verification steps, finish.
    worker
        .step(
            &[(1, &[10], 0, 0, true, None), (2, &[20], 0, 0, true, None)],
            &[(1, "api-a"), (2, "api-b")],
        )
        .await;
    worker
        .step(
            &[
                (1, &[11, 12, 13], 4, 2, false, None),
                (2, &[21], 3, 0, false, None),
            ],
            &[],
        )
        .await;
    worker
        .step(
            &[
                (
                    1,
                    &[14, 15, 16, 17, 18],
                    4,
                    4,
                    false,
                    Some(FinishReason::Stop),
                ),
                (2, &[22, 23], 4, 1, false, Some(FinishReason::Length)),
            ],
            &[],
        )
        .await;

    // Every batch is acknowledged by sequence number in answer to the heartbeats.
    assert_eq!(
        worker.acked_through(3).await,
        TpToWorker::Ack {
            epoch: 1,
            next_seq: 3
        }
    );

    let mut got_a = Vec::new();
    while got_a
        .last()
        .is_none_or(|o: &RequestOutput| o.finish.is_none())
    {
        got_a.extend(api_a.next_outputs().await);
    }
    let mut got_b = Vec::new();
    while got_b
        .last()
        .is_none_or(|o: &RequestOutput| o.finish.is_none())
    {
        got_b.extend(api_b.next_outputs().await);
    }
    assert!(
        got_a.iter().all(|o| o.id == 1),
        "api-a got only its own request"
    );
    assert!(
        got_b.iter().all(|o| o.id == 2),
        "api-b got only its own request"
    );
    let tokens_a: Vec<u32> = got_a.iter().flat_map(|o| o.tokens.clone()).collect();
    assert_eq!(tokens_a, vec![10, 11, 12, 13, 14, 15, 16, 17, 18]);
    let fin_a = got_a.last().unwrap();
    assert_eq!(fin_a.finish, Some(FinishReason::Stop));
    assert_eq!(fin_a.usage.as_ref().unwrap().completion_tokens, 9);
    let m = fin_a.speculate_metrics.as_ref().unwrap();
    assert_eq!(
        (m.num_steps, m.accepted_tokens, m.rejected_tokens),
        (2, 8, 2)
    );
    assert_eq!(m.accept_length_histogram, vec![0, 0, 1, 0, 1]);
    assert_eq!(m.draft_length_histogram, vec![0, 0, 0, 0, 2]);

    // The aggregate counters: steps (4,2) (4,4) (3,0) (4,1).
    let (status, text) = http_get(http_port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    let labels = format!("{{model=\"smol\",worker=\"{WORKER}\"}}");
    // The spec's series carry the worker's proposer too.
    let spec = format!("{{model=\"smol\",worker=\"{WORKER}\",proposer=\"ngram\",class=\"other\"}}");
    assert_eq!(
        metric(&text, &format!("specula_spec_decode_num_steps_total{spec}")),
        4.0
    );
    assert_eq!(
        metric(
            &text,
            &format!("specula_spec_decode_num_drafts_total{spec}")
        ),
        4.0
    );
    assert_eq!(
        metric(
            &text,
            &format!("specula_spec_decode_num_draft_tokens_total{spec}")
        ),
        15.0
    );
    assert_eq!(
        metric(
            &text,
            &format!("specula_spec_decode_num_accepted_tokens_total{spec}")
        ),
        7.0
    );
    assert_eq!(
        metric(
            &text,
            &format!("specula_spec_decode_num_emitted_tokens_total{spec}")
        ),
        11.0
    );
    let pos = |i: usize| {
        format!("specula_spec_decode_num_accepted_tokens_per_pos_total{{model=\"smol\",worker=\"{WORKER}\",proposer=\"ngram\",class=\"other\",position=\"{i}\"}}")
    };
    assert_eq!(
        [0, 1, 2, 3].map(|i| metric(&text, &pos(i))),
        [3.0, 2.0, 1.0, 1.0]
    );
    let bucket = |le: &str| {
        format!("specula_spec_decode_accepted_drafts_per_step_bucket{{model=\"smol\",worker=\"{WORKER}\",proposer=\"ngram\",class=\"other\",le=\"{le}\"}}")
    };
    assert_eq!(
        ["0", "1", "2", "3", "4", "+Inf"].map(|le| metric(&text, &bucket(le))),
        [1.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    );
    let drafted = |le: &str| {
        format!("specula_spec_decode_drafted_per_step_bucket{{model=\"smol\",worker=\"{WORKER}\",proposer=\"ngram\",class=\"other\",le=\"{le}\"}}")
    };
    assert_eq!(
        ["0", "1", "2", "3", "4", "+Inf"].map(|le| metric(&text, &drafted(le))),
        [0.0, 0.0, 0.0, 1.0, 4.0, 4.0]
    );
    for line in text
        .lines()
        .filter(|l| l.starts_with("specula_spec_decode"))
    {
        assert!(
            line.contains(&format!(
                "model=\"smol\",worker=\"{WORKER}\",proposer=\"ngram\""
            )),
            "every acceptance series carries model, worker and proposer: {line}"
        );
    }
    assert_eq!(
        metric(
            &text,
            &format!("specula_requests_finished_stop_total{labels}")
        ),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            &format!("specula_requests_finished_length_total{labels}")
        ),
        1.0
    );
    assert_eq!(
        metric(&text, &format!("specula_generation_tokens_total{labels}")),
        13.0
    );
    assert_eq!(
        metric(&text, &format!("specula_prompt_tokens_total{labels}")),
        10.0
    );
    assert_eq!(
        metric(
            &text,
            &format!("specula_prefix_cache_hit_tokens_total{labels}")
        ),
        4.0
    );
    assert_eq!(metric(&text, "specula_workers_connected"), 1.0);
    assert!(text.contains("specula_time_to_first_token_seconds_bucket"));
    assert!(text.contains("specula_step_batch_processing_seconds_count"));
    promtool_check(&text);

    // A third request, then the worker falls silent: it fails as WorkerLost, health goes 503.
    worker
        .step(&[(3, &[30], 0, 0, true, None)], &[(3, "api-a")])
        .await;
    let first = api_a.next_outputs().await;
    assert_eq!(first[0].id, 3);
    worker.fall_silent().await;
    let lost = api_a.next_outputs().await;
    assert_eq!(lost[0].id, 3);
    assert_eq!(lost[0].finish, Some(FinishReason::Error));
    assert_eq!(
        lost[0].error.as_ref().unwrap().kind,
        OutputErrorKind::WorkerLost
    );
    let body = wait_health(http_port, 503, detection_bound()).await;
    assert!(body.contains("no engine-worker"), "{body}");
    assert!(
        !body.contains("worker="),
        "a lost worker leaves /health: {body}"
    );

    // The worker comes back (a new process) drafting with a draft model: /health shows its
    // proposer and the draft model's KV cache, and its acceptance series move to the new
    // proposer (the old ones retired, never beside them) while its other series go on.
    let restarted = FakeWorker::connect(&ingest, worker_hello(2, "draft:smol-q4", 6_291_456)).await;
    let body = wait_health(http_port, 200, detection_bound()).await;
    assert!(
        body.ends_with(&format!("worker={WORKER} model=smol proposer=draft:smol-q4 num_spec_tokens=4 kv_capacity_tokens=32768 kv_bytes=1509949440 draft_kv_bytes=6291456 \
                 kv_blocks_used=0 kv_blocks_cached=0 kv_blocks_free=0\n")),
        "{body}"
    );
    restarted
        .step(&[(4, &[40], 0, 0, true, None)], &[(4, "api-a")])
        .await;
    restarted
        .step(
            &[(4, &[41, 42], 4, 1, false, Some(FinishReason::Stop))],
            &[],
        )
        .await;
    restarted.acked_through(2).await;
    let (_, text) = http_get(http_port, "/metrics").await.unwrap();
    let spec = format!(
        "{{model=\"smol\",worker=\"{WORKER}\",proposer=\"draft:smol-q4\",class=\"other\"}}"
    );
    assert_eq!(
        metric(&text, &format!("specula_spec_decode_num_steps_total{spec}")),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            &format!("specula_spec_decode_num_accepted_tokens_per_pos_total{{model=\"smol\",worker=\"{WORKER}\",proposer=\"draft:smol-q4\",class=\"other\",position=\"0\"}}")
        ),
        1.0
    );
    assert!(
        !text.contains("proposer=\"ngram\""),
        "the worker's series under its old proposer are retired:\n{text}"
    );
    assert_eq!(
        metric(
            &text,
            &format!("specula_requests_finished_stop_total{labels}")
        ),
        2.0,
        "series without a proposer go on across the restart"
    );
    promtool_check(&text);

    // SIGTERM: exits 0 within the bound.
    let pid = guard.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "token-processor did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status {status}");
}

/// `promtool check metrics` on a real scrape. Skipped only outside the README's test command
/// (which runs `scripts/install-test-deps.sh`, and sets SPECULA_REQUIRE_TOOLS=1 so a missing
/// promtool fails the test instead).
fn promtool_check(text: &str) {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        assert!(
            std::env::var_os("SPECULA_REQUIRE_TOOLS").is_none(),
            "promtool not installed (scripts/install-test-deps.sh installs it)"
        );
        eprintln!("promtool not installed; skipping `promtool check metrics` (run scripts/install-test-deps.sh)");
        return;
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Workers that say hello under new ids and leave (goodbye, or silence), over and over, do not
/// grow `/metrics`: a departed worker's series are removed after `--departed-retention-secs`,
/// while a live worker's stay, however long it sends nothing but heartbeats. Before, every id
/// ever seen kept its series for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departed_workers_series_are_removed_after_the_retention() {
    let (ingest_port, api_port, http_port) = (free_port(), free_port(), free_port());
    let ingest = format!("tcp://127.0.0.1:{ingest_port}");
    let retention = Duration::from_secs(2);
    let child = Command::new(env!("CARGO_BIN_EXE_token-processor"))
        .args(["--ingest-endpoint", &ingest])
        .args(["--api-endpoint", &format!("tcp://127.0.0.1:{api_port}")])
        .args(["--metrics-port", &http_port.to_string()])
        .args(["--heartbeat-interval-ms", &HEARTBEAT_MS.to_string()])
        .args([
            "--departed-retention-secs",
            &retention.as_secs().to_string(),
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn token-processor");
    let _guard = Guard(child);
    wait_health(http_port, 503, Duration::from_secs(20)).await;
    let scrape = || async { http_get(http_port, "/metrics").await.unwrap().1 };
    let series_of = |text: &str, id: &str| {
        let label = format!("worker=\"{id}\"");
        text.lines().filter(|l| l.contains(&label)).count()
    };

    let live = FakeWorker::connect(
        &ingest,
        WorkerHello {
            worker_id: "live".into(),
            ..worker_hello(1, "ngram", 0)
        },
    )
    .await;
    wait_health(http_port, 200, detection_bound()).await;
    let per_worker = series_of(&scrape().await, "live");
    assert!(per_worker > 20, "a worker's series: {per_worker}");
    for round in 0..6 {
        let id = format!("passing-{round}");
        let hello = WorkerHello {
            worker_id: id.clone(),
            ..worker_hello(1, "ngram", 0)
        };
        let worker = FakeWorker::connect(&ingest, hello).await;
        let deadline = Instant::now() + detection_bound();
        while series_of(&scrape().await, &id) < per_worker {
            assert!(Instant::now() < deadline, "{id} never showed its series");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Half leave with a goodbye, half fall silent (declared dead).
        match round % 2 {
            0 => worker.goodbye(&id).await,
            _ => worker.fall_silent().await,
        }
    }
    // The last one is declared dead within the detection bound; then the retention runs.
    tokio::time::sleep(detection_bound() + retention + SLACK).await;
    let text = scrape().await;
    for round in 0..6 {
        let id = format!("passing-{round}");
        assert_eq!(series_of(&text, &id), 0, "{id} still has series:\n{text}");
    }
    assert_eq!(
        series_of(&text, "live"),
        per_worker,
        "the live worker keeps every series"
    );
    drop(live);
}

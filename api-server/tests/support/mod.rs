//! Test harness: the api-server's router over the real default-model tokenizer, and a fake
//! engine (a worker ROUTER and a token-processor ROUTER on real ZeroMQ sockets) whose outputs
//! are scripted, so routes, streaming, aborts and dead peers are tested without the model.

#![allow(dead_code)]

pub mod in_process;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api_server::auth::ApiKey;
use api_server::engine::{EngineClient, EngineClientConfig};
use api_server::model::ModelAssets;
use api_server::openai::validate::Limits;
use api_server::routes::{router, AppState};
use proto::api_worker::{AddRequest, ApiToWorker, WorkerToApi};
use proto::tp_api::{ApiToTp, RequestOutput, TokenCounts, TpHello, TpToApi};
use proto::worker_tp::{Heartbeat, WorkerHello};
use proto::{FinishReason, RequestId, SpeculateMetrics};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Heartbeat interval of the fakes and of the api-server under test: the product's default, so a
/// peer is dead after 1.5 s of silence. (200 ms, a 600 ms window, let a loaded 2-core machine
/// that stalled the fakes' runtime kill a live peer and turn `/health` 503 mid-test.)
pub const INTERVAL: Duration = link::DEFAULT_HEARTBEAT_INTERVAL;

/// The api-server's stall timeout and token-processor outage window under test.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(1);
pub const TP_OUTAGE_WINDOW: Duration = Duration::from_secs(1);

/// How long a test runtime may go unscheduled on a loaded 2-core machine: the one margin every
/// bound adds, and the wait for what happens at once (an abort after a disconnect).
pub const SLACK: Duration = Duration::from_secs(3);

/// From a fake peer's death to the api-server acting on it: the liveness window, a heartbeat,
/// slack.
pub fn detection_bound() -> Duration {
    link::Liveness::new(INTERVAL).window() + INTERVAL + SLACK
}

pub fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

pub fn load_model() -> Arc<ModelAssets> {
    static MODEL: std::sync::OnceLock<Arc<ModelAssets>> = std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| Arc::new(ModelAssets::load(&model_path()).expect("default model present")))
        .clone()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub const SERVED: &str = "smollm2";

pub fn state<E>(engine: E, timeout: Duration) -> AppState<E> {
    AppState {
        model: load_model(),
        served_model_name: SERVED.into(),
        model_names: vec![SERVED.to_owned()].into(),
        model_root: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        limits: Arc::new(Limits::new(8192)),
        engine,
        request_timeout: timeout,
        stream_write_timeout: Duration::from_secs(30),
        allowed_origins: Default::default(),
        body: api_server::body::BodyLimits::new(64 * 1024, Duration::from_secs(5), 2),
        started_unix: 0,
        idle_trim: Default::default(),
        request_classes: Default::default(),
    }
}

pub fn engine_config(worker_endpoints: Vec<String>, tp_endpoint: String) -> EngineClientConfig {
    let mut cfg = EngineClientConfig::new(worker_endpoints, tp_endpoint, "api-test".into());
    cfg.liveness = link::Liveness::new(INTERVAL);
    cfg.stall_timeout = STALL_TIMEOUT;
    cfg.tp_outage_window = TP_OUTAGE_WINDOW;
    cfg
}

/// A router whose engine endpoints lead nowhere (validation tests need no engine).
pub fn offline_router(api_key: Option<&str>) -> axum::Router {
    let engine = EngineClient::start(engine_config(
        vec![format!("tcp://127.0.0.1:{}", free_port())],
        format!("tcp://127.0.0.1:{}", free_port()),
    ));
    router(
        state(engine, Duration::from_secs(5)),
        ApiKey(api_key.map(Into::into)),
    )
}

/// What the fake engine does with each request.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Emit `tokens` two at a time (each output also repeating the previous one, as a resync
    /// would), then finish with `finish`.
    Complete {
        tokens: Vec<u32>,
        finish: FinishReason,
    },
    /// Emit one token every 30 ms until aborted; then a final `abort` output.
    Trickle { token: u32 },
    /// The worker refuses every request.
    Reject(proto::api_worker::RejectReason),
    /// Emit `tokens` one every `delay`, then finish with `finish`.
    Paced {
        tokens: Vec<u32>,
        finish: FinishReason,
        delay: Duration,
    },
    /// The request's output is lost on the way (the worker finished it, the final output never
    /// arrives): nothing is emitted, and a probe learns the worker does not hold it.
    Lost,
}

#[derive(Default)]
pub struct Record {
    pub adds: Vec<AddRequest>,
    pub aborts: Vec<RequestId>,
    pub probes: Vec<Vec<RequestId>>,
    /// Requests whose final output the api-server acknowledged.
    pub delivered: Vec<RequestId>,
}

pub struct FakeEngine {
    pub worker_endpoint: String,
    pub tp_endpoint: String,
    pub record: Arc<Mutex<Record>>,
    pub behaviour: Arc<Mutex<Behaviour>>,
    pub num_spec_tokens: u32,
    /// The worker hears nothing and says nothing, its connection open (a stopped process).
    worker_silent: Arc<AtomicBool>,
    worker_task: JoinHandle<()>,
    tp_task: JoinHandle<()>,
}

/// Figures a request of `steps` verification steps would carry (not the spec's arithmetic; the
/// api-server passes them through untouched, which is what the tests check).
pub fn fake_metrics(seed: u64) -> SpeculateMetrics {
    SpeculateMetrics {
        accepted_tokens: seed,
        rejected_tokens: 1,
        accept_ratio: 0.25,
        average_accept_length: 1.5,
        accept_ratio_per_head: vec![0.5, 0.0],
        accepted_tokens_per_head: vec![seed, 1, 0],
        num_steps: seed,
        num_drafts: 1,
        num_draft_tokens: 2,
        num_accepted_draft_tokens: 1,
        draft_acceptance_rate: 0.5,
        accept_length_histogram: vec![1, 1, 0],
        draft_length_histogram: vec![seed.saturating_sub(1), 0, 1],
        num_offered_tokens: Some(3),
        predicted_accepted_tokens: Some(0.75),
    }
}

fn routed(identity: &bytes::Bytes, payload: Vec<u8>) -> ZmqMessage {
    let mut msg = ZmqMessage::from(payload);
    msg.push_front(identity.clone());
    msg
}

impl FakeEngine {
    pub async fn start(behaviour: Behaviour, num_spec_tokens: u32) -> Self {
        let record = Arc::new(Mutex::new(Record::default()));
        let behaviour = Arc::new(Mutex::new(behaviour));
        let aborted = Arc::new(Mutex::new(HashSet::new()));
        let (add_tx, add_rx) = mpsc::channel(1024);
        let worker_silent = Arc::new(AtomicBool::new(false));

        // Port 0: the system picks a free port at bind time (no race with other tests).
        let mut worker = RouterSocket::new();
        let worker_endpoint = worker.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let mut tp = RouterSocket::new();
        let tp_endpoint = tp.bind("tcp://127.0.0.1:0").await.unwrap().to_string();

        let worker_task = tokio::spawn(run_worker(
            worker,
            Arc::clone(&behaviour),
            Arc::clone(&record),
            Arc::clone(&aborted),
            add_tx,
            num_spec_tokens,
            Arc::clone(&worker_silent),
        ));
        let tp_task = tokio::spawn(run_tp(
            tp,
            add_rx,
            Arc::clone(&behaviour),
            aborted,
            num_spec_tokens,
        ));
        Self {
            worker_endpoint,
            tp_endpoint,
            record,
            behaviour,
            num_spec_tokens,
            worker_silent,
            worker_task,
            tp_task,
        }
    }

    pub fn kill_worker(&self) {
        self.worker_task.abort();
    }

    /// The worker stops, like a SIGSTOP: its connection stays open, it hears and says nothing.
    pub fn pause_worker(&self) {
        self.worker_silent.store(true, Ordering::SeqCst);
    }

    /// The paused worker runs again; it says nothing until it hears a hello.
    pub fn resume_worker(&self) {
        self.worker_silent.store(false, Ordering::SeqCst);
    }

    pub fn kill_tp(&self) {
        self.tp_task.abort();
    }

    pub fn aborts(&self) -> Vec<RequestId> {
        self.record.lock().unwrap().aborts.clone()
    }

    pub fn probes(&self) -> Vec<Vec<RequestId>> {
        self.record.lock().unwrap().probes.clone()
    }

    pub fn delivered(&self) -> Vec<RequestId> {
        self.record.lock().unwrap().delivered.clone()
    }

    pub fn adds(&self) -> Vec<AddRequest> {
        self.record.lock().unwrap().adds.clone()
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.worker_task.abort();
        self.tp_task.abort();
    }
}

async fn run_worker(
    socket: RouterSocket,
    behaviour: Arc<Mutex<Behaviour>>,
    record: Arc<Mutex<Record>>,
    aborted: Arc<Mutex<HashSet<RequestId>>>,
    add_tx: mpsc::Sender<AddRequest>,
    num_spec_tokens: u32,
    silent: Arc<AtomicBool>,
) {
    let (mut tx, mut rx) = socket.split();
    let mut api: Option<bytes::Bytes> = None;
    let mut tick = tokio::time::interval(INTERVAL);
    loop {
        tokio::select! {
                    msg = rx.recv() => {
                        let Ok(msg) = msg else { return };
                        let (Some(identity), Some(frame)) = (msg.get(0).cloned(), msg.get(1)) else { continue };
                        if silent.load(Ordering::SeqCst) {
                            api = None;
                            continue;
                        }
                        match proto::decode::<ApiToWorker>(frame).unwrap() {
                            ApiToWorker::Hello(_) => {
                                let hello = WorkerToApi::Hello(WorkerHello {
                                    protocol_version: proto::PROTOCOL_VERSION,
                                    worker_id: "fake-worker".into(),
                                    epoch: 7,
                                    model: "fake".into(),
                                    num_spec_tokens,
                                    proposer: "ngram".into(),
                                    ready: true,
                                    heartbeat_interval_ms: INTERVAL.as_millis() as u32,
                                                        max_model_len: 2048,
                                                        kv_capacity_tokens: 32_768,
                                                        kv_bytes: 0,
                                                        draft_kv_bytes: 0,
                                                        max_num_seqs: 16,
                                                        session: 7,
        });
                                let _ = tx.send(routed(&identity, proto::encode(&hello).unwrap())).await;
                                api = Some(identity);
                            }
                            ApiToWorker::Add(add) => {
                                record.lock().unwrap().adds.push(add.clone());
                                let refusal = match &*behaviour.lock().unwrap() {
                                    Behaviour::Reject(reason) => Some(reason.clone()),
                                    Behaviour::Lost => continue,
                                    _ => None,
                                };
                                match refusal {
                                    Some(reason) => {
                                        let msg = WorkerToApi::Rejected { id: add.id, reason };
                                        let _ = tx.send(routed(&identity, proto::encode(&msg).unwrap())).await;
                                    }
                                    None => {
                                        let _ = add_tx.send(add).await;
                                    }
                                }
                            }
                            ApiToWorker::Abort(abort) => {
                                record.lock().unwrap().aborts.push(abort.id);
                                aborted.lock().unwrap().insert(abort.id);
                            }
                            ApiToWorker::Heartbeat { .. } => {}
                            ApiToWorker::Delivered { ids } => {
                                record.lock().unwrap().delivered.extend(ids);
                            }
                            ApiToWorker::Probe { ids } => {
                                record.lock().unwrap().probes.push(ids.clone());
                                if matches!(&*behaviour.lock().unwrap(), Behaviour::Lost) {
                                    let msg = WorkerToApi::NotHeld { ids };
                                    let _ = tx.send(routed(&identity, proto::encode(&msg).unwrap())).await;
                                }
                            }
                        }
                    }
                    _ = tick.tick() => {
                        if silent.load(Ordering::SeqCst) {
                            // Back, it beats again only after a hello: only the api-server's
                            // hello (not a heartbeat) can take it back.
                            api = None;
                            continue;
                        }
                        if let Some(identity) = &api {
                            let hb = WorkerToApi::Heartbeat(Heartbeat::idle("fake-worker".into(), 7, 0));
                            let _ = tx.send(routed(identity, proto::encode(&hb).unwrap())).await;
                        }
                    }
                }
    }
}

fn output(add: &AddRequest, first_index: u32, tokens: Vec<u32>) -> RequestOutput {
    RequestOutput {
        id: add.id,
        first_index,
        tokens,
        finish: None,
        usage: None,
        speculate_metrics: None,
        error: None,
        logprobs: Vec::new(),
        prompt_logprobs: Vec::new(),
    }
}

/// Outputs of one request under `behaviour`, sent to `out` in order.
async fn generate(
    add: AddRequest,
    behaviour: Behaviour,
    aborted: Arc<Mutex<HashSet<RequestId>>>,
    out: mpsc::Sender<RequestOutput>,
    num_spec_tokens: u32,
) {
    let metrics = |n: u64| (num_spec_tokens > 0).then(|| Box::new(fake_metrics(n)));
    let usage = |n: usize| {
        Some(TokenCounts {
            prompt_tokens: add.prompt_token_ids.len() as u32,
            // As if the worker's prefix cache held a third of the prompt.
            cached_prompt_tokens: add.prompt_token_ids.len() as u32 / 3,
            completion_tokens: n as u32,
        })
    };
    match behaviour {
        Behaviour::Complete { tokens, finish } => {
            let tokens: Vec<u32> = tokens.into_iter().take(add.max_tokens as usize).collect();
            let mut sent = 0usize;
            while sent < tokens.len() {
                let end = (sent + 2).min(tokens.len());
                // Replays the previous output's tokens too: the api-server must drop them.
                let from = sent.saturating_sub(1);
                let _ = out
                    .send(output(&add, from as u32, tokens[from..end].to_vec()))
                    .await;
                sent = end;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut last = output(&add, tokens.len() as u32, Vec::new());
            last.finish = Some(finish);
            last.usage = usage(tokens.len());
            last.speculate_metrics = metrics(add.id & 0xFF);
            let _ = out.send(last).await;
        }
        Behaviour::Reject(_) | Behaviour::Lost => {}
        Behaviour::Paced {
            tokens,
            finish,
            delay,
        } => {
            for (i, token) in tokens.iter().enumerate() {
                let _ = out.send(output(&add, i as u32, vec![*token])).await;
                tokio::time::sleep(delay).await;
            }
            let mut last = output(&add, tokens.len() as u32, Vec::new());
            last.finish = Some(finish);
            last.usage = usage(tokens.len());
            last.speculate_metrics = metrics(add.id & 0xFF);
            let _ = out.send(last).await;
        }
        Behaviour::Trickle { token } => {
            let mut n = 0u32;
            loop {
                if aborted.lock().unwrap().contains(&add.id) {
                    let mut last = output(&add, n, Vec::new());
                    last.finish = Some(FinishReason::Abort);
                    last.usage = usage(n as usize);
                    last.speculate_metrics = metrics(u64::from(n));
                    let _ = out.send(last).await;
                    return;
                }
                if out.send(output(&add, n, vec![token])).await.is_err() {
                    return;
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }
    }
}

async fn run_tp(
    socket: RouterSocket,
    mut adds: mpsc::Receiver<AddRequest>,
    behaviour: Arc<Mutex<Behaviour>>,
    aborted: Arc<Mutex<HashSet<RequestId>>>,
    num_spec_tokens: u32,
) {
    let (mut tx, mut rx) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<RequestOutput>(4096);
    let mut api: Option<bytes::Bytes> = None;
    let mut tick = tokio::time::interval(INTERVAL);
    let mut generators = Vec::new();
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Ok(msg) = msg else { return };
                let (Some(identity), Some(frame)) = (msg.get(0).cloned(), msg.get(1)) else { continue };
                if let ApiToTp::Hello(_) = proto::decode::<ApiToTp>(frame).unwrap() {
                    let hello = TpToApi::Hello(TpHello { protocol_version: proto::PROTOCOL_VERSION, epoch: 3, workers: vec!["fake-worker".into()] });
                    let _ = tx.send(routed(&identity, proto::encode(&hello).unwrap())).await;
                    api = Some(identity);
                }
            }
            Some(add) = adds.recv() => {
                let b = behaviour.lock().unwrap().clone();
                generators.push(tokio::spawn(generate(add, b, Arc::clone(&aborted), out_tx.clone(), num_spec_tokens)));
            }
            Some(first) = out_rx.recv() => {
                let mut batch = vec![first];
                while let Ok(more) = out_rx.try_recv() {
                    batch.push(more);
                }
                if let Some(identity) = &api {
                    let frame = proto::encode(&TpToApi::Outputs(batch)).unwrap();
                    let _ = tx.send(routed(identity, frame)).await;
                }
            }
            _ = tick.tick() => {
                if let Some(identity) = &api {
                    let hello = TpToApi::Hello(TpHello { protocol_version: proto::PROTOCOL_VERSION, epoch: 3, workers: vec!["fake-worker".into()] });
                    let _ = tx.send(routed(identity, proto::encode(&hello).unwrap())).await;
                }
            }
        }
    }
}

/// An api-server on a free port talking to `engine`; returns its base URL.
pub async fn serve(engine: &FakeEngine, timeout: Duration) -> (String, EngineClient) {
    let client = EngineClient::start(engine_config(
        vec![engine.worker_endpoint.clone()],
        engine.tp_endpoint.clone(),
    ));
    let app = router(state(client.clone(), timeout), ApiKey(None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let base = format!("http://{addr}");
    wait_until(detection_bound(), "api-server healthy", || {
        let url = format!("{base}/health");
        async move {
            reqwest::get(&url)
                .await
                .map(|r| r.status() == 200)
                .unwrap_or(false)
        }
    })
    .await;
    (base, client)
}

pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// Parses an SSE body into its `data:` payloads.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

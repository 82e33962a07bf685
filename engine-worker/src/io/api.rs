//! The api-server link: a ROUTER the api-servers connect to. In: hello, add, abort, heartbeat.
//! Out: our hello (with readiness), heartbeats, and refusals. Liveness is `link::liveness`'s
//! rule: an api-server silent past the window is presumed dead and its requests are aborted; a
//! heartbeat from one we do not know is answered with [`WorkerToApi::AskHello`]. With a link
//! secret, nothing from a connection reaches the protocol before it proved the secret
//! (`link::auth::Gate`).

use std::collections::HashMap;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use link::auth::{Gate, Verdict};
use link::liveness::Heard;
use link::{Liveness, Sweep, Sweeper};
use proto::api_worker::{ApiToWorker, RejectReason, WorkerToApi};
use tokio::sync::mpsc::Receiver;
use zeromq::{RouterSendHalf, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::{ApiOutbound, EngineCommand, WorkerStatus};
use crate::engine::validate_request;

/// Most api-servers remembered at once; hellos beyond it are ignored.
const MAX_API_SERVERS: usize = 256;

#[derive(Debug, Clone)]
pub struct ApiLinkConfig {
    pub heartbeat_interval: Duration,
    /// Limits the link checks before queueing a request (the engine checks again).
    pub max_model_len: usize,
    pub vocab_size: usize,
    pub has_token_bytes: bool,
    pub max_waiting: usize,
}

/// How the link itself behaves (known at start, unlike [`ApiLinkConfig`]).
pub struct ApiLinkSettings {
    pub heartbeat_interval: Duration,
    /// What a connection must prove before its frames are read (`link::auth`).
    pub gate: Gate,
}

struct ApiPeer {
    routing_id: Bytes,
    epoch: u64,
    last_seen: Instant,
}

/// Binds the ROUTER; call before loading the model so peers get a not-ready hello meanwhile.
pub async fn bind_api(endpoint: &str) -> Result<RouterSocket, crate::EngineError> {
    link::ipc::prepare_bind(endpoint)?;
    let mut socket = RouterSocket::new();
    socket
        .bind(endpoint)
        .await
        .map_err(|source| crate::EngineError::Bind {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    Ok(socket)
}

/// Serves the api-servers until `shutdown` resolves.
pub async fn run_api_link(
    socket: RouterSocket,
    status: Arc<WorkerStatus>,
    commands: SyncSender<EngineCommand>,
    mut from_engine: Receiver<ApiOutbound>,
    limits: tokio::sync::watch::Receiver<Option<ApiLinkConfig>>,
    link: ApiLinkSettings,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let ApiLinkSettings {
        heartbeat_interval,
        mut gate,
    } = link;
    // Receiving runs in a task of its own that is never cancelled; frames reach this loop
    // through a bounded channel (when it is full, the socket stops reading: backpressure).
    let (mut socket, mut recv_half) = socket.split();
    let (frames_tx, mut frames_rx) = tokio::sync::mpsc::channel::<ZmqMessage>(1024);
    let receiver = tokio::spawn(async move {
        while let Ok(msg) = recv_half.recv().await {
            if frames_tx.send(msg).await.is_err() {
                break;
            }
        }
    });
    let mut peers: HashMap<String, ApiPeer> = HashMap::new();
    let liveness = Liveness::new(heartbeat_interval);
    let mut sweeper = Sweeper::new(liveness);
    let mut heartbeat = tokio::time::interval(heartbeat_interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // api-servers that connected while the model loaded hold a not-ready hello: say it again.
    let mut announced_ready = false;
    loop {
        tokio::select! {
            msg = frames_rx.recv() => {
                let Some(msg) = msg else {
                    tracing::error!("api socket closed");
                    return;
                };
                let mut frames = msg.into_vec();
                if frames.len() != 2 {
                    tracing::warn!(parts = frames.len(), "api message with unexpected framing dropped");
                    continue;
                }
                let payload = frames.pop().expect("two frames");
                let routing_id = frames.pop().expect("two frames");
                match gate.check(&routing_id, &payload) {
                    Verdict::Pass => {}
                    Verdict::Reply(frame) => {
                        send_frame(&mut socket, routing_id, frame).await;
                        continue;
                    }
                    Verdict::Drop => continue,
                }
                match proto::decode::<ApiToWorker>(&payload) {
                    Ok(msg) => {
                        let limits = limits.borrow().clone();
                        handle(&mut socket, &mut peers, liveness, &status, &commands, limits.as_ref(), routing_id, msg).await;
                    }
                    Err(err) => tracing::warn!(error = %err, "undecodable api message dropped"),
                }
            }
            out = from_engine.recv() => {
                let Some(out) = out else { continue };
                if let Some(peer) = peers.get(&out.owner) {
                    send(&mut socket, peer.routing_id.clone(), &out.msg).await;
                }
            }
            _ = heartbeat.tick() => {
                let now = Instant::now();
                let dead: Vec<String> = match sweeper.begin(now) {
                    Sweep::Judge => peers
                        .iter()
                        .filter(|(_, p)| liveness.is_silent(p.last_seen, now))
                        .map(|(id, _)| id.clone())
                        .collect(),
                    Sweep::Forgive { .. } => {
                        peers.values_mut().for_each(|p| p.last_seen = now);
                        Vec::new()
                    }
                };
                for id in dead {
                    peers.remove(&id);
                    tracing::warn!(api_server = %id, "api-server missed its heartbeats; aborting its requests");
                    push_command(&commands, EngineCommand::AbortOwner(id)).await;
                }
                let beat = if !announced_ready && status.is_ready() {
                    announced_ready = true;
                    WorkerToApi::Hello(status.hello())
                } else {
                    WorkerToApi::Heartbeat(status.heartbeat())
                };
                for peer in peers.values() {
                    send(&mut socket, peer.routing_id.clone(), &beat).await;
                }
            }
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    // A last heartbeat tells the api-servers we no longer accept.
                    let beat = WorkerToApi::Heartbeat(status.heartbeat());
                    for peer in peers.values() {
                        send(&mut socket, peer.routing_id.clone(), &beat).await;
                    }
                    receiver.abort();
                    return;
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn handle(
    socket: &mut RouterSendHalf,
    peers: &mut HashMap<String, ApiPeer>,
    liveness: Liveness,
    status: &WorkerStatus,
    commands: &SyncSender<EngineCommand>,
    limits: Option<&ApiLinkConfig>,
    routing_id: Bytes,
    msg: ApiToWorker,
) {
    match msg {
        ApiToWorker::Hello(hello) => {
            if let Err(err) = proto::check_version(&hello.api_server_id, hello.protocol_version) {
                tracing::warn!(error = %err, "api-server hello refused");
                return;
            }
            if let Some(old) = peers.get(&hello.api_server_id) {
                if old.epoch != hello.epoch && !liveness.is_silent(old.last_seen, Instant::now()) {
                    // Another process with a live api-server's id would take its outputs.
                    tracing::error!(api_server = %hello.api_server_id, "hello refused: another live api-server holds this id");
                    let reason = format!(
                        "api-server id {} is held by another live api-server; give each api-server its own --api-server-id",
                        hello.api_server_id
                    );
                    send(socket, routing_id, &WorkerToApi::Refused { reason }).await;
                    return;
                }
                if old.epoch != hello.epoch {
                    // Restarted: its old requests have no one to report to.
                    push_command(
                        commands,
                        EngineCommand::AbortOwner(hello.api_server_id.clone()),
                    )
                    .await;
                }
            } else if peers.len() >= MAX_API_SERVERS {
                tracing::warn!("too many api-servers; hello ignored");
                return;
            }
            tracing::info!(api_server = %hello.api_server_id, "api-server said hello");
            peers.insert(
                hello.api_server_id,
                ApiPeer {
                    routing_id: routing_id.clone(),
                    epoch: hello.epoch,
                    last_seen: Instant::now(),
                },
            );
            send(socket, routing_id, &WorkerToApi::Hello(status.hello())).await;
        }
        ApiToWorker::Heartbeat {
            api_server_id,
            epoch,
        } => {
            let peer = peers.get_mut(&api_server_id).filter(|p| p.epoch == epoch);
            match (Heard::of(peer.is_some()), peer) {
                (Heard::Known, Some(peer)) => {
                    peer.last_seen = Instant::now();
                    peer.routing_id = routing_id;
                }
                _ => {
                    // Unknown, forgotten, or another epoch (we or it restarted): its hello
                    // tells us who it is and whose requests are gone.
                    tracing::info!(api_server = %api_server_id, "heartbeat from an api-server we do not know; asking for its hello");
                    send(socket, routing_id, &WorkerToApi::AskHello).await;
                }
            }
        }
        ApiToWorker::Add(req) => {
            let id = req.id;
            let reject = |reason| WorkerToApi::Rejected { id, reason };
            let verdict = match limits {
                _ if !status.accepting() => Err(RejectReason::NotAccepting),
                None => Err(RejectReason::NotAccepting),
                Some(l) if status.waiting() >= l.max_waiting => Err(RejectReason::Overloaded),
                Some(l) => validate_request(&req, l.max_model_len, l.vocab_size, l.has_token_bytes),
            };
            if let Err(reason) = verdict {
                send(socket, routing_id, &reject(reason)).await;
                return;
            }
            if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
                commands.try_send(EngineCommand::Add(req))
            {
                send(socket, routing_id, &reject(RejectReason::Overloaded)).await;
            }
        }
        ApiToWorker::Abort(abort) => {
            push_command(commands, EngineCommand::Abort(abort.id)).await;
        }
        ApiToWorker::Probe { mut ids } => {
            let Some(owner) = peers
                .iter()
                .find(|(_, p)| p.routing_id == routing_id)
                .map(|(name, _)| name.clone())
            else {
                send(socket, routing_id, &WorkerToApi::AskHello).await;
                return;
            };
            ids.truncate(proto::api_worker::MAX_PROBE_IDS);
            // Best effort: a probe lost to a full queue is asked again.
            let _ = commands.try_send(EngineCommand::Probe { owner, ids });
        }
        ApiToWorker::Delivered { mut ids } => {
            ids.truncate(proto::api_worker::MAX_PROBE_IDS);
            // Best effort: a lost acknowledgement only keeps the request until the age bound.
            let _ = commands.try_send(EngineCommand::Delivered(ids));
        }
    }
}

/// Aborts must not be lost: wait for room (off the async threads) when the queue is full.
pub async fn push_command(commands: &SyncSender<EngineCommand>, cmd: EngineCommand) {
    match commands.try_send(cmd) {
        Ok(()) | Err(TrySendError::Disconnected(_)) => {}
        Err(TrySendError::Full(cmd)) => {
            let commands = commands.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let _ = commands.send(cmd);
            })
            .await;
        }
    }
}

async fn send(socket: &mut RouterSendHalf, routing_id: Bytes, msg: &WorkerToApi) {
    match proto::encode(msg) {
        Ok(frame) => send_frame(socket, routing_id, frame).await,
        Err(err) => tracing::error!(error = %err, "cannot encode message for an api-server"),
    }
}

async fn send_frame(socket: &mut RouterSendHalf, routing_id: Bytes, frame: Vec<u8>) {
    let mut message = ZmqMessage::from(frame);
    message.push_front(routing_id);
    // A vanished peer is normal; its heartbeats stop and it is dropped in time.
    if let Ok(Err(err)) = tokio::time::timeout(Duration::from_secs(1), socket.send(message)).await {
        tracing::debug!(error = %err, "send to api-server failed");
    }
}

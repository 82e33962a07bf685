//! The api-server link: a ROUTER the api-servers connect to. In: hello, add, abort, heartbeat.
//! Out: our hello (with readiness), heartbeats, and refusals. Liveness is `link::liveness`'s
//! rule: an api-server silent past the window is presumed dead and its requests are aborted; a
//! heartbeat from one we do not know is answered with [`WorkerToApi::AskHello`]. With a link
//! secret, nothing from a connection reaches the protocol before it proved the secret
//! (`link::auth::Gate`).

use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use link::auth::Gate;
use link::liveness::Heard;
use link::peers::{HelloOutcome, PeerTable};
use link::router::Received;
use link::Liveness;
use proto::api_worker::{AddRequest, ApiHello, ApiToWorker, RejectReason, WorkerToApi};
use proto::RequestId;
use tokio::sync::mpsc::Receiver;
use zeromq::{RouterSendHalf, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::{ApiOutbound, EngineCommand, WorkerStatus};

/// Most api-servers remembered at once; hellos beyond it are ignored.
const MAX_API_SERVERS: usize = 256;

/// What the link needs to admit requests, known once the model is loaded. The link only
/// admits (accepting, not overloaded); whether a request is valid the engine decides
/// (`Engine::add_request`), and its refusal goes back like any other.
#[derive(Debug, Clone)]
pub struct ApiAdmission {
    pub max_waiting: usize,
    /// Compiles requests' grammars off the step loop (none without a vocabulary).
    pub grammars: Option<grammar::Compiler>,
}

/// How the link itself behaves (known at start, unlike [`ApiAdmission`]).
pub struct ApiLinkSettings {
    pub heartbeat_interval: Duration,
    /// What a connection must prove before its frames are read (`link::auth`).
    pub gate: Gate,
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
    admission: tokio::sync::watch::Receiver<Option<ApiAdmission>>,
    link: ApiLinkSettings,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    // Receiving runs in a task of its own that is never cancelled; frames reach this loop
    // through a bounded channel (when it is full, the socket stops reading: backpressure).
    let (socket, mut recv_half) = socket.split();
    let (frames_tx, mut frames_rx) = tokio::sync::mpsc::channel::<ZmqMessage>(1024);
    let receiver = tokio::spawn(async move {
        while let Ok(msg) = recv_half.recv().await {
            if frames_tx.send(msg).await.is_err() {
                break;
            }
        }
    });
    let liveness = Liveness::new(link.heartbeat_interval);
    let mut api = ApiLink {
        socket,
        peers: PeerTable::new(liveness, MAX_API_SERVERS, "api-server", "api-server-id"),
        status,
        commands,
        gate: link.gate,
        announced_ready: false,
    };
    let mut heartbeat = tokio::time::interval(link.heartbeat_interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The step loop drops its sender when it ends, while draining, before the link is told to
    // stop: a closed receiver is ready at once, so polling it again would spin.
    let mut engine_open = true;
    loop {
        tokio::select! {
            msg = frames_rx.recv() => {
                let Some(msg) = msg else {
                    tracing::error!("api socket closed");
                    return;
                };
                let admission = admission.borrow().clone();
                api.on_message(msg, admission.as_ref()).await;
            }
            out = from_engine.recv(), if engine_open => {
                let Some(out) = out else {
                    engine_open = false;
                    continue;
                };
                if let Some(peer) = api.peers.get(&out.owner) {
                    send(&mut api.socket, peer.routing_id.clone(), &out.msg).await;
                }
            }
            _ = heartbeat.tick() => api.on_tick().await,
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    // A last heartbeat tells the api-servers we no longer accept.
                    let beat = WorkerToApi::Heartbeat(api.status.heartbeat());
                    api.send_all(&beat).await;
                    receiver.abort();
                    return;
                }
            }
        }
    }
}

/// The link's state: the socket's sending half, the api-servers it knows, and where their
/// commands go.
struct ApiLink {
    socket: RouterSendHalf,
    /// The api-servers that said hello (their requests' owners); nothing else is kept per peer.
    peers: PeerTable<()>,
    status: Arc<WorkerStatus>,
    commands: SyncSender<EngineCommand>,
    gate: Gate,
    /// api-servers that connected while the model loaded hold a not-ready hello: it is said
    /// again once ready.
    announced_ready: bool,
}

impl ApiLink {
    /// One message from a connection: through the gate, decoded, handled.
    async fn on_message(&mut self, msg: ZmqMessage, admission: Option<&ApiAdmission>) {
        match link::router::receive::<ApiToWorker>(&mut self.gate, msg) {
            Received::Message { routing_id, msg } => self.handle(admission, routing_id, msg).await,
            Received::Auth { routing_id, reply } => {
                send_frame(&mut self.socket, routing_id, reply).await
            }
            Received::BadFraming { parts } => {
                tracing::warn!(parts, "api message with unexpected framing dropped")
            }
            Received::Gated => {}
            Received::Malformed { error, .. } => {
                tracing::warn!(error = %error, "undecodable api message dropped")
            }
        }
    }

    async fn handle(
        &mut self,
        admission: Option<&ApiAdmission>,
        routing_id: Bytes,
        msg: ApiToWorker,
    ) {
        match msg {
            ApiToWorker::Hello(hello) => self.on_hello(routing_id, hello).await,
            ApiToWorker::Heartbeat {
                api_server_id,
                epoch,
            } => self.on_heartbeat(routing_id, api_server_id, epoch).await,
            ApiToWorker::Add(req) => self.on_add(routing_id, req, admission).await,
            ApiToWorker::Abort(abort) => {
                let Some(owner) = self.sender(&routing_id).await else {
                    return;
                };
                push_command(
                    &self.commands,
                    EngineCommand::Abort {
                        owner,
                        id: abort.id,
                    },
                )
                .await;
            }
            ApiToWorker::Probe { ids } => self.on_probe(routing_id, ids).await,
            ApiToWorker::Delivered { mut ids } => {
                let Some(owner) = self.sender(&routing_id).await else {
                    return;
                };
                ids.truncate(proto::api_worker::MAX_PROBE_IDS);
                // Best effort: a lost acknowledgement only keeps the request until the age bound.
                let _ = self
                    .commands
                    .try_send(EngineCommand::Delivered { owner, ids });
            }
        }
    }

    /// The api-server that said hello on `routing_id`; a connection that did not is asked for
    /// its hello, and what it sent acts for no one (requests belong to the connection of their
    /// owner's hello, so no other local process can end or feed them).
    async fn sender(&mut self, routing_id: &Bytes) -> Option<String> {
        let owner = self.peers.sender(routing_id).map(str::to_owned);
        if owner.is_none() {
            send(&mut self.socket, routing_id.clone(), &WorkerToApi::AskHello).await;
        }
        owner
    }

    async fn on_hello(&mut self, routing_id: Bytes, hello: ApiHello) {
        if let Err(err) = proto::check_version(&hello.api_server_id, hello.protocol_version) {
            tracing::warn!(error = %err, "api-server hello refused");
            return;
        }
        let name = hello.api_server_id;
        match self.peers.hello(
            &name,
            hello.epoch,
            routing_id.clone(),
            Instant::now(),
            || (),
        ) {
            HelloOutcome::Admitted | HelloOutcome::Reconnected => {}
            HelloOutcome::Restarted { .. } => {
                // Its old requests have no one to report to.
                push_command(&self.commands, EngineCommand::AbortOwner(name.clone())).await;
            }
            HelloOutcome::Refused { reason } => {
                // Another process with a live api-server's id would take its outputs.
                tracing::error!(api_server = %name, "hello refused: another live api-server holds this id");
                let refused = WorkerToApi::Refused { reason };
                return send(&mut self.socket, routing_id, &refused).await;
            }
            HelloOutcome::Full => {
                tracing::warn!("too many api-servers; hello ignored");
                return;
            }
        }
        tracing::info!(api_server = %name, "api-server said hello");
        let reply = WorkerToApi::Hello(self.status.hello_for_api());
        send(&mut self.socket, routing_id, &reply).await;
    }

    async fn on_heartbeat(&mut self, routing_id: Bytes, api_server_id: String, epoch: u64) {
        // Only its own connection keeps it alive: after a reconnect its hello moves it.
        let heard = self
            .peers
            .heard(&api_server_id, epoch, &routing_id, Instant::now());
        if heard == Heard::AskHello {
            // Unknown, forgotten, or another epoch (we or it restarted): its hello tells us
            // who it is and whose requests are gone.
            tracing::info!(api_server = %api_server_id, "heartbeat from an api-server we do not know; asking for its hello");
            send(&mut self.socket, routing_id, &WorkerToApi::AskHello).await;
        }
    }

    /// Admits a request to the engine's queue, or refuses it at once when the worker does not
    /// accept or is overloaded.
    async fn on_add(
        &mut self,
        routing_id: Bytes,
        req: AddRequest,
        admission: Option<&ApiAdmission>,
    ) {
        let id = req.id;
        let sender = self.sender(&routing_id).await;
        let refusal = match admission {
            _ if sender.is_none() => Some(RejectReason::NotAccepting),
            _ if sender.as_deref() != Some(req.owner.as_str()) => Some(RejectReason::Invalid(
                "the request's owner is not the api-server that sent it".into(),
            )),
            _ if !self.status.accepting() => Some(RejectReason::NotAccepting),
            None => Some(RejectReason::NotAccepting),
            Some(a) if self.status.waiting() >= a.max_waiting => Some(RejectReason::Overloaded),
            Some(a) => match self.commands.try_send(prepared(req, a)) {
                Ok(()) => None,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    Some(RejectReason::Overloaded)
                }
            },
        };
        if let Some(reason) = refusal {
            let reject = WorkerToApi::Rejected { id, reason };
            send(&mut self.socket, routing_id, &reject).await;
        }
    }

    async fn on_probe(&mut self, routing_id: Bytes, mut ids: Vec<RequestId>) {
        let Some(owner) = self.sender(&routing_id).await else {
            return;
        };
        ids.truncate(proto::api_worker::MAX_PROBE_IDS);
        // Best effort: a probe lost to a full queue is asked again.
        let _ = self.commands.try_send(EngineCommand::Probe { owner, ids });
    }

    /// Drops the api-servers silent past the window (aborting their requests), then beats.
    async fn on_tick(&mut self) {
        for (id, _) in self.peers.sweep(Instant::now()) {
            tracing::warn!(api_server = %id, "api-server missed its heartbeats; aborting its requests");
            push_command(&self.commands, EngineCommand::AbortOwner(id)).await;
        }
        let beat = if !self.announced_ready && self.status.is_ready() {
            self.announced_ready = true;
            WorkerToApi::Hello(self.status.hello_for_api())
        } else {
            WorkerToApi::Heartbeat(self.status.heartbeat())
        };
        self.send_all(&beat).await;
    }

    async fn send_all(&mut self, msg: &WorkerToApi) {
        for (_, peer) in self.peers.iter() {
            send(&mut self.socket, peer.routing_id.clone(), msg).await;
        }
    }
}

/// A request for the step loop, its grammar's compile started (off the loop) when it has one.
fn prepared(req: AddRequest, admission: &ApiAdmission) -> EngineCommand {
    let job = match (&req.sampling.structured, &admission.grammars) {
        (Some(structured), Some(compiler)) => Some(crate::engine::GrammarJob::start(
            compiler.clone(),
            structured.clone(),
        )),
        _ => None,
    };
    EngineCommand::Add(req, job)
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

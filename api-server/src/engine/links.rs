//! The ZeroMQ links: one DEALER per engine-worker and one to the token-processor. The zeromq
//! crate does not reconnect DEALER sockets, so each link runs `link::connect`'s loop: connect,
//! say hello, then send queued frames and heartbeats and hand received frames to [`Shared`]
//! until the peer disconnects, or stays silent on this connection past the liveness window (a
//! connection the peer no longer hears on looks open from here: only silence tells); then start
//! over with a fresh socket. While the peer is not alive for us, our heartbeat is a hello (which
//! the peer answers with its own), and a peer that asks for our hello gets it at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use link::connect::{connect, Connected};
use link::liveness::{Sweep, Sweeper};
use link::Backoff;
use proto::api_worker::{ApiHello, ApiToWorker};
use proto::tp_api::ApiToTp;
use tokio::sync::{mpsc, watch};
use zeromq::{DealerSocket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use super::shared::Shared;
use super::state::Reply;

/// Bound on one send, so a stuck peer cannot stall the link.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug)]
enum Peer {
    Worker(usize),
    TokenProcessor,
}

impl Peer {
    fn hello(self, shared: &Shared) -> Vec<u8> {
        let hello = ApiHello {
            protocol_version: proto::PROTOCOL_VERSION,
            api_server_id: shared.config.api_server_id.clone(),
            epoch: shared.epoch,
        };
        let frame = match self {
            Peer::Worker(_) => proto::encode(&ApiToWorker::Hello(hello)),
            Peer::TokenProcessor => proto::encode(&ApiToTp::Hello(hello)),
        };
        frame.unwrap_or_default()
    }

    fn heartbeat(self, shared: &Shared) -> Vec<u8> {
        let api_server_id = shared.config.api_server_id.clone();
        let epoch = shared.epoch;
        let frame = match self {
            Peer::Worker(_) => proto::encode(&ApiToWorker::Heartbeat {
                api_server_id,
                epoch,
            }),
            Peer::TokenProcessor => proto::encode(&ApiToTp::Heartbeat {
                api_server_id,
                epoch,
            }),
        };
        frame.unwrap_or_default()
    }

    fn set_connected(self, shared: &Shared, connected: bool) {
        match self {
            Peer::Worker(i) => shared.state().set_worker_connected(i, connected),
            Peer::TokenProcessor => shared.state().set_tp_connected(connected),
        }
    }

    fn on_frame(self, shared: &Shared, frame: &[u8]) -> Reply {
        match self {
            Peer::Worker(i) => shared.on_worker_frame(i, frame),
            Peer::TokenProcessor => shared.on_tp_frame(frame),
        }
    }

    fn alive(self, shared: &Shared) -> bool {
        match self {
            Peer::Worker(i) => shared.state().worker_alive(i),
            Peer::TokenProcessor => shared.state().tp_alive(),
        }
    }

    /// Our heartbeat, or our hello while the peer is not alive for us.
    fn beat(self, shared: &Shared) -> Vec<u8> {
        if self.alive(shared) {
            self.heartbeat(shared)
        } else {
            self.hello(shared)
        }
    }
}

pub(crate) async fn run_worker_link(
    shared: Arc<Shared>,
    index: usize,
    endpoint: String,
    outbound: mpsc::Receiver<ApiToWorker>,
    shutdown: watch::Receiver<bool>,
) {
    run_link(
        shared,
        Peer::Worker(index),
        endpoint,
        Some(outbound),
        shutdown,
    )
    .await;
}

pub(crate) async fn run_tp_link(shared: Arc<Shared>, shutdown: watch::Receiver<bool>) {
    let endpoint = shared.config.tp_endpoint.clone();
    run_link(shared, Peer::TokenProcessor, endpoint, None, shutdown).await;
}

async fn next_outbound(rx: &mut Option<mpsc::Receiver<ApiToWorker>>) -> Option<ApiToWorker> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn send(socket: &mut zeromq::DealerSendHalf, frame: Vec<u8>) -> Result<(), String> {
    match tokio::time::timeout(SEND_TIMEOUT, socket.send(ZmqMessage::from(frame))).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("send timed out".into()),
    }
}

/// Why one connected session ended.
enum SessionEnd {
    Reconnect,
    Shutdown,
}

async fn run_link(
    shared: Arc<Shared>,
    peer: Peer,
    endpoint: String,
    mut outbound: Option<mpsc::Receiver<ApiToWorker>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::default();
    loop {
        if *shutdown.borrow() {
            break;
        }
        let connected = tokio::select! {
            c = connect::<DealerSocket>(&endpoint, &mut backoff, || true) => c,
            _ = shutdown.changed() => break,
        };
        let Some(Connected {
            mut socket,
            monitor,
        }) = connected
        else {
            break;
        };
        if let Some(secret) = &shared.config.link_secret {
            // Before our hello: a peer that requires the secret reads nothing of ours otherwise.
            if let Err(e) = link::auth::prove(&mut socket, secret).await {
                tracing::error!(?peer, %endpoint, error = %e, "link not authenticated; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                    _ = shutdown.changed() => break,
                }
                continue;
            }
        }
        peer.set_connected(&shared, true);
        let end = session(&shared, peer, socket, monitor, &mut outbound, &mut shutdown).await;
        peer.set_connected(&shared, false);
        match end {
            SessionEnd::Shutdown => break,
            SessionEnd::Reconnect => {
                tracing::warn!(?peer, %endpoint, "disconnected; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(Backoff::MIN) => {}
                    _ = shutdown.changed() => break,
                }
            }
        }
    }
}

async fn session(
    shared: &Shared,
    peer: Peer,
    socket: DealerSocket,
    mut monitor: futures::channel::mpsc::Receiver<SocketEvent>,
    outbound: &mut Option<mpsc::Receiver<ApiToWorker>>,
    shutdown: &mut watch::Receiver<bool>,
) -> SessionEnd {
    let (mut tx, mut rx) = socket.split();
    // Hello first on every connect: the peer learns (again) who we are.
    if send(&mut tx, peer.hello(shared)).await.is_err() {
        return SessionEnd::Reconnect;
    }
    let mut heartbeat = tokio::time::interval(shared.config.liveness.interval);
    heartbeat.tick().await;
    let liveness = shared.config.liveness;
    let mut sweeper = Sweeper::new(liveness);
    let mut heard = Instant::now();
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Ok(msg) => {
                    heard = Instant::now();
                    let reply = msg.get(0).map_or(Reply::Nothing, |frame| peer.on_frame(shared, frame));
                    if reply == Reply::Hello && send(&mut tx, peer.hello(shared)).await.is_err() {
                        return SessionEnd::Reconnect;
                    }
                }
                Err(e) => {
                    tracing::debug!(?peer, error = %e, "receive failed");
                    return SessionEnd::Reconnect;
                }
            },
            event = monitor.next() => match event {
                Some(SocketEvent::Disconnected(_)) | Some(SocketEvent::Closed) | None => {
                    return SessionEnd::Reconnect;
                }
                Some(_) => {}
            },
            Some(out) = next_outbound(outbound) => {
                let frame = match proto::encode(&out) {
                    Ok(frame) => frame,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot encode a request frame");
                        continue;
                    }
                };
                if let Err(e) = send(&mut tx, frame).await {
                    tracing::debug!(?peer, error = %e, "send failed");
                    return SessionEnd::Reconnect;
                }
            }
            _ = heartbeat.tick() => {
                let now = Instant::now();
                match sweeper.begin(now) {
                    // Paused ourselves: the silence is ours.
                    Sweep::Forgive { .. } => heard = now,
                    Sweep::Judge if liveness.is_silent(heard, now) => {
                        tracing::warn!(?peer, silent_ms = now.duration_since(heard).as_millis() as u64, "nothing heard on this connection for the liveness window; reconnecting");
                        return SessionEnd::Reconnect;
                    }
                    Sweep::Judge => {}
                }
                if send(&mut tx, peer.beat(shared)).await.is_err() {
                    return SessionEnd::Reconnect;
                }
            }
            _ = shutdown.changed() => {
                // Flush what is queued (aborts, mostly) before leaving.
                if let Some(rx) = outbound.as_mut() {
                    while let Ok(out) = rx.try_recv() {
                        if let Ok(frame) = proto::encode(&out) {
                            let _ = send(&mut tx, frame).await;
                        }
                    }
                }
                return SessionEnd::Shutdown;
            }
        }
    }
}

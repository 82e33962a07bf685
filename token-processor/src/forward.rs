//! Forwarding: a ZeroMQ ROUTER that api-servers connect to. Each api-server says hello with its
//! name; the outputs of a request go to the api-server named as its owner, one `Outputs` message
//! per owner per batch. Outputs for an owner that is not connected are dropped and counted; a
//! slow api-server costs at most [`SEND_TIMEOUT`] per message and never blocks ingest.
//!
//! Liveness is `link::liveness`'s rule: an api-server silent past the window is forgotten; a
//! heartbeat from one we do not know (forgotten, or we restarted) is answered with
//! [`TpToApi::AskHello`]. Our hello doubles as our heartbeat and lists the workers whose batches
//! we take now, so an api-server routes only where outputs can come from.

use std::time::{Duration, Instant};

use bytes::Bytes;
use link::auth::Gate;
use link::liveness::Heard;
use link::peers::{HelloOutcome, PeerTable};
use link::router::Received;
use link::Liveness;
use proto::tp_api::{ApiToTp, TpHello, TpToApi};
use tokio::sync::{mpsc, watch};
use zeromq::{RouterRecvHalf, RouterSendHalf, RouterSocket, SocketRecv, SocketSend, ZmqMessage};

use crate::ingest::OutputsByOwner;
use crate::metrics;
use crate::tracker::{encode_outputs_message, merge_by_owner};

/// Longest wait for one api-server's send queue.
pub const SEND_TIMEOUT: Duration = Duration::from_millis(200);

/// Most api-servers known at once; hellos of new names beyond it are ignored.
const MAX_API_SERVERS: usize = 256;

enum FromApi {
    /// A step of the link-secret exchange to send back (`link::auth`).
    Auth { routing_id: Bytes, reply: Vec<u8> },
    Hello {
        routing_id: Bytes,
        name: String,
        epoch: u64,
    },
    Heartbeat {
        routing_id: Bytes,
        name: String,
        epoch: u64,
    },
}

/// Runs until `outputs` is closed and drained. `live_workers` is the ingest's list of workers
/// alive now.
pub async fn run(
    router: RouterSocket,
    mut outputs: mpsc::Receiver<OutputsByOwner>,
    mut live_workers: watch::Receiver<Vec<String>>,
    liveness: Liveness,
    tp_epoch: u64,
    gate: Gate,
) {
    let (send, recv) = router.split();
    let (from_api_tx, mut from_api) = mpsc::channel::<FromApi>(256);
    let receiver = tokio::spawn(receive_from_api_servers(recv, gate, from_api_tx));
    let Some(mut forwarder) = Forwarder::new(send, liveness, tp_epoch, &mut live_workers) else {
        return;
    };
    let mut tick = tokio::time::interval(liveness.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut workers_open = true;
    loop {
        tokio::select! {
            batch = outputs.recv() => {
                let Some(mut batch) = batch else { break };
                coalesce(&mut batch, &mut outputs);
                forwarder.forward(batch).await;
            }
            msg = from_api.recv() => {
                if let Some(msg) = msg {
                    forwarder.answer(msg).await;
                }
            }
            changed = live_workers.changed(), if workers_open => {
                if changed.is_err() {
                    workers_open = false; // ingest ended; outputs close next
                    continue;
                }
                let workers = live_workers.borrow_and_update().clone();
                forwarder.workers_changed(workers).await;
            }
            _ = tick.tick() => forwarder.sweep_and_heartbeat().await,
        }
    }
    receiver.abort();
}

/// Reads the api-servers' frames, passes them through the link-secret gate, and hands what they
/// mean to the forwarding loop; ends when that loop is gone.
async fn receive_from_api_servers(
    mut recv: RouterRecvHalf,
    mut gate: Gate,
    to_loop: mpsc::Sender<FromApi>,
) {
    loop {
        let msg = match recv.recv().await {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!(error = %e, "api-server receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(from_api) = admit(&mut gate, msg) else {
            continue;
        };
        if to_loop.send(from_api).await.is_err() {
            return;
        }
    }
}

/// What one frame asks of the loop: a step of the link-secret exchange to answer, or a hello or
/// heartbeat; None for a frame the gate drops or that is not a valid message.
fn admit(gate: &mut Gate, msg: ZmqMessage) -> Option<FromApi> {
    match link::router::receive::<ApiToTp>(gate, msg) {
        Received::Message { routing_id, msg } => from_api(routing_id, msg),
        Received::Auth { routing_id, reply } => Some(FromApi::Auth { routing_id, reply }),
        Received::BadFraming { parts } => {
            tracing::warn!(
                parts,
                "dropping an api-server message with unexpected framing"
            );
            None
        }
        Received::Gated => None,
        Received::Malformed { error, .. } => {
            tracing::warn!(error = %error, "dropping malformed api-server frame");
            None
        }
    }
}

/// An admitted message as a hello (of a protocol version we speak) or a heartbeat.
fn from_api(routing_id: Bytes, msg: ApiToTp) -> Option<FromApi> {
    match msg {
        ApiToTp::Hello(hello) => {
            match proto::check_version(&hello.api_server_id, hello.protocol_version) {
                Ok(()) => Some(FromApi::Hello {
                    routing_id,
                    name: hello.api_server_id,
                    epoch: hello.epoch,
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "refusing api-server hello");
                    None
                }
            }
        }
        ApiToTp::Heartbeat {
            api_server_id,
            epoch,
        } => Some(FromApi::Heartbeat {
            routing_id,
            name: api_server_id,
            epoch,
        }),
    }
}

/// The forwarding loop's state: the send half, the api-servers it knows, and its hello.
struct Forwarder {
    send: RouterSendHalf,
    /// The api-servers that said hello, by name (outputs go to their owner by name).
    peers: PeerTable<()>,
    tp_epoch: u64,
    /// Our hello (also our heartbeat), naming the workers alive now.
    hello: Bytes,
    ask_hello: Bytes,
}

impl Forwarder {
    /// None when our own messages cannot be encoded (logged).
    fn new(
        send: RouterSendHalf,
        liveness: Liveness,
        tp_epoch: u64,
        live_workers: &mut watch::Receiver<Vec<String>>,
    ) -> Option<Self> {
        let hello = encode_hello(tp_epoch, live_workers.borrow_and_update().clone())?;
        let ask_hello = proto::encode(&TpToApi::AskHello).ok().map(Bytes::from)?;
        Some(Self {
            send,
            peers: PeerTable::new(liveness, MAX_API_SERVERS, "api-server", "api-server-id"),
            tp_epoch,
            hello,
            ask_hello,
        })
    }

    /// Sends each owner its outputs in one message; outputs whose owner is not connected, that
    /// cannot be encoded, or that its send queue does not take in time are dropped and counted.
    async fn forward(&mut self, batch: OutputsByOwner) {
        for (owner, list) in batch {
            let n = list.len();
            let Some(peer) = self.peers.get(&owner) else {
                metrics::outputs_dropped(n);
                tracing::debug!(owner = %owner, outputs = n, "owner not connected; dropping outputs");
                continue;
            };
            let frame = match encode_outputs_message(&list) {
                Ok(frame) => frame,
                Err(e) => {
                    metrics::outputs_dropped(n);
                    tracing::warn!(owner = %owner, error = %e, "cannot encode outputs");
                    continue;
                }
            };
            if !send_to(&mut self.send, &peer.routing_id, Bytes::from(frame)).await {
                metrics::outputs_dropped(n);
            }
        }
    }

    /// Handles one message from an api-server.
    async fn answer(&mut self, msg: FromApi) {
        match msg {
            FromApi::Auth { routing_id, reply } => {
                send_to(&mut self.send, &routing_id, Bytes::from(reply)).await;
            }
            FromApi::Hello {
                routing_id,
                name,
                epoch,
            } => self.hello_from(routing_id, name, epoch).await,
            FromApi::Heartbeat {
                routing_id,
                name,
                epoch,
            } => self.heartbeat_from(routing_id, name, epoch).await,
        }
    }

    /// Admits an api-server (answering with our hello), unless another live one, of another
    /// epoch, holds its name.
    async fn hello_from(&mut self, routing_id: Bytes, name: String, epoch: u64) {
        let outcome = self
            .peers
            .hello(&name, epoch, routing_id.clone(), Instant::now(), || ());
        match outcome {
            HelloOutcome::Admitted | HelloOutcome::Reconnected | HelloOutcome::Restarted { .. } => {
            }
            HelloOutcome::Refused { reason } => {
                metrics::duplicate_id_refused();
                tracing::error!(api_server = %name, "hello refused: another live api-server holds this id");
                if let Ok(frame) = proto::encode(&TpToApi::Refused { reason }) {
                    send_to(&mut self.send, &routing_id, Bytes::from(frame)).await;
                }
                return;
            }
            HelloOutcome::Full => {
                tracing::warn!(api_server = %name, "too many api-servers; hello ignored");
                return;
            }
        }
        tracing::info!(api_server = %name, "api-server said hello");
        send_to(&mut self.send, &routing_id, self.hello.clone()).await;
        metrics::set_api_servers_connected(self.peers.len());
    }

    /// Notes a known api-server as heard; asks one we do not know for its hello.
    async fn heartbeat_from(&mut self, routing_id: Bytes, name: String, epoch: u64) {
        if self.peers.heard(&name, epoch, &routing_id, Instant::now()) == Heard::AskHello {
            tracing::info!(api_server = %name, "heartbeat from an api-server we do not know; asking for its hello");
            send_to(&mut self.send, &routing_id, self.ask_hello.clone()).await;
        }
    }

    /// Api-servers learn at once which workers they may route to.
    async fn workers_changed(&mut self, workers: Vec<String>) {
        if let Some(fresh) = encode_hello(self.tp_epoch, workers) {
            self.hello = fresh;
        }
        self.send_hello_to_all().await;
    }

    /// Forgets api-servers silent too long (or forgives all after our own stall), then
    /// heartbeats the rest.
    async fn sweep_and_heartbeat(&mut self) {
        for (name, _) in self.peers.sweep(Instant::now()) {
            tracing::warn!(api_server = %name, "api-server missed its heartbeats; forgetting it");
        }
        metrics::set_api_servers_connected(self.peers.len());
        // The hello doubles as the token-processor's heartbeat.
        self.send_hello_to_all().await;
    }

    async fn send_hello_to_all(&mut self) {
        for (_, peer) in self.peers.iter() {
            send_to(&mut self.send, &peer.routing_id, self.hello.clone()).await;
        }
    }
}

/// Our hello (also our heartbeat), naming the workers alive now.
fn encode_hello(tp_epoch: u64, workers: Vec<String>) -> Option<Bytes> {
    let hello = TpToApi::Hello(TpHello {
        protocol_version: proto::PROTOCOL_VERSION,
        epoch: tp_epoch,
        workers,
    });
    match proto::encode(&hello) {
        Ok(bytes) => Some(Bytes::from(bytes)),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the token-processor hello");
            None
        }
    }
}

/// Most outputs merged into one message when the forwarder is behind (well under the frame cap).
const MAX_COALESCED_OUTPUTS: usize = 4_096;

/// When more batches are already queued (the forwarder fell behind), merges them into `batch`,
/// per owner and in order, so one message per owner carries several steps.
fn coalesce(batch: &mut OutputsByOwner, queued: &mut mpsc::Receiver<OutputsByOwner>) {
    let mut total: usize = batch.iter().map(|(_, list)| list.len()).sum();
    while total < MAX_COALESCED_OUTPUTS {
        let Ok(more) = queued.try_recv() else { break };
        total += more.iter().map(|(_, list)| list.len()).sum::<usize>();
        merge_by_owner(batch, more);
    }
}

/// Sends one frame to one peer; false when it could not be queued in time.
async fn send_to(send: &mut RouterSendHalf, routing_id: &Bytes, frame: Bytes) -> bool {
    let mut msg = ZmqMessage::from(frame);
    msg.push_front(routing_id.clone());
    match tokio::time::timeout(SEND_TIMEOUT, send.send(msg)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "send to api-server failed");
            false
        }
        Err(_) => {
            tracing::warn!("api-server send queue full; dropping a message");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proto::tp_api::RequestOutput;

    use super::*;
    use crate::tracker::OwnerOutputs;

    fn out(id: u64, first_index: u32) -> OwnerOutputs {
        let mut list = OwnerOutputs::default();
        list.push(RequestOutput {
            id,
            first_index,
            tokens: vec![1],
            finish: None,
            usage: None,
            speculate_metrics: None,
            error: None,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        });
        list
    }

    #[test]
    fn queued_batches_merge_per_owner_in_order() {
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let (tx, mut rx) = mpsc::channel(8);
        tx.try_send(vec![(a.clone(), out(1, 1)), (b.clone(), out(2, 0))])
            .unwrap();
        tx.try_send(vec![(Arc::from("a"), out(1, 2))]).unwrap();
        let mut batch = vec![(a.clone(), out(1, 0))];
        coalesce(&mut batch, &mut rx);
        assert_eq!(batch.len(), 2);
        let firsts: Vec<u32> = batch[0]
            .1
            .to_outputs()
            .iter()
            .map(|o| o.first_index)
            .collect();
        assert_eq!((&*batch[0].0, firsts), ("a", vec![0, 1, 2]));
        assert_eq!(&*batch[1].0, "b");
        assert!(rx.try_recv().is_err());
    }
}

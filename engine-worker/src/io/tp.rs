//! The token-processor link: a DEALER, connected by us, re-created by `link::connect` whenever
//! it breaks or stalls. Every (re)connect says hello and asks the step loop for a resync; batches
//! queued before that resync are stale and dropped.
//!
//! The token-processor answers every heartbeat with an acknowledgement of the batches it took
//! (by sequence number). Acknowledgements silent past the liveness window (`link::liveness`:
//! a paused, wedged or vanished token-processor) mean a stalled link: we drop the connection,
//! and with it whatever zeromq still queues for it, and reconnect, so the resync replays what
//! it missed (finished requests included, until their api-server acknowledges them). An
//! `AskHello` (it forgot us: declared us dead while we were paused, or restarted) gets a hello
//! and a resync, at most one per heartbeat interval.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use link::connect::{connect, Connected};
use link::liveness::PeerClock;
use link::{Backoff, Liveness, Sweep, Sweeper};
use proto::worker_tp::{TpToWorker, WorkerToTp};
use tokio::sync::mpsc::Receiver;
use zeromq::{
    DealerRecvHalf, DealerSendHalf, DealerSocket, SocketEvent, SocketRecv, SocketSend, ZmqMessage,
};

use super::{TpOutbound, WorkerStatus};

#[derive(Debug, Clone)]
pub struct TpLinkConfig {
    pub endpoint: String,
    /// The link secret the token-processor may require (`link::auth`).
    pub secret: Option<link::auth::Secret>,
    pub heartbeat_interval: Duration,
    /// A send blocked longer than this means a stalled peer: reconnect and resync.
    pub send_timeout: Duration,
    /// How long to let the last messages reach the wire before closing.
    pub linger: Duration,
}

enum LinkEnd {
    /// The step loop said goodbye (or went away): stop.
    Finished,
    /// The connection broke, or the token-processor stopped acknowledging: reconnect.
    Broken(&'static str),
}

/// Runs the link until the step loop's goodbye has been sent (or the step loop is gone).
pub async fn run_tp_link(
    cfg: TpLinkConfig,
    status: Arc<WorkerStatus>,
    mut rx: Receiver<TpOutbound>,
) {
    let mut backoff = Backoff::default();
    loop {
        // Keep the step loop's queue moving while down; a resync follows the reconnect.
        let keep_trying = || {
            while let Ok(msg) = rx.try_recv() {
                if matches!(msg, TpOutbound::Goodbye) {
                    tracing::warn!(
                        "shutting down without a token-processor; goodbye not delivered"
                    );
                    return false;
                }
            }
            true
        };
        let Some(Connected {
            mut socket,
            monitor,
        }) = connect::<DealerSocket>(&cfg.endpoint, &mut backoff, keep_trying).await
        else {
            return;
        };
        if let Some(secret) = &cfg.secret {
            if let Err(e) = link::auth::prove(&mut socket, secret).await {
                tracing::error!(endpoint = %cfg.endpoint, error = %e, "token-processor link not authenticated; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        }
        let (mut send, recv) = socket.split();
        match serve_connection(&cfg, &status, &mut rx, &mut send, recv, monitor).await {
            LinkEnd::Finished => {
                tokio::time::sleep(cfg.linger).await;
                return;
            }
            LinkEnd::Broken(why) => {
                status.set_tp_link_down();
                tracing::warn!(endpoint = %cfg.endpoint, why, "token-processor link lost; reconnecting");
            }
        }
    }
}

async fn send(socket: &mut DealerSendHalf, msg: &WorkerToTp, timeout: Duration) -> bool {
    let frame = match proto::encode(msg) {
        Ok(frame) => frame,
        Err(err) => {
            tracing::error!(error = %err, "cannot encode message for the token-processor");
            return true;
        }
    };
    matches!(
        tokio::time::timeout(timeout, socket.send(ZmqMessage::from(frame))).await,
        Ok(Ok(()))
    )
}

/// What one message from the token-processor asks of the link.
enum TpAsks {
    Nothing,
    /// Say hello and resync.
    Hello,
}

/// Applies a message from the token-processor: any message proves it alive.
fn on_tp_message(frame: &[u8], status: &WorkerStatus, tp: &mut PeerClock, now: Instant) -> TpAsks {
    let msg = match proto::decode::<TpToWorker>(frame) {
        Ok(msg) => msg,
        Err(e) => {
            tracing::warn!(error = %e, bytes = frame.len(), "dropping malformed token-processor frame");
            return TpAsks::Nothing;
        }
    };
    tp.hello(now);
    match msg {
        TpToWorker::Ack { epoch, next_seq } if epoch == status.epoch => {
            status.set_tp_acked(next_seq);
            TpAsks::Nothing
        }
        TpToWorker::Ack { .. } => TpAsks::Nothing,
        TpToWorker::AskHello => TpAsks::Hello,
        TpToWorker::Refused { reason } => {
            tracing::error!(%reason, "the token-processor refused our hello; it asks again while it does not take us");
            TpAsks::Nothing
        }
    }
}

async fn serve_connection(
    cfg: &TpLinkConfig,
    status: &WorkerStatus,
    rx: &mut Receiver<TpOutbound>,
    socket: &mut DealerSendHalf,
    mut recv: DealerRecvHalf,
    mut monitor: futures::channel::mpsc::Receiver<SocketEvent>,
) -> LinkEnd {
    status.request_resync();
    if !send(socket, &WorkerToTp::Hello(status.hello()), cfg.send_timeout).await {
        return LinkEnd::Broken("hello not sent");
    }
    let mut last_hello = Instant::now();
    let mut awaiting_resync = true;
    // Heartbeats carry the next seq actually sent on this socket: the step loop's counter also
    // covers batches still queued in `rx`, which would make the TP see a gap that is not one.
    let mut sent_next_seq: Option<u64> = None;
    let liveness = Liveness::new(cfg.heartbeat_interval);
    // The connect counts as the token-processor's hello: it has one window to acknowledge.
    let mut tp = PeerClock::default();
    tp.hello(last_hello);
    let mut sweeper = Sweeper::new(liveness);
    let mut heartbeat = tokio::time::interval(cfg.heartbeat_interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Some(msg) = msg else { return LinkEnd::Finished };
                let wire = match msg {
                    TpOutbound::Step(batch) => {
                        if awaiting_resync {
                            continue;
                        }
                        sent_next_seq = Some(batch.seq + 1);
                        WorkerToTp::Step(batch)
                    }
                    TpOutbound::Resync(resync) => {
                        // A resync always follows a hello, also one after a local overflow.
                        if !awaiting_resync
                            && !send(socket, &WorkerToTp::Hello(status.hello()), cfg.send_timeout).await
                        {
                            return LinkEnd::Broken("hello not sent");
                        }
                        awaiting_resync = false;
                        sent_next_seq = Some(resync.next_seq);
                        WorkerToTp::Resync(resync)
                    }
                    TpOutbound::Goodbye => {
                        let bye = WorkerToTp::Goodbye {
                            worker_id: status.worker_id.clone(),
                            epoch: status.epoch,
                        };
                        send(socket, &bye, cfg.send_timeout).await;
                        return LinkEnd::Finished;
                    }
                };
                if !send(socket, &wire, cfg.send_timeout).await {
                    return LinkEnd::Broken("send timed out");
                }
            }
            _ = heartbeat.tick() => {
                let now = Instant::now();
                match sweeper.begin(now) {
                    Sweep::Judge => {
                        if tp.expire(liveness, now) {
                            return LinkEnd::Broken("no acknowledgement within the liveness window");
                        }
                    }
                    Sweep::Forgive { .. } => tp.forgive(now),
                }
                // Until the resync is on the wire this socket has carried no batch: a heartbeat
                // would announce the step loop's counter to a token-processor that still expects
                // the old connection's next batch, and it would fail every request for a gap the
                // resync is about to fill.
                if awaiting_resync {
                    continue;
                }
                let mut beat = status.heartbeat();
                beat.next_seq = sent_next_seq.unwrap_or(beat.next_seq);
                if !send(socket, &WorkerToTp::Heartbeat(beat), cfg.send_timeout).await {
                    return LinkEnd::Broken("send timed out");
                }
            }
            msg = recv.recv() => {
                let Ok(msg) = msg else { return LinkEnd::Broken("receive failed") };
                let now = Instant::now();
                let mut say_hello = false;
                for frame in msg.iter() {
                    say_hello |= matches!(on_tp_message(frame, status, &mut tp, now), TpAsks::Hello);
                }
                if say_hello && now.duration_since(last_hello) >= cfg.heartbeat_interval {
                    tracing::info!("the token-processor does not know us; hello and resync");
                    last_hello = now;
                    status.request_resync();
                    awaiting_resync = true;
                    if !send(socket, &WorkerToTp::Hello(status.hello()), cfg.send_timeout).await {
                        return LinkEnd::Broken("hello not sent");
                    }
                }
            }
            event = monitor.next() => {
                if matches!(event, Some(SocketEvent::Disconnected(_)) | None) {
                    return LinkEnd::Broken("disconnected");
                }
            }
        }
    }
}

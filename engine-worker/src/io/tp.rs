//! The token-processor link: PUSH, connected by us, re-created by `link::connect` whenever it
//! breaks. Every (re)connect says hello and asks the step loop for a resync; batches queued
//! before that resync are stale and dropped. The link is one-way, so the token-processor cannot
//! ask for a hello when it forgot us (declared us dead while we were paused): we repeat the hello
//! every [`HELLO_EVERY`] heartbeats, which a token-processor that knows us takes as a no-op.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use link::connect::{connect, Connected};
use link::Backoff;
use proto::worker_tp::WorkerToTp;
use tokio::sync::mpsc::Receiver;
use zeromq::{PushSocket, SocketEvent, SocketSend, ZmqMessage};

use super::{TpOutbound, WorkerStatus};

#[derive(Debug, Clone)]
pub struct TpLinkConfig {
    pub endpoint: String,
    pub heartbeat_interval: Duration,
    /// A send blocked longer than this means a stalled peer: reconnect and resync.
    pub send_timeout: Duration,
    /// How long to let the last messages reach the wire before closing.
    pub linger: Duration,
}

/// Heartbeats between two repeated hellos (see the module doc).
pub const HELLO_EVERY: u32 = 4;

enum LinkEnd {
    /// The step loop said goodbye (or went away): stop.
    Finished,
    /// The connection broke: reconnect.
    Broken,
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
        }) = connect::<PushSocket>(&cfg.endpoint, &mut backoff, keep_trying).await
        else {
            return;
        };
        match serve_connection(&cfg, &status, &mut rx, &mut socket, monitor).await {
            LinkEnd::Finished => {
                tokio::time::sleep(cfg.linger).await;
                return;
            }
            LinkEnd::Broken => {
                tracing::warn!(endpoint = %cfg.endpoint, "token-processor link broken; reconnecting");
            }
        }
    }
}

async fn send(socket: &mut PushSocket, msg: &WorkerToTp, timeout: Duration) -> bool {
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

async fn serve_connection(
    cfg: &TpLinkConfig,
    status: &WorkerStatus,
    rx: &mut Receiver<TpOutbound>,
    socket: &mut PushSocket,
    mut monitor: futures::channel::mpsc::Receiver<SocketEvent>,
) -> LinkEnd {
    status.request_resync();
    if !send(socket, &WorkerToTp::Hello(status.hello()), cfg.send_timeout).await {
        return LinkEnd::Broken;
    }
    let mut awaiting_resync = true;
    // Heartbeats carry the next seq actually sent on this socket: the step loop's counter also
    // covers batches still queued in `rx`, which would make the TP see a gap that is not one.
    let mut sent_next_seq: Option<u64> = None;
    let mut heartbeat = tokio::time::interval(cfg.heartbeat_interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beats: u32 = 0;
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
                            return LinkEnd::Broken;
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
                    return LinkEnd::Broken;
                }
            }
            _ = heartbeat.tick() => {
                beats = beats.wrapping_add(1);
                if beats.is_multiple_of(HELLO_EVERY)
                    && !send(socket, &WorkerToTp::Hello(status.hello()), cfg.send_timeout).await
                {
                    return LinkEnd::Broken;
                }
                let mut beat = status.heartbeat();
                beat.next_seq = sent_next_seq.unwrap_or(beat.next_seq);
                if !send(socket, &WorkerToTp::Heartbeat(beat), cfg.send_timeout).await {
                    return LinkEnd::Broken;
                }
            }
            event = monitor.next() => {
                if matches!(event, Some(SocketEvent::Disconnected(_)) | None) {
                    return LinkEnd::Broken;
                }
            }
        }
    }
}

//! The token-processor link: a DEALER, connected by us, re-created by `link::connect` whenever
//! it breaks or stalls. Every (re)connect says hello and asks the step loop for a resync; batches
//! queued before that resync are stale and dropped. While the model loads there is no step loop
//! to resync: the link beats anyway (no batch numbered yet), and the resync after the load comes
//! behind a hello that says the worker is ready.
//!
//! The token-processor answers every heartbeat with an acknowledgement of the batches it took
//! (by sequence number). Acknowledgements silent past the liveness window (`link::liveness`:
//! a paused, wedged or vanished token-processor) mean a stalled link: we drop the connection,
//! and with it whatever zeromq still queues for it, and reconnect, so the resync replays what
//! it missed (finished requests included, until their api-server acknowledges them). An
//! `AskHello` (it forgot us: declared us dead while we were paused, or restarted) gets a hello
//! and a resync, at most one per heartbeat interval.

use std::ops::ControlFlow;
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
    let liveness = Liveness::new(cfg.heartbeat_interval);
    let mut conn = Connection::new(cfg, status, socket, liveness);
    if let ControlFlow::Break(end) = conn.send_hello().await {
        return end;
    }
    let mut sweeper = Sweeper::new(liveness);
    let mut heartbeat = tokio::time::interval(cfg.heartbeat_interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let flow = tokio::select! {
            msg = rx.recv() => match msg {
                Some(msg) => conn.on_outbound(msg).await,
                None => ControlFlow::Break(LinkEnd::Finished),
            },
            _ = heartbeat.tick() => conn.on_tick(&mut sweeper).await,
            msg = recv.recv() => match msg {
                Ok(msg) => conn.on_frames(&msg).await,
                Err(_) => ControlFlow::Break(LinkEnd::Broken("receive failed")),
            },
            event = monitor.next() => {
                if matches!(event, Some(SocketEvent::Disconnected(_)) | None) {
                    ControlFlow::Break(LinkEnd::Broken("disconnected"))
                } else {
                    ControlFlow::Continue(())
                }
            }
        };
        if let ControlFlow::Break(end) = flow {
            return end;
        }
    }
}

/// One connection's state; each event handler breaks with how the connection ended.
struct Connection<'a> {
    cfg: &'a TpLinkConfig,
    status: &'a WorkerStatus,
    socket: &'a mut DealerSendHalf,
    liveness: Liveness,
    last_hello: Instant,
    /// Whether our last hello said the model is loaded: the resync that follows the load is
    /// preceded by a hello that says so.
    hello_said_ready: bool,
    /// Batches queued before the resync are stale: dropped until it is sent.
    awaiting_resync: bool,
    /// Heartbeats carry the next seq actually sent on this socket: the step loop's counter also
    /// covers batches still queued in `rx`, which would make the TP see a gap that is not one.
    sent_next_seq: Option<u64>,
    tp: PeerClock,
}

impl<'a> Connection<'a> {
    /// Just before our hello.
    fn new(
        cfg: &'a TpLinkConfig,
        status: &'a WorkerStatus,
        socket: &'a mut DealerSendHalf,
        liveness: Liveness,
    ) -> Self {
        let last_hello = Instant::now();
        // The connect counts as the token-processor's hello: it has one window to acknowledge
        // our first heartbeat (see `on_tick`).
        let mut tp = PeerClock::default();
        tp.hello(last_hello);
        Self {
            cfg,
            status,
            socket,
            liveness,
            last_hello,
            hello_said_ready: false,
            awaiting_resync: true,
            sent_next_seq: None,
            tp,
        }
    }

    async fn send_or_break(&mut self, msg: &WorkerToTp, why: &'static str) -> ControlFlow<LinkEnd> {
        if send(&mut *self.socket, msg, self.cfg.send_timeout).await {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(LinkEnd::Broken(why))
        }
    }

    /// A message from the step loop.
    async fn on_outbound(&mut self, msg: TpOutbound) -> ControlFlow<LinkEnd> {
        let wire = match msg {
            TpOutbound::Step(batch) => {
                if self.awaiting_resync {
                    return ControlFlow::Continue(());
                }
                self.sent_next_seq = Some(batch.seq + 1);
                WorkerToTp::Step(batch)
            }
            TpOutbound::Resync(resync) => {
                // A resync always follows a hello, also one after a local overflow, and one
                // that says the model is loaded.
                if !self.awaiting_resync || !self.hello_said_ready {
                    self.send_hello().await?;
                }
                self.awaiting_resync = false;
                self.sent_next_seq = Some(resync.next_seq);
                WorkerToTp::Resync(resync)
            }
            TpOutbound::Goodbye => {
                let bye = WorkerToTp::Goodbye {
                    worker_id: self.status.worker_id.clone(),
                    epoch: self.status.epoch,
                };
                send(&mut *self.socket, &bye, self.cfg.send_timeout).await;
                return ControlFlow::Break(LinkEnd::Finished);
            }
        };
        self.send_or_break(&wire, "send timed out").await
    }

    /// Judges the token-processor's liveness, then beats.
    async fn on_tick(&mut self, sweeper: &mut Sweeper) -> ControlFlow<LinkEnd> {
        let now = Instant::now();
        let sweep = sweeper.begin(now);
        // While the model loads no batch has been numbered, so a heartbeat saying "next: 0" is
        // true and keeps both sides' liveness windows honest through a long load (silent, the
        // token-processor declared a loading worker dead). Once the step loop runs, until the
        // resync is on the wire this socket has carried no batch: a heartbeat would announce the
        // step loop's counter to a token-processor that still expects the old connection's next
        // batch, and it would fail every request for a gap the resync is about to fill. So we
        // send nothing the token-processor answers, and its silence says nothing yet: its window
        // starts with our first heartbeat.
        let loading = !self.status.is_ready();
        if self.awaiting_resync && !loading {
            self.tp.forgive(now);
            return ControlFlow::Continue(());
        }
        match sweep {
            Sweep::Judge => {
                if self.tp.expire(self.liveness, now) {
                    return ControlFlow::Break(LinkEnd::Broken(
                        "no acknowledgement within the liveness window",
                    ));
                }
            }
            Sweep::Forgive { .. } => self.tp.forgive(now),
        }
        let mut beat = self.status.heartbeat();
        beat.next_seq = match (loading, self.sent_next_seq) {
            (true, _) => 0,
            (false, sent) => sent.unwrap_or(beat.next_seq),
        };
        self.send_or_break(&WorkerToTp::Heartbeat(beat), "send timed out")
            .await
    }

    /// Messages from the token-processor; one that forgot us gets a hello and a resync, at most
    /// one per heartbeat interval.
    async fn on_frames(&mut self, msg: &ZmqMessage) -> ControlFlow<LinkEnd> {
        let now = Instant::now();
        let mut say_hello = false;
        for frame in msg.iter() {
            say_hello |= matches!(
                on_tp_message(frame, self.status, &mut self.tp, now),
                TpAsks::Hello
            );
        }
        if say_hello && now.duration_since(self.last_hello) >= self.cfg.heartbeat_interval {
            tracing::info!("the token-processor does not know us; hello and resync");
            self.last_hello = now;
            self.status.request_resync();
            self.awaiting_resync = true;
            self.send_hello().await?;
        }
        ControlFlow::Continue(())
    }

    async fn send_hello(&mut self) -> ControlFlow<LinkEnd> {
        let hello = self.status.hello();
        self.hello_said_ready = hello.ready;
        self.send_or_break(&WorkerToTp::Hello(hello), "hello not sent")
            .await
    }
}

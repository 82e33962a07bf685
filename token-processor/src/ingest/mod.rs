//! The ingest loop: a ZeroMQ ROUTER that every engine-worker connects to, feeding the
//! [`Ingest`] state machine, checking heartbeat deadlines, and handing each batch's outputs to
//! the forwarder without ever waiting on it. Replies to workers (acknowledgements, hello
//! requests) go through a bounded queue to their own task, so a worker that does not read
//! cannot stall ingest: past the queue, replies are dropped (each is repeated by the next
//! heartbeat's).

mod state;
#[cfg(test)]
mod tests;

pub use state::{
    Ingest, IngestConfig, IngestStats, WorkerEntry, WorkerView, DEFAULT_DEPARTED_RETENTION,
    DEFAULT_MAX_REQUESTS_PER_WORKER, DEFAULT_MAX_WORKERS, MAX_SPEC_TOKENS,
};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use link::auth::Gate;
use link::router::Received;
use link::service::Watchdog;
use link::{Liveness, Sweep, Sweeper};
use proto::worker_tp::{TpToWorker, WorkerToTp};
use tokio::sync::{mpsc, watch};
use zeromq::{RouterSendHalf, RouterSocket, SocketRecv, SocketSend, ZmqMessage};

use crate::metrics;
use crate::tracker::{Clock, Outbox};

pub use crate::tracker::OutputsByOwner;

/// How often deadlines are checked and the loop proves it is alive.
pub const TICK: Duration = Duration::from_millis(100);

/// What `/health` reads: set by the ingest loop, read by the HTTP handler.
#[derive(Debug)]
pub struct IngestHealth {
    origin: Instant,
    /// Monotonic ns (since `origin`) of the loop's last turn.
    last_turn_ns: AtomicU64,
    live_workers: AtomicUsize,
    /// The live workers' latest hellos and KV-block use (what `/health` shows of each),
    /// copied only when [`Ingest::roster_version`] moved past `roster_version` (only the ingest
    /// loop writes).
    roster_version: AtomicU64,
    views: Mutex<Vec<WorkerView>>,
}

impl IngestHealth {
    pub fn new(origin: Instant) -> Self {
        Self {
            origin,
            last_turn_ns: AtomicU64::new(0),
            live_workers: AtomicUsize::new(0),
            roster_version: AtomicU64::new(0),
            views: Mutex::new(Vec::new()),
        }
    }

    fn beat(&self, ingest: &Ingest) {
        self.last_turn_ns
            .store(self.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.live_workers
            .store(ingest.live_workers(), Ordering::Relaxed);
        let version = ingest.roster_version();
        if self.roster_version.load(Ordering::Relaxed) != version {
            *self.views.lock().unwrap_or_else(|e| e.into_inner()) = ingest.live_worker_views();
            self.roster_version.store(version, Ordering::Relaxed);
        }
    }

    /// The live workers' latest hellos and KV-block use, by id.
    pub fn workers(&self) -> Vec<WorkerView> {
        self.views.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Ok(live workers) while the loop turned recently and some worker is alive; else why not.
    pub fn check(&self) -> Result<usize, String> {
        let now = self.origin.elapsed().as_nanos() as u64;
        let last = self.last_turn_ns.load(Ordering::Relaxed);
        if last == 0 {
            return Err("ingest loop has not started".into());
        }
        let stalled_ms = now.saturating_sub(last) / 1_000_000;
        if stalled_ms > 20 * TICK.as_millis() as u64 {
            return Err(format!("ingest loop stalled for {stalled_ms} ms"));
        }
        match self.live_workers.load(Ordering::Relaxed) {
            0 => Err("no engine-worker said hello within its heartbeat window".into()),
            n => Ok(n),
        }
    }
}

/// The clock the state machine sees, relative to `origin`.
pub fn clock(origin: Instant) -> Clock {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Clock {
        mono_ns: origin.elapsed().as_nanos() as u64,
        unix_ms,
    }
}

/// What the ingest loop shares with the rest of the process.
pub struct IngestIo {
    pub forward: mpsc::Sender<OutputsByOwner>,
    pub health: Arc<IngestHealth>,
    /// The live workers' ids, for the forwarder's hellos (api-servers route only to these).
    pub live_workers: watch::Sender<Vec<String>>,
    pub shutdown: watch::Receiver<bool>,
    /// Fed from this loop: it is the token-processor's main loop.
    pub watchdog: Watchdog,
    /// What a worker's connection must prove before its frames are read (`link::auth`).
    pub gate: Gate,
}

/// Runs until `shutdown` turns true (or its sender is dropped), then returns, dropping
/// `forward` so the forwarder drains and stops.
pub async fn run(router: RouterSocket, mut ingest: Ingest, io: IngestIo) -> Ingest {
    let IngestIo {
        forward,
        health,
        live_workers,
        mut shutdown,
        mut watchdog,
        mut gate,
    } = io;
    let origin = health.origin;
    let (send_half, mut recv) = router.split();
    let (replies, reply_rx) = mpsc::channel(REPLY_QUEUE);
    let reply_task = tokio::spawn(send_replies(send_half, reply_rx));
    let mut out = Outbox::default();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The sweep runs every TICK; a sweep much later than that means this process was paused.
    let mut sweeper = Sweeper::new(Liveness::new(TICK));
    health.beat(&ingest);
    loop {
        tokio::select! {
            biased;
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                match sweeper.begin(now) {
                    Sweep::Judge => ingest.tick(clock(origin), &mut out),
                    Sweep::Forgive { .. } => ingest.forgive(clock(origin)),
                }
                watchdog.feed(now);
            }
            msg = recv.recv() => {
                let received = Instant::now();
                match msg {
                    Ok(msg) => match link::router::receive::<WorkerToTp>(&mut gate, msg) {
                        Received::Message { routing_id, msg } => {
                            if let Some(reply) = ingest.handle_from(&routing_id, msg, clock(origin), received, &mut out) {
                                queue_reply(&replies, &routing_id, &reply);
                            }
                        }
                        Received::Auth { routing_id, reply } => {
                            let mut msg = ZmqMessage::from(reply);
                            msg.push_front(routing_id);
                            let _ = replies.try_send(msg);
                        }
                        Received::BadFraming { parts } => {
                            metrics::malformed_frame();
                            tracing::warn!(parts, "dropping an ingest message with unexpected framing");
                        }
                        Received::Gated => {}
                        Received::Malformed { error, bytes, .. } => {
                            metrics::malformed_frame();
                            tracing::warn!(error = %error, bytes, "dropping malformed ingest frame");
                        }
                    },
                    Err(e) => tracing::warn!(error = %e, "ingest receive failed"),
                }
            }
        }
        health.beat(&ingest);
        publish_live_workers(&ingest, &live_workers);
        let dropped = hand_off(&mut out, &forward, MAX_HELD_OUTPUTS);
        if dropped > 0 {
            metrics::outputs_dropped(dropped);
            tracing::warn!(
                outputs = dropped,
                held_max = MAX_HELD_OUTPUTS,
                "forwarder far behind; dropping held outputs"
            );
        }
    }
    // Outputs still held go out before the forwarder is told to stop (bounded by the caller's
    // shutdown wait).
    if !out.is_empty() {
        let _ = forward.send(out.take()).await;
    }
    reply_task.abort();
    ingest
}

/// Replies queued for workers; past this they are dropped (acknowledgements repeat with every
/// heartbeat, hello requests with every message of an unknown worker).
pub const REPLY_QUEUE: usize = 1024;

/// Longest wait for one worker's send queue.
pub const REPLY_SEND_TIMEOUT: Duration = Duration::from_millis(200);

fn queue_reply(replies: &mpsc::Sender<ZmqMessage>, routing_id: &Bytes, reply: &TpToWorker) {
    let frame = match proto::encode(reply) {
        Ok(frame) => frame,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode a reply to a worker");
            return;
        }
    };
    let mut msg = ZmqMessage::from(frame);
    msg.push_front(routing_id.clone());
    if replies.try_send(msg).is_err() {
        tracing::debug!("worker reply queue full; dropping a reply");
    }
}

async fn send_replies(mut send: RouterSendHalf, mut replies: mpsc::Receiver<ZmqMessage>) {
    while let Some(msg) = replies.recv().await {
        match tokio::time::timeout(REPLY_SEND_TIMEOUT, send.send(msg)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "reply to a worker failed"),
            Err(_) => tracing::debug!("worker send queue full; dropping a reply"),
        }
    }
}

/// Tells the forwarder which workers are alive when that changed.
fn publish_live_workers(ingest: &Ingest, live_workers: &watch::Sender<Vec<String>>) {
    if live_workers.borrow().len() == ingest.live_workers()
        && live_workers
            .borrow()
            .iter()
            .all(|id| ingest.worker(id).is_some())
    {
        return;
    }
    live_workers.send_replace(ingest.live_worker_ids());
}

/// Most outputs ingest holds back while the forwarder's queue is full. Held outputs ride with
/// later batches (one message per owner), so a forwarder that loses the CPU for a few
/// milliseconds delays outputs instead of losing them; past this bound they are dropped.
pub const MAX_HELD_OUTPUTS: usize = 65_536;

/// Hands the outbox to the forwarder without ever waiting. When its queue is full the outputs
/// stay in `out`, where later batches append to the same per-owner lists (order holds), until
/// more than `max_held` are held: then they are dropped. Returns how many were dropped.
fn hand_off(out: &mut Outbox, forward: &mpsc::Sender<OutputsByOwner>, max_held: usize) -> usize {
    if out.is_empty() {
        return 0;
    }
    match forward.try_send(out.take()) {
        Ok(()) => 0,
        Err(mpsc::error::TrySendError::Full(back)) => {
            out.restore(back);
            let held = out.len();
            if held > max_held {
                drop(out.take());
                held
            } else {
                0
            }
        }
        Err(mpsc::error::TrySendError::Closed(back)) => {
            back.iter().map(|(_, list)| list.len()).sum()
        }
    }
}

#[cfg(test)]
mod hand_off_tests {
    use std::sync::Arc;

    use super::*;

    fn tokens_of(batch: &OutputsByOwner) -> Vec<u32> {
        batch
            .iter()
            .flat_map(|(_, list)| list.to_outputs())
            .flat_map(|o| o.tokens)
            .collect()
    }

    #[test]
    fn a_full_queue_holds_outputs_in_order_then_drops_past_the_bound() {
        let owner: Arc<str> = Arc::from("api-a");
        let (tx, mut rx) = mpsc::channel(1);
        let mut out = Outbox::default();
        out.push_tokens(&owner, 1, 0, &[10], &[]);
        assert_eq!(hand_off(&mut out, &tx, 3), 0);
        assert!(out.is_empty(), "sent");
        // Queue full: held, and later outputs join the same list.
        out.push_tokens(&owner, 1, 1, &[11], &[]);
        assert_eq!(hand_off(&mut out, &tx, 3), 0);
        out.push_tokens(&owner, 1, 2, &[12], &[]);
        assert_eq!(hand_off(&mut out, &tx, 3), 0);
        assert_eq!(out.len(), 2);
        assert_eq!(tokens_of(&rx.try_recv().unwrap()), vec![10]);
        out.push_tokens(&owner, 1, 3, &[13], &[]);
        assert_eq!(hand_off(&mut out, &tx, 3), 0);
        let merged = rx.try_recv().unwrap();
        assert_eq!(merged.len(), 1, "one list per owner");
        assert_eq!(tokens_of(&merged), vec![11, 12, 13]);
        // Past the bound the held outputs are dropped and counted.
        tx.try_send(Vec::new()).unwrap();
        for i in 0..4 {
            out.push_tokens(&owner, 2, i, &[20 + i], &[]);
        }
        assert_eq!(hand_off(&mut out, &tx, 3), 4);
        assert!(out.is_empty());
        // A closed queue counts everything it was handed as dropped.
        drop(rx);
        out.push_tokens(&owner, 3, 0, &[30, 31], &[]);
        assert_eq!(hand_off(&mut out, &tx, 3), 1);
    }
}

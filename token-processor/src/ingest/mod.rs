//! The ingest loop: a ZeroMQ PULL socket that every engine-worker pushes to, feeding the
//! [`Ingest`] state machine, checking heartbeat deadlines, and handing each batch's outputs to
//! the forwarder without ever waiting on it.

mod state;
#[cfg(test)]
mod tests;

pub use state::{Ingest, IngestConfig, IngestStats, WorkerEntry, MAX_SPEC_TOKENS};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proto::worker_tp::WorkerToTp;
use tokio::sync::{mpsc, watch};
use zeromq::{PullSocket, SocketRecv};

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
}

impl IngestHealth {
    pub fn new(origin: Instant) -> Self {
        Self {
            origin,
            last_turn_ns: AtomicU64::new(0),
            live_workers: AtomicUsize::new(0),
        }
    }

    fn beat(&self, live_workers: usize) {
        self.last_turn_ns
            .store(self.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.live_workers.store(live_workers, Ordering::Relaxed);
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

/// Runs until `shutdown` turns true (or its sender is dropped), then returns, dropping
/// `forward` so the forwarder drains and stops.
pub async fn run(
    mut pull: PullSocket,
    mut ingest: Ingest,
    forward: mpsc::Sender<OutputsByOwner>,
    health: Arc<IngestHealth>,
    mut shutdown: watch::Receiver<bool>,
    watchdog: bool,
) -> Ingest {
    let origin = health.origin;
    let mut out = Outbox::default();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    health.beat(0);
    loop {
        tokio::select! {
            biased;
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
            _ = tick.tick() => {
                ingest.tick(clock(origin), &mut out);
                if watchdog {
                    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
                }
            }
            msg = pull.recv() => {
                let received = Instant::now();
                match msg {
                    Ok(msg) => {
                        for frame in msg.iter() {
                            match proto::decode::<WorkerToTp>(frame) {
                                Ok(decoded) => ingest.handle(decoded, clock(origin), received, &mut out),
                                Err(e) => {
                                    metrics::malformed_frame();
                                    tracing::warn!(error = %e, bytes = frame.len(), "dropping malformed ingest frame");
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "ingest receive failed"),
                }
            }
        }
        health.beat(ingest.live_workers());
        if !out.is_empty() {
            let n = out.len();
            if forward.try_send(out.take()).is_err() {
                // The forwarder is behind: never stall ingest for it.
                metrics::outputs_dropped(n);
                tracing::warn!(outputs = n, "forward queue full; dropping outputs");
            }
        }
    }
    ingest
}

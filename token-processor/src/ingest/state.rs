//! The ingest state machine: which workers are alive, in which epoch, at which sequence number,
//! and what each message does to their requests. No sockets and no clock of its own (time comes
//! in as [`Clock`]), so every rule here is unit-tested directly.
//!
//! Rules:
//! - A worker is known from its hello (id, epoch, K, proposer). Anything from a worker not yet
//!   known is dropped and counted until its hello arrives; state is never invented. A hello
//!   whose proposer cannot be a metric label (`proto::worker_tp::check_proposer`) is refused.
//! - Per (worker, epoch) batches carry `seq` 0, 1, 2, ... A jump is a gap: counted, and every
//!   request in flight on that worker fails with `StepGap` (its figures would be wrong). A
//!   heartbeat's `next_seq` beyond ours is a gap too (the last batch was lost).
//! - A resync is authoritative: the worker's view replaces ours and `next_seq` is taken from it.
//! - A new epoch, a goodbye, or silence past the liveness window (`link::liveness`) fail the old
//!   epoch's requests with `WorkerLost` and forget the worker.
//! - Each message gets at most one reply ([`TpToWorker`]) on its connection: a heartbeat or
//!   resync of a worker we take is acknowledged with the `next_seq` we expect (every batch
//!   below it was taken); anything from a (worker, epoch) we do not take — never said hello,
//!   declared dead, or we restarted — is answered with `AskHello` (`link::liveness` rule 2), and
//!   the worker's hello and resync rebuild its requests. A hello of a known epoch keeps the
//!   worker's state and takes what a loading worker learns (ready, draft KV bytes, proposer); a
//!   refused hello is answered with the reason.
//! - When the token-processor itself was paused, [`Ingest::forgive`] restarts every worker's
//!   clock instead of [`Ingest::tick`] declaring them all dead.
//! - Every batch is validated against the worker's K first; an invalid one is counted, dropped,
//!   and the requests it names fail.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use link::peers::{hello_rule, HelloRule, Holder};
use link::Liveness;

use bytes::Bytes;
use proto::tp_api::OutputErrorKind;
use proto::worker_tp::{
    check_hello, Heartbeat, KvBlocks, Resync, StepBatch, TpToWorker, WorkerHello, WorkerToTp,
};
use proto::{RequestId, SpeculateMetrics};

use crate::metrics::{self, WorkerMetrics};
use crate::tracker::{Clock, Figures, Observations, Outbox, RequestClasses, Tracker};

pub use proto::worker_tp::MAX_SPEC_TOKENS;

/// Default in-flight requests per worker (`--max-requests`).
pub const DEFAULT_MAX_REQUESTS_PER_WORKER: usize = 65_536;
/// Default workers tracked at once (`--max-workers`).
pub const DEFAULT_MAX_WORKERS: usize = 256;

#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// In-flight requests per worker; beyond it new requests fail explicitly.
    pub max_requests_per_worker: usize,
    /// Workers tracked at once; hellos beyond it are refused.
    pub max_workers: usize,
    /// The request classes that label the acceptance series (anything else is `other`).
    pub classes: Arc<RequestClasses>,
    /// How long a departed worker's series and totals are kept (a last scrape or alert sees
    /// its final figures), then removed: workers that come and go under new ids do not grow
    /// `/metrics` or the books without limit.
    pub departed_retention: Duration,
}

/// The default [`IngestConfig::departed_retention`].
pub const DEFAULT_DEPARTED_RETENTION: Duration = Duration::from_secs(600);

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            max_requests_per_worker: DEFAULT_MAX_REQUESTS_PER_WORKER,
            max_workers: DEFAULT_MAX_WORKERS,
            classes: Arc::default(),
            departed_retention: DEFAULT_DEPARTED_RETENTION,
        }
    }
}

/// One live worker epoch.
#[derive(Debug)]
pub struct WorkerEntry {
    pub hello: WorkerHello,
    /// The connection its hello came on: only frames from it act for the worker (a stranger
    /// that learned the epoch cannot end, stall or feed its requests).
    routing_id: Bytes,
    /// The seq the next batch should carry; None until a batch, heartbeat or resync tells us.
    pub next_seq: Option<u64>,
    pub last_heard_ns: u64,
    pub tracker: Tracker,
    /// How its KV blocks were used at its latest heartbeat.
    kv_blocks: KvBlocks,
    obs: Observations,
    metrics: WorkerMetrics,
}

/// A live worker as `/health` shows it: its latest hello and KV-block use.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerView {
    pub hello: WorkerHello,
    pub kv_blocks: KvBlocks,
}

impl WorkerEntry {
    fn is_silent(&self, now: Clock) -> bool {
        let silence = now.mono_ns.saturating_sub(self.last_heard_ns);
        Liveness::from_peer_interval_ms(self.hello.heartbeat_interval_ms)
            .is_silent_for(Duration::from_nanos(silence))
    }

    /// Sends the accumulated observations to the metrics and the running totals.
    fn flush(&mut self, totals: &mut HashMap<String, Figures>) {
        self.metrics.apply(&self.obs);
        if self.obs.figures.iter().any(|f| !f.is_zero()) {
            let figures = self.obs.total_figures();
            match totals.get_mut(&self.hello.worker_id) {
                Some(total) => total.add(&figures),
                None => {
                    totals.insert(self.hello.worker_id.clone(), figures);
                }
            }
        }
        self.metrics.running.set(self.tracker.len() as f64);
        self.obs.clear();
    }

    fn fail_all(&mut self, kind: OutputErrorKind, message: &str, now: Clock, out: &mut Outbox) {
        self.tracker
            .fail_all(kind, message, now, out, &mut self.obs);
    }

    /// A hello of this epoch again (a reconnect, or the ready hello after the model loaded):
    /// takes what a loading worker learns. A new proposer moves the worker's acceptance series
    /// to the new label (the old ones are retired, never left beside them).
    fn refresh(&mut self, hello: WorkerHello) {
        self.hello.ready = hello.ready;
        self.hello.kv_capacity_tokens = hello.kv_capacity_tokens;
        self.hello.kv_bytes = hello.kv_bytes;
        self.hello.draft_kv_bytes = hello.draft_kv_bytes;
        if hello.proposer != self.hello.proposer {
            tracing::info!(worker = %hello.worker_id, old = %self.hello.proposer, new = %hello.proposer, "worker changed its proposer");
            self.hello.proposer = hello.proposer;
            self.metrics = WorkerMetrics::new(
                &self.hello.model,
                &self.hello.worker_id,
                &self.hello.proposer,
                self.hello.num_spec_tokens as usize,
                self.tracker.classes().names(),
            );
        }
        self.metrics.set_kv_bytes(self.hello.kv_bytes);
    }
}

/// Counts of what the ingest dropped or detected (also exported as metrics).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IngestStats {
    pub gaps: u64,
    pub invalid_batches: u64,
    pub stale: u64,
    pub unknown_worker_batches: u64,
    /// Frames for a live worker from a connection other than its own.
    pub foreign_frames: u64,
    pub refused_hellos: u64,
    /// Hellos refused because a live worker holds the id.
    pub duplicate_ids: u64,
    pub workers_lost: u64,
    pub resyncs: u64,
}

/// Departed workers remembered for removal at once; past it the oldest go early.
pub const MAX_DEPARTED: usize = 4096;

#[derive(Debug, Default)]
pub struct Ingest {
    config: IngestConfig,
    workers: HashMap<String, WorkerEntry>,
    /// Per worker id, the figures of every verification step seen since start (what the spec's
    /// counters hold). One entry per worker id live or departed within the retention, like the
    /// Prometheus series.
    totals: HashMap<String, Figures>,
    /// Workers that left, oldest first, with when (monotonic ns): their series and totals go
    /// once the retention has run, unless they came back.
    departed: VecDeque<(String, u64)>,
    stats: IngestStats,
    /// Changes whenever a worker is admitted, refreshed or lost: `/health` copies the live
    /// workers' hellos only then.
    roster_version: u64,
}

impl Ingest {
    pub fn new(config: IngestConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    pub fn stats(&self) -> &IngestStats {
        &self.stats
    }

    /// Workers currently alive (said hello, not lost).
    pub fn live_workers(&self) -> usize {
        self.workers.len()
    }

    pub fn worker(&self, worker_id: &str) -> Option<&WorkerEntry> {
        self.workers.get(worker_id)
    }

    /// In-flight requests over all workers.
    pub fn in_flight(&self) -> usize {
        self.workers.values().map(|w| w.tracker.len()).sum()
    }

    /// Figures summed since start for `worker_id` (None before its first verification step).
    pub fn totals(&self, worker_id: &str) -> Option<&Figures> {
        self.totals.get(worker_id)
    }

    /// Figures so far of an in-flight request.
    pub fn in_flight_metrics(&self, worker_id: &str, id: RequestId) -> Option<SpeculateMetrics> {
        self.workers.get(worker_id)?.tracker.speculate_metrics(id)
    }

    /// [`Ingest::handle_from`] for messages that all come on one connection.
    pub fn handle(
        &mut self,
        msg: WorkerToTp,
        now: Clock,
        received: Instant,
        out: &mut Outbox,
    ) -> Option<TpToWorker> {
        self.handle_from(&Bytes::new(), msg, now, received, out)
    }

    /// Applies one message that came on connection `routing_id` and returns the reply for its
    /// sender, if any. `received` is when its frame arrived (for the processing-time
    /// histogram); outputs go to `out`.
    pub fn handle_from(
        &mut self,
        routing_id: &Bytes,
        msg: WorkerToTp,
        now: Clock,
        received: Instant,
        out: &mut Outbox,
    ) -> Option<TpToWorker> {
        let from = |entry: &WorkerEntry| entry.routing_id == *routing_id;
        match msg {
            WorkerToTp::Hello(hello) => self.on_hello(hello, routing_id, now, out),
            WorkerToTp::Step(batch) => self.on_step(&batch, from, now, received, out),
            WorkerToTp::Heartbeat(hb) => self.on_heartbeat(&hb, from, now, out),
            WorkerToTp::Resync(resync) => self.on_resync(&resync, from, now, out),
            WorkerToTp::Goodbye { worker_id, epoch } => {
                self.on_goodbye(&worker_id, epoch, from, now, out);
                None
            }
        }
    }

    /// A message for a live worker from a connection that is not its own: counted, and the
    /// sender asked for a hello (which it cannot give without the worker's session).
    fn foreign(stats: &mut IngestStats) -> Option<TpToWorker> {
        stats.foreign_frames += 1;
        metrics::foreign_frame();
        Some(TpToWorker::AskHello)
    }

    /// The reply to a batch or resync from a worker we do not take: counted, and the sender is
    /// asked for its hello.
    fn unknown_sender(stats: &mut IngestStats) -> Option<TpToWorker> {
        stats.unknown_worker_batches += 1;
        metrics::unknown_worker_batch();
        Some(TpToWorker::AskHello)
    }

    /// Changes whenever the live workers or what their hellos say may have changed.
    pub fn roster_version(&self) -> u64 {
        self.roster_version
    }

    /// The live workers' latest hellos and KV-block use, by id.
    pub fn live_worker_views(&self) -> Vec<WorkerView> {
        let mut views: Vec<WorkerView> = self
            .workers
            .values()
            .map(|w| WorkerView {
                hello: w.hello.clone(),
                kv_blocks: w.kv_blocks,
            })
            .collect();
        views.sort_unstable_by(|a, b| a.hello.worker_id.cmp(&b.hello.worker_id));
        views
    }

    /// Workers alive now, by id (what the api-servers may route to).
    pub fn live_worker_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.workers.keys().cloned().collect();
        ids.sort_unstable();
        ids
    }

    /// This process was paused: every worker's silence is ours, so their clocks restart now.
    pub fn forgive(&mut self, now: Clock) {
        for w in self.workers.values_mut() {
            w.last_heard_ns = now.mono_ns;
        }
    }

    /// Removes the series and totals of workers departed longer than the retention ago (or,
    /// past [`MAX_DEPARTED`] of them, the oldest at once), unless they are back.
    fn forget_departed(&mut self, now: Clock) {
        let retention = self.config.departed_retention.as_nanos() as u64;
        while let Some((worker_id, left_ns)) = self.departed.front() {
            let expired = now.mono_ns.saturating_sub(*left_ns) >= retention;
            if !expired && self.departed.len() <= MAX_DEPARTED {
                break;
            }
            if !self.workers.contains_key(worker_id) {
                self.totals.remove(worker_id);
                metrics::forget_worker(worker_id);
            }
            self.departed.pop_front();
        }
    }

    /// Declares dead every worker silent past its liveness window; forgets departed ones past
    /// the retention.
    pub fn tick(&mut self, now: Clock, out: &mut Outbox) {
        self.forget_departed(now);
        let dead: Vec<String> = self
            .workers
            .values()
            .filter(|w| w.is_silent(now))
            .map(|w| w.hello.worker_id.clone())
            .collect();
        for worker_id in dead {
            tracing::warn!(worker = %worker_id, "worker missed its heartbeats; failing its requests");
            self.end_worker(
                &worker_id,
                "the worker stopped sending heartbeats",
                now,
                out,
            );
        }
    }

    fn on_hello(
        &mut self,
        hello: WorkerHello,
        routing_id: &Bytes,
        now: Clock,
        out: &mut Outbox,
    ) -> Option<TpToWorker> {
        let refused = |stats: &mut IngestStats, reason: String| {
            stats.refused_hellos += 1;
            Some(TpToWorker::Refused { reason })
        };
        if let Err(e) = proto::check_version(&hello.worker_id, hello.protocol_version) {
            tracing::warn!(worker = %hello.worker_id, error = %e, "refusing worker hello");
            return refused(&mut self.stats, e.to_string());
        }
        if let Err(reason) = check_hello(&hello) {
            // The id may itself be what is wrong: log only its length.
            tracing::warn!(worker_id_bytes = hello.worker_id.len(), %reason, "refusing worker hello");
            return refused(&mut self.stats, reason);
        }
        let holder = self.workers.get(&hello.worker_id).map(|entry| Holder {
            epoch: entry.hello.epoch,
            silent: entry.is_silent(now),
        });
        match hello_rule(holder, hello.epoch) {
            HelloRule::SameProcess => {
                let entry = self.workers.get_mut(&hello.worker_id)?;
                if entry.routing_id != *routing_id && entry.hello.session != hello.session {
                    tracing::warn!(worker = %hello.worker_id, "hello refused: a live worker's epoch from another connection, without its session");
                    self.stats.foreign_frames += 1;
                    metrics::foreign_frame();
                    let reason =
                        format!("worker {} is live on another connection", hello.worker_id);
                    return refused(&mut self.stats, reason);
                }
                entry.routing_id = routing_id.clone();
                // A reconnect of the same process: keep its state (a resync follows).
                entry.last_heard_ns = now.mono_ns;
                entry.refresh(hello);
                self.roster_version += 1;
                return None;
            }
            HelloRule::RefuseDuplicate => {
                // Two workers would mix their batches. A restarted worker gets in once the old
                // epoch's silence passes the window (we keep asking for its hello).
                tracing::error!(worker = %hello.worker_id, live_epoch = ?holder.map(|h| h.epoch), refused_epoch = hello.epoch, "hello refused: another live worker holds this id");
                self.stats.duplicate_ids += 1;
                metrics::duplicate_id_refused();
                let reason =
                    link::peers::duplicate_id_reason("worker", &hello.worker_id, "worker-id");
                return refused(&mut self.stats, reason);
            }
            HelloRule::Restart => {
                tracing::warn!(worker = %hello.worker_id, old_epoch = ?holder.map(|h| h.epoch), new_epoch = hello.epoch, "worker restarted; failing the old epoch's requests");
                let worker_id = hello.worker_id.clone();
                self.end_worker(&worker_id, "the worker restarted (new epoch)", now, out);
            }
            HelloRule::Admit if self.workers.len() >= self.config.max_workers => {
                tracing::warn!(worker = %hello.worker_id, max = self.config.max_workers, "refusing worker hello: too many workers");
                let reason = format!(
                    "the token-processor takes at most {} workers",
                    self.config.max_workers
                );
                return refused(&mut self.stats, reason);
            }
            HelloRule::Admit => {}
        }
        tracing::info!(worker = %hello.worker_id, epoch = hello.epoch, model = %hello.model, k = hello.num_spec_tokens, proposer = %hello.proposer, draft_kv_bytes = hello.draft_kv_bytes, "worker said hello");
        self.admit(hello, routing_id, now);
        None
    }

    fn admit(&mut self, hello: WorkerHello, routing_id: &Bytes, now: Clock) {
        let k = hello.num_spec_tokens as usize;
        let classes = self.config.classes.clone();
        let metrics = WorkerMetrics::new(
            &hello.model,
            &hello.worker_id,
            &hello.proposer,
            k,
            classes.names(),
        );
        metrics.set_kv_bytes(hello.kv_bytes);
        let entry = WorkerEntry {
            metrics,
            obs: Observations::new(k, classes.len()),
            tracker: Tracker::new(hello.num_spec_tokens, self.config.max_requests_per_worker)
                .with_classes(classes),
            kv_blocks: KvBlocks::default(),
            next_seq: None,
            last_heard_ns: now.mono_ns,
            routing_id: routing_id.clone(),
            hello,
        };
        self.workers.insert(entry.hello.worker_id.clone(), entry);
        self.roster_version += 1;
        metrics::set_workers_connected(self.workers.len());
    }

    /// The live entry of (worker, epoch), or None (counted as stale) for another epoch. Takes the
    /// fields it needs, so callers keep `totals` borrowable beside the entry.
    fn current<'a>(
        workers: &'a mut HashMap<String, WorkerEntry>,
        stats: &mut IngestStats,
        worker_id: &str,
        epoch: u64,
    ) -> Option<&'a mut WorkerEntry> {
        let entry = workers.get_mut(worker_id)?;
        if entry.hello.epoch != epoch {
            stats.stale += 1;
            entry.metrics.stale.increment(1);
            return None;
        }
        Some(entry)
    }

    fn on_step(
        &mut self,
        batch: &StepBatch,
        from: impl Fn(&WorkerEntry) -> bool,
        now: Clock,
        received: Instant,
        out: &mut Outbox,
    ) -> Option<TpToWorker> {
        let Self {
            workers,
            totals,
            stats,
            ..
        } = self;
        if !workers.contains_key(&batch.worker_id) {
            return Self::unknown_sender(stats);
        }
        let Some(entry) = Self::current(workers, stats, &batch.worker_id, batch.epoch) else {
            return Some(TpToWorker::AskHello);
        };
        if !from(entry) {
            return Self::foreign(stats);
        }
        entry.last_heard_ns = now.mono_ns;
        match entry.next_seq {
            Some(next) if batch.seq < next => {
                stats.stale += 1;
                entry.metrics.stale.increment(1);
                return None;
            }
            Some(next) if batch.seq > next => {
                stats.gaps += 1;
                entry.metrics.gaps.increment(1);
                tracing::warn!(worker = %batch.worker_id, expected = next, got = batch.seq, in_flight = entry.tracker.len(), "step-batch gap; failing the worker's in-flight requests");
                let message = format!("step batches {next}..{} of the worker were lost", batch.seq);
                entry.fail_all(OutputErrorKind::StepGap, &message, now, out);
            }
            _ => {}
        }
        // A worker's seq never nears 2^64 (one batch a millisecond is 500 million years).
        entry.next_seq = Some(batch.seq.saturating_add(1));
        if let Err(e) = batch.validate(entry.hello.num_spec_tokens) {
            stats.invalid_batches += 1;
            entry.metrics.invalid_batches.increment(1);
            tracing::warn!(worker = %batch.worker_id, seq = batch.seq, error = %e, "dropping invalid step batch");
            let message = format!("invalid step batch from the worker: {e}");
            for &id in &batch.ids {
                entry.tracker.fail(
                    id,
                    OutputErrorKind::StepGap,
                    &message,
                    now,
                    out,
                    &mut entry.obs,
                );
            }
        } else {
            entry.tracker.apply_batch(batch, now, out, &mut entry.obs);
        }
        entry.flush(totals);
        entry
            .metrics
            .batch_processing
            .observe([(received.elapsed().as_secs_f64(), 1)]);
        None
    }

    fn on_heartbeat(
        &mut self,
        hb: &Heartbeat,
        from: impl Fn(&WorkerEntry) -> bool,
        now: Clock,
        out: &mut Outbox,
    ) -> Option<TpToWorker> {
        let Self {
            workers,
            totals,
            stats,
            roster_version,
            ..
        } = self;
        if !workers.contains_key(&hb.worker_id) {
            return Some(TpToWorker::AskHello);
        }
        let Some(entry) = Self::current(workers, stats, &hb.worker_id, hb.epoch) else {
            return Some(TpToWorker::AskHello);
        };
        if !from(entry) {
            return Self::foreign(stats);
        }
        entry.last_heard_ns = now.mono_ns;
        entry.metrics.keep_alive();
        entry.metrics.set_kv_blocks(&hb.kv_blocks);
        entry.metrics.set_verify_cost(&hb.verify_cost);
        if entry.kv_blocks != hb.kv_blocks {
            entry.kv_blocks = hb.kv_blocks;
            // `/health` shows the blocks too.
            *roster_version += 1;
        }
        match entry.next_seq {
            Some(next) if hb.next_seq > next => {
                stats.gaps += 1;
                entry.metrics.gaps.increment(1);
                tracing::warn!(worker = %hb.worker_id, expected = next, heartbeat_next = hb.next_seq, "heartbeat shows lost step batches; failing the worker's in-flight requests");
                let message = format!(
                    "step batches {next}..{} of the worker were lost",
                    hb.next_seq
                );
                entry.fail_all(OutputErrorKind::StepGap, &message, now, out);
                entry.flush(totals);
                entry.next_seq = Some(hb.next_seq);
            }
            None => entry.next_seq = Some(hb.next_seq),
            _ => {}
        }
        Some(TpToWorker::Ack {
            epoch: hb.epoch,
            next_seq: entry.next_seq.unwrap_or(hb.next_seq),
        })
    }

    fn on_resync(
        &mut self,
        resync: &Resync,
        from: impl Fn(&WorkerEntry) -> bool,
        now: Clock,
        out: &mut Outbox,
    ) -> Option<TpToWorker> {
        let Self {
            workers,
            totals,
            stats,
            ..
        } = self;
        if !workers.contains_key(&resync.worker_id) {
            return Self::unknown_sender(stats);
        }
        let Some(entry) = Self::current(workers, stats, &resync.worker_id, resync.epoch) else {
            return Some(TpToWorker::AskHello);
        };
        if !from(entry) {
            return Self::foreign(stats);
        }
        stats.resyncs += 1;
        entry.metrics.resyncs.increment(1);
        entry.last_heard_ns = now.mono_ns;
        tracing::info!(worker = %resync.worker_id, next_seq = resync.next_seq, requests = resync.requests.len(), "applying worker resync");
        entry
            .tracker
            .resync(&resync.requests, now, out, &mut entry.obs);
        entry.next_seq = Some(resync.next_seq);
        entry.flush(totals);
        Some(TpToWorker::Ack {
            epoch: resync.epoch,
            next_seq: resync.next_seq,
        })
    }

    fn on_goodbye(
        &mut self,
        worker_id: &str,
        epoch: u64,
        from: impl Fn(&WorkerEntry) -> bool,
        now: Clock,
        out: &mut Outbox,
    ) {
        let Some(entry) = Self::current(&mut self.workers, &mut self.stats, worker_id, epoch)
        else {
            return;
        };
        if !from(entry) {
            tracing::warn!(worker = %worker_id, "goodbye for a worker from another connection; ignored");
            Self::foreign(&mut self.stats);
            return;
        }
        {
            tracing::info!(worker = %worker_id, "worker said goodbye");
            self.end_worker(worker_id, "the worker shut down", now, out);
        }
    }

    /// Fails the worker's in-flight requests with `WorkerLost` and forgets it.
    fn end_worker(&mut self, worker_id: &str, message: &str, now: Clock, out: &mut Outbox) {
        if let Some(mut entry) = self.workers.remove(worker_id) {
            entry.fail_all(OutputErrorKind::WorkerLost, message, now, out);
            entry.flush(&mut self.totals);
            entry.metrics.lost.increment(1);
            entry.metrics.running.set(0.0);
            self.stats.workers_lost += 1;
            self.roster_version += 1;
            self.departed.push_back((worker_id.to_owned(), now.mono_ns));
        }
        metrics::set_workers_connected(self.workers.len());
    }
}

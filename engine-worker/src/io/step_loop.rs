//! The step loop: runs on its own OS thread (the forward pass is CPU-bound), takes commands,
//! steps the engine, numbers the step batches and hands them to the token-processor link.
//! It never blocks on I/O: a full outbound queue drops the batch and schedules a resync.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use link::service::Watchdog;
use proto::api_worker::WorkerToApi;
use proto::worker_tp::Resync;
use tokio::sync::mpsc::Sender;

use super::{ApiOutbound, EngineCommand, TpOutbound, WorkerStatus};
use crate::backend::Backend;
use crate::engine::{to_step_batch, Engine};
use crate::trace::TraceWriter;

/// Heartbeat intervals a finished request may go unacknowledged before the worker takes the
/// token-processor link for stalled (a batch or an output lost on the way) and resyncs.
const ACK_OVERDUE_HEARTBEATS: u32 = 4;

/// How long the idle loop sleeps between looks at its inputs.
const IDLE_POLL: Duration = Duration::from_millis(20);
/// Bound on handing the final batch and goodbye to the link at shutdown.
const FINAL_SEND_TIMEOUT: Duration = Duration::from_secs(2);

pub struct StepLoopIo {
    pub commands: Receiver<EngineCommand>,
    pub to_tp: Sender<TpOutbound>,
    pub to_api: Sender<ApiOutbound>,
    pub status: Arc<WorkerStatus>,
    pub trace: Option<TraceWriter>,
    /// systemd's watchdog, fed from this loop: a stuck step stops the pings.
    pub watchdog: Watchdog,
}

/// Runs until a drain completes or the command channel closes.
pub fn run_step_loop<B: Backend>(mut engine: Engine<B>, mut io: StepLoopIo) {
    let mut next_seq = 0u64;
    let mut needs_resync = false;
    let mut drain_deadline: Option<Instant> = None;
    let mut overdue = OverdueAcks::new(
        Duration::from_millis(u64::from(io.status.heartbeat_interval_ms)) * ACK_OVERDUE_HEARTBEATS,
    );
    loop {
        // Commands: block briefly only when idle.
        let mut first = if engine.has_work() {
            io.commands.try_recv().ok()
        } else {
            match io.commands.recv_timeout(IDLE_POLL) {
                Ok(cmd) => Some(cmd),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    tracing::info!("command channel closed; step loop exits");
                    return;
                }
            }
        };
        while let Some(cmd) = first.take().or_else(|| io.commands.try_recv().ok()) {
            handle_command(&mut engine, cmd, &io, &mut drain_deadline);
        }
        if io.status.take_resync_request() {
            needs_resync = true;
        }
        engine.expire_retained(Instant::now());
        if overdue.check(&engine, Instant::now()) {
            needs_resync = true;
        }
        if needs_resync && io.to_tp.capacity() > 0 {
            let resync = Resync {
                worker_id: io.status.worker_id.clone(),
                epoch: io.status.epoch,
                next_seq,
                requests: engine.resync_requests(),
            };
            needs_resync = io.to_tp.try_send(TpOutbound::Resync(resync)).is_err();
        }
        let draining_done =
            drain_deadline.is_some_and(|deadline| !engine.has_work() || Instant::now() >= deadline);
        if draining_done {
            let aborted = engine.abort_all();
            if aborted > 0 {
                tracing::warn!(
                    aborted,
                    "drain deadline passed; aborting unfinished requests"
                );
            }
        }
        if engine.has_work() {
            let rows = engine.step();
            let timing = engine.last_verify_timing();
            if !rows.is_empty() {
                if let Some(trace) = io.trace.as_mut() {
                    if let Err(err) = trace.record(&rows, timing) {
                        tracing::error!(error = %err, "cannot write acceptance trace; tracing stops");
                        io.trace = None;
                    }
                }
                let batch = to_step_batch(
                    &rows,
                    timing,
                    &io.status.worker_id,
                    io.status.epoch,
                    next_seq,
                );
                next_seq += 1;
                let msg = TpOutbound::Step(batch);
                if draining_done {
                    send_with_deadline(&io.to_tp, msg);
                } else if !needs_resync && io.to_tp.try_send(msg).is_err() {
                    // The link is behind or down: drop, and resync once it catches up.
                    tracing::warn!(
                        seq = next_seq - 1,
                        "outbound queue full; batch dropped, resync scheduled"
                    );
                    needs_resync = true;
                }
            }
        }
        io.status
            .publish(next_seq, engine.num_running(), engine.num_waiting());
        io.status.publish_kv(engine.kv_blocks());
        io.status.publish_verify_cost(engine.planner());
        let (retained, retained_bytes, evicted) = engine.retained_stats();
        io.status
            .publish_retained(retained, retained_bytes, evicted);
        io.watchdog.feed(Instant::now());
        if draining_done {
            send_with_deadline(&io.to_tp, TpOutbound::Goodbye);
            tracing::info!(batches = next_seq, "drained; step loop exits");
            return;
        }
    }
}

/// Watches the acknowledgements: a finished request whose final output its api-server has not
/// acknowledged within the bound means the token-processor link lost something (or stalled),
/// so the worker resyncs, which replays it. Each overdue request triggers at most one resync;
/// looks at most every quarter bound.
struct OverdueAcks {
    bound: Duration,
    covered_up_to: Option<Instant>,
    last_look: Option<Instant>,
}

impl OverdueAcks {
    fn new(bound: Duration) -> Self {
        Self {
            bound,
            covered_up_to: None,
            last_look: None,
        }
    }

    fn check<B: Backend>(&mut self, engine: &Engine<B>, now: Instant) -> bool {
        if self
            .last_look
            .is_some_and(|t| now.saturating_duration_since(t) < self.bound / 4)
        {
            return false;
        }
        self.last_look = Some(now);
        let Some(cutoff) = now.checked_sub(self.bound) else {
            return false;
        };
        let Some(newest) = engine.overdue_since(cutoff, self.covered_up_to) else {
            return false;
        };
        self.covered_up_to = Some(newest);
        tracing::warn!(
            overdue_ms = now.saturating_duration_since(newest).as_millis() as u64,
            "a finished request's output is unacknowledged past the bound; resyncing the token-processor"
        );
        true
    }
}

/// How long the step loop may go without a turn before the worker gives up on it: a turn takes
/// one step, or 20 ms when idle, and one step may hold up to `max_num_batched_tokens` prompt
/// tokens. The bound grows with that budget: a flat 10 s killed a worker whose 2,048-token
/// prefill step took longer on a loaded 2-core machine (docs/faults.md). 10 ms a token is ten
/// times the slowest prefill measured (1,027 tok/s on 2 threads, docs/benchmarks.md), so only a
/// step loop that really stopped is reported: 30.5 s at the default budget.
pub fn step_loop_stall(max_num_batched_tokens: usize) -> Duration {
    const FLOOR: Duration = Duration::from_secs(10);
    const PER_BATCHED_TOKEN: Duration = Duration::from_millis(10);
    FLOOR + PER_BATCHED_TOKEN * u32::try_from(max_num_batched_tokens).unwrap_or(u32::MAX)
}

/// Resolves when the step-loop thread ended (a panic: it returns on its own only after a drain,
/// which the process starts only once it stops watching) or stopped turning for `stall`; says
/// which. The worker then exits non-zero so that systemd restarts it: its heartbeats would
/// otherwise stay green while nothing steps.
pub async fn step_loop_failure(
    status: &WorkerStatus,
    thread: &std::thread::JoinHandle<()>,
    stall: Duration,
) -> String {
    let mut tick = tokio::time::interval((stall / 4).min(Duration::from_millis(250)));
    loop {
        tick.tick().await;
        if thread.is_finished() {
            return "the step loop thread ended (panicked)".into();
        }
        let silence = status.step_loop_silence();
        if silence > stall {
            return format!("no step for {} ms", silence.as_millis());
        }
    }
}

fn handle_command<B: Backend>(
    engine: &mut Engine<B>,
    cmd: EngineCommand,
    io: &StepLoopIo,
    drain_deadline: &mut Option<Instant>,
) {
    match cmd {
        EngineCommand::Add(req, job) => {
            let (id, owner) = (req.id, req.owner.clone());
            let result = if drain_deadline.is_some() {
                Err(proto::api_worker::RejectReason::NotAccepting)
            } else {
                engine.add_prepared(req, job)
            };
            if let Err(reason) = result {
                tracing::info!(?reason, "request rejected");
                let msg = WorkerToApi::Rejected { id, reason };
                if io.to_api.try_send(ApiOutbound { owner, msg }).is_err() {
                    tracing::error!("api outbound queue full; a rejection was dropped");
                }
            }
        }
        EngineCommand::Abort { owner, id } => {
            engine.abort_of(&owner, id);
        }
        EngineCommand::Delivered { owner, ids } => engine.delivered(&owner, &ids),
        EngineCommand::Probe { owner, ids } => {
            let not_held = engine.not_held(&ids);
            if not_held.len() < ids.len() {
                // Outputs of requests we hold went missing on the way: the token-processor
                // replays them from a resync.
                io.status.request_resync();
            }
            let ids = not_held;
            if !ids.is_empty() {
                let msg = WorkerToApi::NotHeld { ids };
                if io.to_api.try_send(ApiOutbound { owner, msg }).is_err() {
                    tracing::warn!(
                        "api outbound queue full; a probe answer was dropped (it is asked again)"
                    );
                }
            }
        }
        EngineCommand::AbortOwner(owner) => {
            let aborted = engine.abort_owner(&owner);
            tracing::warn!(owner = %owner, aborted, "api-server silent; its requests aborted");
        }
        EngineCommand::Drain { deadline } => {
            tracing::info!(
                running = engine.num_running(),
                waiting = engine.num_waiting(),
                "draining"
            );
            *drain_deadline = Some(deadline);
        }
    }
}

/// Final messages must not be dropped, but the loop must not hang on a dead link either.
fn send_with_deadline(tx: &Sender<TpOutbound>, mut msg: TpOutbound) {
    let deadline = Instant::now() + FINAL_SEND_TIMEOUT;
    loop {
        match tx.try_send(msg) {
            Ok(()) => return,
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => return,
            Err(tokio::sync::mpsc::error::TrySendError::Full(back)) => {
                if Instant::now() >= deadline {
                    tracing::error!("token-processor link stuck; final message dropped");
                    return;
                }
                msg = back;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> WorkerStatus {
        let s = WorkerStatus::new("w".into(), 1, "m".into(), 4, "ngram".into(), 100);
        s.set_ready("m".into(), 2048, 32_768, 16);
        s
    }

    #[test]
    fn the_stall_bound_covers_the_longest_step_the_budget_allows() {
        assert_eq!(step_loop_stall(0), Duration::from_secs(10));
        assert_eq!(step_loop_stall(2048), Duration::from_millis(30_480));
        // A budget past u32 does not overflow the bound.
        assert!(step_loop_stall(usize::MAX) > Duration::from_secs(1_000_000));
    }

    #[tokio::test]
    async fn a_panicked_step_loop_is_reported() {
        let thread = std::thread::spawn(|| panic!("step failed"));
        let why = tokio::time::timeout(
            Duration::from_secs(5),
            step_loop_failure(&status(), &thread, Duration::from_secs(60)),
        )
        .await
        .expect("reported");
        assert!(why.contains("panicked"), "{why}");
    }

    #[tokio::test]
    async fn a_step_loop_that_stops_turning_is_reported_and_a_turning_one_is_not() {
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _ = stop_rx.recv();
        });
        let status = status();
        // Turning: published every 20 ms, never reported.
        let turning = async {
            for _ in 0..25 {
                status.publish(0, 0, 0);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            why = step_loop_failure(&status, &thread, Duration::from_millis(200)) => panic!("reported while turning: {why}"),
            () = turning => {}
        }
        // Stuck: no publish for longer than the bound.
        let why = tokio::time::timeout(
            Duration::from_secs(5),
            step_loop_failure(&status, &thread, Duration::from_millis(200)),
        )
        .await
        .expect("reported");
        assert!(why.contains("no step"), "{why}");
        stop_tx.send(()).unwrap();
        thread.join().unwrap();
    }
}

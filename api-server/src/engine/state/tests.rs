//! [`EngineState`] driven directly: each input with its time, each effect checked.

use std::time::{Duration, Instant};

use proto::api_worker::{Abort, ApiToWorker, RejectReason, WorkerToApi};
use proto::tp_api::{TpHello, TpToApi};
use proto::worker_tp::{Heartbeat, WorkerHello};
use proto::{FinishReason, RequestId};
use tokio::sync::mpsc;

use super::{EngineState, Reply, SubmitRefused};
pub(super) use crate::engine::registry::tests::output;
use crate::engine::{EngineClientConfig, EngineEvent, EngineFailure};

pub(super) const INTERVAL: Duration = Duration::from_millis(100);
/// Three missed heartbeats.
pub(super) const WINDOW: Duration = Duration::from_millis(300);
pub(super) const OUTAGE_WINDOW: Duration = Duration::from_secs(2);
pub(super) const STALL: Duration = Duration::from_secs(3);

pub(super) fn config(workers: usize, max_in_flight: usize) -> EngineClientConfig {
    let mut config = EngineClientConfig::new(
        (0..workers).map(|i| format!("ipc://w{i}")).collect(),
        "ipc://tp".into(),
        "api".into(),
    );
    config.liveness = link::Liveness::new(INTERVAL);
    config.max_in_flight = max_in_flight;
    config.tp_outage_window = OUTAGE_WINDOW;
    config.stall_timeout = STALL;
    config
}

pub(super) fn worker_hello(worker_id: &str, epoch: u64, ready: bool) -> WorkerToApi {
    WorkerToApi::Hello(WorkerHello {
        protocol_version: proto::PROTOCOL_VERSION,
        worker_id: worker_id.into(),
        epoch,
        model: "m".into(),
        num_spec_tokens: 4,
        proposer: "ngram".into(),
        ready,
        heartbeat_interval_ms: INTERVAL.as_millis() as u32,
        max_model_len: 2048,
        kv_capacity_tokens: 32_768,
        kv_bytes: 0,
        draft_kv_bytes: 0,
        max_num_seqs: 16,
        session: 1,
    })
}

pub(super) fn heartbeat(worker_id: &str, epoch: u64, accepting: bool) -> WorkerToApi {
    WorkerToApi::Heartbeat(Heartbeat {
        accepting,
        ..Heartbeat::idle(worker_id.into(), epoch, 0)
    })
}

pub(super) fn tp_hello(epoch: u64, workers: &[&str]) -> TpToApi {
    TpToApi::Hello(TpHello {
        protocol_version: proto::PROTOCOL_VERSION,
        epoch,
        workers: workers.iter().map(|w| w.to_string()).collect(),
    })
}

fn abort(worker: usize, id: RequestId) -> (usize, ApiToWorker) {
    (worker, ApiToWorker::Abort(Abort { id }))
}

fn events(rx: &mut mpsc::Receiver<EngineEvent>) -> Vec<EngineEvent> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// Two ready, connected workers ("a", "b") and a token-processor that takes both, at `t0`.
fn serving(t0: Instant) -> EngineState {
    let mut state = EngineState::new(&config(2, 64), t0);
    for (i, id) in ["a", "b"].into_iter().enumerate() {
        state.set_worker_connected(i, true);
        assert!(state
            .on_worker_message(t0, i, worker_hello(id, 1, true))
            .is_empty());
    }
    state.set_tp_connected(true);
    assert!(state.on_tp_message(t0, tp_hello(1, &["a", "b"])).is_empty());
    assert_eq!(state.readiness(t0), Ok(()));
    state
}

fn submit(
    state: &mut EngineState,
    now: Instant,
    id: RequestId,
) -> (usize, mpsc::Receiver<EngineEvent>) {
    let (tx, rx) = mpsc::channel(16);
    let worker = state.submit(now, id, tx).expect("submitted");
    (worker, rx)
}

#[test]
fn requests_go_to_the_least_loaded_servable_worker() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (first, _a) = submit(&mut state, t0, 1);
    let (second, _b) = submit(&mut state, t0, 2);
    assert_ne!(first, second, "the second request goes to the idle worker");
    // The token-processor stops taking worker "b"'s batches: "a" only.
    state.on_tp_message(t0, tp_hello(1, &["a"]));
    for id in 3..6 {
        assert_eq!(submit(&mut state, t0, id).0, 0);
    }
    state.set_worker_connected(0, false);
    let (tx, _rx) = mpsc::channel(1);
    assert_eq!(state.submit(t0, 9, tx), Err(SubmitRefused::NoWorker));
}

#[test]
fn outputs_reach_the_reader_and_the_final_one_is_acknowledged() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (worker, mut rx) = submit(&mut state, t0, 7);
    let outputs = vec![output(7, 0, &[1, 2], None)];
    let effects = state.on_tp_message(t0, TpToApi::Outputs(outputs));
    assert!(effects.is_empty());
    let last = vec![output(7, 2, &[3], Some(FinishReason::Stop))];
    let effects = state.on_tp_message(t0, TpToApi::Outputs(last));
    assert_eq!(
        effects.to_workers,
        vec![(worker, ApiToWorker::Delivered { ids: vec![7] })]
    );
    let got = events(&mut rx);
    assert_eq!(got[0], EngineEvent::Tokens(vec![1, 2]));
    assert_eq!(got[1], EngineEvent::Tokens(vec![3]));
    assert!(matches!(&got[2], EngineEvent::Finished(f) if f.reason == FinishReason::Stop));
    assert_eq!(state.in_flight(), 0);
    assert!(
        state.withdraw(7).is_empty(),
        "nothing to stop once it finished"
    );
}

#[test]
fn a_silent_worker_is_declared_dead_and_its_requests_fail_and_are_stopped() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (worker, mut rx) = submit(&mut state, t0, 1);
    let other = 1 - worker;
    let ids = ["a", "b"];
    // Only the other worker and the token-processor keep talking.
    let mut now = t0;
    for _ in 0..4 {
        now += INTERVAL;
        state.on_worker_message(now, other, heartbeat(ids[other], 1, true));
        state.on_tp_message(now, tp_hello(1, &ids));
        let effects = state.tick(now);
        if now.duration_since(t0) <= WINDOW {
            assert!(effects.is_empty(), "alive within the window");
        } else {
            assert_eq!(effects.to_workers, vec![abort(worker, 1)]);
        }
    }
    assert!(!state.worker_alive(worker));
    assert!(state.worker_alive(other));
    assert_eq!(
        events(&mut rx),
        vec![EngineEvent::Failed(EngineFailure::WorkerLost)]
    );
    // Its heartbeat does not revive it: it is asked for a hello, and the hello does.
    let effects = state.on_worker_message(now, worker, heartbeat(ids[worker], 1, true));
    assert_eq!(effects.reply, Reply::Hello);
    assert!(!state.worker_alive(worker));
    state.on_worker_message(now, worker, worker_hello(ids[worker], 1, true));
    assert!(state.worker_alive(worker));
}

#[test]
fn a_paused_api_server_forgives_its_peers() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (_, mut rx) = submit(&mut state, t0, 1);
    assert!(state.tick(t0 + INTERVAL).is_empty());
    // Nothing ran for 5 s: the silence is ours.
    let resumed = t0 + Duration::from_secs(5);
    assert!(state.tick(resumed).is_empty());
    assert!(state.worker_alive(0) && state.worker_alive(1) && state.tp_alive());
    assert!(events(&mut rx).is_empty());
}

#[test]
fn a_worker_restart_fails_its_requests_without_stopping_them() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (worker, mut rx) = submit(&mut state, t0, 1);
    let id = ["a", "b"][worker];
    let effects = state.on_worker_message(t0, worker, worker_hello(id, 2, true));
    assert!(effects.to_workers.is_empty(), "the new epoch never had it");
    assert_eq!(
        events(&mut rx),
        vec![EngineEvent::Failed(EngineFailure::WorkerLost)]
    );
    assert_eq!(state.in_flight(), 0);
}

#[test]
fn a_second_worker_with_a_live_id_is_refused_and_health_says_why() {
    let t0 = Instant::now();
    let mut state = EngineState::new(&config(2, 8), t0);
    state.set_worker_connected(0, true);
    state.set_worker_connected(1, true);
    state.on_worker_message(t0, 0, worker_hello("same", 1, true));
    state.on_worker_message(t0, 1, worker_hello("same", 2, true));
    assert!(state.worker_alive(0));
    assert!(!state.worker_alive(1));
    let refusal = state.workers()[1].refused.clone().expect("refused");
    assert!(
        refusal.contains("same") && refusal.contains("ipc://w0"),
        "{refusal}"
    );
    state.on_tp_message(t0, tp_hello(1, &["same"]));
    assert_eq!(state.readiness(t0), Ok(()));
}

#[test]
fn a_rejection_fails_only_a_request_of_that_worker() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (worker, mut rx) = submit(&mut state, t0, 1);
    let reason = RejectReason::Overloaded;
    state.on_worker_message(
        t0,
        1 - worker,
        WorkerToApi::Rejected {
            id: 1,
            reason: reason.clone(),
        },
    );
    assert!(
        events(&mut rx).is_empty(),
        "another worker cannot reject it"
    );
    state.on_worker_message(
        t0,
        worker,
        WorkerToApi::Rejected {
            id: 1,
            reason: reason.clone(),
        },
    );
    assert_eq!(
        events(&mut rx),
        vec![EngineEvent::Failed(EngineFailure::Rejected(reason))]
    );
}

#[test]
fn a_stalled_request_is_probed_and_ends_when_its_worker_no_longer_holds_it() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (worker, mut rx) = submit(&mut state, t0, 5);
    let ids = ["a", "b"];
    let mut probed_at = None;
    let mut now = t0;
    while now < t0 + STALL + Duration::from_secs(2) {
        now += INTERVAL;
        for (i, id) in ids.iter().enumerate() {
            state.on_worker_message(now, i, heartbeat(id, 1, true));
        }
        state.on_tp_message(now, tp_hello(1, &ids));
        let effects = state.tick(now);
        if effects.to_workers == vec![(worker, ApiToWorker::Probe { ids: vec![5] })] {
            probed_at.get_or_insert(now);
        }
    }
    let probed_at = probed_at.expect("probed");
    assert!(
        probed_at.duration_since(t0) > STALL,
        "not before the stall timeout"
    );
    state.on_worker_message(now, worker, WorkerToApi::NotHeld { ids: vec![5] });
    assert_eq!(
        events(&mut rx),
        vec![EngineEvent::Failed(EngineFailure::NotHeld)]
    );
}

#[test]
fn requests_wait_out_a_token_processor_outage_and_are_replayed_when_it_is_back() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (worker, mut rx) = submit(&mut state, t0, 3);
    let ids = ["a", "b"];
    let beat = |state: &mut EngineState, now: Instant| {
        for (i, id) in ids.iter().enumerate() {
            state.on_worker_message(now, i, heartbeat(id, 1, true));
        }
        state.tick(now)
    };
    let gone = t0 + WINDOW + INTERVAL;
    let mut now = t0;
    while now < gone {
        now += INTERVAL;
        beat(&mut state, now);
    }
    assert!(!state.tp_alive());
    let health = state.readiness(now).unwrap_err();
    assert!(
        health.contains("in-flight requests wait up to 2 s"),
        "{health}"
    );
    let (tx, _rx) = mpsc::channel(1);
    assert_eq!(
        state.submit(now, 4, tx),
        Err(SubmitRefused::NoTokenProcessor)
    );
    assert_eq!(state.in_flight(), 1, "it waits");
    // Restarted: a new epoch, and every worker is asked to replay our requests.
    let effects = state.on_tp_message(now, tp_hello(2, &ids));
    assert_eq!(
        effects.to_workers,
        vec![(worker, ApiToWorker::Probe { ids: vec![3] })]
    );
    assert_eq!(state.readiness(now), Ok(()));
    assert!(events(&mut rx).is_empty());
}

#[test]
fn requests_fail_and_are_stopped_when_the_outage_outlasts_its_window() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (worker, mut rx) = submit(&mut state, t0, 3);
    let mut now = t0;
    let mut aborted = Vec::new();
    while now < t0 + WINDOW + OUTAGE_WINDOW + Duration::from_secs(1) {
        now += INTERVAL;
        for (i, id) in ["a", "b"].iter().enumerate() {
            state.on_worker_message(now, i, heartbeat(id, 1, true));
        }
        aborted.extend(state.tick(now).to_workers);
    }
    assert_eq!(aborted, vec![abort(worker, 3)]);
    assert_eq!(
        events(&mut rx),
        vec![EngineEvent::Failed(EngineFailure::TokenProcessorLost)]
    );
    assert_eq!(
        state.tp_outage(now),
        None,
        "the outage is over; nothing waits"
    );
}

#[test]
fn a_dropped_handle_stops_its_request_once() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (worker, _rx) = submit(&mut state, t0, 8);
    assert_eq!(state.withdraw(8).to_workers, vec![abort(worker, 8)]);
    assert!(state.withdraw(8).is_empty());
    // Its late outputs are not anyone's.
    let late = vec![output(8, 0, &[1], Some(FinishReason::Stop))];
    assert!(state.on_tp_message(t0, TpToApi::Outputs(late)).is_empty());
}

#[test]
fn shutting_down_ends_every_request_and_refuses_new_ones() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (w1, mut rx1) = submit(&mut state, t0, 1);
    let (w2, _rx2) = submit(&mut state, t0, 2);
    let mut stopped = state.shut_down().to_workers;
    stopped.sort_by_key(|(w, _)| *w);
    let mut expected = vec![abort(w1, 1), abort(w2, 2)];
    expected.sort_by_key(|(w, _)| *w);
    assert_eq!(stopped, expected);
    assert_eq!(
        events(&mut rx1),
        vec![EngineEvent::Failed(EngineFailure::ShuttingDown)]
    );
    let (tx, _rx) = mpsc::channel(1);
    assert_eq!(state.submit(t0, 3, tx), Err(SubmitRefused::ShuttingDown));
    assert_eq!(state.readiness(t0), Err("shutting down".into()));
}

#[test]
fn a_refusal_by_a_worker_ends_its_requests() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (worker, mut rx) = submit(&mut state, t0, 1);
    let refused = WorkerToApi::Refused {
        reason: "api-server id held".into(),
    };
    let effects = state.on_worker_message(t0, worker, refused);
    assert_eq!(effects.to_workers, vec![abort(worker, 1)]);
    assert_eq!(
        events(&mut rx),
        vec![EngineEvent::Failed(EngineFailure::WorkerLost)]
    );
}

#[test]
fn a_refusal_by_the_token_processor_starts_the_outage() {
    let t0 = Instant::now();
    let mut state = serving(t0);
    let (_, mut rx) = submit(&mut state, t0, 1);
    state.on_tp_message(
        t0,
        TpToApi::Refused {
            reason: "id held".into(),
        },
    );
    let health = state.readiness(t0).unwrap_err();
    assert!(
        health.contains("refused this api-server: id held"),
        "{health}"
    );
    assert_eq!(state.tp_outage(t0), Some(Duration::ZERO));
    assert!(events(&mut rx).is_empty(), "it waits for the outage window");
}

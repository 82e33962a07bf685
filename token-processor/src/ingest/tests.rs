//! The ingest rules, one test each: gaps, epochs, heartbeat deadlines, resync, validation.

use std::time::Instant;

use proto::tp_api::{OutputErrorKind, RequestOutput};
use proto::worker_tp::{
    Heartbeat, RequestStart, Resync, ResyncRequest, StepBatch, StepRow, TpToWorker, WorkerHello,
    WorkerToTp, MAX_PROPOSER_BYTES,
};
use proto::{FinishReason, RequestId};

use super::{Ingest, IngestConfig};
use crate::tracker::{Clock, Outbox};

const W: &str = "w0";

fn at(ms: u64) -> Clock {
    Clock {
        mono_ns: ms * 1_000_000,
        unix_ms: 1_000_000 + ms,
    }
}

fn hello(epoch: u64, k: u32) -> WorkerToTp {
    WorkerToTp::Hello(WorkerHello {
        protocol_version: proto::PROTOCOL_VERSION,
        worker_id: W.into(),
        epoch,
        model: "m".into(),
        num_spec_tokens: k,
        proposer: "ngram".into(),
        ready: true,
        heartbeat_interval_ms: 100,
        max_model_len: 2048,
        kv_capacity_tokens: 32_768,
        kv_bytes: 0,
        draft_kv_bytes: 0,
        max_num_seqs: 16,
        session: 7,
    })
}

/// A batch builder: `start` adds a new request's prefill row, `verify` a decode row.
struct B(StepBatch);

impl B {
    fn new(epoch: u64, seq: u64) -> Self {
        Self(StepBatch::new(W.into(), epoch, seq))
    }
    fn start(mut self, id: RequestId, owner: &str) -> Self {
        self.0.starts.push(RequestStart {
            row: self.0.len() as u32,
            owner: owner.into(),
            prompt_tokens: 7,
            cached_prompt_tokens: 4,
            arrival_unix_ms: 1_000_000,
            class: owner.strip_prefix("api-").unwrap_or("").into(),
        });
        self.0.push(StepRow {
            id,
            tokens: &[1],
            drafted: 0,
            accepted: 0,
            offered: 0,
            predicted_milli: 0,
            prefill: true,
            preempted: false,
            finish: None,
            logprobs: &[],
            prompt_logprobs: &[],
        });
        self
    }
    fn verify(mut self, id: RequestId, d: u8, a: u8, finish: Option<FinishReason>) -> Self {
        let tokens = vec![5; usize::from(a) + 1];
        self.0.push(StepRow {
            id,
            tokens: &tokens,
            drafted: d,
            accepted: a,
            offered: d,
            predicted_milli: u16::from(d) * 500,
            prefill: false,
            preempted: false,
            finish,
            logprobs: &[],
            prompt_logprobs: &[],
        });
        self
    }
    fn msg(self) -> WorkerToTp {
        WorkerToTp::Step(self.0)
    }
}

fn feed(ingest: &mut Ingest, msg: WorkerToTp, ms: u64) -> Vec<RequestOutput> {
    let mut out = Outbox::default();
    ingest.handle(msg, at(ms), Instant::now(), &mut out);
    let mut outputs: Vec<RequestOutput> = out.drain_outputs().map(|(_, o)| o).collect();
    outputs.sort_by_key(|o| (o.id, o.first_index));
    outputs
}

fn finals(outputs: &[RequestOutput]) -> Vec<(RequestId, FinishReason, Option<OutputErrorKind>)> {
    outputs
        .iter()
        .filter_map(|o| {
            o.finish
                .map(|f| (o.id, f, o.error.as_ref().map(|e| e.kind)))
        })
        .collect()
}

fn started(ingest: &mut Ingest) {
    feed(ingest, hello(1, 4), 0);
    feed(
        ingest,
        B::new(1, 0).start(1, "api-a").start(2, "api-b").msg(),
        1,
    );
    feed(
        ingest,
        B::new(1, 1)
            .verify(1, 4, 2, None)
            .verify(2, 4, 4, None)
            .msg(),
        2,
    );
    assert_eq!(ingest.in_flight(), 2);
}

#[test]
fn a_sequence_gap_fails_every_in_flight_request_and_is_counted() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    // seq 2 is lost; seq 3 also starts request 3, which is tracked normally.
    let out = feed(
        &mut ingest,
        B::new(1, 3).verify(1, 4, 1, None).start(3, "api-a").msg(),
        3,
    );
    assert_eq!(ingest.stats().gaps, 1);
    assert_eq!(
        finals(&out),
        vec![
            (1, FinishReason::Error, Some(OutputErrorKind::StepGap)),
            (2, FinishReason::Error, Some(OutputErrorKind::StepGap))
        ]
    );
    // The failed request keeps the figures of the steps that did arrive.
    let m1 = out
        .iter()
        .find(|o| o.id == 1)
        .unwrap()
        .speculate_metrics
        .clone()
        .unwrap();
    assert_eq!(m1.num_steps, 1);
    assert_eq!(ingest.in_flight(), 1);
    assert!(ingest.worker(W).unwrap().tracker.contains(3));
    assert_eq!(ingest.stats().gaps, 1);
}

#[test]
fn a_heartbeat_past_our_sequence_is_a_gap() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    let hb = Heartbeat {
        running: 2,
        ..Heartbeat::idle(W.into(), 1, 3)
    };
    let out = feed(&mut ingest, WorkerToTp::Heartbeat(hb.clone()), 3);
    assert_eq!(ingest.stats().gaps, 1);
    assert_eq!(finals(&out).len(), 2);
    // The matching heartbeat afterwards is no gap.
    feed(&mut ingest, WorkerToTp::Heartbeat(hb), 4);
    assert_eq!(ingest.stats().gaps, 1);
}

#[test]
fn duplicates_and_other_epochs_are_ignored() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    let out = feed(&mut ingest, B::new(1, 1).verify(1, 4, 2, None).msg(), 3);
    assert!(out.is_empty());
    let out = feed(&mut ingest, B::new(7, 2).verify(1, 4, 2, None).msg(), 3);
    assert!(out.is_empty());
    assert_eq!(ingest.stats().stale, 2);
    assert_eq!(ingest.stats().gaps, 0);
    assert_eq!(
        ingest
            .worker(W)
            .unwrap()
            .tracker
            .speculate_metrics(1)
            .unwrap()
            .num_steps,
        1
    );
}

#[test]
fn a_new_epoch_fails_the_old_epochs_requests_as_worker_lost() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    // While the old epoch still speaks, another process with its id is refused.
    let out = feed(&mut ingest, hello(2, 4), 3);
    assert!(out.is_empty());
    assert_eq!(ingest.stats().duplicate_ids, 1);
    assert_eq!(ingest.worker(W).unwrap().hello.epoch, 1);
    assert_eq!(ingest.in_flight(), 2);
    // Once the old epoch fell silent past its window, the new one is a restart.
    let out = feed(&mut ingest, hello(2, 4), 400);
    assert_eq!(
        finals(&out),
        vec![
            (1, FinishReason::Error, Some(OutputErrorKind::WorkerLost)),
            (2, FinishReason::Error, Some(OutputErrorKind::WorkerLost))
        ]
    );
    assert_eq!(ingest.in_flight(), 0);
    assert_eq!(ingest.worker(W).unwrap().hello.epoch, 2);
    // The same epoch saying hello again (a reconnect) keeps its state.
    feed(&mut ingest, B::new(2, 0).start(9, "api-a").msg(), 401);
    feed(&mut ingest, hello(2, 4), 402);
    assert_eq!(ingest.in_flight(), 1);
}

#[test]
fn missed_heartbeats_fail_requests_and_forget_the_worker() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    let mut out = Outbox::default();
    ingest.tick(at(2 + 300), &mut out); // exactly 3 intervals: still alive
    assert!(out.is_empty());
    assert_eq!(ingest.live_workers(), 1);
    ingest.tick(at(2 + 301), &mut out);
    let outputs: Vec<_> = out.drain_outputs().map(|(_, o)| o).collect();
    assert_eq!(outputs.len(), 2);
    assert!(outputs
        .iter()
        .all(|o| o.error.as_ref().unwrap().kind == OutputErrorKind::WorkerLost));
    assert_eq!(ingest.live_workers(), 0);
    assert_eq!(ingest.stats().workers_lost, 1);
}

#[test]
fn a_paused_token_processor_forgives_instead_of_failing_everyone() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    let mut out = Outbox::default();
    // We did not run for 3 s: the silence is ours.
    ingest.forgive(at(3_000));
    ingest.tick(at(3_100), &mut out);
    assert!(out.is_empty());
    assert_eq!(ingest.live_workers(), 1);
    assert_eq!(ingest.live_worker_ids(), vec![W.to_owned()]);
    // A worker that really died is found one window later.
    ingest.tick(at(3_301), &mut out);
    assert_eq!(ingest.live_workers(), 0);
}

#[test]
fn a_repeated_hello_of_a_known_epoch_changes_nothing() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    let out = feed(&mut ingest, hello(1, 4), 50);
    assert!(out.is_empty());
    assert_eq!(ingest.in_flight(), 2);
}

#[test]
fn goodbye_fails_leftovers_and_forgets_the_worker() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    let out = feed(
        &mut ingest,
        WorkerToTp::Goodbye {
            worker_id: W.into(),
            epoch: 1,
        },
        3,
    );
    assert_eq!(finals(&out).len(), 2);
    assert_eq!(ingest.live_workers(), 0);
}

#[test]
fn batches_from_an_unknown_worker_wait_for_its_hello() {
    let mut ingest = Ingest::new(IngestConfig::default());
    let out = feed(&mut ingest, B::new(1, 5).start(1, "api-a").msg(), 0);
    assert!(out.is_empty());
    assert_eq!(ingest.stats().unknown_worker_batches, 1);
    assert_eq!(ingest.in_flight(), 0);
    // After its hello, a mid-epoch batch is taken as the start of our sequence (no gap).
    feed(&mut ingest, hello(1, 4), 1);
    feed(
        &mut ingest,
        B::new(1, 6).start(2, "api-a").verify(1, 4, 4, None).msg(),
        2,
    );
    assert_eq!(ingest.stats().gaps, 0);
    assert_eq!(ingest.in_flight(), 1);
    assert_eq!(
        ingest
            .worker(W)
            .unwrap()
            .tracker
            .speculate_metrics(2)
            .unwrap()
            .num_steps,
        0
    );
}

#[test]
fn an_invalid_batch_is_dropped_and_fails_the_requests_it_names() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    let out = feed(&mut ingest, B::new(1, 2).verify(1, 5, 1, None).msg(), 3); // d = 5 > K = 4
    assert_eq!(ingest.stats().invalid_batches, 1);
    assert_eq!(
        finals(&out),
        vec![(1, FinishReason::Error, Some(OutputErrorKind::StepGap))]
    );
    // Request 2 goes on, and the sequence moved past the bad batch.
    feed(
        &mut ingest,
        B::new(1, 3).verify(2, 4, 0, Some(FinishReason::Stop)).msg(),
        4,
    );
    assert_eq!(ingest.stats().gaps, 0);
    assert_eq!(ingest.in_flight(), 0);
    let mut broken = B::new(1, 4).0;
    broken.token_offsets.pop();
    feed(&mut ingest, WorkerToTp::Step(broken), 5);
    assert_eq!(ingest.stats().invalid_batches, 2);
}

#[test]
fn resync_is_authoritative_and_replays_every_token() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest); // 1: prefill + (4,2) → 4 tokens; 2: prefill + (4,4) → 6 tokens
    let resync = Resync {
        worker_id: W.into(),
        epoch: 1,
        next_seq: 10,
        requests: vec![
            // Request 1 ran two more steps in batches we never saw.
            ResyncRequest {
                id: 1,
                owner: "api-a".into(),
                prompt_tokens: 7,
                cached_prompt_tokens: 4,
                arrival_unix_ms: 1_000_000,
                prefilled: true,
                tokens: vec![5; 4 + 2 + 1],
                drafted: vec![4, 4, 3],
                accepted: vec![2, 1, 0],
                offered: vec![4, 4, 3],
                predicted_milli: vec![2000, 2000, 1500],
                class: String::new(),
                finish: 0,
                logprobs: Vec::new(),
                prompt_logprobs: Vec::new(),
            },
            // Request 5 we never heard of (e.g. we restarted).
            ResyncRequest {
                id: 5,
                owner: "api-b".into(),
                prompt_tokens: 3,
                cached_prompt_tokens: 0,
                arrival_unix_ms: 1_000_000,
                prefilled: true,
                tokens: vec![8, 9],
                drafted: vec![2],
                accepted: vec![0],
                offered: vec![2],
                predicted_milli: vec![1000],
                class: String::new(),
                finish: 0,
                logprobs: Vec::new(),
                prompt_logprobs: Vec::new(),
            },
        ],
    };
    let out = feed(&mut ingest, WorkerToTp::Resync(resync), 3);
    // Request 2 is gone from the worker's view: failed explicitly.
    assert_eq!(
        finals(&out),
        vec![(2, FinishReason::Error, Some(OutputErrorKind::StepGap))]
    );
    // Replayed from index 0: the api-server drops the 4 tokens it has.
    let r1 = out.iter().find(|o| o.id == 1).unwrap();
    assert_eq!((r1.first_index, r1.tokens.len()), (0, 7));
    let r5 = out.iter().find(|o| o.id == 5).unwrap();
    assert_eq!((r5.first_index, r5.tokens.clone()), (0, vec![8, 9]));
    let m1 = ingest
        .worker(W)
        .unwrap()
        .tracker
        .speculate_metrics(1)
        .unwrap();
    assert_eq!((m1.num_steps, m1.num_accepted_draft_tokens), (3, 3));
    // Totals grew by exactly what the resync added: 1's two new steps, 5's one step, 2's one.
    let totals = ingest.totals(W).unwrap();
    assert_eq!(totals.steps(), 3 + 1 + 1);
    assert_eq!(totals.accepted_draft_tokens(), 3 + 4);
    // The sequence continues from the resync's next_seq without a gap.
    let out = feed(
        &mut ingest,
        B::new(1, 10)
            .verify(1, 4, 4, Some(FinishReason::Length))
            .msg(),
        4,
    );
    assert_eq!(ingest.stats().gaps, 0);
    let fin = &out[0];
    assert_eq!(
        (
            fin.first_index,
            fin.usage.as_ref().unwrap().completion_tokens
        ),
        (7, 12)
    );
    assert_eq!(fin.speculate_metrics.as_ref().unwrap().num_steps, 4);
}

#[test]
fn the_in_flight_cap_refuses_new_requests_explicitly() {
    let mut ingest = Ingest::new(IngestConfig {
        max_requests_per_worker: 1,
        ..IngestConfig::default()
    });
    feed(&mut ingest, hello(1, 2), 0);
    let out = feed(
        &mut ingest,
        B::new(1, 0).start(1, "api-a").start(2, "api-a").msg(),
        1,
    );
    assert_eq!(
        finals(&out),
        vec![(2, FinishReason::Error, Some(OutputErrorKind::Engine))]
    );
    assert_eq!(ingest.in_flight(), 1);
}

#[test]
fn each_owner_gets_only_its_own_requests() {
    let mut ingest = Ingest::new(IngestConfig::default());
    feed(&mut ingest, hello(1, 4), 0);
    let mut out = Outbox::default();
    ingest.handle(
        B::new(1, 0)
            .start(1, "api-a")
            .start(2, "api-b")
            .start(3, "api-a")
            .msg(),
        at(1),
        Instant::now(),
        &mut out,
    );
    let by_owner = out.take();
    let ids = |owner: &str| {
        let lists: Vec<_> = by_owner.iter().filter(|(o, _)| &**o == owner).collect();
        assert_eq!(lists.len(), 1, "one message per owner");
        let mut v: Vec<RequestId> = lists[0].1.to_outputs().iter().map(|o| o.id).collect();
        v.sort();
        v
    };
    assert_eq!(ids("api-a"), vec![1, 3]);
    assert_eq!(ids("api-b"), vec![2]);
}

#[test]
fn k_zero_has_no_speculate_metrics() {
    let mut ingest = Ingest::new(IngestConfig::default());
    feed(&mut ingest, hello(1, 0), 0);
    feed(&mut ingest, B::new(1, 0).start(1, "api-a").msg(), 1);
    let out = feed(
        &mut ingest,
        B::new(1, 1).verify(1, 0, 0, Some(FinishReason::Stop)).msg(),
        2,
    );
    assert_eq!(out[0].finish, Some(FinishReason::Stop));
    assert!(out[0].speculate_metrics.is_none());
    let usage = out[0].usage.as_ref().unwrap();
    assert_eq!(usage.completion_tokens, 2);
    // The worker's prefix-cache hits ride along to the api-server.
    assert_eq!((usage.prompt_tokens, usage.cached_prompt_tokens), (7, 4));
}

#[test]
fn a_wrong_protocol_version_is_refused() {
    let mut ingest = Ingest::new(IngestConfig::default());
    let WorkerToTp::Hello(mut h) = hello(1, 4) else {
        unreachable!()
    };
    h.protocol_version += 1;
    feed(&mut ingest, WorkerToTp::Hello(h), 0);
    assert_eq!(ingest.live_workers(), 0);
    assert_eq!(ingest.stats().refused_hellos, 1);
}

fn reply(ingest: &mut Ingest, msg: WorkerToTp, ms: u64) -> Option<TpToWorker> {
    ingest.handle(msg, at(ms), Instant::now(), &mut Outbox::default())
}

fn heartbeat_of(epoch: u64, next_seq: u64) -> WorkerToTp {
    WorkerToTp::Heartbeat(Heartbeat::idle(W.into(), epoch, next_seq))
}

#[test]
fn a_stalled_worker_that_speaks_again_is_asked_for_its_hello_and_resyncs() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    let mut out = Outbox::default();
    ingest.tick(at(1_000), &mut out);
    assert_eq!(ingest.live_workers(), 0);
    assert_eq!(out.drain_outputs().count(), 2);
    // Same epoch, no new hello: neither its batch nor its heartbeat is taken, both ask hello.
    let batch = B::new(1, 2).verify(1, 4, 1, None).start(7, "api-a").msg();
    assert_eq!(reply(&mut ingest, batch, 1_001), Some(TpToWorker::AskHello));
    assert_eq!(
        reply(&mut ingest, heartbeat_of(1, 3), 1_002),
        Some(TpToWorker::AskHello)
    );
    assert_eq!(ingest.live_workers(), 0);
    assert_eq!(
        ingest.stats().unknown_worker_batches,
        1,
        "heartbeats are not batches"
    );
    // Its hello and resync bring it back with the requests it still runs.
    assert_eq!(reply(&mut ingest, hello(1, 4), 1_003), None);
    let running = ResyncRequest {
        finish: 0,
        ..finished_request(7, "api-a", vec![5], &[])
    };
    let resync = resync_of(3, vec![running]);
    assert_eq!(
        reply(&mut ingest, resync, 1_004),
        Some(TpToWorker::Ack {
            epoch: 1,
            next_seq: 3
        })
    );
    assert!(ingest.worker(W).unwrap().tracker.contains(7));
    assert!(!ingest.worker(W).unwrap().tracker.contains(1));
}

#[test]
fn heartbeats_are_acknowledged_with_the_next_expected_batch() {
    let mut ingest = Ingest::new(IngestConfig::default());
    // Before its hello a worker is asked for one.
    assert_eq!(
        reply(&mut ingest, heartbeat_of(1, 0), 0),
        Some(TpToWorker::AskHello)
    );
    assert_eq!(reply(&mut ingest, hello(1, 4), 1), None);
    let ack = |next_seq| Some(TpToWorker::Ack { epoch: 1, next_seq });
    assert_eq!(reply(&mut ingest, heartbeat_of(1, 0), 2), ack(0));
    assert_eq!(
        reply(&mut ingest, B::new(1, 0).start(1, "api-a").msg(), 3),
        None
    );
    assert_eq!(
        reply(&mut ingest, B::new(1, 1).verify(1, 4, 2, None).msg(), 4),
        None
    );
    assert_eq!(reply(&mut ingest, heartbeat_of(1, 2), 5), ack(2));
    // Another epoch under the same id is not taken while this one lives: asked for its hello.
    assert_eq!(
        reply(&mut ingest, heartbeat_of(2, 0), 6),
        Some(TpToWorker::AskHello)
    );
    // A refused hello says why.
    let Some(TpToWorker::Refused { reason }) = reply(&mut ingest, hello(2, 4), 7) else {
        panic!("a second live epoch must be refused");
    };
    assert!(reason.contains("held by another live worker"), "{reason}");
    let Some(TpToWorker::Refused { reason }) = reply(&mut ingest, hello(3, 65), 8) else {
        panic!("K above the limit must be refused");
    };
    assert!(reason.contains("65"), "{reason}");
}

fn resync_of(seq: u64, requests: Vec<ResyncRequest>) -> WorkerToTp {
    WorkerToTp::Resync(Resync {
        worker_id: W.into(),
        epoch: 1,
        next_seq: seq,
        requests,
    })
}

fn finished_request(
    id: RequestId,
    owner: &str,
    tokens: Vec<u32>,
    steps: &[(u8, u8)],
) -> ResyncRequest {
    ResyncRequest {
        id,
        owner: owner.into(),
        prompt_tokens: 7,
        cached_prompt_tokens: 4,
        arrival_unix_ms: 1_000_000,
        prefilled: true,
        tokens,
        drafted: steps.iter().map(|s| s.0).collect(),
        accepted: steps.iter().map(|s| s.1).collect(),
        offered: steps.iter().map(|s| s.0).collect(),
        predicted_milli: steps.iter().map(|s| u16::from(s.0) * 500).collect(),
        class: String::new(),
        finish: FinishReason::Stop.code(),
        logprobs: Vec::new(),
        prompt_logprobs: Vec::new(),
    }
}

/// A finished request the worker keeps until acknowledged is replayed with its final output
/// by every resync that lists it, and its steps are counted once however often it is replayed:
/// by a token-processor that never saw it (restarted) and by one that already finished it.
#[test]
fn finished_requests_in_a_resync_get_their_final_again_and_count_once() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest); // 1: 4 tokens after (4,2); 2: 6 tokens after (4,4)
                          // Request 2 finishes in a batch we see; request 1 in one we lose.
    feed(
        &mut ingest,
        B::new(1, 2).verify(2, 4, 0, Some(FinishReason::Stop)).msg(),
        3,
    );
    let steps_seen = ingest.totals(W).unwrap().steps();
    assert_eq!(steps_seen, 3);
    let r1 = finished_request(1, "api-a", vec![5; 4 + 3], &[(4, 2), (4, 2)]);
    let r2 = finished_request(2, "api-b", vec![5; 6 + 1], &[(4, 4), (4, 0)]);
    for round in 0..3 {
        let out = feed(
            &mut ingest,
            resync_of(4, vec![r1.clone(), r2.clone()]),
            4 + round,
        );
        assert_eq!(
            finals(&out),
            vec![(1, FinishReason::Stop, None), (2, FinishReason::Stop, None)],
            "round {round}"
        );
        for o in &out {
            assert_eq!(o.first_index, 0, "replayed from the first token");
            let want = if o.id == 1 { &r1 } else { &r2 };
            assert_eq!(o.tokens, want.tokens);
            assert_eq!(
                o.usage.as_ref().unwrap().completion_tokens,
                want.tokens.len() as u32
            );
            assert_eq!(o.speculate_metrics.as_ref().unwrap().num_steps, 2);
        }
        // Request 1's second step is new at the first replay; nothing is new afterwards.
        assert_eq!(ingest.totals(W).unwrap().steps(), 4, "round {round}");
        assert_eq!(ingest.in_flight(), 0);
    }
    // A token-processor that restarted counts the replayed history once, from zero.
    let mut fresh = Ingest::new(IngestConfig::default());
    feed(&mut fresh, hello(1, 4), 0);
    for round in 0..2 {
        let out = feed(
            &mut fresh,
            resync_of(4, vec![r1.clone(), r2.clone()]),
            1 + round,
        );
        assert_eq!(finals(&out).len(), 2);
        assert_eq!(fresh.totals(W).unwrap().steps(), 4, "round {round}");
    }
    // Once the worker no longer lists them (acknowledged), they are forgotten: a later listing
    // would be a new request.
    feed(&mut fresh, resync_of(4, vec![]), 3);
    feed(&mut fresh, resync_of(4, vec![r1.clone()]), 4);
    assert_eq!(fresh.totals(W).unwrap().steps(), 6);
}

fn hello_with(epoch: u64, proposer: &str, draft_kv_bytes: u64) -> WorkerToTp {
    let WorkerToTp::Hello(mut h) = hello(epoch, 4) else {
        unreachable!()
    };
    h.proposer = proposer.into();
    h.draft_kv_bytes = draft_kv_bytes;
    WorkerToTp::Hello(h)
}

#[test]
fn a_proposer_that_cannot_be_a_metric_label_is_refused_with_the_reason() {
    let mut ingest = Ingest::new(IngestConfig::default());
    let too_long = format!("draft:{}", "m".repeat(MAX_PROPOSER_BYTES - 5));
    for (ms, bad) in ["", too_long.as_str(), "draft:a\nb", "ngram\u{7f}"]
        .into_iter()
        .enumerate()
    {
        let Some(TpToWorker::Refused { reason }) =
            reply(&mut ingest, hello_with(1, bad, 0), ms as u64)
        else {
            panic!("proposer {bad:?} must be refused");
        };
        assert!(reason.contains("proposer"), "{reason}");
    }
    assert_eq!(ingest.live_workers(), 0);
    assert_eq!(ingest.stats().refused_hellos, 4);
    // The longest one that fits is taken.
    let longest = format!("draft:{}", "m".repeat(MAX_PROPOSER_BYTES - 6));
    assert_eq!(reply(&mut ingest, hello_with(1, &longest, 0), 9), None);
    assert_eq!(ingest.worker(W).unwrap().hello.proposer, longest);
}

#[test]
fn a_hello_of_the_same_epoch_takes_draft_kv_bytes_and_a_new_proposer() {
    let mut ingest = Ingest::new(IngestConfig::default());
    let empty = ingest.roster_version();
    // Loading: the draft model's KV cache is not allocated yet.
    feed(&mut ingest, hello_with(1, "draft:tiny", 0), 0);
    feed(&mut ingest, B::new(1, 0).start(1, "api-a").msg(), 1);
    let admitted = ingest.roster_version();
    assert_ne!(admitted, empty);
    feed(&mut ingest, hello_with(1, "draft:tiny", 6_291_456), 2);
    assert_ne!(ingest.roster_version(), admitted, "/health must see it");
    let views = ingest.live_worker_views();
    assert_eq!(views.len(), 1);
    assert_eq!(
        (
            views[0].hello.proposer.as_str(),
            views[0].hello.draft_kv_bytes
        ),
        ("draft:tiny", 6_291_456)
    );
    // Another proposer in the same epoch: the worker keeps its requests, under the new label.
    feed(&mut ingest, hello_with(1, "ngram", 0), 3);
    let entry = ingest.worker(W).unwrap();
    assert_eq!(
        (entry.hello.proposer.as_str(), entry.hello.draft_kv_bytes),
        ("ngram", 0)
    );
    assert!(entry.tracker.contains(1));
    // A lost worker leaves /health too.
    let before_loss = ingest.roster_version();
    ingest.tick(at(1_000), &mut Outbox::default());
    assert!(ingest.live_worker_views().is_empty());
    assert_ne!(ingest.roster_version(), before_loss);
}

/// A stranger that learned the worker's epoch (any api-server's hello reveals it) sends, on its
/// own connection: a goodbye, a heartbeat announcing a seq near 2^64, a batch, a resync, and a
/// hello of the live epoch without the worker's session. Nothing changes for the requests in
/// flight; the worker's own connection goes on; a reconnect of the worker itself (its session)
/// moves the binding.
#[test]
fn frames_for_a_worker_from_another_connection_act_for_nothing() {
    let mut ingest = Ingest::new(IngestConfig::default());
    started(&mut ingest);
    let stranger = bytes::Bytes::from_static(b"stranger");
    let from_stranger = |ingest: &mut Ingest, msg: WorkerToTp| {
        let mut out = Outbox::default();
        let reply = ingest.handle_from(&stranger, msg, at(3), Instant::now(), &mut out);
        assert_eq!(out.drain_outputs().count(), 0, "no output changed");
        reply
    };
    let goodbye = WorkerToTp::Goodbye {
        worker_id: W.into(),
        epoch: 1,
    };
    assert_eq!(from_stranger(&mut ingest, goodbye), None);
    assert_eq!(
        from_stranger(&mut ingest, heartbeat_of(1, u64::MAX - 1)),
        Some(TpToWorker::AskHello)
    );
    let batch = B::new(1, 2)
        .verify(1, 4, 4, Some(FinishReason::Length))
        .msg();
    assert_eq!(
        from_stranger(&mut ingest, batch),
        Some(TpToWorker::AskHello)
    );
    assert_eq!(
        from_stranger(&mut ingest, resync_of(99, Vec::new())),
        Some(TpToWorker::AskHello)
    );
    let WorkerToTp::Hello(mut no_session) = hello(1, 4) else {
        unreachable!()
    };
    no_session.session = 0;
    assert!(matches!(
        from_stranger(&mut ingest, WorkerToTp::Hello(no_session)),
        Some(TpToWorker::Refused { .. })
    ));
    assert_eq!(ingest.in_flight(), 2, "both requests still in flight");
    assert_eq!(ingest.stats().foreign_frames, 5);
    assert_eq!(ingest.worker(W).unwrap().next_seq, Some(2));

    // The worker's own connection is still heard: its next batch is in sequence.
    let outputs = feed(
        &mut ingest,
        B::new(1, 2).verify(1, 4, 1, Some(FinishReason::Stop)).msg(),
        4,
    );
    assert_eq!(finals(&outputs).len(), 1);
    // The worker reconnects (a new connection) with its session: heard from there on.
    let moved = bytes::Bytes::from_static(b"reconnected");
    let mut out = Outbox::default();
    assert_eq!(
        ingest.handle_from(&moved, hello(1, 4), at(5), Instant::now(), &mut out),
        None
    );
    assert_eq!(
        reply(&mut ingest, heartbeat_of(1, 3), 6),
        Some(TpToWorker::AskHello),
        "the old connection no longer acts for it"
    );
}

#[test]
fn a_hello_with_fields_out_of_bounds_is_refused_with_the_reason() {
    let mut ingest = Ingest::new(IngestConfig::default());
    let with = |change: &dyn Fn(&mut WorkerHello)| {
        let WorkerToTp::Hello(mut h) = hello(1, 4) else {
            unreachable!()
        };
        change(&mut h);
        WorkerToTp::Hello(h)
    };
    type Change<'a> = &'a dyn Fn(&mut WorkerHello);
    let cases: [(Change, &str); 5] = [
        (&|h| h.worker_id = "w".repeat(1000), "peer id"),
        (&|h| h.model = "m\n".into(), "model name"),
        (
            &|h| h.heartbeat_interval_ms = u32::MAX,
            "heartbeat_interval_ms",
        ),
        (&|h| h.max_model_len = u32::MAX, "max_model_len"),
        (&|h| h.max_num_seqs = u32::MAX, "max_num_seqs"),
    ];
    for (change, named) in cases {
        match reply(&mut ingest, with(change), 0) {
            Some(TpToWorker::Refused { reason }) => assert!(reason.contains(named), "{reason}"),
            other => panic!("{named}: {other:?}"),
        }
    }
    assert_eq!(ingest.live_workers(), 0);
}

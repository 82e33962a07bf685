//! Seeded randomized test: 100k requests on two workers through prefill, verification steps,
//! preemption, abort, finish and a worker restart. Afterwards no request state is left, every
//! request got exactly one final output whose figures match an independent per-step oracle, and
//! the global counters equal the sums over requests.

use std::collections::HashMap;
use std::time::Instant;

use proto::tp_api::RequestOutput;
use proto::worker_tp::{RequestStart, StepBatch, StepRow, WorkerHello, WorkerToTp};
use proto::{FinishReason, RequestId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use token_processor::ingest::{Ingest, IngestConfig};
use token_processor::tracker::{Clock, Figures, Outbox};

const TOTAL_REQUESTS: u64 = 100_000;

/// What the simulated worker knows about one request: the oracle.
struct SimRequest {
    prefilled: bool,
    steps: Vec<(u8, u8)>,
    delivered: u32,
}

struct SimWorker {
    id: String,
    epoch: u64,
    k: u8,
    seq: u64,
    running: Vec<RequestId>,
    waiting: Vec<RequestId>,
}

impl SimWorker {
    fn hello(&self) -> WorkerToTp {
        WorkerToTp::Hello(WorkerHello {
            protocol_version: proto::PROTOCOL_VERSION,
            worker_id: self.id.clone(),
            epoch: self.epoch,
            model: "m".into(),
            num_spec_tokens: u32::from(self.k),
            proposer: "ngram".into(),
            ready: true,
            heartbeat_interval_ms: 500,
            max_model_len: 2048,
            kv_capacity_tokens: 32_768,
            kv_bytes: 0,
            draft_kv_bytes: 0,
            max_num_seqs: 16,
            session: 7,
        })
    }
}

/// The oracle's `(accepted_i, reached_i)` straight from the spec's definitions.
fn oracle_heads(k: usize, steps: &[(u8, u8)]) -> (Vec<u64>, Vec<u64>) {
    let (mut acc, mut reach) = (vec![0; k], vec![0; k]);
    for &(d, a) in steps {
        for i in 0..k {
            reach[i] += u64::from(i < d as usize && i <= a as usize);
            acc[i] += u64::from(i < a as usize);
        }
    }
    (acc, reach)
}

#[test]
fn hundred_thousand_requests_leave_no_state_and_counters_equal_the_sums() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_5bec);
    let mut ingest = Ingest::new(IngestConfig {
        max_requests_per_worker: 4096,
        ..IngestConfig::default()
    });
    let mut workers = vec![
        SimWorker {
            id: "w-k4".into(),
            epoch: 1,
            k: 4,
            seq: 0,
            running: vec![],
            waiting: vec![],
        },
        SimWorker {
            id: "w-k8".into(),
            epoch: 1,
            k: 8,
            seq: 0,
            running: vec![],
            waiting: vec![],
        },
    ];
    let mut out = Outbox::default();
    let mut ms = 0u64;
    let now = |ms: u64| Clock {
        mono_ns: ms * 1_000_000,
        unix_ms: ms,
    };
    for w in &workers {
        ingest.handle(w.hello(), now(ms), Instant::now(), &mut out);
    }
    let mut sims: HashMap<RequestId, (usize, SimRequest)> = HashMap::new();
    let mut finals: HashMap<RequestId, RequestOutput> = HashMap::new();
    let mut stream_index: HashMap<RequestId, u32> = HashMap::new();
    let mut issued = 0u64;
    let mut restarted = false;

    let mut collect = |out: &mut Outbox, finals: &mut HashMap<RequestId, RequestOutput>| {
        for (_, o) in out.drain_outputs() {
            let next = stream_index.entry(o.id).or_insert(0);
            assert_eq!(o.first_index, *next, "request {} stream has a hole", o.id);
            *next += o.tokens.len() as u32;
            if o.finish.is_some() {
                assert!(finals.insert(o.id, o).is_none(), "two final outputs");
            }
        }
    };

    while issued < TOTAL_REQUESTS
        || workers
            .iter()
            .any(|w| !w.running.is_empty() || !w.waiting.is_empty())
    {
        ms += 1;
        for (wi, w) in workers.iter_mut().enumerate() {
            // Arrivals.
            let arrivals = if issued < TOTAL_REQUESTS {
                rng.gen_range(0..12)
            } else {
                0
            };
            for _ in 0..arrivals.min(TOTAL_REQUESTS - issued) {
                let id = issued;
                issued += 1;
                sims.insert(
                    id,
                    (
                        wi,
                        SimRequest {
                            prefilled: false,
                            steps: vec![],
                            delivered: 0,
                        },
                    ),
                );
                w.waiting.push(id);
            }
            while w.running.len() < 256 && !w.waiting.is_empty() {
                let id = w.waiting.remove(0);
                w.running.push(id);
            }
            let mut batch = StepBatch::new(w.id.clone(), w.epoch, w.seq);
            w.seq += 1;
            let mut still_running = Vec::with_capacity(w.running.len());
            for &id in &w.running {
                let sim = &mut sims.get_mut(&id).unwrap().1;
                let new = !sim.prefilled && sim.delivered == 0 && sim.steps.is_empty();
                if new && !batch.starts.iter().any(|s| batch.ids[s.row as usize] == id) {
                    batch.starts.push(RequestStart {
                        row: batch.len() as u32,
                        owner: format!("api-{}", id % 3),
                        prompt_tokens: (id % 50) as u32 + 1,
                        cached_prompt_tokens: (id % 50) as u32 / 2,
                        arrival_unix_ms: ms,
                        class: String::new(),
                    });
                }
                let roll: f64 = rng.gen();
                let tokens: Vec<u32>;
                let mut row = StepRow {
                    id,
                    tokens: &[],
                    drafted: 0,
                    accepted: 0,
                    offered: 0,
                    predicted_milli: 0,
                    prefill: false,
                    preempted: false,
                    finish: None,
                    logprobs: &[],
                    prompt_logprobs: &[],
                };
                if !sim.prefilled {
                    sim.prefilled = true;
                    tokens = vec![1];
                    row.prefill = true;
                    if roll < 0.03 {
                        row.finish = Some(FinishReason::Length);
                    }
                } else if roll < 0.02 {
                    row.preempted = true;
                    tokens = vec![];
                    w.waiting.push(id);
                } else if roll < 0.03 {
                    row.finish = Some(FinishReason::Abort);
                    tokens = vec![];
                } else {
                    let d = if rng.gen_bool(0.2) {
                        0
                    } else {
                        rng.gen_range(0..=w.k)
                    };
                    let a = rng.gen_range(0..=d);
                    row.drafted = d;
                    row.accepted = a;
                    (row.offered, row.predicted_milli) = policy_of(w.k, d);
                    sim.steps.push((d, a));
                    let end: f64 = rng.gen();
                    if end < 0.05 {
                        row.finish = Some(if rng.gen_bool(0.5) {
                            FinishReason::Stop
                        } else {
                            FinishReason::Length
                        });
                        // A stop may cut the step's tokens short; the figures still count `a`.
                        tokens = vec![7; rng.gen_range(1..=usize::from(a) + 1)];
                    } else {
                        tokens = vec![7; usize::from(a) + 1];
                    }
                }
                sim.delivered += tokens.len() as u32;
                row.tokens = &tokens;
                batch.push(row);
                if row.finish.is_none() && !row.preempted {
                    still_running.push(id);
                }
            }
            w.running = still_running;
            ingest.handle(WorkerToTp::Step(batch), now(ms), Instant::now(), &mut out);
            collect(&mut out, &mut finals);
        }
        // Once, midway: worker 0 restarts; its in-flight requests must fail as WorkerLost.
        if !restarted && issued > TOTAL_REQUESTS / 2 {
            restarted = true;
            // A restart takes longer than the liveness window (a new process loads the model);
            // a new epoch while the old one still speaks would be refused as a duplicate id.
            ms += 2_000;
            let w = &mut workers[0];
            w.epoch += 1;
            w.seq = 0;
            w.running.clear();
            w.waiting.clear();
            ingest.handle(w.hello(), now(ms), Instant::now(), &mut out);
            collect(&mut out, &mut finals);
        }
        assert!(ms < 1_000_000, "simulation does not terminate");
    }
    for w in &workers {
        ingest.handle(
            WorkerToTp::Goodbye {
                worker_id: w.id.clone(),
                epoch: w.epoch,
            },
            now(ms),
            Instant::now(),
            &mut out,
        );
    }
    collect(&mut out, &mut finals);

    // No request state anywhere; no worker left.
    assert_eq!(ingest.in_flight(), 0);
    assert_eq!(ingest.live_workers(), 0);
    assert_eq!(
        finals.len() as u64,
        TOTAL_REQUESTS,
        "every request got exactly one final output"
    );
    assert_eq!(ingest.stats().gaps, 0);

    // Each final output matches the oracle; the counters equal the sums over requests.
    let mut sums: Vec<Figures> = workers
        .iter()
        .map(|w| Figures::new(usize::from(w.k)))
        .collect();
    let mut lost = 0;
    for (id, (wi, sim)) in &sims {
        let fin = &finals[id];
        let k = usize::from(workers[*wi].k);
        let m = fin
            .speculate_metrics
            .as_ref()
            .expect("K > 0: figures present");
        let (acc, reach) = oracle_heads(k, &sim.steps);
        assert_eq!(m.num_steps, sim.steps.len() as u64);
        assert_eq!(
            m.num_accepted_draft_tokens,
            sim.steps.iter().map(|s| u64::from(s.1)).sum::<u64>()
        );
        assert_eq!(m.accepted_tokens_per_head[1..], acc[..]);
        let mut drafted = vec![0u64; k + 1];
        for &(d, _) in &sim.steps {
            drafted[usize::from(d)] += 1;
        }
        assert_eq!(m.draft_length_histogram, drafted);
        // The policy's figures: summed per request, absent when nothing was offered.
        let offered: u64 = (sim.steps.iter())
            .map(|&(d, _)| u64::from(policy_of(workers[*wi].k, d).0))
            .sum();
        let predicted: u64 = (sim.steps.iter())
            .map(|&(d, _)| u64::from(policy_of(workers[*wi].k, d).1))
            .sum();
        assert_eq!(m.num_offered_tokens, (offered > 0).then_some(offered));
        assert_eq!(
            m.predicted_accepted_tokens,
            (offered > 0).then_some(predicted as f64 / 1e3)
        );
        for i in 0..k {
            let want = if reach[i] == 0 {
                0.0
            } else {
                acc[i] as f64 / reach[i] as f64
            };
            assert_eq!(m.accept_ratio_per_head[i], want);
        }
        if fin.finish == Some(FinishReason::Error) {
            lost += 1;
        } else {
            assert_eq!(fin.usage.as_ref().unwrap().completion_tokens, sim.delivered);
        }
        for &(d, a) in &sim.steps {
            sums[*wi].record(d, a);
            let (offered, predicted) = policy_of(workers[*wi].k, d);
            sums[*wi].record_policy(offered, predicted);
        }
    }
    assert!(lost > 0, "the restart failed some requests");
    for (w, sum) in workers.iter().zip(&sums) {
        assert_eq!(ingest.totals(&w.id).unwrap(), sum, "totals of {}", w.id);
    }
}

/// The policy's figures of a step that drafted `d` with K = `k`: one token more offered than
/// verified (up to K), and 0.6 of each verified token predicted accepted.
fn policy_of(k: u8, d: u8) -> (u8, u16) {
    ((d + 1).min(k).max(d), u16::from(d) * 600)
}

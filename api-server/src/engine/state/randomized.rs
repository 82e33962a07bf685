//! 10,000 seeded random event sequences against [`EngineState`]'s invariants: peers that say
//! hello, restart, fall silent, refuse and come back, a token-processor whose outputs arrive
//! late, twice or with gaps, readers that fall behind or leave, pauses of this process. After
//! every input:
//! - a request is in flight only on a live worker, and only while the token-processor is alive
//!   or its outage (bounded) runs;
//! - every abort and acknowledgement names a request that just left, at its own worker; every
//!   probe one still in flight there; a hello is asked for only where the rules say;
//! - a request goes only to a servable worker, and is refused only when none is;
//! - each reader sees exactly its request's tokens, in order, without repeats, then at most one
//!   end (a finish only after all its tokens); at the end of a sequence, every request ended
//!   exactly once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proto::api_worker::{Abort, ApiToWorker, RejectReason, WorkerToApi};
use proto::tp_api::{OutputError, OutputErrorKind, TpToApi};
use proto::{FinishReason, RequestId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc::{self, error::TryRecvError};

use super::tests::{config, heartbeat, output, tp_hello, worker_hello};
use super::{EngineState, Reply, SubmitRefused};
use crate::engine::peers::servable;
use crate::engine::{EngineEvent, EngineFailure};

const SEQUENCES: u64 = 10_000;
const INPUTS: usize = 60;
const WORKER_IDS: [&str; 2] = ["a", "b"];
const MAX_IN_FLIGHT: usize = 12;

/// The `i`-th token of request `id`'s true output.
fn token(id: RequestId, i: u32) -> u32 {
    (id as u32) * 1000 + i
}

/// How a request ended, as its reader saw it.
#[derive(Debug, Clone, PartialEq)]
enum End {
    Finished,
    Failed(EngineFailure),
    /// The channel closed without an end: its reader fell behind (or it was withdrawn).
    Closed,
}

struct Request {
    worker: usize,
    /// Its true output's length: the engine finishes it there.
    len: u32,
    rx: mpsc::Receiver<EngineEvent>,
    seen: Vec<u32>,
    end: Option<End>,
    withdrawn: bool,
}

impl Request {
    /// Reads what its channel holds and checks it against the true output.
    fn read(&mut self, id: RequestId, seed: u64) {
        loop {
            let event = match self.rx.try_recv() {
                Ok(event) => event,
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.end.get_or_insert(End::Closed);
                    return;
                }
            };
            assert!(
                self.end.is_none(),
                "seed {seed}: {id}: {event:?} after its end"
            );
            match event {
                EngineEvent::Tokens(tokens) => {
                    assert!(!tokens.is_empty(), "seed {seed}: {id}: empty tokens");
                    for t in tokens {
                        let i = self.seen.len() as u32;
                        assert_eq!(t, token(id, i), "seed {seed}: {id}: token {i}");
                        self.seen.push(t);
                    }
                    assert!(
                        self.seen.len() as u32 <= self.len,
                        "seed {seed}: {id}: too many"
                    );
                }
                EngineEvent::Finished(f) => {
                    assert_eq!(f.reason, FinishReason::Stop, "seed {seed}: {id}");
                    assert_eq!(
                        self.seen.len() as u32,
                        self.len,
                        "seed {seed}: {id}: finished before all its tokens"
                    );
                    self.end = Some(End::Finished);
                }
                EngineEvent::Failed(why) => self.end = Some(End::Failed(why)),
                other => panic!("seed {seed}: {id}: unexpected {other:?}"),
            }
        }
    }
}

struct Run {
    seed: u64,
    rng: StdRng,
    now: Instant,
    state: EngineState,
    requests: BTreeMap<RequestId, Request>,
    next_id: RequestId,
}

impl Run {
    fn new(seed: u64) -> Self {
        let now = Instant::now();
        Self {
            seed,
            rng: StdRng::seed_from_u64(seed),
            now,
            state: EngineState::new(&config(WORKER_IDS.len(), MAX_IN_FLIGHT), now),
            requests: BTreeMap::new(),
            next_id: 1,
        }
    }

    fn any_worker(&mut self) -> usize {
        self.rng.gen_range(0..WORKER_IDS.len())
    }

    fn any_request(&mut self) -> Option<RequestId> {
        let n = self.requests.len();
        (n > 0).then(|| *self.requests.keys().nth(self.rng.gen_range(0..n)).unwrap())
    }

    fn step(&mut self) {
        match self.rng.gen_range(0..100) {
            0..=9 => self.advance(),
            10..=19 => self.tick(),
            20..=27 => self.worker_hello(),
            28..=39 => self.worker_heartbeat(),
            40..=41 => self.worker_message_other(),
            42..=47 => self.tp_hello(),
            48 => self.tp_other(),
            49..=66 => self.outputs(),
            67..=79 => self.submit(),
            80..=82 => self.withdraw(),
            83..=86 => self.connect(),
            _ => self.read_one(),
        }
    }

    /// Time passes: mostly less than a heartbeat, sometimes long enough to kill a peer, and
    /// sometimes a pause of this whole process.
    fn advance(&mut self) {
        let ms = match self.rng.gen_range(0..20) {
            0 => self.rng.gen_range(2_000..6_000),
            1..=4 => self.rng.gen_range(300..1_500),
            _ => self.rng.gen_range(0..150),
        };
        self.now += Duration::from_millis(ms);
    }

    fn tick(&mut self) {
        let effects = self.state.tick(self.now);
        assert_eq!(effects.reply, Reply::Nothing);
        self.check_frames(&effects.to_workers);
    }

    fn worker_hello(&mut self) {
        let worker = self.any_worker();
        // Now and then a worker claims the other's id.
        let id = WORKER_IDS[if self.rng.gen_bool(0.1) {
            1 - worker
        } else {
            worker
        }];
        let epoch = self.rng.gen_range(1..=2);
        let ready = self.rng.gen_bool(0.9);
        let effects =
            self.state
                .on_worker_message(self.now, worker, worker_hello(id, epoch, ready));
        assert_eq!(effects.reply, Reply::Nothing);
        self.check_frames(&effects.to_workers);
    }

    fn worker_heartbeat(&mut self) {
        let worker = self.any_worker();
        let epoch = self.rng.gen_range(1..=2);
        let accepting = self.rng.gen_bool(0.9);
        let peer = &self.state.workers()[worker];
        let known = peer.alive() && peer.hello.as_ref().is_some_and(|h| h.epoch == epoch);
        let id = WORKER_IDS[worker];
        let effects =
            self.state
                .on_worker_message(self.now, worker, heartbeat(id, epoch, accepting));
        let expected = if known { Reply::Nothing } else { Reply::Hello };
        assert_eq!(
            effects.reply, expected,
            "seed {}: heartbeat reply",
            self.seed
        );
        assert!(effects.to_workers.is_empty());
    }

    fn worker_message_other(&mut self) {
        let worker = self.any_worker();
        let msg = match self.rng.gen_range(0..4) {
            0 => WorkerToApi::AskHello,
            1 => WorkerToApi::Refused {
                reason: "id held".into(),
            },
            2 => WorkerToApi::Rejected {
                id: self.any_request().unwrap_or(0),
                reason: RejectReason::Overloaded,
            },
            _ => {
                let ids = self
                    .requests
                    .keys()
                    .copied()
                    .filter(|_| self.rng.gen_bool(0.5));
                WorkerToApi::NotHeld { ids: ids.collect() }
            }
        };
        let asked = matches!(msg, WorkerToApi::AskHello);
        let effects = self.state.on_worker_message(self.now, worker, msg);
        assert_eq!(effects.reply == Reply::Hello, asked, "seed {}", self.seed);
        self.check_frames(&effects.to_workers);
    }

    fn tp_hello(&mut self) {
        let epoch = self.rng.gen_range(1..=2);
        let takes: Vec<&str> = WORKER_IDS
            .into_iter()
            .filter(|_| self.rng.gen_bool(0.85))
            .collect();
        let effects = self.state.on_tp_message(self.now, tp_hello(epoch, &takes));
        assert_eq!(effects.reply, Reply::Nothing);
        self.check_frames(&effects.to_workers);
    }

    fn tp_other(&mut self) {
        let msg = if self.rng.gen_bool(0.5) {
            TpToApi::AskHello
        } else {
            TpToApi::Refused {
                reason: "id held".into(),
            }
        };
        let asked = matches!(msg, TpToApi::AskHello);
        let effects = self.state.on_tp_message(self.now, msg);
        assert_eq!(effects.reply == Reply::Hello, asked);
        assert!(effects.to_workers.is_empty());
    }

    /// Outputs as a token-processor sends them: windows of each request's true output, some
    /// repeated (a replay), some past a gap, some for requests long gone; the last one
    /// finishes it, or now and then an error does.
    fn outputs(&mut self) {
        let mut outputs = Vec::new();
        for _ in 0..self.rng.gen_range(1..=3) {
            let Some(id) = self.any_request() else { break };
            let len = self.requests[&id].len;
            let seen = self.requests[&id].seen.len() as u32;
            let first = self.rng.gen_range(0..=(seen + 2).min(len));
            let end = (first + self.rng.gen_range(0..=3)).min(len);
            let tokens: Vec<u32> = (first..end).map(|i| token(id, i)).collect();
            let mut out = output(
                id,
                first,
                &tokens,
                (end == len).then_some(FinishReason::Stop),
            );
            if self.rng.gen_range(0..30) == 0 {
                out.finish = Some(FinishReason::Error);
                out.error = Some(OutputError {
                    kind: OutputErrorKind::WorkerLost,
                    message: "lost".into(),
                });
            }
            outputs.push(out);
        }
        let tp_alive = self.state.tp_alive();
        let effects = self
            .state
            .on_tp_message(self.now, TpToApi::Outputs(outputs));
        let expected = if tp_alive {
            Reply::Nothing
        } else {
            Reply::Hello
        };
        assert_eq!(effects.reply, expected, "seed {}: outputs reply", self.seed);
        self.check_frames(&effects.to_workers);
    }

    fn submit(&mut self) {
        let id = self.next_id;
        self.next_id += 1;
        // A small channel now and then: its reader falls behind.
        let capacity = if self.rng.gen_bool(0.1) { 2 } else { 64 };
        let (tx, rx) = mpsc::channel(capacity);
        let any_servable = {
            let state = &self.state;
            state.workers().iter().any(|w| servable(w, state.tp()))
        };
        let (accepting, tp_alive, full) = (
            self.state.accepting(),
            self.state.tp_alive(),
            self.state.in_flight() >= MAX_IN_FLIGHT,
        );
        let seed = self.seed;
        match self.state.submit(self.now, id, tx) {
            Ok(worker) => {
                assert!(accepting && tp_alive && !full, "seed {seed}");
                let state = &self.state;
                assert!(
                    servable(&state.workers()[worker], state.tp()),
                    "seed {seed}: routed to a worker that cannot serve it"
                );
                let len = self.rng.gen_range(1..=8);
                let request = Request {
                    worker,
                    len,
                    rx,
                    seen: Vec::new(),
                    end: None,
                    withdrawn: false,
                };
                self.requests.insert(id, request);
            }
            Err(SubmitRefused::ShuttingDown) => assert!(!accepting, "seed {seed}"),
            Err(SubmitRefused::NoTokenProcessor) => assert!(!tp_alive, "seed {seed}"),
            Err(SubmitRefused::NoWorker) => assert!(!any_servable, "seed {seed}"),
            Err(SubmitRefused::Full) => assert!(full, "seed {seed}"),
        }
    }

    fn withdraw(&mut self) {
        let Some(id) = self.any_request() else { return };
        let in_flight = self.state.registry.worker_of(id).is_some();
        let effects = self.state.withdraw(id);
        let request = self.requests.get_mut(&id).unwrap();
        request.withdrawn |= in_flight;
        let abort = (request.worker, ApiToWorker::Abort(Abort { id }));
        let expected: Vec<_> = in_flight.then_some(abort).into_iter().collect();
        assert_eq!(effects.to_workers, expected, "seed {}", self.seed);
    }

    fn connect(&mut self) {
        let connected = self.rng.gen_bool(0.7);
        if self.rng.gen_bool(0.8) {
            let worker = self.any_worker();
            self.state.set_worker_connected(worker, connected);
        } else {
            self.state.set_tp_connected(connected);
        }
    }

    fn read_one(&mut self) {
        if let Some(id) = self.any_request() {
            let seed = self.seed;
            self.requests.get_mut(&id).unwrap().read(id, seed);
        }
    }

    /// Frames for the workers: aborts and acknowledgements name requests that just left, at
    /// their own worker; probes, requests still in flight there.
    fn check_frames(&mut self, frames: &[(usize, ApiToWorker)]) {
        let seed = self.seed;
        for (worker, frame) in frames {
            let ids = match frame {
                ApiToWorker::Abort(abort) => vec![abort.id],
                ApiToWorker::Delivered { ids } | ApiToWorker::Probe { ids } => ids.clone(),
                other => panic!("seed {seed}: unexpected frame {other:?}"),
            };
            let probe = matches!(frame, ApiToWorker::Probe { .. });
            for id in ids {
                let request = &self.requests[&id];
                assert_eq!(
                    request.worker, *worker,
                    "seed {seed}: {frame:?} to another worker"
                );
                let in_flight = self.state.registry.worker_of(id).is_some();
                assert_eq!(in_flight, probe, "seed {seed}: {frame:?}");
            }
            if let ApiToWorker::Delivered { ids } = frame {
                for id in ids {
                    let request = self.requests.get_mut(id).unwrap();
                    request.read(*id, seed);
                    assert_eq!(
                        request.end,
                        Some(End::Finished),
                        "seed {seed}: {id} acknowledged"
                    );
                }
            }
        }
    }

    /// What holds after every input.
    fn check_invariants(&mut self) {
        let seed = self.seed;
        let state = &self.state;
        let registry = &state.registry;
        let by_worker: u32 = (0..WORKER_IDS.len())
            .map(|w| registry.in_flight_on(w))
            .sum();
        assert_eq!(
            by_worker as usize,
            registry.len(),
            "seed {seed}: per-worker counts"
        );
        assert!(registry.len() <= MAX_IN_FLIGHT);
        for (id, request) in &self.requests {
            let Some(worker) = registry.worker_of(*id) else {
                continue;
            };
            assert_eq!(worker, request.worker, "seed {seed}");
            assert!(
                state.worker_alive(worker),
                "seed {seed}: {id} in flight on a worker not alive"
            );
            assert!(
                request.end.is_none() && !request.withdrawn,
                "seed {seed}: {id} ended"
            );
        }
        if !state.tp_alive() && state.in_flight() > 0 {
            assert!(
                state.tp_outage(self.now).is_some(),
                "seed {seed}: requests wait for a dead token-processor with no outage running"
            );
        }
    }

    /// Ends the sequence: shutting down ends what is left; every request ended exactly once.
    fn finish(mut self) {
        let effects = self.state.shut_down();
        self.check_frames(&effects.to_workers);
        assert_eq!(self.state.in_flight(), 0);
        let seed = self.seed;
        for (id, request) in &mut self.requests {
            request.read(*id, seed);
            if request.withdrawn {
                continue;
            }
            // Ended while in flight: the registry let go of its channel after the end.
            assert!(request.end.is_some(), "seed {seed}: {id} never ended");
        }
    }
}

#[test]
fn ten_thousand_random_sequences_keep_the_invariants() {
    let mut inputs = 0;
    for seed in 0..SEQUENCES {
        let mut run = Run::new(seed);
        // Start from a served state half the time, so requests flow early.
        if seed % 2 == 0 {
            for (i, id) in WORKER_IDS.into_iter().enumerate() {
                run.state.set_worker_connected(i, true);
                run.state
                    .on_worker_message(run.now, i, worker_hello(id, 1, true));
            }
            run.state.on_tp_message(run.now, tp_hello(1, &WORKER_IDS));
        }
        for _ in 0..INPUTS {
            run.step();
            run.check_invariants();
            inputs += 1;
        }
        run.finish();
    }
    assert_eq!(inputs, SEQUENCES as usize * INPUTS);
}

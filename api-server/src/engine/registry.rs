//! In-flight engine requests of this api-server: who runs each one, where its outputs go, and
//! how many tokens it has delivered (so duplicates replayed after a token-processor resync are
//! dropped by `first_index`, and an output past a gap waits for the replay instead). Bounded:
//! [`Registry::insert`] refuses past the cap.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use proto::tp_api::{OutputErrorKind, RequestOutput};
use proto::{FinishReason, RequestId};
use tokio::sync::mpsc;

use super::{EngineEvent, EngineFailure, Finished};

/// Outputs buffered per request before the request is failed as too slow to read.
pub const REQUEST_CHANNEL_CAPACITY: usize = 1024;

struct Entry {
    worker: usize,
    tx: mpsc::Sender<EngineEvent>,
    /// Output tokens delivered so far; the next expected `first_index`.
    delivered: u32,
    /// When the request was submitted or last delivered tokens.
    last_progress: Instant,
    /// When we last asked its worker whether it still holds it.
    probed: Option<Instant>,
}

/// How often one stalled request is probed at most.
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// How soon one request is probed again after an output gap.
const GAP_PROBE_EVERY: Duration = Duration::from_secs(1);

/// What became of one dispatched output.
#[derive(Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// Delivered (possibly nothing new), request still running.
    Delivered,
    /// The request completed and left the registry; `worker` may forget it.
    Finished { worker: usize },
    /// The request ended with an error and left the registry; `worker` must stop it.
    Failed { worker: usize },
    /// Tokens before this output never arrived: it was ignored, and `worker` should be asked
    /// for a replay (Some unless asked within the last second).
    Gap { probe: Option<usize> },
    /// Not ours (already finished or aborted): ignored.
    Unknown,
    /// The request's reader fell behind or left; it was dropped and must be aborted at
    /// `worker`.
    Dropped { worker: usize },
}

pub struct Registry {
    entries: HashMap<RequestId, Entry>,
    per_worker: Vec<u32>,
    cap: usize,
}

impl Registry {
    pub fn new(workers: usize, cap: usize) -> Self {
        Self {
            entries: HashMap::new(),
            per_worker: vec![0; workers],
            cap,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn in_flight_on(&self, worker: usize) -> u32 {
        self.per_worker.get(worker).copied().unwrap_or(0)
    }

    /// Registers a request; `false` when the registry is full.
    pub fn insert(
        &mut self,
        id: RequestId,
        worker: usize,
        tx: mpsc::Sender<EngineEvent>,
        now: Instant,
    ) -> bool {
        if self.entries.len() >= self.cap || worker >= self.per_worker.len() {
            return false;
        }
        self.entries.insert(
            id,
            Entry {
                worker,
                tx,
                delivered: 0,
                last_progress: now,
                probed: None,
            },
        );
        self.per_worker[worker] += 1;
        true
    }

    /// Removes a request; returns the worker it ran on if it was still registered.
    pub fn remove(&mut self, id: RequestId) -> Option<usize> {
        let entry = self.entries.remove(&id)?;
        self.per_worker[entry.worker] -= 1;
        Some(entry.worker)
    }

    /// Ends one request with a failure.
    pub fn fail(&mut self, id: RequestId, failure: EngineFailure) -> Option<usize> {
        let entry = self.entries.get(&id)?;
        let _ = entry.tx.try_send(EngineEvent::Failed(failure));
        self.remove(id)
    }

    /// Ends every request matching `on_worker` (all when `None`) with `failure`; returns the
    /// ended ids with their workers.
    pub fn fail_all(
        &mut self,
        on_worker: Option<usize>,
        failure: EngineFailure,
    ) -> Vec<(RequestId, usize)> {
        let ids: Vec<RequestId> = self
            .entries
            .iter()
            .filter(|(_, e)| on_worker.is_none_or(|w| e.worker == w))
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| self.fail(id, failure.clone()).map(|w| (id, w)))
            .collect()
    }

    /// Requests without progress for `stall` that were not probed in the last [`PROBE_EVERY`],
    /// as `(worker, id)`; marks them probed.
    pub fn stalled(&mut self, now: Instant, stall: Duration) -> Vec<(usize, RequestId)> {
        self.entries
            .iter_mut()
            .filter(|(_, e)| now.saturating_duration_since(e.last_progress) > stall)
            .filter(|(_, e)| {
                e.probed
                    .is_none_or(|t| now.saturating_duration_since(t) >= PROBE_EVERY)
            })
            .map(|(id, e)| {
                e.probed = Some(now);
                (e.worker, *id)
            })
            .collect()
    }

    /// The worker running `id`, if it is registered.
    pub fn worker_of(&self, id: RequestId) -> Option<usize> {
        self.entries.get(&id).map(|e| e.worker)
    }

    /// Delivers one output from the token-processor, received at `now`.
    pub fn dispatch(&mut self, out: RequestOutput, now: Instant) -> Dispatch {
        let Some(entry) = self.entries.get_mut(&out.id) else {
            return Dispatch::Unknown;
        };
        let worker = entry.worker;
        if out.first_index > entry.delivered {
            // Tokens between what we have and this output never arrived (a token-processor
            // restarted or dropped them): wait for the worker's replay, which starts at 0.
            tracing::debug!(
                gap_from = entry.delivered,
                gap_to = out.first_index,
                "output gap; asking for a replay"
            );
            let due = entry
                .probed
                .is_none_or(|t| now.saturating_duration_since(t) >= GAP_PROBE_EVERY);
            if due {
                entry.probed = Some(now);
            }
            return Dispatch::Gap {
                probe: due.then_some(worker),
            };
        }
        let skip = (entry.delivered - out.first_index) as usize;
        if skip < out.tokens.len() {
            let fresh = out.tokens[skip..].to_vec();
            // Once, with the first tokens (a replay from token 0 carries them again).
            let prompt_logprobs = (entry.delivered == 0 && !out.prompt_logprobs.is_empty())
                .then_some(out.prompt_logprobs);
            if prompt_logprobs
                .is_some_and(|l| entry.tx.try_send(EngineEvent::PromptLogprobs(l)).is_err())
            {
                self.remove(out.id);
                return Dispatch::Dropped { worker };
            }
            entry.delivered = out.first_index + out.tokens.len() as u32;
            entry.last_progress = now;
            let logprobs = out.logprobs.get(skip..).filter(|l| !l.is_empty());
            let sent_logprobs = logprobs
                .is_none_or(|l| entry.tx.try_send(EngineEvent::Logprobs(l.to_vec())).is_ok());
            if !sent_logprobs || entry.tx.try_send(EngineEvent::Tokens(fresh)).is_err() {
                self.remove(out.id);
                return Dispatch::Dropped { worker };
            }
        }
        let Some(reason) = out.finish else {
            return Dispatch::Delivered;
        };
        let failed = reason == FinishReason::Error;
        let event = match (reason, out.error) {
            (FinishReason::Error, error) => EngineEvent::Failed(match error.map(|e| e.kind) {
                Some(OutputErrorKind::WorkerLost) => EngineFailure::WorkerLost,
                Some(OutputErrorKind::StepGap) => EngineFailure::OutputGap,
                _ => EngineFailure::Engine,
            }),
            (reason, _) => EngineEvent::Finished(Finished {
                reason,
                usage: out.usage,
                speculate_metrics: out.speculate_metrics.map(|m| *m),
            }),
        };
        let sent = entry.tx.try_send(event).is_ok();
        self.remove(out.id);
        if !sent {
            // Its reader is that far behind: it reads the closed channel as dropped, and the
            // worker must not keep the output for an acknowledgement that will not come.
            return Dispatch::Dropped { worker };
        }
        if failed {
            Dispatch::Failed { worker }
        } else {
            Dispatch::Finished { worker }
        }
    }

    /// Every request, as `(worker, id)`, marked probed: after a token-processor came back, each
    /// worker is asked to replay what it holds of ours (and says which it no longer holds).
    pub fn probe_all(&mut self, now: Instant) -> Vec<(usize, RequestId)> {
        self.entries
            .iter_mut()
            .map(|(id, e)| {
                e.probed = Some(now);
                (e.worker, *id)
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An output of `tokens` from `first_index` (the engine state's tests use it too).
    pub(crate) fn output(
        id: RequestId,
        first_index: u32,
        tokens: &[u32],
        finish: Option<FinishReason>,
    ) -> RequestOutput {
        RequestOutput {
            id,
            first_index,
            tokens: tokens.to_vec(),
            finish,
            usage: None,
            speculate_metrics: None,
            error: None,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        }
    }

    fn t0() -> Instant {
        Instant::now()
    }

    fn drain(rx: &mut mpsc::Receiver<EngineEvent>) -> Vec<u32> {
        let mut tokens = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            if let EngineEvent::Tokens(t) = ev {
                tokens.extend(t);
            }
        }
        tokens
    }

    #[test]
    fn duplicates_from_a_resync_are_dropped() {
        let mut reg = Registry::new(1, 8);
        let (tx, mut rx) = mpsc::channel(16);
        assert!(reg.insert(7, 0, tx, t0()));
        assert_eq!(
            reg.dispatch(output(7, 0, &[10, 11, 12], None), t0()),
            Dispatch::Delivered
        );
        // A resync replays everything, plus one new token.
        assert_eq!(
            reg.dispatch(output(7, 0, &[10, 11, 12, 13], None), t0()),
            Dispatch::Delivered
        );
        assert_eq!(
            reg.dispatch(output(7, 2, &[12, 13], None), t0()),
            Dispatch::Delivered
        );
        assert_eq!(
            reg.dispatch(output(7, 4, &[14], Some(FinishReason::Stop)), t0()),
            Dispatch::Finished { worker: 0 }
        );
        assert_eq!(drain(&mut rx), vec![10, 11, 12, 13, 14]);
        assert!(reg.is_empty());
        assert_eq!(reg.in_flight_on(0), 0);
        assert_eq!(
            reg.dispatch(output(7, 5, &[15], None), t0()),
            Dispatch::Unknown
        );
    }

    #[test]
    fn a_gap_waits_for_the_replay_and_asks_for_it_once_a_second() {
        let mut reg = Registry::new(1, 8);
        let (tx, mut rx) = mpsc::channel(16);
        reg.insert(1, 0, tx, t0());
        reg.dispatch(output(1, 0, &[1], None), t0());
        assert_eq!(
            reg.dispatch(output(1, 3, &[4], None), t0()),
            Dispatch::Gap { probe: Some(0) }
        );
        assert_eq!(
            reg.dispatch(output(1, 4, &[5], Some(FinishReason::Stop)), t0()),
            Dispatch::Gap { probe: None },
            "asked already"
        );
        // The replay from 0 fills the gap; the stream is exact.
        assert_eq!(
            reg.dispatch(
                output(1, 0, &[1, 2, 3, 4, 5], Some(FinishReason::Stop)),
                t0()
            ),
            Dispatch::Finished { worker: 0 }
        );
        assert_eq!(drain(&mut rx), vec![1, 2, 3, 4, 5]);
        assert!(reg.is_empty());
    }

    #[test]
    fn an_error_final_says_the_worker_must_stop_the_request() {
        let mut reg = Registry::new(1, 8);
        let (tx, _rx) = mpsc::channel(16);
        reg.insert(1, 0, tx, t0());
        assert_eq!(
            reg.dispatch(output(1, 0, &[], Some(FinishReason::Error)), t0()),
            Dispatch::Failed { worker: 0 }
        );
    }

    #[test]
    fn full_registry_refuses_and_worker_failures_are_scoped() {
        let mut reg = Registry::new(2, 2);
        let (tx, _rx) = mpsc::channel(4);
        assert!(reg.insert(1, 0, tx.clone(), t0()));
        assert!(reg.insert(2, 1, tx.clone(), t0()));
        assert!(!reg.insert(3, 1, tx, t0()));
        assert_eq!(
            reg.fail_all(Some(1), EngineFailure::WorkerLost),
            vec![(2, 1)]
        );
        assert_eq!(reg.len(), 1);
        assert_eq!(reg.in_flight_on(0), 1);
        assert_eq!(reg.in_flight_on(1), 0);
    }

    #[test]
    fn a_reader_that_falls_behind_is_dropped() {
        let mut reg = Registry::new(1, 8);
        let (tx, _rx) = mpsc::channel(1);
        reg.insert(1, 0, tx, t0());
        assert_eq!(
            reg.dispatch(output(1, 0, &[1], None), t0()),
            Dispatch::Delivered
        );
        assert_eq!(
            reg.dispatch(output(1, 1, &[2], None), t0()),
            Dispatch::Dropped { worker: 0 }
        );
        assert!(reg.is_empty());
    }
}

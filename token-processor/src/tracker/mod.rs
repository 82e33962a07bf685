//! Per-request acceptance tracking for one worker epoch: pure state, no I/O, no clock of its own.
//! The live ingest, the golden-case tests and `replay` all drive this same code.
//!
//! Memory: a request costs one map entry of fixed size plus its [`Figures`] (2(K+1) counters),
//! i.e. O(K), whatever its length; the table holds at most `max_requests` entries and an entry
//! leaves it on finish, abort, failure, or when the worker's epoch ends.

mod effects;
mod figures;
mod outputs;
mod request;
mod settled;

use std::collections::HashMap;
use std::sync::Arc;

pub use effects::{merge_by_owner, FinishedAcceptance, Observations, Outbox, OutputsByOwner};
pub use figures::Figures;
pub use outputs::{encode_outputs_message, OwnerOutputs};
pub use proto::classes::RequestClasses;
pub use request::{PromptTokens, RequestState};

use proto::tp_api::{OutputErrorKind, RequestOutput};
use proto::worker_tp::{ResyncRequest, StepBatch};
use proto::{FinishReason, RequestId, SpeculateMetrics};

/// A moment, as the ingest saw it: monotonic nanoseconds (latencies between deliveries) and wall
/// clock milliseconds (latencies from the api-server's arrival time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    pub mono_ns: u64,
    pub unix_ms: u64,
}

/// Owner names kept interned (one `Arc` per api-server name); names beyond it are not shared.
const MAX_INTERNED_OWNERS: usize = 1024;

/// Maps keyed by request id, hashed with FxHash: ids are chosen by our own (authenticated)
/// api-servers, so hash flooding is not a concern, and SipHash would dominate the per-row cost.
/// Not the identity hash (`nohash-hasher`): an id is a per-api-server prefix over a counter, so
/// its bits are not random and the table's control bytes (the hash's top bits) would collide.
type IdMap<V> = rustc_hash::FxHashMap<RequestId, V>;

/// The in-flight requests of one worker epoch.
#[derive(Debug)]
pub struct Tracker {
    num_spec_tokens: usize,
    max_requests: usize,
    requests: IdMap<RequestState>,
    /// Requests ended recently and what was counted of them (a resync may replay them).
    settled: settled::Settled,
    owners: HashMap<String, Arc<str>>,
    classes: Arc<RequestClasses>,
}

impl Tracker {
    pub fn new(num_spec_tokens: u32, max_requests: usize) -> Self {
        Self {
            num_spec_tokens: num_spec_tokens as usize,
            max_requests,
            requests: IdMap::default(),
            settled: settled::Settled::default(),
            owners: HashMap::new(),
            classes: Arc::default(),
        }
    }

    /// Requests are counted under these classes (by default only `other`).
    pub fn with_classes(mut self, classes: Arc<RequestClasses>) -> Self {
        self.classes = classes;
        self
    }

    pub fn classes(&self) -> &RequestClasses {
        &self.classes
    }

    pub fn num_spec_tokens(&self) -> usize {
        self.num_spec_tokens
    }

    /// In-flight requests.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.requests.contains_key(&id)
    }

    /// The figures so far of an in-flight request.
    pub fn speculate_metrics(&self, id: RequestId) -> Option<SpeculateMetrics> {
        self.requests
            .get(&id)
            .map(|r| r.figures.speculate_metrics())
    }

    pub fn request_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.requests.keys().copied()
    }

    /// The shared name of an owner (so outputs group by pointer).
    fn owner(&mut self, name: &str) -> Arc<str> {
        if let Some(owner) = self.owners.get(name) {
            return owner.clone();
        }
        let owner: Arc<str> = Arc::from(name);
        if self.owners.len() < MAX_INTERNED_OWNERS {
            self.owners.insert(name.to_owned(), owner.clone());
        }
        owner
    }

    /// Ends a request that would exceed the in-flight cap (counted in `obs`).
    fn refuse_at_cap(
        &self,
        state: RequestState,
        id: RequestId,
        out: &mut Outbox,
        obs: &mut Observations,
    ) {
        obs.refused_at_cap += 1;
        let message = format!(
            "token-processor in-flight cap of {} requests per worker reached",
            self.max_requests
        );
        refuse(state, id, (OutputErrorKind::Engine, message), out, obs);
    }

    fn speculating(&self) -> bool {
        self.num_spec_tokens > 0
    }

    /// Applies one batch that passed `StepBatch::validate(K)` with this tracker's K.
    pub fn apply_batch(
        &mut self,
        batch: &StepBatch,
        now: Clock,
        out: &mut Outbox,
        obs: &mut Observations,
    ) {
        self.start_requests(batch, out, obs);
        if let Some(timing) = batch.verify_timing {
            obs.verify_us += u64::from(timing.micros);
            obs.k0_tokens_milli += u64::from(timing.k0_tokens_milli);
            obs.verify_tokens += batch.tokens.len() as u64;
        }
        let speculating = self.speculating();
        out.expect(batch.len());
        self.prefetch_rows(batch);
        for row in batch.rows() {
            let Some(state) = self.requests.get_mut(&row.id) else {
                obs.unknown_rows += 1;
                continue;
            };
            if row.preempted {
                // Recompute preemption: no tokens, no step; the figures carry over.
                continue;
            }
            // An abort or engine failure with no tokens is a notice, not a verification step.
            let notice = row.tokens.is_empty()
                && matches!(row.finish, Some(FinishReason::Abort | FinishReason::Error));
            if row.prefill {
                state.prefilled = true;
            } else if !notice {
                state.figures.record(row.drafted, row.accepted);
                state
                    .figures
                    .record_policy(row.offered, row.predicted_milli);
                obs.record(state.class, &row);
            }
            let has_tokens = !row.tokens.is_empty();
            if has_tokens {
                obs.generation_tokens += row.tokens.len() as u64;
                match state.last_delivery_ns {
                    None => obs.ttft_s.extend(state.age_s(now)),
                    Some(last) => obs
                        .itl_s
                        .push(now.mono_ns.saturating_sub(last) as f64 / 1e9),
                }
                state.last_delivery_ns = Some(now.mono_ns);
            }
            match row.finish {
                None => {
                    if has_tokens {
                        let first_index = state.deliver(row.tokens.len());
                        out.push_tokens(
                            &state.owner,
                            row.id,
                            first_index,
                            row.tokens,
                            row.logprobs,
                        );
                        out.attach_prompt_logprobs(&state.owner, row.prompt_logprobs);
                    }
                }
                Some(reason) => {
                    let mut output = state.tokens_output(row.id, row.tokens.to_vec());
                    output.logprobs = row.logprobs.to_vec();
                    output.prompt_logprobs = row.prompt_logprobs.to_vec();
                    state.finalize(&mut output, reason, worker_failure(reason), speculating);
                    obs.count_finish(reason);
                    obs.finished_request(state.class, &state.figures);
                    obs.e2e_s.extend(state.age_s(now));
                    let owner = state.owner.clone();
                    if let Some(state) = self.requests.remove(&row.id) {
                        self.settled.insert(row.id, &state);
                    }
                    out.push(&owner, output);
                }
            }
        }
    }

    /// Starts tracking the batch's new requests (those beyond the in-flight cap are refused).
    fn start_requests(&mut self, batch: &StepBatch, out: &mut Outbox, obs: &mut Observations) {
        for start in &batch.starts {
            let id = batch.ids[start.row as usize];
            if self.requests.contains_key(&id) {
                // Already known (e.g. restored by a resync): the first start wins.
                continue;
            }
            let owner: Arc<str> = self.owner(&start.owner);
            if self.requests.len() >= self.max_requests {
                let state = RequestState::new(owner, start.into(), start.arrival_unix_ms, 0);
                self.refuse_at_cap(state, id, out, obs);
                continue;
            }
            obs.count_prompt(start.into());
            let mut state = RequestState::new(
                owner,
                start.into(),
                start.arrival_unix_ms,
                self.num_spec_tokens,
            );
            state.class = self.classes.index_of(&start.class);
            self.requests.insert(id, state);
        }
    }

    /// Touches every row's request before any is applied.
    fn prefetch_rows(&self, batch: &StepBatch) {
        // Independent lookups first, so their cache misses overlap (see `Figures::touch`).
        for id in &batch.ids {
            if let Some(state) = self.requests.get(id) {
                // The entry spans two cache lines; the lookup loaded the first.
                figures::prefetch((state as *const RequestState).cast::<u8>().wrapping_add(64));
                state.figures.touch();
            }
        }
    }

    /// Ends one in-flight request with an error (its figures so far go with it).
    pub fn fail(
        &mut self,
        id: RequestId,
        kind: OutputErrorKind,
        message: &str,
        now: Clock,
        out: &mut Outbox,
        obs: &mut Observations,
    ) {
        let speculating = self.speculating();
        if let Some(mut state) = self.requests.remove(&id) {
            let mut output = state.tokens_output(id, Vec::new());
            state.finalize(
                &mut output,
                FinishReason::Error,
                Some((kind, message.to_owned())),
                speculating,
            );
            obs.count_finish(FinishReason::Error);
            obs.finished_request(state.class, &state.figures);
            obs.e2e_s.extend(state.age_s(now));
            self.settled.insert(id, &state);
            out.push(&state.owner, output);
        }
    }

    /// Ends every in-flight request with an error; the table is empty afterwards.
    pub fn fail_all(
        &mut self,
        kind: OutputErrorKind,
        message: &str,
        now: Clock,
        out: &mut Outbox,
        obs: &mut Observations,
    ) {
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        for id in ids {
            self.fail(id, kind, message, now, out, obs);
        }
    }

    /// Makes the table exactly the worker's view (authoritative) and replays it: requests the
    /// worker no longer lists are failed; listed ones take its figures, counted once (a known
    /// request's counters grow by the difference, as do those of a request this tracker ended
    /// recently, from the steps it had counted; others are adopted); every listed request's
    /// tokens go out again from index 0 (the api-server drops what it has), and finished ones
    /// (kept by the worker until acknowledged) get their final output again.
    pub fn resync(
        &mut self,
        requests: &[ResyncRequest],
        now: Clock,
        out: &mut Outbox,
        obs: &mut Observations,
    ) {
        let in_resync: std::collections::HashSet<RequestId> =
            requests.iter().map(|r| r.id).collect();
        let gone: Vec<RequestId> = self
            .requests
            .keys()
            .filter(|id| !in_resync.contains(id))
            .copied()
            .collect();
        for id in gone {
            self.fail(
                id,
                OutputErrorKind::StepGap,
                "the worker's resync no longer lists the request",
                now,
                out,
                obs,
            );
        }
        // The worker forgot the others (acknowledged): they cannot come back.
        self.settled.retain(&in_resync);
        for req in requests {
            self.replay(req, now, out, obs);
        }
    }

    /// One request of a resync (see [`resync`](Self::resync)).
    fn replay(
        &mut self,
        req: &ResyncRequest,
        now: Clock,
        out: &mut Outbox,
        obs: &mut Observations,
    ) {
        let history = figures_from_history(self.num_spec_tokens, req, req.drafted.len())
            .filter(|_| logprobs_fit(req));
        let (Some(figures), Some(finish)) = (history, FinishReason::from_code(req.finish)) else {
            self.fail_invalid_replay(req, now, out, obs);
            return;
        };
        let ended_before = self.settled.get(req.id);
        let Some(mut state) = self.resynced_state(req, figures, finish, ended_before, out, obs)
        else {
            return;
        };
        rewind_deliveries(&mut state, req, now, obs);
        let mut output = state.tokens_output(req.id, req.tokens.clone());
        output.logprobs = req.logprobs.clone();
        output.prompt_logprobs = req.prompt_logprobs.clone();
        let owner = state.owner.clone();
        match finish {
            None => {
                self.requests.insert(req.id, state);
            }
            Some(reason) => {
                state.finalize(
                    &mut output,
                    reason,
                    worker_failure(reason),
                    self.speculating(),
                );
                if ended_before.is_none() {
                    obs.count_finish(reason);
                    obs.finished_request(state.class, &state.figures);
                    obs.e2e_s.extend(state.age_s(now));
                }
                self.settled.insert(req.id, &state);
            }
        }
        out.push(&owner, output);
    }

    /// A resync the worker should never send (history or finish code invalid): fails the
    /// request rather than guess.
    fn fail_invalid_replay(
        &mut self,
        req: &ResyncRequest,
        now: Clock,
        out: &mut Outbox,
        obs: &mut Observations,
    ) {
        let message = "resync carried an invalid history, finish code or logprobs";
        if self.requests.contains_key(&req.id) {
            self.fail(req.id, OutputErrorKind::StepGap, message, now, out, obs);
        } else {
            let owner: Arc<str> = self.owner(&req.owner);
            let k = self.num_spec_tokens;
            let state = RequestState::new(owner, req.into(), req.arrival_unix_ms, k);
            refuse(
                state,
                req.id,
                (OutputErrorKind::StepGap, message.to_owned()),
                out,
                obs,
            );
        }
    }

    /// The replayed request's state, taken out of the table, with the worker's `figures` and
    /// their growth counted in `obs`; None when it was refused at the in-flight cap.
    fn resynced_state(
        &mut self,
        req: &ResyncRequest,
        figures: Figures,
        finish: Option<FinishReason>,
        ended_before: Option<settled::Ended>,
        out: &mut Outbox,
        obs: &mut Observations,
    ) -> Option<RequestState> {
        if let Some(mut state) = self.requests.remove(&req.id) {
            obs.class_figures(state.class)
                .add_growth(&figures, &state.figures);
            state.figures = figures;
            return Some(state);
        }
        if finish.is_none() && ended_before.is_none() && self.requests.len() >= self.max_requests {
            let owner: Arc<str> = self.owner(&req.owner);
            let state = RequestState::new(owner, req.into(), req.arrival_unix_ms, 0);
            self.refuse_at_cap(state, req.id, out, obs);
            return None;
        }
        Some(self.untracked_state(req, figures, ended_before, obs))
    }

    /// The state of a request the table does not hold: one this tracker ended recently counts
    /// only the steps it had not counted; any other is adopted whole.
    fn untracked_state(
        &mut self,
        req: &ResyncRequest,
        figures: Figures,
        ended_before: Option<settled::Ended>,
        obs: &mut Observations,
    ) -> RequestState {
        let k = self.num_spec_tokens;
        let mut state =
            RequestState::new(self.owner(&req.owner), req.into(), req.arrival_unix_ms, k);
        state.class = self.classes.index_of(&req.class);
        match ended_before {
            Some(ended) => {
                let counted = (ended.steps as usize).min(req.drafted.len());
                let before =
                    figures_from_history(k, req, counted).unwrap_or_else(|| Figures::new(k));
                obs.class_figures(state.class).add_growth(&figures, &before);
                state.delivered = ended.delivered;
            }
            None => {
                obs.class_figures(state.class).add(&figures);
                obs.count_prompt(req.into());
            }
        }
        state.figures = figures;
        state
    }
}

/// A resync sends all of a request's tokens again from index 0: counts those not delivered
/// before as generated, and restarts the delivery count.
fn rewind_deliveries(
    state: &mut RequestState,
    req: &ResyncRequest,
    now: Clock,
    obs: &mut Observations,
) {
    state.prefilled = req.prefilled;
    let fresh = req.tokens.len().saturating_sub(state.delivered as usize);
    obs.generation_tokens += fresh as u64;
    if fresh > 0 {
        state.last_delivery_ns = Some(now.mono_ns);
    }
    state.delivered = 0;
}

/// The error a request the engine-worker finished with `Error` carries.
fn worker_failure(reason: FinishReason) -> Option<(OutputErrorKind, String)> {
    (reason == FinishReason::Error).then(|| {
        (
            OutputErrorKind::Engine,
            "the engine-worker failed the request".to_owned(),
        )
    })
}

/// Ends a request that is not (and will not be) tracked: its only output is a final error.
fn refuse(
    state: RequestState,
    id: RequestId,
    error: (OutputErrorKind, String),
    out: &mut Outbox,
    obs: &mut Observations,
) {
    let mut output = empty_output(id);
    state.finalize(&mut output, FinishReason::Error, Some(error), false);
    obs.count_finish(FinishReason::Error);
    out.push(&state.owner, output);
}

/// An output with no tokens yet (to be finalized).
fn empty_output(id: RequestId) -> RequestOutput {
    RequestOutput {
        id,
        first_index: 0,
        tokens: Vec::new(),
        finish: None,
        usage: None,
        speculate_metrics: None,
        error: None,
        logprobs: Vec::new(),
        prompt_logprobs: Vec::new(),
    }
}

/// A resync's logprobs are one per token, or absent (the request did not ask for them); its
/// prompt logprobs one per prompt token after the first, or absent.
fn logprobs_fit(req: &ResyncRequest) -> bool {
    let prompt_scored = req.prompt_tokens.saturating_sub(1) as usize;
    (req.logprobs.is_empty() || req.logprobs.len() == req.tokens.len())
        && (req.prompt_logprobs.is_empty() || req.prompt_logprobs.len() == prompt_scored)
        && (req.logprobs.iter())
            .chain(&req.prompt_logprobs)
            .all(|t| t.top.len() <= usize::from(proto::MAX_TOP_LOGPROBS))
}

/// Rebuilds figures from the first `steps` steps of a resync's history (`(drafted, accepted)`,
/// and the policy's offered and predicted); None if it is inconsistent.
fn figures_from_history(k: usize, req: &ResyncRequest, steps: usize) -> Option<Figures> {
    let n = req.drafted.len();
    if req.accepted.len() != n || req.offered.len() != n || req.predicted_milli.len() != n {
        return None;
    }
    let mut figures = Figures::new(k);
    for i in 0..steps.min(n) {
        let (d, a, o, p) = (
            req.drafted[i],
            req.accepted[i],
            req.offered[i],
            req.predicted_milli[i],
        );
        let policy_ok = o >= d && usize::from(o) <= k && u32::from(p) <= 1000 * u32::from(d);
        if a > d || usize::from(d) > k || !policy_ok {
            return None;
        }
        figures.record(d, a);
        figures.record_policy(o, p);
    }
    Some(figures)
}

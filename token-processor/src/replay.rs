//! Acceptance traces (a golden case file, or the JSON Lines an engine-worker writes with
//! `--trace-acceptance`) replayed through the live ingest's state machine: each event becomes a
//! step-batch row of a synthetic worker, so `replay` and the service compute the same numbers.
//! The lines are [`proto::trace`]'s types, the ones the worker writes with.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use proto::tp_api::RequestOutput;
use proto::trace::{Event, Header};
use proto::worker_tp::{RequestStart, StepBatch, StepRow, WorkerHello, WorkerToTp};
use proto::{FinishReason, RequestId, SpeculateMetrics};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::error::TpError;
use crate::ingest::{Ingest, IngestConfig, MAX_SPEC_TOKENS};
use crate::tracker::{Clock, Figures, Outbox};

/// The synthetic worker a replay runs as.
const REPLAY_WORKER: &str = "replay";
const REPLAY_OWNER: &str = "replay";

pub use proto::trace::EventKind;

/// One trace event, checked: a verify's `(drafted, accepted)` within K, an abort's finish filled
/// in (0s where the kind has no draft).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    pub kind: EventKind,
    pub request: String,
    pub drafted: u8,
    pub accepted: u8,
    pub finish: Option<FinishReason>,
}

#[derive(Debug, Clone)]
pub struct Trace {
    pub num_spec_tokens: u32,
    pub events: Vec<TraceEvent>,
}

/// A trace file's text.
/// A trace's K, bounded as the token-processor bounds a worker's: everything sized by K (per
/// head counts, histograms) is then bounded too, whatever the file says.
pub fn check_num_spec_tokens(num_spec_tokens: u32) -> Result<(), TpError> {
    match num_spec_tokens > MAX_SPEC_TOKENS {
        true => Err(TpError::TraceParse {
            line: 1,
            message: format!("num_spec_tokens {num_spec_tokens} exceeds {MAX_SPEC_TOKENS}"),
        }),
        false => Ok(()),
    }
}

pub fn read_trace(path: &Path) -> Result<String, TpError> {
    std::fs::read_to_string(path).map_err(|source| TpError::TraceIo {
        path: path.display().to_string(),
        source,
    })
}

#[derive(Deserialize)]
struct GoldenFile {
    num_spec_tokens: u32,
    events: Vec<serde_json::Value>,
}

impl Trace {
    pub fn load(path: &Path) -> Result<Self, TpError> {
        Self::parse(&read_trace(path)?)
    }

    /// A golden case (one JSON object with `events`) or JSON Lines (header, then one event a line).
    pub fn parse(text: &str) -> Result<Self, TpError> {
        if let Ok(golden) = serde_json::from_str::<GoldenFile>(text) {
            let mut events = Vec::with_capacity(golden.events.len());
            for (i, value) in golden.events.into_iter().enumerate() {
                let raw: Event =
                    serde_json::from_value(value).map_err(|e| TpError::TraceParse {
                        line: i + 1,
                        message: format!("event {i}: {e}"),
                    })?;
                events.push(raw);
            }
            return Self::checked(golden.num_spec_tokens, events);
        }
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let Some((header_line, header)) = lines.next() else {
            return Err(TpError::TraceParse {
                line: 1,
                message: "empty trace".into(),
            });
        };
        let header: Header = serde_json::from_str(header).map_err(|e| TpError::TraceParse {
            line: header_line + 1,
            message: format!("header: {e}"),
        })?;
        let mut events = Vec::new();
        for (i, line) in lines {
            let raw: Event = serde_json::from_str(line).map_err(|e| TpError::TraceParse {
                line: i + 1,
                message: e.to_string(),
            })?;
            events.push(raw);
        }
        Self::checked(header.num_spec_tokens, events)
    }

    fn checked(num_spec_tokens: u32, raw: Vec<Event>) -> Result<Self, TpError> {
        check_num_spec_tokens(num_spec_tokens)?;
        let mut events = Vec::with_capacity(raw.len());
        let mut finished = std::collections::HashSet::new();
        for (index, r) in raw.into_iter().enumerate() {
            let request = r.request.into_string();
            let bad = |message: String| TpError::TraceEvent {
                index,
                request: request.clone(),
                message,
            };
            if finished.contains(&request) {
                return Err(bad("event after the request finished".into()));
            }
            let (drafted, accepted) = match r.kind {
                EventKind::Verify => match (r.drafted, r.accepted) {
                    (Some(d), Some(a)) if a <= d && u32::from(d) <= num_spec_tokens => (d, a),
                    (Some(d), Some(a)) => {
                        return Err(bad(format!(
                            "need accepted <= drafted <= {num_spec_tokens}, got ({d}, {a})"
                        )))
                    }
                    _ => return Err(bad("verify needs drafted and accepted".into())),
                },
                _ => (0, 0),
            };
            let finish = match r.kind {
                EventKind::Abort => Some(r.finish.unwrap_or(FinishReason::Abort)),
                EventKind::Preempted if r.finish.is_some() => {
                    return Err(bad("a preemption cannot finish a request".into()))
                }
                _ => r.finish,
            };
            if finish.is_some() {
                finished.insert(request.clone());
            }
            events.push(TraceEvent {
                kind: r.kind,
                request,
                drafted,
                accepted,
                finish,
            });
        }
        Ok(Self {
            num_spec_tokens,
            events,
        })
    }
}

/// How events are packed into step batches (the figures must not depend on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// One single-row batch per event.
    PerEvent,
    /// Consecutive events in one batch until a request repeats, like an engine step.
    Packed,
}

/// `speculate_metrics` plus the finish reason, as in the golden files' `expected.requests`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayRequest {
    #[serde(flatten)]
    pub metrics: Option<SpeculateMetrics>,
    pub finish_reason: Option<FinishReason>,
}

/// The golden files' `expected.global`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GlobalCounters {
    pub num_steps_total: u64,
    pub num_drafts_total: u64,
    pub num_draft_tokens_total: u64,
    pub num_accepted_tokens_total: u64,
    pub num_accepted_tokens_per_pos_total: Vec<u64>,
    pub num_emitted_tokens_total: u64,
    pub accept_length_histogram: Vec<u64>,
    pub draft_length_histogram: Vec<u64>,
}

impl GlobalCounters {
    pub fn from_figures(f: &Figures) -> Self {
        Self {
            num_steps_total: f.steps(),
            num_drafts_total: f.drafts(),
            num_draft_tokens_total: f.draft_tokens(),
            num_accepted_tokens_total: f.accepted_draft_tokens(),
            num_accepted_tokens_per_pos_total: f.accepted_per_position(),
            num_emitted_tokens_total: f.emitted_tokens(),
            accept_length_histogram: f.accept_length_histogram().to_vec(),
            draft_length_histogram: f.draft_length_histogram().to_vec(),
        }
    }
}

/// `{"requests": {...}, "global": {...}}`, requests in first-seen order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayResult {
    #[serde(serialize_with = "ordered_map")]
    pub requests: Vec<(String, ReplayRequest)>,
    pub global: GlobalCounters,
    /// Every output the replay produced, in order (not printed; for tests).
    #[serde(skip)]
    pub outputs: Vec<RequestOutput>,
}

fn ordered_map<S: Serializer>(
    entries: &[(String, ReplayRequest)],
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(Some(entries.len()))?;
    for (k, v) in entries {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

/// The step batches a trace turns into, for the synthetic worker, with the string → id map.
pub fn to_batches(trace: &Trace, batching: Batching) -> (Vec<StepBatch>, Vec<String>) {
    let mut ids: HashMap<&str, RequestId> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    let mut batches = Vec::new();
    let mut batch = StepBatch::new(REPLAY_WORKER.into(), 1, 0);
    let mut in_batch: std::collections::HashSet<RequestId> = std::collections::HashSet::new();
    // Dummy token ids: the figures never look at them; usage counts them.
    let bonus = [0u32; 256];
    for event in &trace.events {
        let next_id = names.len() as RequestId;
        let (id, fresh) = match ids.get(event.request.as_str()) {
            Some(&id) => (id, false),
            None => {
                ids.insert(&event.request, next_id);
                names.push(event.request.clone());
                (next_id, true)
            }
        };
        if batching == Batching::PerEvent || in_batch.contains(&id) {
            if !batch.is_empty() {
                let seq = batch.seq;
                batches.push(std::mem::replace(
                    &mut batch,
                    StepBatch::new(REPLAY_WORKER.into(), 1, seq + 1),
                ));
            }
            in_batch.clear();
        }
        in_batch.insert(id);
        if fresh {
            batch.starts.push(RequestStart {
                row: batch.len() as u32,
                owner: REPLAY_OWNER.into(),
                prompt_tokens: 0,
                cached_prompt_tokens: 0,
                arrival_unix_ms: 0,
                class: String::new(),
            });
        }
        let tokens: &[u32] = match event.kind {
            EventKind::Prefill => &bonus[..1],
            EventKind::Verify => &bonus[..usize::from(event.accepted) + 1],
            EventKind::Preempted | EventKind::Abort => &[],
        };
        batch.push(StepRow {
            id,
            tokens,
            drafted: event.drafted,
            accepted: event.accepted,
            // The replay counts the spec's figures; the policy's are `--what-if`'s.
            offered: event.drafted,
            predicted_milli: 0,
            prefill: event.kind == EventKind::Prefill,
            preempted: event.kind == EventKind::Preempted,
            finish: event.finish,
            logprobs: &[],
            prompt_logprobs: &[],
        });
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    (batches, names)
}

/// The spec's figures alone: a replay knows no predictions, so it reports none.
fn spec_only(mut metrics: SpeculateMetrics) -> SpeculateMetrics {
    metrics.num_offered_tokens = None;
    metrics.predicted_accepted_tokens = None;
    metrics
}

/// Replays `trace` through a fresh [`Ingest`] as one synthetic worker.
pub fn run(trace: &Trace, batching: Batching) -> ReplayResult {
    let (batches, names) = to_batches(trace, batching);
    let mut ingest = Ingest::new(IngestConfig {
        max_requests_per_worker: usize::MAX,
        ..IngestConfig::default()
    });
    let now = Clock {
        mono_ns: 0,
        unix_ms: 0,
    };
    let mut out = Outbox::default();
    ingest.handle(
        WorkerToTp::Hello(WorkerHello {
            protocol_version: proto::PROTOCOL_VERSION,
            worker_id: REPLAY_WORKER.into(),
            epoch: 1,
            model: "replay".into(),
            num_spec_tokens: trace.num_spec_tokens,
            proposer: "replay".into(),
            ready: true,
            heartbeat_interval_ms: 0,
            max_model_len: 2048,
            kv_capacity_tokens: 32_768,
            kv_bytes: 0,
            draft_kv_bytes: 0,
            max_num_seqs: 16,
            session: 7,
        }),
        now,
        Instant::now(),
        &mut out,
    );
    let mut outputs = Vec::new();
    let mut finals: HashMap<RequestId, ReplayRequest> = HashMap::new();
    for batch in batches {
        ingest.handle(WorkerToTp::Step(batch), now, Instant::now(), &mut out);
        for (_, output) in out.drain_outputs() {
            if let Some(reason) = output.finish {
                finals.insert(
                    output.id,
                    ReplayRequest {
                        metrics: output.speculate_metrics.as_deref().cloned().map(spec_only),
                        finish_reason: Some(reason),
                    },
                );
            }
            outputs.push(output);
        }
    }
    let speculating = trace.num_spec_tokens > 0;
    let requests = names
        .into_iter()
        .enumerate()
        .map(|(id, name)| {
            let id = id as RequestId;
            let entry = finals.remove(&id).unwrap_or_else(|| ReplayRequest {
                metrics: ingest
                    .in_flight_metrics(REPLAY_WORKER, id)
                    .filter(|_| speculating)
                    .map(spec_only),
                finish_reason: None,
            });
            (name, entry)
        })
        .collect();
    let zero = Figures::new(trace.num_spec_tokens as usize);
    let global = GlobalCounters::from_figures(ingest.totals(REPLAY_WORKER).unwrap_or(&zero));
    ReplayResult {
        requests,
        global,
        outputs,
    }
}

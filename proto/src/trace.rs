//! Acceptance trace files: what an engine-worker writes with `--trace-acceptance` and
//! `token-processor replay` reads. JSON Lines: one [`Header`], then one [`Event`] a line, in the
//! golden event format (`../shared/spec/acceptance-metrics.md`, "Trace files"). The golden case
//! files hold the same events in their `events` list.
//!
//! A file format, not a wire message: these types never cross a socket, so they have no bearing
//! on [`crate::PROTOCOL_VERSION`]. Data only: the reader checks what the events mean (a verify's
//! `accepted <= drafted <= K`, nothing after a finish).
//!
//! Fields are declared in alphabetical order on purpose: serde writes them in declaration order,
//! and the worker wrote these lines through `serde_json::Value` (whose maps sort their keys)
//! before the types existed, so traces stay byte-identical to those written then.

use serde::{Deserialize, Serialize};

use crate::FinishReason;

/// The first line: `num_spec_tokens` (K), and whatever else identifies the run. Only K is
/// required, so a hand-written `{"num_spec_tokens": 2}` is a header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub num_spec_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposer: Option<String>,
    /// The drafting policy's verify-cost curve when the trace started: `[tokens, seconds]`
    /// points, tokens ascending (what `replay --what-if` prices steps with).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verify_cost: Vec<(u32, f64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
}

/// What happened to a request in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// Its prompt was prefilled (one token sampled).
    Prefill,
    /// A draft of `drafted` tokens was verified, `accepted` of them kept.
    Verify,
    /// It lost its cache and waits to be recomputed; never a finish.
    Preempted,
    /// It was aborted; finishes it (`abort` unless the event says otherwise).
    Abort,
}

/// A request as a trace names it: any string (golden cases say `"cmpl-7"`, the worker writes
/// its numeric id in decimal). A bare number is accepted too, for hand-written traces.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestName {
    Text(String),
    Number(u64),
}

impl RequestName {
    /// The name as a string: a number in decimal, so `7` and `"7"` name one request.
    pub fn into_string(self) -> String {
        match self {
            Self::Text(s) => s,
            Self::Number(n) => n.to_string(),
        }
    }
}

/// One event line. `drafted` and `accepted` are present on (and only on) a verify; `finish` on
/// the event that ends the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafted: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<FinishReason>,
    /// On a verify: every draft token the proposer offered (`drafted` of them were verified),
    /// so a what-if replay can re-score the step at another K or policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered: Option<Vec<u32>>,
    pub request: RequestName,
    /// The worker's step number (rows of one step share it): the batch a replay prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Microseconds since the trace started, at the end of the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_us: Option<u64>,
    /// The tokens the step emitted for the request (the prefill's first, or a verify's accepted
    /// drafts and bonus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// Microseconds of the step's verify forward when every row was a verify row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_us: Option<u32>,
}

//! `speculate_metrics`: the per-request acceptance figures of `shared/spec/acceptance-metrics.md`.

use serde::{Deserialize, Serialize};

/// Per-request acceptance figures. Field names and order are the spec's (FastDeploy's names);
/// serde keeps declaration order, so JSON output matches the spec field for field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct SpeculateMetrics {
    pub accepted_tokens: u64,
    pub rejected_tokens: u64,
    pub accept_ratio: f64,
    pub average_accept_length: f64,
    pub accept_ratio_per_head: Vec<f64>,
    pub accepted_tokens_per_head: Vec<u64>,
    pub num_steps: u64,
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_draft_tokens: u64,
    pub draft_acceptance_rate: f64,
    pub accept_length_histogram: Vec<u64>,
    pub draft_length_histogram: Vec<u64>,
    /// Additions beyond the spec (docs/metrics.md), present together or not at all (absent when
    /// the proposer offered nothing, so a trace without them replays to the spec's object):
    /// draft tokens the proposer offered the drafting policy (`num_draft_tokens` of them were
    /// verified)...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_offered_tokens: Option<u64>,
    /// ...and the accepted draft tokens the policy predicted for what it verified (compare
    /// with `num_accepted_draft_tokens`). Last, so a MessagePack array without both ends early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_accepted_tokens: Option<f64>,
}

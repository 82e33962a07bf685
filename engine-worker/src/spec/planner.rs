//! The drafting policy's state in one engine: the policy, the worker-wide acceptance table and
//! the fitted step cost, fed by every verdict and every verify forward.

use super::acceptance::{AcceptanceTable, RequestAcceptance};
use super::cost::StepCost;
use super::policy::{plan_draft_lengths, DraftCandidate, SpecPolicy};

#[derive(Debug, Clone)]
pub struct DraftPlanner {
    policy: SpecPolicy,
    table: AcceptanceTable,
    cost: StepCost,
    forwards_seen: u64,
}

/// Every this many verify forwards the fitted cost goes to the log (debug).
const REPORT_EVERY: u64 = 512;

impl DraftPlanner {
    /// A planner for drafts of up to `max_drafts` tokens on a device whose verify forwards
    /// cost `cost`.
    pub fn new(policy: SpecPolicy, max_drafts: usize, cost: StepCost) -> Self {
        Self {
            policy,
            table: AcceptanceTable::new(max_drafts),
            cost,
            forwards_seen: 0,
        }
    }

    pub fn cost(&self) -> &StepCost {
        &self.cost
    }

    /// How many proposed tokens each candidate verifies this step; with a model drafter whose
    /// forwards cost `draft`, how many it drafts (and verifies).
    pub fn plan(
        &self,
        candidates: &[DraftCandidate<'_>],
        verify_rows: usize,
        draft: Option<&StepCost>,
    ) -> Vec<usize> {
        plan_draft_lengths(
            self.policy,
            candidates,
            verify_rows,
            &self.table,
            &self.cost,
            draft,
        )
    }

    /// A verify forward of `tokens` tokens took `seconds`.
    pub fn observe_forward(&mut self, tokens: usize, seconds: f64) {
        self.cost.observe(tokens, seconds);
        self.forwards_seen += 1;
        if self.forwards_seen.is_multiple_of(REPORT_EVERY) {
            tracing::debug!(
                one_token_ms = self.cost.seconds(1.0) * 1e3,
                eight_tokens_ms = self.cost.seconds(8.0) * 1e3,
                last_tokens = tokens,
                last_ms = seconds * 1e3,
                first_draft_rate_by_strength = ?[1, 2, 3, 4].map(|n| self.table.rate(n, 0)),
                "verify cost refitted"
            );
        }
    }

    /// The verifier accepted `accepted` of `drafted` tokens of a match of `strength`.
    pub fn observe_verdict(
        &mut self,
        request: &mut RequestAcceptance,
        strength: usize,
        drafted: usize,
        accepted: usize,
    ) {
        if drafted > 0 {
            self.table.record(request, strength, drafted, accepted);
        }
    }
}

//! The drafting policy's state in one engine: the policy, the worker-wide acceptance table and
//! the fitted step cost, fed by every verdict and every verify forward.

use super::acceptance::{AcceptanceTable, RequestAcceptance};
use super::cost::StepCost;
use super::policy::{plan_draft_lengths, DraftCandidate, SpecPolicy, StepBase};

#[derive(Debug, Clone)]
pub struct DraftPlanner {
    policy: SpecPolicy,
    table: AcceptanceTable,
    cost: StepCost,
}

impl DraftPlanner {
    /// A planner for drafts of up to `max_drafts` tokens on a device whose verify forwards
    /// cost `cost`.
    pub fn new(policy: SpecPolicy, max_drafts: usize, cost: StepCost) -> Self {
        Self {
            policy,
            table: AcceptanceTable::new(max_drafts),
            cost,
        }
    }

    pub fn policy(&self) -> SpecPolicy {
        self.policy
    }

    pub fn cost(&self) -> &StepCost {
        &self.cost
    }

    /// How many proposed tokens each candidate verifies this step.
    pub fn plan(&self, candidates: &[DraftCandidate<'_>], base: StepBase) -> Vec<usize> {
        plan_draft_lengths(self.policy, candidates, base, &self.table, &self.cost)
    }

    /// A verify forward of `tokens` tokens took `seconds`.
    pub fn observe_forward(&mut self, tokens: usize, seconds: f64) {
        self.cost.observe(tokens, seconds);
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

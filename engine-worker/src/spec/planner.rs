//! The drafting policy's state in one engine: the policy, the worker-wide acceptance table and
//! the fitted step cost, fed by every verdict and every verify forward.

use super::acceptance::{AcceptanceTable, RequestAcceptance};
use super::cost::StepCost;
use super::policy::{plan_draft_lengths, DraftCandidate, SpecPolicy};
use proto::worker_tp::{CostPoint, COST_POINT_TOKENS};

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

    /// The worker-wide acceptance table the policy plans with.
    pub fn table(&self) -> &AcceptanceTable {
        &self.table
    }

    /// The fitted cost curve at the verify sizes an operator reads it at (1 to 64 tokens,
    /// doubling): each point's seconds as the policy prices a forward now.
    pub fn cost_points(&self) -> Vec<CostPoint> {
        COST_POINT_TOKENS
            .iter()
            .map(|&tokens| CostPoint {
                tokens,
                seconds: self.cost.seconds(f64::from(tokens)),
            })
            .collect()
    }

    /// Tokens K = 0 would have emitted in `seconds` with `rows` sequences: one token per row
    /// per forward, a forward of `rows` tokens priced by the fitted curve.
    pub fn k0_tokens(&self, rows: usize, seconds: f64) -> f64 {
        if rows == 0 {
            return 0.0;
        }
        seconds / self.cost.seconds(rows as f64) * rows as f64
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

#[cfg(test)]
mod tests {
    use super::*;

    fn planner() -> DraftPlanner {
        // 6 ms for one token, 1.5 ms per token up to 8 (16.5 ms), 3 ms per token beyond.
        let cost = StepCost::from_calibration(&[(1, 0.006), (8, 0.0165), (16, 0.0405)], 1);
        DraftPlanner::new(SpecPolicy::Goodput, 4, cost)
    }

    #[test]
    fn the_cost_curve_is_reported_at_doubling_sizes() {
        let points = planner().cost_points();
        let tokens: Vec<u32> = points.iter().map(|p| p.tokens).collect();
        assert_eq!(tokens, COST_POINT_TOKENS);
        assert!(points.len() <= proto::worker_tp::MAX_COST_POINTS);
        assert!((points[0].seconds - 0.006).abs() < 1e-12);
        assert!((points[3].seconds - 0.0165).abs() < 1e-12);
        assert!(points.windows(2).all(|w| w[0].seconds <= w[1].seconds));
    }

    #[test]
    fn k0_tokens_divide_the_time_by_a_one_token_per_row_forward() {
        let p = planner();
        // A 16.5 ms forward with 8 rows is exactly one K = 0 step: 8 tokens.
        assert!((p.k0_tokens(8, 0.0165) - 8.0).abs() < 1e-9);
        // One row for 12 ms: two 6 ms steps.
        assert!((p.k0_tokens(1, 0.012) - 2.0).abs() < 1e-9);
        assert_eq!(p.k0_tokens(0, 0.01), 0.0);
    }
}

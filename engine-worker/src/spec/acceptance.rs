//! How likely each draft token is to be accepted, learned from the verifier's verdicts.
//!
//! Two levels, as in SuffixDecoding (Oliaro et al. 2024), which scores a draft by how often its
//! match continued that way before: a worker-wide table of conditional acceptance per draft
//! position and match strength (a 4-token n-gram match predicts better than a 1-token one), and
//! per request a lift, its accepted drafts against what the table expected of them, so a request
//! that repeats its prompt drafts more than one that does not.
//!
//! A draft that is never verified teaches nothing, so the chances the policy plans with are
//! optimistic by an uncertainty bonus that shrinks with the evidence (UCB, Auer et al. 2002):
//! a cell or a request with few verdicts still gets tried where drafting is cheap, and stops once
//! its verdicts say it does not pay.

/// Match strengths the table tells apart; stronger matches share the last row.
const STRENGTHS: usize = 8;
/// Prior of a cell: half accepted, worth two observations. Cells the traffic never reaches
/// stay near it, so a single stream still tries them (a 50% draft pays for one stream on a CPU).
const PRIOR_ACCEPTED: f64 = 1.0;
const PRIOR_REACHED: f64 = 2.0;
/// A cell's counts are halved past this many observations, so it follows the traffic.
const CELL_WINDOW: f64 = 512.0;
/// A request's lift starts at 1 and is worth this many expected drafts.
const LIFT_PRIOR: f64 = 2.0;
/// Uncertainty bonus of a cell's rate and of a request's lift: this over the square root of
/// their evidence (reached drafts, expected accepted drafts).
const CELL_EXPLORE: f64 = 0.3;
const LIFT_EXPLORE: f64 = 0.25;
/// No draft is ever taken for certain: the verifier can always disagree.
const MAX_PROBABILITY: f64 = 0.98;

#[derive(Debug, Clone, Copy)]
struct Cell {
    accepted: f64,
    reached: f64,
}

impl Cell {
    fn rate(&self) -> f64 {
        (self.accepted + PRIOR_ACCEPTED) / (self.reached + PRIOR_REACHED)
    }

    fn optimistic_rate(&self) -> f64 {
        self.rate() + CELL_EXPLORE / (self.reached + PRIOR_REACHED).sqrt()
    }

    fn record(&mut self, accepted: bool) {
        if self.reached >= CELL_WINDOW {
            self.accepted *= 0.5;
            self.reached *= 0.5;
        }
        self.reached += 1.0;
        self.accepted += f64::from(u8::from(accepted));
    }
}

/// The worker-wide table: conditional acceptance of draft position `i` given that positions
/// before it were accepted, per match strength.
#[derive(Debug, Clone)]
pub struct AcceptanceTable {
    positions: usize,
    cells: Vec<Cell>,
}

impl AcceptanceTable {
    /// A table for drafts of up to `max_drafts` tokens.
    pub fn new(max_drafts: usize) -> Self {
        Self {
            positions: max_drafts,
            cells: vec![
                Cell {
                    accepted: 0.0,
                    reached: 0.0
                };
                max_drafts * STRENGTHS
            ],
        }
    }

    fn cell(&self, strength: usize, position: usize) -> usize {
        let row = strength.clamp(1, STRENGTHS) - 1;
        row * self.positions + position
    }

    /// Conditional acceptance of `position` (0-based) for a match of `strength`.
    pub fn rate(&self, strength: usize, position: usize) -> f64 {
        self.cells[self.cell(strength, position)].rate()
    }

    /// Probability that drafts `0..=position` are all accepted, for `request`, as the policy
    /// plans with it: optimistic by the uncertainty of the cells and of the request's lift.
    pub fn chance(&self, request: &RequestAcceptance, strength: usize, position: usize) -> f64 {
        let lift = request.optimistic_lift();
        (0..=position)
            .map(|i| {
                let cell = &self.cells[self.cell(strength, i)];
                (cell.optimistic_rate() * lift).min(MAX_PROBABILITY)
            })
            .product()
    }

    /// Expected accepted tokens of a draft of `drafted` tokens for `request`: the sum over its
    /// positions of the chance that every draft up to it is accepted, by the point estimates
    /// (no exploration bonus). What the policy predicts, reported beside what the verifier
    /// accepted so an operator sees how well it is calibrated.
    pub fn expected_accepted(
        &self,
        request: &RequestAcceptance,
        strength: usize,
        drafted: usize,
    ) -> f64 {
        let lift = request.lift();
        let mut through = 1.0;
        let mut expected = 0.0;
        for i in 0..drafted.min(self.positions) {
            let cell = &self.cells[self.cell(strength, i)];
            through *= (cell.rate() * lift).min(MAX_PROBABILITY);
            expected += through;
        }
        expected
    }

    /// Learns from one verdict: `accepted` of `drafted` tokens of a match of `strength`.
    pub fn record(
        &mut self,
        request: &mut RequestAcceptance,
        strength: usize,
        drafted: usize,
        accepted: usize,
    ) {
        let drafted = drafted.min(self.positions);
        let accepted = accepted.min(drafted);
        // Reached positions: every accepted one, and the first rejected one.
        let reached = drafted.min(accepted + 1);
        for position in 0..reached {
            request.expected += self.rate(strength, position);
            let i = self.cell(strength, position);
            self.cells[i].record(position < accepted);
        }
        request.observed += accepted as f64;
    }
}

/// One request's drafts so far: accepted, against what the table expected of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestAcceptance {
    observed: f64,
    expected: f64,
}

impl RequestAcceptance {
    /// How much better (above 1) or worse than the worker's table this request's drafts fare.
    pub fn lift(&self) -> f64 {
        (self.observed + LIFT_PRIOR) / (self.expected + LIFT_PRIOR)
    }

    fn optimistic_lift(&self) -> f64 {
        self.lift() + LIFT_EXPLORE / (self.expected + 1.0).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn expected_accepted_sums_the_chances_of_reaching_each_position() {
        let mut table = AcceptanceTable::new(4);
        let mut req = RequestAcceptance::default();
        assert_eq!(table.expected_accepted(&req, 1, 0), 0.0);
        // Untrained: every cell at the prior 1/2, lift 1: 1/2 + 1/4 + 1/8.
        assert!((table.expected_accepted(&req, 1, 3) - 0.875).abs() < 1e-12);
        // A table that saw every draft of strength 2 accepted predicts near-full acceptance,
        // and never more than the draft's length.
        for _ in 0..200 {
            table.record(&mut req, 2, 4, 4);
        }
        let fresh = RequestAcceptance::default();
        let e = table.expected_accepted(&fresh, 2, 4);
        assert!(e > 3.0 && e <= 4.0, "{e}");
        assert!(table.expected_accepted(&fresh, 2, 9) <= 4.0);
    }

    #[test]
    fn an_untrained_table_gives_the_prior() {
        let table = AcceptanceTable::new(4);
        let fresh = RequestAcceptance::default();
        assert_eq!(table.rate(1, 0), 0.5);
        // Untried: optimistic, so the policy tries it where a draft is cheap.
        assert!(table.chance(&fresh, 3, 0) > 0.8);
        assert!(table.chance(&fresh, 3, 1) > table.chance(&fresh, 3, 2));
    }

    #[test]
    fn reached_and_accepted_follow_the_spec() {
        // (d=4, a=1): position 0 accepted, position 1 reached and rejected, 2 and 3 unreached.
        let mut table = AcceptanceTable::new(4);
        let mut req = RequestAcceptance::default();
        table.record(&mut req, 2, 4, 1);
        assert_eq!(table.rate(2, 0), 2.0 / 3.0);
        assert_eq!(table.rate(2, 1), 1.0 / 3.0);
        assert_eq!(table.rate(2, 2), 0.5);
        assert_eq!(table.rate(1, 0), 0.5, "other strengths untouched");
        // (d=2, a=2): both reached and accepted.
        table.record(&mut req, 2, 2, 2);
        assert_eq!(table.rate(2, 1), 2.0 / 4.0);
        assert_eq!(req.observed, 3.0);
    }

    #[test]
    fn the_table_learns_each_strengths_rates_from_seeded_verdicts() {
        // Strength s accepts each position with probability 0.2·s (conditionally).
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut table = AcceptanceTable::new(4);
        for _ in 0..20_000 {
            let strength = rng.gen_range(1..=4);
            let p = 0.2 * strength as f64;
            let accepted = (0..4).take_while(|_| rng.gen::<f64>() < p).count();
            table.record(&mut RequestAcceptance::default(), strength, 4, accepted);
        }
        for strength in 1..=4 {
            for position in 0..3 {
                let rate = table.rate(strength, position);
                let want = 0.2 * strength as f64;
                assert!(
                    (rate - want).abs() < 0.08,
                    "s={strength} i={position}: {rate}"
                );
            }
        }
    }

    #[test]
    fn a_request_that_beats_the_table_gets_a_lift_above_one() {
        let mut table = AcceptanceTable::new(4);
        let mut others = RequestAcceptance::default();
        for _ in 0..200 {
            table.record(&mut others, 1, 4, 0);
        }
        let mut repeater = RequestAcceptance::default();
        for _ in 0..10 {
            table.record(&mut repeater, 1, 4, 4);
        }
        assert!(others.lift() < 0.5, "{}", others.lift());
        assert!(repeater.lift() > 1.3, "{}", repeater.lift());
        let fresh = RequestAcceptance::default();
        assert!(table.chance(&repeater, 1, 0) > table.chance(&fresh, 1, 0));
        assert!(table.chance(&others, 1, 0) < table.chance(&fresh, 1, 0));
        assert!(table.chance(&repeater, 1, 3) <= MAX_PROBABILITY.powi(4));
    }

    #[test]
    fn oversized_verdicts_are_clamped() {
        let mut table = AcceptanceTable::new(2);
        let mut req = RequestAcceptance::default();
        table.record(&mut req, 99, 9, 9);
        assert!(table.rate(99, 1) > 0.5);
        assert_eq!(req.observed, 2.0);
    }
}

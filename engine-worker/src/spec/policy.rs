//! How many of its proposed drafts each sequence verifies this step.
//!
//! `Goodput` (the default) maximises expected tokens per second of the whole step (SmartSpec,
//! Liu et al. 2024, "Optimizing Speculative Decoding for Serving LLMs Using Goodput"): a step
//! yields `G = Σ (1 + E[accepted])` tokens and costs `c(tokens)` seconds, so one more draft
//! token with acceptance chance `m` pays iff `(G + m) / (c + Δc) > G / c`, i.e.
//! `m > G · Δc / c`, with `Δc` what one more token adds to this forward. For each number of draft
//! tokens the best set is the best remaining token first (a sequence's chances only fall along
//! its draft); the cost curve is not convex (a new kernel token group costs a step, see
//! `StepCost`), so rather than stop at the first token that does not pay, the policy takes the
//! number of tokens whose step has the highest goodput: eight drafts that fill a new group may
//! pay where the first one alone does not. A lone stream on a CPU drafts what is likely;
//! a full batch drafts only near-certain tokens, since each one costs a token's compute in a
//! forward that is already compute-bound. `Fixed` verifies every proposed token (up to K),
//! independent of load, for experiments.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::acceptance::{AcceptanceTable, RequestAcceptance};
use super::cost::StepCost;

/// Which drafting policy the engine runs (the worker's `--spec-policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecPolicy {
    /// By expected gain: each draft token must be worth its verify cost in this batch, given
    /// the request's acceptance so far, the match's strength and the measured step cost.
    #[default]
    Goodput,
    /// Every proposed token up to K, whatever the load (experiments).
    Fixed,
}

impl SpecPolicy {
    pub fn name(self) -> &'static str {
        match self {
            SpecPolicy::Goodput => "goodput",
            SpecPolicy::Fixed => "fixed",
        }
    }
}

/// One sequence's proposal as the policy sees it.
pub struct DraftCandidate<'a> {
    /// Tokens the proposer offered (already capped at what the sequence may carry).
    pub proposed: usize,
    /// The proposer's match strength (n-gram: matched suffix length).
    pub strength: usize,
    pub acceptance: &'a RequestAcceptance,
    /// Tokens a model drafter must run through before this sequence's first draft, its cache
    /// lagging behind (the prompt, or the steps it did not draft); they go into the forward of
    /// draft position 0. Always 0 for a lookup.
    pub catch_up: usize,
}

struct Next {
    chance: f64,
    index: usize,
}

impl PartialEq for Next {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Next {}
impl PartialOrd for Next {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Next {
    fn cmp(&self, other: &Self) -> Ordering {
        // Ties: the earlier sequence first, so the plan is deterministic.
        self.chance
            .total_cmp(&other.chance)
            .then(other.index.cmp(&self.index))
    }
}

/// Draft lengths for `candidates` (one per row of the step; prompt rows propose nothing): how
/// many of its proposed tokens each verifies. The step is planned as `verify_rows` rows of one
/// token each before any draft (each yields a token). With a model drafter, `draft` is what one
/// of its forwards costs by the sequences in it: the `i`-th draft token of a sequence puts it into
/// the forward of draft position `i`, so the step also pays one draft forward per position
/// anyone drafts at (a lookup drafts for free: `None`).
pub fn plan_draft_lengths(
    policy: SpecPolicy,
    candidates: &[DraftCandidate<'_>],
    verify_rows: usize,
    table: &AcceptanceTable,
    cost: &StepCost,
    draft: Option<&StepCost>,
) -> Vec<usize> {
    if policy == SpecPolicy::Fixed {
        return candidates.iter().map(|c| c.proposed).collect();
    }
    let mut lengths = vec![0; candidates.len()];
    let chance = |i: usize, position: usize| {
        let c = &candidates[i];
        table.chance(c.acceptance, c.strength, position)
    };
    let mut heap: BinaryHeap<Next> = (0..candidates.len())
        .filter(|&i| candidates[i].proposed > 0)
        .map(|index| Next {
            chance: chance(index, 0),
            index,
        })
        .collect();
    // Every draft token in order, best chance first, and the goodput of the step with each
    // prefix of them; the best prefix is taken (the fewest tokens on a tie).
    let mut gain = verify_rows.max(1) as f64;
    let mut tokens = verify_rows;
    let mut best_goodput = gain / cost.seconds(tokens as f64);
    let mut order = Vec::new();
    let mut best_len = 0;
    let mut offered = vec![0; candidates.len()];
    let mut drafting = DraftForwards::new(draft);
    while let Some(next) = heap.pop() {
        gain += next.chance;
        tokens += 1;
        let i = next.index;
        order.push(i);
        let catch_up = if offered[i] == 0 {
            candidates[i].catch_up
        } else {
            0
        };
        drafting.add(offered[i], catch_up);
        offered[i] += 1;
        let goodput = gain / (cost.seconds(tokens as f64) + drafting.seconds);
        if goodput > best_goodput {
            best_goodput = goodput;
            best_len = order.len();
        }
        if offered[i] < candidates[i].proposed {
            heap.push(Next {
                chance: chance(i, offered[i]),
                index: i,
            });
        }
    }
    for &i in &order[..best_len] {
        lengths[i] += 1;
    }
    lengths
}

/// The draft forwards a plan needs so far: sequences per draft position, and their seconds.
struct DraftForwards<'a> {
    cost: Option<&'a StepCost>,
    rows: Vec<usize>,
    seconds: f64,
}

impl<'a> DraftForwards<'a> {
    fn new(cost: Option<&'a StepCost>) -> Self {
        Self {
            cost,
            rows: Vec::new(),
            seconds: 0.0,
        }
    }

    /// One more sequence drafts at `position`, with `catch_up` tokens of its own before it (a
    /// lagging draft cache): priced as that many more rows of the forward.
    fn add(&mut self, position: usize, catch_up: usize) {
        let Some(cost) = self.cost else {
            return;
        };
        if self.rows.len() <= position {
            self.rows.resize(position + 1, 0);
        }
        let before = self.rows[position];
        let was = if before == 0 {
            0.0
        } else {
            cost.seconds(before as f64)
        };
        self.rows[position] += 1 + catch_up;
        self.seconds += cost.seconds(self.rows[position] as f64) - was;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The project's CPU (bench-engine): 1.5 ms per extra token up to 8 tokens, 3 ms above.
    fn cpu() -> StepCost {
        StepCost::from_calibration(&[(1, 0.006), (8, 0.0165), (16, 0.0405), (40, 0.1125)], 1)
    }

    fn trained(rate: f64) -> AcceptanceTable {
        let mut table = AcceptanceTable::new(4);
        let mut scratch = RequestAcceptance::default();
        let (acc, n) = ((rate * 100.0) as usize, 100);
        for strength in 1..=8 {
            for i in 0..n {
                // Position 0 accepted `acc` times in 100, later positions likewise (d=1 steps
                // teach position 0 only, so teach with full drafts).
                let accepted = if i < acc { 4 } else { 0 };
                table.record(&mut scratch, strength, 4, accepted);
            }
        }
        table
    }

    fn plan(table: &AcceptanceTable, n: usize, proposed: usize, strength: usize) -> Vec<usize> {
        let fresh = RequestAcceptance::default();
        let candidates: Vec<DraftCandidate<'_>> = (0..n)
            .map(|_| DraftCandidate {
                proposed,
                strength,
                acceptance: &fresh,
                catch_up: 0,
            })
            .collect();
        plan_draft_lengths(SpecPolicy::Goodput, &candidates, n, table, &cpu(), None)
    }

    /// A draft model that agrees 90% of the time, at two thirds of the target's cost per
    /// forward: a lone stream whose draft cache is current drafts; one whose cache lags by a
    /// 200-token prompt does not, since the catch-up would cost more than the step could gain
    /// (before it was priced, the q4_0 copy served one client at 0.78x of K=0).
    #[test]
    fn a_lagging_draft_cache_is_priced_into_the_first_draft() {
        let table = trained(0.9);
        let draft = StepCost::from_calibration(&[(1, 0.004), (8, 0.011), (16, 0.027)], 1);
        let fresh = RequestAcceptance::default();
        let lone = |catch_up| {
            let candidates = [DraftCandidate {
                proposed: 4,
                strength: 8,
                acceptance: &fresh,
                catch_up,
            }];
            plan_draft_lengths(
                SpecPolicy::Goodput,
                &candidates,
                1,
                &table,
                &cpu(),
                Some(&draft),
            )
        };
        assert!(lone(0)[0] > 0, "a current cache drafts");
        assert_eq!(
            lone(200),
            vec![0],
            "a 200-token catch-up does not pay in one step"
        );
    }

    #[test]
    fn fixed_verifies_every_proposed_token() {
        let table = trained(0.0);
        let fresh = RequestAcceptance::default();
        let candidates = [3, 0, 4].map(|proposed| DraftCandidate {
            proposed,
            strength: 1,
            acceptance: &fresh,
            catch_up: 0,
        });
        let lengths = plan_draft_lengths(SpecPolicy::Fixed, &candidates, 3, &table, &cpu(), None);
        assert_eq!(lengths, vec![3, 0, 4]);
    }

    #[test]
    fn a_lone_stream_drafts_likely_tokens_and_a_compute_bound_batch_none() {
        let likely = trained(0.7);
        assert!(plan(&likely, 1, 4, 2)[0] >= 1, "one stream, 70%");
        assert_eq!(plan(&likely, 8, 4, 2), vec![0; 8], "eight streams, 70%");
        let certain = trained(0.97);
        assert!(
            plan(&certain, 4, 4, 2).iter().all(|&d| d >= 1),
            "four streams, 97%"
        );
        // Eight tokens already fill this CPU's compute: even near-certain drafts cost more than
        // they return.
        assert_eq!(plan(&certain, 8, 4, 2), vec![0; 8], "eight streams, 97%");
        let unlikely = trained(0.1);
        assert_eq!(plan(&unlikely, 1, 4, 2), vec![0], "one stream, 10%");
    }

    #[test]
    fn never_more_than_proposed_and_more_drafts_only_for_better_odds() {
        for rate in [0.3, 0.6, 0.9, 0.99] {
            let table = trained(rate);
            for n in [1, 2, 4, 8, 16] {
                for proposed in 0..=4 {
                    let lengths = plan(&table, n, proposed, 3);
                    assert!(lengths.iter().all(|&d| d <= proposed));
                }
            }
        }
        let total = |rate: f64| plan(&trained(rate), 4, 4, 3).iter().sum::<usize>();
        assert!(total(0.5) <= total(0.8) && total(0.8) <= total(0.99));
    }

    #[test]
    fn drafts_that_fill_a_new_token_group_can_pay_where_its_first_token_alone_does_not() {
        // 8 tokens 17 ms; the ninth starts a new kernel group (27 ms); 16 tokens 30 ms.
        let cost = StepCost::from_calibration(
            &[(1, 0.010), (8, 0.017), (9, 0.027), (16, 0.030), (32, 0.060)],
            8,
        );
        let table = trained(0.99);
        let fresh = RequestAcceptance::default();
        let one_each = |n: usize, drafting: usize| -> Vec<usize> {
            let candidates: Vec<DraftCandidate<'_>> = (0..n)
                .map(|i| DraftCandidate {
                    proposed: usize::from(i < drafting),
                    strength: 2,
                    acceptance: &fresh,
                    catch_up: 0,
                })
                .collect();
            plan_draft_lengths(SpecPolicy::Goodput, &candidates, n, &table, &cost, None)
        };
        // One near-certain draft beside 8 rows: (8 + 0.98) / 27 ms < 8 / 17 ms.
        assert_eq!(one_each(8, 1), vec![0; 8]);
        // Eight of them fill the new group: (8 + 8 × 0.98) / 30 ms > 8 / 17 ms.
        assert_eq!(one_each(8, 8), vec![1; 8]);
        // Inside the first group a draft is cheap: 7 rows and one draft stay in it.
        assert_eq!(one_each(7, 1), vec![1, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn the_plan_pays_by_the_model_it_was_built_on() {
        // Expected tokens per second of the chosen plan beat drafting nothing and drafting all.
        let cost = cpu();
        for rate in [0.2, 0.5, 0.8, 0.95] {
            let table = trained(rate);
            for n in [1, 4, 8] {
                let fresh = RequestAcceptance::default();
                let goodput = |lengths: &[usize]| {
                    let gain: f64 = lengths
                        .iter()
                        .map(|&d| 1.0 + (0..d).map(|i| table.chance(&fresh, 2, i)).sum::<f64>())
                        .sum();
                    gain / cost.seconds((n + lengths.iter().sum::<usize>()) as f64)
                };
                let chosen = plan(&table, n, 4, 2);
                assert!(goodput(&chosen) >= goodput(&vec![0; n]) - 1e-12);
                assert!(goodput(&chosen) >= goodput(&vec![4; n]) - 1e-12);
            }
        }
    }
}

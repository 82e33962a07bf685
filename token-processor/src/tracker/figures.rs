//! The acceptance figures of `shared/spec/acceptance-metrics.md`, kept as a handful of counters
//! and three (K+1)-entry histograms: O(K) memory per request, never O(steps).
//!
//! Per-position counts are derived from the histograms instead of updated per position: position
//! `i` is accepted in a step iff `a > i`, so `accepted_i = #{steps: a > i}` is a suffix sum of the
//! accept-length histogram; it is reached iff `i < min(d, a + 1)`, so `reached_i` is a suffix sum
//! of the histogram of `min(d, a + 1)`. Recording a step is therefore O(1), whatever K is.

use proto::SpeculateMetrics;

/// Running `(d, a)` statistics of one request, or the sum over many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figures {
    steps: u64,
    drafts: u64,
    draft_tokens: u64,
    accepted_draft_tokens: u64,
    /// The drafting policy's figures (docs/metrics.md): tokens the proposer offered, and the
    /// accepted tokens the policy predicted for what it verified, in thousandths.
    offered_tokens: u64,
    predicted_milli: u64,
    /// Three (K+1)-entry histograms in one allocation (one cache miss per step, not three):
    /// [`ACCEPT`] entry `j`: steps with `a == j`; [`REACH`] entry `m`: steps with
    /// `min(d, a + 1) == m` (positions `0..m` were reached); [`DRAFT`] entry `j`: steps with
    /// `d == j`.
    hist: Box<[u64]>,
}

/// The histograms kept in [`Figures::hist`], in storage order.
const ACCEPT: usize = 0;
const REACH: usize = 1;
const DRAFT: usize = 2;
const HISTOGRAMS: usize = 3;

impl Figures {
    /// Zero figures for K = `num_spec_tokens`.
    pub fn new(num_spec_tokens: usize) -> Self {
        Self {
            steps: 0,
            drafts: 0,
            draft_tokens: 0,
            accepted_draft_tokens: 0,
            offered_tokens: 0,
            predicted_milli: 0,
            hist: vec![0; HISTOGRAMS * (num_spec_tokens + 1)].into_boxed_slice(),
        }
    }

    /// K.
    pub fn num_spec_tokens(&self) -> usize {
        self.width() - 1
    }

    /// K + 1: the length of each histogram.
    fn width(&self) -> usize {
        self.hist.len() / HISTOGRAMS
    }

    fn histogram(&self, which: usize) -> &[u64] {
        let width = self.width();
        &self.hist[which * width..(which + 1) * width]
    }

    fn accept_hist(&self) -> &[u64] {
        self.histogram(ACCEPT)
    }

    fn reach_hist(&self) -> &[u64] {
        self.histogram(REACH)
    }

    /// Loads the histograms into cache ahead of [`record`](Self::record): the tracker touches
    /// every row's figures in one pass first, so their cache misses overlap instead of stalling
    /// one row at a time (what dominates a batch that arrives after an idle gap).
    #[inline]
    pub fn touch(&self) {
        prefetch(self.hist.as_ptr());
    }

    /// Records one verification step. The caller guarantees `a <= d <= K` (a validated batch).
    #[inline]
    pub fn record(&mut self, drafted: u8, accepted: u8) {
        debug_assert!(accepted <= drafted && usize::from(drafted) <= self.num_spec_tokens());
        self.steps += 1;
        self.drafts += u64::from(drafted > 0);
        self.draft_tokens += u64::from(drafted);
        self.accepted_draft_tokens += u64::from(accepted);
        let width = self.width();
        self.hist[ACCEPT * width + usize::from(accepted)] += 1;
        self.hist[REACH * width + usize::from(drafted.min(accepted + 1))] += 1;
        self.hist[DRAFT * width + usize::from(drafted)] += 1;
    }

    /// Records the policy's figures of one verification step (see [`StepBatch::offered`]).
    ///
    /// [`StepBatch::offered`]: proto::worker_tp::StepBatch::offered
    #[inline]
    pub fn record_policy(&mut self, offered: u8, predicted_milli: u16) {
        self.offered_tokens += u64::from(offered);
        self.predicted_milli += u64::from(predicted_milli);
    }

    /// Draft tokens the proposer offered.
    pub fn offered_tokens(&self) -> u64 {
        self.offered_tokens
    }

    /// Accepted draft tokens the policy predicted, in thousandths of a token.
    pub fn predicted_milli(&self) -> u64 {
        self.predicted_milli
    }

    /// Verification steps (`n`).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Steps with `d > 0`.
    pub fn drafts(&self) -> u64 {
        self.drafts
    }

    /// `sum(d)`.
    pub fn draft_tokens(&self) -> u64 {
        self.draft_tokens
    }

    /// `sum(a)`, bonus tokens excluded.
    pub fn accepted_draft_tokens(&self) -> u64 {
        self.accepted_draft_tokens
    }

    /// `sum(a + 1)`: tokens produced by verification steps.
    pub fn emitted_tokens(&self) -> u64 {
        self.accepted_draft_tokens + self.steps
    }

    /// Entry `j`: steps that accepted exactly `j` drafts.
    pub fn accept_length_histogram(&self) -> &[u64] {
        self.accept_hist()
    }

    /// Entry `j`: steps that drafted exactly `j` tokens (what the drafting policy chose).
    pub fn draft_length_histogram(&self) -> &[u64] {
        self.histogram(DRAFT)
    }

    /// `accepted_i` for `i in 0..K`.
    pub fn accepted_per_position(&self) -> Vec<u64> {
        suffix_counts(self.accept_hist())
    }

    /// `reached_i` for `i in 0..K`.
    pub fn reached_per_position(&self) -> Vec<u64> {
        suffix_counts(self.reach_hist())
    }

    /// Adds `other` to `self`; a larger K in `other` grows `self` (a worker restarted with
    /// another K keeps one running total).
    pub fn add(&mut self, other: &Figures) {
        self.grow_to(other.num_spec_tokens());
        self.steps += other.steps;
        self.drafts += other.drafts;
        self.draft_tokens += other.draft_tokens;
        self.accepted_draft_tokens += other.accepted_draft_tokens;
        self.offered_tokens += other.offered_tokens;
        self.predicted_milli += other.predicted_milli;
        let width = self.width();
        for which in 0..HISTOGRAMS {
            let mine = &mut self.hist[which * width..(which + 1) * width];
            for (m, n) in mine.iter_mut().zip(other.histogram(which)) {
                *m += n;
            }
        }
    }

    /// Adds `newer - older`, field by field, never below zero: what a resync taught us beyond
    /// what was already counted.
    pub fn add_growth(&mut self, newer: &Figures, older: &Figures) {
        self.grow_to(newer.num_spec_tokens());
        self.steps += newer.steps.saturating_sub(older.steps);
        self.drafts += newer.drafts.saturating_sub(older.drafts);
        self.draft_tokens += newer.draft_tokens.saturating_sub(older.draft_tokens);
        self.accepted_draft_tokens += newer
            .accepted_draft_tokens
            .saturating_sub(older.accepted_draft_tokens);
        self.offered_tokens += newer.offered_tokens.saturating_sub(older.offered_tokens);
        self.predicted_milli += newer.predicted_milli.saturating_sub(older.predicted_milli);
        let width = self.width();
        for which in 0..HISTOGRAMS {
            let older = older.histogram(which);
            let mine = &mut self.hist[which * width..(which + 1) * width];
            for (j, n) in newer.histogram(which).iter().enumerate() {
                mine[j] += n.saturating_sub(older.get(j).copied().unwrap_or(0));
            }
        }
    }

    /// Back to zero, keeping K (reuses the allocation).
    pub fn clear(&mut self) {
        self.steps = 0;
        self.drafts = 0;
        self.draft_tokens = 0;
        self.accepted_draft_tokens = 0;
        self.offered_tokens = 0;
        self.predicted_milli = 0;
        self.hist.fill(0);
    }

    pub fn is_zero(&self) -> bool {
        self.steps == 0
    }

    fn grow_to(&mut self, num_spec_tokens: usize) {
        if num_spec_tokens > self.num_spec_tokens() {
            let width = num_spec_tokens + 1;
            let mut hist = vec![0; HISTOGRAMS * width];
            for which in 0..HISTOGRAMS {
                let old = self.histogram(which);
                hist[which * width..which * width + old.len()].copy_from_slice(old);
            }
            self.hist = hist.into_boxed_slice();
        }
    }

    /// The request's `speculate_metrics`, every float one division as the spec writes it.
    pub fn speculate_metrics(&self) -> SpeculateMetrics {
        let accepted = self.accepted_per_position();
        let reached = self.reached_per_position();
        let accepted_tokens = self.emitted_tokens();
        let mut accepted_tokens_per_head = Vec::with_capacity(accepted.len() + 1);
        accepted_tokens_per_head.push(self.steps);
        accepted_tokens_per_head.extend_from_slice(&accepted);
        SpeculateMetrics {
            accepted_tokens,
            rejected_tokens: self.draft_tokens - self.accepted_draft_tokens,
            accept_ratio: ratio(self.accepted_draft_tokens, accepted_tokens),
            average_accept_length: ratio(accepted_tokens, self.steps),
            accept_ratio_per_head: accepted
                .iter()
                .zip(&reached)
                .map(|(&a, &r)| ratio(a, r))
                .collect(),
            accepted_tokens_per_head,
            num_steps: self.steps,
            num_drafts: self.drafts,
            num_draft_tokens: self.draft_tokens,
            num_accepted_draft_tokens: self.accepted_draft_tokens,
            draft_acceptance_rate: ratio(self.accepted_draft_tokens, self.draft_tokens),
            accept_length_histogram: self.accept_hist().to_vec(),
            draft_length_histogram: self.draft_length_histogram().to_vec(),
            // Present together, once the proposer offered anything (docs/metrics.md).
            num_offered_tokens: (self.offered_tokens > 0).then_some(self.offered_tokens),
            predicted_accepted_tokens: (self.offered_tokens > 0)
                .then(|| self.predicted_milli as f64 / 1e3),
        }
    }
}

/// A hint to load `ptr`'s cache line; never faults, no effect on results.
#[inline(always)]
pub fn prefetch<T>(ptr: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint (SSE, baseline on x86_64): it never faults and writes nothing.
    #[allow(unused_unsafe)]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(ptr.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// `num / den`, or 0 when `den` is 0 (the spec never emits NaN or infinity).
fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

/// Entry `i` (for `i in 0..len-1`): the sum of `hist[i+1..]`.
fn suffix_counts(hist: &[u64]) -> Vec<u64> {
    let mut out = vec![0; hist.len() - 1];
    let mut running = 0;
    for i in (0..out.len()).rev() {
        running += hist[i + 1];
        out[i] = running;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-position counts straight from the spec's definitions, to check the suffix sums.
    fn naive(k: usize, steps: &[(u8, u8)]) -> (Vec<u64>, Vec<u64>) {
        let (mut acc, mut reach) = (vec![0; k], vec![0; k]);
        for &(d, a) in steps {
            for i in 0..k {
                if i < d as usize && i <= a as usize {
                    reach[i] += 1;
                }
                if i < a as usize {
                    acc[i] += 1;
                }
            }
        }
        (acc, reach)
    }

    #[test]
    fn per_position_counts_match_the_definitions() {
        let steps = [
            (4, 4),
            (4, 0),
            (0, 0),
            (2, 2),
            (3, 1),
            (1, 0),
            (0, 0),
            (4, 2),
        ];
        let mut f = Figures::new(4);
        for &(d, a) in &steps {
            f.record(d, a);
        }
        let (acc, reach) = naive(4, &steps);
        assert_eq!(f.accepted_per_position(), acc);
        assert_eq!(f.reached_per_position(), reach);
    }

    #[test]
    fn empty_figures_have_full_length_arrays_and_no_nan() {
        let m = Figures::new(3).speculate_metrics();
        assert_eq!(m.accept_ratio_per_head, vec![0.0; 3]);
        assert_eq!(m.accepted_tokens_per_head, vec![0; 4]);
        assert_eq!(m.accept_length_histogram, vec![0; 4]);
        assert_eq!(m.draft_length_histogram, vec![0; 4]);
        assert_eq!(
            (
                m.accept_ratio,
                m.average_accept_length,
                m.draft_acceptance_rate
            ),
            (0.0, 0.0, 0.0)
        );
    }

    #[test]
    fn growth_adds_only_the_difference() {
        let (mut old, mut new) = (Figures::new(2), Figures::new(2));
        old.record(2, 1);
        new.record(2, 1);
        new.record(1, 1);
        let mut total = old.clone();
        total.add_growth(&new, &old);
        assert_eq!(total, new);
    }

    #[test]
    fn add_grows_to_the_larger_k() {
        let mut small = Figures::new(1);
        small.record(1, 1);
        let mut big = Figures::new(3);
        big.record(3, 2);
        small.add(&big);
        assert_eq!(small.num_spec_tokens(), 3);
        assert_eq!(small.accepted_per_position(), vec![2, 1, 0]);
        let (acc, reach) = naive(3, &[(1, 1), (3, 2)]);
        assert_eq!(
            (small.accepted_per_position(), small.reached_per_position()),
            (acc, reach)
        );
        assert_eq!(small.accept_length_histogram(), &[0, 1, 1, 0]);
        assert_eq!(small.draft_length_histogram(), &[0, 1, 0, 1]);
    }

    #[test]
    fn draft_lengths_are_counted_per_step_and_sum_to_the_steps() {
        let mut f = Figures::new(4);
        for (d, a) in [(4, 1), (0, 0), (2, 2), (4, 4), (0, 0)] {
            f.record(d, a);
        }
        assert_eq!(f.draft_length_histogram(), &[2, 0, 1, 0, 2]);
        assert_eq!(f.draft_length_histogram().iter().sum::<u64>(), f.steps());
        let mut grown = Figures::new(2);
        grown.record(1, 0);
        grown.add(&f);
        assert_eq!(grown.draft_length_histogram(), &[2, 1, 1, 0, 2]);
    }
}

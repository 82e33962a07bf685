//! Re-scoring a trace at another K or policy, and the tokens per second it predicts.

use serde::Serialize;

use super::trace::{RequestSteps, WhatIfTrace};

/// The drafting policies a what-if compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WhatIf {
    /// Every offered token up to K' is verified.
    Fixed,
    /// The draft length with the best expected tokens per second at the run's batch (modelled).
    Goodput,
}

/// What the recorded run did, as the trace says.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Recorded {
    pub num_spec_tokens: u32,
    pub requests: usize,
    /// Every output token (prefills' included).
    pub tokens: u64,
    /// From the first step's end to the last's.
    pub seconds: f64,
    pub tokens_per_s: f64,
    /// Time of the steps whose every row verified.
    pub verify_seconds: f64,
    /// Verify rows per such step, on average.
    pub mean_batch_rows: f64,
    /// Verification steps of requests (one per request per step).
    pub steps: u64,
    pub drafted_per_step: f64,
    pub accepted_per_step: f64,
    /// Entry `j`: steps that accepted `j` drafts.
    pub accepted_length_histogram: Vec<u64>,
    /// Of the offers that reached position `i` (every earlier offered token matched the
    /// output), the share whose token `i` matched too: what each draft position is worth.
    pub offer_acceptance_by_position: Vec<f64>,
    /// `accepted_i / steps` of the recorded verdicts (the dashboard's unconditional panel).
    pub accepted_per_position: Vec<f64>,
}

/// One setting's re-scored run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Prediction {
    pub policy: WhatIf,
    /// K'.
    pub num_spec_tokens: u32,
    pub steps: u64,
    pub drafted_per_step: f64,
    pub accepted_per_step: f64,
    /// Tokens per verification step: accepted plus the bonus (less at a request's end).
    pub tokens_per_step: f64,
    pub accepted_length_histogram: Vec<u64>,
    pub predicted_seconds: f64,
    pub predicted_tokens_per_s: f64,
}

/// The worker's verify cost curve: piecewise linear through its points, the last segment
/// extended.
#[derive(Debug, Clone)]
struct CostCurve(Vec<(f64, f64)>);

impl CostCurve {
    fn new(points: &[(u32, f64)]) -> Self {
        let mut knots: Vec<(f64, f64)> = points
            .iter()
            .filter(|(t, s)| *t > 0 && s.is_finite() && *s > 0.0)
            .map(|&(t, s)| (f64::from(t), s))
            .collect();
        knots.sort_by(|a, b| a.0.total_cmp(&b.0));
        knots.dedup_by(|a, b| a.0 == b.0);
        if knots.len() < 2 {
            knots = vec![(1.0, 1.0), (2.0, 2.0)];
        }
        Self(knots)
    }

    fn seconds(&self, tokens: f64) -> f64 {
        let k = &self.0;
        let i = k
            .windows(2)
            .position(|w| tokens <= w[1].0)
            .unwrap_or(k.len() - 2);
        let (a, b) = (k[i], k[i + 1]);
        (a.1 + (tokens - a.0) * (b.1 - a.1) / (b.0 - a.0)).max(1e-3 * k[0].1)
    }

    /// Seconds per verify row when `rows` rows each verify `drafted` drafts on average.
    fn per_row(&self, rows: f64, drafted: f64) -> f64 {
        self.seconds(rows * (1.0 + drafted)) / rows
    }
}

/// A verify step's time as the run measured it: `per_row * rows + scale * curve(tokens)`. The
/// calibrated curve prices tokens (measured at start on short contexts); the per-row term is
/// what the run's contexts add to every row whatever it drafts (attention over its context),
/// which the curve cannot see. Both are fitted to the run's own timed steps by least squares.
#[derive(Debug, Clone)]
struct StepModel {
    curve: CostCurve,
    per_row: f64,
    scale: f64,
}

impl StepModel {
    fn fit(curve: CostCurve, steps: &[(f64, f64, f64)]) -> Self {
        // Normal equations of t = a * rows + s * c(tokens) over `(rows, tokens, seconds)`.
        let (mut rr, mut rc, mut cc, mut rt, mut ct) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(rows, tokens, t) in steps {
            let c = curve.seconds(tokens);
            rr += rows * rows;
            rc += rows * c;
            cc += c * c;
            rt += rows * t;
            ct += c * t;
        }
        let det = rr * cc - rc * rc;
        let (per_row, scale) = if det > 1e-12 * rr * cc && det > 0.0 {
            ((rt * cc - ct * rc) / det, (ct * rr - rt * rc) / det)
        } else {
            (0.0, f64::NAN)
        };
        // A negative or degenerate fit falls back to the curve alone, scaled to the run.
        let (per_row, scale) = match per_row >= 0.0 && scale > 0.0 {
            true => (per_row, scale),
            false => (0.0, if cc > 0.0 { (ct / cc).max(1e-9) } else { 1.0 }),
        };
        Self {
            curve,
            per_row,
            scale,
        }
    }

    /// Seconds per verify row when `rows` rows each verify `drafted` drafts on average.
    fn per_row_seconds(&self, rows: f64, drafted: f64) -> f64 {
        self.per_row + self.scale * self.curve.per_row(rows, drafted)
    }
}

/// How far `draft` matches `output` from its start.
fn matched(draft: &[u32], output: &[u32]) -> usize {
    draft.iter().zip(output).take_while(|(d, o)| d == o).count()
}

/// One request re-scored: steps, drafted, accepted, tokens, and the accepted-length histogram
/// (entry `j`), with drafts of `length(available)` tokens at each step.
#[derive(Debug, Default)]
struct Rescored {
    steps: u64,
    drafted: u64,
    accepted: u64,
    tokens: u64,
    histogram: Vec<u64>,
}

fn rescore(r: &RequestSteps, k: usize, length: &dyn Fn(usize) -> usize, out: &mut Rescored) {
    let Some(first) = r.steps.first() else {
        return;
    };
    out.histogram.resize(out.histogram.len().max(k + 1), 0);
    let mut pos = first.position;
    let mut recorded = 0;
    while pos < r.output.len() {
        // The last recorded step at or before `pos`; its offer shifted past what was emitted.
        while recorded + 1 < r.steps.len() && r.steps[recorded + 1].position <= pos {
            recorded += 1;
        }
        let step = &r.steps[recorded];
        let available = step.offer.get(pos - step.position..).unwrap_or(&[]);
        let draft = &available[..length(available.len()).min(available.len()).min(k)];
        let remaining = r.output.len() - pos;
        let accepted = matched(draft, &r.output[pos..]).min(remaining - 1);
        let tokens = (accepted + 1).min(remaining);
        out.steps += 1;
        out.drafted += draft.len() as u64;
        out.accepted += accepted as u64;
        out.tokens += tokens as u64;
        out.histogram[accepted] += 1;
        pos += tokens;
    }
}

/// The recorded run's figures.
fn recorded(trace: &WhatIfTrace) -> Recorded {
    let k = trace.num_spec_tokens as usize;
    let tokens: u64 = trace.requests.iter().map(|r| r.output.len() as u64).sum();
    let first = trace.steps.values().map(|s| s.t_us).min().unwrap_or(0);
    let last = trace.steps.values().map(|s| s.t_us).max().unwrap_or(0);
    let seconds = (last - first) as f64 / 1e6;
    let timed: Vec<_> = trace
        .steps
        .values()
        .filter(|s| s.verify_us.is_some())
        .collect();
    let verify_seconds = timed
        .iter()
        .map(|s| f64::from(s.verify_us.unwrap_or(0)))
        .sum::<f64>()
        / 1e6;
    let mean_batch_rows = match timed.len() {
        0 => 1.0,
        n => timed.iter().map(|s| f64::from(s.verify_rows)).sum::<f64>() / n as f64,
    };
    let mut histogram = vec![0u64; k + 1];
    let (mut steps, mut drafted, mut accepted) = (0u64, 0u64, 0u64);
    let mut reached = vec![0u64; k];
    let mut matched_at = vec![0u64; k];
    for step in trace.requests.iter().flat_map(|r| {
        r.steps
            .iter()
            .map(move |s| (s, &r.output[s.position.min(r.output.len())..]))
    }) {
        let (s, output) = step;
        steps += 1;
        drafted += u64::from(s.drafted);
        accepted += u64::from(s.accepted);
        histogram[usize::from(s.accepted).min(k)] += 1;
        let m = matched(&s.offer, output);
        for i in 0..s.offer.len().min(k).min(m + 1) {
            reached[i] += 1;
            matched_at[i] += u64::from(i < m);
        }
    }
    let per_step = |n: u64| {
        if steps == 0 {
            0.0
        } else {
            n as f64 / steps as f64
        }
    };
    let accepted_per_position = (0..k)
        .map(|i| per_step(histogram[i + 1..].iter().sum()))
        .collect();
    Recorded {
        num_spec_tokens: trace.num_spec_tokens,
        requests: trace.requests.len(),
        tokens,
        seconds,
        tokens_per_s: if seconds > 0.0 {
            tokens as f64 / seconds
        } else {
            0.0
        },
        verify_seconds,
        mean_batch_rows,
        steps,
        drafted_per_step: per_step(drafted),
        accepted_per_step: per_step(accepted),
        accepted_length_histogram: histogram,
        offer_acceptance_by_position: reached
            .iter()
            .zip(&matched_at)
            .map(|(&r, &m)| if r == 0 { 0.0 } else { m as f64 / r as f64 })
            .collect(),
        accepted_per_position,
    }
}

/// The draft length the goodput policy is modelled to choose at most `k` with: the one whose
/// step, at the run's mean batch, yields the most expected tokens per second.
fn goodput_length(rates: &[f64], k: usize, cost: &StepModel, rows: f64) -> usize {
    let mut best = (0, 1.0 / cost.per_row_seconds(rows, 0.0));
    let (mut through, mut expected) = (1.0, 0.0);
    for (d, rate) in rates.iter().take(k).enumerate() {
        through *= rate;
        expected += through;
        let goodput = (1.0 + expected) / cost.per_row_seconds(rows, (d + 1) as f64);
        if goodput > best.1 {
            best = (d + 1, goodput);
        }
    }
    best.0
}

/// The recorded run, and every setting K' in `0..=K` under both policies, predicted.
pub fn predict(trace: &WhatIfTrace) -> (Recorded, Vec<Prediction>) {
    let rec = recorded(trace);
    let timed: Vec<(f64, f64, f64)> = (trace.steps.values())
        .filter_map(|s| {
            let us = s.verify_us?;
            let rows = f64::from(s.verify_rows);
            (rows > 0.0).then(|| (rows, rows + f64::from(s.drafted), f64::from(us) / 1e6))
        })
        .collect();
    let cost = StepModel::fit(CostCurve::new(&trace.verify_cost), &timed);
    let rows = rec.mean_batch_rows.max(1.0);
    let k = trace.num_spec_tokens as usize;
    // Verify rows also run in steps beside a prompt, whose time is not measured apart: each is
    // priced at the timed steps' mean seconds per verify row, and only the rest of the run's
    // time (the prompts' share) is held fixed.
    let timed_rows: f64 = timed.iter().map(|s| s.0).sum();
    let per_verify_row = match timed_rows > 0.0 {
        true => rec.verify_seconds / timed_rows,
        false => 0.0,
    };
    let recorded_verify = per_verify_row * rec.steps as f64;
    let recorded_cost = rec.steps as f64 * cost.per_row_seconds(rows, rec.drafted_per_step);
    let other_seconds = (rec.seconds - recorded_verify).max(0.0);
    let mut predictions = Vec::new();
    for policy in [WhatIf::Fixed, WhatIf::Goodput] {
        for k2 in 0..=k {
            let length = match policy {
                WhatIf::Fixed => k2,
                WhatIf::Goodput => {
                    goodput_length(&rec.offer_acceptance_by_position, k2, &cost, rows)
                }
            };
            let mut r = Rescored::default();
            for request in &trace.requests {
                rescore(request, k2, &|available| available.min(length), &mut r);
            }
            let per_step = |n: u64| {
                if r.steps == 0 {
                    0.0
                } else {
                    n as f64 / r.steps as f64
                }
            };
            let drafted_per_step = per_step(r.drafted);
            let modelled = r.steps as f64 * cost.per_row_seconds(rows, drafted_per_step);
            let verify = match recorded_cost > 0.0 {
                true => recorded_verify * modelled / recorded_cost,
                false => 0.0,
            };
            let seconds = other_seconds + verify;
            r.histogram.resize(k + 1, 0);
            predictions.push(Prediction {
                policy,
                num_spec_tokens: k2 as u32,
                steps: r.steps,
                drafted_per_step,
                accepted_per_step: per_step(r.accepted),
                tokens_per_step: per_step(r.tokens),
                accepted_length_histogram: r.histogram,
                predicted_seconds: seconds,
                predicted_tokens_per_s: if seconds > 0.0 {
                    rec.tokens as f64 / seconds
                } else {
                    0.0
                },
            });
        }
    }
    (rec, predictions)
}

#[cfg(test)]
mod tests {
    use super::super::trace::VerifyStep;
    use super::*;

    /// A request whose output is 0..20 and whose proposer always offers the next 4 tokens, but
    /// wrongly from the third on: a fixed-K run at K = 4 accepts 2 per step.
    fn request() -> RequestSteps {
        let output: Vec<u32> = (0..20).collect();
        let mut steps = Vec::new();
        let mut pos = 1;
        while pos < output.len() {
            let offer = vec![pos as u32, pos as u32 + 1, 999, 998];
            let accepted = matched(&offer, &output[pos..]).min(output.len() - pos - 1);
            steps.push(VerifyStep {
                position: pos,
                offer,
                drafted: 4,
                accepted: accepted as u8,
            });
            pos += accepted + 1;
        }
        RequestSteps {
            output,
            steps,
            prefill_tokens: 1,
        }
    }

    fn trace() -> WhatIfTrace {
        let mut t = WhatIfTrace {
            num_spec_tokens: 4,
            verify_cost: vec![(1, 0.010), (8, 0.017), (16, 0.030)],
            requests: vec![request(), request()],
            ..WhatIfTrace::default()
        };
        for (i, s) in (0..14u64).enumerate() {
            t.steps.insert(
                s,
                super::super::trace::StepFacts {
                    verify_rows: 2,
                    drafted: 8,
                    rows: 2,
                    verify_us: Some(15_000),
                    t_us: (i as u64 + 1) * 20_000,
                },
            );
        }
        t
    }

    #[test]
    fn rescoring_at_the_recorded_k_reproduces_the_recorded_verdicts() {
        let t = trace();
        let (rec, predictions) = predict(&t);
        let same = predictions
            .iter()
            .find(|p| p.policy == WhatIf::Fixed && p.num_spec_tokens == 4)
            .unwrap();
        assert_eq!(same.steps, rec.steps);
        assert_eq!(same.accepted_per_step, rec.accepted_per_step);
        assert_eq!(
            same.accepted_length_histogram,
            rec.accepted_length_histogram
        );
        // Its predicted time is the recorded time.
        assert!((same.predicted_seconds - rec.seconds).abs() < 1e-9);
        // Position 1 is rejected only at a request's last token (no output left to match).
        let rates = &rec.offer_acceptance_by_position;
        assert_eq!((rates[0], rates[2]), (1.0, 0.0));
        assert!((rates[1] - 12.0 / 14.0).abs() < 1e-12);
    }

    #[test]
    fn a_shorter_k_is_rescored_from_the_shifted_offers() {
        let (_, predictions) = predict(&trace());
        let at = |policy, k| {
            predictions
                .iter()
                .find(|p| p.policy == policy && p.num_spec_tokens == k)
                .unwrap()
                .clone()
        };
        // K' = 0 emits one token a step.
        assert_eq!(at(WhatIf::Fixed, 0).tokens_per_step, 1.0);
        assert_eq!(at(WhatIf::Fixed, 0).steps, 2 * 19);
        // K' = 1 drafts the offer shifted past what it emitted: from position 1 it accepts `1`,
        // then at 3 the shifted offer's next token is the recorded step's first rejected one
        // (999), so it alternates; per request 1,3,4,6,7,...: 13 steps, 6 accepted.
        let one = at(WhatIf::Fixed, 1);
        assert_eq!((one.steps, one.accepted_per_step), (26, 12.0 / 26.0));
        // K' = 2 accepts as much as K = 4 in as many steps, and verifies no token that is
        // always rejected, so it is predicted faster.
        assert_eq!(at(WhatIf::Fixed, 2).steps, at(WhatIf::Fixed, 4).steps);
        assert!(
            at(WhatIf::Fixed, 2).predicted_tokens_per_s
                > at(WhatIf::Fixed, 4).predicted_tokens_per_s
        );
        // The modelled goodput policy drafts the two good positions, not the bad ones.
        assert_eq!(
            at(WhatIf::Goodput, 4).drafted_per_step,
            at(WhatIf::Fixed, 2).drafted_per_step
        );
    }

    #[test]
    fn the_step_model_recovers_a_per_row_cost_the_curve_cannot_see() {
        let curve = CostCurve::new(&[(1, 0.01), (8, 0.017), (16, 0.03)]);
        // Steps that cost 2 ms per row beyond 1.5 x the curve.
        let steps: Vec<(f64, f64, f64)> =
            [(1.0, 3.0), (2.0, 4.0), (4.0, 12.0), (8.0, 9.0), (3.0, 15.0)]
                .iter()
                .map(|&(r, t)| (r, t, 0.002 * r + 1.5 * curve.seconds(t)))
                .collect();
        let m = StepModel::fit(curve, &steps);
        assert!(
            (m.per_row - 0.002).abs() < 1e-9 && (m.scale - 1.5).abs() < 1e-9,
            "{m:?}"
        );
    }

    #[test]
    fn the_cost_curve_interpolates_and_extends() {
        let c = CostCurve::new(&[(1, 0.01), (8, 0.017), (16, 0.03)]);
        assert!((c.seconds(4.5) - 0.0135).abs() < 1e-12);
        assert!((c.seconds(24.0) - 0.043).abs() < 1e-12);
        assert!((c.per_row(2.0, 1.0) - c.seconds(4.0) / 2.0).abs() < 1e-12);
    }
}

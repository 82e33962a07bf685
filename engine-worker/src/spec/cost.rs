//! What a verify forward costs on this device as a function of the tokens it carries: a curve
//! measured at start (SmartSpec, Liu et al. 2024, models the batch's verify latency from the
//! same kind of profile), then learned online from every measured verify forward.
//!
//! A line is not enough: on a CPU a forward streams every weight once, so up to a few tokens an
//! extra token costs little (memory-bound), and past that each one costs its full compute
//! (compute-bound). Measured on the project's 2-core machine (bench-engine): 1.5 ms per extra
//! token up to 8 tokens, 3 ms above. A linear fit through both regimes let a batch of 8 draft
//! tokens that did not pay.
//!
//! The curve is piecewise linear through the calibration points' lower convex hull: the true
//! curve is convex (extra tokens cost more once compute-bound, never less), and a point measured
//! while another process held the cores lies above it. Seen here at start, when the api-server
//! loads beside the worker: an 8-token point measured at 32 ms instead of 17 made an extra token
//! at 8 look like 0.3 ms, and 8 streams drafted at a loss. Measured forwards scale the curve
//! (load from other processes, longer contexts than the calibration's), which leaves every
//! decision of the policy as it is (they compare costs of the same step) but shows in the log
//! how far real steps are from the calibration. Learning the shape online was tried: the knots
//! around the traffic (8 tokens at 8 streams) rose with real contexts while the knots beyond it
//! kept the calibration, so the slope past the traffic fell and 8 streams drafted at a loss
//! (ShareGPT, 8 clients: 0.89x of K=0).

//!
//! On top of the hull, a step per token group: the CPU kernels decode each weight block once per
//! group of tokens (`Backend::token_group`: 8 with AVX2, 12 with AVX-512), so a forward of one
//! token past a group pays a whole further pass over the weights for it. Measured with the forward bench (verify-shaped steps after
//! 256 positions, 2026-12-03): 8 tokens 22.5 ms, 9 tokens 26.7, 16 tokens 42.9, 17 tokens 49.9,
//! 24 tokens 60.5, 25 tokens 63.6: 1.5–2.3 ms a token inside a group, 3–7 ms for the first of a
//! new group. The hull runs through the doublings (whole groups past the first); the
//! calibration's sizes one past a boundary ([`step_probe_sizes`]: 9, 17) give the step. Without
//! it, a batch of 8 streams drafted one or two tokens at a 1.7–2.6 ms price that really cost
//! 3–7 ms (ShareGPT and HumanEval with 8 clients: 0.88x and 0.87x of K=0), and the policy, which
//! added drafts only
//! while each one raised the step's goodput, could not see that eight more tokens cost less than
//! eight times the first.

/// Weight of each measured forward in the online scale, so one noisy step moves it little.
const SCALE_STEP: f64 = 0.05;
/// The online scale stays within this factor of the calibration.
const SCALE_LIMIT: f64 = 4.0;

/// A calibration point: tokens, seconds.
type Point = (usize, f64);

/// The sizes a calibration measures, besides its doublings, for the step of kernels that work
/// in token groups of `group`: one token past the first two boundaries (none without groups).
pub fn step_probe_sizes(group: usize) -> Vec<usize> {
    if group > 1 {
        vec![group + 1, 2 * group + 1]
    } else {
        Vec::new()
    }
}

/// The cost curve: piecewise linear through `(tokens, seconds)` knots.
#[derive(Debug, Clone)]
pub struct StepCost {
    /// The calibration's lower convex hull: token counts strictly ascending, seconds
    /// non-decreasing and positive, at least two points.
    hull: Vec<(f64, f64)>,
    /// Tokens per kernel group (1: no steps).
    group: usize,
    /// Seconds of a whole group's extra pass, spread by [`partial_group`] (0: no steps).
    group_step: f64,
    scale: f64,
}

impl StepCost {
    /// Starts from calibration points `(tokens, seconds)` measured on this device (any order;
    /// a point measured slower than a larger one is taken as noise and lowered to it) on
    /// kernels that work in token groups of `group` (1: none). The [`step_probe_sizes`] points
    /// measure the group step; the others make the hull. With
    /// no usable point the curve is one second per token, so every decision is still defined.
    pub fn from_calibration(points: &[(usize, f64)], group: usize) -> Self {
        let group = group.max(1);
        let probes = step_probe_sizes(group);
        let (steps, knots): (Vec<Point>, Vec<Point>) = points
            .iter()
            .filter(|&&(t, s)| t > 0 && s.is_finite() && s > 0.0)
            .partition(|(t, _)| probes.contains(t));
        let hull = hull_of(knots.into_iter().map(|(t, s)| (t as f64, s)).collect());
        // A disturbed point only reads too high: the lowest estimate of the step counts.
        let group_step = steps
            .iter()
            .map(|&(t, s)| (s - interpolate(&hull, t as f64)) / partial_group(group, t as f64))
            .fold(f64::INFINITY, f64::min);
        Self {
            hull,
            group,
            group_step: if group_step.is_finite() {
                group_step.max(0.0)
            } else {
                0.0
            },
            scale: 1.0,
        }
    }

    /// Seconds the first token of a new group adds beyond what the hull says (before the online
    /// scale).
    pub fn group_step(&self) -> f64 {
        self.group_step * partial_group(self.group, self.group as f64 + 1.0)
    }
}

/// The part of the last group of `tokens` that is missing (0 when `tokens` fills whole groups,
/// and inside the first group, which the hull measures directly).
fn partial_group(group: usize, tokens: f64) -> f64 {
    let g = group as f64;
    if group <= 1 || tokens <= g {
        0.0
    } else {
        (tokens / g).ceil() - tokens / g
    }
}

/// The lower convex hull of `(tokens, seconds)` knots, after lowering each to the next larger.
fn hull_of(mut knots: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    knots.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    knots.dedup_by(|later, earlier| later.0 == earlier.0);
    if knots.is_empty() {
        knots = vec![(1.0, 1.0), (2.0, 2.0)];
    }
    if knots.len() == 1 {
        let (t, s) = knots[0];
        knots.push((2.0 * t, 2.0 * s));
    }
    // A disturbed measurement is too slow, never too fast: from the largest size down, no
    // point may cost more than the next larger one.
    for i in (0..knots.len() - 1).rev() {
        knots[i].1 = knots[i].1.min(knots[i + 1].1);
    }
    lower_hull(&knots)
}

impl StepCost {
    /// Seconds of one verify forward carrying `tokens` tokens (never below a thousandth of the
    /// smallest knot).
    pub fn seconds(&self, tokens: f64) -> f64 {
        let curve =
            interpolate(&self.hull, tokens) + self.group_step * partial_group(self.group, tokens);
        self.scale * curve.max(1e-3 * self.hull[0].1)
    }

    /// How measured forwards compare with the calibration.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// What one more token adds to a forward that carries `tokens` (never below a thousandth of
    /// a one-token forward, so no draft is ever free).
    pub fn marginal(&self, tokens: f64) -> f64 {
        let floor = 1e-3 * self.seconds(1.0);
        (self.seconds(tokens + 1.0) - self.seconds(tokens)).max(floor)
    }

    /// One measured forward.
    pub fn observe(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let ratio = seconds / (self.seconds(tokens as f64) / self.scale);
        let scale = self.scale + SCALE_STEP * (ratio - self.scale);
        self.scale = scale.clamp(1.0 / SCALE_LIMIT, SCALE_LIMIT);
    }
}

/// The segment of `curve` (at least two points) that `x` falls on, the end segments extending
/// past the ends, and the position in it: 0 at its left point, 1 at its right one.
fn segment(curve: &[(f64, f64)], x: f64) -> (usize, f64) {
    let i = curve
        .windows(2)
        .position(|w| x <= w[1].0)
        .unwrap_or(curve.len() - 2);
    (i, (x - curve[i].0) / (curve[i + 1].0 - curve[i].0))
}

fn interpolate(curve: &[(f64, f64)], x: f64) -> f64 {
    let (i, w) = segment(curve, x);
    curve[i].1 + w * (curve[i + 1].1 - curve[i].1)
}

/// Lower convex hull of points sorted by x (Andrew's monotone chain): the points no chord
/// between two others passes below.
fn lower_hull(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut hull: Vec<(f64, f64)> = Vec::with_capacity(points.len());
    for &p in points {
        while hull.len() >= 2 {
            let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
            // b is on or above the chord a-p: drop it.
            if (b.0 - a.0) * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0) <= 0.0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(p);
    }
    hull
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The project's CPU: memory-bound up to 8 tokens, compute-bound above.
    fn cpu() -> StepCost {
        StepCost::from_calibration(&[(1, 0.006), (8, 0.0165), (16, 0.0405), (40, 0.1125)], 1)
    }

    #[test]
    fn the_curve_interpolates_and_extrapolates_its_knots() {
        let cost = cpu();
        assert!((cost.seconds(1.0) - 0.006).abs() < 1e-12);
        assert!((cost.seconds(4.5) - 0.01125).abs() < 1e-12);
        assert!((cost.seconds(48.0) - 0.1365).abs() < 1e-12);
        assert!((cost.marginal(2.0) - 0.0015).abs() < 1e-12);
        assert!((cost.marginal(20.0) - 0.003).abs() < 1e-12);
    }

    /// Verify-shaped steps on the project's CPU (forward bench, 2026-12-03), in kernel groups
    /// of 8 tokens.
    fn grouped() -> Vec<(usize, f64)> {
        vec![
            (1, 0.0110),
            (2, 0.01325),
            (4, 0.0164),
            (8, 0.0225),
            (9, 0.0267),
            (16, 0.0429),
            (17, 0.0499),
            (32, 0.0762),
            (64, 0.150),
        ]
    }

    #[test]
    fn a_new_token_group_costs_a_step_measured_one_token_past_its_boundary() {
        let cost = StepCost::from_calibration(&grouped(), 8);
        // Whole groups and the first group: the hull through the doublings (16 lies a little
        // above the chord from 8 to 32, so the hull passes under it).
        for (t, s) in [(1, 0.0110), (8, 0.0225), (32, 0.0762)] {
            assert!((cost.seconds(t as f64) - s).abs() < 1e-9, "{t}");
        }
        assert!((cost.seconds(16.0) / 0.0429 - 1.0).abs() < 0.1);
        // The lower of the two estimates of the step: 9 tokens cost as measured.
        assert!((cost.seconds(9.0) - 0.0267).abs() < 1e-9);
        assert!(cost.seconds(17.0) < 0.0499);
        assert!(cost.group_step() > 0.001, "{}", cost.group_step());
        // The first token of a group costs more than the next ones, and than the hull's slope.
        assert!(cost.marginal(8.0) > cost.marginal(9.0) + 0.001);
        assert!(cost.marginal(16.0) > cost.marginal(20.0));
        let flat = StepCost::from_calibration(&grouped(), 1);
        assert!(cost.marginal(8.0) > flat.marginal(8.0));
        // Without groups the points past a boundary are ordinary knots.
        assert_eq!(flat.group_step(), 0.0);
        // A step point read too high (another process held the cores) is not taken.
        let mut disturbed = grouped();
        disturbed[6].1 = 0.080;
        let cost2 = StepCost::from_calibration(&disturbed, 8);
        assert!((cost2.group_step() - cost.group_step()).abs() < 1e-12);
    }

    #[test]
    fn a_disturbed_calibration_point_is_lowered_to_the_next_larger_one() {
        let cost = StepCost::from_calibration(&[(16, 0.040), (1, 0.2), (8, 0.016), (8, 0.02)], 1);
        assert!((cost.seconds(1.0) - 0.016).abs() < 1e-12);
        assert!((cost.seconds(8.0) - 0.016).abs() < 1e-12);
        assert!(cost.marginal(8.0) > 0.0);
    }

    #[test]
    fn a_knot_measured_while_disturbed_lies_above_the_hull_and_is_not_read() {
        // The 8-token point measured at 30 ms (another process held the cores) instead of 16.5.
        let cost =
            StepCost::from_calibration(&[(1, 0.006), (8, 0.030), (16, 0.0405), (40, 0.1125)], 1);
        assert!(
            (cost.marginal(8.0) - 0.0023).abs() < 1e-4,
            "{}",
            cost.marginal(8.0)
        );
        assert!((cost.seconds(8.0) - (0.006 + 7.0 * 0.0023)).abs() < 1e-3);
    }

    #[test]
    fn the_online_scale_follows_a_slower_machine_and_leaves_decisions_alone() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let mut cost = cpu();
        let truth = cpu();
        for _ in 0..2_000 {
            let tokens = rng.gen_range(4..=40);
            let noise = 1.0 + rng.gen_range(-0.1..0.1);
            cost.observe(tokens, 1.5 * truth.seconds(tokens as f64) * noise);
        }
        assert!((cost.scale() - 1.5).abs() < 0.1, "{}", cost.scale());
        for t in [1.0, 8.0, 20.0] {
            let (a, b) = (
                cost.marginal(t) / cost.seconds(t),
                truth.marginal(t) / truth.seconds(t),
            );
            assert!((a - b).abs() < 1e-9, "t={t}");
        }
    }

    #[test]
    fn degenerate_input_keeps_every_figure_positive_and_finite() {
        for points in [vec![], vec![(0, 1.0)], vec![(3, f64::NAN)], vec![(4, 0.01)]] {
            let mut cost = StepCost::from_calibration(&points, 8);
            cost.observe(4, f64::NAN);
            cost.observe(4, -1.0);
            cost.observe(0, 1.0);
            cost.observe(1_000, 1e-9);
            assert!(cost.scale() >= 1.0 / SCALE_LIMIT);
            for t in [0.0, 1.0, 7.5, 1e4] {
                assert!(
                    cost.seconds(t).is_finite() && cost.seconds(t) > 0.0,
                    "{points:?}"
                );
                assert!(cost.marginal(t).is_finite() && cost.marginal(t) > 0.0);
            }
        }
    }
}

//! What a verify forward costs on this device: `seconds ≈ fixed + per_token · tokens`, fitted
//! online by exponentially weighted least squares (SmartSpec, Liu et al. 2024, models the batch's
//! verify latency the same way). A forward reads every weight once (`fixed`) and computes each
//! token's rows (`per_token`); on a CPU the second term dominates, on a GPU the first.

/// Weight of past steps: after about `1 / (1 - FORGET)` steps the old ones have faded, so the
/// fit follows load from other processes without jumping on one noisy step.
const FORGET: f64 = 0.98;
/// Weight of each calibration point, never decayed: it keeps the fit defined when recent steps
/// all carried the same number of tokens.
const PRIOR_WEIGHT: f64 = 1.0;

#[derive(Debug, Clone, Default)]
struct Sums {
    w: f64,
    t: f64,
    tt: f64,
    c: f64,
    tc: f64,
}

impl Sums {
    fn add(&mut self, tokens: f64, seconds: f64, weight: f64) {
        self.w += weight;
        self.t += weight * tokens;
        self.tt += weight * tokens * tokens;
        self.c += weight * seconds;
        self.tc += weight * tokens * seconds;
    }

    fn scale(&mut self, by: f64) {
        self.w *= by;
        self.t *= by;
        self.tt *= by;
        self.c *= by;
        self.tc *= by;
    }

    fn plus(&self, other: &Sums) -> Sums {
        Sums {
            w: self.w + other.w,
            t: self.t + other.t,
            tt: self.tt + other.tt,
            c: self.c + other.c,
            tc: self.tc + other.tc,
        }
    }
}

/// The fitted line; both terms are kept positive so that every decision built on it is defined.
#[derive(Debug, Clone)]
pub struct StepCost {
    prior: Sums,
    recent: Sums,
    fixed: f64,
    per_token: f64,
}

impl StepCost {
    /// Starts from calibration points `(tokens, seconds)` measured on this device; at least two
    /// distinct token counts are needed to fix both terms, else `per_token` starts equal to
    /// `fixed` (a neutral guess that the online fit corrects).
    pub fn from_calibration(points: &[(usize, f64)]) -> Self {
        let mut prior = Sums::default();
        for &(tokens, seconds) in points {
            prior.add(tokens as f64, seconds.max(0.0), PRIOR_WEIGHT);
        }
        let mut cost = Self {
            prior,
            recent: Sums::default(),
            fixed: 1.0,
            per_token: 1.0,
        };
        cost.refit();
        cost
    }

    /// Seconds of one verify forward carrying `tokens` tokens, as now fitted.
    pub fn seconds(&self, tokens: f64) -> f64 {
        self.fixed + self.per_token * tokens
    }

    pub fn fixed(&self) -> f64 {
        self.fixed
    }

    pub fn per_token(&self) -> f64 {
        self.per_token
    }

    /// One measured forward.
    pub fn observe(&mut self, tokens: usize, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        self.recent.scale(FORGET);
        self.recent.add(tokens as f64, seconds, 1.0);
        self.refit();
    }

    fn refit(&mut self) {
        let s = self.prior.plus(&self.recent);
        if s.w <= 0.0 {
            return;
        }
        let mean_t = s.t / s.w;
        let mean_c = s.c / s.w;
        let var_t = s.tt / s.w - mean_t * mean_t;
        let cov = s.tc / s.w - mean_t * mean_c;
        // Relative floor: token counts that hardly vary say nothing about the slope.
        let (per_token, fixed) = if var_t > 1e-6 * (1.0 + mean_t * mean_t) {
            let slope = cov / var_t;
            (slope, mean_c - slope * mean_t)
        } else {
            let split = mean_c / (1.0 + mean_t.max(0.0));
            (split, split)
        };
        // Never zero or negative: a zero per-token cost would make any draft look free, a zero
        // fixed cost every draft look like a full extra step.
        let floor = 1e-3 * mean_c.max(1e-9) / (1.0 + mean_t.max(0.0));
        self.per_token = per_token.max(floor);
        self.fixed = fixed.max(floor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn calibration_points_fix_both_terms() {
        let cost = StepCost::from_calibration(&[(1, 0.010), (8, 0.031), (32, 0.103)]);
        assert!((cost.fixed() - 0.007).abs() < 1e-6, "{}", cost.fixed());
        assert!(
            (cost.per_token() - 0.003).abs() < 1e-7,
            "{}",
            cost.per_token()
        );
    }

    #[test]
    fn the_online_fit_follows_the_device_through_noise() {
        // Seeded noisy steps of a device with fixed 5 ms and 4 ms per token, starting from a
        // calibration taken while the machine was 1.5 times slower.
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let mut cost = StepCost::from_calibration(&[(1, 0.0135), (16, 0.1035)]);
        for _ in 0..2_000 {
            let tokens = rng.gen_range(4..=40);
            let noise = 1.0 + rng.gen_range(-0.1..0.1);
            cost.observe(tokens, (0.005 + 0.004 * tokens as f64) * noise);
        }
        assert!(
            (cost.per_token() - 0.004).abs() < 0.0004,
            "{}",
            cost.per_token()
        );
        assert!((cost.fixed() - 0.005).abs() < 0.003, "{}", cost.fixed());
    }

    #[test]
    fn steps_of_one_size_keep_the_calibrated_slope() {
        let mut cost = StepCost::from_calibration(&[(1, 0.010), (9, 0.034)]);
        for _ in 0..500 {
            cost.observe(8, 0.031);
        }
        assert!(cost.per_token() > 0.0015, "{}", cost.per_token());
        assert!((cost.seconds(8.0) - 0.031).abs() < 0.002);
    }

    #[test]
    fn degenerate_input_keeps_both_terms_positive() {
        let mut cost = StepCost::from_calibration(&[]);
        assert!(cost.fixed() > 0.0 && cost.per_token() > 0.0);
        cost.observe(4, f64::NAN);
        cost.observe(4, -1.0);
        // A device that gets faster with more tokens (noise) must not produce a negative slope.
        cost.observe(1, 0.02);
        cost.observe(30, 0.01);
        assert!(cost.fixed() > 0.0 && cost.per_token() > 0.0);
        assert!(cost.seconds(10.0).is_finite());
    }
}

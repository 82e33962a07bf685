//! The target distribution of one logits row under a request's sampling parameters.

use proto::api_worker::SamplingParams;
use rand::Rng;

/// Index of the largest logit; the lowest index wins ties, NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_val = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_val {
            best_val = v;
            best = i;
        }
    }
    best as u32
}

/// A normalized distribution over its support (token id, probability), highest first when
/// top-k/top-p truncated it, in id order otherwise.
#[derive(Debug, Clone)]
pub struct Distribution {
    support: Vec<(u32, f64)>,
}

impl Distribution {
    /// Softmax of `logits / temperature`, without the tokens below min-p times the top one's
    /// probability, restricted to the top-k, then to the smallest prefix whose mass reaches
    /// top-p, renormalized. `temperature` must be positive.
    pub fn new(logits: &[f32], params: &SamplingParams) -> Self {
        let inv_t = 1.0 / f64::from(params.temperature);
        let mut support: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| (i as u32, f64::from(v) * inv_t))
            .collect();
        if support.is_empty() {
            return Self {
                support: vec![(0, 1.0)],
            };
        }
        let min_p = params.processors.min_p;
        if min_p > 0.0 && min_p <= 1.0 {
            // p >= min_p * p_max, in log space after temperature (vLLM applies it there).
            let top = support
                .iter()
                .map(|e| e.1)
                .fold(f64::NEG_INFINITY, f64::max);
            let floor = top + f64::from(min_p).ln();
            support.retain(|e| e.1 >= floor);
        }
        let by_prob_desc = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let top_k = params.top_k as usize;
        if top_k > 0 && top_k < support.len() {
            support.select_nth_unstable_by(top_k - 1, by_prob_desc);
            support.truncate(top_k);
        }
        let truncating_p = params.top_p > 0.0 && params.top_p < 1.0;
        if truncating_p || top_k > 0 {
            support.sort_unstable_by(by_prob_desc);
        }
        let max = support
            .iter()
            .map(|e| e.1)
            .fold(f64::NEG_INFINITY, f64::max);
        let mut total = 0.0;
        for e in &mut support {
            e.1 = (e.1 - max).exp();
            total += e.1;
        }
        for e in &mut support {
            e.1 /= total;
        }
        if truncating_p {
            let mut mass = 0.0;
            let mut keep = support.len();
            for (i, e) in support.iter().enumerate() {
                mass += e.1;
                if mass >= f64::from(params.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            support.truncate(keep);
            let kept: f64 = support.iter().map(|e| e.1).sum();
            for e in &mut support {
                e.1 /= kept;
            }
        }
        Self { support }
    }

    pub fn support(&self) -> &[(u32, f64)] {
        &self.support
    }

    /// Draws one token.
    pub fn sample(&self, rng: &mut impl Rng) -> u32 {
        let mut u = rng.gen::<f64>();
        for &(id, p) in &self.support {
            if u < p {
                return id;
            }
            u -= p;
        }
        // Rounding left a sliver of mass: the last token takes it.
        self.support[self.support.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::position_rng;

    fn params(temperature: f32, top_p: f32, top_k: u32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: None,
            processors: proto::api_worker::LogitsProcessors::NONE,
            logprobs: None,
            prompt_logprobs: None,
            structured: None,
        }
    }

    #[test]
    fn min_p_drops_tokens_below_its_share_of_the_top_one() {
        // Probabilities ∝ e^0, e^1, e^2, e^3: relative to the top 0.05, 0.14, 0.37, 1.
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let mut p = params(1.0, 1.0, 0);
        p.processors.min_p = 0.2;
        let d = Distribution::new(&logits, &p);
        let mut kept: Vec<u32> = d.support().iter().map(|e| e.0).collect();
        kept.sort();
        assert_eq!(kept, vec![2, 3]);
        let total: f64 = d.support().iter().map(|e| e.1).sum();
        assert!((total - 1.0).abs() < 1e-12);
    }

    #[test]
    fn argmax_prefers_lowest_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), 1);
    }

    #[test]
    fn top_k_and_top_p_truncate() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let d = Distribution::new(&logits, &params(1.0, 1.0, 2));
        assert_eq!(
            d.support().iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![3, 2]
        );
        assert!((d.support().iter().map(|e| e.1).sum::<f64>() - 1.0).abs() < 1e-12);
        // p(3) = 0.644 under softmax; top-p 0.5 keeps only token 3.
        let d = Distribution::new(&logits, &params(1.0, 0.5, 0));
        assert_eq!(d.support().len(), 1);
        assert_eq!(d.support(), &[(3, 1.0)]);
    }

    #[test]
    fn sampling_follows_the_probabilities() {
        let d = Distribution::new(&[0.0, (3.0f32).ln()], &params(1.0, 1.0, 0));
        let ones = (0..20_000)
            .filter(|&pos| d.sample(&mut position_rng(9, pos)) == 1)
            .count();
        // p(1) = 0.75; 20k draws give a standard deviation of ~0.003.
        assert!((ones as f64 / 20_000.0 - 0.75).abs() < 0.015, "{ones}");
    }
}

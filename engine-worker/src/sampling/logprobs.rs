//! Log-probabilities of emitted tokens, as OpenAI's `logprobs` reports them: the log-softmax of
//! the row the choice was made from (after the request's logits processors; before
//! temperature, min-p, top-k and top-p, which shape the draw, not the model's distribution).
//! Computed in f64 so that the reported figure does not depend on the row's summation order.

use proto::TokenLogprob;

/// `log Σ exp(row)`, stable: the row's maximum is taken out first. `-inf` for an all `-inf`
/// row.
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let max = f64::from(max);
    let sum: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    max + sum.ln()
}

/// The logprob of `token` and of the `top` most likely tokens of `row`, most likely first (ties
/// by lower id, so the list is deterministic).
pub fn token_logprob(row: &[f32], token: u32, top: usize) -> TokenLogprob {
    let lse = log_sum_exp(row);
    let logprob = |id: usize| (f64::from(row[id]) - lse) as f32;
    TokenLogprob {
        logprob: logprob(token as usize),
        top: top_ids(row, top)
            .into_iter()
            .map(|id| (id as u32, logprob(id)))
            .collect(),
    }
}

/// Ids of the `n` largest entries, largest first, ties by lower id: one pass keeping a sorted
/// list of at most `n` (n ≤ 20, so insertion beats a heap).
fn top_ids(row: &[f32], n: usize) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::with_capacity(n + 1);
    if n == 0 {
        return best;
    }
    for (id, &x) in row.iter().enumerate() {
        if best.len() == n && x <= row[best[n - 1]] {
            continue;
        }
        // Equal values keep the earlier (lower) id ahead.
        let at = best.partition_point(|&b| row[b] >= x);
        best.insert(at, id);
        best.truncate(n);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn logprobs_are_a_normalized_log_softmax() {
        let row = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
        let lp = token_logprob(&row, 0, 4);
        let p: f64 = lp.top.iter().map(|&(_, l)| f64::from(l).exp()).sum();
        assert!((p - 1.0).abs() < 1e-6, "{p}");
        assert_eq!(
            lp.top.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
            [2, 1, 0, 3]
        );
        let expected = 1.0 - (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!((f64::from(lp.logprob) - expected).abs() < 1e-6);
        assert_eq!(lp.top[3].1, f32::NEG_INFINITY);
        assert!(token_logprob(&row, 2, 0).top.is_empty());
    }

    /// Against a full sort, on random rows with ties.
    #[test]
    fn top_ids_match_a_full_sort() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for _ in 0..200 {
            let len = rng.gen_range(1..60);
            let row: Vec<f32> = (0..len).map(|_| rng.gen_range(0..8) as f32).collect();
            let n = rng.gen_range(0..25);
            let mut sorted: Vec<usize> = (0..len).collect();
            sorted.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            sorted.truncate(n);
            assert_eq!(top_ids(&row, n), sorted, "{row:?} n={n}");
        }
    }
}

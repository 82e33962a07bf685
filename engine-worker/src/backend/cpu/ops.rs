//! Element-wise pieces of the forward pass: RMSNorm, RoPE, SiLU-gated MLP activation.

use crate::model::RopeStyle;

/// `out[t] = x[t] / rms(x[t]) * weight` per row of `x` (`[tokens, dim]`), with a fixed
/// reduction order.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (row, out) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean_sq = super::kernels::dot(row, row) / dim as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for ((o, v), w) in out.iter_mut().zip(row).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// cos/sin of every rotation angle for each position: `[positions, head_dim / 2]` each.
pub(crate) struct RopeTable {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    half: usize,
}

impl RopeTable {
    pub(crate) fn new(positions: &[usize], head_dim: usize, theta: f32) -> Self {
        let half = head_dim / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| f64::from(theta).powf(-((2 * i) as f64) / head_dim as f64))
            .collect();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for f in &inv_freq {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Self { cos, sin, half }
    }

    /// Rotates every head of row `t` of `x` (`[tokens, heads * head_dim]`) by position `t`'s
    /// angles.
    pub(crate) fn apply(&self, x: &mut [f32], heads: usize, style: RopeStyle) {
        let head_dim = 2 * self.half;
        for (t, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
            let cos = &self.cos[t * self.half..(t + 1) * self.half];
            let sin = &self.sin[t * self.half..(t + 1) * self.half];
            for head in row.chunks_exact_mut(head_dim) {
                match style {
                    RopeStyle::Interleaved => {
                        for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                            let (a, b) = (pair[0], pair[1]);
                            pair[0] = a * cos[i] - b * sin[i];
                            pair[1] = a * sin[i] + b * cos[i];
                        }
                    }
                    RopeStyle::HalfSplit => {
                        let (first, second) = head.split_at_mut(self.half);
                        for i in 0..self.half {
                            let (a, b) = (first[i], second[i]);
                            first[i] = a * cos[i] - b * sin[i];
                            second[i] = a * sin[i] + b * cos[i];
                        }
                    }
                }
            }
        }
    }
}

/// `gate = silu(gate) * up`, in place.
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `x += y`.
pub(crate) fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_styles_agree_up_to_the_permutation() {
        // Interleaved RoPE on a permuted head equals half-split RoPE on the original.
        let head_dim = 8;
        let table = RopeTable::new(&[5], head_dim, 10_000.0);
        let original: Vec<f32> = (0..head_dim).map(|i| i as f32 * 0.3 - 1.0).collect();
        let mut permuted = vec![0.0; head_dim];
        for i in 0..head_dim / 2 {
            permuted[2 * i] = original[i];
            permuted[2 * i + 1] = original[i + head_dim / 2];
        }
        let mut half = original.clone();
        table.apply(&mut half, 1, RopeStyle::HalfSplit);
        table.apply(&mut permuted, 1, RopeStyle::Interleaved);
        for i in 0..head_dim / 2 {
            assert!((permuted[2 * i] - half[i]).abs() < 1e-6);
            assert!((permuted[2 * i + 1] - half[i + head_dim / 2]).abs() < 1e-6);
        }
        // Position 0 is the identity.
        let mut x = original.clone();
        RopeTable::new(&[0], head_dim, 10_000.0).apply(&mut x, 1, RopeStyle::Interleaved);
        assert_eq!(x, original);
    }

    #[test]
    fn rms_norm_normalizes() {
        let x = [3.0, 4.0];
        let mut out = [0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 8.0 / rms).abs() < 1e-6);
    }
}

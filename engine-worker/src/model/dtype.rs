//! Storage types of weight matrices and their block layouts (ggml's, for the quantized ones).
//!
//! Every layout stores each row contiguously; quantized rows are a sequence of 32-element
//! blocks. Scalar (de)quantization lives here; the SIMD kernels in `backend::cpu` read the
//! same layouts.

use half::{bf16, f16};

/// Elements per quantization block.
pub const QK: usize = 32;

/// How a weight matrix is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightType {
    F32,
    F16,
    BF16,
    /// Block of 32: f16 scale `d`, 32 × i8 `q`; value = `d * q`.
    Q8_0,
    /// Block of 32: f16 scale `d`, 16 bytes of nibbles; value = `d * (nibble - 8)`.
    Q4_0,
    /// Block of 32: f16 scale `d`, f16 minimum `m`, 16 bytes of nibbles; value = `d * nibble + m`.
    /// Byte `j` holds element `j` in its low nibble and element `j + 16` in its high nibble.
    Q4_1,
}

impl WeightType {
    /// `(elements per block, bytes per block)`.
    pub fn block_layout(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q8_0 => (QK, 34),
            Self::Q4_0 => (QK, 18),
            Self::Q4_1 => (QK, 20),
        }
    }

    /// f16 parameters at the start of each block: a scale `d`, then for Q4_1 a minimum `m`.
    pub fn scales_per_block(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 0,
            Self::Q8_0 | Self::Q4_0 => 1,
            Self::Q4_1 => 2,
        }
    }

    /// Bytes of one row of `cols` elements (`cols` must be a multiple of the block size).
    pub fn row_bytes(self, cols: usize) -> usize {
        let (elems, bytes) = self.block_layout();
        cols / elems * bytes
    }

    pub fn from_ggml(t: gguf::GgmlType) -> Option<Self> {
        Some(match t {
            gguf::GgmlType::F32 => Self::F32,
            gguf::GgmlType::F16 => Self::F16,
            gguf::GgmlType::BF16 => Self::BF16,
            gguf::GgmlType::Q8_0 => Self::Q8_0,
            gguf::GgmlType::Q4_0 => Self::Q4_0,
            gguf::GgmlType::Q4_1 => Self::Q4_1,
            _ => return None,
        })
    }

    /// Parses `f32`, `f16`, `bf16`, `q8_0`, `q4_0`, `q4_1` (case-insensitive).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Self::F32,
            "f16" | "float16" => Self::F16,
            "bf16" | "bfloat16" => Self::BF16,
            "q8_0" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "q4_1" => Self::Q4_1,
            _ => return None,
        })
    }
}

impl std::fmt::Display for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Decodes one row (`out.len()` elements) from its stored bytes.
pub fn dequantize_row(dtype: WeightType, row: &[u8], out: &mut [f32]) {
    match dtype {
        WeightType::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        WeightType::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WeightType::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WeightType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for (o, &q) in o.iter_mut().zip(&b[2..]) {
                    *o = d * f32::from(q as i8);
                }
            }
        }
        WeightType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for (j, &q) in b[2..].iter().enumerate() {
                    o[j] = d * (f32::from(q & 0x0f) - 8.0);
                    o[j + 16] = d * (f32::from(q >> 4) - 8.0);
                }
            }
        }
        WeightType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(20)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                for (j, &q) in b[4..].iter().enumerate() {
                    o[j] = d * f32::from(q & 0x0f) + m;
                    o[j + 16] = d * f32::from(q >> 4) + m;
                }
            }
        }
    }
}

/// Encodes one row of values (length a multiple of the block size for quantized types). Used
/// for dummy weights and tests; the rounding matches ggml's reference quantizers.
pub fn quantize_row(dtype: WeightType, values: &[f32], out: &mut Vec<u8>) {
    match dtype {
        WeightType::F32 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        WeightType::F16 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        WeightType::BF16 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
        WeightType::Q8_0 => {
            for block in values.chunks_exact(QK) {
                let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend(block.iter().map(|v| (v * inv).round() as i8 as u8));
            }
        }
        WeightType::Q4_0 => {
            for block in values.chunks_exact(QK) {
                // The value of largest magnitude maps to -8.
                let max = block
                    .iter()
                    .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = max / -8.0;
                let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                let q = |v: f32| ((v * inv + 8.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
            }
        }
        WeightType::Q4_1 => {
            for block in values.chunks_exact(QK) {
                let min = block.iter().copied().fold(f32::INFINITY, f32::min);
                let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
                let q = |v: f32| (((v - min) * inv + 0.5) as i32).clamp(0, 15) as u8;
                out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 61) as f32 - 30.0) / 17.0)
            .collect()
    }

    #[test]
    fn round_trip_error_is_bounded_by_the_format() {
        let values = ramp(128);
        for (dtype, tol) in [
            (WeightType::F32, 0.0),
            (WeightType::F16, 2e-3),
            (WeightType::BF16, 2e-2),
            (WeightType::Q8_0, 0.02),
            (WeightType::Q4_0, 0.25),
            (WeightType::Q4_1, 0.15),
        ] {
            let mut bytes = Vec::new();
            quantize_row(dtype, &values, &mut bytes);
            assert_eq!(bytes.len(), dtype.row_bytes(values.len()), "{dtype}");
            let mut back = vec![0.0; values.len()];
            dequantize_row(dtype, &bytes, &mut back);
            for (a, b) in values.iter().zip(&back) {
                assert!((a - b).abs() <= tol, "{dtype}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn q4_1_nibble_order() {
        // d = 1, m = 0.5; byte j = low nibble j, high nibble 15 - j.
        let mut block = Vec::new();
        block.extend_from_slice(&f16::from_f32(1.0).to_le_bytes());
        block.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0.0; 32];
        dequantize_row(WeightType::Q4_1, &block, &mut out);
        assert_eq!(out[0], 0.5);
        assert_eq!(out[15], 15.5);
        assert_eq!(out[16], 15.5);
        assert_eq!(out[31], 0.5);
    }
}

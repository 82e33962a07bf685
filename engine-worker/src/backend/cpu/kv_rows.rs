//! The stored forms of a KV row and how attention reads them: one zero-sized type per
//! [`KvDtype`], encoding a row of f32 keys or values on write and loading it back as f32 lanes
//! inside the attention kernels, so no widened copy of the cache is ever made. Every path
//! (portable, AVX2, AVX-512) decodes to the same f32 values (f16 and bf16 widen exactly; a
//! Q8_0 element is `scale * q`, exact in f32), so the paths differ only as they do for f32.
//! Q8_0 follows ggml's `quantize_row_q8_0_ref` (ggml/src/ggml-quants.c).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::{bf16, f16};

use crate::kv::{KvDtype, Q8_0_BLOCK};

/// Bytes of one Q8_0 block: the f16 scale, then 32 signed bytes.
const Q8_0_BYTES: usize = 2 + Q8_0_BLOCK;

/// One stored form of a KV row.
pub(crate) trait KvRow: Send + Sync + 'static {
    const DTYPE: KvDtype;

    /// Stores `src` (one row) into `dst` (`DTYPE.row_bytes(src.len())` bytes).
    fn encode(src: &[f32], dst: &mut [u8]);

    /// Element `i` of a stored row.
    fn get(row: &[u8], i: usize) -> f32;

    /// Elements `i..i + 8` of the row at `row` (`i` a multiple of 8).
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; the row must hold those elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(row: *const u8, i: usize) -> __m256;

    /// Elements `i..i + 16` of the row at `row` (`i` a multiple of 16).
    ///
    /// # Safety
    /// AVX-512F must be available; the row must hold those elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(row: *const u8, i: usize) -> __m512;
}

pub(crate) struct F32Row;
pub(crate) struct F16Row;
pub(crate) struct Bf16Row;
pub(crate) struct Q8Row;

impl KvRow for F32Row {
    const DTYPE: KvDtype = KvDtype::F32;

    fn encode(src: &[f32], dst: &mut [u8]) {
        for (x, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
            d.copy_from_slice(&x.to_le_bytes());
        }
    }

    #[inline]
    fn get(row: &[u8], i: usize) -> f32 {
        f32::from_le_bytes(row[4 * i..4 * i + 4].try_into().unwrap())
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8(row: *const u8, i: usize) -> __m256 {
        _mm256_loadu_ps(row.cast::<f32>().add(i))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load16(row: *const u8, i: usize) -> __m512 {
        _mm512_loadu_ps(row.cast::<f32>().add(i))
    }
}

impl KvRow for F16Row {
    const DTYPE: KvDtype = KvDtype::F16;

    fn encode(src: &[f32], dst: &mut [u8]) {
        for (x, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
            d.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
        }
    }

    #[inline]
    fn get(row: &[u8], i: usize) -> f32 {
        f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8(row: *const u8, i: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * i).cast()))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load16(row: *const u8, i: usize) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(row.add(2 * i).cast()))
    }
}

impl KvRow for Bf16Row {
    const DTYPE: KvDtype = KvDtype::Bf16;

    fn encode(src: &[f32], dst: &mut [u8]) {
        for (x, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
            d.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
        }
    }

    #[inline]
    fn get(row: &[u8], i: usize) -> f32 {
        bf16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32()
    }

    /// A bf16 is the high half of an f32: widen each to 32 bits and shift it up.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8(row: *const u8, i: usize) -> __m256 {
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(row.add(2 * i).cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load16(row: *const u8, i: usize) -> __m512 {
        let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(2 * i).cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
    }
}

impl Q8Row {
    /// The block holding element `i`: its scale's bits and a pointer to element `i`.
    #[inline]
    fn locate(row: *const u8, i: usize) -> (u16, *const i8) {
        let block = row.wrapping_add(i / Q8_0_BLOCK * Q8_0_BYTES);
        // SAFETY (of the callers): the row holds element `i`, so its block's two scale bytes.
        let scale = unsafe { u16::from_le_bytes([*block, *block.add(1)]) };
        (scale, block.wrapping_add(2 + i % Q8_0_BLOCK).cast())
    }
}

impl KvRow for Q8Row {
    const DTYPE: KvDtype = KvDtype::Q8_0;

    fn encode(src: &[f32], dst: &mut [u8]) {
        for (x, d) in src
            .chunks_exact(Q8_0_BLOCK)
            .zip(dst.chunks_exact_mut(Q8_0_BYTES))
        {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = amax / 127.0;
            let inverse = if scale != 0.0 { 1.0 / scale } else { 0.0 };
            d[..2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
            for (q, v) in d[2..].iter_mut().zip(x) {
                *q = (v * inverse).round() as i8 as u8;
            }
        }
    }

    #[inline]
    fn get(row: &[u8], i: usize) -> f32 {
        let block = &row[i / Q8_0_BLOCK * Q8_0_BYTES..];
        let scale = f16::from_le_bytes([block[0], block[1]]).to_f32();
        scale * f32::from(block[2 + i % Q8_0_BLOCK] as i8)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8(row: *const u8, i: usize) -> __m256 {
        let (scale, q) = Self::locate(row, i);
        let scale = _mm256_cvtph_ps(_mm_set1_epi16(scale as i16));
        let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.cast())));
        _mm256_mul_ps(scale, q)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load16(row: *const u8, i: usize) -> __m512 {
        let (scale, q) = Self::locate(row, i);
        let scale = _mm512_cvtph_ps(_mm256_set1_epi16(scale as i16));
        let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q.cast())));
        _mm512_mul_ps(scale, q)
    }
}

/// Calls `$body` with `$row` bound to the row type of `$dtype`.
macro_rules! with_kv_row {
    ($dtype:expr, $row:ident => $body:expr) => {
        match $dtype {
            $crate::kv::KvDtype::F32 => {
                type $row = $crate::backend::cpu::kv_rows::F32Row;
                $body
            }
            $crate::kv::KvDtype::F16 => {
                type $row = $crate::backend::cpu::kv_rows::F16Row;
                $body
            }
            $crate::kv::KvDtype::Bf16 => {
                type $row = $crate::backend::cpu::kv_rows::Bf16Row;
                $body
            }
            $crate::kv::KvDtype::Q8_0 => {
                type $row = $crate::backend::cpu::kv_rows::Q8Row;
                $body
            }
        }
    };
}
pub(crate) use with_kv_row;

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::backend::cpu::Isa;

    fn roundtrip<R: KvRow>(src: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let mut row = vec![0u8; R::DTYPE.row_bytes(src.len())];
        R::encode(src, &mut row);
        let back = (0..src.len()).map(|i| R::get(&row, i)).collect();
        (row, back)
    }

    /// Each form's error bound (half an ulp of its significand, or half a Q8_0 step), and
    /// every SIMD load returning exactly what the portable read does.
    fn check<R: KvRow>(relative: f32, step_of_amax: f32) {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let src: Vec<f32> = (0..128).map(|_| rng.gen_range(-4.0..4.0)).collect();
        let (row, back) = roundtrip::<R>(&src);
        for (block, (s, b)) in src
            .chunks(Q8_0_BLOCK)
            .zip(back.chunks(Q8_0_BLOCK))
            .enumerate()
        {
            let amax = s.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (x, y) in s.iter().zip(b) {
                let bound = relative * x.abs() + step_of_amax * amax * 0.5001;
                assert!(
                    (x - y).abs() <= bound,
                    "{:?} block {block}: {x} read back as {y}",
                    R::DTYPE
                );
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::Avx2.is_supported() {
                for i in (0..128).step_by(8) {
                    let mut lanes = [0.0f32; 8];
                    // SAFETY: AVX2/FMA/F16C checked; the row holds 128 elements.
                    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), R::load8(row.as_ptr(), i)) };
                    assert_eq!(
                        lanes.map(f32::to_bits),
                        std::array::from_fn(|j| back[i + j].to_bits())
                    );
                }
            }
            if !Isa::testable(&[Isa::Avx512], "backend::cpu::kv_rows::tests").is_empty() {
                for i in (0..128).step_by(16) {
                    let mut lanes = [0.0f32; 16];
                    // SAFETY: AVX-512F checked; the row holds 128 elements.
                    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), R::load16(row.as_ptr(), i)) };
                    assert_eq!(
                        lanes.map(f32::to_bits),
                        std::array::from_fn(|j| back[i + j].to_bits())
                    );
                }
            }
        }
    }

    #[test]
    fn every_form_reads_back_within_its_precision_and_the_same_on_every_path() {
        check::<F32Row>(0.0, 0.0);
        check::<F16Row>(1.0 / 2048.0, 0.0);
        check::<Bf16Row>(1.0 / 256.0, 0.0);
        // The scale itself is rounded to f16, which moves the top of the range by up to half
        // an f16 ulp on top of half a step.
        check::<Q8Row>(1.0 / 2048.0, 1.0 / 127.0);
    }

    #[test]
    fn q8_0_matches_ggml_on_a_zero_block_and_the_extremes() {
        let mut src = vec![0.0f32; 64];
        // Values exact in binary: the scale is 63.5 / 127 = 0.5, so 0.75 sits on a tie.
        src[32] = -63.5;
        src[33] = 0.75;
        let (row, back) = roundtrip::<Q8Row>(&src);
        assert_eq!(
            &row[..34],
            &[0u8; 34],
            "a zero block is a zero scale and zero values"
        );
        assert_eq!(row[36] as i8, -127);
        assert_eq!(
            row[37] as i8, 2,
            "round half away from zero, as ggml's roundf"
        );
        assert_eq!((back[32], back[33]), (-63.5, 1.0));
    }
}

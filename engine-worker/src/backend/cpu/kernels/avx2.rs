//! AVX2 + FMA + F16C kernels. Each 32-element block is decoded once into four 8-lane f32
//! vectors and multiplied into every token of the group; per token, block partial sums are
//! scaled into one accumulator (with 16 registers, two per token would spill for 8 tokens).

/// The row-range kernel ([`super::row_range_kernels`]); only called when the CPU has the
/// instruction set ([`super::Isa::detect`]).
#[cfg(target_arch = "x86_64")]
pub(super) use imp::dot_group_rows;

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    use super::super::super::folds::hsum8;
    use super::super::{GroupInput, RowRange, MAX_GROUP};
    use crate::model::{WeightType, QK};

    /// One stored block format of 32 elements.
    trait Format {
        const BLOCK_BYTES: usize;
        /// f32 parameters per block in the matrix's `block_scales`: a scale `d`, then a minimum.
        const SCALES: usize;
        /// The block's dot product is multiplied by its scale `d` (its first f32 parameter).
        const SCALED: bool;
        /// `m · Σx` is added, `m` the block's second f32 parameter (Q4_1).
        const HAS_MIN: bool;
        /// The 32 block values before scaling, as four 8-lane vectors.
        unsafe fn load(p: *const u8) -> [__m256; 4];
    }

    struct F32;
    impl Format for F32 {
        const BLOCK_BYTES: usize = 128;
        const SCALES: usize = 0;
        const SCALED: bool = false;
        const HAS_MIN: bool = false;
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8) -> [__m256; 4] {
            let p = p as *const f32;
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        }
    }

    struct F16;
    impl Format for F16 {
        const BLOCK_BYTES: usize = 64;
        const SCALES: usize = 0;
        const SCALED: bool = false;
        const HAS_MIN: bool = false;
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8) -> [__m256; 4] {
            let h = |i: usize| _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * i) as *const __m128i));
            [h(0), h(1), h(2), h(3)]
        }
    }

    struct Bf16;
    impl Format for Bf16 {
        const BLOCK_BYTES: usize = 64;
        const SCALES: usize = 0;
        const SCALED: bool = false;
        const HAS_MIN: bool = false;
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8) -> [__m256; 4] {
            // bf16 is the top half of an f32.
            let h = |i: usize| {
                let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(16 * i) as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
            };
            [h(0), h(1), h(2), h(3)]
        }
    }

    struct Q8_0;
    impl Format for Q8_0 {
        const BLOCK_BYTES: usize = 34;
        const SCALES: usize = 1;
        const SCALED: bool = true;
        const HAS_MIN: bool = false;
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8) -> [__m256; 4] {
            let q = p.add(2);
            let h = |i: usize| {
                let bytes = _mm_loadl_epi64(q.add(8 * i) as *const __m128i);
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))
            };
            [h(0), h(1), h(2), h(3)]
        }
    }

    /// Splits 16 bytes of nibbles into elements 0..16 (low) and 16..32 (high), as bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn nibbles(p: *const u8) -> (__m128i, __m128i) {
        let v = _mm_loadu_si128(p as *const __m128i);
        let mask = _mm_set1_epi8(0x0f);
        (
            _mm_and_si128(v, mask),
            _mm_and_si128(_mm_srli_epi16::<4>(v), mask),
        )
    }

    struct Q4_0;
    impl Format for Q4_0 {
        const BLOCK_BYTES: usize = 18;
        const SCALES: usize = 1;
        const SCALED: bool = true;
        const HAS_MIN: bool = false;
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8) -> [__m256; 4] {
            let (lo, hi) = nibbles(p.add(2));
            let eight = _mm_set1_epi8(8);
            let (lo, hi) = (_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight));
            let h = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            [
                h(lo),
                h(_mm_srli_si128::<8>(lo)),
                h(hi),
                h(_mm_srli_si128::<8>(hi)),
            ]
        }
    }

    struct Q4_1;
    impl Format for Q4_1 {
        const BLOCK_BYTES: usize = 20;
        const SCALES: usize = 2;
        const SCALED: bool = true;
        const HAS_MIN: bool = true;
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8) -> [__m256; 4] {
            let (lo, hi) = nibbles(p.add(4));
            let h = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
            [
                h(lo),
                h(_mm_srli_si128::<8>(lo)),
                h(hi),
                h(_mm_srli_si128::<8>(hi)),
            ]
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn block_dot(q: &[__m256; 4], x: *const f32) -> __m256 {
        let mut bd = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
        bd = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x.add(8)), bd);
        bd = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x.add(16)), bd);
        _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x.add(24)), bd)
    }

    /// The [`row_range_kernels`](super::super::row_range_kernels) shape, one row at a time
    /// (with 16 registers, a group's accumulators leave no room for a second row's).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn dot<F: Format, const R: usize, const N: usize>(
        row: *const u8,
        row_stride: usize,
        scales: *const f32,
        scale_stride: usize,
        group: &GroupInput<'_>,
        out: &mut [[f32; MAX_GROUP]; R],
    ) {
        for (r, out) in out.iter_mut().enumerate() {
            dot_row::<F, N>(
                row.add(r * row_stride),
                scales.add(r * scale_stride),
                group,
                out,
            );
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn dot_row<F: Format, const N: usize>(
        row: *const u8,
        scales: *const f32,
        group: &GroupInput<'_>,
        out: &mut [f32; MAX_GROUP],
    ) {
        let cols = group.cols;
        let blocks = cols / QK;
        let x = group.x.as_ptr();
        let sums = group.sums.as_ptr();
        let mut acc = [_mm256_setzero_ps(); N];

        // One block into the given accumulators; a macro so the accumulator arrays stay in
        // registers.
        macro_rules! step {
            ($b:expr, $acc:ident) => {{
                let b = $b;
                let q = F::load(row.add(b * F::BLOCK_BYTES));
                let d = if F::SCALED {
                    _mm256_set1_ps(*scales.add(b * F::SCALES))
                } else {
                    _mm256_setzero_ps()
                };
                for t in 0..N {
                    let bd = block_dot(&q, x.add(t * cols + b * QK));
                    $acc[t] = if F::SCALED {
                        _mm256_fmadd_ps(d, bd, $acc[t])
                    } else {
                        _mm256_add_ps(bd, $acc[t])
                    };
                }
            }};
        }

        for b in 0..blocks {
            step!(b, acc);
        }
        // Q4_1's `m · Σx` terms in a pass of their own, keeping the vector loop's registers
        // for the accumulators.
        let mut min_terms = [0f32; N];
        if F::HAS_MIN {
            for b in 0..blocks {
                let m = *scales.add(b * F::SCALES + 1);
                for (t, term) in min_terms.iter_mut().enumerate() {
                    *term += m * *sums.add(t * blocks + b);
                }
            }
        }
        for t in 0..N {
            out[t] = hsum8(acc[t]) + min_terms[t];
        }
    }

    super::super::row_range_kernels!(
        "avx2,fma,f16c",
        rows_per_pass: {1 => 1, 2 => 1, 3 => 1, 4 => 1, 5 => 1, 6 => 1, 7 => 1, 8 => 1}
    );
}

//! AVX-512F kernels: as the AVX2 ones (`avx2.rs`), with each 32-element block decoded into two
//! 16-lane vectors, which halves the decode instructions per block; 4-bit blocks are decoded
//! straight to scaled values through a 16-entry `vpermps` table. With 32 registers a pass takes
//! two rows of an 8-token group (four of a smaller one), so each activation load feeds two
//! rows' FMAs: with one row, loads bounded the 8-token kernel (0.60–0.62 → 0.55–0.57 ns per
//! Q4_1 block and token, 0.67 → 0.59 for Q8_0, in `kernel_throughput`). AVX-512VL lets the
//! compiler use all 32 registers for 128- and 256-bit instructions too: without it, the
//! accumulators' zeroing (a VEX `vxorps`) kept them in the first 16, and two spilled.

/// The row-range kernel ([`super::row_range_kernels`]); only called when the CPU has the
/// instruction set ([`super::Isa::detect`]).
#[cfg(target_arch = "x86_64")]
pub(super) use imp::dot_group_rows;

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    use super::super::super::folds::{halves, pairs, quads};
    use super::super::{GroupInput, RowRange, MAX_GROUP};
    use crate::model::{WeightType, QK};

    /// One stored block format of 32 elements.
    trait Format {
        const BLOCK_BYTES: usize;
        /// f32 parameters per block in the matrix's `block_scales` (see `load`).
        const SCALES: usize;
        /// The 32 block values at `p`, scaled (and Q4_1's minimum added), as two 16-lane
        /// vectors; `s` points to the block's `SCALES` f32 parameters, which are broadcast from
        /// memory (a load, where the stored f16 would need conversion and shuffle work). Done
        /// once per block, so a token costs two FMAs per block.
        unsafe fn load(p: *const u8, s: *const f32) -> [__m512; 2];
    }

    struct F32;
    impl Format for F32 {
        const BLOCK_BYTES: usize = 128;
        const SCALES: usize = 0;
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8, _s: *const f32) -> [__m512; 2] {
            let p = p as *const f32;
            [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
        }
    }

    struct F16;
    impl Format for F16 {
        const BLOCK_BYTES: usize = 64;
        const SCALES: usize = 0;
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8, _s: *const f32) -> [__m512; 2] {
            [
                _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
                _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32) as *const __m256i)),
            ]
        }
    }

    /// bf16 is the top half of an f32.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn bf16x16(p: *const u8) -> __m512 {
        let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
    }

    struct Bf16;
    impl Format for Bf16 {
        const BLOCK_BYTES: usize = 64;
        const SCALES: usize = 0;
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8, _s: *const f32) -> [__m512; 2] {
            [bf16x16(p), bf16x16(p.add(32))]
        }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn i8x16(v: __m128i) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
    }

    struct Q8_0;
    impl Format for Q8_0 {
        const BLOCK_BYTES: usize = 34;
        const SCALES: usize = 1;
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8, s: *const f32) -> [__m512; 2] {
            let d = _mm512_set1_ps(*s);
            [
                _mm512_mul_ps(d, i8x16(_mm_loadu_si128(p.add(2) as *const __m128i))),
                _mm512_mul_ps(d, i8x16(_mm_loadu_si128(p.add(18) as *const __m128i))),
            ]
        }
    }

    /// A 4-bit block decoded through a 16-entry table of its values: `vpermps` picks entry
    /// `nibble` for every lane (it reads only an index's low 4 bits, so no masking is needed).
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn nibble_lookup(nibbles: *const u8, table: __m512) -> [__m512; 2] {
        let v = _mm_loadu_si128(nibbles as *const __m128i);
        let low = _mm512_cvtepu8_epi32(v);
        let high = _mm512_cvtepu8_epi32(_mm_srli_epi16::<4>(v));
        [
            _mm512_permutexvar_ps(low, table),
            _mm512_permutexvar_ps(high, table),
        ]
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn iota16() -> __m512 {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    }

    /// Loads already-scaled values (`d * (n - 8)`), so the block needs no further scaling.
    struct Q4_0;
    impl Format for Q4_0 {
        const BLOCK_BYTES: usize = 18;
        const SCALES: usize = 1;
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8, s: *const f32) -> [__m512; 2] {
            let d = _mm512_set1_ps(*s);
            let table = _mm512_mul_ps(d, _mm512_sub_ps(iota16(), _mm512_set1_ps(8.0)));
            nibble_lookup(p.add(2), table)
        }
    }

    /// Loads already-dequantized values (`d * n + m`): no scaling and no minimum term left.
    struct Q4_1;
    impl Format for Q4_1 {
        const BLOCK_BYTES: usize = 20;
        const SCALES: usize = 2;
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
        #[inline]
        unsafe fn load(p: *const u8, s: *const f32) -> [__m512; 2] {
            let d = _mm512_set1_ps(*s);
            let m = _mm512_set1_ps(*s.add(1));
            nibble_lookup(p.add(4), _mm512_fmadd_ps(d, iota16(), m))
        }
    }

    /// Horizontal sum in a fixed order.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn hsum(v: __m512) -> f32 {
        let oct = _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        );
        let quad = _mm_add_ps(_mm256_castps256_ps128(oct), _mm256_extractf128_ps::<1>(oct));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps::<1>(pair, pair)))
    }

    /// Horizontal sums of eight vectors at once, each by [`hsum`]'s tree (lane `i` + lane
    /// `i + 8`, then `i + 4`, `i + 2`, `i + 1`), so a token's sum has the same bits either way:
    /// 15 shuffles and 8 adds where eight `hsum`s take 32 and 32 (by instruction count, about a
    /// fifth of a token's work on rows of 18 blocks).
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn hsum8(v: &[__m512; 8]) -> [f32; 8] {
        let low = quads(halves(v[0], v[1]), halves(v[2], v[3]));
        let high = quads(halves(v[4], v[5]), halves(v[6], v[7]));
        // Per 128-bit lane k: [k's q0 + q2, k's q1 + q3, (k + 4)'s q0 + q2, (k + 4)'s q1 + q3].
        let folded = pairs(low, high);
        let sums = _mm512_add_ps(folded, _mm512_permute_ps::<0xB1>(folded));
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), sums);
        std::array::from_fn(|t| lanes[(t % 4) * 4 + (t / 4) * 2])
    }

    /// `out[r][t] = row_r · x[t]` for `R` consecutive rows (`row_stride` bytes and
    /// `scale_stride` scales apart) and the group's first `N` tokens. Each block of each row is
    /// decoded once per call, and each token's block of activations is loaded once and used
    /// for all `R` rows, so a block costs a token two FMAs and, per row, one activation load
    /// shared `R` ways. Every (row, token) pair keeps one accumulator fed in block order, so a
    /// result never depends on `R` or `N`.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    // Index loops over constant bounds: they unroll fully, keeping every accumulator in a
    // register.
    #[allow(clippy::needless_range_loop)]
    unsafe fn dot<F: Format, const R: usize, const N: usize>(
        row: *const u8,
        row_stride: usize,
        scales: *const f32,
        scale_stride: usize,
        group: &GroupInput<'_>,
        out: &mut [[f32; MAX_GROUP]; R],
    ) {
        let cols = group.cols;
        let blocks = cols / QK;
        let x = group.x.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        for b in 0..blocks {
            let mut q = [[_mm512_setzero_ps(); 2]; R];
            for (r, q) in q.iter_mut().enumerate() {
                *q = F::load(
                    row.add(r * row_stride + b * F::BLOCK_BYTES),
                    scales.add(r * scale_stride + b * F::SCALES),
                );
            }
            for t in 0..N {
                let xt = x.add(t * cols + b * QK);
                for half in 0..2 {
                    let xh = _mm512_loadu_ps(xt.add(16 * half));
                    for r in 0..R {
                        let a = &mut acc[r][t];
                        *a = _mm512_fmadd_ps(q[r][half], xh, *a);
                    }
                }
            }
        }
        for r in 0..R {
            if N >= 4 {
                // Eight tokens at a time; absent tokens sum zeros, and a token's tree does
                // not depend on its neighbours.
                for first in (0..N).step_by(8) {
                    let n = (N - first).min(8);
                    let mut v = [_mm512_setzero_ps(); 8];
                    v[..n].copy_from_slice(&acc[r][first..first + n]);
                    out[r][first..first + n].copy_from_slice(&hsum8(&v)[..n]);
                }
            } else {
                for t in 0..N {
                    out[r][t] = hsum(acc[r][t]);
                }
            }
        }
    }

    super::super::row_range_kernels!(
        "avx512f,avx512vl,avx2,fma,f16c",
        // 16 accumulators at most (rows × tokens), beside each row's two decoded vectors;
        // past 8 tokens one row a pass, its decode shared by up to 16 tokens.
        rows_per_pass: {
            1 => 2, 2 => 4, 3 => 4, 4 => 4, 5 => 2, 6 => 2, 7 => 2, 8 => 2,
            9 => 2, 10 => 2, 11 => 2, 12 => 2, 13 => 1, 14 => 1, 15 => 1, 16 => 1,
        }
    );
}

//! Horizontal sums shared by the row-dot kernels and attention. [`hsum8`] for AVX2; the AVX-512
//! steps fold several vectors at once, and every vector's own lanes go through the same tree (lane
//! `i` + lane `i + 8`, then `+ 4`, `+ 2`, `+ 1`) whatever its neighbours, so a sum taken among
//! others has the bits it has alone.

use std::arch::x86_64::*;

/// The sum of `v`'s 8 lanes in a fixed order (halves, then pairs, then the last two).
#[target_feature(enable = "avx")]
#[inline]
pub(crate) unsafe fn hsum8(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps::<1>(pair, pair)))
}

/// `[a's lanes i + (i + 8) | b's]`: two vectors folded to 8 lanes each, one per 256-bit half.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn halves(a: __m512, b: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x44>(a, b),
        _mm512_shuffle_f32x4::<0xEE>(a, b),
    )
}

/// Two [`halves`] results folded again (lane `i` + lane `i + 4`): four vectors' 4-lane folds,
/// one per 128-bit quarter.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn quads(ab: __m512, cd: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x88>(ab, cd),
        _mm512_shuffle_f32x4::<0xDD>(ab, cd),
    )
}

/// Two [`quads`] results folded again (lane `i` + lane `i + 2`): per 128-bit quarter `k`,
/// `[low's vector k (2 lanes), high's vector k (2 lanes)]`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn pairs(low: __m512, high: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x44>(low, high),
        _mm512_shuffle_ps::<0xEE>(low, high),
    )
}

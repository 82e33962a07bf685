//! Row-dot kernels: `out[r, t] = Σ_c W[r, c] · x[t, c]` for a weight matrix in its stored type
//! and f32 activations.
//!
//! Batch invariance: a token's result goes through the same instructions whatever other
//! tokens share the call. Tokens are processed in groups of up to [`Isa::token_group`] per pass
//! over a weight row (to reuse each decoded block), and a pass may take several rows (to reuse each
//! activation load), but every (row, token) pair keeps its own accumulators and its operation
//! order depends neither on the group size nor on the rows beside it.
//!
//! Block scales (and Q4_1's minimums) come from the matrix's f32 copies
//! ([`WeightMatrix::block_scales`]) rather than the stored f16: a broadcast from memory is a
//! plain load, while converting and broadcasting each block's f16 took four shuffle-port
//! instructions, which bounded the one-token kernels (4.7 → 1.9 ns per Q4_1 block on AVX-512).

/// A SIMD module's row-range entry point, written once and expanded inside each module's `imp`
/// (where its `Format`, `dot` and block formats are in scope): `dot_group_rows` runs
/// `dot::<F, R, N>` over consecutive rows, `R` rows per call for a group of `N` tokens
/// (`rows_per_pass` maps each group size the module takes, 1 to its [`Isa::token_group`], to
/// its `R`).
macro_rules! row_range_kernels {
    ($features:literal, rows_per_pass: {$($n:literal => $r:literal),+ $(,)?}) => {
        /// [`dot`] for every row of `range`, `R` rows per call (the last `count % R` one at a
        /// time), row `i`'s result for token `t` to `out[t * token_stride + i]`.
        #[target_feature(enable = $features)]
        unsafe fn dot_rows<F: Format, const R: usize, const N: usize>(
            range: RowRange,
            group: &GroupInput<'_>,
        ) {
            let whole = range.count / R * R;
            dot_row_span::<F, R, N>(range, group, 0..whole);
            dot_row_span::<F, 1, N>(range, group, whole..range.count);
        }

        /// [`dot`] for rows `rows` of `range` (a multiple of `R` of them), `R` per call.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn dot_row_span<F: Format, const R: usize, const N: usize>(
            range: RowRange,
            group: &GroupInput<'_>,
            rows: std::ops::Range<usize>,
        ) {
            let blocks = group.cols / QK;
            let (row_stride, scale_stride) = (blocks * F::BLOCK_BYTES, blocks * F::SCALES);
            let mut res = [[0f32; MAX_GROUP]; R];
            for first in rows.step_by(R) {
                dot::<F, R, N>(
                    range.rows.add(first * row_stride),
                    row_stride,
                    range.scales.add(first * scale_stride),
                    scale_stride,
                    group,
                    &mut res,
                );
                for (r, row_res) in res.iter().enumerate() {
                    for (t, v) in row_res.iter().enumerate().take(N) {
                        *range.out.add(t * range.token_stride + first + r) = *v;
                    }
                }
            }
        }

        /// [`dot_rows`] for a group of `n` tokens (a size `rows_per_pass` lists).
        #[target_feature(enable = $features)]
        unsafe fn dot_rows_of<F: Format>(n: usize, range: RowRange, group: &GroupInput<'_>) {
            match n {
                $($n => dot_rows::<F, $r, $n>(range, group),)+
                _ => unreachable!("a group of {n} tokens is past this instruction set's group"),
            }
        }

        /// `out[t * token_stride + i] = row_i · x[t]` for the first `n` tokens of `group` and
        /// every row of `range`.
        ///
        /// # Safety
        /// The module's instruction set must be available, and `range` must describe real
        /// memory as [`RowRange`] says for `dtype`, `group` and `n` (see `RowRange::new`).
        pub(crate) unsafe fn dot_group_rows(
            dtype: WeightType,
            range: RowRange,
            group: &GroupInput<'_>,
            n: usize,
        ) {
            match dtype {
                WeightType::F32 => dot_rows_of::<F32>(n, range, group),
                WeightType::F16 => dot_rows_of::<F16>(n, range, group),
                WeightType::BF16 => dot_rows_of::<Bf16>(n, range, group),
                WeightType::Q8_0 => dot_rows_of::<Q8_0>(n, range, group),
                WeightType::Q4_0 => dot_rows_of::<Q4_0>(n, range, group),
                WeightType::Q4_1 => dot_rows_of::<Q4_1>(n, range, group),
            }
        }
    };
}
use row_range_kernels;

mod avx2;
mod avx512;
mod scalar;

use std::ops::Range;

use crate::model::{WeightMatrix, WeightType, QK};

/// The most tokens any instruction set's kernels take per decode of a weight row (the size of
/// their result arrays); each set's own limit is [`Isa::token_group`].
pub(crate) const MAX_GROUP: usize = 16;

/// Instruction set the kernels use; fixed per backend so results never mix paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F and AVX-512VL (+ AVX2, FMA, F16C), x86-64, runtime-detected.
    Avx512,
    /// AVX2 + FMA + F16C (x86-64, runtime-detected).
    Avx2,
    /// Portable code (auto-vectorized where the compiler can).
    Scalar,
}

impl Isa {
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Scalar];

    /// Of `candidates`, those this CPU runs; each other one is recorded as not run by `test`
    /// ([`record_skipped`]), so the suite's summary names it instead of staying green in
    /// silence on a machine without it.
    pub fn testable(candidates: &[Isa], test: &str) -> Vec<Isa> {
        candidates
            .iter()
            .copied()
            .filter(|isa| {
                let runs = isa.is_supported();
                if !runs {
                    record_skipped(*isa, test);
                }
                runs
            })
            .collect()
    }

    /// The best instruction set this CPU supports.
    pub fn detect() -> Self {
        if Self::Avx512.is_supported() {
            Isa::Avx512
        } else if Self::Avx2.is_supported() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }

    pub fn is_supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            match self {
                Isa::Avx512 => avx2 && has!("avx512f") && has!("avx512vl"),
                Isa::Avx2 => avx2,
                Isa::Scalar => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Scalar
        }
    }

    /// Tokens that share one decode of a weight row: a larger group spreads each block's
    /// decode over more tokens, as far as the accumulators fit in registers (AVX-512 has 32,
    /// AVX2 16). A token's result does not depend on the group (see the module doc).
    pub fn token_group(self) -> usize {
        match self {
            Isa::Avx512 => 12,
            Isa::Avx2 | Isa::Scalar => 8,
        }
    }

    /// `requested` if this CPU supports it, otherwise the best detected one.
    pub fn supported_or_detect(requested: Option<Isa>) -> Self {
        match requested {
            Some(isa) if isa.is_supported() => isa,
            _ => Self::detect(),
        }
    }
}

impl std::str::FromStr for Isa {
    type Err = String;

    /// Parses `avx512`, `avx2` or `scalar` (any case).
    fn from_str(name: &str) -> Result<Self, String> {
        match name.to_ascii_lowercase().as_str() {
            "avx512" => Ok(Isa::Avx512),
            "avx2" => Ok(Isa::Avx2),
            "scalar" => Ok(Isa::Scalar),
            _ => Err(format!("unknown ISA {name:?}: avx512, avx2 or scalar")),
        }
    }
}

/// Per-token sums of each 32-element block of `x` (`[tokens, cols / 32]`, `cols` a multiple of
/// 32); Q4_1's minimum term needs them.
pub(crate) fn block_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(QK).map(sum_block).collect()
}

fn sum_block(block: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    for chunk in block.chunks_exact(8) {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *l += v;
        }
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// The instruction set used for this matrix: SIMD paths need whole 32-element blocks per row.
fn isa_for(isa: Isa, w: &WeightMatrix) -> Isa {
    if w.cols.is_multiple_of(QK) {
        isa
    } else {
        Isa::Scalar
    }
}

/// Where a call's results go: columns `0..rows` of a `[tokens, token_stride]` matrix (row `r`'s
/// result for token `t` at `ptr[t * token_stride + r]`), so parallel calls on disjoint row
/// ranges fill one `[tokens, rows]` output in place, with no transposing pass.
#[derive(Clone, Copy)]
pub(crate) struct OutColumns {
    pub ptr: *mut f32,
    pub token_stride: usize,
}

/// Every row of `W · xᵀ` for `tokens` tokens into `out` (`[tokens, w.rows]`): the safe entry
/// the kernel tests and probes use.
#[cfg(test)]
pub(crate) fn matmul_all_rows(
    isa: Isa,
    w: &WeightMatrix,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
) {
    assert_eq!(out.len(), w.rows * tokens, "output shape");
    let out = OutColumns {
        ptr: out.as_mut_ptr(),
        token_stride: w.rows,
    };
    // SAFETY: `out` is exactly `[tokens, w.rows]` and borrowed exclusively.
    unsafe { matmul_rows_into(isa, w, 0..w.rows, x, &block_sums(x), tokens, out) }
}

/// Computes rows `rows` of `W · xᵀ` for `tokens` tokens: `x` is `[tokens, cols]`, `sums` is
/// [`block_sums`] of `x` (only read for Q4_1); row `r`'s result for token `t` goes to
/// `out[t * token_stride + r - rows.start]`.
///
/// # Safety
/// `out` must point to `tokens` rows of `out.token_stride >= rows.len()` f32s whose first
/// `rows.len()` columns are writable and not accessed by anything else during the call.
pub(crate) unsafe fn matmul_rows_into(
    isa: Isa,
    w: &WeightMatrix,
    rows: Range<usize>,
    x: &[f32],
    sums: &[f32],
    tokens: usize,
    out: OutColumns,
) {
    let cols = w.cols;
    assert_eq!(x.len(), tokens * cols);
    assert!(rows.len() <= out.token_stride, "output columns");
    let isa = isa_for(isa, w);
    let rb = w.row_bytes();
    let row_bytes = &w.bytes()[rows.start * rb..rows.end * rb];
    let scales_per_row = w.dtype.scales_per_block() * (cols / QK);
    // Only the SIMD paths read the f32 scales; the portable one never makes them.
    let row_scales = || &w.block_scales()[rows.start * scales_per_row..rows.end * scales_per_row];
    let mut scratch = Vec::new();
    let mut start = 0;
    while start < tokens {
        let n = (tokens - start).min(isa.token_group());
        let group = GroupInput {
            x: &x[start * cols..(start + n) * cols],
            sums: if w.dtype == WeightType::Q4_1 {
                &sums[start * (cols / QK)..(start + n) * (cols / QK)]
            } else {
                &[]
            },
            cols,
        };
        // The group's first token's row of the output.
        let group_out = OutColumns {
            ptr: out.ptr.add(start * out.token_stride),
            token_stride: out.token_stride,
        };
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx2 => {
                let range = RowRange::new(w.dtype, row_bytes, row_scales(), &group, n, group_out);
                // SAFETY: the ISA was detected at backend construction (`isa_for` keeps it only
                // for whole blocks), `RowRange::new` checked the input lengths, and the caller
                // vouches for the output.
                if isa == Isa::Avx512 {
                    avx512::dot_group_rows(w.dtype, range, &group, n)
                } else {
                    avx2::dot_group_rows(w.dtype, range, &group, n)
                }
            }
            _ => {
                for (i, row) in row_bytes.chunks_exact(rb).enumerate() {
                    let mut res = [0f32; MAX_GROUP];
                    scalar::dot_group(w.dtype, row, &group, n, &mut res, &mut scratch);
                    for (t, r) in res.iter().enumerate().take(n) {
                        // SAFETY: token `t < n` of the group and column `i < rows.len()`, both
                        // inside the output the caller vouches for.
                        *group_out.ptr.add(t * group_out.token_stride + i) = *r;
                    }
                }
            }
        }
        start += n;
    }
}

/// Consecutive weight rows for the SIMD kernels: `count` rows of one matrix from `rows`, their
/// block scales from `scales`, row `i`'s result for token `t` to `out[t * token_stride + i]`.
#[derive(Clone, Copy)]
pub(crate) struct RowRange {
    rows: *const u8,
    count: usize,
    scales: *const f32,
    out: *mut f32,
    token_stride: usize,
}

impl RowRange {
    /// The range over `rows` (whole rows of `dtype`), `scales` and `out`, after checking the
    /// input shapes the SIMD `dot_group_rows` relies on: `n` tokens in the group, whole rows
    /// with their scales, and an output row wide enough for every row (the output memory
    /// itself is the caller's promise, see [`matmul_rows_into`]).
    #[cfg(target_arch = "x86_64")]
    fn new(
        dtype: WeightType,
        rows: &[u8],
        scales: &[f32],
        group: &GroupInput<'_>,
        n: usize,
        out: OutColumns,
    ) -> Self {
        let row_bytes = dtype.row_bytes(group.cols);
        let count = rows.len() / row_bytes;
        assert!(
            (1..=MAX_GROUP).contains(&n)
                && group.cols.is_multiple_of(QK)
                && group.x.len() >= n * group.cols
                && rows.len() == count * row_bytes
                && scales.len() == count * dtype.scales_per_block() * (group.cols / QK)
                && count <= out.token_stride,
            "row-dot shapes"
        );
        Self {
            rows: rows.as_ptr(),
            count,
            scales: scales.as_ptr(),
            out: out.ptr,
            token_stride: out.token_stride,
        }
    }
}

/// A group of up to [`MAX_GROUP`] tokens' activations.
pub(crate) struct GroupInput<'a> {
    /// `[n, cols]`.
    pub x: &'a [f32],
    /// `[n, cols / 32]` (Q4_1 only, else empty).
    pub sums: &'a [f32],
    pub cols: usize,
}

/// f32 dot product with a fixed 8-lane order (auto-vectorized; the lane order makes the result
/// the same whatever vector width the compiler picks).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let split = a.len() / 8 * 8;
    for (ca, cb) in a[..split].chunks_exact(8).zip(b[..split].chunks_exact(8)) {
        for i in 0..8 {
            lanes[i] += ca[i] * cb[i];
        }
    }
    let mut total = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (x, y) in a[split..].iter().zip(&b[split..]) {
        total += x * y;
    }
    total
}

#[cfg(test)]
pub(crate) mod tests;

/// Where tests record the kernel variants this machine could not run: the file named by
/// `SPECULA_SKIPPED_KERNELS` (`scripts/test.sh` sets it and prints the list at the end of the
/// suite), one `variant<TAB>test` line each; always also on stderr.
pub fn record_skipped(isa: Isa, test: &str) {
    eprintln!("{isa:?} kernels not run by {test}: this CPU lacks them");
    let Some(path) = std::env::var_os("SPECULA_SKIPPED_KERNELS") else {
        return;
    };
    use std::io::Write;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    if let Ok(mut file) = file {
        // One short write per line: appends from parallel tests do not interleave.
        let _ = file.write_all(format!("{isa:?}\t{test}\n").as_bytes());
    }
}

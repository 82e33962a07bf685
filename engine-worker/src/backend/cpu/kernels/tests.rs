use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::backend::cpu::aligned::LineAligned;
use crate::model::{quantize_row, WeightMatrix, WeightType};

fn supported_isas() -> Vec<Isa> {
    Isa::testable(&Isa::ALL, "backend::cpu::kernels::tests")
}

const TYPES: [WeightType; 6] = [
    WeightType::F32,
    WeightType::F16,
    WeightType::BF16,
    WeightType::Q8_0,
    WeightType::Q4_0,
    WeightType::Q4_1,
];

pub(crate) fn random_matrix(
    dtype: WeightType,
    rows: usize,
    cols: usize,
    rng: &mut ChaCha8Rng,
) -> WeightMatrix {
    let mut data = Vec::new();
    for _ in 0..rows {
        let values: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        quantize_row(dtype, &values, &mut data);
    }
    WeightMatrix::owned("w", dtype, rows, cols, data).unwrap()
}

fn reference(w: &WeightMatrix, x: &[f32], tokens: usize) -> Vec<f64> {
    let dense = w.to_f32();
    let mut out = vec![0.0; tokens * w.rows]; // [tokens, rows]
    for r in 0..w.rows {
        for t in 0..tokens {
            out[t * w.rows + r] = (0..w.cols)
                .map(|c| f64::from(dense[r * w.cols + c]) * f64::from(x[t * w.cols + c]))
                .sum();
        }
    }
    out
}

#[test]
fn kernels_match_the_dequantized_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    // Rows that do not divide into the multi-row passes, more tokens than two groups.
    let (rows, cols, tokens) = (21, 96, 27);
    for isa in supported_isas() {
        for dtype in TYPES {
            let w = random_matrix(dtype, rows, cols, &mut rng);
            let x: Vec<f32> = (0..tokens * cols)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let mut out = vec![0.0; rows * tokens];
            matmul_all_rows(isa, &w, &x, tokens, &mut out);
            for (got, want) in out.iter().zip(reference(&w, &x, tokens)) {
                assert!(
                    (f64::from(*got) - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{isa:?} {dtype}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn a_tokens_result_does_not_depend_on_its_group() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (rows, cols) = (19, 160);
    for isa in supported_isas() {
        for dtype in TYPES {
            let w = random_matrix(dtype, rows, cols, &mut rng);
            // Past two groups on every instruction set (8 tokens on AVX2, 12 on AVX-512).
            let tokens = 30;
            let x: Vec<f32> = (0..tokens * cols)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let mut all = vec![0.0; rows * tokens];
            matmul_all_rows(isa, &w, &x, tokens, &mut all);
            for t in 0..tokens {
                let xt = &x[t * cols..(t + 1) * cols];
                let mut one = vec![0.0; rows];
                matmul_all_rows(isa, &w, xt, 1, &mut one);
                for r in 0..rows {
                    assert_eq!(
                        one[r].to_bits(),
                        all[t * rows + r].to_bits(),
                        "{isa:?} {dtype}"
                    );
                }
            }
        }
    }
}

/// The AVX-512 kernels take 1 to 4 rows per pass (the rest one at a time), by group size: a
/// row's result must not depend on which rows share its pass.
#[test]
fn a_rows_result_does_not_depend_on_the_rows_beside_it() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (rows, cols) = (39, 96);
    for isa in supported_isas() {
        for dtype in TYPES {
            let w = random_matrix(dtype, rows, cols, &mut rng);
            for tokens in [1, 3, 8, 11, 12, 14, 25] {
                let x: Vec<f32> = (0..tokens * cols)
                    .map(|_| rng.gen_range(-2.0..2.0))
                    .collect();
                let mut all = vec![0.0; rows * tokens];
                matmul_all_rows(isa, &w, &x, tokens, &mut all);
                for r in 0..rows {
                    let mut alone = vec![0.0; tokens];
                    let out = OutColumns {
                        ptr: alone.as_mut_ptr(),
                        token_stride: 1,
                    };
                    // SAFETY: `alone` is exactly `[tokens, 1]` and borrowed exclusively.
                    unsafe {
                        matmul_rows_into(isa, &w, r..r + 1, &x, &block_sums(&x), tokens, out)
                    };
                    for t in 0..tokens {
                        assert_eq!(
                            alone[t].to_bits(),
                            all[t * rows + r].to_bits(),
                            "{isa:?} {dtype} row {r} of {tokens} tokens"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn float_rows_not_a_multiple_of_32_use_the_portable_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let w = random_matrix(WeightType::F16, 4, 20, &mut rng);
    let x: Vec<f32> = (0..40).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut out = vec![0.0; 8];
    matmul_all_rows(Isa::detect(), &w, &x, 2, &mut out);
    for (got, want) in out.iter().zip(reference(&w, &x, 2)) {
        assert!((f64::from(*got) - want).abs() < 1e-4);
    }
}

/// Kernel cost probe (not a correctness test): `cargo test --release -p engine-worker --lib
/// kernel_throughput -- --ignored --nocapture`. One thread, weights past L2 (8 matrices of the
/// model's shapes); per token count the fastest of several runs, since a disturbed run is only
/// ever slower.
#[test]
#[ignore]
fn kernel_throughput() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for (dtype, rows, cols) in [
        (WeightType::Q4_1, 1536, 576),
        (WeightType::Q4_1, 576, 1536),
        (WeightType::Q8_0, 1536, 576),
    ] {
        let ws: Vec<WeightMatrix> = (0..8)
            .map(|_| random_matrix(dtype, rows, cols, &mut rng))
            .collect();
        for isa in supported_isas().into_iter().filter(|&i| i != Isa::Scalar) {
            let mut one_token_ns = 0.0;
            for tokens in [1, 8, 9, 12, 16, 20, 24, 40] {
                let xs: Vec<f32> = (0..tokens * cols)
                    .map(|_| rng.gen_range(-1.0..1.0))
                    .collect();
                // On a cache line, as `matmul` hands it to the kernels.
                let aligned = LineAligned::new(&xs);
                let x = aligned.as_slice();
                let mut out = vec![0.0; rows * tokens];
                let mut fastest = f64::INFINITY;
                for _ in 0..9 {
                    let start = std::time::Instant::now();
                    for w in &ws {
                        matmul_all_rows(isa, w, x, tokens, &mut out);
                    }
                    fastest = fastest.min(start.elapsed().as_secs_f64());
                }
                let blocks = (ws.len() * rows * cols / 32) as f64;
                let per_block_ns = fastest * 1e9 / blocks;
                if tokens == 1 {
                    one_token_ns = per_block_ns;
                }
                println!(
                    "{dtype} {rows}x{cols} {isa:?} tokens {tokens:2}: {:.2} ns/block/token, \
                     {:.2} ns/block per token past the first",
                    per_block_ns / tokens as f64,
                    (per_block_ns - one_token_ns) / (tokens as f64 - 1.0).max(1.0),
                );
            }
        }
    }
}

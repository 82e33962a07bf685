//! Multi-threaded `y = x · Wᵀ` for one or more weight matrices sharing an input: the output
//! rows of all matrices are cut into tasks that rayon spreads over the pool. A row's result
//! does not depend on how rows are split (see `kernels`).
//! The input reaches the kernels on a cache line ([`LineAligned`]).

use rayon::prelude::*;

use super::aligned::LineAligned;
use super::kernels::{block_sums, matmul_rows, Isa};
use crate::model::{WeightMatrix, WeightType};

/// One matrix of a [`matmul`] call and where its result goes (`[tokens, w.rows]`).
pub(crate) struct Job<'a> {
    pub w: &'a WeightMatrix,
    pub out: &'a mut [f32],
}

/// Computes every job's `out = x · wᵀ`; `x` is `[tokens, cols]`, the same for all jobs.
pub(crate) fn matmul(isa: Isa, x: &[f32], tokens: usize, jobs: &mut [Job<'_>]) {
    if tokens == 0 || jobs.is_empty() {
        return;
    }
    let cols = jobs[0].w.cols;
    debug_assert!(jobs
        .iter()
        .all(|j| j.w.cols == cols && j.out.len() == tokens * j.w.rows));
    debug_assert_eq!(x.len(), tokens * cols);
    let aligned = LineAligned::new(x);
    let x = aligned.as_slice();
    let sums = if jobs.iter().any(|j| j.w.dtype == WeightType::Q4_1) {
        block_sums(x)
    } else {
        Vec::new()
    };
    let total_rows: usize = jobs.iter().map(|j| j.w.rows).sum();
    let threads = rayon::current_num_threads().max(1);
    // Enough tasks for load balance, few enough that scheduling stays cheap.
    let rows_per_task = (total_rows / (threads * 8)).clamp(8, 512);

    // Results land row-major per matrix (`[rows, tokens]`), then get transposed; with one
    // token the two layouts coincide and the kernels write in place.
    let mut transposed: Vec<Vec<f32>> = if tokens == 1 {
        Vec::new()
    } else {
        jobs.iter().map(|j| vec![0.0; j.out.len()]).collect()
    };
    {
        let mut tasks = Vec::new();
        if tokens == 1 {
            for job in jobs.iter_mut() {
                let w = job.w;
                for (i, chunk) in job.out.chunks_mut(rows_per_task).enumerate() {
                    tasks.push((w, i * rows_per_task, chunk));
                }
            }
        } else {
            for (job, buf) in jobs.iter().zip(transposed.iter_mut()) {
                for (i, chunk) in buf.chunks_mut(rows_per_task * tokens).enumerate() {
                    tasks.push((job.w, i * rows_per_task, chunk));
                }
            }
        }
        tasks.into_par_iter().for_each(|(w, start, chunk)| {
            let rows = start..start + chunk.len() / tokens;
            matmul_rows(isa, w, rows, x, &sums, tokens, chunk);
        });
    }
    if tokens > 1 {
        for (job, buf) in jobs.iter_mut().zip(&transposed) {
            let rows = job.w.rows;
            for (r, row) in buf.chunks_exact(tokens).enumerate() {
                for (t, v) in row.iter().enumerate() {
                    job.out[t * rows + r] = *v;
                }
            }
        }
    }
}

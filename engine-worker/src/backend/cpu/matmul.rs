//! Multi-threaded `y = x · Wᵀ` for one or more weight matrices sharing an input: the output
//! rows of all matrices are cut into tasks that rayon spreads over the pool. A row's result
//! does not depend on how rows are split (see `kernels`).
//! The input reaches the kernels on a cache line ([`LineAligned`]); the kernels write each
//! task's columns of the `[tokens, rows]` output in place (a separate transposing pass ran on
//! one thread and took about a tenth of a 256-token prefill).

use rayon::prelude::*;

use super::aligned::LineAligned;
use super::kernels::{block_sums, matmul_rows_into, Isa, OutColumns};
use crate::model::{WeightMatrix, WeightType};

/// One matrix of a [`matmul`] call and where its result goes (`[tokens, w.rows]`).
pub(crate) struct Job<'a> {
    pub w: &'a WeightMatrix,
    pub out: &'a mut [f32],
}

/// A task's share of one job: weight rows `start..end`, written to columns `start..end` of the
/// job's output from `out` on.
struct Task<'a> {
    w: &'a WeightMatrix,
    start: usize,
    end: usize,
    out: OutColumns,
}

// SAFETY: a task's `out` points into a job's output, which `matmul` borrows exclusively for the
// whole parallel section, and no two tasks share a column of the same output.
unsafe impl Send for Task<'_> {}

/// Computes every job's `out = x · wᵀ`; `x` is `[tokens, cols]`, the same for all jobs.
pub(crate) fn matmul(isa: Isa, x: &[f32], tokens: usize, jobs: &mut [Job<'_>]) {
    if tokens == 0 || jobs.is_empty() {
        return;
    }
    let cols = jobs[0].w.cols;
    assert!(
        jobs.iter()
            .all(|j| j.w.cols == cols && j.out.len() == tokens * j.w.rows),
        "matmul shapes"
    );
    assert_eq!(x.len(), tokens * cols, "matmul input");
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

    let mut tasks = Vec::new();
    for job in jobs.iter_mut() {
        let (w, base) = (job.w, job.out.as_mut_ptr());
        for start in (0..w.rows).step_by(rows_per_task) {
            tasks.push(Task {
                w,
                start,
                end: (start + rows_per_task).min(w.rows),
                // SAFETY: `start < w.rows`, inside the job's `[tokens, w.rows]` output.
                out: OutColumns {
                    ptr: unsafe { base.add(start) },
                    token_stride: w.rows,
                },
            });
        }
    }
    tasks.into_par_iter().for_each(|task| {
        // SAFETY: the task's columns of its job's output (checked above to be
        // `[tokens, w.rows]`) are its own; see `Task`.
        unsafe {
            matmul_rows_into(
                isa,
                task.w,
                task.start..task.end,
                x,
                &sums,
                tokens,
                task.out,
            )
        }
    });
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::{matmul, Job};
    use crate::backend::cpu::kernels::tests::random_matrix;
    use crate::backend::cpu::kernels::{matmul_all_rows, Isa};
    use crate::model::WeightType;

    /// Tasks write their columns of each job's `[tokens, rows]` output in place: the result of
    /// a split, multi-job, multi-threaded call has the bits of one single-threaded call per job.
    #[test]
    fn split_jobs_fill_each_output_as_one_call_would() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let cols = 64;
        // Row counts that do not divide into the tasks evenly.
        let (a, b) = (
            random_matrix(WeightType::Q4_1, 1000, cols, &mut rng),
            random_matrix(WeightType::Q4_1, 37, cols, &mut rng),
        );
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for tokens in [1, 5, 8, 13, 30] {
            let x: Vec<f32> = (0..tokens * cols)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let (mut out_a, mut out_b) =
                (vec![f32::NAN; tokens * 1000], vec![f32::NAN; tokens * 37]);
            pool.install(|| {
                matmul(
                    Isa::detect(),
                    &x,
                    tokens,
                    &mut [
                        Job {
                            w: &a,
                            out: &mut out_a,
                        },
                        Job {
                            w: &b,
                            out: &mut out_b,
                        },
                    ],
                )
            });
            for (w, got) in [(&a, &out_a), (&b, &out_b)] {
                let mut want = vec![0.0; tokens * w.rows];
                matmul_all_rows(Isa::detect(), w, &x, tokens, &mut want);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "tokens {tokens}, rows {}", w.rows);
            }
        }
    }
}

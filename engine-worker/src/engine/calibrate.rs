//! Measures verify forwards of growing sizes at start, so the drafting policy knows this
//! device's cost curve (`StepCost`) before the first request; every verify forward refines it
//! from then on. A model drafter's forwards are measured the same way, by the sequences they
//! carry.

use std::time::Instant;

use proto::api_worker::SamplingParams;

use crate::backend::{Backend, LogitsFor, SeqForward, TokenChoice};
use crate::kv::{BlockAllocator, BlockTable};
use crate::spec::cost::step_probe_sizes;
use crate::EngineError;

/// Sweeps over the sizes; per size the fastest run counts (a disturbed run is slower, never
/// faster). Whole sweeps, not runs of one size in a row, so that a burst of other work at start
/// (the api-server loading beside the worker) cannot spoil every run of one size.
const SWEEPS: usize = 3;
/// Cached positions before each measured sequence's tokens: attention over a context is part of
/// what a verify token costs (ShareGPT chats run 100–600 positions). A cache too small for it
/// is calibrated without context.
const CONTEXT: usize = 256;

const GREEDY_CHOICE: TokenChoice<'static> = TokenChoice {
    sampling: &SamplingParams::GREEDY,
    seed: 0,
    first_position: 0,
    history: crate::sampling::History::EMPTY,
    masks: &[],
};

/// Token counts measured: doublings from 1 up to the most a verify step carries and, where the
/// backend's kernels work in token groups, one token past the first two group boundaries (the
/// step up a new group costs; see `StepCost`).
fn sizes(max_step_tokens: usize, group: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = std::iter::successors(Some(1usize), |&t| Some(t * 2))
        .take_while(|&t| t < max_step_tokens)
        .collect();
    sizes.extend(
        step_probe_sizes(group)
            .into_iter()
            .filter(|&t| t < max_step_tokens),
    );
    sizes.push(max_step_tokens.max(1));
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// `(tokens, seconds)` of verify-shaped forwards (sequences of K+1 tokens after a context,
/// every row's logits) of up to `max_step_tokens` tokens. Stops at the first size the cache cannot hold or whose
/// forward fails; empty then, the policy starts from a neutral curve.
pub fn calibrate<B: Backend>(
    backend: &mut B,
    alloc: &mut BlockAllocator,
    max_drafts: usize,
    max_step_tokens: usize,
) -> Vec<(usize, f64)> {
    let sizes = sizes(max_step_tokens, backend.token_group());
    let shape = Shape {
        per_seq: max_drafts + 1,
        logits: LogitsFor::All,
    };
    measure(alloc, &sizes, shape, |forwards| {
        let choices = vec![GREEDY_CHOICE; forwards.len()];
        // Timed as the steps are (see `Engine::run_forwards`): forward and verification.
        backend.forward_and_verify(forwards, &choices).map(drop)
    })
}

/// `(sequences, seconds)` of draft forwards (one token per sequence after a context, its logits
/// row), for 1, 2, 4, … up to `max_seqs` sequences, each run by `run`.
pub fn calibrate_draft(
    alloc: &mut BlockAllocator,
    max_seqs: usize,
    group: usize,
    run: impl FnMut(&[SeqForward<'_>]) -> Result<(), EngineError>,
) -> Vec<(usize, f64)> {
    let shape = Shape {
        per_seq: 1,
        logits: LogitsFor::Last,
    };
    measure(alloc, &sizes(max_seqs, group), shape, run)
}

/// The sequences of a measured forward.
#[derive(Clone, Copy)]
struct Shape {
    /// Tokens each sequence carries.
    per_seq: usize,
    logits: LogitsFor,
}

/// Times `run` on forwards of each of `sizes` tokens (fastest of [`SWEEPS`]), in sequences of
/// `shape` after [`CONTEXT`] cached positions where the cache has room for them.
fn measure(
    alloc: &mut BlockAllocator,
    sizes: &[usize],
    shape: Shape,
    mut run: impl FnMut(&[SeqForward<'_>]) -> Result<(), EngineError>,
) -> Vec<(usize, f64)> {
    let per_seq = shape.per_seq;
    let tokens = vec![0u32; per_seq];
    let largest = sizes.last().copied().unwrap_or(1);
    let context =
        if alloc.blocks_for(CONTEXT + per_seq) * largest.div_ceil(per_seq) <= alloc.num_free() {
            CONTEXT
        } else {
            0
        };
    let mut tables: Vec<BlockTable> = Vec::new();
    // Sizes whose sequences all got cache blocks, smallest first.
    let mut fitting = 0;
    for &total in sizes {
        let seqs = total.div_ceil(per_seq);
        while tables.len() < seqs {
            let mut table = BlockTable::default();
            if !table.reserve(alloc, context + per_seq) {
                break;
            }
            tables.push(table);
        }
        if tables.len() < seqs {
            break;
        }
        fitting += 1;
    }
    let mut fastest = vec![f64::INFINITY; fitting];
    'sweeps: for _ in 0..SWEEPS {
        for (i, &total) in sizes[..fitting].iter().enumerate() {
            let forwards: Vec<SeqForward<'_>> = (0..total.div_ceil(per_seq))
                .map(|s| SeqForward {
                    tokens: &tokens[..per_seq.min(total - s * per_seq)],
                    start_pos: context,
                    block_table: tables[s].blocks(),
                    logits: shape.logits,
                })
                .collect();
            let started = Instant::now();
            if run(&forwards).is_err() {
                fastest.truncate(i);
                break 'sweeps;
            }
            fastest[i] = fastest[i].min(started.elapsed().as_secs_f64());
        }
    }
    for mut table in tables {
        table.release_all(alloc);
    }
    sizes.iter().copied().zip(fastest).collect()
}

#[cfg(test)]
mod tests {
    use super::sizes;

    #[test]
    fn sizes_double_up_to_the_step_limit() {
        assert_eq!(sizes(80, 1), vec![1, 2, 4, 8, 16, 32, 64, 80]);
        assert_eq!(sizes(64, 1), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(sizes(1, 1), vec![1]);
        assert_eq!(sizes(0, 1), vec![1]);
    }

    #[test]
    fn token_groups_add_the_sizes_just_past_their_first_two_boundaries() {
        assert_eq!(sizes(80, 8), vec![1, 2, 4, 8, 9, 16, 17, 32, 64, 80]);
        assert_eq!(sizes(12, 8), vec![1, 2, 4, 8, 9, 12]);
        assert_eq!(sizes(9, 8), vec![1, 2, 4, 8, 9]);
    }
}

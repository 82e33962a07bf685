//! Measures verify forwards of a few sizes at start, so the drafting policy knows this device's
//! cost of a forward and of each token in it before the first request (the online fit refines
//! it from then on).

use std::time::Instant;

use crate::backend::{Backend, LogitsFor, SeqForward};
use crate::kv::{BlockAllocator, BlockTable};

/// Total tokens of the measured forwards: one decode step, one verify of K+1, a small batch.
fn sizes(max_drafts: usize) -> [usize; 3] {
    let verify = max_drafts + 1;
    [1, verify, 4 * verify]
}

/// `(tokens, seconds)` of verify-shaped forwards (sequences of up to K+1 tokens, every row's
/// logits), the fastest of two runs each; empty when the cache cannot hold them or a forward
/// fails (the policy then starts from a neutral guess).
pub fn calibrate<B: Backend>(
    backend: &mut B,
    alloc: &mut BlockAllocator,
    max_drafts: usize,
) -> Vec<(usize, f64)> {
    let verify = max_drafts + 1;
    let seqs_needed = sizes(max_drafts)[2].div_ceil(verify);
    let mut tables: Vec<BlockTable> = (0..seqs_needed).map(|_| BlockTable::default()).collect();
    let reserved = tables.iter_mut().all(|t| t.reserve(alloc, verify));
    let mut points = Vec::new();
    if reserved {
        let tokens = vec![0u32; verify];
        'sizes: for total in sizes(max_drafts) {
            let forwards: Vec<SeqForward<'_>> = tables
                .iter()
                .enumerate()
                .map(|(i, t)| (i * verify, t))
                .take_while(|&(start, _)| start < total)
                .map(|(start, table)| SeqForward {
                    tokens: &tokens[..verify.min(total - start)],
                    start_pos: 0,
                    block_table: table.blocks(),
                    logits: LogitsFor::All,
                })
                .collect();
            let mut fastest = f64::INFINITY;
            for _ in 0..2 {
                let started = Instant::now();
                if backend.forward(&forwards).is_err() {
                    break 'sizes;
                }
                fastest = fastest.min(started.elapsed().as_secs_f64());
            }
            points.push((total, fastest));
        }
    }
    for mut table in tables {
        table.release_all(alloc);
    }
    points
}

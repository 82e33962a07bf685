//! Host-side preparation of one forward batch: validation and the per-token metadata the
//! kernels read (token ids, positions, owning sequence, KV slots, padded block tables, logit
//! rows), packed into one `u32` buffer so each step makes a single host-to-device copy.

use crate::backend::{LogitsFor, SeqForward};
use crate::EngineError;

/// Where each array starts in [`BatchMeta::packed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaLayout {
    pub tokens: usize,
    pub rows: usize,
    pub seqs: usize,
    pub max_blocks: usize,
    pub ids: usize,
    pub positions: usize,
    pub token_seq: usize,
    pub slots: usize,
    pub logit_rows: usize,
    pub block_tables: usize,
    pub len: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMeta {
    pub layout: MetaLayout,
    pub packed: Vec<u32>,
}

/// Checks a batch against the model and cache and lays out its metadata.
pub fn prepare(
    seqs: &[SeqForward<'_>],
    vocab_size: usize,
    block_size: usize,
    num_blocks: usize,
) -> Result<BatchMeta, EngineError> {
    let bad = |msg: String| Err(EngineError::InvalidBatch(msg));
    if seqs.is_empty() {
        return bad("empty batch".into());
    }
    let mut tokens = 0usize;
    let mut rows = 0usize;
    let mut max_blocks = 1usize;
    for (i, s) in seqs.iter().enumerate() {
        if s.tokens.is_empty() {
            return bad(format!("sequence {i} has no tokens"));
        }
        if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return bad(format!(
                "sequence {i}: token {t} is outside the vocabulary ({vocab_size})"
            ));
        }
        let end = s.start_pos + s.tokens.len();
        let needed = end.div_ceil(block_size);
        if s.block_table.len() < needed {
            return bad(format!(
                "sequence {i}: {} blocks cannot hold {end} positions of {block_size}",
                s.block_table.len()
            ));
        }
        if let Some(b) = s.block_table[..needed]
            .iter()
            .find(|&&b| b as usize >= num_blocks)
        {
            return bad(format!(
                "sequence {i}: block {b} is outside the cache ({num_blocks})"
            ));
        }
        if end > i32::MAX as usize / 2 {
            return bad(format!("sequence {i}: position {end} is too large"));
        }
        tokens += s.tokens.len();
        rows += s.logit_rows();
        max_blocks = max_blocks.max(needed);
    }
    let ids = 0;
    let positions = ids + tokens;
    let token_seq = positions + tokens;
    let slots = token_seq + tokens;
    let logit_rows = slots + tokens;
    let block_tables = logit_rows + rows;
    let len = block_tables + seqs.len() * max_blocks;
    let layout = MetaLayout {
        tokens,
        rows,
        seqs: seqs.len(),
        max_blocks,
        ids,
        positions,
        token_seq,
        slots,
        logit_rows,
        block_tables,
        len,
    };
    let mut packed = vec![0u32; len];
    let mut t = 0usize;
    let mut r = 0usize;
    for (i, s) in seqs.iter().enumerate() {
        let needed = (s.start_pos + s.tokens.len()).div_ceil(block_size);
        packed[block_tables + i * max_blocks..][..needed].copy_from_slice(&s.block_table[..needed]);
        for (j, &token) in s.tokens.iter().enumerate() {
            let pos = s.start_pos + j;
            packed[ids + t] = token;
            packed[positions + t] = pos as u32;
            packed[token_seq + t] = i as u32;
            packed[slots + t] =
                s.block_table[pos / block_size] * block_size as u32 + (pos % block_size) as u32;
            let wants_row = match s.logits {
                LogitsFor::All => true,
                LogitsFor::Last => j + 1 == s.tokens.len(),
            };
            if wants_row {
                packed[logit_rows + r] = t as u32;
                r += 1;
            }
            t += 1;
        }
    }
    Ok(BatchMeta { layout, packed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lays_out_a_mixed_prefill_and_verify_batch() {
        // Block size 4: a 3-token prompt in block 7, and a verify of 2 tokens at positions 4..6
        // of a sequence whose blocks are [2, 5].
        let seqs = [
            SeqForward::new(&[10, 11, 12], 0, &[7], LogitsFor::Last),
            SeqForward::new(&[20, 21], 4, &[2, 5], LogitsFor::All),
        ];
        let m = prepare(&seqs, 100, 4, 8).unwrap();
        let l = m.layout;
        assert_eq!((l.tokens, l.rows, l.seqs, l.max_blocks), (5, 3, 2, 2));
        let p = &m.packed;
        assert_eq!(&p[l.ids..l.ids + 5], &[10, 11, 12, 20, 21]);
        assert_eq!(&p[l.positions..l.positions + 5], &[0, 1, 2, 4, 5]);
        assert_eq!(&p[l.token_seq..l.token_seq + 5], &[0, 0, 0, 1, 1]);
        assert_eq!(&p[l.slots..l.slots + 5], &[28, 29, 30, 20, 21]);
        assert_eq!(&p[l.logit_rows..l.logit_rows + 3], &[2, 3, 4]);
        assert_eq!(&p[l.block_tables..l.block_tables + 4], &[7, 0, 2, 5]);
    }

    #[test]
    fn rejects_bad_batches() {
        let err = |seqs: &[SeqForward<'_>]| prepare(seqs, 100, 4, 8).unwrap_err().to_string();
        assert!(err(&[]).contains("empty"));
        assert!(err(&[SeqForward::new(&[], 0, &[0], LogitsFor::Last)]).contains("no tokens"));
        assert!(err(&[SeqForward::new(&[100], 0, &[0], LogitsFor::Last)]).contains("vocabulary"));
        assert!(
            err(&[SeqForward::new(&[1, 2, 3], 2, &[0], LogitsFor::Last)]).contains("cannot hold")
        );
        assert!(
            err(&[SeqForward::new(&[1], 0, &[8], LogitsFor::Last)]).contains("outside the cache")
        );
    }
}

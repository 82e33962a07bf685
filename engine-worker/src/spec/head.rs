//! Drafting with an EAGLE-3 head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration
//! of Large Language Models via Training-Time Test", <https://arxiv.org/abs/2503.01840>).
//!
//! The head reads the target's own hidden states: every full target forward captures the
//! residual stream entering three of its layers for each token it runs (no second pass). Head
//! position `p` reads the token at `p + 1` with the target's states at `p` and predicts the
//! token at `p + 2`. After a verdict, the positions whose tokens the target accepted (a
//! prefill's all, a verify chunk's last token and accepted drafts) are pending; the next draft
//! runs them through the head in one catch-up forward, writing the head's KV cache there over
//! whatever the rejected drafts had written (the rollback), and its last row gives the first
//! draft. Each further draft is one batched forward of one token per sequence, reading the
//! head's own output at the previous position. Drafts are drawn as a draft model's are (argmax,
//! or the request's own random stream for that output position) over the draft vocabulary
//! mapped to target ids; the verifier alone decides what is accepted.

use std::collections::HashMap;
use std::time::Instant;

use super::cost::StepCost;
use super::draft_model::{choose, DraftJob};
use super::drafter::{Drafter, TargetRows};
use super::proposer::SeqKey;
use crate::backend::{Backend, HeadForward, HeadInput, LogitsFor, SeqForward};
use crate::model::HeadWeights;
use crate::sampling::{argmax, is_greedy};
use crate::EngineError;

/// Pending positions past which a sequence that does not draft still runs them through the
/// head, so what is kept for it stays bounded.
const FLUSH_PENDING: usize = 16;

/// The target's states for one run of a sequence's positions.
#[derive(Debug, Default)]
struct Rows {
    /// Position of the first row.
    start: usize,
    /// `[rows, width]`.
    data: Vec<f32>,
}

impl Rows {
    fn len(&self, width: usize) -> usize {
        self.data.len() / width
    }

    /// `next` after these rows when it follows them, else in their place.
    fn append(&mut self, next: Rows, width: usize) {
        if !self.data.is_empty() && self.start + self.len(width) == next.start {
            self.data.extend(next.data);
        } else {
            *self = next;
        }
    }
}

#[derive(Debug, Default)]
struct HeadSeq {
    /// Accepted positions the head has not run yet.
    pending: Rows,
    /// The last target forward's rows, until the verdict says which hold.
    unverified: Option<Rows>,
}

/// An EAGLE-3 head drafting for the target it is attached to.
#[derive(Debug)]
pub struct HeadDrafter {
    name: String,
    /// Target id of each draft id.
    draft_to_target: Vec<u32>,
    vocab_size: usize,
    hidden_size: usize,
    /// Values per captured target row (three states side by side).
    width: usize,
    seqs: HashMap<SeqKey, HeadSeq>,
    cost: StepCost,
}

impl HeadDrafter {
    /// Attaches `head` to `target` (its states captured from now on).
    pub fn new(
        head: HeadWeights,
        target: &mut dyn Backend,
        cost: StepCost,
    ) -> Result<Self, EngineError> {
        let c = &head.config;
        let drafter = Self {
            name: format!("head:{}", c.name),
            draft_to_target: head.draft_to_target.clone(),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            width: c.aux_layers.len() * c.target_hidden_size,
            seqs: HashMap::new(),
            cost,
        };
        target.capture_hidden(&c.aux_layers)?;
        target.attach_draft_head(head)?;
        Ok(drafter)
    }

    /// The draft token at output index `position` from a row of draft-vocabulary logits.
    fn pick(&self, row: &[f32], job: &DraftJob<'_>, position: usize) -> u32 {
        if is_greedy(job.sampling) {
            return self.draft_to_target[argmax(row) as usize];
        }
        let mut full = vec![f32::NEG_INFINITY; self.vocab_size];
        for (&logit, &t) in row.iter().zip(&self.draft_to_target) {
            full[t as usize] = logit;
        }
        choose(&full, job.sampling, job.seed, position)
    }

    /// Runs the head once and learns what it cost when every sequence ran one token.
    fn forward(
        &mut self,
        target: &mut dyn Backend,
        seqs: &[HeadForward<'_>],
    ) -> Result<crate::backend::HeadOutput, EngineError> {
        let started = Instant::now();
        let out = target.head_forward(seqs)?;
        if seqs.iter().all(|s| s.tokens.len() == 1) {
            self.cost
                .observe(seqs.len(), started.elapsed().as_secs_f64());
        }
        let rows: usize = seqs
            .iter()
            .map(|s| match s.logits {
                LogitsFor::Last => 1,
                LogitsFor::All => s.tokens.len(),
            })
            .sum();
        if out.hidden.len() != rows * self.hidden_size {
            return Err(EngineError::InvalidBatch(format!(
                "draft head returned {} state values for {rows} rows",
                out.hidden.len()
            )));
        }
        Ok(out)
    }
}

impl Drafter for HeadDrafter {
    fn name(&self) -> &str {
        &self.name
    }

    fn cost(&self) -> &StepCost {
        &self.cost
    }

    fn set_cost(&mut self, cost: StepCost) {
        self.cost = cost;
    }

    fn kv_cache_bytes(&self, target: &dyn Backend) -> u64 {
        target.head_kv_cache_bytes()
    }

    fn tracked(&self) -> usize {
        self.seqs.len()
    }

    fn catch_up(&mut self, seq: SeqKey, _tokens: &[u32], _table: &[u32]) -> usize {
        let width = self.width;
        self.seqs
            .get(&seq)
            .map_or(0, |s| s.pending.len(width).saturating_sub(1))
    }

    fn draft(
        &mut self,
        target: &mut dyn Backend,
        jobs: &[DraftJob<'_>],
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        let width = self.width;
        let mut drafts: Vec<Vec<u32>> = jobs.iter().map(|j| Vec::with_capacity(j.drafts)).collect();
        // Catch-up: each job's pending positions, with the tokens after them (all known: the
        // last pending position is the one before the sequence's last token).
        let pending: Vec<Rows> = jobs
            .iter()
            .map(|j| {
                let state = self.seqs.entry(j.seq).or_default();
                let rows = std::mem::take(&mut state.pending);
                let n = rows.len(width);
                if j.drafts == 0 && n < FLUSH_PENDING {
                    state.pending = rows; // runs with the next draft
                    return Rows::default();
                }
                match n > 0 && rows.start + n + 1 == j.tokens.len() {
                    true => rows,
                    // States not reaching the last token (lost to a preemption): the head
                    // drafts from the cache it has.
                    false => Rows::default(),
                }
            })
            .collect();
        let catch_up: Vec<(usize, HeadForward<'_>)> = jobs
            .iter()
            .zip(&pending)
            .enumerate()
            .filter(|(_, (_, rows))| !rows.data.is_empty())
            .map(|(i, (j, rows))| {
                let n = rows.len(width);
                let fwd = HeadForward {
                    tokens: &j.tokens[rows.start + 1..rows.start + n + 1],
                    start_pos: rows.start,
                    block_table: j.block_table,
                    input: HeadInput::Target(&rows.data),
                    logits: LogitsFor::Last,
                };
                (i, fwd)
            })
            .collect();
        if catch_up.is_empty() {
            return Ok(drafts);
        }
        let forwards: Vec<HeadForward<'_>> = catch_up.iter().map(|(_, f)| *f).collect();
        let out = self.forward(target, &forwards)?;
        let dv = self.draft_to_target.len();
        // Per job drafting on: its last state and the position its next draft runs at.
        let mut state: Vec<Option<(Vec<f32>, usize)>> = vec![None; jobs.len()];
        for (r, (i, fwd)) in catch_up.iter().enumerate() {
            let job = &jobs[*i];
            if job.drafts == 0 {
                continue;
            }
            let row = &out.logits[r * dv..(r + 1) * dv];
            drafts[*i].push(self.pick(row, job, job.first_position));
            let h = out.hidden[r * self.hidden_size..(r + 1) * self.hidden_size].to_vec();
            state[*i] = Some((h, fwd.start_pos + fwd.tokens.len()));
        }
        let depth = jobs.iter().map(|j| j.drafts).max().unwrap_or(0);
        for k in 1..depth {
            let active: Vec<usize> = (0..jobs.len())
                .filter(|&i| jobs[i].drafts > k && state[i].is_some())
                .collect();
            if active.is_empty() {
                break;
            }
            let forwards: Vec<HeadForward<'_>> = active
                .iter()
                .map(|&i| {
                    let (h, pos) = state[i].as_ref().expect("active");
                    HeadForward {
                        tokens: std::slice::from_ref(drafts[i].last().expect("drafted")),
                        start_pos: *pos,
                        block_table: jobs[i].block_table,
                        input: HeadInput::Own(h),
                        logits: LogitsFor::Last,
                    }
                })
                .collect();
            let out = self.forward(target, &forwards)?;
            for (r, &i) in active.iter().enumerate() {
                let job = &jobs[i];
                let row = &out.logits[r * dv..(r + 1) * dv];
                let token = self.pick(row, job, job.first_position + k);
                drafts[i].push(token);
                let h = out.hidden[r * self.hidden_size..(r + 1) * self.hidden_size].to_vec();
                let pos = state[i].as_ref().expect("active").1 + 1;
                state[i] = Some((h, pos));
            }
        }
        Ok(drafts)
    }

    fn target_forward(&mut self, target: &mut dyn Backend, rows: &[TargetRows]) {
        let hidden = target.take_hidden();
        let width = self.width;
        let total: usize = rows.iter().map(|r| r.len).sum();
        if hidden.len() != total * width {
            // Not a forward that captured (nothing to take): the head drafts from older states.
            return;
        }
        let mut offset = 0;
        for r in rows {
            let data = hidden[offset * width..(offset + r.len) * width].to_vec();
            offset += r.len;
            let state = self.seqs.entry(r.seq).or_default();
            let rows = Rows {
                start: r.start_pos,
                data,
            };
            match r.settled {
                true => state.pending.append(rows, width),
                false => state.unverified = Some(rows),
            }
        }
    }

    fn verified(
        &mut self,
        seq: SeqKey,
        _tokens: &[u32],
        _table: &[u32],
        len_before: usize,
        _drafted: usize,
        accepted: usize,
    ) {
        let width = self.width;
        let Some(state) = self.seqs.get_mut(&seq) else {
            return;
        };
        let Some(mut rows) = state.unverified.take() else {
            return;
        };
        // A row holds where its input token is the sequence's: every position before the last
        // token as it was, and the accepted drafts'.
        let valid_end = len_before + accepted;
        let keep = valid_end.saturating_sub(rows.start).min(rows.len(width));
        rows.data.truncate(keep * width);
        state.pending.append(rows, width);
    }

    fn preempted(&mut self, seq: SeqKey) {
        // Its recompute captures the states again.
        self.seqs.remove(&seq);
    }

    fn forget(&mut self, seq: SeqKey) {
        self.seqs.remove(&seq);
    }

    fn reads_target_states(&self) -> bool {
        true
    }

    fn token_group(&self, target: &dyn Backend) -> usize {
        target.token_group()
    }

    fn calibration_forward(
        &mut self,
        target: &mut dyn Backend,
        forwards: &[SeqForward<'_>],
    ) -> Result<(), EngineError> {
        let zeros = vec![0f32; self.hidden_size];
        let seqs: Vec<HeadForward<'_>> = forwards
            .iter()
            .map(|f| HeadForward {
                tokens: &f.tokens[..1],
                start_pos: f.start_pos,
                block_table: f.block_table,
                input: HeadInput::Own(&zeros),
                logits: LogitsFor::Last,
            })
            .collect();
        target.head_forward(&seqs).map(drop)
    }
}

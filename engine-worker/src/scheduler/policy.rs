//! The scheduling policy: which sequences run this step and which wait or get preempted.

use std::collections::VecDeque;

use proto::RequestId;

use super::{Sequence, SequencePhase};
use crate::kv::BlockAllocator;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens one step's forward passes may carry (prompt tokens plus K+1 per verify).
    pub max_num_batched_tokens: usize,
    /// Most positions (prompt plus output) a sequence may reach.
    pub max_model_len: usize,
    /// K: draft tokens a verify step may carry.
    pub num_spec_tokens: usize,
    /// Share the cached full blocks of earlier prompts with new requests that start alike.
    pub prefix_caching: bool,
    /// Compute the last matched cached block again (vLLM's rule for EAGLE): a draft head's
    /// cache at a position depends on the next token too, and reads the target's states, which
    /// only a forward gives; the blocks before it are exact for the new sequence.
    pub recompute_last_cached_block: bool,
}

/// The outcome of [`Scheduler::schedule`]: every sequence left in `running` runs this step.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Sequences preempted (recompute) this step, now at the front of the waiting queue.
    pub preempted: Vec<RequestId>,
    /// Sequences moved from waiting to running this step.
    pub admitted: usize,
}

/// Prompt tokens admitted, and how many of them came from the prefix cache.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub queried_tokens: u64,
    pub hit_tokens: u64,
}

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    alloc: BlockAllocator,
    waiting: VecDeque<Sequence>,
    /// In admission order: the newest sequence is preempted first.
    running: Vec<Sequence>,
    prefix_stats: PrefixCacheStats,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, alloc: BlockAllocator) -> Self {
        Self {
            cfg,
            alloc,
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefix_stats: PrefixCacheStats::default(),
        }
    }

    pub fn prefix_stats(&self) -> PrefixCacheStats {
        self.prefix_stats
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn allocator(&self) -> &BlockAllocator {
        &self.alloc
    }

    pub fn waiting(&self) -> &VecDeque<Sequence> {
        &self.waiting
    }

    pub fn waiting_mut(&mut self) -> impl Iterator<Item = &mut Sequence> {
        self.waiting.iter_mut()
    }

    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    pub fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    pub fn num_unfinished(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.running.iter().any(|s| s.id == id) || self.waiting.iter().any(|s| s.id == id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Sequence> {
        self.running.iter().chain(self.waiting.iter())
    }

    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Most draft tokens `seq` may carry this step: K, but never past the model length nor past
    /// the last token `max_tokens` allows (the bonus token comes on top of the drafts).
    pub fn max_drafts(&self, seq: &Sequence) -> usize {
        let room_in_model = self.cfg.max_model_len.saturating_sub(seq.len());
        let room_in_output = seq.max_tokens.saturating_sub(seq.num_generated() + 1);
        self.cfg
            .num_spec_tokens
            .min(room_in_model)
            .min(room_in_output)
    }

    /// Positions whose cache slots `seq` needs this step, and the tokens its forward carries when
    /// its first `computed` positions are cached.
    fn demand(&self, seq: &Sequence, computed: usize) -> (usize, usize) {
        match seq.phase() {
            SequencePhase::Prefill => (seq.prompt_len, seq.prompt_len - computed),
            SequencePhase::Recompute | SequencePhase::Verify => {
                let drafts = self.max_drafts(seq);
                // The cached positions, then the rest up to the last token, then the drafts.
                (seq.len() + drafts, seq.len() - computed + drafts)
            }
        }
    }

    /// Cached blocks that hold the start of a waiting sequence's tokens. Its last token is
    /// always computed: a new prompt's logits are the first output, a resumed sequence's last
    /// token starts its verify step.
    fn cached_prefix(&self, seq: &Sequence) -> Vec<u32> {
        if !self.cfg.prefix_caching || !seq.blocks.is_empty() {
            return Vec::new();
        }
        // Prompt logprobs need a logits row at every prompt position: compute them all.
        if !seq.prefilled && seq.sampling.prompt_logprobs.is_some() {
            return Vec::new();
        }
        let reusable = if seq.prefilled {
            seq.len() - 1
        } else {
            seq.prompt_len - 1
        };
        let block_size = self.alloc.block_size();
        let mut cached = self
            .alloc
            .lookup(&seq.tokens[..reusable], reusable / block_size);
        if self.cfg.recompute_last_cached_block {
            cached.pop();
        }
        cached
    }

    pub fn schedule(&mut self) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut i = 0;
        while i < self.running.len() {
            let (positions, tokens) = self.demand(&self.running[i], self.running[i].num_computed);
            let seq = &mut self.running[i];
            if seq.blocks.reserve(&mut self.alloc, positions) {
                budget = budget.saturating_sub(tokens);
                i += 1;
                continue;
            }
            // Out of blocks: recompute the newest sequence later (possibly this one).
            let mut victim = self.running.pop().expect("index i is in range");
            victim.blocks.release_all(&mut self.alloc);
            victim.num_computed = 0;
            victim.offered_blocks = 0;
            victim.offered_link = None;
            plan.preempted.push(victim.id);
            self.waiting.push_front(victim);
        }
        // Admitting right after a preemption would only thrash.
        if !plan.preempted.is_empty() {
            return plan;
        }
        // In queue order, passing over sequences whose grammar still compiles off the loop
        // (they keep their place for the next step).
        while let Some(next) = self.waiting.iter().position(|s| s.grammar_job.is_none()) {
            if self.running.len() >= self.cfg.max_num_seqs {
                break;
            }
            let front = &self.waiting[next];
            let cached = self.cached_prefix(front);
            let computed = cached.len() * self.alloc.block_size();
            let (positions, tokens) = self.demand(front, computed);
            // A prompt larger than the whole budget still runs, alone, rather than never.
            let alone = budget == self.cfg.max_num_batched_tokens;
            if tokens > budget && !alone {
                break;
            }
            // Cached blocks no table holds count as free until this sequence takes them.
            let reclaimed = cached
                .iter()
                .filter(|&&b| !self.alloc.is_allocated(b))
                .count();
            let missing = front.blocks.missing_blocks(&self.alloc, positions) - cached.len();
            if missing + reclaimed > self.alloc.num_free() {
                break;
            }
            let mut seq = self.waiting.remove(next).expect("index from position");
            seq.blocks.share_prefix(&mut self.alloc, &cached);
            seq.num_computed = computed;
            let reserved = seq.blocks.reserve(&mut self.alloc, positions);
            assert!(reserved, "free blocks checked above");
            if !seq.prefilled {
                seq.cached_prompt_tokens = computed;
                self.prefix_stats.queried_tokens += seq.prompt_len as u64;
                self.prefix_stats.hit_tokens += computed as u64;
            }
            budget = budget.saturating_sub(tokens);
            self.running.push(seq);
            plan.admitted += 1;
        }
        plan
    }

    /// Registers the full blocks whose every position a forward has written (prompt and
    /// output alike), for later requests that start with the same tokens (the next turn of a
    /// chat) to share. Called after each forward, before finished sequences let go of theirs.
    pub fn cache_computed_blocks(&mut self) {
        if !self.cfg.prefix_caching {
            return;
        }
        let block_size = self.alloc.block_size();
        for seq in &mut self.running {
            // After a step cut short by a stop condition the cache may hold positions past the
            // tokens kept: only blocks of kept tokens are offered.
            let full = seq.num_computed.min(seq.len()) / block_size;
            let from = seq.offered_blocks;
            if full <= from {
                continue;
            }
            seq.offered_link = self.alloc.register(
                seq.offered_link,
                &seq.tokens[from * block_size..full * block_size],
                &seq.blocks.blocks()[from..full],
            );
            seq.offered_blocks = full;
        }
    }

    /// Removes a sequence (finished or aborted) wherever it is and frees its blocks.
    pub fn remove(&mut self, id: RequestId) -> Option<Sequence> {
        let mut seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else {
            let i = self.waiting.iter().position(|s| s.id == id)?;
            self.waiting.remove(i).expect("index from position")
        };
        seq.blocks.release_all(&mut self.alloc);
        Some(seq)
    }

    /// Every block is free or held, and held exactly as often as tables name it; only cached
    /// blocks are shared, and no table still has to write a cached block; waiting sequences hold
    /// none; running ones hold enough for their cached positions; the caps hold.
    pub fn check_invariants(&self) -> Result<(), String> {
        let block_size = self.alloc.block_size();
        let mut holders = vec![0u32; self.alloc.num_blocks()];
        for seq in &self.running {
            if seq.blocks.len() < self.alloc.blocks_for(seq.num_computed) {
                return Err(format!(
                    "request {} caches more than its blocks hold",
                    seq.id
                ));
            }
            if seq.len() > self.cfg.max_model_len {
                return Err(format!("request {} is past max_model_len", seq.id));
            }
            for (i, &b) in seq.blocks.blocks().iter().enumerate() {
                if seq.blocks.blocks()[..i].contains(&b) {
                    return Err(format!("block {b} twice in request {}'s table", seq.id));
                }
                if self.alloc.is_cached(b) && (i + 1) * block_size > seq.num_computed {
                    return Err(format!(
                        "cached block {b} is still to be written by request {}",
                        seq.id
                    ));
                }
                holders[b as usize] += 1;
            }
        }
        let mut held = 0;
        for (b, &n) in holders.iter().enumerate() {
            let b = b as u32;
            if n != self.alloc.ref_count(b) {
                return Err(format!(
                    "block {b} is in {n} tables but counted {} times",
                    self.alloc.ref_count(b)
                ));
            }
            if n > 1 && !self.alloc.is_cached(b) {
                return Err(format!("block {b} is shared but caches no prefix"));
            }
            held += usize::from(n > 0);
        }
        if let Some(seq) = self
            .waiting
            .iter()
            .find(|s| !s.blocks.is_empty() || s.num_computed > 0)
        {
            return Err(format!("waiting request {} holds cache", seq.id));
        }
        if held + self.alloc.num_free() != self.alloc.num_blocks() {
            return Err(format!(
                "{} blocks held + {} free != {}",
                held,
                self.alloc.num_free(),
                self.alloc.num_blocks()
            ));
        }
        if self.running.len() > self.cfg.max_num_seqs {
            return Err("more running sequences than max_num_seqs".into());
        }
        Ok(())
    }
}

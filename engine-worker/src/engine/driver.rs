//! [`Engine`]: owns the backend, scheduler and proposer, and runs one step at a time.

use proto::api_worker::{AddRequest, RejectReason};
use proto::worker_tp::ResyncRequest;
use proto::{FinishReason, RequestId};

use super::calibrate::{calibrate, calibrate_draft};
use super::config::{validate_request, EngineConfig, ProposerKind};
use super::prompt_logprobs::compute_prompt_logprobs;
use super::retained::{RetainBounds, Retained};
use super::rows::{RowKind, RowOut, RowPolicy, StartInfo};
use super::stop::StopRules;
use super::structured;
use crate::backend::{Backend, LogitsFor, SeqForward, TokenChoice};
use crate::kv::{BlockAllocator, BlockTable};
use crate::sampling::History;
use crate::scheduler::{Scheduler, SchedulerConfig, Sequence, SequencePhase};
use crate::spec::{
    DraftCandidate, DraftJob, DraftPlanner, DraftSource, Drafter, NgramProposer, Proposer,
    RequestAcceptance, StepCost, SuffixProposer, TargetRows, Verification,
};
use proto::worker_tp::KvBlocks;
use vocab::TokenBytes;

/// Largest forward measured at start (about 0.2 s on a 2-core CPU); the cost curve goes on
/// along its last segment beyond it.
const CALIBRATION_MAX_TOKENS: usize = 64;

/// Per running row, the drafts it verifies with their match strength, and the proposer's whole
/// offer.
type PlannedDrafts = (Vec<(Vec<u32>, usize)>, Vec<Vec<u32>>);

/// Stands in the trace for offered draft tokens a model drafter never ran (it drafts only
/// what the policy verifies): a token id no vocabulary has, so it never matches an output.
const NOT_DRAFTED: u32 = u32::MAX;

/// The match strength a model drafter's drafts are planned and learned under: the acceptance
/// table then holds its acceptance by draft position alone.
const MODEL_DRAFT_STRENGTH: usize = 1;

/// One running sequence's outcome of a step: the verifier's verdict, and how strong the
/// proposer's match its drafts came from was.
struct RowVerdict {
    strength: usize,
    verdict: Verification,
    /// What the drafting policy saw and predicted of this row's draft.
    policy: RowPolicy,
}

pub struct Engine<B: Backend> {
    backend: B,
    scheduler: Scheduler,
    proposer: Option<Box<dyn Proposer>>,
    /// A draft model, the target's first layers or a draft head, instead of `proposer`.
    drafter: Option<Box<dyn Drafter>>,
    /// How many proposed drafts each sequence verifies, and what it learned so far.
    planner: DraftPlanner,
    cfg: EngineConfig,
    vocab: Option<TokenBytes>,
    eos_token_ids: Vec<u32>,
    /// Rows of requests aborted between steps, emitted with the next step; their sequences are
    /// kept until then so a resync still reports them.
    pending: Vec<(RowOut, Option<Sequence>)>,
    /// Finished requests whose final output their api-server has not acknowledged yet.
    retained: Retained,
    /// Compiles requests' `response_format` over the vocabulary (None without one).
    grammars: Option<grammar::Compiler>,
    /// The last step's verify forward, when the whole step was one.
    last_verify_timing: Option<proto::worker_tp::VerifyTiming>,
}

impl<B: Backend> Engine<B> {
    /// `cfg.max_model_len` is clamped to what the model and the cache can hold, and the token
    /// budget raised to fit one verify step of every running sequence.
    pub fn new(backend: B, cfg: EngineConfig, vocab: Option<TokenBytes>) -> Self {
        Self::with_drafter(backend, cfg, vocab, None)
            .expect("an engine without a model drafter always builds")
    }

    /// [`Engine::new`] with a model drafter in place of the configured proposer (when K > 0):
    /// refused if the draft does not fit the target (vocabulary size, cache layout, layers).
    pub fn with_drafter(
        mut backend: B,
        mut cfg: EngineConfig,
        vocab: Option<TokenBytes>,
        draft: Option<DraftSource>,
    ) -> Result<Self, crate::EngineError> {
        let mut alloc = BlockAllocator::new(backend.num_blocks(), backend.block_size());
        let calibration = if cfg.num_spec_tokens > 0 {
            let verify_tokens = cfg.max_num_seqs * (cfg.num_spec_tokens + 1);
            calibrate(
                &mut backend,
                &mut alloc,
                cfg.num_spec_tokens,
                verify_tokens.min(CALIBRATION_MAX_TOKENS),
            )
        } else {
            Vec::new()
        };
        let cost = StepCost::from_calibration(&calibration, backend.token_group());
        // Without speculation nothing was measured and no draft is ever planned.
        if cfg.num_spec_tokens > 0 {
            tracing::info!(
                policy = cfg.spec_policy.name(),
                one_token_ms = cost.seconds(1.0) * 1e3,
                eight_tokens_ms = cost.seconds(8.0) * 1e3,
                extra_token_at_eight_ms = cost.marginal(8.0) * 1e3,
                group_step_ms = cost.group_step() * 1e3,
                points = ?calibration,
                "verify cost calibrated"
            );
        }
        let planner = DraftPlanner::new(cfg.spec_policy, cfg.num_spec_tokens, cost);
        cfg.max_model_len = cfg
            .max_model_len
            .min(backend.config().max_position_embeddings)
            .min(alloc.capacity_tokens());
        cfg.max_num_batched_tokens = cfg
            .max_num_batched_tokens
            .max(cfg.max_num_seqs * (cfg.num_spec_tokens + 1));
        let drafter = match draft.filter(|_| cfg.num_spec_tokens > 0) {
            Some(source) => Some(build_drafter(
                source,
                &mut backend,
                &mut alloc,
                cfg.max_num_seqs,
            )?),
            None => None,
        };
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: cfg.max_num_seqs,
                max_num_batched_tokens: cfg.max_num_batched_tokens,
                max_model_len: cfg.max_model_len,
                num_spec_tokens: cfg.num_spec_tokens,
                prefix_caching: cfg.prefix_caching,
                recompute_last_cached_block: drafter
                    .as_ref()
                    .is_some_and(|d| d.reads_target_states()),
            },
            alloc,
        );
        let proposer = (cfg.num_spec_tokens > 0 && drafter.is_none()).then(|| build_proposer(&cfg));
        let eos_token_ids = backend.config().eos_token_ids.clone();
        let grammars =
            structured::compiler(vocab.as_ref(), backend.config().vocab_size, &eos_token_ids);
        Ok(Self {
            backend,
            scheduler,
            proposer,
            drafter,
            planner,
            cfg,
            vocab,
            eos_token_ids,
            pending: Vec::new(),
            retained: Retained::new(RetainBounds::default()),
            grammars,
            last_verify_timing: None,
        })
    }

    /// Sets how much of its finished, unacknowledged output the engine keeps (drops what it
    /// kept so far).
    pub fn set_retain_bounds(&mut self, bounds: RetainBounds) {
        self.retained = Retained::new(bounds);
    }

    /// Finished requests kept for a resync: how many, their bytes, and how many were dropped
    /// unacknowledged since start.
    pub fn retained_stats(&self) -> (usize, usize, u64) {
        (
            self.retained.len(),
            self.retained.bytes(),
            self.retained.evicted(),
        )
    }

    /// `owner` has the final outputs of `ids`: forget those that are its own.
    pub fn delivered(&mut self, owner: &str, ids: &[RequestId]) {
        for &id in ids {
            if self.retained.owner_of(id) == Some(owner) {
                self.retained.forget(id);
            }
        }
    }

    /// The api-server a request (running, waiting, or finished and kept) belongs to.
    pub fn owner_of(&self, id: RequestId) -> Option<&str> {
        self.scheduler
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.owner.as_str())
            .or_else(|| self.retained.owner_of(id))
    }

    /// Aborts `id` if `owner` owns it (another api-server's abort, or a stranger's, is
    /// ignored). Returns whether it did.
    pub fn abort_of(&mut self, owner: &str, id: RequestId) -> bool {
        self.owner_of(id) == Some(owner) && self.abort(id)
    }

    /// When the newest finished request kept since before `cutoff` (and after `after`) finished:
    /// its final output is overdue (see [`Retained::overdue_since`]).
    pub fn overdue_since(
        &self,
        cutoff: std::time::Instant,
        after: Option<std::time::Instant>,
    ) -> Option<std::time::Instant> {
        self.retained.overdue_since(cutoff, after)
    }

    /// Drops retained requests past the age bound.
    pub fn expire_retained(&mut self, now: std::time::Instant) {
        self.retained.expire(now);
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    pub fn planner(&self) -> &DraftPlanner {
        &self.planner
    }

    /// The last step's verify forward time and what K = 0 would have emitted in it (None when
    /// the step was not a pure verify step).
    pub fn last_verify_timing(&self) -> Option<proto::worker_tp::VerifyTiming> {
        self.last_verify_timing
    }

    /// `ngram`, `suffix`, `draft:<model>`, `layers:<N>`, or `none` without speculation.
    pub fn proposer_name(&self) -> &str {
        match (&self.drafter, &self.proposer) {
            (Some(d), _) => d.name(),
            (None, Some(p)) => p.name(),
            (None, None) => "none",
        }
    }

    /// The model drafter, if one drafts.
    pub fn drafter(&self) -> Option<&dyn Drafter> {
        self.drafter.as_deref()
    }

    /// Bytes of the drafter's own KV cache (0 without one, or for early exit).
    /// Bytes of the target's KV cache.
    pub fn kv_cache_bytes(&self) -> u64 {
        self.backend.kv_cache_bytes()
    }

    /// How the KV-cache blocks are used now: held by sequences, cached (a prefix no sequence
    /// holds) and free.
    pub fn kv_blocks(&self) -> proto::worker_tp::KvBlocks {
        let alloc = self.scheduler.allocator();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let evictable = alloc.num_evictable();
        KvBlocks {
            used: count(alloc.num_blocks() - alloc.num_free()),
            cached: count(evictable),
            free: count(alloc.num_free() - evictable),
        }
    }

    pub fn draft_kv_bytes(&self) -> u64 {
        self.drafter
            .as_ref()
            .map_or(0, |d| d.kv_cache_bytes(&self.backend))
    }

    /// Stop strings can be checked (the model came with a vocabulary).
    /// Positions the whole KV cache holds.
    pub fn kv_capacity_tokens(&self) -> usize {
        self.scheduler.allocator().capacity_tokens()
    }

    pub fn has_token_bytes(&self) -> bool {
        self.vocab.is_some()
    }

    pub fn num_running(&self) -> usize {
        self.scheduler.running().len()
    }

    pub fn num_waiting(&self) -> usize {
        self.scheduler.waiting().len()
    }

    /// Work left: unfinished requests or rows not yet emitted.
    pub fn has_work(&self) -> bool {
        self.scheduler.num_unfinished() > 0 || !self.pending.is_empty()
    }

    /// Queues a request, or says why not; a grammar it asks for is compiled here (library
    /// use and tests: the worker compiles off the loop, [`Engine::add_prepared`]).
    pub fn add_request(&mut self, req: AddRequest) -> Result<(), RejectReason> {
        self.add_prepared(req, None)
    }

    /// The compiler of `response_format` grammars, for [`GrammarJob::start`].
    pub fn grammars(&self) -> Option<&grammar::Compiler> {
        self.grammars.as_ref()
    }

    /// Queues a request whose grammar, if it asks for one, is being compiled by `job`: the
    /// request waits in the queue until it is ready (ends with an error if it fails).
    pub fn add_prepared(
        &mut self,
        req: AddRequest,
        job: Option<structured::GrammarJob>,
    ) -> Result<(), RejectReason> {
        validate_request(
            &req,
            self.cfg.max_model_len,
            self.backend.config().vocab_size,
            self.vocab.is_some(),
        )?;
        if self.scheduler.contains(req.id) || self.pending.iter().any(|p| p.0.id == req.id) {
            return Err(RejectReason::Invalid(format!(
                "request id {} is already in flight",
                req.id
            )));
        }
        if self.scheduler.waiting().len() >= self.cfg.max_waiting {
            return Err(RejectReason::Overloaded);
        }
        let grammar = match (&req.sampling.structured, &job) {
            (Some(structured), None) => Some(Box::new(
                structured::compile(self.grammars.as_ref(), structured)
                    .map_err(RejectReason::Invalid)?,
            )),
            _ => None,
        };
        let grammar_job = job.filter(|_| req.sampling.structured.is_some());
        let seed = req.sampling.seed.unwrap_or_else(rand::random);
        let stop_ids = stop_ids(&self.eos_token_ids, &req.stop);
        self.scheduler.add(Sequence {
            id: req.id,
            owner: req.owner,
            arrival_unix_ms: req.arrival_unix_ms,
            prompt_len: req.prompt_token_ids.len(),
            tokens: req.prompt_token_ids,
            sampling: req.sampling,
            seed,
            stop: req.stop,
            stop_ids,
            max_tokens: req.max_tokens as usize,
            num_computed: 0,
            blocks: BlockTable::default(),
            offered_blocks: 0,
            offered_link: None,
            cached_prompt_tokens: 0,
            prefilled: false,
            drafted: Vec::new(),
            accepted: Vec::new(),
            offered: Vec::new(),
            predicted_milli: Vec::new(),
            class: req.class,
            acceptance: RequestAcceptance::default(),
            announced: false,
            output_bytes: Vec::new(),
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            grammar,
            grammar_job,
        });
        Ok(())
    }

    /// Takes in the grammars compiled off the loop since the last step; a request whose
    /// grammar failed ends with an error.
    fn resolve_grammar_jobs(&mut self) {
        let mut failed = Vec::new();
        for seq in self.scheduler.waiting_mut() {
            let Some(done) = seq.grammar_job.as_ref().and_then(|job| job.poll()) else {
                continue;
            };
            seq.grammar_job = None;
            match done {
                Ok(grammar) => seq.grammar = Some(Box::new(grammar)),
                Err(reason) => {
                    tracing::warn!(%reason, "a request's grammar failed to compile");
                    failed.push(seq.id);
                }
            }
        }
        for id in failed {
            self.end_request(id, FinishReason::Error);
        }
    }

    /// Aborts a request wherever it is; its abort row goes out with the next step. A finished
    /// request kept for its api-server is forgotten. Returns false for an unknown id.
    pub fn abort(&mut self, id: RequestId) -> bool {
        self.end_request(id, FinishReason::Abort) || self.retained.forget(id)
    }

    /// Of `ids`, those this engine does not hold (neither running, waiting nor finished and
    /// kept for a resync).
    pub fn not_held(&self, ids: &[RequestId]) -> Vec<RequestId> {
        let held: std::collections::HashSet<RequestId> =
            self.scheduler.iter().map(|s| s.id).collect();
        ids.iter()
            .copied()
            .filter(|id| !held.contains(id) && !self.retained.contains(*id))
            .collect()
    }

    /// Aborts every request owned by `owner` (an api-server that went silent).
    pub fn abort_owner(&mut self, owner: &str) -> usize {
        let ids: Vec<RequestId> = self
            .scheduler
            .iter()
            .filter(|s| s.owner == owner)
            .map(|s| s.id)
            .collect();
        let running = ids.iter().filter(|&&id| self.abort(id)).count();
        running + self.retained.forget_owner(owner)
    }

    /// Aborts everything (end of a drain).
    pub fn abort_all(&mut self) -> usize {
        let ids: Vec<RequestId> = self.scheduler.iter().map(|s| s.id).collect();
        ids.iter().filter(|&&id| self.abort(id)).count()
    }

    fn end_request(&mut self, id: RequestId, finish: FinishReason) -> bool {
        let Some(mut seq) = self.scheduler.remove(id) else {
            return false;
        };
        self.forget_drafts(id);
        let row = RowOut {
            id,
            kind: RowKind::Abort,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            drafted: 0,
            accepted: 0,
            policy: RowPolicy::default(),
            finish: Some(finish),
            start: take_start(&mut seq),
        };
        self.pending.push((row, Some(seq)));
        true
    }

    /// In-flight requests the token-processor has heard of, as of the next step batch, then the
    /// finished ones kept until acknowledged.
    pub fn resync_requests(&self) -> Vec<ResyncRequest> {
        self.scheduler
            .iter()
            .chain(self.pending.iter().filter_map(|p| p.1.as_ref()))
            .filter(|s| s.announced)
            .map(|s| resync_of(s, None))
            .chain(self.retained.iter().cloned())
            .collect()
    }

    /// Emits the rows of requests ended between steps; those that ended in an engine error are
    /// kept until acknowledged, like any finished request.
    fn drain_pending(&mut self) -> Vec<RowOut> {
        let now = std::time::Instant::now();
        let mut rows = Vec::with_capacity(self.pending.len());
        for (row, seq) in std::mem::take(&mut self.pending) {
            if let (Some(FinishReason::Error), Some(seq)) = (row.finish, &seq) {
                self.retained
                    .keep(resync_of(seq, Some(FinishReason::Error)), now);
            }
            rows.push(row);
        }
        rows
    }

    /// Runs one step and returns its rows (empty when there is nothing to do).
    pub fn step(&mut self) -> Vec<RowOut> {
        self.resolve_grammar_jobs();
        let mut rows: Vec<RowOut> = self.drain_pending();
        let plan = self.scheduler.schedule();
        for id in plan.preempted {
            if let Some(d) = &mut self.drafter {
                d.preempted(id);
            }
            rows.push(RowOut {
                id,
                kind: RowKind::Preempted,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                prompt_logprobs: Vec::new(),
                drafted: 0,
                accepted: 0,
                policy: RowPolicy::default(),
                finish: None,
                start: None,
            });
        }
        if self.scheduler.running().is_empty() {
            return rows;
        }
        match self.run_forwards() {
            Ok(verdicts) => self.apply(verdicts, &mut rows),
            Err(err) => {
                // The batch is lost; fail its requests explicitly rather than retry forever.
                tracing::error!(error = %err, running = self.num_running(), "forward pass failed");
                let ids: Vec<RequestId> = self.scheduler.running().iter().map(|s| s.id).collect();
                for id in ids {
                    self.end_request(id, FinishReason::Error);
                }
                let failed = self.drain_pending();
                rows.extend(failed);
            }
        }
        rows
    }

    /// Proposes and plans each sequence's drafts: the tokens it verifies and the strength of
    /// the match they come from.
    /// Also returns each row's offer: the proposer's whole draft and how many tokens that is.
    fn plan_drafts(&mut self) -> Result<PlannedDrafts, crate::EngineError> {
        if self.drafter.is_some() {
            return self.plan_model_drafts();
        }
        Ok(self.plan_lookup_drafts())
    }

    /// Lookups are free: propose up to K, then keep what pays.
    fn plan_lookup_drafts(&mut self) -> PlannedDrafts {
        let running = self.scheduler.running();
        let mut proposals: Vec<(Vec<u32>, usize)> = running
            .iter()
            .map(|s| {
                let mut out = Vec::new();
                let mut strength = 0;
                if let (Some(p), false) = (&mut self.proposer, s.phase() == SequencePhase::Prefill)
                {
                    let max_drafts = self.scheduler.max_drafts(s);
                    strength = p.propose(s.id, &s.tokens, max_drafts, &mut out);
                }
                (out, strength)
            })
            .collect();
        if self.proposer.is_none() {
            let offers = vec![Vec::new(); proposals.len()];
            return (proposals, offers);
        }
        // A prompt in the step is no reason to draft: the drafts would delay its first token,
        // and its tokens cost less than verify tokens (one logits row). Plan as if the verify
        // rows ran alone.
        let verify_rows = running
            .iter()
            .filter(|s| s.phase() != SequencePhase::Prefill)
            .count();
        let candidates: Vec<DraftCandidate<'_>> = running
            .iter()
            .zip(&proposals)
            .map(|(s, (drafts, strength))| DraftCandidate {
                proposed: drafts.len(),
                strength: *strength,
                acceptance: &s.acceptance,
                catch_up: 0,
            })
            .collect();
        let lengths = self.planner.plan(&candidates, verify_rows, None);
        let offers = proposals.iter().map(|(drafts, _)| drafts.clone()).collect();
        for ((drafts, _), length) in proposals.iter_mut().zip(lengths) {
            drafts.truncate(length);
        }
        (proposals, offers)
    }

    /// Drafting by model costs forwards: plan each sequence's draft length first (verify and
    /// draft forwards priced), then draft exactly that, all sequences together.
    fn plan_model_drafts(&mut self) -> Result<PlannedDrafts, crate::EngineError> {
        let running = self.scheduler.running();
        let drafter = self.drafter.as_mut().expect("checked by plan_drafts");
        let drafting = |s: &Sequence| s.phase() != SequencePhase::Prefill;
        let verify_rows = running.iter().filter(|s| drafting(s)).count();
        let candidates: Vec<DraftCandidate<'_>> = running
            .iter()
            .map(|s| DraftCandidate {
                proposed: if drafting(s) {
                    self.scheduler.max_drafts(s)
                } else {
                    0
                },
                strength: MODEL_DRAFT_STRENGTH,
                acceptance: &s.acceptance,
                catch_up: match drafting(s) {
                    true => drafter.catch_up(s.id, &s.tokens, s.blocks.blocks()),
                    false => 0,
                },
            })
            .collect();
        let lengths = self
            .planner
            .plan(&candidates, verify_rows, Some(drafter.cost()));
        let (rows, jobs): (Vec<usize>, Vec<DraftJob<'_>>) = running
            .iter()
            .zip(&lengths)
            .enumerate()
            // A sequence drafting nothing still gets a job: a head may run its pending states.
            .filter(|(_, (s, _))| drafting(s))
            .map(|(row, (s, &drafts))| {
                let job = DraftJob {
                    seq: s.id,
                    tokens: &s.tokens,
                    block_table: s.blocks.blocks(),
                    drafts,
                    sampling: &s.sampling,
                    seed: s.seed,
                    first_position: s.num_generated(),
                };
                (row, job)
            })
            .unzip();
        let mut proposals = vec![(Vec::new(), MODEL_DRAFT_STRENGTH); running.len()];
        for (row, drafts) in rows
            .into_iter()
            .zip(drafter.draft(&mut self.backend, &jobs)?)
        {
            proposals[row].0 = drafts;
        }
        // A model drafts only what the policy asked for; it offered what the row may carry.
        let offers = candidates
            .iter()
            .zip(&proposals)
            .map(|(c, (drafts, _))| {
                let mut offer = drafts.clone();
                offer.resize(c.proposed.max(drafts.len()), NOT_DRAFTED);
                offer
            })
            .collect();
        Ok((proposals, offers))
    }

    /// Sequence `id` is gone: its proposer or drafter state goes too.
    fn forget_drafts(&mut self, id: RequestId) {
        if let Some(p) = &mut self.proposer {
            p.forget(id);
        }
        if let Some(d) = &mut self.drafter {
            d.forget(id);
        }
    }

    /// Proposes, recomputes resumed sequences, runs the batched forward and verifies. Returns per
    /// running sequence its verdict.
    fn run_forwards(&mut self) -> Result<Vec<RowVerdict>, crate::EngineError> {
        let drafter = &mut self.drafter;
        compute_prompt_logprobs(
            &mut self.backend,
            self.scheduler.running_mut(),
            |backend, seq, start_pos, len| {
                if let Some(d) = drafter {
                    let rows = TargetRows {
                        seq,
                        start_pos,
                        len,
                        settled: true,
                    };
                    d.target_forward(backend, &[rows]);
                }
            },
        )?;
        // Before drafting: early exit reads the target's cache of every position but the last.
        let recomputed = recompute_resumed(&mut self.backend, self.scheduler.running())?;
        if let Some(d) = &mut self.drafter {
            d.target_forward(&mut self.backend, &recomputed);
        }
        let planning = std::time::Instant::now();
        let (mut planned, offers) = self.plan_drafts()?;
        let max_drafts: Vec<usize> = (self.scheduler.running().iter())
            .map(|s| self.scheduler.max_drafts(s))
            .collect();
        let masks = structured::step_masks(
            self.scheduler.running_mut(),
            &mut planned,
            self.drafter.is_none(),
            &max_drafts,
        );
        let policies = self.row_policies(&planned, offers, &max_drafts);
        let plan_us = planning.elapsed().as_micros() as u64;
        let running = self.scheduler.running();
        let chunks = verify_chunks(running, &planned);
        let forwards = step_forwards(running, &chunks);
        let choices: Vec<TokenChoice<'_>> = running
            .iter()
            .zip(&masks)
            .map(|(s, masks)| TokenChoice {
                sampling: &s.sampling,
                seed: s.seed,
                first_position: s.num_generated(),
                history: History {
                    tokens: &s.tokens,
                    prompt_len: s.prompt_len,
                    stop_ids: &s.stop_ids,
                },
                masks,
            })
            .collect();
        let started = std::time::Instant::now();
        let verdicts = self.backend.forward_and_verify(&forwards, &choices)?;
        if let Some(d) = &mut self.drafter {
            let rows: Vec<TargetRows> = running
                .iter()
                .zip(&forwards)
                .map(|(s, f)| TargetRows {
                    seq: s.id,
                    start_pos: f.start_pos,
                    len: f.tokens.len(),
                    settled: false,
                })
                .collect();
            d.target_forward(&mut self.backend, &rows);
        }
        if verdicts.len() != forwards.len() {
            return Err(crate::EngineError::InvalidBatch(format!(
                "backend returned {} verdicts for {} sequences",
                verdicts.len(),
                forwards.len()
            )));
        }
        // Steps with a prompt in them cost differently per token: only verify steps teach the
        // policy what a verify token costs.
        let seconds = started.elapsed().as_secs_f64();
        let tokens: usize = forwards.iter().map(|f| f.tokens.len()).sum();
        let verify_rows = forwards
            .iter()
            .filter(|f| f.logits == LogitsFor::All)
            .count();
        tracing::debug!(
            tokens,
            verify_rows,
            prompt_rows = forwards.len() - verify_rows,
            drafted = planned.iter().map(|(d, _)| d.len()).sum::<usize>(),
            accepted = verdicts.iter().map(|v| v.accepted).sum::<usize>(),
            plan_us,
            forward_us = (seconds * 1e6) as u64,
            "step"
        );
        self.last_verify_timing = None;
        if verify_rows == forwards.len() {
            self.planner.observe_forward(tokens, seconds);
            self.last_verify_timing = Some(proto::worker_tp::VerifyTiming {
                micros: (seconds * 1e6).min(f64::from(u32::MAX)) as u32,
                k0_tokens_milli: (self.planner.k0_tokens(verify_rows, seconds) * 1e3)
                    .min(f64::from(u32::MAX)) as u32,
            });
        }
        Ok(verdicts
            .into_iter()
            .zip(planned)
            .zip(policies)
            .map(|((verdict, (_, strength)), policy)| RowVerdict {
                strength,
                verdict,
                policy,
            })
            .collect())
    }

    /// Per row, what the policy was offered and what it predicts of the draft it verifies (the
    /// final one, after a grammar dropped or forced tokens).
    fn row_policies(
        &self,
        planned: &[(Vec<u32>, usize)],
        offers: Vec<Vec<u32>>,
        max_drafts: &[usize],
    ) -> Vec<RowPolicy> {
        let running = self.scheduler.running();
        running
            .iter()
            .zip(planned)
            .zip(offers)
            .zip(max_drafts)
            .map(|(((s, (drafts, strength)), offer), &max)| {
                let offered = offer.len().max(drafts.len()).min(max.max(drafts.len()));
                let predicted =
                    self.planner
                        .table()
                        .expected_accepted(&s.acceptance, *strength, drafts.len());
                RowPolicy {
                    offered: offered.min(usize::from(u8::MAX)) as u8,
                    predicted_milli: (predicted * 1e3).round().min(f64::from(u16::MAX)) as u16,
                    offer,
                }
            })
            .collect()
    }

    fn apply(&mut self, verdicts: Vec<RowVerdict>, rows: &mut Vec<RowOut>) {
        let rules = StopRules {
            eos_token_ids: &self.eos_token_ids,
            vocab: self.vocab.as_ref(),
            max_model_len: self.cfg.max_model_len,
        };
        let mut finished = Vec::new();
        for (seq, v) in self.scheduler.running_mut().iter_mut().zip(verdicts) {
            let Verification {
                drafted,
                accepted,
                tokens,
                mut logprobs,
            } = v.verdict;
            let kind = if seq.prefilled {
                RowKind::Verify
            } else {
                RowKind::Prefill
            };
            // The cache now holds every position up to the last accepted draft.
            let len_before = seq.len();
            let cached_after = len_before + accepted;
            let (appended, finish) = rules.append(seq, &tokens);
            if let Some(d) = &mut self.drafter {
                d.verified(
                    seq.id,
                    &seq.tokens,
                    seq.blocks.blocks(),
                    len_before,
                    drafted,
                    accepted,
                );
            }
            seq.num_computed = if kind == RowKind::Prefill {
                seq.prompt_len
            } else {
                cached_after
            };
            let policy = match kind {
                RowKind::Verify => v.policy,
                _ => RowPolicy::default(),
            };
            if kind == RowKind::Verify {
                seq.drafted.push(drafted as u8);
                seq.accepted.push(accepted as u8);
                seq.offered.push(policy.offered);
                seq.predicted_milli.push(policy.predicted_milli);
                self.planner
                    .observe_verdict(&mut seq.acceptance, v.strength, drafted, accepted);
            }
            seq.prefilled = true;
            let new_tokens = seq.tokens[seq.len() - appended..].to_vec();
            structured::advance(seq, &new_tokens);
            // A stop condition may cut the step's tokens short: their logprobs go with them.
            logprobs.truncate(appended);
            seq.logprobs.extend_from_slice(&logprobs);
            let prompt_logprobs = match kind {
                RowKind::Prefill => seq.prompt_logprobs.clone(),
                _ => Vec::new(),
            };
            rows.push(RowOut {
                id: seq.id,
                kind,
                tokens: new_tokens,
                logprobs,
                prompt_logprobs,
                drafted: drafted as u8,
                accepted: accepted as u8,
                policy,
                finish,
                start: take_start(seq),
            });
            if let Some(finish) = finish {
                finished.push((seq.id, finish));
            }
        }
        // Before finished sequences give their blocks back, so a finished request's blocks
        // are cached too.
        self.scheduler.cache_computed_blocks();
        let now = std::time::Instant::now();
        for (id, finish) in finished {
            if let Some(seq) = self.scheduler.remove(id) {
                if let Some(p) = &mut self.proposer {
                    p.finished(id, seq.output());
                }
                if let Some(d) = &mut self.drafter {
                    d.forget(id);
                }
                self.retained.keep(resync_of(&seq, Some(finish)), now);
            }
        }
    }
}

/// Resumed sequences first rebuild their cache (all but the last token) in a forward of their
/// own, so the step's forward treats them like any running sequence. Returns what it ran.
fn recompute_resumed<B: Backend>(
    backend: &mut B,
    running: &[Sequence],
) -> Result<Vec<TargetRows>, crate::EngineError> {
    let recompute: Vec<SeqForward<'_>> = running
        .iter()
        .filter(|s| s.phase() == SequencePhase::Recompute)
        .map(|s| SeqForward {
            tokens: &s.tokens[s.num_computed..s.len() - 1],
            start_pos: s.num_computed,
            block_table: s.blocks.blocks(),
            logits: LogitsFor::Last,
        })
        .collect();
    if !recompute.is_empty() {
        backend.forward(&recompute)?;
    }
    Ok(running
        .iter()
        .filter(|s| s.phase() == SequencePhase::Recompute)
        .zip(&recompute)
        .map(|(s, f)| TargetRows {
            seq: s.id,
            start_pos: f.start_pos,
            len: f.tokens.len(),
            settled: true,
        })
        .collect())
}

/// Per running sequence, the chunk a verify forward runs: its last token, then its drafts.
fn verify_chunks(running: &[Sequence], planned: &[(Vec<u32>, usize)]) -> Vec<Vec<u32>> {
    running
        .iter()
        .zip(planned)
        .map(|(s, (drafts, _))| {
            let mut chunk = Vec::with_capacity(drafts.len() + 1);
            chunk.push(*s.tokens.last().expect("sequences are never empty"));
            chunk.extend_from_slice(drafts);
            chunk
        })
        .collect()
}

/// The step's forward per running sequence: a prompt's last row, or a verify chunk's every row.
fn step_forwards<'a>(running: &'a [Sequence], chunks: &'a [Vec<u32>]) -> Vec<SeqForward<'a>> {
    running
        .iter()
        .zip(chunks)
        .map(|(s, chunk)| match s.phase() {
            // After the positions the prefix cache already holds.
            SequencePhase::Prefill => SeqForward {
                tokens: &s.tokens[s.num_computed..s.prompt_len],
                start_pos: s.num_computed,
                block_table: s.blocks.blocks(),
                logits: LogitsFor::Last,
            },
            SequencePhase::Recompute | SequencePhase::Verify => SeqForward {
                tokens: chunk,
                start_pos: s.len() - 1,
                block_table: s.blocks.blocks(),
                logits: LogitsFor::All,
            },
        })
        .collect()
}

/// The drafter over `source`, its forward's cost measured on cache blocks of `alloc`.
fn build_drafter<B: Backend>(
    source: DraftSource,
    backend: &mut B,
    alloc: &mut BlockAllocator,
    max_num_seqs: usize,
) -> Result<Box<dyn Drafter>, crate::EngineError> {
    let mut drafter = source.into_drafter(backend, StepCost::from_calibration(&[], 1))?;
    let group = drafter.token_group(backend);
    let points = calibrate_draft(alloc, max_num_seqs, group, |forwards| {
        drafter.calibration_forward(backend, forwards)
    });
    let cost = StepCost::from_calibration(&points, group);
    tracing::info!(
        drafter = drafter.name(),
        one_seq_ms = cost.seconds(1.0) * 1e3,
        eight_seqs_ms = cost.seconds(8.0) * 1e3,
        draft_kv_bytes = drafter.kv_cache_bytes(backend),
        points = ?points,
        "draft forward cost calibrated"
    );
    drafter.set_cost(cost);
    Ok(drafter)
}

/// The proposer `cfg` asks for.
fn build_proposer(cfg: &EngineConfig) -> Box<dyn Proposer> {
    match cfg.proposer {
        ProposerKind::Ngram => Box::new(NgramProposer::new(cfg.ngram_min, cfg.ngram_max)),
        ProposerKind::Suffix => Box::new(SuffixProposer::new(cfg.suffix)),
    }
}

/// What a resync says of a sequence: running (`finish` None) or finished and kept.
fn resync_of(s: &Sequence, finish: Option<FinishReason>) -> ResyncRequest {
    ResyncRequest {
        id: s.id,
        owner: s.owner.clone(),
        prompt_tokens: s.prompt_len as u32,
        cached_prompt_tokens: s.cached_prompt_tokens as u32,
        arrival_unix_ms: s.arrival_unix_ms,
        prefilled: s.prefilled,
        tokens: s.output().to_vec(),
        drafted: s.drafted.clone(),
        accepted: s.accepted.clone(),
        offered: s.offered.clone(),
        predicted_milli: s.predicted_milli.clone(),
        class: s.class.clone(),
        finish: finish.map_or(0, FinishReason::code),
        logprobs: s.logprobs.clone(),
        prompt_logprobs: s.prompt_logprobs.clone(),
    }
}

/// The start facts, the first time a request appears in a row.
fn take_start(seq: &mut Sequence) -> Option<StartInfo> {
    if std::mem::replace(&mut seq.announced, true) {
        return None;
    }
    Some(StartInfo {
        owner: seq.owner.clone(),
        prompt_tokens: seq.prompt_len as u32,
        cached_prompt_tokens: seq.cached_prompt_tokens as u32,
        arrival_unix_ms: seq.arrival_unix_ms,
        class: seq.class.clone(),
    })
}

/// The tokens that end a request: EOS unless it is ignored, and its stop tokens.
fn stop_ids(eos_token_ids: &[u32], stop: &proto::api_worker::StopConditions) -> Vec<u32> {
    let eos = match stop.ignore_eos {
        true => &[][..],
        false => eos_token_ids,
    };
    eos.iter().chain(&stop.stop_token_ids).copied().collect()
}

//! What tracking a batch produces, kept apart from where it goes: outputs for the api-servers
//! ([`Outbox`]) and facts for the metrics ([`Observations`]). The tracker writes both; the live
//! ingest ships them, the tests and `replay` read them.

use std::sync::Arc;

use proto::tp_api::RequestOutput;
use proto::{FinishReason, RequestId};

use super::outputs::OwnerOutputs;
use super::{Figures, PromptTokens};

/// Outputs grouped by owning api-server: one list (one message) per owner.
pub type OutputsByOwner = Vec<(Arc<str>, OwnerOutputs)>;

/// Appends each of `more`'s lists to the same owner's list in `into` (order kept), or adds it.
pub fn merge_by_owner(into: &mut OutputsByOwner, more: OutputsByOwner) {
    for (owner, list) in more {
        match into.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, existing)) => existing.append(list),
            None => into.push((owner, list)),
        }
    }
}

/// Outputs of one or more batches, grouped by owning api-server. Owners are few (one per
/// api-server) and interned by the tracker, so a pointer comparison usually finds the group.
#[derive(Debug, Default)]
pub struct Outbox {
    by_owner: OutputsByOwner,
    /// Row capacity a new owner's list starts with (the batch's row count), so a batch's
    /// outputs are not copied by repeated growth.
    capacity_hint: usize,
}

impl Outbox {
    fn list(&mut self, owner: &Arc<str>) -> &mut OwnerOutputs {
        let found = match self
            .by_owner
            .iter()
            .position(|(o, _)| Arc::ptr_eq(o, owner))
        {
            Some(i) => Some(i),
            None => self.by_owner.iter().position(|(o, _)| o == owner),
        };
        let i = match found {
            Some(i) => i,
            None => {
                let list = OwnerOutputs::with_capacity(self.capacity_hint.max(1));
                self.by_owner.push((owner.clone(), list));
                self.by_owner.len() - 1
            }
        };
        &mut self.by_owner[i].1
    }

    pub fn push(&mut self, owner: &Arc<str>, output: RequestOutput) {
        self.list(owner).push(output);
    }

    /// A tokens-only output (no finish), without materializing a [`RequestOutput`].
    pub fn push_tokens(
        &mut self,
        owner: &Arc<str>,
        id: RequestId,
        first_index: u32,
        tokens: &[u32],
        logprobs: &[proto::TokenLogprob],
    ) {
        self.list(owner)
            .push_tokens(id, first_index, tokens, logprobs);
    }

    /// Attaches prompt logprobs to the output just pushed for `owner`.
    pub fn attach_prompt_logprobs(&mut self, owner: &Arc<str>, prompt: &[proto::TokenLogprob]) {
        if !prompt.is_empty() {
            self.list(owner).attach_prompt_logprobs(prompt);
        }
    }

    /// Expect about `n` more outputs per owner.
    pub fn expect(&mut self, n: usize) {
        self.capacity_hint = n;
    }

    pub fn is_empty(&self) -> bool {
        self.by_owner.is_empty()
    }

    /// Number of outputs held.
    pub fn len(&self) -> usize {
        self.by_owner.iter().map(|(_, list)| list.len()).sum()
    }

    /// Takes everything, leaving the outbox empty.
    pub fn take(&mut self) -> OutputsByOwner {
        std::mem::take(&mut self.by_owner)
    }

    /// Puts back what [`take`](Self::take) returned (the forwarder's queue was full), ahead of
    /// anything pushed since.
    pub fn restore(&mut self, mut by_owner: OutputsByOwner) {
        merge_by_owner(&mut by_owner, std::mem::take(&mut self.by_owner));
        self.by_owner = by_owner;
    }

    /// Every output, owner dropped (tests and replay).
    pub fn drain_outputs(&mut self) -> impl Iterator<Item = (Arc<str>, RequestOutput)> {
        self.take().into_iter().flat_map(|(owner, list)| {
            list.to_outputs()
                .into_iter()
                .map(move |o| (owner.clone(), o))
        })
    }
}

/// Facts for the metrics from one batch (or resync, or failure sweep). Reused across batches so
/// the hot path does not allocate.
#[derive(Debug)]
pub struct Observations {
    /// Verification steps recorded, summed per request class (index of [`RequestClasses`]).
    ///
    /// [`RequestClasses`]: super::RequestClasses
    pub figures: Vec<Figures>,
    /// Requests that finished after at least one verification step: their class and figures'
    /// acceptance, for the per-request histograms.
    pub finished_acceptance: Vec<FinishedAcceptance>,
    /// The steps' verify forwards: microseconds, and the tokens K = 0 would have emitted in
    /// them (thousandths).
    pub verify_us: u64,
    pub k0_tokens_milli: u64,
    /// Tokens those steps emitted.
    pub verify_tokens: u64,
    /// Finished requests by [`FinishReason::code`] - 1.
    pub finished: [u64; 4],
    pub prompt_tokens: u64,
    /// Of `prompt_tokens`, those the workers' prefix caches held.
    pub cached_prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Seconds from arrival to first token, per request that got its first token.
    pub ttft_s: Vec<f64>,
    /// Seconds between a request's consecutive token deliveries (one per step with tokens).
    pub itl_s: Vec<f64>,
    /// Seconds from arrival to the final output, per finished request.
    pub e2e_s: Vec<f64>,
    /// Rows naming a request this tracker does not know (lost state, or refused at the cap).
    pub unknown_rows: u64,
    /// Requests refused because the worker's in-flight cap was reached.
    pub refused_at_cap: u64,
}

/// One finished request's acceptance, observed once at its finish.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FinishedAcceptance {
    pub class: u8,
    /// `num_accepted_draft_tokens / num_draft_tokens`; None when it drafted nothing.
    pub draft_acceptance_rate: Option<f64>,
    /// `average_accept_length`: tokens per verification step.
    pub mean_accepted_length: f64,
}

impl Observations {
    /// Observations for K = `num_spec_tokens` and `classes` request classes (at least 1).
    pub fn new(num_spec_tokens: usize, classes: usize) -> Self {
        Self {
            figures: vec![Figures::new(num_spec_tokens); classes.max(1)],
            finished_acceptance: Vec::new(),
            verify_us: 0,
            k0_tokens_milli: 0,
            verify_tokens: 0,
            finished: [0; 4],
            prompt_tokens: 0,
            cached_prompt_tokens: 0,
            generation_tokens: 0,
            ttft_s: Vec::new(),
            itl_s: Vec::new(),
            e2e_s: Vec::new(),
            unknown_rows: 0,
            refused_at_cap: 0,
        }
    }

    /// A request's prompt, counted once when its tracking starts.
    pub fn count_prompt(&mut self, prompt: PromptTokens) {
        self.prompt_tokens += u64::from(prompt.total);
        self.cached_prompt_tokens += u64::from(prompt.cached);
    }

    /// One verification step of a request of class `class`.
    #[inline]
    pub fn record(&mut self, class: u8, row: &proto::worker_tp::StepRow<'_>) {
        let figures = &mut self.figures[usize::from(class)];
        figures.record(row.drafted, row.accepted);
        figures.record_policy(row.offered, row.predicted_milli);
    }

    /// The figures of a class (`other`'s when `class` is past the configured ones).
    pub fn class_figures(&mut self, class: u8) -> &mut Figures {
        let i = usize::from(class).min(self.figures.len() - 1);
        &mut self.figures[i]
    }

    /// Every class summed.
    pub fn total_figures(&self) -> Figures {
        let mut total = self.figures[0].clone();
        for f in &self.figures[1..] {
            total.add(f);
        }
        total
    }

    /// A request of class `class` finished with `figures`: its acceptance, if it verified.
    pub fn finished_request(&mut self, class: u8, figures: &Figures) {
        if figures.steps() == 0 {
            return;
        }
        let draft_acceptance_rate = (figures.draft_tokens() > 0)
            .then(|| figures.accepted_draft_tokens() as f64 / figures.draft_tokens() as f64);
        self.finished_acceptance.push(FinishedAcceptance {
            class,
            draft_acceptance_rate,
            mean_accepted_length: figures.emitted_tokens() as f64 / figures.steps() as f64,
        });
    }

    pub fn count_finish(&mut self, reason: FinishReason) {
        self.finished[usize::from(reason.code() - 1)] += 1;
    }

    /// Back to zero, keeping the buffers.
    pub fn clear(&mut self) {
        for f in &mut self.figures {
            f.clear();
        }
        self.finished_acceptance.clear();
        self.verify_us = 0;
        self.k0_tokens_milli = 0;
        self.verify_tokens = 0;
        self.finished = [0; 4];
        self.prompt_tokens = 0;
        self.cached_prompt_tokens = 0;
        self.generation_tokens = 0;
        self.ttft_s.clear();
        self.itl_s.clear();
        self.e2e_s.clear();
        self.unknown_rows = 0;
        self.refused_at_cap = 0;
    }
}

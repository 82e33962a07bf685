//! What tracking a batch produces, kept apart from where it goes: outputs for the api-servers
//! ([`Outbox`]) and facts for the metrics ([`Observations`]). The tracker writes both; the live
//! ingest ships them, the tests and `replay` read them.

use std::sync::Arc;

use proto::tp_api::RequestOutput;
use proto::FinishReason;

use super::Figures;

/// Outputs grouped by owning api-server: one list (one message) per owner.
pub type OutputsByOwner = Vec<(Arc<str>, Vec<RequestOutput>)>;

/// Outputs of one or more batches, grouped by owning api-server. Owners are few (one per
/// api-server) and interned by the tracker, so a pointer comparison usually finds the group.
#[derive(Debug, Default)]
pub struct Outbox {
    by_owner: OutputsByOwner,
    /// Capacity a new owner's list starts with (the batch's row count), so a batch's outputs
    /// are not copied by repeated growth.
    capacity_hint: usize,
}

impl Outbox {
    pub fn push(&mut self, owner: &Arc<str>, output: RequestOutput) {
        let found = match self
            .by_owner
            .iter()
            .position(|(o, _)| Arc::ptr_eq(o, owner))
        {
            Some(i) => Some(i),
            None => self.by_owner.iter().position(|(o, _)| o == owner),
        };
        match found {
            Some(i) => self.by_owner[i].1.push(output),
            None => {
                let mut list = Vec::with_capacity(self.capacity_hint.max(1));
                list.push(output);
                self.by_owner.push((owner.clone(), list));
            }
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

    /// Every output, owner dropped (tests and replay).
    pub fn drain_outputs(&mut self) -> impl Iterator<Item = (Arc<str>, RequestOutput)> {
        self.take()
            .into_iter()
            .flat_map(|(owner, list)| list.into_iter().map(move |o| (owner.clone(), o)))
    }
}

/// Facts for the metrics from one batch (or resync, or failure sweep). Reused across batches so
/// the hot path does not allocate.
#[derive(Debug)]
pub struct Observations {
    /// Verification steps recorded, summed.
    pub figures: Figures,
    /// Finished requests by [`FinishReason::code`] - 1.
    pub finished: [u64; 4],
    pub prompt_tokens: u64,
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

impl Observations {
    pub fn new(num_spec_tokens: usize) -> Self {
        Self {
            figures: Figures::new(num_spec_tokens),
            finished: [0; 4],
            prompt_tokens: 0,
            generation_tokens: 0,
            ttft_s: Vec::new(),
            itl_s: Vec::new(),
            e2e_s: Vec::new(),
            unknown_rows: 0,
            refused_at_cap: 0,
        }
    }

    pub fn count_finish(&mut self, reason: FinishReason) {
        self.finished[usize::from(reason.code() - 1)] += 1;
    }

    /// Back to zero, keeping the buffers.
    pub fn clear(&mut self) {
        self.figures.clear();
        self.finished = [0; 4];
        self.prompt_tokens = 0;
        self.generation_tokens = 0;
        self.ttft_s.clear();
        self.itl_s.clear();
        self.e2e_s.clear();
        self.unknown_rows = 0;
        self.refused_at_cap = 0;
    }
}

//! One in-flight request: who owns it, what was delivered, and its figures. Fixed size plus the
//! O(K) figures; no per-step history.

use std::sync::Arc;

use proto::tp_api::{OutputError, OutputErrorKind, RequestOutput, TokenCounts};
use proto::worker_tp::{RequestStart, ResyncRequest};
use proto::{FinishReason, RequestId};

use super::{Clock, Figures};

/// A request's prompt length, and how much of it the worker's prefix cache held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptTokens {
    pub total: u32,
    pub cached: u32,
}

impl From<&RequestStart> for PromptTokens {
    fn from(start: &RequestStart) -> Self {
        Self {
            total: start.prompt_tokens,
            cached: start.cached_prompt_tokens,
        }
    }
}

impl From<&ResyncRequest> for PromptTokens {
    fn from(req: &ResyncRequest) -> Self {
        Self {
            total: req.prompt_tokens,
            cached: req.cached_prompt_tokens,
        }
    }
}

#[derive(Debug)]
pub struct RequestState {
    pub owner: Arc<str>,
    pub prompt: PromptTokens,
    pub arrival_unix_ms: u64,
    pub prefilled: bool,
    /// Tokens forwarded to the owner so far (the next output's `first_index`).
    pub delivered: u32,
    /// Monotonic time of the last delivery, for inter-token latency; None before the first.
    pub last_delivery_ns: Option<u64>,
    /// Its class's index in the tracker's [`RequestClasses`](super::RequestClasses).
    pub class: u8,
    pub figures: Figures,
}

impl RequestState {
    pub fn new(owner: Arc<str>, prompt: PromptTokens, arrival_unix_ms: u64, k: usize) -> Self {
        Self {
            owner,
            prompt,
            arrival_unix_ms,
            prefilled: false,
            delivered: 0,
            last_delivery_ns: None,
            class: 0,
            figures: Figures::new(k),
        }
    }

    /// Seconds since the request arrived at its api-server; None when the arrival time is
    /// unknown (0) or lies in the future (clocks disagree).
    pub fn age_s(&self, now: Clock) -> Option<f64> {
        if self.arrival_unix_ms == 0 || now.unix_ms < self.arrival_unix_ms {
            return None;
        }
        Some((now.unix_ms - self.arrival_unix_ms) as f64 / 1e3)
    }

    /// Counts `n` tokens as delivered; returns the index of the first of them.
    pub fn deliver(&mut self, n: usize) -> u32 {
        let first_index = self.delivered;
        self.delivered = self.delivered.saturating_add(n as u32);
        first_index
    }

    /// An output carrying `tokens`, the next in the request's stream.
    pub fn tokens_output(&mut self, id: RequestId, tokens: Vec<u32>) -> RequestOutput {
        let first_index = self.deliver(tokens.len());
        RequestOutput {
            id,
            first_index,
            tokens,
            finish: None,
            usage: None,
            speculate_metrics: None,
            error: None,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        }
    }

    /// Turns `output` into the request's final one: finish reason, usage, figures, error.
    pub fn finalize(
        &self,
        output: &mut RequestOutput,
        finish: FinishReason,
        error: Option<(OutputErrorKind, String)>,
        speculating: bool,
    ) {
        output.finish = Some(finish);
        output.usage = Some(TokenCounts {
            prompt_tokens: self.prompt.total,
            cached_prompt_tokens: self.prompt.cached,
            completion_tokens: self.delivered,
        });
        output.speculate_metrics = speculating.then(|| Box::new(self.figures.speculate_metrics()));
        output.error = error.map(|(kind, message)| OutputError { kind, message });
    }
}

//! Running the engine requests of one HTTP request: one [`ChoiceRun`] per choice (prompt × n),
//! each turning engine events into text through its own incremental decoder, bounded by the
//! request's deadline. Dropping a run aborts its engine request.

use std::sync::Arc;
use std::time::Duration;

use proto::api_worker::RejectReason;
use proto::tp_api::Usage as EngineUsage;
use proto::SpeculateMetrics;
use tokio::time::Instant;

use crate::engine::admission::Admitted;
use crate::engine::{Engine, EngineEvent, EngineFailure, EngineRequest, SubmitRequest};
use crate::error::ApiError;
use crate::openai::responses::Usage;
use crate::openai::validate::GenerateSpec;
use crate::tokenizer::detok::IncrementalDecoder;
use crate::tokenizer::Tokenizer;

/// One step of a choice's progress.
#[derive(Debug, Clone)]
pub enum ChoiceUpdate {
    Text {
        index: u32,
        text: String,
    },
    /// Boxed: an end is rare next to text updates and carries the figures.
    End(Box<ChoiceEnd>),
}

/// How a choice ended; `text` is the text not yet handed out.
#[derive(Debug, Clone)]
pub struct ChoiceEnd {
    pub index: u32,
    pub text: String,
    pub finish_reason: &'static str,
    pub stop_reason: Option<String>,
    pub usage: Usage,
    pub speculate_metrics: Option<SpeculateMetrics>,
}

/// One choice in flight, over its engine request `R`.
pub struct ChoiceRun<R> {
    pub index: u32,
    request: R,
    decoder: IncrementalDecoder,
    prompt_tokens: u32,
    deadline: Instant,
    timeout_secs: u64,
    ended: bool,
    /// Its place under the admission bound, given back when the choice is dropped.
    _admitted: Option<Admitted>,
}

fn failure_error(failure: EngineFailure) -> ApiError {
    match failure {
        EngineFailure::Rejected(RejectReason::Overloaded) => ApiError::Overloaded {
            message: failure.message(),
        },
        EngineFailure::Rejected(RejectReason::Invalid(_)) => ApiError::InvalidParam {
            param: "prompt",
            message: failure.message(),
        },
        other => ApiError::unavailable(other.message()),
    }
}

/// Admits every choice of `spec` (a 429 when the server stays full past the admission wait),
/// then submits them; on any failure the ones already submitted are aborted.
pub async fn start_choices<E: Engine>(
    engine: &E,
    tokenizer: &Arc<Tokenizer>,
    spec: &GenerateSpec,
    timeout: Duration,
) -> Result<Vec<ChoiceRun<E::Request>>, ApiError> {
    let deadline = Instant::now() + timeout;
    let sequences = spec.prompts.len() * spec.n as usize;
    let mut admitted = engine.admit(sequences).await?;
    let mut runs = Vec::with_capacity(sequences);
    for (p, prompt) in spec.prompts.iter().enumerate() {
        for j in 0..spec.n {
            let mut sampling = spec.sampling.clone();
            // Each choice samples on its own: derive distinct seeds from the request's.
            sampling.seed = sampling.seed.map(|s| s.wrapping_add(u64::from(j)));
            let request = engine.submit(SubmitRequest {
                prompt_token_ids: prompt.clone(),
                sampling,
                stop: spec.stop.clone(),
                max_tokens: spec.max_tokens[p],
            })?;
            runs.push(ChoiceRun {
                index: p as u32 * spec.n + j,
                request,
                decoder: IncrementalDecoder::new(
                    Arc::clone(tokenizer),
                    spec.stop.stop_strings.clone(),
                ),
                prompt_tokens: prompt.len() as u32,
                deadline,
                timeout_secs: timeout.as_secs(),
                ended: false,
                _admitted: admitted.pop(),
            });
        }
    }
    Ok(runs)
}

impl<R: EngineRequest> ChoiceRun<R> {
    /// The next update, `None` after the end.
    pub async fn step(&mut self) -> Option<Result<ChoiceUpdate, ApiError>> {
        if self.ended {
            return None;
        }
        let result = self.step_inner().await;
        if !matches!(result, Ok(ChoiceUpdate::Text { .. })) {
            self.ended = true;
        }
        Some(result)
    }

    async fn step_inner(&mut self) -> Result<ChoiceUpdate, ApiError> {
        loop {
            let event = match tokio::time::timeout_at(self.deadline, self.request.next()).await {
                Ok(event) => event,
                Err(_) => {
                    return Err(ApiError::Timeout {
                        secs: self.timeout_secs,
                    })
                }
            };
            match event {
                EngineEvent::Tokens(tokens) => {
                    // Stop strings are the worker's decision (it ends the request on the same
                    // token); here they only trim the text.
                    let text = self.decoder.push(&tokens);
                    if !text.is_empty() {
                        return Ok(ChoiceUpdate::Text {
                            index: self.index,
                            text,
                        });
                    }
                }
                EngineEvent::Finished(finished) => {
                    let reason = finished.reason.as_str();
                    // The token-processor attaches figures only when the worker speculates.
                    let mut end = self.end(finished.usage, finished.speculate_metrics);
                    if self.decoder.matched_stop().is_none() {
                        end.finish_reason = reason;
                    }
                    return Ok(ChoiceUpdate::End(Box::new(end)));
                }
                EngineEvent::Failed(failure) => {
                    if self.decoder.matched_stop().is_some() {
                        // The text already ended at a stop string; only the engine's
                        // confirmation (and its figures) went missing.
                        return Ok(ChoiceUpdate::End(Box::new(self.end(None, None))));
                    }
                    return Err(failure_error(failure));
                }
            }
        }
    }

    fn end(
        &mut self,
        engine_usage: Option<EngineUsage>,
        metrics: Option<SpeculateMetrics>,
    ) -> ChoiceEnd {
        let text = self.decoder.finish();
        let stop_reason = self.decoder.matched_stop().map(str::to_owned);
        // When we cut at a stop string, count the tokens we used, not what the engine ran on.
        let completion = match (&stop_reason, &engine_usage) {
            (None, Some(u)) => u.completion_tokens,
            _ => self.decoder.tokens_seen() as u32,
        };
        let cached = engine_usage.as_ref().map(|u| u.cached_prompt_tokens);
        ChoiceEnd {
            index: self.index,
            text,
            finish_reason: "stop",
            stop_reason,
            usage: Usage::new(self.prompt_tokens, completion).with_cached_tokens(cached),
            speculate_metrics: metrics,
        }
    }

    /// Runs to the end; returns the whole text and how it ended.
    pub async fn run_to_end(mut self) -> Result<(String, ChoiceEnd), ApiError> {
        let mut text = String::new();
        while let Some(update) = self.step().await {
            match update? {
                ChoiceUpdate::Text { text: piece, .. } => text.push_str(&piece),
                ChoiceUpdate::End(mut end) => {
                    text.push_str(&end.text);
                    end.text = String::new();
                    return Ok((text, *end));
                }
            }
        }
        Err(ApiError::Internal)
    }
}

/// Runs every choice concurrently; the first failure fails the request (and aborts the rest).
pub async fn collect_all<R: EngineRequest>(
    runs: Vec<ChoiceRun<R>>,
) -> Result<Vec<(String, ChoiceEnd)>, ApiError> {
    let results =
        futures::future::try_join_all(runs.into_iter().map(ChoiceRun::run_to_end)).await?;
    Ok(results)
}

/// Request usage: prompts counted once each (with their prefix-cache hits, where known),
/// completions summed over choices.
pub fn total_usage(ends: &[&ChoiceEnd], n: u32) -> Usage {
    let completion: u32 = ends.iter().map(|e| e.usage.completion_tokens).sum();
    let prompt_ends = || ends.iter().filter(|e| e.index % n.max(1) == 0);
    let prompt: u32 = prompt_ends().map(|e| e.usage.prompt_tokens).sum();
    let cached = prompt_ends()
        .filter_map(|e| e.usage.prompt_tokens_details)
        .map(|d| d.cached_tokens)
        .reduce(|a, b| a + b);
    Usage::new(prompt, completion).with_cached_tokens(cached)
}

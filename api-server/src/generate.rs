//! Running the engine requests of one HTTP request: one [`ChoiceRun`] per choice (prompt × n),
//! each turning engine events into text through its own incremental decoder, bounded by the
//! request's deadline. Dropping a run aborts its engine request.
//!
//! A request holds at most its share of the admission bound: its choices run through that many
//! [`Lane`]s, each holding one admitted sequence and starting its next choice when the last one
//! ends, so `n = 64` runs as (by default) 16 at a time and everyone else keeps the rest.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::api_worker::RejectReason;
use proto::tp_api::TokenCounts;
use proto::SpeculateMetrics;
use tokio::time::Instant;

use crate::engine::admission::{Admitted, ClientKey};
use crate::engine::{EngineEvent, EngineFailure, EngineRequest, ServingEngine, SubmitRequest};
use crate::error::ApiError;
use crate::openai::logprobs::{self, LogprobEntry, TokenNames};
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
        /// The logprobs of the tokens behind `text` (None when the request did not ask).
        logprobs: Option<Vec<LogprobEntry>>,
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
    /// The logprobs not yet handed out (the whole choice's in a response answered whole);
    /// None when the request did not ask for them.
    pub logprobs: Option<Vec<LogprobEntry>>,
}

/// One choice in flight, over its engine request `R`.
pub struct ChoiceRun<R> {
    pub index: u32,
    request: R,
    decoder: IncrementalDecoder,
    /// Present when the request asked for logprobs.
    logprobs: Option<LogprobsState>,
    /// The prompt, until its text (and logprobs) open the choice's text (`echo`).
    echo: Option<Vec<u32>>,
    prompt_tokens: u32,
    deadline: Instant,
    timeout_secs: u64,
    ended: bool,
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

/// A choice's logprobs between the engine and its updates.
struct LogprobsState {
    names: TokenNames,
    /// Of the next tokens, from [`EngineEvent::Logprobs`].
    incoming: Vec<proto::TokenLogprob>,
    /// Rendered, for tokens whose text has not been handed out yet.
    ready: Vec<LogprobEntry>,
    text_offset: usize,
    /// The prompt's, from [`EngineEvent::PromptLogprobs`], until echoed.
    prompt: Vec<proto::TokenLogprob>,
}

/// A choice not yet started: its lane submits it when the lane's previous choice ends.
struct PendingChoice {
    index: u32,
    request: SubmitRequest,
}

/// What every choice of one request shares.
struct RequestCommon<E> {
    engine: E,
    tokenizer: Arc<Tokenizer>,
    stop_strings: Vec<String>,
    token_names: TokenNames,
    echo: bool,
    deadline: Instant,
    timeout: Duration,
    /// Choices no lane has started yet, in index order.
    pending: Mutex<VecDeque<PendingChoice>>,
}

impl<E: ServingEngine> RequestCommon<E> {
    fn next_pending(&self) -> Option<PendingChoice> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    fn start(&self, choice: PendingChoice) -> Result<ChoiceRun<E::Request>, ApiError> {
        let prompt_tokens = choice.request.prompt_token_ids.len() as u32;
        let logprobs = choice.request.sampling.logprobs.map(|_| LogprobsState {
            names: self.token_names,
            incoming: Vec::new(),
            ready: Vec::new(),
            text_offset: 0,
            prompt: Vec::new(),
        });
        let echo = self.echo.then(|| choice.request.prompt_token_ids.clone());
        let request = self.engine.submit(choice.request)?;
        Ok(ChoiceRun {
            index: choice.index,
            request,
            decoder: IncrementalDecoder::new(
                Arc::clone(&self.tokenizer),
                self.stop_strings.clone(),
            ),
            logprobs,
            echo,
            prompt_tokens,
            deadline: self.deadline,
            timeout_secs: self.timeout.as_secs(),
            ended: false,
        })
    }
}

/// One admitted sequence of a request, running its choices one after another.
pub struct Lane<E: ServingEngine> {
    common: Arc<RequestCommon<E>>,
    current: Option<ChoiceRun<E::Request>>,
    /// Its place under the admission bound, given back when the lane is dropped.
    _admitted: Option<Admitted>,
}

/// Admits the choices of `spec` for `client` (a 429 when the server stays full past the
/// admission wait), then starts as many as the request was given lanes; the others start as
/// lanes free. On a failure to start, the ones already started are aborted.
pub async fn start_choices<E: ServingEngine>(
    engine: &E,
    tokenizer: &Arc<Tokenizer>,
    spec: &GenerateSpec,
    timeout: Duration,
    client: &ClientKey,
) -> Result<Vec<Lane<E>>, ApiError> {
    let deadline = Instant::now() + timeout;
    let sequences = spec.prompts.len() * spec.n as usize;
    let admitted = engine.admit(sequences, client).await?;
    let mut pending = VecDeque::with_capacity(sequences);
    for (p, prompt) in spec.prompts.iter().enumerate() {
        for j in 0..spec.n {
            let mut sampling = spec.sampling.clone();
            // Each choice samples on its own: derive distinct seeds from the request's.
            sampling.seed = sampling.seed.map(|s| s.wrapping_add(u64::from(j)));
            pending.push_back(PendingChoice {
                index: p as u32 * spec.n + j,
                request: SubmitRequest {
                    prompt_token_ids: prompt.clone(),
                    sampling,
                    stop: spec.stop.clone(),
                    max_tokens: spec.max_tokens[p],
                    class: spec.class.clone(),
                },
            });
        }
    }
    let common = Arc::new(RequestCommon {
        engine: engine.clone(),
        tokenizer: Arc::clone(tokenizer),
        stop_strings: spec.stop.stop_strings.clone(),
        token_names: match spec.tokens_as_ids {
            true => TokenNames::Ids,
            false => TokenNames::Text,
        },
        echo: spec.echo,
        deadline,
        timeout,
        pending: Mutex::new(pending),
    });
    // No bound yet (no worker reported): every choice gets a lane; routing answers.
    let lanes: Vec<Option<Admitted>> = match admitted.is_empty() {
        true => (0..sequences).map(|_| None).collect(),
        false => admitted.into_iter().map(Some).collect(),
    };
    let mut started = Vec::with_capacity(lanes.len());
    for admitted in lanes {
        let Some(choice) = common.next_pending() else {
            break;
        };
        started.push(Lane {
            current: Some(common.start(choice)?),
            common: Arc::clone(&common),
            _admitted: admitted,
        });
    }
    Ok(started)
}

impl<E: ServingEngine> Lane<E> {
    /// The next update of this lane's current choice, starting the next pending choice of the
    /// request when it ends; `None` when no choice is left. Cancel-safe (see
    /// [`ChoiceRun::step`]): nothing changes until an engine event arrives.
    pub async fn step(&mut self) -> Option<Result<ChoiceUpdate, ApiError>> {
        loop {
            if let Some(run) = &mut self.current {
                match run.step().await {
                    Some(update) => {
                        if !matches!(update, Ok(ChoiceUpdate::Text { .. })) {
                            // Ended: its engine request is done; free it before the next.
                            self.current = None;
                        }
                        return Some(update);
                    }
                    None => self.current = None,
                }
            }
            let choice = self.common.next_pending()?;
            match self.common.start(choice) {
                Ok(run) => self.current = Some(run),
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Runs every choice this lane gets to its end: each one's whole text and how it ended.
    pub async fn run_to_end(mut self) -> Result<Vec<(String, ChoiceEnd)>, ApiError> {
        let mut done = Vec::new();
        let mut text = String::new();
        let mut logprobs = Vec::new();
        while let Some(update) = self.step().await {
            match update? {
                ChoiceUpdate::Text {
                    text: piece,
                    logprobs: entries,
                    ..
                } => {
                    text.push_str(&piece);
                    logprobs.extend(entries.into_iter().flatten());
                }
                ChoiceUpdate::End(mut end) => {
                    text.push_str(&end.text);
                    end.text = String::new();
                    if let Some(rest) = end.logprobs.as_mut() {
                        logprobs.append(rest);
                        std::mem::swap(rest, &mut logprobs);
                    }
                    logprobs.clear();
                    done.push((std::mem::take(&mut text), *end));
                }
            }
        }
        Ok(done)
    }
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
                EngineEvent::Logprobs(logprobs) => {
                    if let Some(state) = &mut self.logprobs {
                        state.incoming = logprobs;
                    }
                }
                EngineEvent::PromptLogprobs(logprobs) => {
                    if let Some(state) = &mut self.logprobs {
                        state.prompt = logprobs;
                    }
                }
                EngineEvent::Tokens(tokens) => {
                    let mut text = self.take_echo();
                    // Stop strings are the worker's decision (it ends the request on the same
                    // token); here they only trim the text.
                    let seen_before = self.decoder.tokens_seen();
                    text.push_str(&self.decoder.push(&tokens));
                    let used = self.decoder.tokens_seen() - seen_before;
                    self.render_logprobs(&tokens[..used]);
                    if !text.is_empty() {
                        return Ok(ChoiceUpdate::Text {
                            index: self.index,
                            text,
                            logprobs: self.take_logprobs(),
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

    /// Renders the logprobs of `tokens` (those the text used) from the latest
    /// [`EngineEvent::Logprobs`]; tokens past a stop string get none.
    fn render_logprobs(&mut self, tokens: &[u32]) {
        let Some(state) = &mut self.logprobs else {
            return;
        };
        let incoming = std::mem::take(&mut state.incoming);
        let entries = logprobs::render(
            self.decoder.tokenizer(),
            state.names,
            tokens,
            &incoming,
            &mut state.text_offset,
        );
        state.ready.extend(entries);
    }

    /// The echoed prompt's text, its logprobs rendered ahead of the output's; empty once
    /// taken or without `echo`.
    fn take_echo(&mut self) -> String {
        let Some(prompt) = self.echo.take() else {
            return String::new();
        };
        let tokenizer = self.decoder.tokenizer();
        if let Some(state) = &mut self.logprobs {
            let scored = std::mem::take(&mut state.prompt);
            let entries = logprobs::render_prompt(
                tokenizer,
                state.names,
                &prompt,
                &scored,
                &mut state.text_offset,
            );
            state.ready.extend(entries);
        }
        // Special tokens too: the echo is the prompt as it was sent.
        tokenizer.decode(&prompt, false)
    }

    fn take_logprobs(&mut self) -> Option<Vec<LogprobEntry>> {
        self.logprobs
            .as_mut()
            .map(|state| std::mem::take(&mut state.ready))
    }

    fn end(
        &mut self,
        engine_usage: Option<TokenCounts>,
        metrics: Option<SpeculateMetrics>,
    ) -> ChoiceEnd {
        let mut text = self.take_echo();
        text.push_str(&self.decoder.finish());
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
            logprobs: self.take_logprobs(),
        }
    }
}

/// Runs every lane concurrently; the first failure fails the request (and aborts the rest).
pub async fn collect_all<E: ServingEngine>(
    lanes: Vec<Lane<E>>,
) -> Result<Vec<(String, ChoiceEnd)>, ApiError> {
    let results = futures::future::try_join_all(lanes.into_iter().map(Lane::run_to_end)).await?;
    Ok(results.into_iter().flatten().collect())
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

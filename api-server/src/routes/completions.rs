//! `POST /v1/completions`.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::AppState;
use crate::body::{read_json, Parsed};
use crate::error::ApiError;
use crate::generate::{collect_all, start_choices, total_usage, ChoiceUpdate};
use crate::openai::requests::CompletionRequest;
use crate::openai::responses::{
    response_id, unix_now, Chunk, CompletionChoice, CompletionResponse, UsageField,
};
use crate::openai::validate::{check_model, completion_prompts, generate_spec, DefaultMaxTokens};
use crate::stream::{first_updates, sse_event, sse_response, StreamItem, FIRST_UPDATE_PATIENCE};

const OBJECT: &str = "text_completion";
/// vLLM's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: u32 = 16;

fn unsupported_fields(req: &CompletionRequest) -> Result<(), ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    if req.logprobs.as_ref().is_some_and(|l| !l.is_null()) {
        return Err(ApiError::invalid("logprobs", "logprobs are not supported"));
    }
    if req.suffix.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    if req
        .best_of
        .is_some_and(|b| Some(b) != req.sampling.n.or(Some(1)))
    {
        return Err(ApiError::invalid("best_of", "best_of must equal n"));
    }
    Ok(())
}

pub async fn handle(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Parsed { value: req, heavy } =
        read_json::<CompletionRequest>(&headers, body, &state.body).await?;
    check_model(req.model.as_deref(), &state.model_names)?;
    unsupported_fields(&req)?;
    let (assets, limits) = (Arc::clone(&state.model), state.limits());
    let spec = state
        .body
        .run(heavy, move || {
            let prompts = completion_prompts(&req.prompt, &assets.tokenizer, &limits)?;
            generate_spec(
                prompts,
                &req.sampling,
                req.sampling.max_tokens,
                DefaultMaxTokens::Fixed(DEFAULT_MAX_TOKENS),
                &assets.tokenizer,
                &limits,
            )
        })
        .await?;
    let tokenizer = &state.model.tokenizer;
    let runs = start_choices(&state.engine, tokenizer, &spec, state.request_timeout).await?;
    let id = response_id("cmpl");
    let created = unix_now();
    let model = state.served_model_name.to_string();

    if spec.stream {
        let usage_field = UsageField::for_stream_chunks(spec.include_usage);
        let format = move |item: StreamItem<'_>| -> Bytes {
            let (choices, usage) = match item {
                StreamItem::Update(ChoiceUpdate::Text { index, text }) => (
                    vec![CompletionChoice {
                        index: *index,
                        text: text.clone(),
                        logprobs: None,
                        finish_reason: None,
                        stop_reason: None,
                        speculate_metrics: None,
                    }],
                    usage_field,
                ),
                StreamItem::Update(ChoiceUpdate::End(end)) => (
                    vec![CompletionChoice {
                        index: end.index,
                        text: end.text.clone(),
                        logprobs: None,
                        finish_reason: Some(end.finish_reason),
                        stop_reason: end.stop_reason.clone(),
                        speculate_metrics: end.speculate_metrics.clone(),
                    }],
                    usage_field,
                ),
                StreamItem::Usage(usage) => (Vec::new(), UsageField::Totals(usage)),
            };
            sse_event(&Chunk {
                id: id.clone(),
                object: OBJECT,
                created,
                model: model.clone(),
                choices,
                usage,
            })
        };
        let runs = first_updates(runs, FIRST_UPDATE_PATIENCE).await?;
        return Ok(sse_response(
            runs,
            Vec::new(),
            spec.include_usage,
            spec.n,
            format,
        ));
    }

    let results = collect_all(runs).await?;
    let ends: Vec<_> = results.iter().map(|(_, end)| end).collect();
    let usage = total_usage(&ends, spec.n);
    let mut choices: Vec<CompletionChoice> = results
        .into_iter()
        .map(|(text, end)| CompletionChoice {
            index: end.index,
            text,
            logprobs: None,
            finish_reason: Some(end.finish_reason),
            stop_reason: end.stop_reason,
            speculate_metrics: end.speculate_metrics,
        })
        .collect();
    choices.sort_by_key(|c| c.index);
    Ok(Json(CompletionResponse {
        id,
        object: OBJECT,
        created,
        model,
        choices,
        usage: Some(usage),
    })
    .into_response())
}

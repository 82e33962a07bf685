//! `POST /v1/chat/completions`.

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
use crate::openai::requests::ChatCompletionRequest;
use crate::openai::responses::{
    response_id, unix_now, AssistantMessage, ChatChoice, ChatChunkChoice, ChatResponse, Chunk,
    Delta, UsageField,
};
use crate::openai::validate::{chat_prompt, check_model, generate_spec, DefaultMaxTokens};
use crate::stream::{first_updates, sse_event, sse_response, StreamItem, FIRST_UPDATE_PATIENCE};

const OBJECT: &str = "chat.completion";
const CHUNK_OBJECT: &str = "chat.completion.chunk";

pub async fn handle(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Parsed { value: req, heavy } =
        read_json::<ChatCompletionRequest>(&headers, body, &state.body).await?;
    check_model(req.model.as_deref(), &state.model_names)?;
    let (assets, limits) = (Arc::clone(&state.model), state.limits());
    let spec = state
        .body
        .run(heavy, move || {
            let tokenizer = &assets.tokenizer;
            let prompt = chat_prompt(&req, assets.chat_template.as_ref(), tokenizer, &limits)?;
            // `max_completion_tokens` is the newer name; it wins when both are given.
            let max_tokens = req.max_completion_tokens.or(req.sampling.max_tokens);
            generate_spec(
                vec![prompt],
                &req.sampling,
                max_tokens,
                DefaultMaxTokens::RestOfContext,
                tokenizer,
                &limits,
            )
        })
        .await?;
    let tokenizer = &state.model.tokenizer;
    let runs = start_choices(&state.engine, tokenizer, &spec, state.request_timeout).await?;
    let id = response_id("chatcmpl");
    let created = unix_now();
    let model = state.served_model_name.to_string();

    if spec.stream {
        let usage_field = UsageField::for_stream_chunks(spec.include_usage);
        let chunk = {
            let (id, model) = (id.clone(), model.clone());
            move |choices: Vec<ChatChunkChoice>, usage: UsageField| {
                sse_event(&Chunk {
                    id: id.clone(),
                    object: CHUNK_OBJECT,
                    created,
                    model: model.clone(),
                    choices,
                    usage,
                })
            }
        };
        // vLLM opens each choice with the assistant role and empty content.
        let prelude: Vec<Bytes> = (0..spec.n)
            .map(|index| {
                chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta: Delta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                        },
                        logprobs: None,
                        finish_reason: None,
                        stop_reason: None,
                        speculate_metrics: None,
                    }],
                    usage_field,
                )
            })
            .collect();
        let format = move |item: StreamItem<'_>| -> Bytes {
            match item {
                StreamItem::Update(ChoiceUpdate::Text { index, text }) => chunk(
                    vec![ChatChunkChoice {
                        index: *index,
                        delta: Delta {
                            role: None,
                            content: Some(text.clone()),
                        },
                        logprobs: None,
                        finish_reason: None,
                        stop_reason: None,
                        speculate_metrics: None,
                    }],
                    usage_field,
                ),
                StreamItem::Update(ChoiceUpdate::End(end)) => chunk(
                    vec![ChatChunkChoice {
                        index: end.index,
                        delta: Delta {
                            role: None,
                            content: (!end.text.is_empty()).then(|| end.text.clone()),
                        },
                        logprobs: None,
                        finish_reason: Some(end.finish_reason),
                        stop_reason: end.stop_reason.clone(),
                        speculate_metrics: end.speculate_metrics.clone(),
                    }],
                    usage_field,
                ),
                StreamItem::Usage(usage) => chunk(Vec::new(), UsageField::Totals(usage)),
            }
        };
        let runs = first_updates(runs, FIRST_UPDATE_PATIENCE).await?;
        return Ok(sse_response(
            runs,
            prelude,
            spec.include_usage,
            spec.n,
            format,
        ));
    }

    let results = collect_all(runs).await?;
    let ends: Vec<_> = results.iter().map(|(_, end)| end).collect();
    let usage = total_usage(&ends, spec.n);
    let mut choices: Vec<ChatChoice> = results
        .into_iter()
        .map(|(text, end)| ChatChoice {
            index: end.index,
            message: AssistantMessage {
                role: "assistant",
                content: text,
            },
            logprobs: None,
            finish_reason: Some(end.finish_reason),
            stop_reason: end.stop_reason,
            speculate_metrics: end.speculate_metrics,
        })
        .collect();
    choices.sort_by_key(|c| c.index);
    Ok(Json(ChatResponse {
        id,
        object: OBJECT,
        created,
        model,
        choices,
        usage,
    })
    .into_response())
}

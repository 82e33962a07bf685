//! What chat and completions share: read the body and check its model, turn it into a
//! [`GenerateSpec`] (off the runtime when the body is heavy), start its choices, then answer
//! whole or as a stream. A [`Flavour`] says what differs: the request and the choices' shape.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::AppState;
use crate::body::{read_json, Parsed};
use crate::client_key::ClientSocket;
use crate::engine::admission::ClientKey;
use crate::engine::ServingEngine;
use crate::error::ApiError;
use crate::generate::{collect_all, start_choices, total_usage, ChoiceEnd, Lane};
use crate::model::ModelAssets;
use crate::openai::logprobs::LogprobEntry;
use crate::openai::requests::SamplingFields;
use crate::openai::responses::{response_id, unix_now, Chunk, Usage, UsageField, WholeResponse};
use crate::openai::validate::{check_model, GenerateSpec, Limits};
use crate::stream::{
    first_updates, sse_event, sse_response, Delivery, StreamChunks, FIRST_UPDATE_PATIENCE,
};

/// What one generation route does its own way.
pub trait Flavour: Send + Sync + 'static {
    type Request: DeserializeOwned + Send + 'static;
    /// A choice of the whole response.
    type Choice: Serialize;
    /// A choice of a stream chunk.
    type ChunkChoice: Serialize;
    /// The response id's prefix (`cmpl`, `chatcmpl`).
    const ID_PREFIX: &'static str;
    const OBJECT: &'static str;
    const CHUNK_OBJECT: &'static str;

    /// The request's `model` field.
    fn model(request: &Self::Request) -> Option<&str>;
    /// The request's sampling fields (shared by both routes).
    fn sampling(request: &Self::Request) -> &SamplingFields;
    /// Checks the request and tokenizes its prompts (on the blocking pool when heavy).
    fn spec(
        request: Self::Request,
        model: &ModelAssets,
        limits: &Limits,
    ) -> Result<GenerateSpec, ApiError>;
    /// What opens choice `index` before any output, if anything.
    fn opening(index: u32) -> Option<Self::ChunkChoice>;
    fn text_chunk(
        index: u32,
        text: String,
        logprobs: Option<Vec<LogprobEntry>>,
    ) -> Self::ChunkChoice;
    fn end_chunk(end: &ChoiceEnd) -> Self::ChunkChoice;
    fn choice(text: String, end: ChoiceEnd) -> Self::Choice;
}

/// The handler of a generation route; the router names its [`Flavour`].
pub async fn handle<E: ServingEngine, F: Flavour>(
    State(state): State<AppState<E>>,
    client: ClientKey,
    ClientSocket(socket): ClientSocket,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Parsed { value: req, heavy } = read_json::<F::Request>(&headers, body, &state.body).await?;
    check_model(F::model(&req), &state.model_names)?;
    // Checking a schema (compiling it, its first masks) is bounded work, but not light work
    // for the runtime that answers everyone and sends the links' heartbeats.
    let heavy = heavy || F::sampling(&req).response_format.is_some();
    let (assets, limits) = (Arc::clone(&state.model), state.limits());
    let mut spec = state
        .body
        .run(heavy, move || F::spec(req, &assets, &limits))
        .await?;
    spec.class = state.request_classes.resolve(&headers, &spec.class);
    let tokenizer = &state.model.tokenizer;
    let lanes = start_choices(
        &state.engine,
        tokenizer,
        &spec,
        state.request_timeout,
        &client,
    )
    .await?;
    let head = Head {
        id: response_id(F::ID_PREFIX),
        created: unix_now(),
        model: state.served_model_name.to_string(),
    };
    if spec.stream {
        let chunks = Chunks::<F> {
            head,
            n: spec.n,
            usage: UsageField::for_stream_chunks(spec.include_usage),
            flavour: PhantomData,
        };
        let lanes = first_updates(lanes, FIRST_UPDATE_PATIENCE).await?;
        return Ok(sse_response(
            lanes,
            chunks,
            spec.include_usage,
            spec.n,
            Delivery {
                write_timeout: state.stream_write_timeout,
                socket,
            },
        ));
    }
    answer_whole::<F, _>(lanes, head, spec.n).await
}

/// What every chunk and response of one request carries.
struct Head {
    id: String,
    created: u64,
    model: String,
}

/// Runs every choice to its end and answers with all of them.
async fn answer_whole<F: Flavour, E: ServingEngine>(
    lanes: Vec<Lane<E>>,
    head: Head,
    n: u32,
) -> Result<Response, ApiError> {
    let mut results = collect_all(lanes).await?;
    // Rendering the choices (logprobs' token texts) and the JSON is off the runtime: with
    // `echo` and 20 logprobs a response runs to megabytes.
    let body = tokio::task::spawn_blocking(move || {
        let ends: Vec<_> = results.iter().map(|(_, end)| end).collect();
        let usage = total_usage(&ends, n);
        results.sort_by_key(|(_, end)| end.index);
        serde_json::to_vec(&WholeResponse {
            id: head.id,
            object: F::OBJECT,
            created: head.created,
            model: head.model,
            choices: results
                .into_iter()
                .map(|(text, end)| F::choice(text, end))
                .collect(),
            usage,
        })
    })
    .await
    .map_err(|_| ApiError::Internal)?
    .map_err(|error| {
        tracing::error!(%error, "cannot serialize a response");
        ApiError::Internal
    })?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}

/// A stream's chunks in flavour `F`.
struct Chunks<F> {
    head: Head,
    n: u32,
    /// `usage` on every chunk but the usage chunk.
    usage: UsageField,
    flavour: PhantomData<fn() -> F>,
}

impl<F: Flavour> Chunks<F> {
    fn chunk(&self, choices: Vec<F::ChunkChoice>, usage: UsageField) -> Bytes {
        sse_event(&Chunk {
            id: self.head.id.clone(),
            object: F::CHUNK_OBJECT,
            created: self.head.created,
            model: self.head.model.clone(),
            choices,
            usage,
        })
    }
}

impl<F: Flavour> StreamChunks for Chunks<F> {
    fn opening(&self) -> Vec<Bytes> {
        (0..self.n)
            .filter_map(F::opening)
            .map(|choice| self.chunk(vec![choice], self.usage))
            .collect()
    }

    fn text(&self, index: u32, text: String, logprobs: Option<Vec<LogprobEntry>>) -> Bytes {
        self.chunk(vec![F::text_chunk(index, text, logprobs)], self.usage)
    }

    fn end(&self, end: &ChoiceEnd) -> Bytes {
        self.chunk(vec![F::end_chunk(end)], self.usage)
    }

    fn usage(&self, usage: Usage) -> Bytes {
        self.chunk(Vec::new(), UsageField::Totals(usage))
    }
}

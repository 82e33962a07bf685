//! Server-sent events for streamed responses: `data: <chunk>` per update, the usage chunk when
//! asked for, an error event if the request fails midway, and always `data: [DONE]` last.
//! Dropping the body (client gone) drops the runs, which aborts their engine requests.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};
use serde::Serialize;

use crate::engine::EngineRequest;
use crate::error::ApiError;
use crate::generate::{ChoiceEnd, ChoiceRun, ChoiceUpdate};
use crate::openai::responses::Usage;

/// How a stream writes its chunks; chat's and completions' differ in their choices.
pub trait StreamChunks: Send + 'static {
    /// What goes before any output (chat opens each choice with the assistant role).
    fn opening(&self) -> Vec<Bytes>;
    /// A choice's new text.
    fn text(&self, index: u32, text: String) -> Bytes;
    /// A choice's end, with its last text and figures.
    fn end(&self, end: &ChoiceEnd) -> Bytes;
    /// The final usage chunk (only with `include_usage`).
    fn usage(&self, usage: Usage) -> Bytes;
}

pub fn sse_event<T: Serialize>(value: &T) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "{}".into());
    Bytes::from(format!("data: {json}\n\n"))
}

fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

fn error_event(err: &ApiError) -> Bytes {
    Bytes::from(format!("data: {}\n\n", err.envelope_json()))
}

/// How long a stream waits for its first output before answering 200 anyway. A refusal or a
/// failure within it (a worker rejects at once) gets its HTTP status; a request queued longer
/// learns now that it was admitted, and a later failure arrives as an error event.
pub const FIRST_UPDATE_PATIENCE: Duration = Duration::from_millis(500);

/// A run with its first update taken when it came within the patience (see [`first_updates`]).
pub struct PrimedRun<R> {
    run: ChoiceRun<R>,
    first: Option<ChoiceUpdate>,
}

/// Waits up to `patience` for every run's first update, so a request the engine refuses or
/// fails before any output gets a proper HTTP status instead of a 200 stream holding an error
/// event, while a queued one is not left without a status.
pub async fn first_updates<R: EngineRequest>(
    runs: Vec<ChoiceRun<R>>,
    patience: Duration,
) -> Result<Vec<PrimedRun<R>>, ApiError> {
    let until = tokio::time::Instant::now() + patience;
    futures::future::try_join_all(runs.into_iter().map(|mut run| async move {
        // `step` is cancel-safe: it changes nothing until an engine event arrives.
        match tokio::time::timeout_at(until, run.step()).await {
            Ok(Some(Ok(first))) => Ok(PrimedRun {
                run,
                first: Some(first),
            }),
            Ok(Some(Err(err))) => Err(err),
            Ok(None) => Err(ApiError::Internal),
            Err(_) => Ok(PrimedRun { run, first: None }),
        }
    }))
    .await
}

/// Merges the choices' updates into one SSE body, each update written as one chunk.
pub fn sse_response<R: EngineRequest>(
    runs: Vec<PrimedRun<R>>,
    chunks: impl StreamChunks,
    include_usage: bool,
    n: u32,
) -> Response {
    let updates = stream::select_all(runs.into_iter().map(|PrimedRun { run, first }| {
        Box::pin(
            stream::iter(first.map(Ok)).chain(stream::unfold(run, |mut run| async move {
                run.step().await.map(|update| (update, run))
            })),
        )
    }));
    let opening = chunks.opening();
    let body = stream::iter(opening.into_iter().map(Ok::<_, Infallible>)).chain(events(
        updates,
        include_usage,
        n,
        chunks,
    ));
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn events<S, C>(
    updates: S,
    include_usage: bool,
    n: u32,
    chunks: C,
) -> impl Stream<Item = Result<Bytes, Infallible>>
where
    S: Stream<Item = Result<ChoiceUpdate, ApiError>> + Unpin + Send + 'static,
    C: StreamChunks,
{
    struct State<S, C> {
        /// `None` once failed: dropping the runs aborts their engine requests at once.
        updates: Option<S>,
        chunks: C,
        ends: Vec<ChoiceEnd>,
        finished: bool,
    }
    let state = State {
        updates: Some(updates),
        chunks,
        ends: Vec::new(),
        finished: false,
    };
    stream::unfold(state, move |mut st| async move {
        if st.finished {
            return None;
        }
        let updates = st.updates.as_mut()?;
        match updates.next().await {
            Some(Ok(ChoiceUpdate::Text { index, text })) => {
                Some((Ok(st.chunks.text(index, text)), st))
            }
            Some(Ok(ChoiceUpdate::End(end))) => {
                let bytes = st.chunks.end(&end);
                st.ends.push(*end);
                Some((Ok(bytes), st))
            }
            Some(Err(err)) => {
                st.finished = true;
                st.updates = None;
                let mut bytes = error_event(&err).to_vec();
                bytes.extend_from_slice(&done());
                Some((Ok(Bytes::from(bytes)), st))
            }
            None => {
                st.finished = true;
                let mut bytes = Vec::new();
                if include_usage {
                    let ends: Vec<&ChoiceEnd> = st.ends.iter().collect();
                    let usage = crate::generate::total_usage(&ends, n);
                    bytes.extend_from_slice(&st.chunks.usage(usage));
                }
                bytes.extend_from_slice(&done());
                Some((Ok(Bytes::from(bytes)), st))
            }
        }
    })
}

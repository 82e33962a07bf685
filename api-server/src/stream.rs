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

use crate::error::ApiError;
use crate::generate::{ChoiceEnd, ChoiceRun, ChoiceUpdate};
use crate::openai::responses::Usage;

/// What the formatter is asked to write.
pub enum StreamItem<'a> {
    Update(&'a ChoiceUpdate),
    /// The final usage chunk (only with `include_usage`).
    Usage(Usage),
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

/// Merges the choices' updates into one SSE body. `prelude` goes first (chat's role chunks);
/// `format` turns each update into one chunk.
/// How long a stream waits for its first output before answering 200 anyway. A refusal or a
/// failure within it (a worker rejects at once) gets its HTTP status; a request queued longer
/// learns now that it was admitted, and a later failure arrives as an error event.
pub const FIRST_UPDATE_PATIENCE: Duration = Duration::from_millis(500);

/// A run with its first update taken when it came within the patience (see [`first_updates`]).
pub struct PrimedRun {
    run: ChoiceRun,
    first: Option<ChoiceUpdate>,
}

/// Waits up to `patience` for every run's first update, so a request the engine refuses or
/// fails before any output gets a proper HTTP status instead of a 200 stream holding an error
/// event, while a queued one is not left without a status.
pub async fn first_updates(
    runs: Vec<ChoiceRun>,
    patience: Duration,
) -> Result<Vec<PrimedRun>, ApiError> {
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

pub fn sse_response<F>(
    runs: Vec<PrimedRun>,
    prelude: Vec<Bytes>,
    include_usage: bool,
    n: u32,
    format: F,
) -> Response
where
    F: Fn(StreamItem<'_>) -> Bytes + Send + 'static,
{
    let updates = stream::select_all(runs.into_iter().map(|PrimedRun { run, first }| {
        Box::pin(
            stream::iter(first.map(Ok)).chain(stream::unfold(run, |mut run| async move {
                run.step().await.map(|update| (update, run))
            })),
        )
    }));
    let body = stream::iter(prelude.into_iter().map(Ok::<_, Infallible>)).chain(events(
        updates,
        include_usage,
        n,
        format,
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

fn events<S, F>(
    updates: S,
    include_usage: bool,
    n: u32,
    format: F,
) -> impl Stream<Item = Result<Bytes, Infallible>>
where
    S: Stream<Item = Result<ChoiceUpdate, ApiError>> + Unpin + Send + 'static,
    F: Fn(StreamItem<'_>) -> Bytes + Send + 'static,
{
    struct State<S, F> {
        /// `None` once failed: dropping the runs aborts their engine requests at once.
        updates: Option<S>,
        format: F,
        ends: Vec<ChoiceEnd>,
        finished: bool,
    }
    let state = State {
        updates: Some(updates),
        format,
        ends: Vec::new(),
        finished: false,
    };
    stream::unfold(state, move |mut st| async move {
        if st.finished {
            return None;
        }
        let updates = st.updates.as_mut()?;
        match updates.next().await {
            Some(Ok(update)) => {
                let bytes = (st.format)(StreamItem::Update(&update));
                if let ChoiceUpdate::End(end) = update {
                    st.ends.push(*end);
                }
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
                    bytes.extend_from_slice(&(st.format)(StreamItem::Usage(usage)));
                }
                bytes.extend_from_slice(&done());
                Some((Ok(Bytes::from(bytes)), st))
            }
        }
    })
}

//! Server-sent events for streamed responses: `data: <chunk>` per update, the usage chunk when
//! asked for, an error event if the request fails midway, and always `data: [DONE]` last.
//!
//! A task of its own drives each stream's choices and hands the chunks to the body through a
//! short queue, so the request's deadline holds whether or not hyper polls the body (it stops
//! when the client stops reading and the socket fills). A client that takes nothing for the
//! write timeout loses its response: the task stops, which drops the runs, aborts their engine
//! requests and gives their admitted sequences back, and the body ends with an error, so the
//! connection closes without the chunked terminator. The same happens at once when the client
//! goes away (the body is dropped).
//!
//! "Takes nothing" is read off the connection's socket where there is one: bytes wait to reach
//! the client and none was acknowledged for the write timeout (`TCP_INFO`), so the timeout
//! counts from the client's last read, not from when the buffers between us filled. Without a
//! socket (in-process tests) the stream's queue staying full for the timeout says the same.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};
use serde::Serialize;

use link::http::ConnectionSocket;

use crate::engine::ServingEngine;
use crate::error::ApiError;
use crate::generate::{ChoiceEnd, ChoiceUpdate, Lane};
use crate::openai::logprobs::LogprobEntry;
use crate::openai::responses::Usage;

/// How a stream writes its chunks; chat's and completions' differ in their choices.
pub trait StreamChunks: Send + 'static {
    /// What goes before any output (chat opens each choice with the assistant role).
    fn opening(&self) -> Vec<Bytes>;
    /// A choice's new text.
    fn text(&self, index: u32, text: String, logprobs: Option<Vec<LogprobEntry>>) -> Bytes;
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

/// Chunks a stream's task may run ahead of the body before it waits for the client.
pub const STREAM_QUEUE_CHUNKS: usize = 32;

/// A lane with its first update taken when it came within the patience (see [`first_updates`]).
pub struct PrimedLane<E: ServingEngine> {
    lane: Lane<E>,
    first: Option<ChoiceUpdate>,
}

/// Waits up to `patience` for every run's first update, so a request the engine refuses or
/// fails before any output gets a proper HTTP status instead of a 200 stream holding an error
/// event, while a queued one is not left without a status.
pub async fn first_updates<E: ServingEngine>(
    lanes: Vec<Lane<E>>,
    patience: Duration,
) -> Result<Vec<PrimedLane<E>>, ApiError> {
    let until = tokio::time::Instant::now() + patience;
    futures::future::try_join_all(lanes.into_iter().map(|mut lane| async move {
        // `step` is cancel-safe: it changes nothing until an engine event arrives.
        match tokio::time::timeout_at(until, lane.step()).await {
            Ok(Some(Ok(first))) => Ok(PrimedLane {
                lane,
                first: Some(first),
            }),
            Ok(Some(Err(err))) => Err(err),
            Ok(None) => Err(ApiError::Internal),
            Err(_) => Ok(PrimedLane { lane, first: None }),
        }
    }))
    .await
}

/// How a stream learns that its client stopped reading.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    pub write_timeout: Duration,
    pub socket: Option<ConnectionSocket>,
}

/// Merges the lanes' updates into one SSE body, each update written as one chunk; a client that
/// reads nothing for the write timeout loses the stream (see the module's doc).
pub fn sse_response<E: ServingEngine>(
    lanes: Vec<PrimedLane<E>>,
    chunks: impl StreamChunks,
    include_usage: bool,
    n: u32,
    delivery: Delivery,
) -> Response {
    let updates = stream::select_all(lanes.into_iter().map(|PrimedLane { lane, first }| {
        Box::pin(
            stream::iter(first.map(Ok)).chain(stream::unfold(lane, |mut lane| async move {
                lane.step().await.map(|update| (update, lane))
            })),
        )
    }));
    let opening = chunks.opening();
    let chunks = stream::iter(opening).chain(events(updates, include_usage, n, chunks));
    let mut response = Body::from_stream(drive(chunks, delivery)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Runs `chunks` on a task of its own and returns the body's side: the chunks, then an error if
/// the task gave up on a client that stopped reading.
fn drive(
    chunks: impl Stream<Item = Bytes> + Send + 'static,
    delivery: Delivery,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let write_timeout = delivery.write_timeout;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(STREAM_QUEUE_CHUNKS);
    let gave_up = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&gave_up);
    tokio::spawn(async move {
        let mut chunks = std::pin::pin!(chunks);
        let mut unread = std::pin::pin!(unread_for(delivery));
        let stopped_reading = loop {
            let chunk = tokio::select! {
                chunk = chunks.next() => chunk,
                // The body was dropped: the client went away.
                () = tx.closed() => return,
                () = &mut unread => break true,
            };
            let Some(chunk) = chunk else { return };
            tokio::select! {
                sent = tokio::time::timeout(write_timeout, tx.send(chunk)) => match sent {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return,
                    Err(_) => break true,
                },
                () = &mut unread => break true,
            }
        };
        if stopped_reading {
            flag.store(true, Ordering::Release);
            tracing::info!(
                write_timeout_s = write_timeout.as_secs_f64(),
                "a stream's client read nothing for the write timeout; stream dropped"
            );
        }
    });
    let received = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (Ok(chunk), rx))
    });
    let ending = stream::once(async move {
        match gave_up.load(Ordering::Acquire) {
            // Ends the body with an error: hyper closes the connection mid-chunk.
            true => Some(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client stopped reading",
            ))),
            false => None,
        }
    })
    .filter_map(std::future::ready);
    received.chain(ending)
}

/// Resolves once the connection's socket shows bytes waiting for the client and none
/// acknowledged for the write timeout; never without a socket.
async fn unread_for(delivery: Delivery) {
    let Some(socket) = delivery.socket else {
        return std::future::pending().await;
    };
    let timeout = delivery.write_timeout;
    let mut check = tokio::time::interval(
        (timeout / 4).clamp(Duration::from_millis(10), Duration::from_millis(500)),
    );
    let mut acked = None;
    let mut progress = tokio::time::Instant::now();
    loop {
        let now = check.tick().await;
        let Some(seen) = socket.delivery() else {
            // The socket is gone: the connection ends, and the body with it.
            return std::future::pending().await;
        };
        if seen.pending == 0 || acked != Some(seen.acked) {
            acked = Some(seen.acked);
            progress = now;
        } else if now.duration_since(progress) >= timeout {
            return;
        }
    }
}

fn events<S, C>(updates: S, include_usage: bool, n: u32, chunks: C) -> impl Stream<Item = Bytes>
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
            Some(Ok(ChoiceUpdate::Text {
                index,
                text,
                logprobs,
            })) => Some((st.chunks.text(index, text, logprobs), st)),
            Some(Ok(ChoiceUpdate::End(end))) => {
                let bytes = st.chunks.end(&end);
                st.ends.push(*end);
                Some((bytes, st))
            }
            Some(Err(err)) => {
                st.finished = true;
                st.updates = None;
                let mut bytes = error_event(&err).to_vec();
                bytes.extend_from_slice(&done());
                Some((Bytes::from(bytes), st))
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
                Some((Bytes::from(bytes), st))
            }
        }
    })
}

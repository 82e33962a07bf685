//! Reading a JSON request body safely: `Content-Type: application/json` (415 otherwise: a web
//! page can POST `text/plain` without a CORS preflight, never JSON), size cap (413 before
//! reading past it), a read deadline
//! (408 for a client that trickles its body), nesting cap, syntax (400), must be an object
//! (400), then the typed schema (422). A large body is read, parsed and later tokenized under
//! one of a few permits and off the async runtime ([`BodyLimits::run`]): a burst of 4 MiB bodies
//! costs a bounded amount of memory and never stalls the runtime threads that serve everyone
//! else (and answer the peers' heartbeats).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::error::ApiError;

/// Bodies above this many bytes (or of unknown length) are heavy: read and handled under a
/// permit, parsed and tokenized on the blocking pool. Real chat requests are far smaller.
pub const HEAVY_BODY_BYTES: usize = 64 * 1024;

/// How request bodies are read.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    pub max_bytes: usize,
    /// The whole body must arrive within this.
    pub read_timeout: Duration,
    /// Heavy bodies handled at once.
    heavy: Arc<Semaphore>,
}

impl BodyLimits {
    /// `heavy_at_once`: heavy bodies read, parsed or tokenized at the same time (at least 1).
    pub fn new(max_bytes: usize, read_timeout: Duration, heavy_at_once: usize) -> Self {
        Self {
            max_bytes,
            read_timeout,
            heavy: Arc::new(Semaphore::new(heavy_at_once.max(1))),
        }
    }

    /// One of the heavy permits, waited for at most the body's read timeout (then a 503): a
    /// burst of large bodies cannot queue requests without bound behind it.
    async fn heavy_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
        match tokio::time::timeout(self.read_timeout, self.heavy.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(ApiError::Internal),
            Err(_) => Err(ApiError::unavailable(
                "too many large request bodies are being handled; retry later",
            )),
        }
    }

    /// Runs CPU-bound request work: inline for a light body, else under a permit on the
    /// blocking pool.
    pub async fn run<T, F>(&self, heavy: bool, work: F) -> Result<T, ApiError>
    where
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        if !heavy {
            return work();
        }
        let _permit = self.heavy_permit().await?;
        on_blocking_pool(work).await
    }
}

/// Runs `work` on the blocking pool (a panic in it is an internal error).
async fn on_blocking_pool<T, F>(work: F) -> Result<T, ApiError>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| ApiError::Internal)?
}

/// How long an oversized body is read and thrown away before its 413 (see [`discard`]).
pub const DISCARD_WITHIN: Duration = Duration::from_secs(10);

/// Most bytes of an oversized body read and thrown away.
pub const DISCARD_AT_MOST: usize = 256 << 20;

/// Reads an oversized body to its end (at most [`DISCARD_AT_MOST`] bytes, for at most `within`)
/// and drops it, so that the 413 reaches a client that writes its whole body before reading
/// (Python's `http.client`, curl without `Expect`): closing with unread bytes makes the kernel
/// reset the connection, and the client sees EPIPE instead of the error (nginx's lingering
/// close exists for the same reason). Costs only bandwidth: nothing is kept.
async fn discard(body: Body, within: Duration) {
    let mut body = body.into_data_stream();
    let mut read = 0usize;
    let drain = async {
        use futures::StreamExt;
        while let Some(Ok(chunk)) = body.next().await {
            read += chunk.len();
            if read > DISCARD_AT_MOST {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(within, drain).await;
}

/// A parsed body, and whether it was heavy (its later work goes through [`BodyLimits::run`]).
#[derive(Debug)]
pub struct Parsed<T> {
    pub value: T,
    pub heavy: bool,
}

/// Deepest `[`/`{` nesting accepted; real requests need a handful.
pub const MAX_JSON_DEPTH: usize = 32;

/// Nesting depth of JSON text, counting brackets outside strings. Runs before parsing so a
/// deeply nested body never reaches the recursive parser.
pub fn json_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Whether the body is declared JSON: `application/json`, parameters (charset) allowed.
pub fn declared_json(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// Reads and parses the body as `T`.
pub async fn read_json<T: DeserializeOwned + Send + 'static>(
    headers: &HeaderMap,
    body: Body,
    limits: &BodyLimits,
) -> Result<Parsed<T>, ApiError> {
    if !declared_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let limit = limits.max_bytes;
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        discard(body, limits.read_timeout.min(DISCARD_WITHIN)).await;
        return Err(ApiError::BodyTooLarge { limit });
    }
    let heavy = declared.is_none_or(|len| len > HEAVY_BODY_BYTES as u64);
    let _permit = match heavy {
        true => Some(limits.heavy_permit().await?),
        false => None,
    };
    // Stops reading as soon as the cap is passed (chunked bodies have no declared length).
    let bytes = tokio::time::timeout(limits.read_timeout, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| ApiError::BodyTimeout {
            secs: limits.read_timeout.as_secs(),
        })?
        .map_err(|_| ApiError::BodyTooLarge { limit })?;
    let heavy = bytes.len() > HEAVY_BODY_BYTES;
    let value = if heavy {
        on_blocking_pool(move || parse(&bytes)).await?
    } else {
        parse(&bytes)?
    };
    Ok(Parsed { value, heavy })
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if json_depth(bytes) > MAX_JSON_DEPTH {
        return Err(ApiError::InvalidJson {
            message: format!("JSON nesting deeper than {MAX_JSON_DEPTH} levels"),
        });
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::InvalidJson {
        message: format!("invalid JSON: {e}"),
    })?;
    if !value.is_object() {
        return Err(ApiError::InvalidJson {
            message: "the request body must be a JSON object".into(),
        });
    }
    serde_json::from_value(value).map_err(|e| ApiError::Schema {
        message: format!("invalid request: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While every heavy permit is held, a heavy body gets a 503 after the read timeout instead
    /// of waiting for good; a light one is read at once.
    #[tokio::test]
    async fn a_heavy_body_waits_for_a_permit_at_most_the_read_timeout() {
        let limits = BodyLimits::new(1 << 20, Duration::from_millis(200), 1);
        let held = limits.heavy_permit().await.unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::CONTENT_TYPE,
            "application/json".parse().unwrap(),
        );
        // No Content-Length: of unknown length, so heavy.
        let started = tokio::time::Instant::now();
        let heavy = read_json::<Value>(&headers, Body::from("{}"), &limits).await;
        assert!(
            matches!(heavy, Err(ApiError::Unavailable { .. })),
            "{heavy:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(200));
        headers.insert(axum::http::header::CONTENT_LENGTH, "2".parse().unwrap());
        assert!(read_json::<Value>(&headers, Body::from("{}"), &limits)
            .await
            .is_ok());
        drop(held);
        headers.remove(axum::http::header::CONTENT_LENGTH);
        assert!(read_json::<Value>(&headers, Body::from("{}"), &limits)
            .await
            .is_ok());
    }

    #[test]
    fn only_json_bodies_are_read() {
        let with = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(axum::http::header::CONTENT_TYPE, ct.parse().unwrap());
            declared_json(&h)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            assert!(!with(other), "{other}");
        }
        assert!(!declared_json(&HeaderMap::new()));
    }

    #[test]
    fn depth_ignores_brackets_in_strings() {
        assert_eq!(json_depth(br#"{"a": "[[[[{{{{"}"#), 1);
        assert_eq!(json_depth(br#"{"a": [[1], {"b": "\"[["}]}"#), 3);
        assert_eq!(json_depth(&[b'['; 1000]), 1000);
    }
}

//! Reading a JSON request body safely: size cap (413 before reading past it), nesting cap,
//! syntax (400), must be an object (400), then the typed schema (422).

use axum::body::Body;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;

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

/// Reads and parses the body as `T`.
pub async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    // Stops reading as soon as the cap is passed (chunked bodies have no declared length).
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::BodyTooLarge { limit })?;
    if json_depth(&bytes) > MAX_JSON_DEPTH {
        return Err(ApiError::InvalidJson {
            message: format!("JSON nesting deeper than {MAX_JSON_DEPTH} levels"),
        });
    }
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::InvalidJson {
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

    #[test]
    fn depth_ignores_brackets_in_strings() {
        assert_eq!(json_depth(br#"{"a": "[[[[{{{{"}"#), 1);
        assert_eq!(json_depth(br#"{"a": [[1], {"b": "\"[["}]}"#), 3);
        assert_eq!(json_depth(&[b'['; 1000]), 1000);
    }
}

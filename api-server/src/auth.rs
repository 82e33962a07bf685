//! `--api-key`: every route but `/health` needs `Authorization: Bearer <key>`, compared in
//! constant time.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// The expected key; `None` disables the check.
#[derive(Clone)]
pub struct ApiKey(pub Option<std::sync::Arc<str>>);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.write_str(if self.0.is_some() {
            "ApiKey(set)"
        } else {
            "ApiKey(none)"
        })
    }
}

fn authorized(expected: &str, header: Option<&axum::http::HeaderValue>) -> bool {
    let Some(given) = header.and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let Some(token) = given.strip_prefix("Bearer ") else {
        return false;
    };
    // Exact: a key padded with spaces is another key.
    bool::from(token.as_bytes().ct_eq(expected.as_bytes()))
}

pub async fn require_api_key(State(key): State<ApiKey>, request: Request, next: Next) -> Response {
    if let Some(expected) = &key.0 {
        if request.uri().path() != "/health"
            && !authorized(
                expected,
                request.headers().get(axum::http::header::AUTHORIZATION),
            )
        {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_must_match_exactly() {
        let ok = HeaderValue::from_static("Bearer sk-test");
        assert!(authorized("sk-test", Some(&ok)));
        for bad in [
            "Bearer sk-tes",
            "Bearer sk-test2",
            "sk-test",
            "Basic sk-test",
            "Bearer ",
            "Bearer  sk-test",
            "Bearer sk-test ",
            "Bearer\tsk-test",
        ] {
            assert!(
                !authorized("sk-test", Some(&HeaderValue::from_static(bad))),
                "{bad}"
            );
        }
        assert!(!authorized("sk-test", None));
    }
}

//! `--allowed-origins`: a request that carries an `Origin` header comes from a web page, and is
//! served only when that origin is allowed (none by default, as vLLM's and llama.cpp's servers
//! default to no CORS): a page the operator happens to open cannot drive the API on
//! 127.0.0.1. Clients that are not browsers send no `Origin` and are unaffected. An allowed
//! origin gets the CORS headers, and its preflight (`OPTIONS`) a 204.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Origins allowed to call the API (`scheme://host[:port]`, exact; `*` for any).
#[derive(Debug, Clone, Default)]
pub struct AllowedOrigins(pub Arc<[String]>);

impl AllowedOrigins {
    pub fn allows(&self, origin: &str) -> bool {
        self.0
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
    }
}

pub async fn check_origin(
    State(allowed): State<AllowedOrigins>,
    request: Request,
    next: Next,
) -> Response {
    let Some(origin) = request.headers().get(header::ORIGIN).cloned() else {
        return next.run(request).await;
    };
    let text = origin.to_str().unwrap_or_default();
    if !allowed.allows(text) {
        return ApiError::ForbiddenOrigin {
            origin: text.chars().take(200).collect(),
        }
        .into_response();
    }
    let mut response = match request.method() == Method::OPTIONS {
        true => preflight(),
        false => next.run(request).await,
    };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    response
}

fn preflight() -> Response {
    (
        StatusCode::NO_CONTENT,
        [
            (header::ACCESS_CONTROL_ALLOW_METHODS, "GET, POST, OPTIONS"),
            (
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                "authorization, content-type",
            ),
            (header::ACCESS_CONTROL_MAX_AGE, "600"),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_origins_are_allowed() {
        let none = AllowedOrigins::default();
        assert!(!none.allows("http://localhost:3000"));
        let some = AllowedOrigins(vec!["http://localhost:3000".to_owned()].into());
        assert!(some.allows("http://localhost:3000"));
        assert!(!some.allows("http://localhost:3001"));
        assert!(!some.allows("http://evil.example"));
        let any = AllowedOrigins(vec!["*".to_owned()].into());
        assert!(any.allows("http://evil.example"));
    }
}

//! The crate's one error type. Over HTTP every variant becomes the OpenAI error envelope
//! `{"error": {"message", "type", "param", "code"}}` with a fitting status; messages are written
//! for clients and never carry internal details (those go to the logs).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ApiError {
    /// Syntactically broken JSON, a body that is not an object, or nesting past the cap.
    #[error("{message}")]
    InvalidJson { message: String },
    /// Well-formed JSON whose fields do not match the request schema (a wrong type, a missing
    /// field): 400, as OpenAI and vLLM answer.
    #[error("{message}")]
    Schema { message: String },
    /// A field the server neither serves nor lists as accepted without effect: refused rather
    /// than dropped, so a client never gets a 200 that ignored what it asked for.
    #[error("unsupported field `{field}`: {reason}")]
    UnsupportedField { field: String, reason: String },
    /// A field with a value outside what the server accepts.
    #[error("{message}")]
    InvalidParam {
        param: &'static str,
        message: String,
    },
    /// Prompt (plus requested completion) longer than the model's context.
    #[error("{message}")]
    ContextLength {
        param: &'static str,
        message: String,
    },
    #[error("missing or incorrect API key")]
    Unauthorized,
    /// A browser page from an origin not in `--allowed-origins`.
    #[error("requests from origin {origin:?} are not allowed")]
    ForbiddenOrigin { origin: String },
    #[error("the request body must be JSON sent as Content-Type: application/json")]
    UnsupportedMediaType,
    #[error("the model `{model}` does not exist")]
    ModelNotFound { model: String },
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("the request body did not arrive within {secs} s")]
    BodyTimeout { secs: u64 },
    #[error("{message}")]
    Overloaded { message: String },
    /// No engine can take the request now, or its engine went away while it ran.
    #[error("{message}")]
    Unavailable { message: String },
    #[error("request did not finish within {secs} s")]
    Timeout { secs: u64 },
    /// A fault inside the server; the client sees a generic message.
    #[error("internal error")]
    Internal,
    /// Startup only: the model's tokenizer or chat template could not be loaded.
    #[error("cannot load {what}: {reason}")]
    ModelLoad { what: String, reason: String },
}

/// The inner object of the OpenAI error envelope.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ErrorBody {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidParam {
            param,
            message: message.into(),
        }
    }

    pub fn unsupported(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::UnsupportedField {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::Unavailable {
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidJson { .. }
            | Self::Schema { .. }
            | Self::UnsupportedField { .. }
            | Self::InvalidParam { .. }
            | Self::ContextLength { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::ForbiddenOrigin { .. } => StatusCode::FORBIDDEN,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::ModelNotFound { .. } | Self::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable { .. } | Self::Timeout { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal | Self::ModelLoad { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The envelope's inner object; also used for error events on a stream.
    pub fn body(&self) -> ErrorBody {
        let (kind, code, param) = match self {
            Self::InvalidJson { .. } => ("invalid_request_error", Some("invalid_json"), None),
            Self::Schema { .. } => ("invalid_request_error", Some("invalid_schema"), None),
            Self::UnsupportedField { field, .. } => (
                "invalid_request_error",
                Some("unsupported_field"),
                Some(field.clone()),
            ),
            Self::InvalidParam { param, .. } => (
                "invalid_request_error",
                Some("invalid_value"),
                Some((*param).to_owned()),
            ),
            Self::ContextLength { param, .. } => (
                "invalid_request_error",
                Some("context_length_exceeded"),
                Some((*param).to_owned()),
            ),
            Self::Unauthorized => ("invalid_request_error", Some("invalid_api_key"), None),
            Self::ForbiddenOrigin { .. } => {
                ("invalid_request_error", Some("forbidden_origin"), None)
            }
            Self::UnsupportedMediaType => (
                "invalid_request_error",
                Some("unsupported_media_type"),
                None,
            ),
            Self::ModelNotFound { .. } => (
                "invalid_request_error",
                Some("model_not_found"),
                Some("model".to_owned()),
            ),
            Self::RouteNotFound { .. } => ("invalid_request_error", Some("unknown_url"), None),
            Self::BodyTooLarge { .. } => ("invalid_request_error", Some("body_too_large"), None),
            Self::BodyTimeout { .. } => ("invalid_request_error", Some("body_timeout"), None),
            Self::Overloaded { .. } => ("rate_limit_error", Some("overloaded"), None),
            Self::Unavailable { .. } => ("server_error", Some("engine_unavailable"), None),
            Self::Timeout { .. } => ("server_error", Some("request_timeout"), None),
            Self::Internal | Self::ModelLoad { .. } => {
                ("server_error", Some("internal_error"), None)
            }
        };
        let message = match self {
            // Load failures name files and causes: fine in logs, not for clients.
            Self::ModelLoad { .. } => "internal error".to_owned(),
            other => other.to_string(),
        };
        ErrorBody {
            message,
            kind,
            param,
            code,
        }
    }

    /// `{"error": {...}}` as JSON text.
    pub fn envelope_json(&self) -> String {
        #[derive(Serialize)]
        struct Envelope {
            error: ErrorBody,
        }
        serde_json::to_string(&Envelope { error: self.body() })
            .unwrap_or_else(|_| r#"{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}"#.to_owned())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if matches!(self, Self::Internal | Self::ModelLoad { .. }) {
            tracing::warn!(status = status.as_u16(), error = %self, "request failed");
        } else {
            tracing::debug!(status = status.as_u16(), error = %self, "request rejected");
        }
        let mut response = (status, self.envelope_json()).into_response();
        response.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        );
        if matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            // Overload and a peer restarting both pass within seconds: say when to come back.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_has_all_four_fields() {
        let v: serde_json::Value =
            serde_json::from_str(&ApiError::invalid("top_p", "bad").envelope_json()).unwrap();
        let e = &v["error"];
        assert_eq!(e["message"], "bad");
        assert_eq!(e["type"], "invalid_request_error");
        assert_eq!(e["param"], "top_p");
        assert_eq!(e["code"], "invalid_value");
    }

    #[test]
    fn load_errors_do_not_leak_paths() {
        let err = ApiError::ModelLoad {
            what: "/secret/path".into(),
            reason: "x".into(),
        };
        assert!(!err.envelope_json().contains("secret"));
        assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}

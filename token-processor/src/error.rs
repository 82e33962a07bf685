//! The crate's one error type.

use thiserror::Error;

/// Everything the token-processor can fail at, each with the facts needed to act on it.
#[derive(Debug, Error)]
pub enum TpError {
    #[error("cannot read trace {path}: {source}")]
    TraceIo {
        path: String,
        source: std::io::Error,
    },
    #[error("trace line {line}: {message}")]
    TraceParse { line: usize, message: String },
    #[error("trace event {index} ({request}): {message}")]
    TraceEvent {
        index: usize,
        request: String,
        message: String,
    },
    #[error("cannot bind {what} on {endpoint}: {message}")]
    Bind {
        what: &'static str,
        endpoint: String,
        message: String,
    },
    #[error("configuration: {0}")]
    Config(String),
    #[error("metrics exporter: {0}")]
    Metrics(String),
    #[error(transparent)]
    Proto(#[from] proto::ProtoError),
    #[error(transparent)]
    Link(#[from] link::LinkError),
    #[error("zeromq: {0}")]
    Zmq(#[from] zeromq::ZmqError),
}

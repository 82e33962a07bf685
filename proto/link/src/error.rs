use std::io;

/// Failures of the link layer.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{endpoint} is in use by a running process")]
    EndpointInUse { endpoint: String },
    #[error("cannot prepare {endpoint}: {source}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: io::Error,
    },
}

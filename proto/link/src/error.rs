use std::io;

/// Failures of the link layer.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{endpoint} is in use by a running process")]
    EndpointInUse { endpoint: String },
    #[error("refusing the runtime directory {dir}: {reason}")]
    UnsafeRuntimeDir {
        dir: std::path::PathBuf,
        reason: String,
    },
    #[error("cannot read the link secret {path}: {reason}")]
    Secret {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error(
        "{endpoint} is reachable from other hosts: give every process the same --link-secret-file"
    )]
    SecretRequired { endpoint: String },
    #[error("the peer did not accept our link secret: {reason}")]
    AuthFailed { reason: String },
    #[error("cannot prepare {endpoint}: {source}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: io::Error,
    },
}

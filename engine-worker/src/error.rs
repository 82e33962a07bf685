use thiserror::Error;

/// Errors of the engine-worker library.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("cannot read model file {path}: {source}")]
    ModelIo { path: String, source: std::io::Error },
    #[error("unsupported model file {path}: {reason}")]
    UnsupportedModel { path: String, reason: String },
    #[error("model is missing tensor {name}")]
    MissingTensor { name: String },
    #[error("tensor {name} has shape {actual:?}, expected {expected:?}")]
    TensorShape { name: String, expected: Vec<usize>, actual: Vec<usize> },
    #[error("invalid forward batch: {0}")]
    InvalidBatch(String),
    #[error("backend {backend} unavailable: {reason}")]
    BackendUnavailable { backend: String, reason: String },
}

use thiserror::Error;

/// Errors of the engine-worker library.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("cannot read model file {path}: {source}")]
    ModelIo {
        path: String,
        source: std::io::Error,
    },
    #[error("unsupported model file {path}: {reason}")]
    UnsupportedModel { path: String, reason: String },
    #[error("model is missing tensor {name}")]
    MissingTensor { name: String },
    #[error("tensor {name} has shape {actual:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("invalid forward batch: {0}")]
    InvalidBatch(String),
    #[error("backend {backend} unavailable: {reason}")]
    BackendUnavailable { backend: String, reason: String },
    #[error("invalid GGUF file {path}: {source}")]
    Gguf {
        path: String,
        source: gguf::GgufError,
    },
    #[error("unsupported model architecture {architecture:?} (supported: llama, mistral, qwen2)")]
    UnsupportedArchitecture { architecture: String },
    #[error(
        "tensor {name} has unsupported type {dtype} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"
    )]
    UnsupportedTensorType { name: String, dtype: String },
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Link(#[from] link::LinkError),
    #[error("cannot bind {endpoint}: {source}")]
    Bind {
        endpoint: String,
        source: zeromq::ZmqError,
    },
    /// An option out of range, or at odds with another; the message names the option.
    #[error("{0}")]
    Options(String),
    #[error("unknown --dummy-dtype {0}")]
    UnknownDummyDtype(String),
    #[error("cannot load {path}")]
    Load {
        path: String,
        source: Box<EngineError>,
    },
    #[error("cannot load draft model {path}")]
    LoadDraft {
        path: String,
        source: Box<EngineError>,
    },
    #[error("draft model {draft} cannot draft for {target}: {reason}")]
    DraftVocabulary {
        draft: String,
        target: String,
        reason: String,
    },
    #[error("draft head {head} cannot draft for {target}: {reason}")]
    DraftHeadMismatch {
        head: String,
        target: String,
        reason: String,
    },
    #[error("cannot name the proposer: {0}; rename the draft file")]
    ProposerName(String),
    #[error("cannot create trace {path}: {source}")]
    Trace {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the step-loop thread: {0}")]
    Thread(std::io::Error),
    #[error("step loop died while loading")]
    StepLoopDied,
}

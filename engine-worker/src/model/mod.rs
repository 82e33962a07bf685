//! Model hyper-parameters and weights, loaded from GGUF, Hugging Face safetensors directories,
//! or generated (`--load-format dummy`).

mod config;

pub use config::ModelConfig;

//! engine-worker: owns the model and the accelerator. Continuous batching over a paged KV cache,
//! a proposer (n-gram first) and a verifier; each step's outcome goes to the token-processor.
//!
//! Layout: `model` loads weights and hyper-parameters (GGUF, safetensors, dummy); `backend`
//! runs the forward pass (CPU here, CUDA behind the `cuda` feature) behind one trait; the rest
//! (KV-block bookkeeping, scheduler, proposer, verifier, step driver, I/O) is backend-agnostic;
//! `worker` starts and stops the whole process (the binary parses options and waits).

pub mod backend;
pub mod engine;
mod error;
pub mod huge_pages;
pub mod io;
pub mod kv;
pub mod model;
pub mod sampling;
pub mod scheduler;
pub mod spec;
pub mod trace;
pub mod worker;

pub use error::EngineError;

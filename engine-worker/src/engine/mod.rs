//! The step driver: schedule → propose → one batched forward (K+1 positions per running
//! sequence plus prefills) → verify → append with stop checks → one row per request.

mod calibrate;
mod config;
mod driver;
mod prompt_logprobs;
mod retained;
mod rows;
mod stop;
mod structured;

pub use config::{EngineConfig, ProposerKind};
pub use driver::Engine;
pub use retained::{RetainBounds, Retained};
pub use rows::{to_step_batch, RowKind, RowOut, RowPolicy, StartInfo};
pub use structured::GrammarJob;
// The vocabulary crate's types, under the names the engine's callers already use.
pub use vocab::{TokenBytes, VocabKind};

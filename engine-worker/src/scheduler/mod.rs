//! Continuous batching: a waiting queue and a running set over the paged KV cache. Each step
//! keeps every running sequence going (reserving room for its prompt-lookahead), preempting the
//! newest ones by recompute when blocks run out, then admits waiting ones FCFS within the
//! sequence cap, the per-step token budget and the free blocks.

mod policy;
mod sequence;

pub use policy::{PrefixCacheStats, Scheduler, SchedulerConfig, StepPlan};
pub use sequence::{Sequence, SequencePhase};

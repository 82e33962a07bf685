//! Continuous batching: a waiting queue and a running set over the paged KV cache. Each step
//! keeps every running sequence going (reserving room for its prompt-lookahead), preempting the
//! newest ones by recompute when blocks run out, then admits waiting ones FCFS within the
//! sequence cap, the per-step token budget and the free blocks. An admitted prompt first takes
//! the cached blocks of an earlier prompt that starts alike (automatic prefix caching), so its
//! prefill computes only the rest.

mod policy;
mod sequence;

pub use policy::{PrefixCacheStats, Scheduler, SchedulerConfig, StepPlan};
pub use sequence::{Sequence, SequencePhase};

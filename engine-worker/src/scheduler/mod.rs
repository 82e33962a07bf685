//! Continuous batching: a waiting queue and a running set over the paged KV cache. Each step
//! keeps every running sequence going (reserving room for its prompt-lookahead), preempting the
//! newest ones by recompute when blocks run out, then admits waiting ones FCFS within the
//! sequence cap, the per-step token budget and the free blocks. An admitted sequence first takes
//! the cached blocks of earlier tokens that start alike (automatic prefix caching: an earlier
//! prompt, or an earlier prompt and its answer, as in the next turn of a chat), so its prefill
//! computes only the rest.

mod policy;
mod sequence;

pub use policy::{PrefixCacheStats, Scheduler, SchedulerConfig, StepPlan};
pub use sequence::{Sequence, SequencePhase};

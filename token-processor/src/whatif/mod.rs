//! `replay --what-if`: what another K, or the other drafting policy, would have given on a
//! recorded run, predicted from the run's own acceptance trace (`--trace-acceptance`).
//!
//! Re-scoring is exact for what the trace holds: every verify step carries the proposer's whole
//! offer and the tokens the target emitted, so the accepted length of any prefix of an offer is
//! known (the longest prefix that equals the output). A shorter K' moves the steps: a request
//! at output position `p` drafts the offer of the last recorded step at or before `p`, shifted
//! past the tokens already emitted since. Recorded steps advance by their accepted length plus
//! one, so a shifted offer always starts on the path the output took (the shift never exceeds
//! that step's accepted length): what is assumed is only that the proposer, one match longer,
//! would have continued the same way (a lookup's match does; a model drafter's undrafted
//! positions are taken as rejected).
//!
//! Throughput: the time of verify steps scales with the modelled cost of their batches, priced
//! by the worker's calibrated cost curve (trace header) at the run's mean batch; the rest of
//! the run's time (prefills, scheduling) is held fixed. `goodput` is modelled as the draft
//! length that maximises expected tokens per second of a step at that batch, from the trace's
//! per-position acceptance (the live policy also conditions on match strength and on each
//! request's own record, so it is an estimate of it, not a replay).

mod model;
mod report;
mod trace;

pub use model::{predict, Prediction, Recorded, WhatIf};
pub use report::{write_report, Report, METHOD};
pub use trace::{RequestSteps, WhatIfTrace};

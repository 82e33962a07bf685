//! token-processor: specula's sidecar. It pulls step batches from engine-workers, tracks
//! speculative-decoding acceptance per request and per draft position
//! (`shared/spec/acceptance-metrics.md`), exports the sums on `/metrics`, and forwards each
//! request's tokens and final figures to the api-server that owns it.
//!
//! - [`tracker`]: per-request state and the spec's figures (pure).
//! - [`ingest`]: the worker-facing state machine (epochs, sequence gaps, resync, heartbeats) and
//!   its ROUTER-socket loop.
//! - [`forward`]: the api-server-facing ROUTER.
//! - [`metrics`], [`binned`], [`http`]: Prometheus (histograms observed per row are binned per
//!   batch) and `/health`.
//! - [`memory`]: process memory settings (huge pages off).
//! - [`replay`]: acceptance traces through the same state machine, for `token-processor replay`.
//! - [`synth`]: synthetic step batches for the benchmarks.
//! - [`serve`]: the whole service, started and stopped (the binary parses options and waits).

pub mod binned;
pub mod error;
pub mod forward;
pub mod http;
pub mod ingest;
pub mod memory;
pub mod metrics;
pub mod replay;
pub mod serve;
pub mod synth;
pub mod tracker;
pub mod whatif;

pub use error::TpError;

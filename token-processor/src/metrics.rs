//! Every metric the token-processor exports: names, units, help text and histogram buckets, all
//! here. Labels are `model` and `worker`, plus `proposer` (the worker's hello's) and `class` (the
//! request's class among the configured ones, or `other`) on the spec's series
//! (`specula_spec_decode*`, one proposer per worker and a configured set of classes, so bounded)
//! and the spec's `position` on the per-position counter; never a request id. docs/metrics.md
//! defines every series. Finish reasons are separate counters so that
//! no other label exists.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, gauge};
use metrics::{Counter, Gauge, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use proto::worker_tp::{CostPoint, KvBlocks, COST_POINT_TOKENS, MAX_COST_POINTS};

use crate::binned::{self, BinnedHistogram, Labels, OwnCounter};
use crate::error::TpError;
use crate::tracker::{Figures, Observations};

pub const SPEC_NUM_STEPS: &str = "specula_spec_decode_num_steps_total";
pub const SPEC_NUM_DRAFTS: &str = "specula_spec_decode_num_drafts_total";
pub const SPEC_NUM_DRAFT_TOKENS: &str = "specula_spec_decode_num_draft_tokens_total";
pub const SPEC_NUM_ACCEPTED_TOKENS: &str = "specula_spec_decode_num_accepted_tokens_total";
pub const SPEC_ACCEPTED_PER_POS: &str = "specula_spec_decode_num_accepted_tokens_per_pos_total";
pub const SPEC_NUM_EMITTED_TOKENS: &str = "specula_spec_decode_num_emitted_tokens_total";
pub const SPEC_ACCEPTED_PER_STEP: &str = "specula_spec_decode_accepted_drafts_per_step";
pub const SPEC_DRAFTED_PER_STEP: &str = "specula_spec_decode_drafted_per_step";
pub const SPEC_OFFERED_TOKENS: &str = "specula_spec_decode_num_offered_tokens_total";
pub const SPEC_PREDICTED_TOKENS: &str = "specula_spec_decode_num_predicted_accepted_tokens_total";
pub const SPEC_VERIFY_SECONDS: &str = "specula_spec_policy_verify_seconds_total";
pub const SPEC_K0_TOKENS: &str = "specula_spec_policy_k0_tokens_estimate_total";
pub const SPEC_VERIFY_TOKENS: &str = "specula_spec_policy_verify_tokens_total";
pub const SPEC_VERIFY_COST: &str = "specula_spec_policy_verify_cost_seconds";
pub const REQUEST_ACCEPTANCE_RATE: &str = "specula_request_draft_acceptance_rate";
pub const REQUEST_ACCEPTED_LENGTH: &str = "specula_request_mean_accepted_length";

/// Every series labelled with the worker's proposer: the spec's.
const SPEC_SERIES: &[&str] = &[
    SPEC_NUM_STEPS,
    SPEC_NUM_DRAFTS,
    SPEC_NUM_DRAFT_TOKENS,
    SPEC_NUM_ACCEPTED_TOKENS,
    SPEC_ACCEPTED_PER_POS,
    SPEC_NUM_EMITTED_TOKENS,
    SPEC_ACCEPTED_PER_STEP,
    SPEC_DRAFTED_PER_STEP,
    SPEC_OFFERED_TOKENS,
    SPEC_PREDICTED_TOKENS,
];

/// Finished-request counters, indexed by `FinishReason::code() - 1`.
pub const FINISHED: [&str; 4] = [
    "specula_requests_finished_stop_total",
    "specula_requests_finished_length_total",
    "specula_requests_finished_abort_total",
    "specula_requests_finished_error_total",
];
pub const PROMPT_TOKENS: &str = "specula_prompt_tokens_total";
pub const PREFIX_CACHE_HITS: &str = "specula_prefix_cache_hit_tokens_total";
pub const GENERATION_TOKENS: &str = "specula_generation_tokens_total";
pub const TTFT: &str = "specula_time_to_first_token_seconds";
pub const ITL: &str = "specula_inter_token_latency_seconds";
pub const E2E: &str = "specula_e2e_request_latency_seconds";
pub const REQUESTS_RUNNING: &str = "specula_requests_running";
pub const KV_CACHE_BLOCKS: &str = "specula_kv_cache_blocks";
pub const KV_CACHE_BYTES: &str = "specula_kv_cache_bytes";
/// The `state` label values of [`KV_CACHE_BLOCKS`], in [`WorkerMetrics::kv_blocks`]'s order.
pub const KV_BLOCK_STATES: [&str; 3] = ["used", "cached", "free"];
pub const WORKERS_CONNECTED: &str = "specula_workers_connected";
pub const API_SERVERS_CONNECTED: &str = "specula_api_servers_connected";
pub const BATCH_PROCESSING: &str = "specula_step_batch_processing_seconds";
pub const GAPS: &str = "specula_step_batch_gaps_total";
pub const INVALID_BATCHES: &str = "specula_step_batches_invalid_total";
pub const STALE_BATCHES: &str = "specula_step_batches_stale_total";
pub const UNKNOWN_WORKER_BATCHES: &str = "specula_step_batches_unknown_worker_total";
pub const FOREIGN_FRAMES: &str = "specula_worker_frames_foreign_total";
pub const UNKNOWN_ROWS: &str = "specula_step_rows_unknown_request_total";
pub const REFUSED: &str = "specula_requests_refused_total";
pub const WORKERS_LOST: &str = "specula_workers_lost_total";
pub const RESYNCS: &str = "specula_worker_resyncs_total";
pub const MALFORMED_FRAMES: &str = "specula_ingest_frames_malformed_total";
pub const OUTPUTS_DROPPED: &str = "specula_outputs_dropped_total";
pub const DUPLICATE_IDS: &str = "specula_hellos_refused_duplicate_id_total";

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5,
];
const E2E_BUCKETS: &[f64] = &[
    0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0,
];
const ACCEPTANCE_RATE_BUCKETS: &[f64] =
    &[0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0];
/// Mean tokens per verification step: 1 (no draft ever accepted) up to K + 1.
const ACCEPTED_LENGTH_BUCKETS: &[f64] = &[
    1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0, 65.0,
];
const BATCH_BUCKETS: &[f64] = &[
    0.000_005, 0.000_01, 0.000_015, 0.000_02, 0.000_025, 0.000_03, 0.000_04, 0.000_05, 0.000_06,
    0.000_07, 0.000_08, 0.000_09, 0.000_1, 0.000_125, 0.000_15, 0.000_2, 0.000_25, 0.000_5, 0.001,
    0.002_5, 0.005, 0.01, 0.025, 0.1,
];

/// The process-wide counters, exported at 0 from startup. Every other series carries the
/// `model` and `worker` labels and exists once that worker said hello (the spec: no series
/// without those labels).
const PROCESS_COUNTERS: &[&str] = &[
    UNKNOWN_WORKER_BATCHES,
    FOREIGN_FRAMES,
    MALFORMED_FRAMES,
    OUTPUTS_DROPPED,
    DUPLICATE_IDS,
];

/// Installs the global Prometheus recorder and the series the token-processor renders itself
/// ([`binned`]: the histograms observed once per batch row, and the spec's counters).
/// `max_spec_tokens` sets the per-step buckets `le="0".."K"` (one bucket set per metric name,
/// so the largest K expected).
///
/// A departed worker's series are removed `departed_retention` after its last update: the
/// recorder's counters and gauges by its idle timeout (a live worker's are touched at every
/// heartbeat, [`WorkerMetrics::keep_alive`], the process's own by the upkeep,
/// [`keep_process_series_alive`]), the rendered ones by [`forget_worker`]. Histograms are all
/// rendered ones, which the recorder's idle timeout could not spare without a recording.
pub fn install(
    max_spec_tokens: u32,
    departed_retention: Duration,
) -> Result<PrometheusHandle, TpError> {
    let mut own = binned::Registry::default();
    declare_speculation(&mut own, max_spec_tokens);
    own.declare(
        ITL,
        "Time between consecutive token deliveries of a request, in seconds.",
        ITL_BUCKETS,
    );
    own.declare(
        TTFT,
        "Time from arrival at the api-server to the first output token, in seconds.",
        TTFT_BUCKETS,
    );
    own.declare(
        E2E,
        "Time from arrival at the api-server to the final output, in seconds.",
        E2E_BUCKETS,
    );
    own.declare(
        BATCH_PROCESSING,
        "Time to decode and account one step batch and queue its outputs, in seconds.",
        BATCH_BUCKETS,
    );
    binned::install(own);
    let err = |e: metrics_exporter_prometheus::BuildError| TpError::Metrics(e.to_string());
    let handle = PrometheusBuilder::new()
        .idle_timeout(MetricKindMask::ALL, Some(departed_retention))
        .install_recorder()
        .map_err(err)?;
    describe_all();
    for name in PROCESS_COUNTERS {
        counter!(*name).increment(0);
    }
    gauge!(WORKERS_CONNECTED).set(0.0);
    gauge!(API_SERVERS_CONNECTED).set(0.0);
    Ok(handle)
}

/// Describes every series, by family (each `describe_*!` of the token-processor is in this file).
fn describe_all() {
    describe_requests();
    describe_connections();
    describe_step_batches();
    describe_link_faults();
    describe_policy();
}

/// The drafting policy's own figures: what it weighs (the cost curve) and how its bets pay.
fn describe_policy() {
    describe_gauge!(
        SPEC_VERIFY_COST,
        Unit::Seconds,
        "The drafting policy's fitted cost of one verify forward carrying `tokens` tokens."
    );
}

/// The spec's speculative-decoding series, rendered by [`binned`] so that a worker's series under
/// an earlier proposer can be retired ([`SpecSeries::new`]).
fn declare_speculation(own: &mut binned::Registry, max_spec_tokens: u32) {
    own.declare_counter(
        SPEC_NUM_STEPS,
        "Verification (decode) steps; the prefill is not one.",
    );
    own.declare_counter(
        SPEC_NUM_DRAFTS,
        "Verification steps that proposed at least one draft token.",
    );
    own.declare_counter(
        SPEC_NUM_DRAFT_TOKENS,
        "Draft tokens proposed, sum of d over steps.",
    );
    own.declare_counter(
        SPEC_NUM_ACCEPTED_TOKENS,
        "Draft tokens accepted by the verifier, sum of a over steps (bonus token excluded).",
    );
    own.declare_counter(
        SPEC_ACCEPTED_PER_POS,
        "Draft tokens accepted at draft position i (0-based; position 0 is head 1).",
    );
    own.declare_counter(
        SPEC_NUM_EMITTED_TOKENS,
        "Tokens produced by verification steps, sum of a+1 (bonus included).",
    );
    let per_step: Vec<f64> = (0..=max_spec_tokens).map(f64::from).collect();
    own.declare(
        SPEC_ACCEPTED_PER_STEP,
        "Accepted draft tokens per verification step.",
        &per_step,
    );
    own.declare(
        SPEC_DRAFTED_PER_STEP,
        "Draft tokens proposed per verification step (what the drafting policy chose).",
        &per_step,
    );
    own.declare_counter(
        SPEC_OFFERED_TOKENS,
        "Draft tokens the proposer offered the drafting policy (num_draft_tokens of them were verified).",
    );
    own.declare_scaled_counter(
        SPEC_PREDICTED_TOKENS,
        "Accepted draft tokens the drafting policy predicted for the drafts it verified (compare with num_accepted_tokens).",
        1e-3,
    );
    own.declare_scaled_counter(
        SPEC_VERIFY_SECONDS,
        "Seconds of verify forwards (steps whose every row verified), as the worker measured them.",
        1e-6,
    );
    // Rendered by the registry so that every class's buckets exist at 0 from the worker's
    // hello (a first scrape before any request finished).
    own.declare(
        REQUEST_ACCEPTANCE_RATE,
        "Per finished request that drafted: accepted draft tokens over draft tokens.",
        ACCEPTANCE_RATE_BUCKETS,
    );
    own.declare(
        REQUEST_ACCEPTED_LENGTH,
        "Per finished request that verified: tokens per verification step (average_accept_length).",
        ACCEPTED_LENGTH_BUCKETS,
    );
    own.declare_counter(
        SPEC_VERIFY_TOKENS,
        "Tokens emitted by the verify forwards of specula_spec_policy_verify_seconds_total; over specula_spec_policy_k0_tokens_estimate_total, the gain of drafting against K=0.",
    );
    own.declare_scaled_counter(
        SPEC_K0_TOKENS,
        "Tokens K=0 would have emitted in the same verify time: each verify forward's time over the fitted cost of a one-token-per-row forward, times its rows.",
        1e-3,
    );
}

/// Request outcomes, token counts and latencies.
fn describe_requests() {
    for (name, reason) in FINISHED.iter().zip(["stop", "length", "abort", "error"]) {
        describe_counter!(
            *name,
            Unit::Count,
            format!("Requests finished with reason {reason}.")
        );
    }
    describe_counter!(
        PROMPT_TOKENS,
        Unit::Count,
        "Prompt tokens of the requests seen."
    );
    describe_counter!(
        PREFIX_CACHE_HITS,
        Unit::Count,
        "Of the prompt tokens, those whose KV the worker's prefix cache held (not computed again); \
         the hit rate is this over specula_prompt_tokens_total."
    );
    describe_counter!(
        GENERATION_TOKENS,
        Unit::Count,
        "Output tokens delivered to api-servers."
    );
    describe_gauge!(
        REQUESTS_RUNNING,
        Unit::Count,
        "Requests in flight on the worker."
    );
    describe_gauge!(
        KV_CACHE_BLOCKS,
        Unit::Count,
        "The worker's KV-cache blocks by state, from its latest heartbeat: used (held by running \
         sequences), cached (held by none, keeping a prompt prefix until a new block needs the \
         room) and free."
    );
    describe_gauge!(
        KV_CACHE_BYTES,
        Unit::Bytes,
        "Bytes of the worker's target KV cache: the most it may take (on the CPU its pages are \
         backed as blocks are first written)."
    );
}

/// Peers connected now.
fn describe_connections() {
    describe_gauge!(
        WORKERS_CONNECTED,
        Unit::Count,
        "Workers that said hello and are within their heartbeat deadline."
    );
    describe_gauge!(
        API_SERVERS_CONNECTED,
        Unit::Count,
        "Api-servers that said hello and are within their heartbeat deadline."
    );
}

/// How step batches and their rows were processed, or why they were not.
fn describe_step_batches() {
    describe_counter!(
        GAPS,
        Unit::Count,
        "Holes in a worker's step-batch sequence (its in-flight requests fail)."
    );
    describe_counter!(
        INVALID_BATCHES,
        Unit::Count,
        "Step batches that failed validation and were dropped."
    );
    describe_counter!(
        STALE_BATCHES,
        Unit::Count,
        "Duplicate or old-epoch messages that were ignored."
    );
    describe_counter!(
        UNKNOWN_WORKER_BATCHES,
        Unit::Count,
        "Step batches from a worker that has not said hello yet (dropped until it does)."
    );
    describe_counter!(
        FOREIGN_FRAMES,
        Unit::Count,
        "Frames acting for a live worker (batches, heartbeats, resyncs, goodbyes, hellos of its \
         epoch) from a connection other than the one its hello came on; ignored."
    );
    describe_counter!(
        UNKNOWN_ROWS,
        Unit::Count,
        "Step-batch rows naming a request the token-processor does not track."
    );
    describe_counter!(
        REFUSED,
        Unit::Count,
        "Requests failed because the per-worker in-flight cap was reached."
    );
}

/// Faults on the links to workers and api-servers: lost peers, resyncs, bad frames, refused
/// hellos and dropped outputs.
fn describe_link_faults() {
    describe_counter!(
        WORKERS_LOST,
        Unit::Count,
        "Worker epochs ended by restart, goodbye or missed heartbeats."
    );
    describe_counter!(RESYNCS, Unit::Count, "Resync messages applied.");
    describe_counter!(
        MALFORMED_FRAMES,
        Unit::Count,
        "Ingest frames that were not a valid message."
    );
    describe_counter!(
        DUPLICATE_IDS,
        Unit::Count,
        "Hellos refused because a live worker or api-server already holds the id."
    );
    describe_counter!(
        OUTPUTS_DROPPED,
        Unit::Count,
        "Request outputs dropped: owner not connected or queue full."
    );
}

/// The spec's series of one worker and request class (every `specula_spec_decode*` name with
/// a `class` label), labelled `model`, `worker`, `proposer` and `class`.
#[derive(Debug, Clone)]
struct SpecSeries {
    steps: OwnCounter,
    drafts: OwnCounter,
    draft_tokens: OwnCounter,
    accepted_tokens: OwnCounter,
    accepted_per_pos: Vec<OwnCounter>,
    emitted_tokens: OwnCounter,
    accepted_per_step: BinnedHistogram,
    drafted_per_step: BinnedHistogram,
    offered_tokens: OwnCounter,
    /// Counted in thousandths, rendered in tokens.
    predicted_tokens: OwnCounter,
}

/// The label sets of a worker's spec series, one per class.
fn spec_labels(model: &str, worker: &str, proposer: &str, classes: &[String]) -> Vec<Labels> {
    classes
        .iter()
        .map(|class| Labels::new(model, worker, &[("proposer", proposer), ("class", class)]))
        .collect()
}

impl SpecSeries {
    /// Resolves (and exports at 0) the series of one label set.
    fn new(labels: &Labels, num_spec_tokens: usize) -> Self {
        let c = |name: &str| binned::counter(name, labels, &[]);
        let accepted_per_pos = (0..num_spec_tokens)
            .map(|i| {
                binned::counter(
                    SPEC_ACCEPTED_PER_POS,
                    labels,
                    &[("position", &i.to_string())],
                )
            })
            .collect();
        Self {
            steps: c(SPEC_NUM_STEPS),
            drafts: c(SPEC_NUM_DRAFTS),
            draft_tokens: c(SPEC_NUM_DRAFT_TOKENS),
            accepted_tokens: c(SPEC_NUM_ACCEPTED_TOKENS),
            accepted_per_pos,
            emitted_tokens: c(SPEC_NUM_EMITTED_TOKENS),
            accepted_per_step: binned::histogram(SPEC_ACCEPTED_PER_STEP, labels),
            drafted_per_step: binned::histogram(SPEC_DRAFTED_PER_STEP, labels),
            offered_tokens: c(SPEC_OFFERED_TOKENS),
            predicted_tokens: c(SPEC_PREDICTED_TOKENS),
        }
    }

    /// Adds one batch's figures.
    fn apply(&self, f: &Figures) {
        if f.is_zero() {
            return;
        }
        self.steps.increment(f.steps());
        self.drafts.increment(f.drafts());
        self.draft_tokens.increment(f.draft_tokens());
        self.accepted_tokens.increment(f.accepted_draft_tokens());
        self.emitted_tokens.increment(f.emitted_tokens());
        for (handle, n) in self.accepted_per_pos.iter().zip(f.accepted_per_position()) {
            handle.increment(n);
        }
        self.accepted_per_step
            .observe(per_length(f.accept_length_histogram()));
        self.drafted_per_step
            .observe(per_length(f.draft_length_histogram()));
        self.offered_tokens.increment(f.offered_tokens());
        self.predicted_tokens.increment(f.predicted_milli());
    }
}

/// A worker's per-class series: the spec's, and the per-request acceptance histograms.
#[derive(Debug, Clone)]
struct ClassSeries {
    spec: SpecSeries,
    acceptance_rate: BinnedHistogram,
    accepted_length: BinnedHistogram,
}

/// The drafting policy's per-worker series: verify time, its K = 0 estimate, the cost curve.
#[derive(Debug, Clone)]
struct PolicySeries {
    /// Microseconds, rendered in seconds.
    verify_seconds: OwnCounter,
    /// Thousandths, rendered in tokens.
    k0_tokens: OwnCounter,
    verify_tokens: OwnCounter,
    /// One gauge per [`COST_POINT_TOKENS`] size.
    verify_cost: Vec<Gauge>,
}

impl PolicySeries {
    fn new(model: &str, worker: &str) -> Self {
        let labels = Labels::new(model, worker, &[]);
        let verify_cost = COST_POINT_TOKENS
            .iter()
            .map(|tokens| {
                gauge!(SPEC_VERIFY_COST, "model" => model.to_owned(), "worker" => worker.to_owned(), "tokens" => tokens.to_string())
            })
            .collect();
        Self {
            verify_seconds: binned::counter(SPEC_VERIFY_SECONDS, &labels, &[]),
            k0_tokens: binned::counter(SPEC_K0_TOKENS, &labels, &[]),
            verify_tokens: binned::counter(SPEC_VERIFY_TOKENS, &labels, &[]),
            verify_cost,
        }
    }
}

/// Metric handles of one worker, resolved once at hello so the hot path does no lookups.
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    /// Indexed by request class (the tracker's [`RequestClasses`](crate::tracker::RequestClasses)).
    classes: Vec<ClassSeries>,
    policy: PolicySeries,
    finished: [Counter; 4],
    prompt_tokens: Counter,
    prefix_cache_hits: Counter,
    generation_tokens: Counter,
    ttft: BinnedHistogram,
    itl: BinnedHistogram,
    e2e: BinnedHistogram,
    pub running: Gauge,
    /// [`KV_CACHE_BLOCKS`] by [`KV_BLOCK_STATES`].
    kv_blocks: [Gauge; 3],
    kv_bytes: Gauge,
    pub batch_processing: BinnedHistogram,
    pub gaps: Counter,
    pub invalid_batches: Counter,
    pub stale: Counter,
    unknown_rows: Counter,
    refused: Counter,
    pub lost: Counter,
    pub resyncs: Counter,
}

impl WorkerMetrics {
    /// Resolves (and exports at 0) every series of worker `worker` serving `model` with K drafts
    /// from `proposer`, one set of acceptance series per request class. The worker's series
    /// under another model or proposer are retired: a worker that comes back with another
    /// proposer shows only the new one (Prometheus keeps the old one's history).
    pub fn new(
        model: &str,
        worker: &str,
        proposer: &str,
        num_spec_tokens: usize,
        classes: &[String],
    ) -> Self {
        let spec_labels = spec_labels(model, worker, proposer, classes);
        binned::retire(SPEC_SERIES, &spec_labels);
        let classes = spec_labels
            .iter()
            .zip(classes)
            .map(|(spec_labels, class)| {
                let labels = Labels::new(model, worker, &[("class", class)]);
                ClassSeries {
                    spec: SpecSeries::new(spec_labels, num_spec_tokens),
                    acceptance_rate: binned::histogram(REQUEST_ACCEPTANCE_RATE, &labels),
                    accepted_length: binned::histogram(REQUEST_ACCEPTED_LENGTH, &labels),
                }
            })
            .collect();
        let labels = [("model", model.to_owned()), ("worker", worker.to_owned())];
        let c = |name: &'static str| {
            let handle = counter!(name, &labels);
            handle.increment(0);
            handle
        };
        let running = gauge!(REQUESTS_RUNNING, &labels);
        running.set(0.0);
        let kv_blocks = KV_BLOCK_STATES.map(|state| {
            let mut labels = labels.to_vec();
            labels.push(("state", state.to_owned()));
            let handle = gauge!(KV_CACHE_BLOCKS, &labels);
            handle.set(0.0);
            handle
        });
        let kv_bytes = gauge!(KV_CACHE_BYTES, &labels);
        let worker_labels = Labels::new(model, worker, &[]);
        Self {
            classes,
            policy: PolicySeries::new(model, worker),
            finished: FINISHED.map(c),
            prompt_tokens: c(PROMPT_TOKENS),
            prefix_cache_hits: c(PREFIX_CACHE_HITS),
            generation_tokens: c(GENERATION_TOKENS),
            ttft: binned::histogram(TTFT, &worker_labels),
            itl: binned::histogram(ITL, &worker_labels),
            e2e: binned::histogram(E2E, &worker_labels),
            running,
            kv_blocks,
            kv_bytes,
            batch_processing: binned::histogram(BATCH_PROCESSING, &worker_labels),
            gaps: c(GAPS),
            invalid_batches: c(INVALID_BATCHES),
            stale: c(STALE_BATCHES),
            unknown_rows: c(UNKNOWN_ROWS),
            refused: c(REFUSED),
            lost: c(WORKERS_LOST),
            resyncs: c(RESYNCS),
        }
    }

    /// Touches every recorder series of the worker (a zero increment), so that the idle
    /// timeout that removes departed workers' series never removes a live one's: called at
    /// each of its heartbeats.
    pub fn keep_alive(&self) {
        let counters = self.finished.iter().chain([
            &self.prompt_tokens,
            &self.prefix_cache_hits,
            &self.generation_tokens,
            &self.gaps,
            &self.invalid_batches,
            &self.stale,
            &self.unknown_rows,
            &self.refused,
            &self.lost,
            &self.resyncs,
        ]);
        for counter in counters {
            counter.increment(0);
        }
        let gauges = self.kv_blocks.iter().chain(&self.policy.verify_cost);
        for gauge in gauges.chain([&self.running, &self.kv_bytes]) {
            gauge.increment(0.0);
        }
    }

    pub fn set_kv_bytes(&self, bytes: u64) {
        self.kv_bytes.set(bytes as f64);
    }

    /// The KV-cache blocks' use a heartbeat reported.
    pub fn set_kv_blocks(&self, blocks: &KvBlocks) {
        for (gauge, n) in self
            .kv_blocks
            .iter()
            .zip([blocks.used, blocks.cached, blocks.free])
        {
            gauge.set(f64::from(n));
        }
    }

    /// The drafting policy's cost curve a heartbeat reported (sizes outside
    /// [`COST_POINT_TOKENS`] are ignored: the label stays bounded).
    pub fn set_verify_cost(&self, points: &[CostPoint]) {
        for point in points.iter().take(MAX_COST_POINTS) {
            if let Some(i) = COST_POINT_TOKENS.iter().position(|&t| t == point.tokens) {
                if point.seconds.is_finite() && point.seconds >= 0.0 {
                    self.policy.verify_cost[i].set(point.seconds);
                }
            }
        }
    }

    /// Adds one batch's (or sweep's) observations.
    pub fn apply(&self, obs: &Observations) {
        for (series, figures) in self.classes.iter().zip(&obs.figures) {
            series.spec.apply(figures);
        }
        for finished in &obs.finished_acceptance {
            let Some(series) = self.classes.get(usize::from(finished.class)) else {
                continue;
            };
            if let Some(rate) = finished.draft_acceptance_rate {
                series.acceptance_rate.observe([(rate, 1)]);
            }
            series
                .accepted_length
                .observe([(finished.mean_accepted_length, 1)]);
        }
        if obs.verify_us > 0 {
            self.policy.verify_seconds.increment(obs.verify_us);
            self.policy.k0_tokens.increment(obs.k0_tokens_milli);
            self.policy.verify_tokens.increment(obs.verify_tokens);
        }
        for (handle, &n) in self.finished.iter().zip(&obs.finished) {
            if n > 0 {
                handle.increment(n);
            }
        }
        self.prompt_tokens.increment(obs.prompt_tokens);
        self.prefix_cache_hits.increment(obs.cached_prompt_tokens);
        self.generation_tokens.increment(obs.generation_tokens);
        if !obs.ttft_s.is_empty() {
            self.ttft.observe(obs.ttft_s.iter().map(|&s| (s, 1)));
        }
        if !obs.itl_s.is_empty() {
            self.itl.observe(obs.itl_s.iter().map(|&s| (s, 1)));
        }
        if !obs.e2e_s.is_empty() {
            self.e2e.observe(obs.e2e_s.iter().map(|&s| (s, 1)));
        }
        if obs.unknown_rows > 0 {
            self.unknown_rows.increment(obs.unknown_rows);
        }
        if obs.refused_at_cap > 0 {
            self.refused.increment(obs.refused_at_cap);
        }
    }
}

/// `(j, steps of length j)` for a per-step histogram's observations.
fn per_length(histogram: &[u64]) -> impl Iterator<Item = (f64, u64)> + '_ {
    histogram.iter().enumerate().map(|(j, &n)| (j as f64, n))
}

/// Process-wide series (no worker yet, or no worker at all).
/// Unlabeled: the worker id of a stranger is untrusted input, not a label value.
pub fn unknown_worker_batch() {
    counter!(UNKNOWN_WORKER_BATCHES).increment(1);
}

/// Unlabeled, like [`unknown_worker_batch`]: the sender is not the worker it names.
pub fn foreign_frame() {
    counter!(FOREIGN_FRAMES).increment(1);
}

pub fn malformed_frame() {
    counter!(MALFORMED_FRAMES).increment(1);
}

pub fn duplicate_id_refused() {
    counter!(DUPLICATE_IDS).increment(1);
}

pub fn outputs_dropped(n: usize) {
    counter!(OUTPUTS_DROPPED).increment(n as u64);
}

pub fn set_workers_connected(n: usize) {
    gauge!(WORKERS_CONNECTED).set(n as f64);
}

pub fn set_api_servers_connected(n: usize) {
    gauge!(API_SERVERS_CONNECTED).set(n as f64);
}

/// Touches the process's own series (no worker label) so the recorder's idle timeout, which
/// removes departed workers' series, never removes them: called by the upkeep.
pub fn keep_process_series_alive() {
    for name in PROCESS_COUNTERS {
        counter!(*name).increment(0);
    }
    gauge!(WORKERS_CONNECTED).increment(0.0);
    gauge!(API_SERVERS_CONNECTED).increment(0.0);
}

/// Removes every rendered series of a worker that left (its spec series, histograms): the
/// recorder's own drop by their idle timeout.
pub fn forget_worker(worker: &str) {
    binned::forget_worker(worker);
}

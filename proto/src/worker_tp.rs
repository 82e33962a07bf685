//! engine-worker ⇄ token-processor. The worker connects a DEALER to the token-processor's ROUTER
//! and says [`WorkerHello`] on every (re)connect, then a [`Resync`] of its in-flight requests,
//! then numbered [`StepBatch`]es and periodic [`Heartbeat`]s. The token-processor answers on the
//! same connection ([`TpToWorker`]): every heartbeat and resync with an [`TpToWorker::Ack`] of
//! the batches it took, anything from a worker it does not know with
//! [`TpToWorker::AskHello`].

use serde::{Deserialize, Serialize};

use crate::{FinishReason, ProtoError, RequestId, TokenLogprob, MAX_TOP_LOGPROBS};

/// Largest K (`num_spec_tokens`) any process accepts: the token-processor's figures are O(K) per
/// request and the step batch carries `d` as a byte. A worker with a larger K refuses to start.
pub const MAX_SPEC_TOKENS: u32 = 64;

/// Longest [`WorkerHello::proposer`] the token-processor takes, in bytes: the proposer becomes
/// a label value of every acceptance series, so it is bounded like any label an operator did
/// not choose.
pub const MAX_PROPOSER_BYTES: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerHello {
    pub protocol_version: u32,
    pub worker_id: String,
    /// Changes on every process start; a new epoch means the old one's requests are gone.
    pub epoch: u64,
    pub model: String,
    /// K: the most draft tokens a step may propose.
    pub num_spec_tokens: u32,
    /// Where the drafts come from: `ngram`, `suffix`, `draft:<model name>`, `layers:<N>`, or
    /// `none` (K = 0). The token-processor labels the worker's acceptance series with it, so it
    /// must pass [`check_proposer`].
    pub proposer: String,
    /// True once the model is loaded and the worker takes requests.
    pub ready: bool,
    /// Peers declare the worker dead after a few missed intervals.
    pub heartbeat_interval_ms: u32,
    /// Most positions (prompt + output) of one request on this worker; 0 until the model is
    /// loaded. The api-server validates against it and takes the default `max_tokens` from it.
    pub max_model_len: u32,
    /// Positions the worker's KV cache holds (blocks × block size); 0 until the model is loaded.
    /// The api-server's default admission bound derives from it.
    pub kv_capacity_tokens: u32,
    /// Bytes of the target's KV cache (0 until the model is loaded): what the cache may take at
    /// most (on the CPU its pages are backed as blocks are first written).
    pub kv_bytes: u64,
    /// Bytes of the draft model's own KV cache, beside the target's (0 when the proposer keeps
    /// none, and until the model is loaded): what drafting costs in accelerator memory.
    pub draft_kv_bytes: u64,
    /// Most sequences the worker runs in one batch (0 until the model is loaded): what a request
    /// may hold a share of at the api-server, so that no request fills every batch slot.
    pub max_num_seqs: u32,
    /// Random per worker process, sent only to token-processors (0 in the hello api-servers
    /// get): the epoch is seen by anyone who says hello to the worker, so a hello of a live
    /// epoch from another connection is taken only with this (a reconnect of the same process).
    pub session: u64,
}

/// Longest peer id (`worker_id`, `api_server_id`) a hello may carry, in bytes: ids become
/// label values and map keys.
pub const MAX_PEER_ID_BYTES: usize = 128;

/// Longest model name a hello may carry, in bytes (a label value too).
pub const MAX_MODEL_NAME_BYTES: usize = 256;

/// Longest heartbeat interval a hello may announce, in milliseconds (0 is the default): a peer
/// announcing months would stay alive for months after its death.
pub const MAX_HEARTBEAT_INTERVAL_MS: u32 = 60_000;

/// Largest context length and batch a hello may announce.
pub const MAX_ANNOUNCED_CONTEXT: u32 = 1 << 24;
pub const MAX_ANNOUNCED_BATCH: u32 = 1 << 16;

/// Ok when `id` can name a peer: not empty, at most [`MAX_PEER_ID_BYTES`], no control
/// characters. Else why not.
pub fn check_peer_id(id: &str) -> Result<(), String> {
    check_name("the peer id", id, MAX_PEER_ID_BYTES)
}

fn check_name(what: &str, name: &str, max: usize) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if name.len() > max {
        return Err(format!("{what} is {} bytes, more than {max}", name.len()));
    }
    if name.chars().any(char::is_control) {
        return Err(format!("{what} contains control characters"));
    }
    Ok(())
}

/// Ok when every field of a worker's hello is within what peers take; else the first that is
/// not, as a reason for the refusal. (The protocol version is checked before, by its own rule.)
pub fn check_hello(hello: &WorkerHello) -> Result<(), String> {
    check_peer_id(&hello.worker_id)?;
    check_name("the model name", &hello.model, MAX_MODEL_NAME_BYTES)?;
    check_proposer(&hello.proposer)
        .map_err(|p| format!("{p}: the token-processor labels acceptance series with it"))?;
    if hello.num_spec_tokens > MAX_SPEC_TOKENS {
        return Err(format!(
            "num_spec_tokens {} exceeds the token-processor's limit {MAX_SPEC_TOKENS}",
            hello.num_spec_tokens
        ));
    }
    if hello.heartbeat_interval_ms > MAX_HEARTBEAT_INTERVAL_MS {
        return Err(format!(
            "heartbeat_interval_ms {} exceeds {MAX_HEARTBEAT_INTERVAL_MS}",
            hello.heartbeat_interval_ms
        ));
    }
    if hello.max_model_len > MAX_ANNOUNCED_CONTEXT {
        return Err(format!(
            "max_model_len {} exceeds {MAX_ANNOUNCED_CONTEXT}",
            hello.max_model_len
        ));
    }
    if hello.max_num_seqs > MAX_ANNOUNCED_BATCH {
        return Err(format!(
            "max_num_seqs {} exceeds {MAX_ANNOUNCED_BATCH}",
            hello.max_num_seqs
        ));
    }
    Ok(())
}

/// Ok when `proposer` can be a metric label value: not empty (an empty value is no label at all
/// in Prometheus), at most [`MAX_PROPOSER_BYTES`], no control characters. Else why not.
pub fn check_proposer(proposer: &str) -> Result<(), String> {
    if proposer.is_empty() {
        return Err("the proposer is empty".into());
    }
    if proposer.len() > MAX_PROPOSER_BYTES {
        return Err(format!(
            "the proposer is {} bytes, more than {MAX_PROPOSER_BYTES}",
            proposer.len()
        ));
    }
    if proposer.chars().any(char::is_control) {
        return Err(format!(
            "the proposer {proposer:?} contains control characters"
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub worker_id: String,
    pub epoch: u64,
    /// Sequence number the next step batch will carry (so a lost last batch shows as a gap).
    pub next_seq: u64,
    pub running: u32,
    pub waiting: u32,
    /// False while draining for shutdown.
    pub accepting: bool,
    /// Finished requests kept until their api-server acknowledges the final output
    /// ([`ApiToWorker::Delivered`](crate::api_worker::ApiToWorker::Delivered)), and their bytes.
    pub retained: u32,
    pub retained_bytes: u64,
    /// Retained requests dropped unacknowledged (over the bound or too old) since start.
    pub retained_evicted: u64,
    /// The `next_seq` of the token-processor's latest [`TpToWorker::Ack`] on this connection:
    /// batches below it were taken (0 before the first).
    pub tp_acked_seq: u64,
    /// The token-processor acknowledged within its liveness window; false while the link is
    /// down or stalled (the worker reconnects and resyncs).
    pub tp_link_up: bool,
    /// KV-cache blocks held by running sequences, cached (held by none, keeping a prompt prefix
    /// for later requests until a new block needs the room) and free.
    pub kv_blocks: KvBlocks,
    /// The drafting policy's verify-cost curve as fitted now (at most [`MAX_COST_POINTS`]
    /// points, tokens ascending; empty without speculation): what a verify forward of that many
    /// tokens costs, the price the policy weighs every draft token against.
    pub verify_cost: Vec<CostPoint>,
}

/// Most points of [`Heartbeat::verify_cost`] (each becomes a gauge with a `tokens` label).
pub const MAX_COST_POINTS: usize = 16;

/// The verify sizes a worker reports its cost curve at; the token-processor exports only these
/// (a `tokens` label a worker could choose freely would be unbounded).
pub const COST_POINT_TOKENS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];

/// One point of the verify-cost curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostPoint {
    pub tokens: u32,
    pub seconds: f64,
}

/// How a worker's KV-cache blocks are used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvBlocks {
    pub used: u32,
    pub cached: u32,
    pub free: u32,
}

impl Heartbeat {
    /// The heartbeat of an idle worker (nothing running, waiting or kept) whose link to the
    /// token-processor is up: what tests and benchmarks send; real workers fill in the rest.
    pub fn idle(worker_id: String, epoch: u64, next_seq: u64) -> Self {
        Self {
            worker_id,
            epoch,
            next_seq,
            running: 0,
            waiting: 0,
            accepting: true,
            retained: 0,
            retained_bytes: 0,
            retained_evicted: 0,
            tp_acked_seq: 0,
            tp_link_up: true,
            kv_blocks: KvBlocks::default(),
            verify_cost: Vec::new(),
        }
    }
}

/// Row flag: this row is the request's prefill (not a verification step).
pub const FLAG_PREFILL: u8 = 1;
/// Row flag: the request was preempted (recompute) in this step; the row has no tokens.
pub const FLAG_PREEMPTED: u8 = 2;

/// Facts about a request sent once, with the row where it first appears.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestStart {
    pub row: u32,
    pub owner: String,
    pub prompt_tokens: u32,
    /// Of `prompt_tokens`, those whose KV the worker's prefix cache held (not computed again).
    pub cached_prompt_tokens: u32,
    pub arrival_unix_ms: u64,
    /// The request's class as its api-server named it (the token-processor maps a class it
    /// was not configured with to `other`).
    pub class: String,
}

/// One engine step, column-oriented: row `i` is one request's outcome in that step. The flat
/// layout (one token array plus offsets) decodes far faster than an array of structs, and the
/// integer columns travel as little-endian `bin`s ([`crate::columns`]), faster still.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct StepBatch {
    pub worker_id: String,
    pub epoch: u64,
    /// Per (worker, epoch), starting at 0 with no holes.
    pub seq: u64,
    #[serde(with = "crate::columns")]
    pub ids: Vec<RequestId>,
    /// `ids.len() + 1` entries; row `i`'s tokens are `tokens[token_offsets[i]..token_offsets[i+1]]`.
    #[serde(with = "crate::columns")]
    pub token_offsets: Vec<u32>,
    #[serde(with = "crate::columns")]
    pub tokens: Vec<u32>,
    #[serde(with = "serde_bytes")]
    pub drafted: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub accepted: Vec<u8>,
    /// Draft tokens the proposer offered the drafting policy (`drafted` of them were verified;
    /// never fewer than `drafted`, never more than K).
    #[serde(with = "serde_bytes")]
    pub offered: Vec<u8>,
    /// The policy's expected accepted tokens of the verified draft, in thousandths of a token
    /// (its point estimate, without the exploration bonus it plans with).
    #[serde(with = "crate::columns")]
    pub predicted_milli: Vec<u16>,
    #[serde(with = "serde_bytes")]
    pub flags: Vec<u8>,
    /// [`FinishReason::code`], 0 when the request goes on.
    #[serde(with = "serde_bytes")]
    pub finish: Vec<u8>,
    pub starts: Vec<RequestStart>,
    /// The logprobs of the rows whose requests asked for them, in row order.
    pub logprobs: Vec<RowLogprobs>,
    /// The prompt logprobs of prefill rows whose requests asked for them (one per prompt token
    /// after the first), in row order.
    pub prompt_logprobs: Vec<RowLogprobs>,
    /// The step's verify forward, when every row of it was a verify row (else `None`): what the
    /// policy's cost curve learns from.
    pub verify_timing: Option<VerifyTiming>,
}

/// The measured time of a step's verify forward, and what K = 0 would have done in it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct VerifyTiming {
    /// Microseconds the forward took.
    pub micros: u32,
    /// Tokens K = 0 would have emitted in the same time, in thousandths: the forward's time
    /// over the fitted cost of a one-token-per-row forward, times the rows.
    pub k0_tokens_milli: u32,
}

/// The logprobs of one row's tokens, one per token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowLogprobs {
    pub row: u32,
    pub tokens: Vec<TokenLogprob>,
}

/// One validated row of a [`StepBatch`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRow<'a> {
    pub id: RequestId,
    pub tokens: &'a [u32],
    pub drafted: u8,
    pub accepted: u8,
    /// See [`StepBatch::offered`].
    pub offered: u8,
    /// See [`StepBatch::predicted_milli`].
    pub predicted_milli: u16,
    pub prefill: bool,
    pub preempted: bool,
    pub finish: Option<FinishReason>,
    /// One per token when the request asked for logprobs, else empty.
    pub logprobs: &'a [TokenLogprob],
    /// On a prefill row whose request asked for prompt logprobs, one per prompt token after
    /// the first; else empty.
    pub prompt_logprobs: &'a [TokenLogprob],
}

impl StepBatch {
    pub fn new(worker_id: String, epoch: u64, seq: u64) -> Self {
        Self {
            worker_id,
            epoch,
            seq,
            token_offsets: vec![0],
            ..Self::default()
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Appends a row. `accepted <= drafted <= K` is the caller's contract, checked on receipt.
    pub fn push(&mut self, row: StepRow<'_>) {
        if !row.logprobs.is_empty() {
            self.logprobs.push(RowLogprobs {
                row: self.ids.len() as u32,
                tokens: row.logprobs.to_vec(),
            });
        }
        if !row.prompt_logprobs.is_empty() {
            self.prompt_logprobs.push(RowLogprobs {
                row: self.ids.len() as u32,
                tokens: row.prompt_logprobs.to_vec(),
            });
        }
        self.ids.push(row.id);
        self.tokens.extend_from_slice(row.tokens);
        self.token_offsets.push(self.tokens.len() as u32);
        self.drafted.push(row.drafted);
        self.accepted.push(row.accepted);
        self.offered.push(row.offered);
        self.predicted_milli.push(row.predicted_milli);
        let mut flags = 0;
        if row.prefill {
            flags |= FLAG_PREFILL;
        }
        if row.preempted {
            flags |= FLAG_PREEMPTED;
        }
        self.flags.push(flags);
        self.finish.push(row.finish.map_or(0, FinishReason::code));
    }

    /// Checks the columns against each other and against `num_spec_tokens` (K) so that
    /// [`rows`](Self::rows) cannot fail or index out of bounds.
    pub fn validate(&self, num_spec_tokens: u32) -> Result<(), ProtoError> {
        let n = self.ids.len();
        if self.token_offsets.len() != n + 1
            || self.drafted.len() != n
            || self.accepted.len() != n
            || self.offered.len() != n
            || self.predicted_milli.len() != n
            || self.flags.len() != n
            || self.finish.len() != n
        {
            return Err(ProtoError::InvalidBatch("column lengths differ"));
        }
        if self.token_offsets[0] != 0 || self.token_offsets[n] as usize != self.tokens.len() {
            return Err(ProtoError::InvalidBatch(
                "token offsets do not span the tokens",
            ));
        }
        if self.token_offsets.windows(2).any(|w| w[0] > w[1]) {
            return Err(ProtoError::InvalidBatch("token offsets decrease"));
        }
        for i in 0..n {
            let (d, a) = (self.drafted[i], self.accepted[i]);
            if a > d || u32::from(d) > num_spec_tokens {
                return Err(ProtoError::InvalidBatch(
                    "accepted > drafted or drafted > K",
                ));
            }
            if self.offered[i] < d || u32::from(self.offered[i]) > num_spec_tokens {
                return Err(ProtoError::InvalidBatch("offered < drafted or offered > K"));
            }
            if u32::from(self.predicted_milli[i]) > 1000 * u32::from(d) {
                return Err(ProtoError::InvalidBatch(
                    "more accepted tokens predicted than drafted",
                ));
            }
            if self.flags[i] & !(FLAG_PREFILL | FLAG_PREEMPTED) != 0 {
                return Err(ProtoError::InvalidBatch("unknown row flag"));
            }
            if FinishReason::from_code(self.finish[i]).is_none() {
                return Err(ProtoError::InvalidBatch("unknown finish code"));
            }
        }
        if self.starts.iter().any(|s| s.row as usize >= n) {
            return Err(ProtoError::InvalidBatch(
                "request start points past the rows",
            ));
        }
        self.validate_logprobs()
    }

    fn validate_logprobs(&self) -> Result<(), ProtoError> {
        check_logprob_rows(&self.logprobs, self.ids.len())?;
        for entry in &self.logprobs {
            let row = entry.row as usize;
            let tokens = (self.token_offsets[row + 1] - self.token_offsets[row]) as usize;
            if entry.tokens.len() != tokens {
                return Err(ProtoError::InvalidBatch(
                    "a row's logprobs do not match its tokens",
                ));
            }
        }
        check_logprob_rows(&self.prompt_logprobs, self.ids.len())?;
        if self
            .prompt_logprobs
            .iter()
            .any(|entry| self.flags[entry.row as usize] & FLAG_PREFILL == 0)
        {
            return Err(ProtoError::InvalidBatch(
                "prompt logprobs on a row that is not a prefill",
            ));
        }
        Ok(())
    }

    /// Rows of a batch that passed [`validate`](Self::validate).
    pub fn rows(&self) -> impl ExactSizeIterator<Item = StepRow<'_>> + '_ {
        let mut logprobs = self.logprobs.iter().peekable();
        let mut prompt_logprobs = self.prompt_logprobs.iter().peekable();
        (0..self.ids.len()).map(move |i| {
            let row_logprobs = logprobs
                .next_if(|entry| entry.row as usize == i)
                .map_or(&[][..], |entry| &entry.tokens[..]);
            let row_prompt_logprobs = prompt_logprobs
                .next_if(|entry| entry.row as usize == i)
                .map_or(&[][..], |entry| &entry.tokens[..]);
            let (lo, hi) = (
                self.token_offsets[i] as usize,
                self.token_offsets[i + 1] as usize,
            );
            StepRow {
                id: self.ids[i],
                tokens: &self.tokens[lo..hi],
                drafted: self.drafted[i],
                accepted: self.accepted[i],
                offered: self.offered[i],
                predicted_milli: self.predicted_milli[i],
                prefill: self.flags[i] & FLAG_PREFILL != 0,
                preempted: self.flags[i] & FLAG_PREEMPTED != 0,
                finish: FinishReason::from_code(self.finish[i]).flatten(),
                logprobs: row_logprobs,
                prompt_logprobs: row_prompt_logprobs,
            }
        })
    }
}

/// Rows in increasing order, each one present, and no more top logprobs than allowed.
fn check_logprob_rows(entries: &[RowLogprobs], rows: usize) -> Result<(), ProtoError> {
    let mut next_row = 0;
    for entry in entries {
        let row = entry.row as usize;
        if row < next_row || row >= rows {
            return Err(ProtoError::InvalidBatch(
                "logprob rows out of order or past the rows",
            ));
        }
        next_row = row + 1;
        if entry
            .tokens
            .iter()
            .any(|t| t.top.len() > usize::from(MAX_TOP_LOGPROBS))
        {
            return Err(ProtoError::InvalidBatch("more top logprobs than allowed"));
        }
    }
    Ok(())
}

/// One in-flight request as its worker knows it, for a token-processor that (re)connected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResyncRequest {
    pub id: RequestId,
    pub owner: String,
    pub prompt_tokens: u32,
    /// Of `prompt_tokens`, those the prefix cache held at admission.
    pub cached_prompt_tokens: u32,
    pub arrival_unix_ms: u64,
    /// Whether the prefill step already ran.
    pub prefilled: bool,
    /// Output tokens so far.
    pub tokens: Vec<u32>,
    /// `(drafted, accepted)` of every verification step so far, in order.
    #[serde(with = "serde_bytes")]
    pub drafted: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub accepted: Vec<u8>,
    /// Per verification step, the tokens offered and the accepted tokens predicted, as in
    /// [`StepBatch::offered`] and [`StepBatch::predicted_milli`].
    #[serde(with = "serde_bytes")]
    pub offered: Vec<u8>,
    #[serde(with = "crate::columns")]
    pub predicted_milli: Vec<u16>,
    /// See [`RequestStart::class`].
    pub class: String,
    /// [`FinishReason::code`] of a request that finished but whose final output its api-server
    /// has not acknowledged yet; 0 while it runs.
    pub finish: u8,
    /// One per output token when the request asked for logprobs, else empty.
    pub logprobs: Vec<TokenLogprob>,
    /// One per prompt token after the first once prefilled, when the request asked for prompt
    /// logprobs; else empty.
    pub prompt_logprobs: Vec<TokenLogprob>,
}

/// Sent right after [`WorkerHello`] on every (re)connect, and whenever an api-server reports
/// outputs missing: the worker's in-flight requests, and its finished ones not yet acknowledged,
/// as of just before step batch `next_seq`. The token-processor replays each from token 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resync {
    pub worker_id: String,
    pub epoch: u64,
    pub next_seq: u64,
    pub requests: Vec<ResyncRequest>,
}

/// token-processor → engine-worker, on the worker's connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TpToWorker {
    /// Answer to each heartbeat and resync of a worker it takes: the batches of `epoch` below
    /// `next_seq` were received and counted. Silence of these for the liveness window tells
    /// the worker its link stalled.
    Ack { epoch: u64, next_seq: u64 },
    /// The token-processor does not know the sender (never heard its hello, declared it dead,
    /// or restarted): say hello and resync.
    AskHello,
    /// The sender's hello was refused (version, K, a live worker holds the id, too many
    /// workers).
    Refused { reason: String },
}

// Step batches are what this link carries; a box would cost each one an allocation to save the
// space of a decoded hello or heartbeat, which live for a moment.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerToTp {
    Hello(WorkerHello),
    Step(StepBatch),
    Heartbeat(Heartbeat),
    Resync(Resync),
    /// Clean shutdown: the worker's requests are all finished and it sends nothing more.
    Goodbye {
        worker_id: String,
        epoch: u64,
    },
}

//! State the step loop publishes for the I/O tasks' hellos and heartbeats.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use proto::worker_tp::{CostPoint, Heartbeat, KvBlocks, WorkerHello};

use crate::spec::DraftPlanner;

/// How often the heartbeat's cost curve is refreshed from the planner.
const COST_REFRESH: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct WorkerStatus {
    pub worker_id: String,
    pub epoch: u64,
    pub num_spec_tokens: u32,
    pub proposer: String,
    pub heartbeat_interval_ms: u32,
    model: RwLock<String>,
    /// 0 until the model is loaded.
    max_model_len: AtomicU32,
    kv_capacity_tokens: AtomicU32,
    /// Bytes of the target's KV cache, and of the draft model's own (0 when the proposer keeps
    /// none).
    kv_bytes: AtomicU64,
    draft_kv_bytes: AtomicU64,
    /// Blocks used, cached and free, as the step loop last saw them.
    kv_used: AtomicU32,
    kv_cached: AtomicU32,
    kv_free: AtomicU32,
    /// The policy's verify-cost curve, refreshed by the step loop at most once a second.
    verify_cost: Mutex<(Option<Instant>, Vec<CostPoint>)>,
    max_num_seqs: AtomicU32,
    /// Sent only to token-processors (`WorkerHello::session`).
    session: u64,
    ready: AtomicBool,
    draining: AtomicBool,
    next_seq: AtomicU64,
    running: AtomicU32,
    waiting: AtomicU32,
    resync_requested: AtomicBool,
    retained: AtomicU32,
    retained_bytes: AtomicU64,
    retained_evicted: AtomicU64,
    /// The token-processor's latest acknowledgement (`next_seq`), and whether it came within
    /// the liveness window.
    tp_acked_seq: AtomicU64,
    tp_link_up: AtomicBool,
    /// When the step loop last turned, as ns since `started`.
    last_turn_ns: AtomicU64,
    started: Instant,
}

impl WorkerStatus {
    pub fn new(
        worker_id: String,
        epoch: u64,
        model: String,
        num_spec_tokens: u32,
        proposer: String,
        heartbeat_interval_ms: u32,
    ) -> Self {
        Self {
            worker_id,
            epoch,
            num_spec_tokens,
            proposer,
            heartbeat_interval_ms,
            model: RwLock::new(model),
            max_model_len: AtomicU32::new(0),
            kv_capacity_tokens: AtomicU32::new(0),
            kv_bytes: AtomicU64::new(0),
            draft_kv_bytes: AtomicU64::new(0),
            kv_used: AtomicU32::new(0),
            kv_cached: AtomicU32::new(0),
            kv_free: AtomicU32::new(0),
            verify_cost: Mutex::new((None, Vec::new())),
            max_num_seqs: AtomicU32::new(0),
            session: rand::random::<u64>() | 1,
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            next_seq: AtomicU64::new(0),
            running: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            resync_requested: AtomicBool::new(false),
            retained: AtomicU32::new(0),
            retained_bytes: AtomicU64::new(0),
            retained_evicted: AtomicU64::new(0),
            tp_acked_seq: AtomicU64::new(0),
            tp_link_up: AtomicBool::new(false),
            last_turn_ns: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// The model is loaded: hellos say ready, and state the context length, the KV cache's
    /// size and the batch's, from now on.
    pub fn set_ready(
        &self,
        model: String,
        max_model_len: usize,
        kv_capacity_tokens: usize,
        max_num_seqs: usize,
    ) {
        self.max_num_seqs.store(
            u32::try_from(max_num_seqs).unwrap_or(u32::MAX),
            Ordering::SeqCst,
        );
        *self.model.write().unwrap_or_else(|e| e.into_inner()) = model;
        self.max_model_len.store(
            u32::try_from(max_model_len).unwrap_or(u32::MAX),
            Ordering::SeqCst,
        );
        self.kv_capacity_tokens.store(
            u32::try_from(kv_capacity_tokens).unwrap_or(u32::MAX),
            Ordering::SeqCst,
        );
        self.last_turn_ns
            .store(self.started.elapsed().as_nanos() as u64, Ordering::SeqCst);
        self.ready.store(true, Ordering::SeqCst);
    }

    /// The KV caches are allocated: hellos state their sizes from now on (set them before
    /// [`Self::set_ready`], so the ready hello carries them).
    pub fn set_kv_bytes(&self, target: u64, draft: u64) {
        self.kv_bytes.store(target, Ordering::SeqCst);
        self.draft_kv_bytes.store(draft, Ordering::SeqCst);
    }

    /// The policy's fitted verify cost, for the heartbeats (without speculation none). The curve
    /// moves slowly (one forward moves its scale by 5%), so once a second is enough.
    pub fn publish_verify_cost(&self, planner: &DraftPlanner) {
        if self.num_spec_tokens == 0 {
            return;
        }
        let mut cost = self.verify_cost.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if cost
            .0
            .is_none_or(|at| now.duration_since(at) >= COST_REFRESH)
        {
            *cost = (Some(now), planner.cost_points());
        }
    }

    /// The KV-cache blocks' use, for the heartbeats.
    pub fn publish_kv(&self, blocks: KvBlocks) {
        self.kv_used.store(blocks.used, Ordering::SeqCst);
        self.kv_cached.store(blocks.cached, Ordering::SeqCst);
        self.kv_free.store(blocks.free, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Takes new requests: loaded and not draining.
    pub fn accepting(&self) -> bool {
        self.is_ready() && !self.draining.load(Ordering::SeqCst)
    }

    /// How long since the step loop last published (it does every pass, idle or not).
    pub fn step_loop_silence(&self) -> Duration {
        let last = Duration::from_nanos(self.last_turn_ns.load(Ordering::SeqCst));
        self.started.elapsed().saturating_sub(last)
    }

    pub fn publish(&self, next_seq: u64, running: usize, waiting: usize) {
        self.last_turn_ns
            .store(self.started.elapsed().as_nanos() as u64, Ordering::SeqCst);
        self.next_seq.store(next_seq, Ordering::SeqCst);
        self.running.store(running as u32, Ordering::SeqCst);
        self.waiting.store(waiting as u32, Ordering::SeqCst);
    }

    /// Finished requests kept until acknowledged, their bytes, and drops since start.
    pub fn publish_retained(&self, retained: usize, bytes: usize, evicted: u64) {
        self.retained.store(retained as u32, Ordering::SeqCst);
        self.retained_bytes.store(bytes as u64, Ordering::SeqCst);
        self.retained_evicted.store(evicted, Ordering::SeqCst);
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst) as usize
    }

    /// The token-processor acknowledged the batches below `next_seq`.
    pub fn set_tp_acked(&self, next_seq: u64) {
        self.tp_acked_seq.store(next_seq, Ordering::SeqCst);
        self.tp_link_up.store(true, Ordering::SeqCst);
    }

    /// The token-processor link broke or stalled (until its next acknowledgement).
    pub fn set_tp_link_down(&self) {
        self.tp_link_up.store(false, Ordering::SeqCst);
    }

    /// The token-processor link (re)connected and needs the in-flight state.
    pub fn request_resync(&self) {
        self.resync_requested.store(true, Ordering::SeqCst);
    }

    pub fn take_resync_request(&self) -> bool {
        self.resync_requested.swap(false, Ordering::SeqCst)
    }

    /// The hello for api-servers: without the session, which only the token-processor may know.
    pub fn hello_for_api(&self) -> WorkerHello {
        WorkerHello {
            session: 0,
            ..self.hello()
        }
    }

    /// The hello for the token-processor.
    pub fn hello(&self) -> WorkerHello {
        WorkerHello {
            protocol_version: proto::PROTOCOL_VERSION,
            worker_id: self.worker_id.clone(),
            epoch: self.epoch,
            model: self.model.read().unwrap_or_else(|e| e.into_inner()).clone(),
            num_spec_tokens: self.num_spec_tokens,
            proposer: self.proposer.clone(),
            ready: self.is_ready(),
            heartbeat_interval_ms: self.heartbeat_interval_ms,
            max_model_len: self.max_model_len.load(Ordering::SeqCst),
            kv_capacity_tokens: self.kv_capacity_tokens.load(Ordering::SeqCst),
            kv_bytes: self.kv_bytes.load(Ordering::SeqCst),
            draft_kv_bytes: self.draft_kv_bytes.load(Ordering::SeqCst),
            max_num_seqs: self.max_num_seqs.load(Ordering::SeqCst),
            session: self.session,
        }
    }

    pub fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            worker_id: self.worker_id.clone(),
            epoch: self.epoch,
            next_seq: self.next_seq.load(Ordering::SeqCst),
            running: self.running.load(Ordering::SeqCst),
            waiting: self.waiting.load(Ordering::SeqCst),
            accepting: self.accepting(),
            retained: self.retained.load(Ordering::SeqCst),
            retained_bytes: self.retained_bytes.load(Ordering::SeqCst),
            retained_evicted: self.retained_evicted.load(Ordering::SeqCst),
            tp_acked_seq: self.tp_acked_seq.load(Ordering::SeqCst),
            tp_link_up: self.tp_link_up.load(Ordering::SeqCst),
            kv_blocks: KvBlocks {
                used: self.kv_used.load(Ordering::SeqCst),
                cached: self.kv_cached.load(Ordering::SeqCst),
                free: self.kv_free.load(Ordering::SeqCst),
            },
            verify_cost: self
                .verify_cost
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .1
                .clone(),
        }
    }
}

//! What this api-server knows about its peers: each engine-worker's hello, heartbeats and
//! liveness, and the token-processor's. Liveness is `link::liveness`'s rule: a peer is alive
//! from its hello until it stays silent past the window or says hello with a new epoch; a
//! message from a peer declared dead is answered with our hello (which asks for theirs).

use std::time::Instant;

use link::liveness::Heard;
use link::peers::{dialed_heard, dialed_hello_rule, HelloRule, Holder};
use link::{Liveness, PeerClock};
use proto::tp_api::TpHello;
use proto::worker_tp::{Heartbeat, WorkerHello};

/// A worker's finished requests kept until their owner acknowledges them (its heartbeat).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetainedOutputs {
    pub unacknowledged: u32,
    pub bytes: u64,
    /// Dropped since the worker started, over its retention bounds.
    pub dropped_total: u64,
}

/// A worker's link to the token-processor, as its heartbeat reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerTpLink {
    /// The token-processor acknowledged its step batches within the window.
    pub acknowledges: bool,
    /// Step batches sent but not yet acknowledged.
    pub batches_unacknowledged: u64,
}

#[derive(Debug, Clone)]
pub struct WorkerPeer {
    pub endpoint: String,
    pub hello: Option<WorkerHello>,
    /// The socket is connected (a disconnect stops routing at once; death waits for the window).
    pub connected: bool,
    pub clock: PeerClock,
    pub accepting: bool,
    /// running + waiting from the last heartbeat (all api-servers' requests).
    pub reported_load: u32,
    /// Finished requests the worker keeps until acknowledged, from its last heartbeat.
    pub retained: RetainedOutputs,
    /// The worker's link to the token-processor, from its last heartbeat.
    pub tp_link: WorkerTpLink,
    /// Why the worker refused our hello, or why we refused its (until the next hello).
    pub refused: Option<String>,
}

impl WorkerPeer {
    pub fn new(endpoint: String) -> Self {
        Self {
            endpoint,
            hello: None,
            connected: false,
            clock: PeerClock::default(),
            accepting: false,
            reported_load: 0,
            retained: RetainedOutputs::default(),
            tp_link: WorkerTpLink::default(),
            refused: None,
        }
    }

    pub fn alive(&self) -> bool {
        self.clock.is_alive()
    }

    /// Can take a new request now, as far as the worker itself goes (the token-processor must
    /// also take its batches: [`TpPeer::takes_batches_of`]).
    pub fn routable(&self) -> bool {
        self.alive()
            && self.connected
            && self.accepting
            && self.hello.as_ref().is_some_and(|h| h.ready)
    }

    pub fn worker_id(&self) -> Option<&str> {
        self.hello.as_ref().map(|h| h.worker_id.as_str())
    }

    /// Most positions of one request on this worker (None before its ready hello).
    pub fn max_model_len(&self) -> Option<u32> {
        self.hello
            .as_ref()
            .filter(|h| h.ready && h.max_model_len > 0)
            .map(|h| h.max_model_len)
    }

    fn liveness(&self) -> Liveness {
        Liveness::from_peer_interval_ms(self.hello.as_ref().map_or(0, |h| h.heartbeat_interval_ms))
    }

    /// The worker as the holder of its id, for the hello rule (None before its first hello).
    pub fn holder(&self) -> Option<Holder> {
        self.hello.as_ref().map(|h| Holder {
            epoch: h.epoch,
            silent: !self.alive(),
        })
    }

    /// Records a hello; returns true when it shows a restart (link's dialed-peer rule: a new
    /// epoch at the endpoint), whose requests are gone.
    pub fn on_hello(&mut self, hello: WorkerHello, now: Instant) -> bool {
        let rule = dialed_hello_rule(self.hello.as_ref().map(|h| h.epoch), hello.epoch);
        let restarted = rule == HelloRule::Restart;
        self.accepting = hello.ready;
        self.hello = Some(hello);
        self.clock.hello(now);
        self.refused = None;
        restarted
    }

    /// The worker refused our hello (or we refused its): not alive until a hello succeeds.
    pub fn on_refused(&mut self, reason: String) {
        self.clock.kill();
        self.refused = Some(reason);
    }

    /// A heartbeat counts only from a live worker of the hello's epoch; anything else (declared
    /// dead, another epoch) asks for a hello, and only the hello makes a worker alive.
    pub fn on_heartbeat(&mut self, hb: &Heartbeat, now: Instant) -> Heard {
        let known_epoch = self.hello.as_ref().map(|h| h.epoch);
        let heard = dialed_heard(&mut self.clock, known_epoch, hb.epoch, now);
        if heard == Heard::Known {
            self.accepting = hb.accepting;
            self.reported_load = hb.running.saturating_add(hb.waiting);
            self.retained = RetainedOutputs {
                unacknowledged: hb.retained,
                bytes: hb.retained_bytes,
                dropped_total: hb.retained_evicted,
            };
            self.tp_link = WorkerTpLink {
                acknowledges: hb.tp_link_up,
                batches_unacknowledged: hb.next_seq.saturating_sub(hb.tp_acked_seq),
            };
        }
        heard
    }

    /// Declares the worker dead if it has been silent too long; true on the transition.
    pub fn check_liveness(&mut self, now: Instant) -> bool {
        self.clock.expire(self.liveness(), now)
    }
}

#[derive(Debug, Clone)]
pub struct TpPeer {
    pub hello: Option<TpHello>,
    pub connected: bool,
    pub clock: PeerClock,
    /// The TP re-sends its hello every interval (it is its heartbeat); the rule we expect.
    pub liveness: Liveness,
    /// Why the token-processor refused our hello (until it accepts one).
    pub refused: Option<String>,
}

impl TpPeer {
    pub fn new(liveness: Liveness) -> Self {
        Self {
            hello: None,
            connected: false,
            clock: PeerClock::default(),
            liveness,
            refused: None,
        }
    }

    pub fn alive(&self) -> bool {
        self.clock.is_alive()
    }

    /// Records a hello; returns what it means under link's dialed-peer rule (a new epoch is a
    /// restart).
    pub fn on_hello(&mut self, hello: TpHello, now: Instant) -> HelloRule {
        let rule = dialed_hello_rule(self.hello.as_ref().map(|h| h.epoch), hello.epoch);
        self.hello = Some(hello);
        self.clock.hello(now);
        self.refused = None;
        rule
    }

    /// The token-processor refused our hello: not alive until it accepts one.
    pub fn on_refused(&mut self, reason: String) {
        self.clock.kill();
        self.refused = Some(reason);
    }

    /// Outputs count as a sign of life only from a live token-processor; from one declared dead
    /// they ask for its hello.
    pub fn on_outputs(&mut self, now: Instant) -> Heard {
        self.clock.heard(now)
    }

    /// The token-processor, alive, takes the step batches of `worker_id` (its hello lists the
    /// workers it admitted): only then can a request routed there produce output.
    pub fn takes_batches_of(&self, worker_id: &str) -> bool {
        self.alive()
            && self
                .hello
                .as_ref()
                .is_some_and(|h| h.workers.iter().any(|w| w == worker_id))
    }

    /// Declares the token-processor dead if silent too long; true on the transition.
    pub fn check_liveness(&mut self, now: Instant) -> bool {
        self.clock.expire(self.liveness, now)
    }
}

/// The worker can take a request whose output will reach us: routable itself, and its step
/// batches taken by the token-processor.
pub fn servable(worker: &WorkerPeer, tp: &TpPeer) -> bool {
    worker.routable() && worker.worker_id().is_some_and(|id| tp.takes_batches_of(id))
}

/// Index of the servable worker with the least load, counting this server's in-flight requests
/// first (they are exact) and the worker's reported queue second.
pub fn least_loaded(
    workers: &[WorkerPeer],
    tp: &TpPeer,
    in_flight: impl Fn(usize) -> u32,
) -> Option<usize> {
    workers
        .iter()
        .enumerate()
        .filter(|(_, w)| servable(w, tp))
        .min_by_key(|(i, w)| (in_flight(*i), w.reported_load))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn hello(epoch: u64, ready: bool) -> WorkerHello {
        WorkerHello {
            protocol_version: proto::PROTOCOL_VERSION,
            worker_id: "w".into(),
            epoch,
            model: "m".into(),
            num_spec_tokens: 4,
            proposer: "ngram".into(),
            ready,
            heartbeat_interval_ms: 100,
            max_model_len: 2048,
            kv_capacity_tokens: 32_768,
            kv_bytes: 0,
            draft_kv_bytes: 0,
            max_num_seqs: 16,
            session: 7,
        }
    }

    fn heartbeat(epoch: u64, accepting: bool) -> Heartbeat {
        Heartbeat {
            running: 1,
            accepting,
            ..Heartbeat::idle("w".into(), epoch, 0)
        }
    }

    fn tp_taking(workers: &[&str], now: Instant) -> TpPeer {
        let mut tp = TpPeer::new(Liveness::new(Duration::from_millis(100)));
        tp.on_hello(
            TpHello {
                protocol_version: proto::PROTOCOL_VERSION,
                epoch: 1,
                workers: workers.iter().map(|w| w.to_string()).collect(),
            },
            now,
        );
        tp
    }

    #[test]
    fn worker_lifecycle() {
        let t0 = Instant::now();
        let mut w = WorkerPeer::new("tcp://x".into());
        w.connected = true;
        assert!(!w.routable());
        assert!(!w.on_hello(hello(1, true), t0));
        assert!(w.routable());
        assert!(!w.check_liveness(t0 + Duration::from_millis(250)));
        assert!(w.check_liveness(t0 + Duration::from_millis(350)));
        assert!(!w.routable());
        assert!(
            w.on_hello(hello(2, true), t0 + Duration::from_millis(400)),
            "new epoch"
        );
        w.on_heartbeat(&heartbeat(2, false), t0 + Duration::from_millis(450));
        assert!(!w.routable(), "draining");
    }

    #[test]
    fn a_dead_or_other_epoch_worker_is_asked_for_a_hello() {
        let t0 = Instant::now();
        let mut w = WorkerPeer::new("tcp://x".into());
        w.connected = true;
        w.on_hello(hello(1, true), t0);
        assert_eq!(w.on_heartbeat(&heartbeat(1, true), t0), Heard::Known);
        assert_eq!(w.on_heartbeat(&heartbeat(2, true), t0), Heard::AskHello);
        assert!(w.check_liveness(t0 + Duration::from_secs(1)));
        assert_eq!(
            w.on_heartbeat(&heartbeat(1, true), t0 + Duration::from_secs(1)),
            Heard::AskHello,
            "declared dead: its heartbeats do not revive it, its hello does"
        );
        assert!(!w.routable());
        w.on_hello(hello(1, true), t0 + Duration::from_secs(1));
        assert!(w.routable());
    }

    #[test]
    fn a_paused_server_forgives_its_peers() {
        let t0 = Instant::now();
        let mut w = WorkerPeer::new("tcp://x".into());
        w.on_hello(hello(1, true), t0);
        let mut tp = tp_taking(&["w"], t0);
        let resumed = t0 + Duration::from_secs(3);
        w.clock.forgive(resumed);
        tp.clock.forgive(resumed);
        assert!(!w.check_liveness(resumed + Duration::from_millis(100)));
        assert!(!tp.check_liveness(resumed + Duration::from_millis(100)));
    }

    #[test]
    fn only_workers_the_token_processor_takes_are_servable() {
        let t0 = Instant::now();
        let mut w = WorkerPeer::new("tcp://x".into());
        w.connected = true;
        w.on_hello(hello(1, true), t0);
        assert!(servable(&w, &tp_taking(&["w"], t0)));
        assert!(!servable(&w, &tp_taking(&["other"], t0)));
        let mut dead_tp = tp_taking(&["w"], t0);
        assert!(dead_tp.check_liveness(t0 + Duration::from_secs(1)));
        assert!(!servable(&w, &dead_tp));
        assert_eq!(w.max_model_len(), Some(2048));
    }

    #[test]
    fn least_loaded_prefers_fewer_in_flight() {
        let t0 = Instant::now();
        let mut a = WorkerPeer::new("a".into());
        let mut b = WorkerPeer::new("b".into());
        let c = WorkerPeer::new("c".into());
        for w in [&mut a, &mut b] {
            w.connected = true;
            w.on_hello(hello(1, true), t0);
        }
        let counts = [3, 1, 0];
        let tp = tp_taking(&["w"], t0);
        assert_eq!(
            least_loaded(&[a.clone(), b.clone(), c.clone()], &tp, |i| counts[i]),
            Some(1)
        );
        b.connected = false;
        assert_eq!(least_loaded(&[a, b, c], &tp, |i| counts[i]), Some(0));
    }

    #[test]
    fn token_processor_dies_after_three_silent_intervals() {
        let t0 = Instant::now();
        let mut tp = TpPeer::new(Liveness::new(Duration::from_millis(100)));
        assert!(!tp.check_liveness(t0), "never alive, so no transition");
        tp.on_hello(
            TpHello {
                protocol_version: 1,
                epoch: 1,
                workers: vec![],
            },
            t0,
        );
        assert!(!tp.check_liveness(t0 + Duration::from_millis(299)));
        assert!(tp.check_liveness(t0 + Duration::from_millis(301)));
        assert!(!tp.alive());
    }
}

//! What this api-server knows about its peers: each engine-worker's hello, heartbeats and
//! liveness, and the token-processor's. A peer is alive from its hello until it stays silent for
//! [`MISSED_INTERVALS`] heartbeat intervals or says hello with a new epoch.

use std::time::{Duration, Instant};

use proto::tp_api::TpHello;
use proto::worker_tp::{Heartbeat, WorkerHello};

/// Heartbeat intervals of silence after which a peer is declared dead.
pub const MISSED_INTERVALS: u32 = 3;

#[derive(Debug, Clone)]
pub struct WorkerPeer {
    pub endpoint: String,
    pub hello: Option<WorkerHello>,
    /// The socket is connected (a disconnect stops routing at once; death waits for the window).
    pub connected: bool,
    pub alive: bool,
    pub last_heard: Option<Instant>,
    pub accepting: bool,
    /// running + waiting from the last heartbeat (all api-servers' requests).
    pub reported_load: u32,
}

impl WorkerPeer {
    pub fn new(endpoint: String) -> Self {
        Self {
            endpoint,
            hello: None,
            connected: false,
            alive: false,
            last_heard: None,
            accepting: false,
            reported_load: 0,
        }
    }

    /// Can take a new request now.
    pub fn routable(&self) -> bool {
        self.alive
            && self.connected
            && self.accepting
            && self.hello.as_ref().is_some_and(|h| h.ready)
    }

    fn window(&self) -> Duration {
        let ms = self
            .hello
            .as_ref()
            .map_or(500, |h| h.heartbeat_interval_ms.max(1));
        Duration::from_millis(u64::from(ms)) * MISSED_INTERVALS
    }

    /// Records a hello; returns true when it shows a restart (new epoch), whose requests are
    /// gone.
    pub fn on_hello(&mut self, hello: WorkerHello, now: Instant) -> bool {
        let restarted = self
            .hello
            .as_ref()
            .is_some_and(|old| old.epoch != hello.epoch);
        self.accepting = hello.ready;
        self.hello = Some(hello);
        self.alive = true;
        self.last_heard = Some(now);
        restarted
    }

    pub fn on_heartbeat(&mut self, hb: &Heartbeat, now: Instant) {
        // A heartbeat from another epoch than the hello's is stale (or the hello is still
        // coming); only the hello makes a worker alive.
        if self.hello.as_ref().is_some_and(|h| h.epoch == hb.epoch) {
            self.last_heard = Some(now);
            self.accepting = hb.accepting;
            self.reported_load = hb.running.saturating_add(hb.waiting);
        }
    }

    /// Declares the worker dead if it has been silent too long; true on the transition.
    pub fn check_liveness(&mut self, now: Instant) -> bool {
        let silent = self
            .last_heard
            .is_none_or(|t| now.duration_since(t) > self.window());
        if self.alive && silent {
            self.alive = false;
            return true;
        }
        false
    }
}

#[derive(Debug, Clone)]
pub struct TpPeer {
    pub hello: Option<TpHello>,
    pub connected: bool,
    pub alive: bool,
    pub last_heard: Option<Instant>,
    /// The TP re-sends its hello every interval; this is the interval we expect.
    pub interval: Duration,
}

impl TpPeer {
    pub fn new(interval: Duration) -> Self {
        Self {
            hello: None,
            connected: false,
            alive: false,
            last_heard: None,
            interval,
        }
    }

    pub fn on_hello(&mut self, hello: TpHello, now: Instant) {
        self.hello = Some(hello);
        self.alive = true;
        self.last_heard = Some(now);
    }

    /// Declares the token-processor dead if silent too long; true on the transition.
    pub fn check_liveness(&mut self, now: Instant) -> bool {
        let window = self.interval * MISSED_INTERVALS;
        let silent = self
            .last_heard
            .is_none_or(|t| now.duration_since(t) > window);
        if self.alive && silent {
            self.alive = false;
            return true;
        }
        false
    }
}

/// Index of the routable worker with the least load, counting this server's in-flight requests
/// first (they are exact) and the worker's reported queue second.
pub fn least_loaded(workers: &[WorkerPeer], in_flight: impl Fn(usize) -> u32) -> Option<usize> {
    workers
        .iter()
        .enumerate()
        .filter(|(_, w)| w.routable())
        .min_by_key(|(i, w)| (in_flight(*i), w.reported_load))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
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
        }
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
        w.on_heartbeat(
            &Heartbeat {
                worker_id: "w".into(),
                epoch: 2,
                next_seq: 0,
                running: 1,
                waiting: 0,
                accepting: false,
            },
            t0 + Duration::from_millis(450),
        );
        assert!(!w.routable(), "draining");
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
        assert_eq!(
            least_loaded(&[a.clone(), b.clone(), c.clone()], |i| counts[i]),
            Some(1)
        );
        b.connected = false;
        assert_eq!(least_loaded(&[a, b, c], |i| counts[i]), Some(0));
    }

    #[test]
    fn token_processor_dies_after_three_silent_intervals() {
        let t0 = Instant::now();
        let mut tp = TpPeer::new(Duration::from_millis(100));
        assert!(!tp.check_liveness(t0), "never alive, so no transition");
        tp.on_hello(
            TpHello {
                protocol_version: 1,
                epoch: 1,
            },
            t0,
        );
        assert!(!tp.check_liveness(t0 + Duration::from_millis(299)));
        assert!(tp.check_liveness(t0 + Duration::from_millis(301)));
        assert!(!tp.alive);
    }
}

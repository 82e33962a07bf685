//! One liveness rule for every link (the heartbeat pattern of the ZeroMQ guide, "Paranoid
//! Pirate"):
//!
//! 1. A peer is alive from its hello until it stays silent (no message of any kind) for
//!    [`MISSED_HEARTBEATS`] heartbeat intervals; then it is declared dead and what depends on it
//!    ends with an explicit error.
//! 2. A message from a peer that the receiver does not know, or has declared dead, makes the
//!    receiver ask for a hello instead of ignoring it: two running processes never stay deaf to
//!    each other.
//! 3. Silence is judged only by a process that kept time itself: when a sweep runs more than
//!    one window after the previous one, this process was paused (SIGSTOP, VM steal, swap, a
//!    debugger) and the peers' silence is its own. Such a sweep forgives every peer (their
//!    clocks restart now) instead of declaring them all dead; a peer that really died is found
//!    one window later.

use std::time::{Duration, Instant};

/// Heartbeat intervals of silence after which a peer is declared dead.
pub const MISSED_HEARTBEATS: u32 = 3;

/// The heartbeat period of every process unless configured otherwise.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);

/// The liveness settings of one link: how often we speak, how much silence kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    pub interval: Duration,
    pub missed: u32,
}

impl Default for Liveness {
    fn default() -> Self {
        Self::new(DEFAULT_HEARTBEAT_INTERVAL)
    }
}

impl Liveness {
    /// The rule with heartbeats every `interval` (a zero interval counts as 1 ms).
    pub fn new(interval: Duration) -> Self {
        Self {
            interval: interval.max(Duration::from_millis(1)),
            missed: MISSED_HEARTBEATS,
        }
    }

    /// The rule for a peer that announced its heartbeat period in milliseconds (0: the
    /// default).
    pub fn from_peer_interval_ms(ms: u32) -> Self {
        match ms {
            0 => Self::default(),
            ms => Self::new(Duration::from_millis(u64::from(ms))),
        }
    }

    /// Silence longer than this declares a peer dead.
    pub fn window(&self) -> Duration {
        self.interval * self.missed
    }

    /// A peer last heard at `last_heard` is dead at `now`.
    pub fn is_silent(&self, last_heard: Instant, now: Instant) -> bool {
        self.is_silent_for(now.saturating_duration_since(last_heard))
    }

    /// A peer silent for `silence` is dead.
    pub fn is_silent_for(&self, silence: Duration) -> bool {
        silence > self.window()
    }

    /// The interval in whole milliseconds, as hellos carry it.
    pub fn interval_ms(&self) -> u32 {
        u32::try_from(self.interval.as_millis()).unwrap_or(u32::MAX)
    }
}

/// What a liveness sweep may do (rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// This process kept time: declare silent peers dead.
    Judge,
    /// This process was paused for `paused`: restart every peer's clock, declare nobody dead.
    Forgive { paused: Duration },
}

/// Decides, sweep by sweep, whether this process kept time (rule 3).
#[derive(Debug, Clone)]
pub struct Sweeper {
    liveness: Liveness,
    last: Option<Instant>,
}

impl Sweeper {
    pub fn new(liveness: Liveness) -> Self {
        Self {
            liveness,
            last: None,
        }
    }

    /// Call at the start of every sweep. A sweep more than one window after the previous one
    /// means this process did not run in between.
    pub fn begin(&mut self, now: Instant) -> Sweep {
        let gap = self.last.map(|t| now.saturating_duration_since(t));
        self.last = Some(now);
        match gap {
            Some(gap) if gap > self.liveness.window() => {
                tracing::warn!(
                    paused_ms = gap.as_millis() as u64,
                    "this process did not run for longer than a liveness window; forgiving its peers' silence"
                );
                Sweep::Forgive { paused: gap }
            }
            _ => Sweep::Judge,
        }
    }
}

/// One peer's liveness under rules 1–3: alive from its hello until silent past the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerClock {
    alive: bool,
    last_heard: Option<Instant>,
}

impl PeerClock {
    pub fn is_alive(&self) -> bool {
        self.alive
    }

    /// Its hello: alive from now.
    pub fn hello(&mut self, now: Instant) {
        self.alive = true;
        self.last_heard = Some(now);
    }

    /// Any other message: refreshes a live peer; a dead one is asked for a hello (rule 2).
    pub fn heard(&mut self, now: Instant) -> Heard {
        if self.alive {
            self.last_heard = Some(now);
        }
        Heard::of(self.alive)
    }

    /// Not alive, whatever it says, until its next accepted hello (e.g. it refused ours).
    pub fn kill(&mut self) {
        self.alive = false;
    }

    /// This process was paused: the silence is ours, the clock restarts now (rule 3).
    pub fn forgive(&mut self, now: Instant) {
        if self.alive {
            self.last_heard = Some(now);
        }
    }

    /// Declares the peer dead when silent past the window; true on the transition (rule 1).
    pub fn expire(&mut self, liveness: Liveness, now: Instant) -> bool {
        let silent = self.last_heard.is_none_or(|t| liveness.is_silent(t, now));
        if self.alive && silent {
            self.alive = false;
            return true;
        }
        false
    }
}

/// What to do with a message from a peer (rule 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// A live, known peer: refresh its clock and handle the message.
    Known,
    /// Unknown or declared dead: ask it for a hello (and handle nothing it says until then).
    AskHello,
}

impl Heard {
    /// The verdict for a peer that is (or is not) known and alive.
    pub fn of(known_and_alive: bool) -> Self {
        if known_and_alive {
            Heard::Known
        } else {
            Heard::AskHello
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_beyond_three_intervals_kills() {
        let l = Liveness::new(Duration::from_millis(100));
        let t0 = Instant::now();
        assert!(!l.is_silent(t0, t0 + Duration::from_millis(300)));
        assert!(l.is_silent(t0, t0 + Duration::from_millis(301)));
        assert!(
            !l.is_silent(t0 + Duration::from_secs(1), t0),
            "clock skew is not silence"
        );
        assert_eq!(Liveness::from_peer_interval_ms(0), Liveness::default());
        assert_eq!(Liveness::from_peer_interval_ms(250).interval_ms(), 250);
    }

    #[test]
    fn a_late_sweep_forgives_and_the_next_one_judges() {
        let mut s = Sweeper::new(Liveness::new(Duration::from_millis(100)));
        let t0 = Instant::now();
        assert_eq!(s.begin(t0), Sweep::Judge);
        assert_eq!(s.begin(t0 + Duration::from_millis(100)), Sweep::Judge);
        assert_eq!(s.begin(t0 + Duration::from_millis(400)), Sweep::Judge);
        let late = s.begin(t0 + Duration::from_millis(3_400));
        assert_eq!(
            late,
            Sweep::Forgive {
                paused: Duration::from_secs(3)
            }
        );
        assert_eq!(s.begin(t0 + Duration::from_millis(3_500)), Sweep::Judge);
    }

    #[test]
    fn a_peer_clock_lives_from_hello_to_silence_and_asks_the_dead_for_a_hello() {
        let l = Liveness::new(Duration::from_millis(100));
        let t0 = Instant::now();
        let mut c = PeerClock::default();
        assert_eq!(c.heard(t0), Heard::AskHello, "unknown");
        assert!(!c.expire(l, t0), "never alive: no transition");
        c.hello(t0);
        assert_eq!(c.heard(t0 + Duration::from_millis(200)), Heard::Known);
        assert!(!c.expire(l, t0 + Duration::from_millis(500)));
        assert!(c.expire(l, t0 + Duration::from_millis(501)));
        assert!(!c.is_alive());
        assert_eq!(c.heard(t0 + Duration::from_secs(1)), Heard::AskHello);
        c.hello(t0 + Duration::from_secs(1));
        c.forgive(t0 + Duration::from_secs(5));
        assert!(!c.expire(l, t0 + Duration::from_millis(5_200)));
        c.kill();
        assert!(!c.is_alive());
    }

    #[test]
    fn unknown_or_dead_peers_are_asked_for_a_hello() {
        assert_eq!(Heard::of(true), Heard::Known);
        assert_eq!(Heard::of(false), Heard::AskHello);
    }
}

//! The table of peers that connect to a ROUTER and name themselves in a hello (the api-servers,
//! at a worker and at the token-processor): who is admitted, restarted or refused, which
//! connection acts for whom, and who is dead at each sweep, under [`crate::liveness`]'s rules.
//! The processes keep only their own reaction (a worker aborts a restarted or dead api-server's
//! requests; the token-processor forgets it). The token-processor's table of workers keeps
//! richer state under a clock its tests set, so it applies the hello rule alone
//! ([`hello_rule`]) and the same refusal text.
//!
//! The rules, in one place:
//! - a hello of a name nobody holds is admitted, up to the table's capacity;
//! - a hello of a held name and the same epoch is the same process, reconnected: it moves to the
//!   new connection;
//! - a hello of a held name and another epoch is refused while the holder is alive (two
//!   processes would share one name's outputs; [`duplicate_id_reason`]), and replaces it once
//!   the holder is silent past the window (a restart: the old epoch's state is gone);
//! - any other message is heard only from the connection and epoch of the peer's hello; anything
//!   else is answered with an ask for a hello (rule 2);
//! - a sweep removes the peers silent past the window, unless this process itself was paused
//!   (rule 3: then every clock restarts).
//!
//! A peer this process dials (the api-server's workers and token-processor) is the process that
//! holds the endpoint: [`dialed_hello_rule`] has no duplicate to refuse, and a new epoch is a
//! restart at once. A name held at two endpoints is the one duplicate there, refused by
//! [`hello_rule`] with the endpoints' peers as holders.

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;

use crate::liveness::{Heard, Liveness, PeerClock, Sweep, Sweeper};

/// Why a hello is refused when another live process holds the name: the text every process
/// sends and logs. `role` names the kind of process ("worker", "api-server"), `flag` the option
/// that sets its id.
pub fn duplicate_id_reason(role: &str, id: &str, flag: &str) -> String {
    format!("{role} id {id} is held by another live {role}; give each {role} its own --{flag}")
}

/// The holder of a name, as far as the hello rule needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The holder's process.
    pub epoch: u64,
    /// Silent past the liveness window.
    pub silent: bool,
}

/// What a hello means under the rules above; capacity and what each side keeps are the
/// caller's. [`PeerTable`] applies it, and so does the token-processor's table of workers
/// (which keeps its own per-worker state under a testable clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloRule {
    /// Nobody holds the name.
    Admit,
    /// The holder itself (same epoch), maybe on a new connection: keep its state.
    SameProcess,
    /// Another process while the holder still speaks: refuse ([`duplicate_id_reason`]).
    RefuseDuplicate,
    /// Another process after the holder went silent: a restart; the old epoch's state is gone.
    Restart,
}

/// The hello rule: `holder` of the name (None: nobody), `epoch` of the hello.
pub fn hello_rule(holder: Option<Holder>, epoch: u64) -> HelloRule {
    match holder {
        None => HelloRule::Admit,
        Some(holder) if holder.epoch == epoch => HelloRule::SameProcess,
        Some(holder) if !holder.silent => HelloRule::RefuseDuplicate,
        Some(_) => HelloRule::Restart,
    }
}

/// The hello rule for a peer this process dials: `known_epoch` of the endpoint's last hello (None:
/// none yet), `epoch` of this one. Only one live process can hold an endpoint (a bound port or
/// socket path), so another epoch means the old process is gone, even within the liveness window
/// (a supervisor restarts faster than that): never [`HelloRule::RefuseDuplicate`].
pub fn dialed_hello_rule(known_epoch: Option<u64>, epoch: u64) -> HelloRule {
    match known_epoch {
        None => HelloRule::Admit,
        Some(known) if known == epoch => HelloRule::SameProcess,
        Some(_) => HelloRule::Restart,
    }
}

/// Rule 2 for a dialed peer's message that names its epoch (a heartbeat): heard only if it is of
/// the epoch of the endpoint's hello (`known_epoch`) and the peer is alive; otherwise ask for a
/// hello.
pub fn dialed_heard(
    clock: &mut PeerClock,
    known_epoch: Option<u64>,
    epoch: u64,
    now: Instant,
) -> Heard {
    if known_epoch == Some(epoch) {
        clock.heard(now)
    } else {
        Heard::AskHello
    }
}

/// One admitted peer.
#[derive(Debug, Clone)]
pub struct Peer<S> {
    /// The ROUTER connection its hello came from; only this one acts for it.
    pub routing_id: Bytes,
    /// Its process (a restart is a new epoch).
    pub epoch: u64,
    last_heard: Instant,
    /// What the process keeps per peer.
    pub state: S,
}

/// What a hello did.
#[derive(Debug, PartialEq, Eq)]
pub enum HelloOutcome<S> {
    /// A name nobody held: admitted.
    Admitted,
    /// The same process on a new connection (same epoch): moved, its state kept.
    Reconnected,
    /// A new process with a name whose holder went silent: admitted, and the old epoch's state
    /// handed back (what depended on it is gone).
    Restarted { old_epoch: u64, old_state: S },
    /// Another live process holds the name: the reason to send back.
    Refused { reason: String },
    /// A new name while the table is full: ignored.
    Full,
}

/// The peers of one ROUTER, by the name in their hello.
#[derive(Debug)]
pub struct PeerTable<S> {
    peers: HashMap<String, Peer<S>>,
    liveness: Liveness,
    sweeper: Sweeper,
    capacity: usize,
    /// How this side names its peers in refusals: role and id option.
    role: &'static str,
    id_flag: &'static str,
}

impl<S> PeerTable<S> {
    /// At most `capacity` peers, judged by `liveness`; `role` and `id_flag` word refusals.
    pub fn new(
        liveness: Liveness,
        capacity: usize,
        role: &'static str,
        id_flag: &'static str,
    ) -> Self {
        Self {
            peers: HashMap::new(),
            liveness,
            sweeper: Sweeper::new(liveness),
            capacity,
            role,
            id_flag,
        }
    }

    /// A hello from `routing_id` naming `name` of `epoch`; `state` makes a new peer's state.
    pub fn hello(
        &mut self,
        name: &str,
        epoch: u64,
        routing_id: Bytes,
        now: Instant,
        state: impl FnOnce() -> S,
    ) -> HelloOutcome<S> {
        let holder = self.peers.get(name).map(|held| Holder {
            epoch: held.epoch,
            silent: self.liveness.is_silent(held.last_heard, now),
        });
        match hello_rule(holder, epoch) {
            HelloRule::Admit if self.peers.len() >= self.capacity => HelloOutcome::Full,
            HelloRule::Admit => {
                self.insert(name, epoch, routing_id, now, state());
                HelloOutcome::Admitted
            }
            HelloRule::SameProcess => {
                if let Some(held) = self.peers.get_mut(name) {
                    held.routing_id = routing_id;
                    held.last_heard = now;
                }
                HelloOutcome::Reconnected
            }
            HelloRule::RefuseDuplicate => HelloOutcome::Refused {
                reason: duplicate_id_reason(self.role, name, self.id_flag),
            },
            HelloRule::Restart => match self.insert(name, epoch, routing_id, now, state()) {
                Some(old) => HelloOutcome::Restarted {
                    old_epoch: old.epoch,
                    old_state: old.state,
                },
                None => HelloOutcome::Admitted,
            },
        }
    }

    /// Any other message that names its sender (a heartbeat): heard only from the connection
    /// and epoch of the peer's hello; otherwise ask for a hello (rule 2).
    pub fn heard(&mut self, name: &str, epoch: u64, routing_id: &Bytes, now: Instant) -> Heard {
        let peer = self
            .peers
            .get_mut(name)
            .filter(|p| p.epoch == epoch && p.routing_id == *routing_id);
        match peer {
            Some(peer) => {
                peer.last_heard = now;
                Heard::Known
            }
            None => Heard::AskHello,
        }
    }

    /// The peer whose hello came from `routing_id`: a message that does not name its sender acts
    /// for this one only (None: ask for a hello).
    pub fn sender(&self, routing_id: &Bytes) -> Option<&str> {
        self.peers
            .iter()
            .find(|(_, p)| p.routing_id == *routing_id)
            .map(|(name, _)| name.as_str())
    }

    /// The sweep of rule 1 and 3: removes and returns the peers silent past the window, or,
    /// when this process was paused, restarts every peer's clock and returns none.
    pub fn sweep(&mut self, now: Instant) -> Vec<(String, Peer<S>)> {
        match self.sweeper.begin(now) {
            Sweep::Judge => {
                let dead: Vec<String> = self
                    .peers
                    .iter()
                    .filter(|(_, p)| self.liveness.is_silent(p.last_heard, now))
                    .map(|(name, _)| name.clone())
                    .collect();
                dead.into_iter()
                    .filter_map(|name| self.peers.remove_entry(&name))
                    .collect()
            }
            Sweep::Forgive { .. } => {
                self.peers.values_mut().for_each(|p| p.last_heard = now);
                Vec::new()
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<&Peer<S>> {
        self.peers.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Peer<S>)> {
        self.peers.iter().map(|(name, p)| (name.as_str(), p))
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    fn insert(
        &mut self,
        name: &str,
        epoch: u64,
        routing_id: Bytes,
        now: Instant,
        state: S,
    ) -> Option<Peer<S>> {
        self.peers.insert(
            name.to_owned(),
            Peer {
                routing_id,
                epoch,
                last_heard: now,
                state,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rand::{Rng, SeedableRng};

    use super::*;

    const BEAT: Duration = Duration::from_millis(100);

    fn table(capacity: usize) -> PeerTable<u32> {
        PeerTable::new(Liveness::new(BEAT), capacity, "api-server", "api-server-id")
    }

    fn conn(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    #[test]
    fn the_hello_rule() {
        let held = |epoch, silent| Some(Holder { epoch, silent });
        assert_eq!(hello_rule(None, 1), HelloRule::Admit);
        assert_eq!(hello_rule(held(1, false), 1), HelloRule::SameProcess);
        assert_eq!(hello_rule(held(1, true), 1), HelloRule::SameProcess);
        assert_eq!(hello_rule(held(1, false), 2), HelloRule::RefuseDuplicate);
        assert_eq!(hello_rule(held(1, true), 2), HelloRule::Restart);
    }

    #[test]
    fn the_dialed_hello_rule_has_no_duplicate_and_restarts_at_once() {
        assert_eq!(dialed_hello_rule(None, 1), HelloRule::Admit);
        assert_eq!(dialed_hello_rule(Some(1), 1), HelloRule::SameProcess);
        assert_eq!(dialed_hello_rule(Some(1), 2), HelloRule::Restart);
    }

    #[test]
    fn a_dialed_peer_is_heard_only_alive_and_of_its_hellos_epoch() {
        let t0 = Instant::now();
        let mut clock = PeerClock::default();
        assert_eq!(dialed_heard(&mut clock, None, 1, t0), Heard::AskHello);
        clock.hello(t0);
        assert_eq!(dialed_heard(&mut clock, Some(1), 1, t0), Heard::Known);
        assert_eq!(dialed_heard(&mut clock, Some(1), 2, t0), Heard::AskHello);
        clock.kill();
        assert_eq!(dialed_heard(&mut clock, Some(1), 1, t0), Heard::AskHello);
    }

    #[test]
    fn a_new_name_is_admitted_up_to_the_capacity() {
        let t0 = Instant::now();
        let mut t = table(1);
        assert_eq!(t.hello("a", 1, conn(1), t0, || 7), HelloOutcome::Admitted);
        assert_eq!(t.hello("b", 1, conn(2), t0, || 8), HelloOutcome::Full);
        assert_eq!(t.len(), 1);
        assert_eq!(t.get("a").map(|p| p.state), Some(7));
    }

    #[test]
    fn the_same_epoch_moves_to_its_new_connection_and_keeps_its_state() {
        let t0 = Instant::now();
        let mut t = table(4);
        t.hello("a", 1, conn(1), t0, || 7);
        assert_eq!(
            t.hello("a", 1, conn(2), t0, || 0),
            HelloOutcome::Reconnected
        );
        assert_eq!(t.sender(&conn(2)), Some("a"));
        assert_eq!(
            t.sender(&conn(1)),
            None,
            "the old connection acts for no one"
        );
        assert_eq!(t.get("a").map(|p| p.state), Some(7));
    }

    #[test]
    fn another_epoch_is_refused_while_the_holder_lives_and_replaces_it_once_silent() {
        let t0 = Instant::now();
        let mut t = table(4);
        t.hello("a", 1, conn(1), t0, || 7);
        let live = t0 + BEAT * 3; // exactly the window: still alive
        let HelloOutcome::Refused { reason } = t.hello("a", 2, conn(2), live, || 0) else {
            panic!("a live holder's name was taken");
        };
        assert_eq!(
            reason,
            "api-server id a is held by another live api-server; give each api-server its own --api-server-id"
        );
        assert_eq!(t.sender(&conn(2)), None);
        let silent = t0 + BEAT * 3 + Duration::from_millis(1);
        assert_eq!(
            t.hello("a", 2, conn(2), silent, || 9),
            HelloOutcome::Restarted {
                old_epoch: 1,
                old_state: 7
            }
        );
        assert_eq!(t.get("a").map(|p| (p.epoch, p.state)), Some((2, 9)));
    }

    #[test]
    fn only_the_connection_and_epoch_of_the_hello_are_heard() {
        let t0 = Instant::now();
        let mut t = table(4);
        t.hello("a", 1, conn(1), t0, || 0);
        assert_eq!(t.heard("a", 1, &conn(1), t0), Heard::Known);
        assert_eq!(t.heard("a", 1, &conn(2), t0), Heard::AskHello);
        assert_eq!(t.heard("a", 2, &conn(1), t0), Heard::AskHello);
        assert_eq!(t.heard("b", 1, &conn(1), t0), Heard::AskHello);
    }

    #[test]
    fn a_sweep_removes_the_silent_and_a_late_sweep_forgives_everyone() {
        let t0 = Instant::now();
        let mut t = table(4);
        t.hello("a", 1, conn(1), t0, || 1);
        t.hello("b", 1, conn(2), t0, || 2);
        assert!(t.sweep(t0).is_empty());
        // `b` keeps beating, `a` does not; sweeps run every beat.
        let mut dead = Vec::new();
        for i in 1..=4 {
            let now = t0 + BEAT * i;
            t.heard("b", 1, &conn(2), now);
            dead.extend(t.sweep(now + Duration::from_millis(1)));
        }
        assert_eq!(
            dead.iter()
                .map(|(n, p)| (n.as_str(), p.state))
                .collect::<Vec<_>>(),
            vec![("a", 1)]
        );
        // This process stalls for 10 windows: `b`'s silence is ours.
        let late = t0 + BEAT * 40;
        assert!(t.sweep(late).is_empty());
        assert_eq!(t.len(), 1);
        assert!(
            t.sweep(late + BEAT).is_empty(),
            "its clock restarted at the late sweep"
        );
    }

    /// Seeded random hellos, heartbeats and sweeps: a refused or ignored hello changes nothing,
    /// an admitted one holds the name with its epoch, only the hello's connection and epoch are
    /// heard, the capacity holds, and a sweep removes exactly the peers silent past the window
    /// (none when this process was paused).
    #[test]
    fn random_sequences_keep_the_table_consistent() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9ee5);
        for _ in 0..200 {
            let t0 = Instant::now();
            let mut now = t0;
            let mut t = table(3);
            for _ in 0..300 {
                now += Duration::from_millis(rng.gen_range(0..120));
                let name = ["a", "b", "c", "d"][rng.gen_range(0..4)];
                let (epoch, c) = (rng.gen_range(0..3), conn(rng.gen_range(0..5)));
                match rng.gen_range(0..3) {
                    0 => {
                        let before = t.get(name).map(|p| (p.epoch, p.routing_id.clone()));
                        match t.hello(name, epoch, c.clone(), now, || 0) {
                            HelloOutcome::Refused { .. } | HelloOutcome::Full => {
                                assert_eq!(
                                    t.get(name).map(|p| (p.epoch, p.routing_id.clone())),
                                    before
                                );
                            }
                            _ => assert_eq!(t.get(name).map(|p| p.epoch), Some(epoch)),
                        }
                    }
                    1 => {
                        let heard = t.heard(name, epoch, &c, now);
                        let known = t
                            .get(name)
                            .is_some_and(|p| p.epoch == epoch && p.routing_id == c);
                        assert_eq!(heard == Heard::Known, known);
                    }
                    _ => {
                        for (_, p) in t.sweep(now) {
                            assert!(now.duration_since(p.last_heard) > BEAT * 3);
                        }
                        for (_, p) in t.iter() {
                            assert!(now.duration_since(p.last_heard) <= BEAT * 3);
                        }
                    }
                }
                assert!(t.len() <= 3);
            }
        }
    }
}

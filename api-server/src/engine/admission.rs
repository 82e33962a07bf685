//! Admission control: a bound on the engine sequences in flight at this api-server (every choice
//! of every request: prompts × `n`), shared fairly between clients.
//!
//! - **A request holds at most a share of what the server runs at once** (`--max-request-share`,
//!   a quarter by default, of the live workers' batch slots, or of the bound where it is
//!   smaller or no worker reported them): a request with more choices than that runs them
//!   through that many lanes, each starting its next choice when its last one ends
//!   (`generate`), so one 64-sequence request can fill neither the queue nor every batch.
//! - **Waiting is fair between clients** (a client is an API key, or the peer address where
//!   there is none): waiting requests are granted round-robin over clients, each client's in
//!   arrival order, and a client already holding its share is passed over while another client
//!   waits. A grant is all or nothing (a request's lanes start together), and the client whose
//!   turn it is blocks the ones behind it until its grant fits, so a large request is never
//!   starved by small ones.
//! - **A client never holds every slot**: one client (all its requests) holds at most the
//!   batch slots (or the bound) less one request's share, whether or not anyone waits, so a
//!   newcomer always finds room in the batch and gets its first token within a step or two,
//!   instead of waiting minutes for long generations to end. The rest of its requests wait
//!   their turn like anyone's.
//! - Past the admission wait a request is refused with a 429 (TGI's "Model is overloaded"; the
//!   error carries `Retry-After`).
//!
//! The bound is `--max-sequences-in-flight`, or by default [`QUEUE_FACTOR`] times the sequences
//! the live workers' KV caches hold at full context (`kv_capacity_tokens / max_model_len` each,
//! from their hellos): enough waiting work to keep every batch full, little enough that an
//! admitted request starts within a few batches' time. It follows the workers as they come and
//! go, never below [`Admission::new`]'s floor; after a shrink, held sequences finish and nothing
//! new is granted until the books are under the new bound.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::ApiError;

/// The most sequences (prompts × n) one request may carry; also the admission bound's floor.
pub const MAX_SEQUENCES_PER_REQUEST: usize = 64;

/// Queue depth of the default bound, in multiples of what the KV caches hold at full context.
pub const QUEUE_FACTOR: usize = 4;

/// Of the bound, what one request (and, while others wait, one client) may hold by default.
pub const DEFAULT_REQUEST_SHARE: f64 = 0.25;

/// Most clients with requests waiting at once; past it a new client gets its 429 at once
/// (waiters are also bounded by the HTTP connection cap; this bounds the books).
pub const MAX_WAITING_CLIENTS: usize = 16_384;

/// How the bound is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionBound {
    /// From the workers' reported KV capacity.
    Auto,
    Fixed(usize),
}

/// Who a request is for fairness: its API key or its peer address. Only compared and hashed,
/// never logged (it may be a key).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientKey(Arc<str>);

impl ClientKey {
    pub fn new(key: impl Into<Arc<str>>) -> Self {
        Self(key.into())
    }

    /// The key of requests whose client is not known (in-process callers).
    pub fn unknown() -> Self {
        Self::new("")
    }
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientKey(..)")
    }
}

/// What a worker's hello says of its capacity.
#[derive(Debug, Clone, Copy)]
pub struct WorkerCapacity {
    pub kv_capacity_tokens: u32,
    pub max_model_len: u32,
    pub max_num_seqs: u32,
}

/// What the live workers hold, for the bound and the shares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// The default bound ([`auto_bound`]); 0 when no worker has reported.
    pub auto_bound: usize,
    /// Sequences the workers run at once (their batch slots); 0 when none reported them.
    pub running: usize,
}

/// The default bound for these live workers (0 when none has reported yet).
pub fn auto_bound(workers: impl IntoIterator<Item = WorkerCapacity>) -> usize {
    workers
        .into_iter()
        .filter(|w| w.kv_capacity_tokens > 0 && w.max_model_len > 0)
        .map(|w| (w.kv_capacity_tokens / w.max_model_len).max(1) as usize * QUEUE_FACTOR)
        .sum()
}

/// The bound and batch slots of these live workers.
pub fn capacity(workers: &[WorkerCapacity]) -> Capacity {
    Capacity {
        auto_bound: auto_bound(workers.iter().copied()),
        running: workers.iter().map(|w| w.max_num_seqs as usize).sum(),
    }
}

/// One admitted sequence; dropping it makes room for the next.
pub struct Admitted {
    books: Arc<Mutex<Books>>,
    client: ClientKey,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admitted")
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let grants = {
            let mut books = lock(&self.books);
            books.release(&self.client, 1);
            books.grant(&self.books)
        };
        deliver(grants);
    }
}

fn lock(books: &Mutex<Books>) -> std::sync::MutexGuard<'_, Books> {
    books.lock().unwrap_or_else(|e| e.into_inner())
}

/// Hands grants to their waiters, outside the lock: a waiter that gave up drops its grant,
/// and that drop takes the lock again.
fn deliver(grants: Vec<Grant>) {
    for (tx, admitted) in grants {
        let _ = tx.send(admitted);
    }
}

type Grant = (oneshot::Sender<Vec<Admitted>>, Vec<Admitted>);

struct Waiter {
    id: u64,
    sequences: usize,
    tx: oneshot::Sender<Vec<Admitted>>,
}

/// Who holds what and who waits. Every map entry belongs to a client that holds or waits.
#[derive(Default)]
struct Books {
    bound: usize,
    /// Of one client while another waits (also the most one request holds).
    client_share: usize,
    /// The most one client holds at all ([`Admission::client_cap`]).
    client_cap: usize,
    held: usize,
    held_by: HashMap<ClientKey, usize>,
    /// Clients with waiting requests, whose turn comes first.
    turns: VecDeque<ClientKey>,
    waiting: HashMap<ClientKey, VecDeque<Waiter>>,
    next_id: u64,
}

impl Books {
    fn held_by(&self, client: &ClientKey) -> usize {
        self.held_by.get(client).copied().unwrap_or(0)
    }

    fn release(&mut self, client: &ClientKey, sequences: usize) {
        self.held = self.held.saturating_sub(sequences);
        if let Some(held) = self.held_by.get_mut(client) {
            *held = held.saturating_sub(sequences);
            if *held == 0 {
                self.held_by.remove(client);
            }
        }
    }

    fn take(&mut self, books: &Arc<Mutex<Books>>, client: &ClientKey, n: usize) -> Vec<Admitted> {
        self.held += n;
        *self.held_by.entry(client.clone()).or_default() += n;
        (0..n)
            .map(|_| Admitted {
                books: Arc::clone(books),
                client: client.clone(),
            })
            .collect()
    }

    /// Whether `client` may take `sequences` more without passing `limit`.
    fn fits(&self, client: &ClientKey, sequences: usize, limit: usize) -> bool {
        self.held_by(client) + sequences <= limit
    }

    /// The client whose turn it is: the first in turn order within its share, or, when every
    /// waiting client is past it, the first still under its cap; none when every waiting
    /// client is at its cap (its own sequences must end first).
    fn next_turn(&self) -> Option<usize> {
        let next = |c: &ClientKey| {
            let front = self.waiting.get(c).and_then(|q| q.front());
            front.map_or(0, |w| w.sequences)
        };
        let turn_within =
            |limit: usize| self.turns.iter().position(|c| self.fits(c, next(c), limit));
        turn_within(self.client_share).or_else(|| turn_within(self.client_cap))
    }

    /// Grants waiting requests while they fit, round-robin over clients.
    fn grant(&mut self, books: &Arc<Mutex<Books>>) -> Vec<Grant> {
        let mut grants = Vec::new();
        while let Some(turn) = self.next_turn() {
            let client = self.turns[turn].clone();
            let Some(queue) = self.waiting.get_mut(&client) else {
                self.turns.remove(turn);
                continue;
            };
            let gave_up = queue.front().is_none_or(|w| w.tx.is_closed());
            if !gave_up && self.held + queue[0].sequences > self.bound {
                break;
            }
            let waiter = queue.pop_front();
            let more = !queue.is_empty();
            self.turns.remove(turn);
            if more {
                self.turns.push_back(client.clone());
            } else {
                self.waiting.remove(&client);
            }
            if let Some(waiter) = waiter.filter(|_| !gave_up) {
                let admitted = self.take(books, &client, waiter.sequences);
                grants.push((waiter.tx, admitted));
            }
        }
        grants
    }

    fn enqueue(&mut self, client: &ClientKey, sequences: usize) -> Option<(u64, WaitRx)> {
        if !self.waiting.contains_key(client) && self.waiting.len() >= MAX_WAITING_CLIENTS {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        self.next_id += 1;
        let id = self.next_id;
        let queue = self.waiting.entry(client.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(client.clone());
        }
        queue.push_back(Waiter { id, sequences, tx });
        Some((id, rx))
    }

    /// Takes a waiter out of the queue (it gave up); false when it is no longer there.
    fn withdraw(&mut self, client: &ClientKey, id: u64) -> bool {
        let Some(queue) = self.waiting.get_mut(client) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|w| w.id != id);
        let found = queue.len() < before;
        if queue.is_empty() {
            self.waiting.remove(client);
            self.turns.retain(|c| c != client);
        }
        found
    }
}

type WaitRx = oneshot::Receiver<Vec<Admitted>>;

/// Withdraws a waiter whose request stopped waiting (timed out, or its client went away).
struct WaitGuard<'a> {
    books: &'a Arc<Mutex<Books>>,
    client: &'a ClientKey,
    id: u64,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let grants = {
            let mut books = lock(self.books);
            books.withdraw(self.client, self.id);
            // Its turn may have blocked the ones behind it.
            books.grant(self.books)
        };
        deliver(grants);
    }
}

#[derive(Debug)]
pub struct Admission {
    books: Arc<Mutex<Books>>,
    bound: AdmissionBound,
    floor: usize,
    share: f64,
    wait: Duration,
}

impl std::fmt::Debug for Books {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Books")
            .field("bound", &self.bound)
            .field("held", &self.held)
            .field("waiting_clients", &self.waiting.len())
            .finish()
    }
}

impl Admission {
    /// `floor`: a bound below it is raised to it. `share`: of the bound, what one request holds
    /// at most (and one client while others wait); clamped to (0, 1].
    pub fn new(bound: AdmissionBound, floor: usize, share: f64, wait: Duration) -> Self {
        let share = if share.is_finite() && share > 0.0 {
            share.min(1.0)
        } else {
            DEFAULT_REQUEST_SHARE
        };
        Self {
            books: Arc::new(Mutex::new(Books::default())),
            bound,
            floor: floor.max(1),
            share,
            wait,
        }
    }

    /// The bound now, given what the workers report (`auto`: [`auto_bound`] of the live ones).
    /// None while the bound is automatic and no worker has reported: routing answers then.
    pub fn bound(&self, auto: usize) -> Option<usize> {
        match self.bound {
            AdmissionBound::Fixed(n) => Some(n.max(self.floor)),
            AdmissionBound::Auto if auto == 0 => None,
            AdmissionBound::Auto => Some(auto.max(self.floor)),
        }
    }

    /// The most sequences one request holds at once under `bound` on workers that run
    /// `running` at once (0: unknown).
    pub fn request_cap(&self, bound: usize, running: usize) -> usize {
        let base = match running {
            0 => bound,
            running => running.min(bound),
        };
        ((base as f64 * self.share).floor() as usize).clamp(1, bound.max(1))
    }

    /// The most sequences one client holds at once: what the workers run at once (or the
    /// bound, where smaller or unknown) less one request's share, and never less than one
    /// share. The share it leaves is a newcomer's room in the batch.
    pub fn client_cap(&self, bound: usize, running: usize) -> usize {
        let base = match running {
            0 => bound,
            running => running.min(bound),
        };
        let share = self.request_cap(bound, running);
        base.saturating_sub(share).max(share)
    }

    /// Sequences admitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        lock(&self.books).held
    }

    /// Clients with a request waiting for room.
    pub fn waiting_clients(&self) -> usize {
        lock(&self.books).waiting.len()
    }

    /// Admits up to `sequences` for `client`, all at once: as many as one request may hold
    /// ([`Admission::request_cap`]); the request runs its choices through them. Waits up to the
    /// configured wait for its turn, then a 429. `workers` is what the live workers report now.
    /// With no bound yet (no worker reported) nothing is held: the request gets its 503 from
    /// routing instead of a misleading 429.
    pub async fn admit(
        &self,
        sequences: usize,
        client: &ClientKey,
        workers: Capacity,
    ) -> Result<Vec<Admitted>, ApiError> {
        let Some(bound) = self.bound(workers.auto_bound) else {
            return Ok(Vec::new());
        };
        let cap = self.request_cap(bound, workers.running);
        let n = sequences.clamp(1, cap);
        let (id, rx, grants) = {
            let mut books = lock(&self.books);
            books.bound = bound;
            books.client_share = cap;
            books.client_cap = self.client_cap(bound, workers.running);
            let grants = books.grant(&self.books);
            let client_cap = books.client_cap;
            if books.waiting.is_empty()
                && books.held + n <= bound
                && books.fits(client, n, client_cap)
            {
                let admitted = books.take(&self.books, client, n);
                drop(books);
                deliver(grants);
                return Ok(admitted);
            }
            match books.enqueue(client, n) {
                // Waiting behind a client at its cap only, it may be granted at once.
                Some((id, rx)) => {
                    let mut grants = grants;
                    grants.extend(books.grant(&self.books));
                    (id, rx, grants)
                }
                None => {
                    drop(books);
                    deliver(grants);
                    return Err(self.overloaded(bound));
                }
            }
        };
        deliver(grants);
        let guard = WaitGuard {
            books: &self.books,
            client,
            id,
        };
        let outcome = tokio::time::timeout(self.wait, rx).await;
        drop(guard);
        match outcome {
            Ok(Ok(admitted)) => Ok(admitted),
            Ok(Err(_)) | Err(_) => Err(self.overloaded(bound)),
        }
    }

    fn overloaded(&self, bound: usize) -> ApiError {
        ApiError::Overloaded {
            message: format!(
                "Model is overloaded: {} of {bound} sequences in flight; retry later",
                self.in_flight()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(50);

    fn overloaded(r: &Result<Vec<Admitted>, ApiError>) -> bool {
        matches!(r, Err(ApiError::Overloaded { .. }))
    }

    /// Workers that report `bound` as the default bound and no batch slots.
    fn cap(auto_bound: usize) -> Capacity {
        Capacity {
            auto_bound,
            running: 0,
        }
    }

    fn client(name: &str) -> ClientKey {
        ClientKey::new(name)
    }

    /// Admission with the whole bound open to one request (the share rules are tested apart).
    fn whole(bound: AdmissionBound, floor: usize, wait: Duration) -> Admission {
        Admission::new(bound, floor, 1.0, wait)
    }

    #[test]
    fn the_default_bound_is_four_full_contexts_per_worker() {
        let w = |kv, len| WorkerCapacity {
            kv_capacity_tokens: kv,
            max_model_len: len,
            max_num_seqs: 16,
        };
        assert_eq!(
            capacity(&[w(32_768, 2048), w(0, 0)]),
            Capacity {
                auto_bound: 64,
                running: 32
            }
        );
        assert_eq!(auto_bound([w(32_768, 2048)]), 64);
        assert_eq!(auto_bound([w(32_768, 2048), w(8192, 2048)]), 64 + 16);
        // A cache smaller than one context still admits a queue's worth; unreported ones none.
        assert_eq!(auto_bound([w(1024, 2048), w(0, 0)]), 4);
        assert_eq!(auto_bound([]), 0);
    }

    #[tokio::test]
    async fn admits_up_to_the_bound_then_refuses_after_the_wait() {
        let a = whole(AdmissionBound::Fixed(4), 2, WAIT);
        let me = client("a");
        let first = a.admit(3, &me, cap(0)).await.unwrap();
        assert_eq!(first.len(), 3);
        assert_eq!(a.in_flight(), 3);
        let started = tokio::time::Instant::now();
        let refused = a.admit(2, &me, cap(0)).await;
        assert!(overloaded(&refused), "{refused:?}");
        assert!(started.elapsed() >= WAIT);
        let Err(ApiError::Overloaded { message }) = refused else {
            unreachable!()
        };
        assert!(message.contains("3 of 4"), "{message}");
        // All or nothing: the one free sequence was not taken by the refused request.
        let one = a.admit(1, &me, cap(0)).await.unwrap();
        assert_eq!(a.in_flight(), 4);
        drop(first);
        drop(one);
        assert_eq!(a.in_flight(), 0);
        assert_eq!(a.admit(4, &me, cap(0)).await.unwrap().len(), 4);
        assert_eq!(a.waiting_clients(), 0);
    }

    #[tokio::test]
    async fn a_waiting_request_is_admitted_when_room_frees_within_the_wait() {
        let a = Arc::new(whole(AdmissionBound::Fixed(2), 1, Duration::from_secs(5)));
        let mut held = a.admit(2, &client("a"), cap(0)).await.unwrap();
        let waiter = tokio::spawn({
            let a = Arc::clone(&a);
            async move { a.admit(1, &client("b"), cap(0)).await.map(|v| v.len()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        held.pop(); // one choice of the first request ends
        assert_eq!(waiter.await.unwrap().unwrap(), 1);
    }

    #[tokio::test]
    async fn the_automatic_bound_follows_the_workers_and_has_a_floor() {
        let a = whole(AdmissionBound::Auto, 8, WAIT);
        let me = client("a");
        // No worker reported: no bound here (routing answers 503).
        assert_eq!(a.bound(0), None);
        assert!(a.admit(100, &me, cap(0)).await.unwrap().is_empty());
        assert_eq!(a.bound(4), Some(8), "raised to the floor");
        let held = a.admit(8, &me, cap(64)).await.unwrap();
        assert_eq!(held.len(), 8);
        // The workers shrink to a bound of 8 while 8 are held: nothing more until they end.
        assert!(overloaded(&a.admit(1, &me, cap(8)).await));
        drop(held);
        let held = a.admit(8, &me, cap(8)).await.unwrap();
        assert_eq!(held.len(), 8);
        assert!(overloaded(&a.admit(1, &me, cap(8)).await));
        drop(held);
        // They grow again.
        assert_eq!(a.admit(16, &me, cap(64)).await.unwrap().len(), 16);
    }

    #[tokio::test]
    async fn one_request_holds_at_most_its_share_of_the_bound() {
        let a = Admission::new(AdmissionBound::Fixed(64), 1, DEFAULT_REQUEST_SHARE, WAIT);
        assert_eq!(a.request_cap(64, 0), 16);
        assert_eq!(a.request_cap(2, 0), 1, "at least one");
        assert_eq!(a.request_cap(64, 16), 4, "a quarter of the batch slots");
        assert_eq!(a.request_cap(8, 16), 2, "of the bound where it is smaller");
        let big = a.admit(64, &client("big"), cap(0)).await.unwrap();
        assert_eq!(big.len(), 16, "64 choices run through 16 lanes");
        // Everyone else still finds 48 free at once.
        let mut others = Vec::new();
        for i in 0..48 {
            others.extend(a.admit(1, &client(&format!("c{i}")), cap(0)).await.unwrap());
        }
        assert_eq!(a.in_flight(), 64);
        assert!(overloaded(&a.admit(1, &client("late"), cap(0)).await));
    }

    /// Client "hog" queues many requests before "newcomer" queues one: as room frees, the
    /// newcomer is served on the second grant, not after all of the hog's.
    #[tokio::test]
    async fn waiting_clients_take_turns() {
        let a = Arc::new(whole(AdmissionBound::Fixed(1), 1, Duration::from_secs(5)));
        let mut held = Some(a.admit(1, &client("x"), cap(0)).await.unwrap());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let spawn = |name: &'static str, tag: usize| {
            let (a, order) = (Arc::clone(&a), Arc::clone(&order));
            tokio::spawn(async move {
                let permit = a.admit(1, &client(name), cap(0)).await.unwrap();
                order.lock().unwrap().push((name, tag));
                tokio::task::yield_now().await;
                drop(permit);
            })
        };
        for tag in 0..4 {
            tasks.push(spawn("hog", tag));
            tokio::task::yield_now().await;
        }
        tasks.push(spawn("newcomer", 0));
        tokio::task::yield_now().await;
        assert_eq!(a.waiting_clients(), 2);
        held.take();
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order[0], ("hog", 0));
        assert_eq!(order[1], ("newcomer", 0), "{order:?}");
        assert_eq!(&order[2..], &[("hog", 1), ("hog", 2), ("hog", 3)]);
    }

    /// A client past its share is passed over while another waits; alone, it holds all but
    /// one share, which a newcomer takes at once.
    #[tokio::test]
    async fn a_client_past_its_share_yields_to_others() {
        let a = Arc::new(Admission::new(
            AdmissionBound::Fixed(8),
            1,
            0.25,
            Duration::from_secs(5),
        ));
        assert_eq!(a.client_cap(8, 0), 6);
        let hog = client("hog");
        // Alone, the hog fills all but one share, two at a time.
        let mut held: Vec<_> = Vec::new();
        for _ in 0..3 {
            held.extend(a.admit(2, &hog, cap(0)).await.unwrap());
        }
        assert_eq!(a.in_flight(), 6);
        let hog_waits = tokio::spawn({
            let a = Arc::clone(&a);
            async move { a.admit(2, &client("hog"), cap(0)).await.map(|v| v.len()) }
        });
        tokio::task::yield_now().await;
        assert!(
            !hog_waits.is_finished(),
            "at its cap, though the bound has room"
        );
        // A newcomer finds the share the hog left, at once.
        let other = a.admit(2, &client("other"), cap(0)).await.unwrap();
        assert_eq!(other.len(), 2);
        assert_eq!(a.in_flight(), 8);
        let third = tokio::spawn({
            let a = Arc::clone(&a);
            async move { a.admit(2, &client("third"), cap(0)).await }
        });
        tokio::task::yield_now().await;
        held.truncate(4); // two free: the hog was first, but holds more than its share
        let third_holds = third.await.unwrap().unwrap();
        assert_eq!(third_holds.len(), 2);
        tokio::task::yield_now().await;
        assert!(!hog_waits.is_finished());
        drop(other);
        assert_eq!(hog_waits.await.unwrap().unwrap(), 2);
    }

    /// What the workers run bounds one client: 16 batch slots, a quarter share of 4 per
    /// request, so one client holds 12 however many requests it sends, and a newcomer's
    /// request is admitted at once beside them (before: the client held all 64 of the bound
    /// and the newcomer waited out the admission wait, then got its 429).
    #[tokio::test]
    async fn one_client_with_many_requests_leaves_a_newcomer_its_room() {
        let a = Arc::new(Admission::new(
            AdmissionBound::Fixed(64),
            1,
            DEFAULT_REQUEST_SHARE,
            WAIT,
        ));
        let slots = Capacity {
            auto_bound: 64,
            running: 16,
        };
        assert_eq!(a.client_cap(64, 16), 12);
        let hog = client("hog");
        let mut held = Vec::new();
        let mut refused = 0;
        for _ in 0..16 {
            match a.admit(4, &hog, slots).await {
                Ok(got) => held.extend(got),
                Err(_) => refused += 1,
            }
        }
        assert_eq!((held.len(), refused), (12, 13));
        let newcomer = tokio::time::timeout(WAIT / 2, a.admit(4, &client("new"), slots)).await;
        assert_eq!(
            newcomer.expect("admitted without waiting").unwrap().len(),
            4
        );
    }

    /// A waiter whose client went away (its future dropped) leaves no trace and no permits.
    #[tokio::test]
    async fn an_abandoned_wait_is_withdrawn() {
        let a = Arc::new(whole(AdmissionBound::Fixed(1), 1, Duration::from_secs(5)));
        let held = a.admit(1, &client("a"), cap(0)).await.unwrap();
        let waiter = tokio::spawn({
            let a = Arc::clone(&a);
            async move { a.admit(1, &client("b"), cap(0)).await.map(|v| v.len()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(a.waiting_clients(), 1);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(a.waiting_clients(), 0);
        drop(held);
        assert_eq!(a.in_flight(), 0);
        assert_eq!(a.admit(1, &client("c"), cap(0)).await.unwrap().len(), 1);
    }

    /// Seeded random admits (several clients, some giving up at once), releases and bound
    /// changes: never more held than the bound allowed at each admit, and the books balance.
    #[tokio::test]
    async fn random_admits_and_resizes_keep_the_books() {
        let a = Admission::new(AdmissionBound::Auto, 1, 0.5, Duration::from_millis(1));
        let mut state = 0x5eed_u64;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut held: Vec<Admitted> = Vec::new();
        for _ in 0..2000 {
            let bound = 1 + rand(40) as usize;
            let who = client(&format!("c{}", rand(5)));
            match rand(3) {
                0 => {
                    if let Ok(mut got) = a.admit(1 + rand(8) as usize, &who, cap(bound)).await {
                        assert!(got.len() <= a.request_cap(bound, 0));
                        held.append(&mut got);
                        // Admitted only within the bound and the client's cap in force now.
                        assert!(held.len() <= bound, "{} > {bound}", held.len());
                        let by_who = held.iter().filter(|h| h.client == who).count();
                        let client_cap = a.client_cap(bound, 0);
                        assert!(by_who <= client_cap, "{by_who} > {client_cap}");
                    }
                }
                1 => {
                    for _ in 0..rand(6) {
                        if !held.is_empty() {
                            held.swap_remove(rand(held.len() as u64) as usize);
                        }
                    }
                }
                _ => {
                    // Gives up at once: a cancelled wait.
                    let attempt = a.admit(1 + rand(4) as usize, &who, cap(bound));
                    futures::FutureExt::now_or_never(attempt);
                }
            }
            assert_eq!(a.in_flight(), held.len());
            assert_eq!(a.waiting_clients(), 0);
        }
        held.clear();
        assert_eq!(a.in_flight(), 0);
        assert!(lock(&a.books).held_by.is_empty());
    }
}

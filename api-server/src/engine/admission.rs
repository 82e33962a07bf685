//! Admission control: a bound on the engine sequences in flight at this api-server (every choice
//! of every request: prompts × `n`). A request takes all of its sequences at once or none. Past
//! the bound it waits a short while for room — in arrival order: the semaphore is fair, so a
//! large request is not starved by small ones — then is refused with a 429 (TGI's "Model is
//! overloaded"; the error carries `Retry-After`). A client learns within the wait whether it was
//! admitted, and an admitted request reaches a worker whose queue has room for it.
//!
//! The bound is `--max-sequences-in-flight`, or by default [`QUEUE_FACTOR`] times the sequences
//! the live workers' KV caches hold at full context (`kv_capacity_tokens / max_model_len` each,
//! from their hellos): enough waiting work to keep every batch full, little enough that an
//! admitted request starts within a few batches' time. It follows the workers as they come and
//! go; it never drops below the largest request one may send ([`Admission::new`]'s floor).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// The most sequences (prompts × n) one request may carry; also the admission bound's floor.
pub const MAX_SEQUENCES_PER_REQUEST: usize = 64;

/// Queue depth of the default bound, in multiples of what the KV caches hold at full context.
pub const QUEUE_FACTOR: usize = 4;

/// How the bound is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionBound {
    /// From the workers' reported KV capacity.
    Auto,
    Fixed(usize),
}

/// One admitted sequence; dropping it makes room for the next.
#[derive(Debug)]
pub struct Admitted(#[allow(dead_code)] OwnedSemaphorePermit);

#[derive(Debug)]
pub struct Admission {
    permits: Arc<Semaphore>,
    bound: AdmissionBound,
    /// Permits the semaphore holds in all (held by requests or free), and those still to
    /// forget after a shrink (held when it happened): the bound in force is their difference.
    total: Mutex<Total>,
    floor: usize,
    wait: Duration,
}

#[derive(Debug, Default)]
struct Total {
    given: usize,
    to_forget: usize,
}

/// What a worker's hello says of its capacity, for the default bound.
#[derive(Debug, Clone, Copy)]
pub struct WorkerCapacity {
    pub kv_capacity_tokens: u32,
    pub max_model_len: u32,
}

/// The default bound for these live workers (0 when none has reported yet).
pub fn auto_bound(workers: impl IntoIterator<Item = WorkerCapacity>) -> usize {
    workers
        .into_iter()
        .filter(|w| w.kv_capacity_tokens > 0 && w.max_model_len > 0)
        .map(|w| (w.kv_capacity_tokens / w.max_model_len).max(1) as usize * QUEUE_FACTOR)
        .sum()
}

impl Admission {
    /// `floor`: the most sequences one request may carry; a bound below it is raised to it so
    /// that every valid request can be admitted once the server is idle.
    pub fn new(bound: AdmissionBound, floor: usize, wait: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(0)),
            bound,
            total: Mutex::new(Total::default()),
            floor: floor.max(1),
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

    /// Sequences admitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        let total = self.lock();
        total.given.saturating_sub(self.permits.available_permits())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Total> {
        self.total.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings the semaphore's permits to `bound`: grows at once; shrinks by what is free now
    /// and the rest as admitted sequences finish.
    fn resize(&self, bound: usize) {
        let mut total = self.lock();
        if total.to_forget > 0 {
            let forgot = self.permits.forget_permits(total.to_forget);
            total.to_forget -= forgot;
            total.given -= forgot;
        }
        let target = total.given - total.to_forget;
        if bound > target {
            let grow = bound - target;
            let repaid = grow.min(total.to_forget);
            total.to_forget -= repaid;
            self.permits.add_permits(grow - repaid);
            total.given += grow - repaid;
        } else if bound < target {
            let shrink = target - bound;
            let forgot = self.permits.forget_permits(shrink);
            total.given -= forgot;
            total.to_forget += shrink - forgot;
        }
    }

    /// Admits `sequences` at once, waiting up to the configured wait for room; past it a 429.
    /// `auto` is the default bound from the workers now (see [`Admission::bound`]). With no
    /// bound yet (no worker reported) the request goes on unbounded: it gets its 503 from
    /// routing instead of a misleading 429.
    pub async fn admit(&self, sequences: usize, auto: usize) -> Result<Vec<Admitted>, ApiError> {
        let Some(bound) = self.bound(auto) else {
            return Ok(Vec::new());
        };
        self.resize(bound);
        let n = u32::try_from(sequences.min(bound)).unwrap_or(u32::MAX);
        let acquire = Arc::clone(&self.permits).acquire_many_owned(n);
        let mut permit = match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_closed)) => return Err(ApiError::unavailable("the server is shutting down")),
            Err(_) => {
                return Err(ApiError::Overloaded {
                    message: format!(
                        "Model is overloaded: {} of {bound} sequences in flight; retry later",
                        self.in_flight()
                    ),
                })
            }
        };
        let mut admitted = Vec::with_capacity(sequences);
        while permit.num_permits() > 1 {
            if let Some(one) = permit.split(1) {
                admitted.push(Admitted(one));
            }
        }
        admitted.push(Admitted(permit));
        Ok(admitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(50);

    fn overloaded(r: &Result<Vec<Admitted>, ApiError>) -> bool {
        matches!(r, Err(ApiError::Overloaded { .. }))
    }

    #[test]
    fn the_default_bound_is_four_full_contexts_per_worker() {
        let w = |kv, len| WorkerCapacity {
            kv_capacity_tokens: kv,
            max_model_len: len,
        };
        assert_eq!(auto_bound([w(32_768, 2048)]), 64);
        assert_eq!(auto_bound([w(32_768, 2048), w(8192, 2048)]), 64 + 16);
        // A cache smaller than one context still admits a queue's worth; unreported ones none.
        assert_eq!(auto_bound([w(1024, 2048), w(0, 0)]), 4);
        assert_eq!(auto_bound([]), 0);
    }

    #[tokio::test]
    async fn admits_up_to_the_bound_then_refuses_after_the_wait() {
        let a = Admission::new(AdmissionBound::Fixed(4), 2, WAIT);
        let first = a.admit(3, 0).await.unwrap();
        assert_eq!(first.len(), 3);
        assert_eq!(a.in_flight(), 3);
        let started = tokio::time::Instant::now();
        let refused = a.admit(2, 0).await;
        assert!(overloaded(&refused), "{refused:?}");
        assert!(started.elapsed() >= WAIT);
        let Err(ApiError::Overloaded { message }) = refused else {
            unreachable!()
        };
        assert!(message.contains("3 of 4"), "{message}");
        // All or nothing: the one free sequence was not taken by the refused request.
        let one = a.admit(1, 0).await.unwrap();
        assert_eq!(a.in_flight(), 4);
        drop(first);
        drop(one);
        assert_eq!(a.in_flight(), 0);
        assert_eq!(a.admit(4, 0).await.unwrap().len(), 4);
    }

    #[tokio::test]
    async fn a_waiting_request_is_admitted_when_room_frees_within_the_wait() {
        let a = Arc::new(Admission::new(
            AdmissionBound::Fixed(2),
            1,
            Duration::from_secs(5),
        ));
        let mut held = a.admit(2, 0).await.unwrap();
        let waiter = tokio::spawn({
            let a = Arc::clone(&a);
            async move { a.admit(1, 0).await.map(|v| v.len()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        held.pop(); // one choice of the first request ends
        assert_eq!(waiter.await.unwrap().unwrap(), 1);
    }

    #[tokio::test]
    async fn the_automatic_bound_follows_the_workers_and_has_a_floor() {
        let a = Admission::new(AdmissionBound::Auto, 8, WAIT);
        // No worker reported: no bound here (routing answers 503).
        assert_eq!(a.bound(0), None);
        assert!(a.admit(100, 0).await.unwrap().is_empty());
        assert_eq!(a.bound(4), Some(8), "raised to the floor");
        let held = a.admit(8, 64).await.unwrap();
        assert_eq!(held.len(), 8);
        // The workers shrink to a bound of 8 while 8 are held: nothing more until they end.
        assert!(overloaded(&a.admit(1, 8).await));
        drop(held);
        let held = a.admit(8, 8).await.unwrap();
        assert_eq!(held.len(), 8);
        assert!(overloaded(&a.admit(1, 8).await));
        drop(held);
        // They grow again.
        assert_eq!(a.admit(16, 64).await.unwrap().len(), 16);
    }

    /// Seeded random admits, releases and bound changes: never more in flight than the bound
    /// in force when each was admitted allows, and the books balance at the end.
    #[tokio::test]
    async fn random_admits_and_resizes_keep_the_books() {
        let a = Admission::new(AdmissionBound::Auto, 1, Duration::from_millis(1));
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
            match rand(3) {
                0 => {
                    if let Ok(mut got) = a.admit(1 + rand(4) as usize, bound).await {
                        held.append(&mut got);
                        assert!(held.len() <= bound.max(40), "{} > {bound}", held.len());
                    }
                }
                1 => {
                    for _ in 0..rand(6) {
                        if !held.is_empty() {
                            held.swap_remove(rand(held.len() as u64) as usize);
                        }
                    }
                }
                _ => a.resize(bound),
            }
            assert_eq!(a.in_flight(), held.len());
        }
        held.clear();
        assert_eq!(a.in_flight(), 0);
    }
}

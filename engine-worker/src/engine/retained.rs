//! Finished requests kept until their api-server acknowledges the final output
//! (`ApiToWorker::Delivered`). A token-processor that restarted or stalled never saw some of them
//! finish; the next resync lists them, so it replays them and the client still gets the exact
//! stream. Bounded in bytes and in age: past either, the oldest go unacknowledged and are
//! counted (their api-server's probe then ends them with an explicit error).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use proto::worker_tp::ResyncRequest;
use proto::RequestId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetainBounds {
    /// Most bytes of retained tokens and histories (a resync must stay far below the frame cap).
    pub max_bytes: usize,
    /// A request unacknowledged this long is dropped: its api-server has given up on it by then.
    pub max_age: Duration,
}

impl Default for RetainBounds {
    fn default() -> Self {
        Self {
            max_bytes: 8 << 20,
            max_age: Duration::from_secs(120),
        }
    }
}

#[derive(Debug)]
struct Kept {
    request: ResyncRequest,
    since: Instant,
    bytes: usize,
}

#[derive(Debug, Default)]
pub struct Retained {
    bounds: RetainBounds,
    kept: HashMap<RequestId, Kept>,
    /// Ids in the order they were kept; acknowledged ones are skipped lazily.
    order: VecDeque<RequestId>,
    bytes: usize,
    evicted: u64,
}

/// What one retained request costs: its tokens, its history and a fixed overhead.
fn cost(r: &ResyncRequest) -> usize {
    let logprobs: usize = (r.logprobs.iter())
        .chain(&r.prompt_logprobs)
        .map(proto::TokenLogprob::heap_bytes)
        .sum();
    r.tokens.len() * 4
        + logprobs
        + r.drafted.len()
        + r.accepted.len()
        + r.offered.len()
        + r.predicted_milli.len() * 2
        + r.class.len()
        + r.owner.len()
        + 96
}

impl Retained {
    pub fn new(bounds: RetainBounds) -> Self {
        Self {
            bounds,
            ..Self::default()
        }
    }

    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Dropped unacknowledged since start.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.kept.contains_key(&id)
    }

    /// The api-server a kept request belongs to.
    pub fn owner_of(&self, id: RequestId) -> Option<&str> {
        self.kept.get(&id).map(|k| k.request.owner.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = &ResyncRequest> + '_ {
        self.order
            .iter()
            .filter_map(|id| self.kept.get(id))
            .map(|k| &k.request)
    }

    /// Keeps a finished request (its `finish` set), evicting the oldest past the byte bound.
    pub fn keep(&mut self, request: ResyncRequest, now: Instant) {
        let bytes = cost(&request);
        let id = request.id;
        if let Some(old) = self.kept.insert(
            id,
            Kept {
                request,
                since: now,
                bytes,
            },
        ) {
            self.bytes -= old.bytes;
        } else {
            self.order.push_back(id);
        }
        self.bytes += bytes;
        while self.bytes > self.bounds.max_bytes {
            if !self.evict_oldest("over the retention bound") {
                break;
            }
        }
    }

    /// The api-server has the final output (or gave the request up): forget it.
    pub fn forget(&mut self, id: RequestId) -> bool {
        let Some(k) = self.kept.remove(&id) else {
            return false;
        };
        self.bytes -= k.bytes;
        self.compact();
        true
    }

    /// Forgets every request of `owner` (an api-server that went silent).
    pub fn forget_owner(&mut self, owner: &str) -> usize {
        let ids: Vec<RequestId> = self
            .kept
            .iter()
            .filter(|(_, k)| k.request.owner == owner)
            .map(|(id, _)| *id)
            .collect();
        ids.iter().filter(|&&id| self.forget(id)).count()
    }

    /// Drops requests kept longer than the age bound.
    pub fn expire(&mut self, now: Instant) {
        while let Some(&id) = self.order.front() {
            match self.kept.get(&id) {
                None => {
                    self.order.pop_front();
                }
                Some(k) if now.saturating_duration_since(k.since) > self.bounds.max_age => {
                    self.evict_oldest("unacknowledged past the retention age");
                }
                Some(_) => break,
            }
        }
    }

    fn evict_oldest(&mut self, why: &'static str) -> bool {
        while let Some(id) = self.order.pop_front() {
            if let Some(k) = self.kept.remove(&id) {
                self.bytes -= k.bytes;
                self.evicted += 1;
                tracing::warn!(
                    why,
                    evicted_total = self.evicted,
                    retained = self.kept.len(),
                    "finished request dropped before its api-server acknowledged it"
                );
                return true;
            }
        }
        false
    }

    /// When the newest request kept since before `cutoff` (and after `after`) was kept: such a
    /// request's final output is overdue. Walks only the requests older than `cutoff`.
    pub fn overdue_since(&self, cutoff: Instant, after: Option<Instant>) -> Option<Instant> {
        let mut newest = None;
        for id in &self.order {
            let Some(k) = self.kept.get(id) else { continue };
            if k.since > cutoff {
                break;
            }
            if after.is_none_or(|a| k.since > a) {
                newest = Some(k.since);
            }
        }
        newest
    }

    /// Keeps the order queue from growing with acknowledged ids behind a long-kept one.
    fn compact(&mut self) {
        if self.order.len() > 4 * self.kept.len() + 1024 {
            let kept = &self.kept;
            self.order.retain(|id| kept.contains_key(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(id: RequestId, owner: &str, tokens: usize) -> ResyncRequest {
        ResyncRequest {
            id,
            owner: owner.into(),
            prompt_tokens: 3,
            cached_prompt_tokens: 0,
            arrival_unix_ms: 0,
            prefilled: true,
            tokens: vec![7; tokens],
            drafted: vec![2; tokens / 2],
            accepted: vec![1; tokens / 2],
            offered: vec![2; tokens / 2],
            predicted_milli: vec![1500; tokens / 2],
            class: "other".into(),
            finish: 1,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        }
    }

    #[test]
    fn acknowledged_requests_are_forgotten_and_bytes_return_to_zero() {
        let mut r = Retained::new(RetainBounds::default());
        let now = Instant::now();
        for id in 0..100 {
            r.keep(finished(id, "api-a", 40), now);
        }
        assert_eq!(r.len(), 100);
        let ids: Vec<RequestId> = r.iter().map(|q| q.id).collect();
        assert_eq!(ids, (0..100).collect::<Vec<_>>(), "kept in finish order");
        for id in 0..100 {
            assert!(r.forget(id));
        }
        assert!(!r.forget(5));
        assert_eq!((r.len(), r.bytes(), r.evicted()), (0, 0, 0));
    }

    #[test]
    fn the_byte_bound_evicts_the_oldest_and_counts_them() {
        let one = cost(&finished(0, "api-a", 100));
        let mut r = Retained::new(RetainBounds {
            max_bytes: 10 * one,
            max_age: Duration::from_secs(60),
        });
        let now = Instant::now();
        for id in 0..25 {
            r.keep(finished(id, "api-a", 100), now);
            assert!(r.bytes() <= 10 * one);
        }
        assert_eq!(r.len(), 10);
        assert_eq!(r.evicted(), 15);
        assert!(!r.contains(14) && r.contains(15) && r.contains(24));
    }

    #[test]
    fn old_requests_expire_and_owners_are_forgotten_together() {
        let mut r = Retained::new(RetainBounds {
            max_bytes: usize::MAX,
            max_age: Duration::from_secs(10),
        });
        let t0 = Instant::now();
        r.keep(finished(1, "api-a", 4), t0);
        r.keep(finished(2, "api-b", 4), t0 + Duration::from_secs(5));
        r.keep(finished(3, "api-a", 4), t0 + Duration::from_secs(6));
        r.expire(t0 + Duration::from_secs(11));
        assert!(!r.contains(1) && r.contains(2));
        assert_eq!(r.evicted(), 1);
        assert_eq!(r.forget_owner("api-a"), 1);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn overdue_requests_are_found_once() {
        let mut r = Retained::new(RetainBounds::default());
        let t0 = Instant::now();
        r.keep(finished(1, "api-a", 4), t0);
        r.keep(finished(2, "api-a", 4), t0 + Duration::from_secs(1));
        r.keep(finished(3, "api-a", 4), t0 + Duration::from_secs(5));
        let cutoff = t0 + Duration::from_secs(2);
        assert_eq!(
            r.overdue_since(cutoff, None),
            Some(t0 + Duration::from_secs(1))
        );
        assert_eq!(
            r.overdue_since(cutoff, Some(t0 + Duration::from_secs(1))),
            None
        );
        r.forget(1);
        r.forget(2);
        assert_eq!(
            r.overdue_since(t0 + Duration::from_secs(9), None),
            Some(t0 + Duration::from_secs(5))
        );
    }

    #[test]
    fn the_order_queue_stays_bounded_behind_a_long_kept_request() {
        let mut r = Retained::new(RetainBounds::default());
        let now = Instant::now();
        r.keep(finished(0, "api-a", 4), now);
        for id in 1..20_000 {
            r.keep(finished(id, "api-a", 4), now);
            r.forget(id);
        }
        assert_eq!(r.len(), 1);
        assert!(r.order.len() <= 4 + 1024 + 1, "{}", r.order.len());
    }
}

//! Requests this tracker ended recently, with what it had counted of them: a resync may list
//! them again (the worker keeps a finished request until its api-server acknowledges the final
//! output), and the replay must count each step once. Bounded: the oldest are forgotten first.

use std::collections::{HashSet, VecDeque};

use proto::RequestId;

use super::{IdMap, RequestState};

/// Most ended requests remembered per worker epoch (~32 bytes each).
pub const MAX_SETTLED: usize = 16_384;

/// What was counted of an ended request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Verification steps in its figures.
    pub steps: u32,
    /// Tokens it had been sent.
    pub delivered: u32,
}

#[derive(Debug, Default)]
pub struct Settled {
    ended: IdMap<Ended>,
    order: VecDeque<RequestId>,
}

impl Settled {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.ended.len()
    }

    pub fn get(&self, id: RequestId) -> Option<Ended> {
        self.ended.get(&id).copied()
    }

    pub fn insert(&mut self, id: RequestId, state: &RequestState) {
        let ended = Ended {
            steps: u32::try_from(state.figures.steps()).unwrap_or(u32::MAX),
            delivered: state.delivered,
        };
        if self.ended.insert(id, ended).is_none() {
            self.order.push_back(id);
        }
        while self.ended.len() > MAX_SETTLED {
            match self.order.pop_front() {
                Some(old) => {
                    self.ended.remove(&old);
                }
                None => break,
            }
        }
    }

    /// Keeps only `ids` (a resync's list: the worker has forgotten the rest).
    pub fn retain(&mut self, ids: &HashSet<RequestId>) {
        self.ended.retain(|id, _| ids.contains(id));
        let ended = &self.ended;
        self.order.retain(|id| ended.contains_key(id));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::tracker::PromptTokens;

    fn state(steps: usize, delivered: u32) -> RequestState {
        let mut s = RequestState::new(
            Arc::from("api"),
            PromptTokens {
                total: 3,
                cached: 0,
            },
            0,
            2,
        );
        for _ in 0..steps {
            s.figures.record(2, 1);
        }
        s.delivered = delivered;
        s
    }

    #[test]
    fn remembers_what_was_counted_within_its_bound() {
        let mut settled = Settled::default();
        settled.insert(1, &state(3, 7));
        assert_eq!(
            settled.get(1),
            Some(Ended {
                steps: 3,
                delivered: 7
            })
        );
        for id in 2..(MAX_SETTLED as u64 + 10) {
            settled.insert(id, &state(0, 0));
        }
        assert_eq!(settled.len(), MAX_SETTLED);
        assert!(settled.get(1).is_none(), "the oldest went first");
        let keep: HashSet<RequestId> = [5, 6].into_iter().collect();
        settled.retain(&keep);
        assert_eq!(settled.len(), 0, "5 and 6 were evicted too");
        settled.insert(5, &state(1, 1));
        settled.retain(&keep);
        assert_eq!(settled.len(), 1);
        assert_eq!(settled.order.len(), 1);
    }
}

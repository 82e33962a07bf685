//! The one reconnect backoff policy: doubling from [`Backoff::MIN`] to [`Backoff::MAX`], reset on
//! a successful connect. Short enough that a restarted peer is found within a second or two,
//! long enough that a missing one costs nothing.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Self::MIN }
    }
}

impl Backoff {
    pub const MIN: Duration = Duration::from_millis(50);
    pub const MAX: Duration = Duration::from_secs(1);

    /// The wait before the next attempt; doubles the one after.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }

    /// Connected: the next failure starts from the shortest wait again.
    pub fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<u64> = (0..7).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(delays, [50, 100, 200, 400, 800, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_delay(), Backoff::MIN);
    }
}

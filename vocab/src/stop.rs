//! Stop strings matched on an output's bytes as they grow: which stop string the newest bytes
//! complete, and how much text may be shown while a stop string could still be forming. The
//! engine-worker ends a sequence on a match; the api-server cuts the text shown there.

/// A stop string found in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopMatch {
    /// Byte offset where the stop string starts.
    pub at: usize,
    /// Which stop string (index into the list searched).
    pub index: usize,
}

/// The earliest occurrence of a non-empty stop string in `text` that ends after byte `new_from`,
/// i.e. that the bytes from `new_from` on complete; ties go to the stop listed first. Searching
/// only there keeps each check proportional to the new bytes, not the whole output.
pub fn find_completed_stop<S: AsRef<[u8]>>(
    text: &[u8],
    new_from: usize,
    stops: &[S],
) -> Option<StopMatch> {
    let mut best: Option<StopMatch> = None;
    for (index, stop) in stops.iter().enumerate() {
        let stop = stop.as_ref();
        if stop.is_empty() {
            continue;
        }
        let from = (new_from + 1).saturating_sub(stop.len());
        let Some(window) = text.get(from..) else {
            continue;
        };
        let found = window.windows(stop.len()).position(|w| w == stop);
        if let Some(at) = found.map(|p| from + p) {
            if best.is_none_or(|b| at < b.at) {
                best = Some(StopMatch { at, index });
            }
        }
    }
    best
}

/// One output's stop strings, for text released to a client piece by piece.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
}

impl StopStrings {
    /// Empty stop strings are dropped: they would match everywhere.
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The stop string a match names.
    pub fn get(&self, found: StopMatch) -> &str {
        self.stops.get(found.index).map_or("", String::as_str)
    }

    /// See [`find_completed_stop`].
    pub fn find_completed(&self, text: &str, new_from: usize) -> Option<StopMatch> {
        find_completed_stop(text.as_bytes(), new_from, &self.stops)
    }

    /// Bytes at the end of the text that may be the start of a stop string, so not shown yet:
    /// the longest stop string minus one byte.
    pub fn hold_back(&self) -> usize {
        self.stops
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .saturating_sub(1)
    }

    /// How much of `text` may be shown: all but the held-back tail, cut at a char boundary.
    pub fn releasable_len(&self, text: &str) -> usize {
        floor_char_boundary(text, text.len().saturating_sub(self.hold_back()))
    }
}

fn floor_char_boundary(s: &str, mut at: usize) -> usize {
    at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_must_end_in_the_new_bytes() {
        let completes = |text: &[u8], old_len| {
            find_completed_stop(text, old_len, &["ab".to_string()]).is_some()
        };
        assert!(completes(b"xxab", 3));
        assert!(completes(b"xxab", 2));
        assert!(!completes(b"abxx", 3));
        assert!(!completes(b"xxa", 2));
    }

    #[test]
    fn earliest_match_wins_and_ties_go_to_the_first_stop() {
        let stops = ["cd", "bcd", "b"];
        let found = find_completed_stop(b"abcd", 3, &stops);
        assert_eq!(found, Some(StopMatch { at: 1, index: 1 }));
        let found = find_completed_stop(b"ab", 0, &["b", "ab", "a"]);
        assert_eq!(found, Some(StopMatch { at: 0, index: 1 }));
        assert_eq!(find_completed_stop(b"ab", 9, &["b"]), None);
        assert_eq!(find_completed_stop(b"ab", 0, &[""]), None);
    }

    #[test]
    fn held_back_tail_covers_a_forming_stop_string() {
        let stops = StopStrings::new(vec![String::new(), "END".into()]);
        assert_eq!(stops.hold_back(), 2);
        assert_eq!(stops.releasable_len("abcE"), 2);
        // Never inside a char: "é" is two bytes.
        assert_eq!(stops.releasable_len("aéb"), 1);
        assert_eq!(StopStrings::new(vec![]).hold_back(), 0);
        let found = stops.find_completed("xxEND", 4);
        assert_eq!(found.map(|m| stops.get(m)), Some("END"));
    }
}

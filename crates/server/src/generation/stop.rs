//! Stop strings matched across token boundaries: [`StopMatcher`] holds back text
//! that could start a stop string and never emits the stop string itself.

/// Stop-string matching over a stream of text pieces.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What a piece of text releases.
#[derive(Debug, PartialEq)]
pub enum StopOutcome {
    /// Text that can be emitted (possibly empty: all held back).
    Emit(String),
    /// A stop string matched; this text preceded it. Generation ends.
    Stopped(String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops,
            held: String::new(),
        }
    }

    pub fn push(&mut self, piece: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Emit(piece.to_string());
        }
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(i) = first {
            let before = self.held[..i].to_string();
            self.held.clear();
            return StopOutcome::Stopped(before);
        }
        // Hold back the longest suffix that could start a stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep_from);
        StopOutcome::Emit(std::mem::replace(&mut self.held, rest))
    }

    /// Releases what is held back (generation ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopOutcome::Emit(t) => out.push_str(&t),
                StopOutcome::Stopped(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_strings_across_pieces() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(
            run(&["END"], &["abc E", "N", "D more"]),
            ("abc ".into(), true)
        );
        assert_eq!(
            run(&["END"], &["abc E", "N", "x"]),
            ("abc ENx".into(), false)
        );
        assert_eq!(
            run(&["\n\n", "xy"], &["a\n", "b x", "y"]),
            ("a\nb ".into(), true)
        );
        // The earliest match wins, whichever stop string it is.
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true));
        // Multi-byte characters are never split.
        assert_eq!(run(&["日本"], &["é日", "x日本"]), ("é日x".into(), true));
        assert_eq!(run(&["ab"], &["a"]), ("a".into(), false));
    }

    #[test]
    fn held_text_is_only_a_possible_prefix() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("xxST"), StopOutcome::Emit("xx".into()));
        assert_eq!(m.push("AR"), StopOutcome::Emit("STAR".into()));
        assert_eq!(m.push("S"), StopOutcome::Emit("".into()));
        assert_eq!(m.push("TOP"), StopOutcome::Stopped("".into()));
    }
}

//! A fallback asked to continue an answer may start by saying again what the
//! caller already has: all of it (it ignored the instruction and answered
//! from the start), its last words, or the whitespace a trimmed prefill left
//! out. [`Restate`] reads the fallback's first text and decides how many of
//! its bytes repeat the delivered text, so the caller sees each word once.
//!
//! Accepted restatements, with `D` the delivered text and `F` the fallback's:
//! `F` starts with all of `D`; `F` starts with a suffix of `D` that begins a
//! word and is at least [`MIN_OVERLAP`] bytes long (a shorter match is as
//! likely a coincidence); `F` starts with the whitespace `D` ends with. The
//! longest wins. While some candidate still matches, the decision waits for
//! more text; an `F` that ends (or turns to other output) while still
//! matching restated all it said.

/// The shortest suffix of the delivered text taken as restated.
pub(crate) const MIN_OVERLAP: usize = 16;

/// The decision on one fallback's leading text (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct Restate {
    delivered: String,
    /// Where the trailing whitespace of `delivered` starts, when it has some.
    whitespace: Option<usize>,
    /// Candidate starts in `delivered` still matching the text read.
    live: Vec<usize>,
    /// The longest restatement completed (bytes of fallback text to drop).
    overlap: usize,
    /// Fallback text read while undecided.
    read: usize,
    decided: bool,
}

impl Restate {
    pub(crate) fn new(delivered: &str) -> Restate {
        let d = delivered.as_bytes();
        let trimmed = delivered.trim_end().len();
        let whitespace = (trimmed < d.len()).then_some(trimmed);
        let live: Vec<usize> = (0..d.len())
            .filter(|&i| {
                i == 0
                    || Some(i) == whitespace
                    || (d.len() - i >= MIN_OVERLAP
                        && delivered.is_char_boundary(i)
                        && d[i - 1].is_ascii_whitespace()
                        && !d[i].is_ascii_whitespace())
            })
            .collect();
        Restate {
            delivered: delivered.to_owned(),
            whitespace,
            decided: live.is_empty(),
            live,
            overlap: 0,
            read: 0,
        }
    }

    /// Whether the decision is made: text read from now on is the fallback's own.
    pub(crate) fn decided(&self) -> bool {
        self.decided
    }

    /// Reads the fallback's next text; returns whether the decision is made.
    pub(crate) fn read(&mut self, text: &str) -> bool {
        if self.decided {
            return true;
        }
        let (d, t, p) = (self.delivered.as_bytes(), text.as_bytes(), self.read);
        let mut overlap = self.overlap;
        self.live.retain(|&i| {
            let s = &d[i..];
            let n = (s.len() - p).min(t.len());
            if s[p..p + n] != t[..n] {
                return false;
            }
            if p + n == s.len() {
                overlap = overlap.max(s.len());
                return false;
            }
            true
        });
        self.overlap = overlap;
        self.read += t.len();
        self.decided = self.live.is_empty();
        self.decided
    }

    /// No more text comes before other output: decides now, counting a
    /// candidate still matching as a restatement of everything read.
    pub(crate) fn settle(&mut self) {
        if !self.decided {
            for &i in &self.live {
                if i == 0 || Some(i) == self.whitespace || self.read >= MIN_OVERLAP {
                    self.overlap = self.overlap.max(self.read);
                }
            }
            self.live.clear();
            self.decided = true;
        }
    }

    /// Bytes of the fallback's leading text that restate the delivered text
    /// (final once decided).
    pub(crate) fn overlap(&self) -> usize {
        self.overlap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes dropped from `said` (fed in `pieces`) after `delivered`.
    fn dropped(delivered: &str, pieces: &[&str]) -> usize {
        let mut r = Restate::new(delivered);
        for p in pieces {
            if r.read(p) {
                break;
            }
        }
        r.settle();
        r.overlap()
    }

    #[test]
    fn a_whole_restatement_is_dropped_in_any_pieces() {
        let d = "answer from fb-x: w1 w2";
        assert_eq!(dropped(d, &["answer from fb-x: w1 w2", " w3"]), d.len());
        assert_eq!(dropped(d, &["ans", "wer from fb-x:", " w1 w2 w3"]), d.len());
        // It stops while still restating: all of it was restated.
        assert_eq!(dropped(d, &["answer from"]), "answer from".len());
        // A fresh continuation drops nothing, and is decided at once.
        let mut r = Restate::new(d);
        assert!(r.read(" w3") && r.overlap() == 0);
    }

    #[test]
    fn a_restated_tail_counts_only_from_a_word_start_and_when_long_enough() {
        let d = "The quick brown fox jumps over the lazy dog";
        // "jumps over the lazy dog" (23 bytes) restated, then new text.
        assert_eq!(dropped(d, &["jumps over the lazy dog and runs"]), 23);
        // "the lazy dog" is only 12 bytes: not taken as restated.
        assert_eq!(dropped(d, &["the lazy dog and runs"]), 0);
        // Not from a word start.
        assert_eq!(dropped(d, &["umps over the lazy dog!"]), 0);
        // A longer restatement wins over a shorter one that completed first.
        let d = "ab ab ab ab ab ab ab ab ab ab";
        assert_eq!(dropped(d, &["ab ab ab ab ab ab ab ab ab ab!"]), d.len());
    }

    #[test]
    fn trailing_whitespace_sent_again_is_dropped_once() {
        assert_eq!(dropped("Hello ", &[" world"]), 1);
        assert_eq!(dropped("Hello\n\n", &["\n\nWorld"]), 2);
        assert_eq!(dropped("Hello\n\n", &["\nWorld"]), 0);
        assert_eq!(dropped("Hello", &[" world"]), 0);
        assert_eq!(dropped("", &["x"]), 0);
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let d = "naïve café — déjà vu";
        assert_eq!(dropped(d, &["naïve café — déjà vu, encore"]), d.len());
        let d = "x ééééééééééééééééé";
        let tail = &d[2..];
        assert!(tail.len() >= MIN_OVERLAP);
        assert_eq!(dropped(d, &[tail, "!"]), tail.len());
    }
}

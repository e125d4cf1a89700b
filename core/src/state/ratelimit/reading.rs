//! One response's rate-limit evidence in one model, whatever the provider:
//! for each [`Kind`] a [`Window`] (limit, remaining, time to reset), plus the
//! refusal signals (a 429, an exhausted quota, a server wait hint).

use smol_str::SmolStr;
use std::time::Duration;

/// What a provider limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Requests per window (RPM).
    Requests,
    /// Tokens per window, input and output together (TPM).
    Tokens,
    /// Input tokens per window (Anthropic ITPM).
    InputTokens,
    /// Output tokens per window (Anthropic OTPM).
    OutputTokens,
}

impl Kind {
    /// Every kind, in index order.
    pub const ALL: [Kind; 4] = [Kind::Requests, Kind::Tokens, Kind::InputTokens, Kind::OutputTokens];

    /// Stable name, used in snapshots and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Requests => "requests",
            Kind::Tokens => "tokens",
            Kind::InputTokens => "input_tokens",
            Kind::OutputTokens => "output_tokens",
        }
    }

    /// The kind a header suffix names (`requests`, `tokens`, `input-tokens`, `output-tokens`).
    pub(crate) fn from_suffix(s: &str) -> Option<Kind> {
        match s {
            "requests" => Some(Kind::Requests),
            "tokens" => Some(Kind::Tokens),
            "input-tokens" => Some(Kind::InputTokens),
            "output-tokens" => Some(Kind::OutputTokens),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What one response says about one kind's window. Every field is optional:
/// providers send different subsets (Azure only `remaining`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Allowance per window.
    pub limit: Option<u64>,
    /// Allowance left in the current window.
    pub remaining: Option<u64>,
    /// Time from the response until the window resets (the allowance is full again).
    pub reset: Option<Duration>,
    /// Window length, when the provider states it (`RateLimit-Policy`'s `w`).
    pub window: Option<Duration>,
}

impl Window {
    /// True when the window says nothing.
    pub fn is_empty(&self) -> bool {
        *self == Window::default()
    }

    /// Folds a repeated value of the same field into this one, keeping the
    /// conservative reading: the smaller limit and remaining, the later reset.
    pub(crate) fn fold_same(&mut self, o: Window) {
        fn pick(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            }
        }
        self.limit = pick(self.limit, o.limit);
        self.remaining = pick(self.remaining, o.remaining);
        self.reset = self.reset.max(o.reset);
        self.window = self.window.max(o.window);
    }

    /// Of two windows of the same kind from different sources (two header
    /// families, two IETF policies), the one that binds first: the smaller
    /// remaining, on a tie the later reset. Its fields are kept together (a
    /// per-minute remaining with a per-day reset would turn a minute's wait
    /// into a day's); a source with no remaining only fills what the binding
    /// one lacks.
    pub(crate) fn tighter(self, o: Window) -> Window {
        let (mut win, lose) = match (self.remaining, o.remaining) {
            (Some(a), Some(b)) if a != b => {
                if a < b {
                    (self, o)
                } else {
                    (o, self)
                }
            }
            (Some(_), Some(_)) => {
                if self.reset >= o.reset {
                    (self, o)
                } else {
                    (o, self)
                }
            }
            (None, Some(_)) => (o, self),
            _ => (self, o),
        };
        if lose.remaining.is_none() || win.remaining.is_none() {
            win.limit = win.limit.or(lose.limit);
            win.reset = win.reset.or(lose.reset);
            win.window = win.window.or(lose.window);
        }
        win
    }
}

/// One response's rate-limit evidence, built by [`Reading::parse`] (headers)
/// and the builder methods (status and body evidence the caller already has).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reading {
    pub(crate) windows: [Window; 4],
    /// The server's wait hint (`retry-after-ms`, `retry-after`, or Gemini's `RetryInfo.retryDelay`).
    pub retry_after: Option<Duration>,
    /// A response arrived (any status): set by [`Reading::parse`] when there
    /// was any header, and by [`Reading::answered`]. Only an answered reading
    /// that is no quota refusal ends a quota hold; a connection that failed
    /// says nothing about the quota.
    pub answered: bool,
    /// The response refused the request for its rate (a 429 without quota exhaustion).
    pub rate_limited: bool,
    /// The response says a quota that does not come back within a rate window
    /// is exhausted (a per-day Gemini `QuotaFailure`, OpenAI `insufficient_quota`).
    pub quota_exhausted: bool,
    /// Names (lower-case) of rate-limit headers whose values were malformed
    /// and ignored, one entry per bad value.
    pub malformed: Vec<SmolStr>,
    /// A refusal the scope is told not to hold on (a bare 429): still no
    /// attempt the provider took.
    pub(crate) refused: bool,
}

impl Reading {
    /// What the response says about `kind`.
    #[inline]
    pub fn window(&self, kind: Kind) -> Window {
        self.windows[kind.index()]
    }

    /// Sets what the response says about `kind` (simulators, tests, and
    /// providers whose limits arrive some other way).
    pub fn with_window(mut self, kind: Kind, w: Window) -> Self {
        self.windows[kind.index()] = w;
        self
    }

    /// Marks that a response arrived (the outcome has a status).
    pub fn answered(mut self) -> Self {
        self.answered = true;
        self
    }

    /// Marks the response as a rate-limit refusal (a 429 without quota exhaustion).
    pub fn rate_limited(mut self) -> Self {
        self.rate_limited = true;
        self.answered = true;
        self
    }

    /// Marks a quota as exhausted (per-day `QuotaFailure`, `insufficient_quota`).
    pub fn quota_exhausted(mut self) -> Self {
        self.quota_exhausted = true;
        self.answered = true;
        self
    }

    /// Adds a wait hint from the body (Gemini `RetryInfo.retryDelay`); the
    /// longer of it and a header's hint is kept.
    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.retry_after = self.retry_after.max(Some(d));
        self
    }

    /// True when the provider took the attempt: an answer that refused
    /// nothing (what a limit no header states is learned from).
    pub(crate) fn taken(&self) -> bool {
        self.answered && !self.rate_limited && !self.quota_exhausted && !self.refused
    }

    /// Malformed rate-limit header values met (each was ignored).
    pub fn problems(&self) -> usize {
        self.malformed.len()
    }

    /// True when the reading carries no window, no hint and no refusal
    /// (whether it was answered or not).
    pub fn is_empty(&self) -> bool {
        self.windows.iter().all(Window::is_empty)
            && self.retry_after.is_none()
            && !self.rate_limited
            && !self.quota_exhausted
    }

    /// True when the reading states `kind`'s remaining allowance: it then
    /// accounts for the request whose response carried it.
    #[inline]
    pub(crate) fn confirms(&self, kind: Kind) -> bool {
        self.windows[kind.index()].remaining.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(limit: Option<u64>, remaining: Option<u64>, reset_s: Option<u64>) -> Window {
        Window {
            limit,
            remaining,
            reset: reset_s.map(Duration::from_secs),
            window: None,
        }
    }

    #[test]
    fn the_tighter_window_binds_and_keeps_its_fields_together() {
        let per_min = w(Some(50), Some(10), Some(30));
        let per_day = w(Some(1000), Some(900), Some(80_000));
        assert_eq!(per_min.tighter(per_day), per_min);
        assert_eq!(per_day.tighter(per_min), per_min);
        // Same remaining: the later reset binds.
        let a = w(Some(50), Some(0), Some(30));
        let b = w(Some(60), Some(0), Some(40));
        assert_eq!(a.tighter(b), b);
        assert_eq!(b.tighter(a), b);
        // A limit-only source fills what the binding one lacks.
        let azure = w(None, Some(5), None);
        let policy = Window {
            window: Some(Duration::from_secs(60)),
            ..w(Some(100), None, None)
        };
        let t = azure.tighter(policy);
        assert_eq!(
            (t.limit, t.remaining, t.window),
            (Some(100), Some(5), Some(Duration::from_secs(60)))
        );
        assert_eq!(policy.tighter(azure), t);
        assert_eq!(Window::default().tighter(per_min), per_min);
    }

    #[test]
    fn repeated_fields_fold_conservatively() {
        let mut a = w(Some(60), Some(5), Some(10));
        a.fold_same(w(Some(50), Some(7), Some(20)));
        assert_eq!(a, w(Some(50), Some(5), Some(20)));
        a.fold_same(Window::default());
        assert_eq!(a, w(Some(50), Some(5), Some(20)));
    }

    #[test]
    fn builder_and_emptiness() {
        assert!(Reading::default().is_empty());
        let r = Reading::default()
            .retry_delay(Duration::from_secs(3))
            .retry_delay(Duration::from_secs(1));
        assert_eq!(r.retry_after, Some(Duration::from_secs(3)));
        assert!(!r.is_empty());
        assert!(!Reading::default().rate_limited().is_empty());
        assert!(!Reading::default().quota_exhausted().is_empty());
        assert!(Reading::default().answered().is_empty() && Reading::default().rate_limited().answered);
        let r = Reading::default().with_window(Kind::Tokens, w(None, Some(1), None));
        assert!(r.confirms(Kind::Tokens) && !r.confirms(Kind::Requests));
        assert_eq!(
            Kind::ALL.map(Kind::as_str),
            ["requests", "tokens", "input_tokens", "output_tokens"]
        );
        assert_eq!(Kind::from_suffix("input-tokens"), Some(Kind::InputTokens));
        assert_eq!(Kind::from_suffix("bytes"), None);
    }
}

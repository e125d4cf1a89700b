//! What the caller observed for one attempt: status or machine error, phase,
//! response headers, vendor code, effect state and token usage.

use crate::types::{EffectState, ErrorKind, Phase};

/// Response headers, looked up case-insensitively. Small and ordered: model
/// APIs return a handful of headers that matter here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    pairs: Vec<(String, String)>,
}

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Headers { pairs: Vec::new() }
    }

    /// Adds a header (names are stored lower-case).
    pub fn insert(&mut self, name: &str, value: &str) {
        self.pairs.push((name.to_ascii_lowercase(), value.to_string()));
    }

    /// First value for `name`, case-insensitively.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// All pairs, names lower-case.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// True when there are no headers.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut h = Headers::new();
        for (k, v) in iter {
            h.insert(k.as_ref(), v.as_ref());
        }
        h
    }
}

/// One attempt's result as the caller saw it.
///
/// ```
/// use retrywise::{Outcome, ErrorKind, Phase};
/// let a = Outcome::status(503).header("retry-after", "2");
/// let b = Outcome::error(ErrorKind::ConnectTimeout);
/// let c = Outcome::error(ErrorKind::ConnectionReset).phase(Phase::StreamVisible);
/// let ok = Outcome::success();
/// # let _ = (a, b, c, ok);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// Machine error, when the attempt failed below HTTP (or broke mid-body).
    pub error: Option<ErrorKind>,
    /// How far the attempt got; inferred when absent (see [`Outcome::effective_phase`]).
    pub phase: Option<Phase>,
    /// Response headers.
    pub headers: Headers,
    /// Vendor error code or type (`insufficient_quota`, `overloaded_error`, `context_length_exceeded`).
    pub vendor_code: Option<String>,
    /// What the caller knows about the side effect, when it knows something.
    pub effect: Option<EffectState>,
    /// Real input token count, when the upstream reported it (re-runs matching after `context_length_exceeded`).
    pub input_tokens: Option<u64>,
    /// Explicit success regardless of status (e.g. a transport with no status).
    pub ok: bool,
}

impl Outcome {
    /// A successful attempt.
    pub fn success() -> Self {
        Outcome {
            ok: true,
            ..Outcome::default()
        }
    }

    /// A response with this status (2xx and 3xx count as success unless an error is also set).
    pub fn status(status: u16) -> Self {
        Outcome {
            status: Some(status),
            ..Outcome::default()
        }
    }

    /// A machine error with no response.
    pub fn error(kind: ErrorKind) -> Self {
        Outcome {
            error: Some(kind),
            ..Outcome::default()
        }
    }

    /// Adds a response header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Sets the phase the attempt reached.
    pub fn phase(mut self, phase: Phase) -> Self {
        self.phase = Some(phase);
        self
    }

    /// Sets the vendor error code.
    pub fn vendor_code(mut self, code: &str) -> Self {
        self.vendor_code = Some(code.to_string());
        self
    }

    /// Sets the effect state.
    pub fn effect(mut self, effect: EffectState) -> Self {
        self.effect = Some(effect);
        self
    }

    /// Sets the real input token count.
    pub fn input_tokens(mut self, n: u64) -> Self {
        self.input_tokens = Some(n);
        self
    }

    /// True when this outcome is a success.
    pub fn is_success(&self) -> bool {
        if self.error.is_some() {
            return false;
        }
        self.ok || matches!(self.status, Some(s) if (200..400).contains(&s))
    }

    /// The phase given, or the one implied by the evidence: a status means
    /// headers arrived; connect-level errors mean nothing was sent; a timeout
    /// waiting for the first byte or a failed write means the request may have
    /// been received; an idle stream means the stream was open.
    pub fn effective_phase(&self) -> Phase {
        if let Some(p) = self.phase {
            return p;
        }
        match self.error {
            Some(ErrorKind::Dns | ErrorKind::Connect | ErrorKind::Tls | ErrorKind::ConnectTimeout) => Phase::BeforeSend,
            Some(ErrorKind::StreamIdleTimeout) => Phase::StreamOpen,
            Some(
                ErrorKind::Write
                | ErrorKind::FirstByteTimeout
                | ErrorKind::ConnectionReset
                | ErrorKind::Other
                | ErrorKind::DeadlineExceeded
                | ErrorKind::Cancelled,
            ) => {
                if self.status.is_some() {
                    Phase::Headers
                } else {
                    Phase::Sent
                }
            }
            Some(ErrorKind::MalformedResponse) => Phase::Headers,
            None => {
                if self.status.is_some() {
                    Phase::Headers
                } else {
                    Phase::Sent
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_case_insensitive() {
        let o = Outcome::status(429).header("Retry-After", "2");
        assert_eq!(o.headers.get("retry-after"), Some("2"));
        assert_eq!(o.headers.get("RETRY-AFTER"), Some("2"));
        assert_eq!(o.headers.get("x"), None);
    }

    #[test]
    fn success_and_phase_inference() {
        assert!(Outcome::success().is_success());
        assert!(Outcome::status(200).is_success());
        assert!(!Outcome::status(200)
            .phase(Phase::StreamVisible)
            .header("a", "b")
            .with_error()
            .is_success());
        assert_eq!(Outcome::error(ErrorKind::Connect).effective_phase(), Phase::BeforeSend);
        assert_eq!(
            Outcome::error(ErrorKind::FirstByteTimeout).effective_phase(),
            Phase::Sent
        );
        assert_eq!(Outcome::status(503).effective_phase(), Phase::Headers);
    }

    impl Outcome {
        fn with_error(mut self) -> Self {
            self.error = Some(ErrorKind::ConnectionReset);
            self
        }
    }
}

/// Extracts the vendor error code from an OpenAI- or Anthropic-style error
/// body: `error.code`, then `error.type` (`{"error":{"code":"insufficient_quota"}}`,
/// `{"type":"error","error":{"type":"overloaded_error"}}`). Bindings call this
/// so every language reads bodies the same way. Non-JSON bodies give `None`.
pub fn vendor_code_from_body(body: &[u8]) -> Option<String> {
    if body.len() > 1 << 20 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let err = v.get("error")?;
    let pick = |k: &str| {
        err.get(k)
            .and_then(|c| c.as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    pick("code").or_else(|| pick("type"))
}

#[cfg(test)]
mod body_tests {
    use super::vendor_code_from_body as v;

    #[test]
    fn openai_and_anthropic_error_bodies() {
        assert_eq!(
            v(br#"{"error":{"message":"x","type":"insufficient_quota","code":"insufficient_quota"}}"#).as_deref(),
            Some("insufficient_quota")
        );
        assert_eq!(
            v(br#"{"error":{"message":"x","type":"invalid_request_error","code":"context_length_exceeded"}}"#)
                .as_deref(),
            Some("context_length_exceeded")
        );
        assert_eq!(
            v(br#"{"error":{"message":"x","type":"server_error","code":null}}"#).as_deref(),
            Some("server_error")
        );
        assert_eq!(
            v(br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#).as_deref(),
            Some("overloaded_error")
        );
        assert_eq!(v(b"not json"), None);
        assert_eq!(v(br#"{"ok":true}"#), None);
    }
}

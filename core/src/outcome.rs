//! What the caller observed for one attempt: status or machine error, phase,
//! response headers, vendor code, effect state and token usage.

use crate::types::{Continuation, EffectState, ErrorKind, Phase};

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
    /// Output tokens the response reported (its usage): settles the
    /// attempt's reservation against the provider's token limits.
    pub output_tokens: Option<u64>,
    /// Explicit success regardless of status (e.g. a transport with no status).
    pub ok: bool,
    /// A wait the error body asked for (Gemini `RetryInfo`); a header's hint wins over it.
    pub retry_delay: Option<std::time::Duration>,
    /// A stream that broke after visible output can be continued by another
    /// upstream: what it showed is text only (no tool-call delta), and it had
    /// not finished (`wire::Transcript::resumable`).
    pub resumable: bool,
    /// The attempt continued a broken stream, sent this way (what
    /// [`crate::Decision::continuation`] asked for).
    pub continuation: Option<Continuation>,
    /// A streamed answer's first visible output came this long after its
    /// request was sent (a stream gate's first release). Successes that
    /// report it teach the engine the upstream's usual time to first token
    /// (`timeouts.learn`): a later attempt there is left for a fallback
    /// once it stays silent well past that, not after half the time left.
    pub first_token: Option<std::time::Duration>,
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

    /// Sets the time from sending to the first visible output of a stream.
    pub fn first_token(mut self, after: std::time::Duration) -> Self {
        self.first_token = Some(after);
        self
    }

    /// Sets the vendor error code.
    pub fn vendor_code(mut self, code: &str) -> Self {
        self.vendor_code = Some(code.to_string());
        self
    }

    /// Reads what a response body, read whole and decoded, says: the vendor
    /// code of an error body (unless one was given), and whether a non-empty
    /// 2xx body whose `content-type` is JSON parses. One that does not is a
    /// [`ErrorKind::MalformedResponse`]: the upstream answered but nothing
    /// usable came back, which is not a success (for the stats, the breaker,
    /// or an unsafe call's effect). Set the headers first. Bindings call this
    /// with every body they read inside the retry loop.
    ///
    /// ```
    /// use retrywise::{ErrorKind, Outcome};
    /// let o = Outcome::status(200).header("Content-Type", "application/json").body(b"{\"id\":");
    /// assert_eq!(o.error, Some(ErrorKind::MalformedResponse));
    /// let o = Outcome::status(429).body(br#"{"error":{"code":"insufficient_quota"}}"#);
    /// assert_eq!(o.vendor_code.as_deref(), Some("insufficient_quota"));
    /// ```
    pub fn body(mut self, body: &[u8]) -> Self {
        self.read_body(body);
        self
    }

    /// [`Outcome::body`] in place.
    pub fn read_body(&mut self, body: &[u8]) {
        let Some(status) = self.status else { return };
        if status >= 400 {
            let e = crate::bodies::read_error_body(body);
            if self.vendor_code.is_none() {
                self.vendor_code = e.vendor_code;
            }
            self.retry_delay = self.retry_delay.or(e.retry_delay);
            self.input_tokens = self.input_tokens.or(e.input_tokens);
        } else if (200..300).contains(&status)
            && !body.is_empty()
            && self.error.is_none()
            && self.headers.get("content-type").is_some_and(json_media_type)
            // JSON text is UTF-8 (RFC 8259); skipping a value does not check that.
            && std::str::from_utf8(body).map_or(true, |text| serde_json::from_str::<serde::de::IgnoredAny>(text).is_err())
        {
            self.error = Some(ErrorKind::MalformedResponse);
        }
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

    /// Sets the token usage the response reported (input and output): the
    /// attempt's token reservation is settled against it.
    pub fn usage(mut self, input: u64, output: u64) -> Self {
        self.input_tokens = Some(input);
        self.output_tokens = Some(output);
        self
    }

    /// Marks what the broken stream showed as continuable (see [`Outcome::resumable`]).
    pub fn resumable(mut self, yes: bool) -> Self {
        self.resumable = yes;
        self
    }

    /// Marks the attempt as a continuation sent this way (see [`Outcome::continuation`]).
    pub fn continuation(mut self, how: Continuation) -> Self {
        self.continuation = Some(how);
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

/// The media type of a `content-type` value: before any parameter, trimmed.
pub(crate) fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// Whether `content_type` names JSON: `application/json` or any `+json`
/// subtype, parameters ignored. [`Outcome::read_body`] judges only such
/// bodies; bindings ask this before reading a success body whole.
pub fn json_media_type(content_type: &str) -> bool {
    let m = media_type(content_type);
    m.eq_ignore_ascii_case("application/json")
        || m.split_once('/')
            .is_some_and(|(_, sub)| sub.len() > 5 && sub.as_bytes()[sub.len() - 5..].eq_ignore_ascii_case(b"+json"))
}

/// The vendor error code of an error body (see [`crate::bodies`] for the
/// shapes read: OpenAI, Azure OpenAI, Anthropic, Gemini). Bindings call this
/// so every language reads bodies the same way. Non-JSON bodies give `None`.
pub fn vendor_code_from_body(body: &[u8]) -> Option<String> {
    crate::bodies::read_error_body(body).vendor_code
}

#[cfg(test)]
mod body_tests {
    use super::vendor_code_from_body as v;
    use super::{json_media_type as is_json, Outcome};
    use crate::types::ErrorKind;

    #[test]
    fn a_json_success_that_does_not_parse_is_malformed() {
        let json = |status: u16, ct: &str, body: &[u8]| Outcome::status(status).header("content-type", ct).body(body);
        for ct in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/problem+json",
        ] {
            assert_eq!(
                json(200, ct, br#"{"id":"x","choices":[{"#).error,
                Some(ErrorKind::MalformedResponse),
                "{ct}"
            );
            // No body (HEAD, 204) is nothing to judge.
            assert_eq!(json(200, ct, b"").error, None, "{ct}: empty");
            assert_eq!(json(201, ct, br#"{"id":"x"}"#).error, None, "{ct}");
            assert!(json(200, ct, b" [1, 2] ").is_success());
            let bad_utf8 = json(200, ct, b"{\"id\":\"\xff\xfe\"}").error;
            assert_eq!(bad_utf8, Some(ErrorKind::MalformedResponse), "{ct}: not UTF-8");
        }
        // Not JSON by its type, a redirect, an error already reported: left alone.
        for (status, ct) in [
            (200, "text/plain"),
            (200, "text/event-stream"),
            (200, "json"),
            (302, "application/json"),
        ] {
            assert_eq!(json(status, ct, b"{garbled").error, None, "{status} {ct}");
        }
        let o = Outcome::status(200).body(b"{garbled");
        assert!(o.is_success(), "no content-type: not judged");
        let mut o = Outcome::status(200).header("content-type", "application/json");
        o.error = Some(ErrorKind::ConnectionReset);
        assert_eq!(o.body(b"{").error, Some(ErrorKind::ConnectionReset));
        assert!(!is_json("+json") && !is_json("a+json") && !is_json("a/+json") && is_json("a/b+json"));
        assert!(
            !is_json("application/é+jsonx") && is_json("application/é+json"),
            "non-ASCII never splits a char"
        );
    }

    #[test]
    fn an_error_body_gives_its_vendor_code_unless_one_was_given() {
        let quota = br#"{"error":{"code":"insufficient_quota"}}"#;
        assert_eq!(
            Outcome::status(429).body(quota).vendor_code.as_deref(),
            Some("insufficient_quota")
        );
        assert_eq!(
            Outcome::status(429).vendor_code("x").body(quota).vendor_code.as_deref(),
            Some("x")
        );
        assert_eq!(Outcome::status(200).body(quota).vendor_code, None);
        assert_eq!(Outcome::error(ErrorKind::Connect).body(quota).vendor_code, None);
    }

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

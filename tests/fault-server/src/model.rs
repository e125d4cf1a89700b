//! Faults chosen by the request's `model` name: the sixteen failures of the public
//! failover methodology, one model name each, and an enforced provider rate limit.
//!
//! A model name is the one field an SDK client, a transport and a policy's upstream
//! catalog all carry per request, so selecting the fault by model lets one client
//! reach every fault (and a healthy fallback) just by changing `model`, and lets a
//! transport's fallback really land on a different fault or a healthy model.
//!
//! Grammar: `fb-<name>(:<key>=<value>)*`, e.g. `fb-stream-cut:k=3:id=t7`. Values
//! have no `:` and no whitespace. Unknown names or keys are errors, so a typo fails
//! loudly instead of answering as a healthy model.

use std::fmt;

pub use crate::ratelimit::Mode;
use crate::spec::{SpecError, MAX_WAIT_MS};

/// Every fault model name starts with this; other model names answer as before.
pub const PREFIX: &str = "fb-";

/// Upper bound for `words=`: an answer stays a few KiB.
pub const MAX_WORDS: u32 = 1000;

/// Upper bound for `window=` (one hour).
pub const MAX_WINDOW_MS: u64 = 3_600_000;

/// Upper bound for `k=`: a stream never has more content deltas than an answer words.
pub const MAX_K: u32 = MAX_WORDS + 1;

/// The fault a model name selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `fb-429-retry-after`: 429 with `retry-after`.
    RateLimitHinted,
    /// `fb-429`: 429 without any retry hint.
    RateLimit,
    /// `fb-500-once`: 500, then healthy.
    ServerErrorOnce,
    /// `fb-503`: 503 (or `status=`) on every request.
    Unavailable,
    /// `fb-reset`: TCP reset after the request arrived, before any response byte.
    Reset,
    /// `fb-silent`: the request is read and never answered.
    Silent,
    /// `fb-slow-first-token`: headers and the stream preamble at once, then a long
    /// pause before the first content delta.
    SlowFirstToken,
    /// `fb-stream-cut`: `k` content deltas, then the connection is aborted.
    StreamCut,
    /// `fb-stream-stall`: `k` content deltas, then silence on an open connection.
    StreamStall,
    /// `fb-malformed-sse`: a `data:` line that is not JSON after `k` deltas.
    MalformedSse,
    /// `fb-no-done`: a complete stream that ends without its terminator.
    NoDone,
    /// `fb-context-length`: 400 context length exceeded.
    ContextLength,
    /// `fb-content-filter`: 400 refused by the provider's content filter.
    ContentFilter,
    /// `fb-no-prefill`: healthy, but 400 when the last message is the assistant's.
    NoPrefill,
    /// `fb-flap`: 503 for a window from its first request, then healthy.
    Flap,
    /// `fb-ok`: healthy; names itself in its answer and returns usage.
    Ok,
    /// `fb-ratelimit`: a real request limit per model name; every answer states it
    /// in one provider's rate-limit headers, requests over it get 429.
    RateLimitWindow,
}

/// Whose rate-limit headers `fb-ratelimit` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `x-ratelimit-{limit,remaining,reset}-requests`, reset as a Go duration.
    OpenAi,
    /// `anthropic-ratelimit-requests-{limit,remaining,reset}`, reset as RFC 3339.
    Anthropic,
    /// IETF `RateLimit-Policy` and `RateLimit` (draft 08+), seconds.
    Ietf,
    /// Azure OpenAI: `x-ratelimit-remaining-requests` only; a 429 adds `retry-after-ms`.
    Azure,
    /// Gemini: no rate-limit headers; a 429's body carries `RetryInfo.retryDelay`.
    Gemini,
}

/// Parameters a kind accepts besides the common `id=` and `words=`.
struct Entry {
    name: &'static str,
    kind: Kind,
    keys: &'static [&'static str],
    /// Requests per counter that get the fault; `None` = every request.
    times: Option<u32>,
}

/// The model table, in the methodology's order (README documents the same table).
const TABLE: &[Entry] = &[
    entry("429-retry-after", Kind::RateLimitHinted, &["n", "ra"], Some(1)),
    entry("429", Kind::RateLimit, &["n"], Some(1)),
    entry("500-once", Kind::ServerErrorOnce, &["n"], Some(1)),
    entry("503", Kind::Unavailable, &["n", "status"], None),
    entry("reset", Kind::Reset, &["n"], Some(1)),
    entry("silent", Kind::Silent, &["n"], None),
    entry("slow-first-token", Kind::SlowFirstToken, &["n", "ms", "after"], None),
    entry("stream-cut", Kind::StreamCut, &["n", "k", "end"], None),
    entry("stream-stall", Kind::StreamStall, &["n", "k"], None),
    entry("malformed-sse", Kind::MalformedSse, &["n", "k"], None),
    entry("no-done", Kind::NoDone, &["n"], None),
    entry("context-length", Kind::ContextLength, &["n"], None),
    entry("content-filter", Kind::ContentFilter, &["n", "code", "reason"], None),
    entry("no-prefill", Kind::NoPrefill, &["resend"], None),
    entry("flap", Kind::Flap, &["down", "status"], None),
    entry("ok", Kind::Ok, &["resend"], None),
    entry(
        "ratelimit",
        Kind::RateLimitWindow,
        &["rpm", "window", "family", "mode"],
        None,
    ),
];

const fn entry(name: &'static str, kind: Kind, keys: &'static [&'static str], times: Option<u32>) -> Entry {
    Entry {
        name,
        kind,
        keys,
        times,
    }
}

/// Keys every model accepts.
const COMMON_KEYS: &[&str] = &["id", "words"];

/// Which OpenAI content-filter error shape `fb-content-filter` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterCode {
    /// Azure OpenAI's `content_filter` with `innererror.content_filter_result`.
    ContentFilter,
    /// OpenAI's `content_policy_violation`.
    ContentPolicyViolation,
}

/// How `fb-stream-cut` ends a streamed answer after its `k` deltas (`end=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutEnd {
    /// `cut` (the default): the connection is aborted.
    Abort,
    /// `error`: the vendor's in-stream error event, then a clean end of body.
    ErrorEvent,
    /// `close`: a clean end of body with no finish and no terminator, as a
    /// close-delimited body or a proxy that ends its stream when the upstream drops.
    Close,
}

/// A parsed fault model name with every parameter resolved to its value or default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFault {
    pub kind: Kind,
    /// The table name without the prefix, e.g. `stream-cut`.
    pub name: &'static str,
    /// `n=`: how many requests per counter get the fault; `None` = all.
    pub times: Option<u32>,
    /// `ra=`: the `retry-after` value, verbatim (default `1`).
    pub retry_after: String,
    /// `ms=`: the first-token pause (default 15 000 ms).
    pub first_token_ms: u64,
    /// `after=`: the first this many requests to the model name (since start or
    /// the last reset, whatever their logical request) answer at once; the fault
    /// applies from the next one on (default 0: from the first).
    pub after: u32,
    /// `k=`: content deltas before the break (default 2).
    pub k: u32,
    /// `end=`: how a streamed cut ends after its `k` deltas (default: aborted).
    pub end: CutEnd,
    /// `status=`: the status of `fb-503` and `fb-flap` (default 503).
    pub status: u16,
    /// `down=`: how long `fb-flap` is down, from its first request (default 60 000 ms).
    pub down_ms: u64,
    pub filter_code: FilterCode,
    /// `reason=`: the content filter's category, named in the error message.
    pub reason: String,
    /// `words=`: words after the answer's header (default 6).
    pub words: u32,
    /// `resend=1`: a continuation answer repeats the delivered prefix before the
    /// rest, as a model that ignored the instruction would (to test deduplication).
    pub resend: bool,
    /// `rpm=`: requests `fb-ratelimit` admits per window (default 60).
    pub limit: u32,
    /// `window=`: the `fb-ratelimit` window in ms (default 60 000).
    pub window_ms: u64,
    /// `family=`: whose rate-limit headers (default `openai`).
    pub family: Family,
    /// `mode=`: fixed windows (default), a sliding window or a token bucket.
    pub mode: Mode,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = TABLE.iter().find(|e| e.kind == *self).map_or("?", |e| e.name);
        write!(f, "{PREFIX}{name}")
    }
}

/// Whether a model name asks for a fault model (it may still fail to parse).
pub fn is_fault_model(model: &str) -> bool {
    model.starts_with(PREFIX)
}

fn err<T>(model: &str, msg: impl fmt::Display) -> Result<T, SpecError> {
    Err(SpecError(format!("model {model:?}: {msg}")))
}

fn num<T: std::str::FromStr>(model: &str, key: &str, raw: &str) -> Result<T, SpecError> {
    raw.parse()
        .or_else(|_| err(model, format!("`{key}` must be a number, got {raw:?}")))
}

impl ModelFault {
    /// Parses `fb-<name>(:<key>=<value>)*`.
    pub fn parse(model: &str) -> Result<Self, SpecError> {
        let Some(rest) = model.strip_prefix(PREFIX) else {
            return err(model, format!("a fault model starts with {PREFIX:?}"));
        };
        if model.chars().any(char::is_whitespace) {
            return err(model, "a fault model has no whitespace");
        }
        let mut parts = rest.split(':');
        let name = parts.next().unwrap_or_default();
        let Some(entry) = TABLE.iter().find(|e| e.name == name) else {
            let names: Vec<String> = TABLE.iter().map(|e| format!("{PREFIX}{}", e.name)).collect();
            return err(
                model,
                format!("unknown fault model; expected one of {}", names.join(", ")),
            );
        };
        let mut fault = ModelFault {
            kind: entry.kind,
            name: entry.name,
            times: entry.times,
            retry_after: "1".into(),
            first_token_ms: 15_000,
            after: 0,
            k: 2,
            end: CutEnd::Abort,
            status: 503,
            down_ms: 60_000,
            filter_code: FilterCode::ContentFilter,
            reason: "hate".into(),
            words: 6,
            resend: false,
            limit: 60,
            window_ms: 60_000,
            family: Family::OpenAi,
            mode: Mode::Fixed,
        };
        let mut seen: Vec<&str> = Vec::new();
        for param in parts {
            let Some((key, value)) = param.split_once('=') else {
                return err(model, format!("expected `key=value`, got {param:?}"));
            };
            if !entry.keys.contains(&key) && !COMMON_KEYS.contains(&key) {
                let mut keys: Vec<&str> = entry.keys.to_vec();
                keys.extend_from_slice(COMMON_KEYS);
                return err(
                    model,
                    format!("`{PREFIX}{name}` takes no `{key}`; keys: {}", keys.join(", ")),
                );
            }
            if seen.contains(&key) {
                return err(model, format!("`{key}` given twice"));
            }
            seen.push(key);
            if value.is_empty() {
                return err(model, format!("`{key}` has an empty value"));
            }
            fault.set(model, key, value)?;
        }
        Ok(fault)
    }

    fn set(&mut self, model: &str, key: &str, value: &str) -> Result<(), SpecError> {
        match key {
            "id" => {}
            "n" => {
                self.times = match value {
                    "always" => None,
                    v => Some(num(model, key, v)?),
                }
            }
            "ra" => {
                if !value.bytes().all(|b| (0x21..0x7f).contains(&b)) {
                    return err(model, format!("`ra` must be visible ASCII, got {value:?}"));
                }
                value.clone_into(&mut self.retry_after);
            }
            "ms" | "down" => {
                let ms: u64 = num(model, key, value)?;
                if ms > MAX_WAIT_MS {
                    return err(model, format!("`{key}` must be <= {MAX_WAIT_MS}, got {ms}"));
                }
                if key == "ms" {
                    self.first_token_ms = ms;
                } else {
                    self.down_ms = ms;
                }
            }
            "window" => {
                self.window_ms = num(model, key, value)?;
                if !(1..=MAX_WINDOW_MS).contains(&self.window_ms) {
                    return err(model, format!("`window` must be 1..={MAX_WINDOW_MS}, got {value}"));
                }
            }
            "rpm" => {
                self.limit = num(model, key, value)?;
                if self.limit == 0 {
                    return err(model, "`rpm` must be at least 1");
                }
            }
            "family" => {
                self.family = match value {
                    "openai" => Family::OpenAi,
                    "anthropic" => Family::Anthropic,
                    "ietf" => Family::Ietf,
                    "azure" => Family::Azure,
                    "gemini" => Family::Gemini,
                    v => {
                        return err(
                            model,
                            format!("`family` is `openai`, `anthropic`, `ietf`, `azure` or `gemini`, got {v:?}"),
                        )
                    }
                }
            }
            "mode" => {
                self.mode = match value {
                    "fixed" => Mode::Fixed,
                    "sliding" => Mode::Sliding,
                    "bucket" => Mode::Bucket,
                    v => return err(model, format!("`mode` is `fixed`, `sliding` or `bucket`, got {v:?}")),
                }
            }
            "after" => self.after = num(model, key, value)?,
            "k" => {
                self.k = num(model, key, value)?;
                if self.k > MAX_K {
                    return err(model, format!("`k` must be <= {MAX_K}, got {}", self.k));
                }
            }
            "end" => match value {
                "cut" => self.end = CutEnd::Abort,
                "error" => self.end = CutEnd::ErrorEvent,
                "close" => self.end = CutEnd::Close,
                v => return err(model, format!("`end` is `cut`, `error` or `close`, got {v:?}")),
            },
            "status" => {
                self.status = num(model, key, value)?;
                if !(400..=599).contains(&self.status) {
                    return err(model, format!("`status` must be 400..=599, got {}", self.status));
                }
            }
            "code" => match value {
                "content_filter" => self.filter_code = FilterCode::ContentFilter,
                "content_policy_violation" => self.filter_code = FilterCode::ContentPolicyViolation,
                v => {
                    return err(
                        model,
                        format!("`code` is `content_filter` or `content_policy_violation`, got {v:?}"),
                    )
                }
            },
            "reason" => value.clone_into(&mut self.reason),
            "words" => {
                self.words = num(model, key, value)?;
                if self.words == 0 || self.words > MAX_WORDS {
                    return err(model, format!("`words` must be 1..={MAX_WORDS}, got {}", self.words));
                }
            }
            "resend" => match value {
                "0" => self.resend = false,
                "1" => self.resend = true,
                v => return err(model, format!("`resend` is 0 or 1, got {v:?}")),
            },
            _ => return err(model, format!("unknown key `{key}`")),
        }
        Ok(())
    }

    /// Whether the request that had `prior` predecessors on its counter gets the fault.
    pub fn fires(&self, prior: u32) -> bool {
        self.times.is_none_or(|n| prior < n)
    }

    /// Whether the request that had `earlier` predecessors to its model name
    /// (any logical request) is past `after=`'s healthy start.
    pub fn past_after(&self, earlier: u32) -> bool {
        earlier >= self.after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_name_parses_with_its_defaults() {
        for e in TABLE {
            let m = ModelFault::parse(&format!("{PREFIX}{}", e.name)).expect(e.name);
            assert_eq!((m.kind, m.name, m.times), (e.kind, e.name, e.times));
            assert_eq!((m.k, m.words, m.status, m.down_ms), (2, 6, 503, 60_000));
            assert_eq!(m.kind.to_string(), format!("{PREFIX}{}", e.name));
        }
        assert_eq!(TABLE.len(), 17, "the methodology's sixteen faults and the rate limit");
    }

    #[test]
    fn readme_documents_every_fault_model_in_table_order() {
        let readme = include_str!("../README.md");
        for (i, e) in TABLE.iter().enumerate() {
            let row = format!("| {} | `{PREFIX}{}` |", i + 1, e.name);
            assert!(readme.contains(&row), "README lacks the row {row:?}");
        }
    }

    #[test]
    fn parameters() {
        let m = ModelFault::parse("fb-stream-cut:k=3:end=error:id=x:words=9").unwrap();
        assert_eq!(
            (m.kind, m.k, m.end, m.words),
            (Kind::StreamCut, 3, CutEnd::ErrorEvent, 9)
        );
        assert_eq!(ModelFault::parse("fb-stream-cut:end=close").unwrap().end, CutEnd::Close);
        assert_eq!(ModelFault::parse("fb-stream-cut").unwrap().end, CutEnd::Abort);
        let m = ModelFault::parse("fb-429-retry-after:ra=2.5:n=always").unwrap();
        assert_eq!((m.retry_after.as_str(), m.times), ("2.5", None));
        let m = ModelFault::parse("fb-500-once:n=3").unwrap();
        assert_eq!(m.times, Some(3));
        assert!(m.fires(2) && !m.fires(3));
        let m = ModelFault::parse("fb-slow-first-token:after=20:ms=500").unwrap();
        assert_eq!((m.after, m.first_token_ms), (20, 500));
        assert!(!m.past_after(19) && m.past_after(20));
        assert_eq!(ModelFault::parse("fb-slow-first-token").unwrap().after, 0);
        assert!(ModelFault::parse("fb-slow-first-token").unwrap().past_after(0));
        let m = ModelFault::parse("fb-flap:down=1500:status=529").unwrap();
        assert_eq!((m.down_ms, m.status), (1500, 529));
        let m = ModelFault::parse("fb-content-filter:code=content_policy_violation:reason=violence").unwrap();
        assert_eq!(
            (m.filter_code, m.reason.as_str()),
            (FilterCode::ContentPolicyViolation, "violence")
        );
        assert!(ModelFault::parse("fb-ok:resend=1").unwrap().resend);
        let m = ModelFault::parse("fb-ratelimit").unwrap();
        assert_eq!(
            (m.limit, m.window_ms, m.family, m.mode),
            (60, 60_000, Family::OpenAi, Mode::Fixed)
        );
        let m = ModelFault::parse("fb-ratelimit:rpm=5:window=2000:family=anthropic:mode=sliding").unwrap();
        assert_eq!(
            (m.limit, m.window_ms, m.family, m.mode),
            (5, 2000, Family::Anthropic, Mode::Sliding)
        );
        assert_eq!(
            ModelFault::parse("fb-ratelimit:family=ietf").unwrap().family,
            Family::Ietf
        );
    }

    #[test]
    fn rejects_typos() {
        for bad in [
            "fb-",
            "fb-nope",
            "fb-ok:k=2",
            "fb-ok:after=1",
            "fb-slow-first-token:after=x",
            "fb-slow-first-token:after=-1",
            "fb-stream-cut:k",
            "fb-stream-cut:k=",
            "fb-stream-cut:k=x",
            "fb-stream-cut:k=2:k=3",
            "fb-stream-cut:end=later",
            "fb-503:status=200",
            "fb-flap:down=999999",
            "fb-ok:words=0",
            "fb-ok id=1",
            "fb-ratelimit:rpm=0",
            "fb-ratelimit:window=0",
            "fb-ratelimit:mode=token",
            "fb-ratelimit:family=google",
            "fb-ratelimit:family=bedrock",
            "gpt-4o",
        ] {
            assert!(ModelFault::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}

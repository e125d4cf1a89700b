//! Fault specs: the `<spec>` segment of `/s/<spec>/...` request paths.
//!
//! A spec is carried in the URL path (not a header or a body field) so that an
//! unmodified SDK pointed at `base_url = http://127.0.0.1:PORT/s/<spec>/v1` gets the
//! fault on every request it sends, retries included, without any test hook inside
//! the SDK. Parameters are `:`-separated because `:` survives SDK URL joining intact.

use std::fmt;
use std::str::FromStr;

/// Text deltas of a complete stream answered for a path spec: `"c1 "`, `"c2 "`, `"c3 "`.
pub const STREAM_DELTAS: u32 = 3;

/// Frames of a complete path-spec stream: the preamble, the deltas, the finish.
pub const STREAM_CHUNKS: u32 = STREAM_DELTAS + 2;

/// Upper bound for every waiting parameter (`delay`, `slow-sse` gaps). It matches the
/// `hang` cap: a test that needs a longer wait than this is waiting on the wrong thing.
pub const MAX_WAIT_MS: u64 = 120_000;

/// Upper bound for `write-cut:<kib>`: below the largest request body read.
pub const MAX_WRITE_CUT_KIB: u32 = 16 * 1024;

/// Upper bound for `sse-cut:<n>`, so a typo cannot make one response unbounded.
pub const MAX_CUT_CHUNKS: u32 = 10_000;

/// Upper bound for the steps of `seq:<spec>,<spec>,...`.
pub const MAX_SEQ_STEPS: usize = 64;

/// One parsed fault spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// `ok`: a valid response (JSON, or SSE when the request asked to stream).
    Ok,
    /// `status:<code>[:<vendor_code>]`: always this status with a vendor error body.
    Status { code: u16, vendor_code: Option<String> },
    /// `flaky:<n>:<code>[:<vendor_code>]`: the first `n` requests of each logical
    /// request get `code`, later ones behave like `ok`.
    Flaky {
        failures: u32,
        code: u16,
        vendor_code: Option<String>,
    },
    /// `ra-secs:<v>`, `ra-date:<secs>`, `ra-ms:<v>`, each with optional `:then-ok`
    /// and an optional status (default 429, e.g. `ra-secs:1:503`): an error carrying
    /// a Retry-After hint.
    RetryAfter {
        hint: RetryAfterHint,
        then_ok: bool,
        status: u16,
    },
    /// `hang`: read the request, never answer (capped at [`MAX_WAIT_MS`]).
    Hang,
    /// `drop`: read the request, close the connection without a response.
    Drop,
    /// `write-cut:<kib>`: close the connection once `kib` KiB of the request
    /// body arrived, while the client is still writing it.
    WriteCut { kib: u32 },
    /// `malformed`: 200 `application/json` whose body is not valid JSON.
    Malformed,
    /// `sse-cut:<n>`: an SSE stream cut after `n` chunks, without a terminator.
    SseCut { chunks: u32 },
    /// `slow-sse:<gap_ms>[:<fast>]`: a complete SSE stream with pauses between
    /// chunks, the first `fast` chunks (1..=5, default 1) sent back to back.
    SlowSse { gap_ms: u64, fast: u32 },
    /// `delay:<ms>`: wait, then behave like `ok`.
    Delay { ms: u64 },
    /// `seq:<spec>,<spec>,...`: the n-th request of each logical request gets the
    /// n-th spec (each step answers as on a first request); requests after the
    /// last step behave like `ok`. Steps cannot be `seq` themselves.
    Seq(Vec<Fault>),
}

/// The three Retry-After forms upstreams send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryAfterHint {
    /// `retry-after: <v>` with `v` sent verbatim (decimal, negative or garbage
    /// values are deliberately allowed so clients' validation can be tested).
    Secs(String),
    /// `retry-after: <IMF-fixdate>` this many seconds from the time of the response
    /// (negative means in the past).
    Date(i64),
    /// `retry-after-ms: <v>`, verbatim like [`RetryAfterHint::Secs`].
    Ms(String),
}

/// Why a spec could not be parsed; the message is sent back in a 400 body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

fn err<T>(msg: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError(msg.into()))
}

fn parse_num<T: FromStr>(spec: &str, what: &str, raw: &str) -> Result<T, SpecError> {
    raw.parse()
        .or_else(|_| err(format!("{spec}: {what} must be a number, got {raw:?}")))
}

fn parse_status(spec: &str, raw: &str) -> Result<u16, SpecError> {
    let code: u16 = parse_num(spec, "status code", raw)?;
    // 1xx are not final responses and would break the HTTP exchange itself.
    if !(200..=599).contains(&code) {
        return err(format!("{spec}: status code must be in 200..=599, got {code}"));
    }
    Ok(code)
}

fn parse_wait(spec: &str, what: &str, raw: &str) -> Result<u64, SpecError> {
    let ms: u64 = parse_num(spec, what, raw)?;
    if ms > MAX_WAIT_MS {
        return err(format!("{spec}: {what} must be <= {MAX_WAIT_MS}, got {ms}"));
    }
    Ok(ms)
}

fn vendor_code(spec: &str, raw: Option<&&str>) -> Result<Option<String>, SpecError> {
    match raw {
        None => Ok(None),
        Some(&"") => err(format!("{spec}: empty vendor code")),
        Some(v) => Ok(Some((*v).to_owned())),
    }
}

/// A verbatim header value must still be a legal one, or hyper would refuse it.
fn header_text(spec: &str, raw: &str) -> Result<String, SpecError> {
    if raw.is_empty() || !raw.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return err(format!(
            "{spec}: header value must be non-empty visible ASCII, got {raw:?}"
        ));
    }
    Ok(raw.to_owned())
}

impl FromStr for Fault {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<Self, SpecError> {
        if let Some(steps) = spec.strip_prefix("seq:") {
            let steps: Vec<&str> = steps.split(',').collect();
            if steps.len() > MAX_SEQ_STEPS {
                return err(format!("{spec}: at most {MAX_SEQ_STEPS} steps, got {}", steps.len()));
            }
            let mut out = Vec::with_capacity(steps.len());
            for step in steps {
                if step.is_empty() || step == "seq" || step.starts_with("seq:") {
                    return err(format!(
                        "{spec}: each step must be a non-empty spec other than seq, got {step:?}"
                    ));
                }
                out.push(step.parse::<Fault>()?);
            }
            return Ok(Fault::Seq(out));
        }
        let parts: Vec<&str> = spec.split(':').collect();
        let kind = parts.first().copied().unwrap_or_default();
        let args = parts.get(1..).unwrap_or_default();
        let arity = |min: usize, max: usize| -> Result<(), SpecError> {
            if args.len() < min || args.len() > max {
                return err(format!(
                    "{spec}: `{kind}` takes {min}..={max} parameter(s), got {}",
                    args.len()
                ));
            }
            Ok(())
        };
        match kind {
            "ok" => arity(0, 0).map(|()| Fault::Ok),
            "hang" => arity(0, 0).map(|()| Fault::Hang),
            "drop" => arity(0, 0).map(|()| Fault::Drop),
            "write-cut" => {
                arity(1, 1)?;
                let kib: u32 = parse_num(spec, "KiB", args[0])?;
                if kib == 0 || kib > MAX_WRITE_CUT_KIB {
                    return err(format!("{spec}: KiB must be 1..={MAX_WRITE_CUT_KIB}, got {kib}"));
                }
                Ok(Fault::WriteCut { kib })
            }
            "malformed" => arity(0, 0).map(|()| Fault::Malformed),
            "status" => {
                arity(1, 2)?;
                Ok(Fault::Status {
                    code: parse_status(spec, args[0])?,
                    vendor_code: vendor_code(spec, args.get(1))?,
                })
            }
            "flaky" => {
                arity(2, 3)?;
                Ok(Fault::Flaky {
                    failures: parse_num(spec, "failure count", args[0])?,
                    code: parse_status(spec, args[1])?,
                    vendor_code: vendor_code(spec, args.get(2))?,
                })
            }
            "ra-secs" | "ra-date" | "ra-ms" => {
                arity(1, 3)?;
                // After the value: `then-ok` and/or a status code, each at most once.
                let (mut then_ok, mut status) = (false, None);
                for extra in &args[1..] {
                    match *extra {
                        "then-ok" if !then_ok => then_ok = true,
                        code if status.is_none() && code.bytes().all(|b| b.is_ascii_digit()) => {
                            status = Some(parse_status(spec, code)?);
                        }
                        other => {
                            return err(format!("{spec}: expected `then-ok` or a status code, got {other:?}"));
                        }
                    }
                }
                let hint = match kind {
                    "ra-secs" => RetryAfterHint::Secs(header_text(spec, args[0])?),
                    "ra-ms" => RetryAfterHint::Ms(header_text(spec, args[0])?),
                    _ => RetryAfterHint::Date(parse_num(spec, "seconds", args[0])?),
                };
                Ok(Fault::RetryAfter {
                    hint,
                    then_ok,
                    status: status.unwrap_or(429),
                })
            }
            "sse-cut" => {
                arity(1, 1)?;
                let chunks: u32 = parse_num(spec, "chunk count", args[0])?;
                if chunks > MAX_CUT_CHUNKS {
                    return err(format!("{spec}: chunk count must be <= {MAX_CUT_CHUNKS}, got {chunks}"));
                }
                Ok(Fault::SseCut { chunks })
            }
            "slow-sse" => {
                arity(1, 2)?;
                let fast: u32 = match args.get(1) {
                    Some(a) => parse_num(spec, "fast chunk count", a)?,
                    None => 1,
                };
                if fast == 0 || fast > STREAM_CHUNKS {
                    return err(format!(
                        "{spec}: fast chunk count must be 1..={STREAM_CHUNKS}, got {fast}"
                    ));
                }
                Ok(Fault::SlowSse {
                    gap_ms: parse_wait(spec, "gap_ms", args[0])?,
                    fast,
                })
            }
            "delay" => {
                arity(1, 1)?;
                Ok(Fault::Delay {
                    ms: parse_wait(spec, "ms", args[0])?,
                })
            }
            _ => err(format!(
                "unknown fault spec {spec:?}; expected one of ok, status, flaky, ra-secs, \
                 ra-date, ra-ms, hang, drop, write-cut, malformed, sse-cut, slow-sse, delay, seq"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        let cases = [
            ("ok", Fault::Ok),
            ("hang", Fault::Hang),
            ("drop", Fault::Drop),
            ("malformed", Fault::Malformed),
            (
                "status:503",
                Fault::Status {
                    code: 503,
                    vendor_code: None,
                },
            ),
            (
                "status:429:insufficient_quota",
                Fault::Status {
                    code: 429,
                    vendor_code: Some("insufficient_quota".into()),
                },
            ),
            (
                "flaky:2:503",
                Fault::Flaky {
                    failures: 2,
                    code: 503,
                    vendor_code: None,
                },
            ),
            (
                "ra-secs:1.5",
                Fault::RetryAfter {
                    hint: RetryAfterHint::Secs("1.5".into()),
                    then_ok: false,
                    status: 429,
                },
            ),
            (
                "ra-date:-3:then-ok",
                Fault::RetryAfter {
                    hint: RetryAfterHint::Date(-3),
                    then_ok: true,
                    status: 429,
                },
            ),
            (
                "ra-ms:250:then-ok",
                Fault::RetryAfter {
                    hint: RetryAfterHint::Ms("250".into()),
                    then_ok: true,
                    status: 429,
                },
            ),
            (
                "ra-secs:1:503",
                Fault::RetryAfter {
                    hint: RetryAfterHint::Secs("1".into()),
                    then_ok: false,
                    status: 503,
                },
            ),
            (
                "ra-secs:1:503:then-ok",
                Fault::RetryAfter {
                    hint: RetryAfterHint::Secs("1".into()),
                    then_ok: true,
                    status: 503,
                },
            ),
            (
                "seq:ra-secs:1,hang,sse-cut:2",
                Fault::Seq(vec![
                    Fault::RetryAfter {
                        hint: RetryAfterHint::Secs("1".into()),
                        then_ok: false,
                        status: 429,
                    },
                    Fault::Hang,
                    Fault::SseCut { chunks: 2 },
                ]),
            ),
            ("sse-cut:2", Fault::SseCut { chunks: 2 }),
            ("slow-sse:50", Fault::SlowSse { gap_ms: 50, fast: 1 }),
            ("slow-sse:50:2", Fault::SlowSse { gap_ms: 50, fast: 2 }),
            ("write-cut:64", Fault::WriteCut { kib: 64 }),
            ("delay:10", Fault::Delay { ms: 10 }),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Fault>(), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "",
            "nope",
            "ok:1",
            "status",
            "status:abc",
            "status:150",
            "status:503:",
            "flaky:2",
            "ra-secs:1:later",
            "ra-secs:1:503:503",
            "ra-secs:1:then-ok:then-ok",
            "ra-secs:1:99",
            "seq:",
            "seq:ok,,ok",
            "seq:ok,seq:ok",
            "seq:nope",
            "ra-date:soon",
            "delay:999999",
            "slow-sse:10:6",
            "slow-sse:10:0",
            "write-cut:0",
            "write-cut:99999",
            "write-cut",
            "slow-sse:10:1:1",
            "sse-cut:99999999",
        ] {
            assert!(bad.parse::<Fault>().is_err(), "{bad:?} should be rejected");
        }
    }
}

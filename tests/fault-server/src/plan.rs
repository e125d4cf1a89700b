//! What one request is answered with, decided before any waiting so the record
//! can say what the client was sent. Path specs and fault models both come down to
//! a [`Plan`]; the service then carries it out in whichever wire shape applies.

use std::time::{Duration, SystemTime};

use crate::model::{CutEnd, Family, FilterCode, Kind, ModelFault};
use crate::ratelimit::Slot;
use crate::spec::{Fault, RetryAfterHint};

/// Why an error response is sent; the service renders it in the request's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// An injected status with the vendor's generic body.
    Injected {
        vendor_code: Option<String>,
    },
    ContextLength,
    ContentFilter {
        code: FilterCode,
        reason: String,
    },
    PrefillRejected,
    /// Over `fb-ratelimit`'s request limit: the provider's rate-limit error.
    RateLimited {
        limit: u32,
        retry_after_s: u64,
        /// Whose body: Gemini's carries `RetryInfo` (and no header says when).
        family: Family,
    },
    /// A trailing assistant message that continues no fault model's answer exactly.
    ContinuationMismatch(String),
}

/// How an answer deviates from a healthy one. Frames are counted from the start
/// of the stream: frame 0 is the preamble (stream open, no visible output), frame
/// `i >= 1` the `i`-th content delta, the last frame the finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Script {
    Healthy,
    /// Pause `gap` before every frame from frame `fast` on (`slow-sse`).
    Gaps {
        gap: Duration,
        fast: u32,
    },
    /// Pause before the first content delta; a JSON answer waits before its headers.
    FirstToken(Duration),
    /// Send only the first `frames` frames (never the finish), then break.
    Break {
        frames: usize,
        how: Break,
    },
    /// Insert an event that is not JSON after `frames` frames, then go on.
    Malformed {
        frames: usize,
    },
    /// A complete stream without its end marker.
    NoTerminator,
}

/// How a [`Script::Break`] ends the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    /// Abort the connection.
    Cut,
    /// Send the vendor's in-stream error event, then end the body cleanly.
    ErrorEvent,
    /// End the body cleanly (no finish, no terminator).
    Close,
    /// Keep the connection open and send nothing more.
    Stall,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// A 200 answer after `delay`: JSON, or SSE when the request streams or
    /// `always_sse` (the path specs `sse-cut` and `slow-sse` stream regardless).
    Answer {
        delay: Duration,
        script: Script,
        always_sse: bool,
    },
    Error {
        status: u16,
        error: ApiError,
        header: Option<(&'static str, String)>,
    },
    Hang,
    Drop,
    /// Reset the connection (TCP RST) without a response byte.
    Reset,
    /// Close the connection once this many request-body bytes arrived.
    WriteCut(usize),
    Malformed,
}

impl Plan {
    fn answer(script: Script) -> Plan {
        Plan::Answer {
            delay: Duration::ZERO,
            script,
            always_sse: false,
        }
    }

    fn status_error(status: u16, vendor_code: Option<String>) -> Plan {
        Plan::Error {
            status,
            error: ApiError::Injected { vendor_code },
            header: None,
        }
    }

    /// For a path spec; `prior` is how many requests with the same (spec, logical
    /// id) came before.
    pub fn decide(fault: &Fault, prior: u32) -> Plan {
        let success = Plan::answer(Script::Healthy);
        match fault {
            Fault::Ok => success,
            Fault::Delay { ms } => Plan::Answer {
                delay: Duration::from_millis(*ms),
                script: Script::Healthy,
                always_sse: false,
            },
            Fault::Status { code, vendor_code } => Plan::status_error(*code, vendor_code.clone()),
            Fault::Flaky {
                failures,
                code,
                vendor_code,
            } => {
                if prior < *failures {
                    Plan::status_error(*code, vendor_code.clone())
                } else {
                    success
                }
            }
            Fault::RetryAfter { hint, then_ok, status } => {
                if *then_ok && prior > 0 {
                    return success;
                }
                let header = match hint {
                    RetryAfterHint::Secs(v) => ("retry-after", v.clone()),
                    RetryAfterHint::Ms(v) => ("retry-after-ms", v.clone()),
                    RetryAfterHint::Date(secs) => ("retry-after", http_date_in(*secs)),
                };
                Plan::Error {
                    status: *status,
                    error: ApiError::Injected { vendor_code: None },
                    header: Some(header),
                }
            }
            Fault::Seq(steps) => match usize::try_from(prior).ok().and_then(|i| steps.get(i)) {
                Some(step) => Plan::decide(step, 0),
                None => success,
            },
            Fault::Hang => Plan::Hang,
            Fault::Drop => Plan::Drop,
            Fault::WriteCut { kib } => Plan::WriteCut(*kib as usize * 1024),
            Fault::Malformed => Plan::Malformed,
            Fault::SseCut { chunks } => Plan::Answer {
                delay: Duration::ZERO,
                script: Script::Break {
                    frames: *chunks as usize,
                    how: Break::Cut,
                },
                always_sse: true,
            },
            Fault::SlowSse { gap_ms, fast } => Plan::Answer {
                delay: Duration::ZERO,
                script: Script::Gaps {
                    gap: Duration::from_millis(*gap_ms),
                    fast: *fast,
                },
                always_sse: true,
            },
        }
    }

    /// For a fault model. `fires`: this request is one of the first `n=` on its
    /// counter; `down`: a flapping model is inside its down window; `prefill`: the
    /// conversation ends with an assistant message.
    pub fn for_model(m: &ModelFault, fires: bool, down: bool, prefill: bool) -> Plan {
        let healthy = Plan::answer(Script::Healthy);
        if !fires {
            return healthy;
        }
        let after_k = m.k as usize + 1;
        match m.kind {
            Kind::RateLimitHinted => Plan::Error {
                status: 429,
                error: ApiError::Injected { vendor_code: None },
                header: Some(("retry-after", m.retry_after.clone())),
            },
            Kind::RateLimit => Plan::status_error(429, None),
            Kind::ServerErrorOnce => Plan::status_error(500, None),
            Kind::Unavailable => Plan::status_error(m.status, None),
            Kind::Reset => Plan::Reset,
            Kind::Silent => Plan::Hang,
            Kind::SlowFirstToken => Plan::answer(Script::FirstToken(Duration::from_millis(m.first_token_ms))),
            Kind::StreamCut => Plan::answer(Script::Break {
                frames: after_k,
                how: match m.end {
                    CutEnd::Abort => Break::Cut,
                    CutEnd::ErrorEvent => Break::ErrorEvent,
                    CutEnd::Close => Break::Close,
                },
            }),
            Kind::StreamStall => Plan::answer(Script::Break {
                frames: after_k,
                how: Break::Stall,
            }),
            Kind::MalformedSse => Plan::answer(Script::Malformed { frames: after_k }),
            Kind::NoDone => Plan::answer(Script::NoTerminator),
            Kind::ContextLength => Plan::Error {
                status: 400,
                error: ApiError::ContextLength,
                header: None,
            },
            Kind::ContentFilter => Plan::Error {
                status: 400,
                error: ApiError::ContentFilter {
                    code: m.filter_code,
                    reason: m.reason.clone(),
                },
                header: None,
            },
            Kind::NoPrefill if prefill => Plan::Error {
                status: 400,
                error: ApiError::PrefillRejected,
                header: None,
            },
            Kind::Flap if down => Plan::status_error(m.status, None),
            // The limit is decided against the server's state (`for_rate_limit`).
            Kind::NoPrefill | Kind::Flap | Kind::Ok | Kind::RateLimitWindow => healthy,
        }
    }

    /// `fb-ratelimit`: the answer, or a 429 when over the limit, with
    /// `retry-after` (Azure: `retry-after-ms`; Gemini: none, the body's `RetryInfo`).
    pub fn for_rate_limit(slot: &Slot, family: Family) -> Option<Plan> {
        (!slot.admitted).then(|| {
            let retry_after_s = slot.retry_after_secs();
            let header = match family {
                Family::Gemini => None,
                Family::Azure => Some(("retry-after-ms", slot.retry_after_ms().to_string())),
                _ => Some(("retry-after", retry_after_s.to_string())),
            };
            Plan::Error {
                status: 429,
                error: ApiError::RateLimited {
                    limit: slot.limit,
                    retry_after_s,
                    family,
                },
                header,
            }
        })
    }

    /// The status the client receives; `None` when it receives no response.
    pub fn status(&self) -> Option<u16> {
        match self {
            Plan::Error { status, .. } => Some(*status),
            Plan::Hang | Plan::Drop | Plan::Reset | Plan::WriteCut(_) => None,
            Plan::Answer { .. } | Plan::Malformed => Some(200),
        }
    }
}

/// IMF-fixdate `secs` seconds from now (in the past when negative). The format has
/// one-second resolution, so the effective wait is up to a second shorter.
fn http_date_in(secs: i64) -> String {
    let now = SystemTime::now();
    let offset = Duration::from_secs(secs.unsigned_abs());
    let at = if secs >= 0 {
        now.checked_add(offset)
    } else {
        now.checked_sub(offset)
    };
    httpdate::fmt_http_date(at.unwrap_or(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flaky_and_then_ok_follow_prior_count() {
        let flaky = Fault::Flaky {
            failures: 2,
            code: 503,
            vendor_code: None,
        };
        let statuses: Vec<_> = (0..4).map(|p| Plan::decide(&flaky, p).status()).collect();
        assert_eq!(statuses, [Some(503), Some(503), Some(200), Some(200)]);

        let ra = Fault::RetryAfter {
            hint: RetryAfterHint::Ms("5".into()),
            then_ok: true,
            status: 429,
        };
        assert_eq!(Plan::decide(&ra, 0).status(), Some(429));
        assert_eq!(Plan::decide(&ra, 1).status(), Some(200));

        let seq: Fault = "seq:ra-secs:1:503,hang,status:500".parse().unwrap();
        let statuses: Vec<_> = (0..5).map(|p| Plan::decide(&seq, p).status()).collect();
        assert_eq!(statuses, [Some(503), None, Some(500), Some(200), Some(200)]);
    }

    #[test]
    fn http_date_is_parseable_and_in_the_future() {
        let text = http_date_in(30);
        let at = httpdate::parse_http_date(&text).expect("valid IMF-fixdate");
        let ahead = at.duration_since(SystemTime::now()).expect("date is in the future");
        assert!(ahead <= Duration::from_secs(30) && ahead >= Duration::from_secs(28));
    }

    #[test]
    fn model_plans() {
        let plan = |model: &str, fires, down, prefill| {
            Plan::for_model(&ModelFault::parse(model).unwrap(), fires, down, prefill)
        };
        assert_eq!(plan("fb-500-once", true, false, false).status(), Some(500));
        assert_eq!(plan("fb-500-once", false, false, false), Plan::answer(Script::Healthy));
        assert_eq!(plan("fb-reset", true, false, false), Plan::Reset);
        assert_eq!(plan("fb-silent", true, false, false), Plan::Hang);
        assert_eq!(
            plan("fb-stream-cut:k=3:end=error", true, false, false),
            Plan::answer(Script::Break {
                frames: 4,
                how: Break::ErrorEvent
            })
        );
        assert_eq!(
            plan("fb-stream-cut:k=1:end=close", true, false, false),
            Plan::answer(Script::Break {
                frames: 2,
                how: Break::Close
            })
        );
        assert_eq!(plan("fb-no-prefill", true, false, true).status(), Some(400));
        assert_eq!(plan("fb-no-prefill", true, false, false).status(), Some(200));
        assert_eq!(plan("fb-flap:status=529", true, true, false).status(), Some(529));
        assert_eq!(plan("fb-flap", true, false, false).status(), Some(200));
        let Plan::Error { header, .. } = plan("fb-429-retry-after:ra=3", true, false, false) else {
            panic!("an error")
        };
        assert_eq!(header, Some(("retry-after", "3".to_owned())));
    }
}

//! Reading rate-limit headers of every provider family into one [`Reading`]:
//!
//! | family | headers | reset form |
//! | --- | --- | --- |
//! | OpenAI | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` | Go duration (`6m0s`, `1.5s`, `20ms`) |
//! | Azure OpenAI | `x-ratelimit-remaining-{requests,tokens}` (`-1` = unknown), `x-rate-limit-reset-tokens`, `retry-after-ms` | seconds (`55`) |
//! | Anthropic | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}` | RFC 3339 instant |
//! | IETF drafts | `RateLimit`, `RateLimit-Policy`, `RateLimit-{Limit,Remaining,Reset}` | seconds (forms in `ietf.rs`) |
//! | any | `retry-after-ms`, `retry-after` (seconds or HTTP-date) | |
//!
//! Gemini sends its evidence in the body (`RetryInfo.retryDelay`, a per-day
//! `QuotaFailure`), which the caller already decodes: it goes in through
//! [`Reading::retry_delay`] and [`Reading::quota_exhausted`].
//!
//! Names match case-insensitively. A value repeated (two field lines, or one
//! folded with commas) keeps its conservative reading: the smaller limit and
//! remaining, the later reset. Of different families describing the same kind
//! the window that binds first wins whole (the smaller remaining, on a tie the
//! later reset), so a per-minute remaining is never paired with a per-day
//! reset. A malformed value is ignored, and its
//! header's name is listed in [`Reading::malformed`]; nothing here panics.

use super::ietf;
use super::reading::{Kind, Reading, Window};
use super::values::{self, Malformed};
use crate::outcome::Headers;
use crate::rules::wait::parse_retry_after_value;
use smol_str::SmolStr;
use std::time::{Duration, SystemTime};

/// Longest header name looked at; every name read here is shorter.
const NAME_MAX: usize = 48;

#[derive(Clone, Copy)]
enum Field {
    Limit,
    Remaining,
    Reset,
}

fn field(s: &str) -> Option<Field> {
    match s {
        "limit" => Some(Field::Limit),
        "remaining" => Some(Field::Remaining),
        "reset" => Some(Field::Reset),
        _ => None,
    }
}

/// Folds every comma-separated part of `value` into `w`; false if any part was malformed.
fn fold_value(w: &mut Window, f: Field, value: &str, wall: SystemTime) -> bool {
    let mut ok = true;
    for part in value.split(',') {
        let parsed: Result<Window, Malformed> = match f {
            Field::Limit => values::count(part).map(|n| Window {
                limit: n,
                ..Window::default()
            }),
            Field::Remaining => values::count(part).map(|n| Window {
                remaining: n,
                ..Window::default()
            }),
            Field::Reset => values::reset(part, wall).map(|d| Window {
                reset: Some(d),
                ..Window::default()
            }),
        };
        match parsed {
            Ok(x) => w.fold_same(x),
            Err(_) => ok = false,
        }
    }
    ok
}

/// True when the header `name` (lower-case) may carry rate-limit evidence
/// (every name [`Reading::parse`] reads contains one of these): a success
/// without such a header leaves every scope's state as it was, which the
/// engine's fast lane checks without parsing.
pub(crate) fn may_limit(name: &str) -> bool {
    name.contains("ratelimit") || name.contains("rate-limit") || name.starts_with("retry-after")
}

impl Reading {
    /// Reads the rate-limit headers among `headers` (name, value pairs).
    /// `wall` is the injected wall clock, used only to turn RFC 3339 and
    /// HTTP-date instants into durations.
    pub fn parse<'a, I>(headers: I, wall: SystemTime) -> Reading
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut r = Reading::default();
        let mut families = [[Window::default(); 4]; 2];
        let mut fields = ietf::Fields::default();
        let (mut hint_ms, mut hint): (Option<Duration>, Option<Duration>) = (None, None);
        let mut buf = [0u8; NAME_MAX];
        for (name, value) in headers {
            r.answered = true;
            if name.len() > NAME_MAX {
                continue;
            }
            let lower = &mut buf[..name.len()];
            lower.copy_from_slice(name.as_bytes());
            lower.make_ascii_lowercase();
            let Ok(lname) = std::str::from_utf8(lower) else {
                continue;
            };
            // OpenAI and Azure name the field first, Anthropic the kind first.
            let target = if let Some(rest) = lname
                .strip_prefix("x-ratelimit-")
                .or_else(|| lname.strip_prefix("x-rate-limit-"))
            {
                rest.split_once('-').map(|(f, k)| (0, f, k))
            } else if let Some(rest) = lname.strip_prefix("anthropic-ratelimit-") {
                rest.rsplit_once('-').map(|(k, f)| (1, f, k))
            } else {
                None
            };
            let ok = if let Some((fam, f, k)) = target {
                match (field(f), Kind::from_suffix(k)) {
                    (Some(f), Some(k)) => fold_value(&mut families[fam][k.index()], f, value, wall),
                    _ => true,
                }
            } else if fields.take(lname, value) {
                true
            } else if lname == "retry-after-ms" {
                values::millis(value).map(|d| hint_ms = hint_ms.max(Some(d))).is_ok()
            } else if lname == "retry-after" {
                parse_retry_after_value(value, wall)
                    .map(|d| hint = hint.max(Some(d)))
                    .is_ok()
            } else {
                true
            };
            if !ok {
                r.malformed.push(SmolStr::new(lname));
            }
        }
        let generic = fields.windows(&mut |n| r.malformed.push(SmolStr::new_static(n)));
        for k in 0..4 {
            r.windows[k] = families[0][k].tighter(families[1][k]).tighter(generic[k]);
        }
        r.retry_after = hint_ms.or(hint);
        r
    }

    /// [`Reading::parse`] over a response's [`Headers`].
    pub fn from_headers(headers: &Headers, wall: SystemTime) -> Reading {
        Reading::parse(headers.iter(), wall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::UNIX_EPOCH;

    fn wall() -> SystemTime {
        // 2025-01-01T00:00:00Z
        UNIX_EPOCH + Duration::from_secs(1_735_689_600)
    }

    fn read(pairs: &[(&str, &str)]) -> Reading {
        Reading::parse(pairs.iter().copied(), wall())
    }

    fn win(limit: Option<u64>, remaining: Option<u64>, reset_ms: Option<u64>) -> Window {
        Window {
            limit,
            remaining,
            reset: reset_ms.map(Duration::from_millis),
            window: None,
        }
    }

    #[test]
    fn openai() {
        let r = read(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
            ("x-request-id", "req_1"),
        ]);
        assert_eq!(r.window(Kind::Requests), win(Some(60), Some(59), Some(1_000)));
        assert_eq!(r.window(Kind::Tokens), win(Some(150_000), Some(149_984), Some(360_000)));
        assert!(r.window(Kind::InputTokens).is_empty() && r.window(Kind::OutputTokens).is_empty());
        assert_eq!((r.problems(), r.retry_after, r.rate_limited), (0, None, false));
        // Fractions and compound durations; mixed-case names.
        let r = read(&[
            ("X-RateLimit-Reset-Requests", "1h2m3.5s"),
            ("X-RATELIMIT-RESET-TOKENS", "20ms"),
            ("x-ratelimit-Remaining-Tokens", "0"),
        ]);
        assert_eq!(r.window(Kind::Requests), win(None, None, Some(3_723_500)));
        assert_eq!(r.window(Kind::Tokens), win(None, Some(0), Some(20)));
    }

    #[test]
    fn azure_openai() {
        let r = read(&[
            ("x-ratelimit-remaining-requests", "79"),
            ("x-ratelimit-remaining-tokens", "61353"),
            ("retry-after-ms", "1500"),
            ("retry-after", "2"),
        ]);
        assert_eq!(r.window(Kind::Requests), win(None, Some(79), None));
        assert_eq!(r.window(Kind::Tokens), win(None, Some(61_353), None));
        assert_eq!(r.retry_after, Some(Duration::from_millis(1500)), "retry-after-ms wins");
        // -1 means unknown: ignored, not malformed. A reset of 0 alone says nothing harmful.
        let r = read(&[
            ("x-ratelimit-limit-tokens", "-1"),
            ("x-ratelimit-remaining-tokens", "-1"),
            ("x-ratelimit-reset-tokens", "0"),
        ]);
        assert_eq!(r.window(Kind::Tokens), win(None, None, Some(0)));
        assert_eq!(r.problems(), 0);
        // The hyphenated spelling and bare seconds.
        let r = read(&[
            ("x-rate-limit-reset-tokens", "55"),
            ("x-ratelimit-remaining-requests", "0"),
        ]);
        assert_eq!(r.window(Kind::Tokens), win(None, None, Some(55_000)));
        assert_eq!(r.window(Kind::Requests), win(None, Some(0), None));
    }

    #[test]
    fn anthropic() {
        let r = read(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2025-01-01T00:00:01Z"),
            ("anthropic-ratelimit-tokens-limit", "90000"),
            ("anthropic-ratelimit-tokens-remaining", "89000"),
            ("anthropic-ratelimit-tokens-reset", "2025-01-01T00:00:12.5Z"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "39500"),
            ("anthropic-ratelimit-input-tokens-reset", "2025-01-01T01:00:30+01:00"),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            ("anthropic-ratelimit-output-tokens-reset", "2024-12-31T23:59:00Z"),
            ("retry-after", "12"),
            ("anthropic-ratelimit-unified-status", "allowed"),
        ]);
        assert_eq!(r.window(Kind::Requests), win(Some(50), Some(49), Some(1_000)));
        assert_eq!(r.window(Kind::Tokens), win(Some(90_000), Some(89_000), Some(12_500)));
        assert_eq!(
            r.window(Kind::InputTokens),
            win(Some(40_000), Some(39_500), Some(30_000))
        );
        assert_eq!(
            r.window(Kind::OutputTokens),
            win(Some(8_000), Some(0), Some(0)),
            "a reset in the past is now"
        );
        assert_eq!(r.retry_after, Some(Duration::from_secs(12)));
        assert_eq!(r.problems(), 0);
    }

    #[test]
    fn ietf_through_the_reading() {
        let r = read(&[
            ("RateLimit-Policy", "\"default\";q=100;w=60"),
            ("RateLimit", "\"default\";r=50;t=30"),
        ]);
        let w = r.window(Kind::Requests);
        assert_eq!(
            (w.limit, w.remaining, w.reset),
            (Some(100), Some(50), Some(Duration::from_secs(30)))
        );
        assert_eq!(w.window, Some(Duration::from_secs(60)));
        let r = read(&[("ratelimit", "limit=100, remaining=50, reset=30")]);
        assert_eq!(r.window(Kind::Requests), win(Some(100), Some(50), Some(30_000)));
    }

    #[test]
    fn repeated_and_folded_values_keep_the_conservative_reading() {
        let r = read(&[
            ("x-ratelimit-remaining-requests", "10"),
            ("x-ratelimit-remaining-requests", "7"),
            ("x-ratelimit-reset-requests", "2s, 5s"),
            ("x-ratelimit-limit-requests", "60,50"),
        ]);
        assert_eq!(r.window(Kind::Requests), win(Some(50), Some(7), Some(5_000)));
        // Two families for one kind: the one with less remaining binds, whole.
        let r = read(&[
            ("x-ratelimit-remaining-requests", "30"),
            ("x-ratelimit-reset-requests", "30s"),
            ("ratelimit", "limit=100, remaining=5, reset=2"),
        ]);
        assert_eq!(r.window(Kind::Requests), win(Some(100), Some(5), Some(2_000)));
        // Several Retry-After values: the longest.
        let r = read(&[
            ("retry-after", "1"),
            ("retry-after", "3"),
            ("retry-after-ms", "10"),
            ("retry-after-ms", "20"),
        ]);
        assert_eq!(
            r.retry_after,
            Some(Duration::from_millis(20)),
            "ms wins, the longer one"
        );
    }

    #[test]
    fn malformed_values_are_ignored_and_named() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                &[("x-ratelimit-remaining-requests", "many")],
                &["x-ratelimit-remaining-requests"],
            ),
            (
                &[("x-ratelimit-remaining-requests", "-2")],
                &["x-ratelimit-remaining-requests"],
            ),
            (&[("x-ratelimit-limit-tokens", "1.5")], &["x-ratelimit-limit-tokens"]),
            (
                &[("x-ratelimit-limit-tokens", "99999999999999999999999")],
                &["x-ratelimit-limit-tokens"],
            ),
            (&[("X-RateLimit-Reset-Tokens", "-1s")], &["x-ratelimit-reset-tokens"]),
            (
                &[("x-ratelimit-reset-tokens", "6 minutes")],
                &["x-ratelimit-reset-tokens"],
            ),
            (
                &[("x-ratelimit-reset-tokens", "100000h")],
                &["x-ratelimit-reset-tokens"],
            ),
            (
                &[("anthropic-ratelimit-tokens-reset", "2025-02-30T00:00:00Z")],
                &["anthropic-ratelimit-tokens-reset"],
            ),
            (
                &[("anthropic-ratelimit-tokens-reset", "2030-01-01T00:00:00Z")],
                &["anthropic-ratelimit-tokens-reset"],
            ),
            (
                &[("anthropic-ratelimit-requests-remaining", "")],
                &["anthropic-ratelimit-requests-remaining"],
            ),
            (&[("retry-after", "soon")], &["retry-after"]),
            (&[("retry-after", "-3")], &["retry-after"]),
            (&[("retry-after-ms", "1e3")], &["retry-after-ms"]),
            (&[("ratelimit", "\"d\";r=x")], &["ratelimit"]),
        ];
        for (pairs, names) in cases {
            let r = read(pairs);
            assert_eq!(
                r.malformed,
                names.iter().map(SmolStr::new).collect::<Vec<_>>(),
                "{pairs:?}"
            );
            assert!(Kind::ALL.iter().all(|k| r.window(*k).is_empty()), "{pairs:?}");
            assert_eq!(r.retry_after, None);
        }
        // One bad part of a folded value does not spoil the good one.
        let r = read(&[("x-ratelimit-remaining-requests", "x, 4")]);
        assert_eq!(r.window(Kind::Requests).remaining, Some(4));
        assert_eq!(r.problems(), 1);
        // A bad retry-after-ms falls back to retry-after.
        let r = read(&[("retry-after-ms", "junk"), ("retry-after", "3")]);
        assert_eq!(r.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(r.problems(), 1);
    }

    #[test]
    fn unrelated_and_unknown_names_are_not_problems() {
        let long = "x-ratelimit-remaining-requests-and-a-very-long-tail-of-text";
        let r = read(&[
            ("x-ratelimit-limit-tokens_usage_based", "1"),
            ("x-ratelimit-bogus-requests", "x"),
            ("x-ratelimit-remaining", "5"),
            ("anthropic-ratelimit-requests", "5"),
            ("anthropic-priority-input-tokens-limit", "5"),
            ("content-type", "application/json"),
            (long, "oops"),
            ("x-ratelimit-remaining-requésts", "1"),
        ]);
        assert!(r.is_empty() && r.answered, "{r:?}");
        assert_eq!(r.problems(), 0);
        assert!(!read(&[]).answered);
    }

    #[test]
    fn headers_type_is_read_the_same() {
        let h: Headers = [("x-ratelimit-remaining-requests", "3"), ("Retry-After", "2")]
            .into_iter()
            .collect();
        let r = Reading::from_headers(&h, wall());
        assert_eq!(r.window(Kind::Requests).remaining, Some(3));
        assert_eq!(r.retry_after, Some(Duration::from_secs(2)));
    }

    const NAMES: &[&str] = &[
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "x-rate-limit-reset-tokens",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-output-tokens-limit",
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "retry-after",
        "retry-after-ms",
        "content-type",
    ];

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[-0-9.,;=\" :a-zA-Z+TZ]{0,40}",
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| format!("{n}ms")),
            (0u64..100_000, 0u32..1_000).prop_map(|(s, f)| format!("{s}.{f}s")),
            (any::<u8>(), 0u8..70).prop_map(|(d, s)| format!("2025-01-{:02}T00:00:{s:02}Z", d % 40)),
            "\"[a-z]{1,5}\";[rqtw]=-?[0-9]{1,17}(;[a-z]=[0-9]{1,3}){0,2}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes in any of these headers: no panic, every window within a
        /// year, every problem named after a header that was given, and the
        /// same reading twice.
        #[test]
        fn arbitrary_values_never_panic(pairs in proptest::collection::vec(
            (prop_oneof![proptest::sample::select(NAMES).prop_map(String::from), any::<String>()], value()), 0..12)
        ) {
            let r = Reading::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())), wall());
            for k in Kind::ALL {
                let w = r.window(k);
                prop_assert!(w.reset.is_none_or(|d| d <= values::ABSURD));
                prop_assert!(w.window.is_none_or(|d| d <= values::ABSURD));
            }
            prop_assert!(r.retry_after.is_none_or(|d| d <= values::ABSURD));
            for bad in &r.malformed {
                prop_assert!(pairs.iter().any(|(k, _)| k.eq_ignore_ascii_case(bad)), "{bad}");
            }
            prop_assert_eq!(&r, &Reading::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())), wall()));
        }

        /// Valid counts and durations read back exactly.
        #[test]
        fn valid_values_read_back(n in any::<u64>(), ms in 0u64..31_536_000_000) {
            let (n_s, d_s) = (n.to_string(), format!("{ms}ms"));
            let r = read(&[("x-ratelimit-remaining-tokens", n_s.as_str()), ("x-ratelimit-reset-tokens", d_s.as_str())]);
            prop_assert_eq!(r.window(Kind::Tokens), win(None, Some(n), Some(ms)));
            prop_assert_eq!(r.problems(), 0);
        }
    }
}

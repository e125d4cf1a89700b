//! The generic IETF rate-limit fields (draft-ietf-httpapi-ratelimit-headers),
//! in each form servers still send:
//!
//! - drafts 08 and later: `RateLimit-Policy: "permin";q=50;w=60` and
//!   `RateLimit: "permin";r=10;t=30` — lists of named items whose parameters
//!   give the quota (`q`), its unit (`qu`, default `requests`), the window
//!   (`w`, seconds), the remaining units (`r`) and the seconds until more are
//!   available (`t`); items are matched by name;
//! - draft 07: `RateLimit: limit=100, remaining=50, reset=30` (a dictionary)
//!   with `RateLimit-Policy: 100;w=60` (integer items);
//! - drafts 00–06: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
//!
//! Values are read with a lenient subset of Structured Fields (RFC 8941):
//! items, parameters and dictionaries of integers, decimals, strings, tokens,
//! byte sequences and booleans; inner lists are not used by these fields and
//! make the field malformed. A field that does not parse is ignored whole, as
//! the drafts require, and reported as malformed.

use super::reading::{Kind, Window};
use super::values::{self, Malformed};
use std::time::Duration;

/// A bare item, reduced to what these fields use.
#[derive(Debug, Clone, PartialEq)]
enum Bare {
    Int(i64),
    Str(String),
    Token(String),
    Other,
}

#[derive(Debug, Clone, PartialEq)]
struct Item {
    value: Bare,
    params: Vec<(String, Bare)>,
}

impl Item {
    fn param(&self, key: &str) -> Option<&Bare> {
        // RFC 8941: a repeated key keeps its last value.
        self.params.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A parameter that must be a non-negative integer when present.
    fn uint(&self, key: &str) -> Result<Option<u64>, Malformed> {
        match self.param(key) {
            None => Ok(None),
            Some(Bare::Int(n)) if *n >= 0 => Ok(Some(*n as u64)),
            Some(_) => Err(Malformed),
        }
    }

    fn name(&self) -> Option<&str> {
        match &self.value {
            Bare::Str(s) | Bare::Token(s) => Some(s),
            _ => None,
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn new(s: &'a str) -> Self {
        Parser { s: s.as_bytes(), i: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    fn done(&mut self) -> bool {
        self.skip_ws();
        self.i >= self.s.len()
    }

    /// A key (lower-case in RFC 8941; upper case is accepted and folded).
    fn key(&mut self) -> Result<String, Malformed> {
        let start = self.i;
        match self.peek() {
            Some(b) if b.is_ascii_alphabetic() || b == b'*' => self.i += 1,
            _ => return Err(Malformed),
        }
        while matches!(self.peek(), Some(b) if b.is_ascii_alphanumeric() || b"_-.*".contains(&b)) {
            self.i += 1;
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).to_ascii_lowercase())
    }

    fn bare(&mut self) -> Result<Bare, Malformed> {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                let mut out = Vec::new();
                loop {
                    match self.peek() {
                        None => return Err(Malformed),
                        Some(b'"') => {
                            self.i += 1;
                            return Ok(Bare::Str(String::from_utf8_lossy(&out).into_owned()));
                        }
                        Some(b'\\') => {
                            self.i += 1;
                            match self.peek() {
                                Some(c @ (b'"' | b'\\')) => out.push(c),
                                _ => return Err(Malformed),
                            }
                            self.i += 1;
                        }
                        Some(c) if (0x20..0x7f).contains(&c) => {
                            out.push(c);
                            self.i += 1;
                        }
                        Some(_) => return Err(Malformed),
                    }
                }
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                if self.peek() == Some(b'-') {
                    self.i += 1;
                }
                let digits_at = self.i;
                while matches!(self.peek(), Some(b'0'..=b'9' | b'.')) {
                    self.i += 1;
                }
                let num = std::str::from_utf8(&self.s[start..self.i]).map_err(|_| Malformed)?;
                let body = &self.s[digits_at..self.i];
                if body.is_empty() || !body[0].is_ascii_digit() {
                    return Err(Malformed);
                }
                if body.contains(&b'.') {
                    num.parse::<f64>().map_err(|_| Malformed)?;
                    return Ok(Bare::Other);
                }
                // RFC 8941 integers have at most 15 digits.
                if body.len() > 15 {
                    return Err(Malformed);
                }
                num.parse().map(Bare::Int).map_err(|_| Malformed)
            }
            Some(b':') => {
                self.i += 1;
                while matches!(self.peek(), Some(b) if b.is_ascii_alphanumeric() || b"+/=".contains(&b)) {
                    self.i += 1;
                }
                if self.peek() != Some(b':') {
                    return Err(Malformed);
                }
                self.i += 1;
                Ok(Bare::Other)
            }
            Some(b'?') => {
                self.i += 1;
                match self.peek() {
                    Some(b'0' | b'1') => {
                        self.i += 1;
                        Ok(Bare::Other)
                    }
                    _ => Err(Malformed),
                }
            }
            Some(b) if b.is_ascii_alphabetic() || b == b'*' => {
                let start = self.i;
                while matches!(self.peek(), Some(b) if b.is_ascii_graphic() && !b"\"(),;<=>?@[\\]{}".contains(&b)) {
                    self.i += 1;
                }
                Ok(Bare::Token(
                    String::from_utf8_lossy(&self.s[start..self.i]).into_owned(),
                ))
            }
            _ => Err(Malformed),
        }
    }

    /// `key` or `key=value` (a key alone is boolean true, which nothing here reads).
    fn keyed(&mut self) -> Result<(String, Bare), Malformed> {
        let k = self.key()?;
        if self.peek() != Some(b'=') {
            return Ok((k, Bare::Other));
        }
        self.i += 1;
        Ok((k, self.bare()?))
    }

    fn params(&mut self) -> Result<Vec<(String, Bare)>, Malformed> {
        let mut out = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() != Some(b';') {
                return Ok(out);
            }
            self.i += 1;
            self.skip_ws();
            out.push(self.keyed()?);
        }
    }

    /// A non-empty, comma-separated sequence of members read by `one`, then the end.
    fn members<T>(mut self, mut one: impl FnMut(&mut Self) -> Result<T, Malformed>) -> Result<Vec<T>, Malformed> {
        let mut out = Vec::new();
        if self.done() {
            return Err(Malformed);
        }
        loop {
            self.skip_ws();
            out.push(one(&mut self)?);
            if self.done() {
                return Ok(out);
            }
            if self.peek() != Some(b',') {
                return Err(Malformed);
            }
            self.i += 1;
            if self.done() {
                return Err(Malformed);
            }
        }
    }

    fn list(self) -> Result<Vec<Item>, Malformed> {
        self.members(|p| {
            let value = p.bare()?;
            Ok(Item {
                value,
                params: p.params()?,
            })
        })
    }

    fn dictionary(self) -> Result<Vec<(String, Item)>, Malformed> {
        self.members(|p| {
            let (k, value) = p.keyed()?;
            Ok((
                k,
                Item {
                    value,
                    params: p.params()?,
                },
            ))
        })
    }
}

/// The kind a quota unit measures; `None` for units that are not a rate of
/// requests or tokens (`content-bytes`, `concurrent-requests`).
fn unit_kind(unit: Option<&Bare>) -> Result<Option<Kind>, Malformed> {
    match unit {
        None => Ok(Some(Kind::Requests)),
        Some(Bare::Str(s) | Bare::Token(s)) => Ok(match s.as_str() {
            "requests" => Some(Kind::Requests),
            // Not registered by the draft; LLM gateways use them.
            "tokens" => Some(Kind::Tokens),
            "input-tokens" => Some(Kind::InputTokens),
            "output-tokens" => Some(Kind::OutputTokens),
            _ => None,
        }),
        Some(_) => Err(Malformed),
    }
}

fn secs(n: Option<u64>) -> Result<Option<Duration>, Malformed> {
    match n {
        Some(s) if s > values::ABSURD.as_secs() => Err(Malformed),
        s => Ok(s.map(Duration::from_secs)),
    }
}

/// One `RateLimit-Policy` item.
#[derive(Debug, Clone, PartialEq)]
struct Policy {
    name: Option<String>,
    quota: Option<u64>,
    kind: Option<Kind>,
    window: Option<Duration>,
}

/// The IETF fields of one response, gathered while the headers are read
/// (a list may be split over several field lines) and interpreted at the end.
#[derive(Debug, Default)]
pub(crate) struct Fields<'a> {
    pub(crate) ratelimit: Vec<&'a str>,
    pub(crate) policy: Vec<&'a str>,
    pub(crate) limit: Vec<&'a str>,
    pub(crate) remaining: Vec<&'a str>,
    pub(crate) reset: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    /// Takes a header if it is one of these fields.
    pub(crate) fn take(&mut self, lname: &str, value: &'a str) -> bool {
        let v = match lname {
            "ratelimit" => &mut self.ratelimit,
            "ratelimit-policy" => &mut self.policy,
            "ratelimit-limit" => &mut self.limit,
            "ratelimit-remaining" => &mut self.remaining,
            "ratelimit-reset" => &mut self.reset,
            _ => return false,
        };
        v.push(value);
        true
    }

    fn is_empty(&self) -> bool {
        self.ratelimit.is_empty()
            && self.policy.is_empty()
            && self.limit.is_empty()
            && self.remaining.is_empty()
            && self.reset.is_empty()
    }

    /// The windows these fields describe; `bad` receives the name of every
    /// field that was malformed.
    pub(crate) fn windows(&self, bad: &mut dyn FnMut(&'static str)) -> [Window; 4] {
        let mut out = [Window::default(); 4];
        if self.is_empty() {
            return out;
        }
        let policies = self.policies(bad);
        let joined = self.ratelimit.join(", ");
        if !joined.trim().is_empty() {
            let parsed = match Parser::new(&joined).list() {
                Ok(items) if items.iter().any(|i| i.param("r").is_some()) => named(&items, &policies, &mut out),
                _ => Parser::new(&joined)
                    .dictionary()
                    .and_then(|d| dictionary(&d, &policies, &mut out)),
            };
            if parsed.is_err() {
                bad("ratelimit");
            }
        } else if !self.ratelimit.is_empty() {
            bad("ratelimit");
        }
        self.separate(&policies, &mut out, bad);
        out
    }

    fn policies(&self, bad: &mut dyn FnMut(&'static str)) -> Vec<Policy> {
        if self.policy.is_empty() {
            return Vec::new();
        }
        let parse = |v: &str| -> Result<Vec<Policy>, Malformed> {
            Parser::new(v)
                .list()?
                .iter()
                .map(|it| {
                    let window = secs(it.uint("w")?)?;
                    Ok(match &it.value {
                        // Draft 07: the item is the quota.
                        Bare::Int(q) if *q >= 0 => Policy {
                            name: None,
                            quota: Some(*q as u64),
                            kind: Some(Kind::Requests),
                            window,
                        },
                        Bare::Str(n) | Bare::Token(n) => Policy {
                            name: Some(n.clone()),
                            quota: it.uint("q")?,
                            kind: unit_kind(it.param("qu"))?,
                            window,
                        },
                        _ => return Err(Malformed),
                    })
                })
                .collect()
        };
        match parse(&self.policy.join(", ")) {
            Ok(p) => p,
            Err(_) => {
                bad("ratelimit-policy");
                Vec::new()
            }
        }
    }

    /// Drafts 00–06: one field per value, the limit optionally followed by policies.
    fn separate(&self, policies: &[Policy], out: &mut [Window; 4], bad: &mut dyn FnMut(&'static str)) {
        let mut w = Window::default();
        let mut first_int = |vals: &[&str], name: &'static str| -> Option<(u64, Option<Duration>)> {
            if vals.is_empty() {
                return None;
            }
            let r = Parser::new(&vals.join(", ")).list().and_then(|items| match &items[0] {
                it @ Item {
                    value: Bare::Int(n), ..
                } if *n >= 0 => Ok((*n as u64, secs(it.uint("w")?)?)),
                _ => Err(Malformed),
            });
            r.map_err(|_| bad(name)).ok()
        };
        if let Some((n, win)) = first_int(&self.limit, "ratelimit-limit") {
            w.limit = Some(n);
            w.window = win;
        }
        if let Some((n, _)) = first_int(&self.remaining, "ratelimit-remaining") {
            w.remaining = Some(n);
        }
        if let Some((n, _)) = first_int(&self.reset, "ratelimit-reset") {
            match secs(Some(n)) {
                Ok(d) => w.reset = d,
                Err(_) => bad("ratelimit-reset"),
            }
        }
        if w.is_empty() {
            return;
        }
        if w.window.is_none() {
            w.window = unnamed_window(policies, w.limit);
        }
        let k = Kind::Requests.index();
        out[k] = out[k].tighter(w);
    }
}

/// Drafts up to 07 name no policy: the window of the one whose quota is the limit.
fn unnamed_window(policies: &[Policy], limit: Option<u64>) -> Option<Duration> {
    policies
        .iter()
        .find(|p| p.name.is_none() && p.quota == limit)
        .and_then(|p| p.window)
}

/// Drafts 08+: each `RateLimit` item joined with the policy of the same name.
fn named(items: &[Item], policies: &[Policy], out: &mut [Window; 4]) -> Result<(), Malformed> {
    let mut found = [Window::default(); 4];
    let mut seen = [false; 4];
    for it in items {
        let Some(remaining) = it.uint("r")? else { continue };
        let reset = secs(it.uint("t")?)?;
        let policy = it
            .name()
            .and_then(|n| policies.iter().find(|p| p.name.as_deref() == Some(n)));
        let kind = match policy {
            Some(p) => p.kind,
            None => Some(Kind::Requests),
        };
        let Some(kind) = kind else { continue };
        let w = Window {
            limit: policy.and_then(|p| p.quota),
            remaining: Some(remaining),
            reset,
            window: policy.and_then(|p| p.window),
        };
        let k = kind.index();
        found[k] = if seen[k] { found[k].tighter(w) } else { w };
        seen[k] = true;
    }
    for k in 0..4 {
        out[k] = out[k].tighter(found[k]);
    }
    Ok(())
}

/// Draft 07: `limit=…, remaining=…, reset=…` for the expiring limit.
fn dictionary(members: &[(String, Item)], policies: &[Policy], out: &mut [Window; 4]) -> Result<(), Malformed> {
    let get = |key: &str| -> Result<Option<u64>, Malformed> {
        match members.iter().rev().find(|(k, _)| k == key).map(|(_, it)| &it.value) {
            None => Ok(None),
            Some(Bare::Int(n)) if *n >= 0 => Ok(Some(*n as u64)),
            Some(_) => Err(Malformed),
        }
    };
    let mut w = Window {
        limit: get("limit")?,
        remaining: get("remaining")?,
        reset: secs(get("reset")?)?,
        window: None,
    };
    if w.is_empty() {
        return Err(Malformed);
    }
    w.window = unnamed_window(policies, w.limit);
    let k = Kind::Requests.index();
    out[k] = out[k].tighter(w);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pairs: &[(&'static str, &'static str)]) -> ([Window; 4], Vec<&'static str>) {
        let mut f = Fields::default();
        for (k, v) in pairs {
            assert!(f.take(k, v), "{k}");
        }
        let mut bad = Vec::new();
        let w = f.windows(&mut |n| bad.push(n));
        (w, bad)
    }

    fn win(limit: Option<u64>, remaining: Option<u64>, reset: Option<u64>, window: Option<u64>) -> Window {
        Window {
            limit,
            remaining,
            reset: reset.map(Duration::from_secs),
            window: window.map(Duration::from_secs),
        }
    }

    const R: usize = 0;

    #[test]
    fn structured_form_joins_items_to_policies_by_name() {
        let (w, bad) = run(&[
            ("ratelimit-policy", "\"default\";q=100;w=60"),
            ("ratelimit", "\"default\";r=50;t=30"),
        ]);
        assert!(bad.is_empty());
        assert_eq!(w[R], win(Some(100), Some(50), Some(30), Some(60)));
        // Two policies: the one with less remaining binds, with its own reset.
        let (w, bad) = run(&[
            ("ratelimit-policy", "\"permin\";q=50;w=60, \"perday\";q=1000;w=86400"),
            ("ratelimit", "\"perday\";r=900;t=80000, \"permin\";r=10;t=30"),
        ]);
        assert!(bad.is_empty());
        assert_eq!(w[R], win(Some(50), Some(10), Some(30), Some(60)));
        // Split over several field lines, a token name, a partition key, extra params.
        let (w, bad) = run(&[
            ("ratelimit-policy", "tpm;q=30000;qu=\"tokens\";w=60;pk=:cHsdsRa894==:"),
            ("ratelimit-policy", "\"rpm\";q=60;w=60;acme-burst=5"),
            ("ratelimit", "tpm;r=1200;t=12"),
            ("ratelimit", "\"rpm\";r=3;t=2;pk=:QXBwLTk5OQ==:"),
        ]);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(
            w[Kind::Tokens.index()],
            win(Some(30000), Some(1200), Some(12), Some(60))
        );
        assert_eq!(w[R], win(Some(60), Some(3), Some(2), Some(60)));
        // No reset; no policy at all; a unit that is not a rate is skipped, not malformed.
        let (w, bad) = run(&[
            ("ratelimit", "\"default\";r=999"),
            ("ratelimit-policy", "\"bytes\";q=65535;qu=\"content-bytes\";w=10"),
        ]);
        assert!(bad.is_empty());
        assert_eq!(w[R], win(None, Some(999), None, None));
        let (w, bad) = run(&[
            ("ratelimit-policy", "\"bytes\";q=65535;qu=\"content-bytes\";w=10"),
            ("ratelimit", "\"bytes\";r=1;t=1"),
        ]);
        assert!(bad.is_empty() && w.iter().all(Window::is_empty));
    }

    #[test]
    fn draft_07_dictionary_form() {
        let (w, bad) = run(&[("ratelimit", "limit=100, remaining=50, reset=30")]);
        assert!(bad.is_empty());
        assert_eq!(w[R], win(Some(100), Some(50), Some(30), None));
        let (w, bad) = run(&[
            ("ratelimit-policy", "10;w=1, 100;w=60"),
            ("ratelimit", "Limit=100,remaining=0 ,reset=7"),
        ]);
        assert!(bad.is_empty());
        assert_eq!(w[R], win(Some(100), Some(0), Some(7), Some(60)));
    }

    #[test]
    fn drafts_00_to_06_separate_fields() {
        let (w, bad) = run(&[
            ("ratelimit-limit", "100, 100;w=60"),
            ("ratelimit-remaining", "20"),
            ("ratelimit-reset", "15"),
        ]);
        assert!(bad.is_empty());
        assert_eq!(w[R], win(Some(100), Some(20), Some(15), None));
        let (w, _) = run(&[("ratelimit-limit", "10;w=1"), ("ratelimit-remaining", "2")]);
        assert_eq!(w[R], win(Some(10), Some(2), None, Some(1)));
    }

    #[test]
    fn malformed_fields_are_ignored_whole_and_named() {
        type Case = (&'static [(&'static str, &'static str)], &'static [&'static str]);
        let cases: &[Case] = &[
            (&[("ratelimit", "\"default\";r=-5;t=30")], &["ratelimit"]),
            (&[("ratelimit", "\"default\";r=5;t=-1")], &["ratelimit"]),
            (&[("ratelimit", "\"default\";r=1.5")], &["ratelimit"]),
            (&[("ratelimit", "\"default\";r=\"5\"")], &["ratelimit"]),
            (&[("ratelimit", "\"default;r=5")], &["ratelimit"]),
            (&[("ratelimit", "\"default\";r=5,")], &["ratelimit"]),
            (&[("ratelimit", "\"default\";r=1234567890123456")], &["ratelimit"]),
            (&[("ratelimit", "\"default\";r=5;t=99999999999")], &["ratelimit"]),
            (&[("ratelimit", "")], &["ratelimit"]),
            (&[("ratelimit", "limit=abc, remaining=1")], &["ratelimit"]),
            (&[("ratelimit", "limit=1, remaining=-1")], &["ratelimit"]),
            (&[("ratelimit", "(1 2);r=1")], &["ratelimit"]),
            (&[("ratelimit", "foo, bar")], &["ratelimit"]),
            (&[("ratelimit-policy", "\"p\";q=-1")], &["ratelimit-policy"]),
            (&[("ratelimit-policy", "\"p\";q=1;qu=5")], &["ratelimit-policy"]),
            (&[("ratelimit-policy", "?1;w=5")], &["ratelimit-policy"]),
            (&[("ratelimit-limit", "many")], &["ratelimit-limit"]),
            (&[("ratelimit-remaining", "-3")], &["ratelimit-remaining"]),
            (&[("ratelimit-reset", "99999999999")], &["ratelimit-reset"]),
            (&[("ratelimit-reset", "soon")], &["ratelimit-reset"]),
        ];
        for (pairs, want) in cases {
            let (w, bad) = run(pairs);
            assert_eq!(&bad, want, "{pairs:?}");
            assert!(w.iter().all(Window::is_empty), "{pairs:?}: {w:?}");
        }
        // A malformed policy does not spoil a good RateLimit.
        let (w, bad) = run(&[("ratelimit-policy", "\"p\";q=x"), ("ratelimit", "\"p\";r=4;t=2")]);
        assert_eq!(bad, ["ratelimit-policy"]);
        assert_eq!(w[R], win(None, Some(4), Some(2), None));
    }

    #[test]
    fn parser_reads_every_bare_item_type() {
        let items = Parser::new("\"a\\\"b\";x=?0, tok/en:1;d=1.5;b=:AQ==:;f, -7;k=*x")
            .list()
            .unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].value, Bare::Str("a\"b".into()));
        assert_eq!(items[1].value, Bare::Token("tok/en:1".into()));
        assert_eq!(items[1].params.len(), 3);
        assert_eq!(items[2].value, Bare::Int(-7));
        assert_eq!(items[2].param("k"), Some(&Bare::Token("*x".into())));
        for bad in [
            "\"\\x\"", "\"é\"", ":AQ==", "?2", "-", "-.5", ";a", "a;", "a;=1", "\u{1}",
        ] {
            assert!(Parser::new(bad).list().is_err(), "{bad:?}");
        }
    }
}

//! Reading a request: the fault path prefix, query strings, headers, and the few
//! body fields that decide an answer.

use std::collections::BTreeMap;

use hyper::http::request::Parts;
use serde_json::Value;

/// Decodes `%XX` escapes (and `+` as space in query strings). Malformed escapes are
/// kept literally rather than rejected: the decoded text is only matched, never
/// trusted.
pub fn percent_decode(raw: &str, plus_as_space: bool) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let hex = |j: usize| bytes.get(j).and_then(|c| (*c as char).to_digit(16));
        match b {
            b'%' => match (hex(i + 1), hex(i + 2)) {
                (Some(hi), Some(lo)) => {
                    // Two hex digits fit a byte by construction.
                    out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
                    i += 3;
                    continue;
                }
                _ => out.push(b),
            },
            b'+' if plus_as_space => out.push(b' '),
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits `/s/<spec>/<api path>` into the decoded spec and the API path. Paths
/// without the prefix are plain API calls: their model decides.
pub fn split_fault_path(path: &str) -> (Option<String>, String) {
    match path.strip_prefix("/s/") {
        Some(rest) => match rest.split_once('/') {
            Some((raw, api)) => (Some(percent_decode(raw, false)), format!("/{api}")),
            None => (Some(percent_decode(rest, false)), "/".to_owned()),
        },
        None => (None, path.to_owned()),
    }
}

pub fn query_params(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

pub fn header_text(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

pub fn header_int(parts: &Parts, name: &str) -> Option<i64> {
    header_text(parts, name).and_then(|v| v.trim().parse().ok())
}

/// The body fields that shape an answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BodyFields {
    /// The parsed JSON body, `Null` when the body is not JSON.
    pub json: Value,
    pub stream: bool,
    /// `stream_options.include_usage` (chat completions).
    pub include_usage: bool,
    pub model: Option<String>,
}

impl BodyFields {
    pub fn parse(body: &[u8]) -> Self {
        let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let flag = |v: Option<&Value>| v.and_then(Value::as_bool).unwrap_or(false);
        BodyFields {
            stream: flag(json.get("stream")),
            include_usage: flag(json.get("stream_options").and_then(|o| o.get("include_usage"))),
            model: json.get("model").and_then(Value::as_str).map(str::to_owned),
            json,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_paths() {
        assert_eq!(
            split_fault_path("/s/status:503/v1/chat/completions"),
            (Some("status:503".into()), "/v1/chat/completions".into())
        );
        assert_eq!(
            split_fault_path("/s/ra-secs%3A2/v1/messages"),
            (Some("ra-secs:2".into()), "/v1/messages".into())
        );
        assert_eq!(split_fault_path("/s/ok"), (Some("ok".into()), "/".into()));
        assert_eq!(
            split_fault_path("/v1/chat/completions"),
            (None, "/v1/chat/completions".into())
        );
    }

    #[test]
    fn decodes_percent_and_plus() {
        assert_eq!(percent_decode("a%3Ab+c%zz%", true), "a:b c%zz%");
        assert_eq!(percent_decode("a+b", false), "a+b");
    }

    #[test]
    fn body_fields() {
        let f = BodyFields::parse(br#"{"model":"fb-ok","stream":true,"stream_options":{"include_usage":true}}"#);
        assert_eq!(
            (f.model.as_deref(), f.stream, f.include_usage),
            (Some("fb-ok"), true, true)
        );
        let f = BodyFields::parse(b"not json");
        assert_eq!((f.model, f.stream, f.json), (None, false, Value::Null));
    }
}

//! Which API a request speaks: its [`Endpoint`] (the tail of its URL path,
//! kept when the request moves to another base URL) and its [`ApiFamily`]
//! (the URL shape and the auth header an upstream takes).

use crate::types::ApiFamily;

/// An endpoint a request can be moved to another upstream with, named by the
/// tail of its URL path. The tail runs from the endpoint's first segment to
/// the end of the path (`/messages/count_tokens`, `/responses/{id}` included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `/chat/completions` (OpenAI chat and every compatible API).
    ChatCompletions,
    /// `/responses` (the OpenAI Responses API).
    Responses,
    /// `/completions` (legacy text completions).
    Completions,
    /// `/embeddings`.
    Embeddings,
    /// `/messages` (Anthropic).
    Messages,
}

impl Endpoint {
    /// Every endpoint, in matching order.
    pub const ALL: [Endpoint; 5] = [
        Endpoint::ChatCompletions,
        Endpoint::Responses,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Messages,
    ];

    /// Stable name: `chat_completions`, `responses`, `completions`, `embeddings`, `messages`.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Responses => "responses",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Messages => "messages",
        }
    }

    /// The path the endpoint starts with.
    pub fn tail(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/chat/completions",
            Endpoint::Responses => "/responses",
            Endpoint::Completions => "/completions",
            Endpoint::Embeddings => "/embeddings",
            Endpoint::Messages => "/messages",
        }
    }

    /// The endpoint of a URL path and the offset its tail starts at: the
    /// leftmost segment that starts one (a base path before it, such as
    /// `/v1` or a gateway's prefix, is the upstream's, not the endpoint's).
    ///
    /// ```
    /// use retrywise::wire::Endpoint;
    /// assert_eq!(Endpoint::find("/v1/chat/completions"), Some((3, Endpoint::ChatCompletions)));
    /// assert_eq!(Endpoint::find("/v1/messages/count_tokens"), Some((3, Endpoint::Messages)));
    /// assert_eq!(Endpoint::find("/v1/models"), None);
    /// ```
    pub fn find(path: &str) -> Option<(usize, Endpoint)> {
        let mut at = 0;
        while at < path.len() {
            let rest = &path[at..];
            for e in Endpoint::ALL {
                let tail = e.tail();
                if rest.starts_with(tail) && matches!(rest.as_bytes().get(tail.len()), None | Some(b'/')) {
                    return Some((at, e));
                }
            }
            at += 1 + rest[1..].find('/').map_or(rest.len(), |i| i);
        }
        None
    }
}

impl ApiFamily {
    /// The family a request was built for, from its URL and headers: an
    /// Azure host or deployment path is Azure OpenAI, `/messages` or an
    /// Anthropic header is Anthropic, anything else OpenAI-compatible.
    pub fn of_request(url: &str, headers: &[(String, String)]) -> ApiFamily {
        let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        ApiFamily::of_request_with(url, &has)
    }

    /// [`ApiFamily::of_request`] with the headers asked by name (`has(name)`:
    /// the request carries that header).
    pub fn of_request_with(url: &str, has: &dyn Fn(&str) -> bool) -> ApiFamily {
        let parsed = Url::parse(url);
        let host = parsed.as_ref().map(|u| u.origin().1).unwrap_or_default();
        let path = parsed.as_ref().map_or("", |u| u.path);
        if host.ends_with(".openai.azure.com")
            || host.ends_with(".cognitiveservices.azure.com")
            || path.contains("/openai/deployments/")
        {
            return ApiFamily::AzureOpenAi;
        }
        let messages = Endpoint::find(path).is_some_and(|(_, e)| e == Endpoint::Messages);
        if messages || has("anthropic-version") || has("x-api-key") {
            ApiFamily::Anthropic
        } else {
            ApiFamily::OpenAi
        }
    }

    /// The header that carries this family's key, and its value for `key`.
    pub fn auth_header(self, key: &str) -> (&'static str, String) {
        match self {
            ApiFamily::OpenAi => ("authorization", format!("Bearer {key}")),
            ApiFamily::Anthropic => ("x-api-key", key.to_owned()),
            ApiFamily::AzureOpenAi => ("api-key", key.to_owned()),
        }
    }
}

/// An absolute URL split into the parts a rewrite needs (no normalisation:
/// what is kept is kept byte for byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Url<'a> {
    pub(crate) scheme: &'a str,
    pub(crate) authority: &'a str,
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
}

impl<'a> Url<'a> {
    /// `scheme://authority[path][?query][#fragment]`; None for anything else.
    pub(crate) fn parse(url: &'a str) -> Option<Url<'a>> {
        let (scheme, rest) = url.split_once("://")?;
        let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        if !scheme_ok || authority.is_empty() || authority.contains(char::is_whitespace) {
            return None;
        }
        let rest = rest[end..].split('#').next().unwrap_or_default();
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        Some(Url {
            scheme,
            authority,
            path,
            query,
        })
    }

    /// Scheme, host (lowercase, without user info) and port (the scheme's
    /// default when absent): two URLs with the same origin reach the same server.
    pub(crate) fn origin(&self) -> (String, String, Option<u16>) {
        let scheme = self.scheme.to_ascii_lowercase();
        let host_port = self.authority.rsplit('@').next().unwrap_or_default();
        let (host, port) = match host_port.rfind(':') {
            // An IPv6 literal's colons sit inside brackets.
            Some(i) if !host_port[i..].contains(']') => (&host_port[..i], host_port[i + 1..].parse().ok()),
            _ => (host_port, None),
        };
        let port = port.or(match scheme.as_str() {
            "http" | "ws" => Some(80),
            "https" | "wss" => Some(443),
            _ => None,
        });
        (scheme, host.to_ascii_lowercase(), port)
    }

    /// `scheme://authority`.
    pub(crate) fn base(&self) -> String {
        format!("{}://{}", self.scheme, self.authority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn endpoints_are_found_after_any_base_path() {
        for (path, want) in [
            ("/v1/chat/completions", Some((3, Endpoint::ChatCompletions))),
            ("/s/fb-ok/v1/chat/completions", Some((11, Endpoint::ChatCompletions))),
            (
                "/openai/deployments/gpt4/chat/completions",
                Some((24, Endpoint::ChatCompletions)),
            ),
            ("/v1/completions", Some((3, Endpoint::Completions))),
            ("/v1/responses", Some((3, Endpoint::Responses))),
            ("/v1/responses/resp_1/input_items", Some((3, Endpoint::Responses))),
            ("/v1/embeddings", Some((3, Endpoint::Embeddings))),
            ("/v1/messages", Some((3, Endpoint::Messages))),
            ("/messages", Some((0, Endpoint::Messages))),
            // The leftmost endpoint wins: a stored chat completion's messages.
            (
                "/v1/chat/completions/c_1/messages",
                Some((3, Endpoint::ChatCompletions)),
            ),
            ("/v1/chatx/completions", Some((9, Endpoint::Completions))),
            ("/v1/messagesx", None),
            ("/v1/models", None),
            ("", None),
            ("/", None),
        ] {
            assert_eq!(Endpoint::find(path), want, "{path}");
        }
    }

    #[test]
    fn families_from_url_and_headers() {
        let f = |url: &str, hs: &[(&str, &str)]| ApiFamily::of_request(url, &h(hs));
        assert_eq!(f("https://api.openai.com/v1/chat/completions", &[]), ApiFamily::OpenAi);
        assert_eq!(f("https://api.anthropic.com/v1/messages", &[]), ApiFamily::Anthropic);
        assert_eq!(
            f("https://gw.example/v1/chat/completions", &[("X-Api-Key", "k")]),
            ApiFamily::Anthropic
        );
        assert_eq!(
            f("https://res.openai.azure.com/openai/responses?api-version=x", &[]),
            ApiFamily::AzureOpenAi
        );
        assert_eq!(
            f("http://127.0.0.1:1/openai/deployments/d/chat/completions", &[]),
            ApiFamily::AzureOpenAi
        );
        assert_eq!(f("not a url", &[]), ApiFamily::OpenAi);
    }

    #[test]
    fn urls_split_and_origins_compare() {
        let u = Url::parse("HTTPS://user:pw@API.example.com/v1/x?a=1&b=2#frag").unwrap();
        assert_eq!((u.scheme, u.path, u.query), ("HTTPS", "/v1/x", Some("a=1&b=2")));
        assert_eq!(u.origin(), ("https".into(), "api.example.com".into(), Some(443)));
        assert_eq!(
            Url::parse("http://[::1]:8080").unwrap().origin(),
            ("http".into(), "[::1]".into(), Some(8080))
        );
        assert_eq!(
            Url::parse("http://[::1]").unwrap().origin(),
            ("http".into(), "[::1]".into(), Some(80))
        );
        assert_eq!(
            Url::parse("https://a.example:443/").unwrap().origin(),
            Url::parse("https://A.example").unwrap().origin()
        );
        for bad in ["", "/v1/chat", "https://", "://x", "1http://x", "http://a b/"] {
            assert!(Url::parse(bad).is_none(), "{bad}");
        }
    }
}

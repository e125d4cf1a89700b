//! The request for the upstream the core chose: the SDK built it for the
//! client's own base URL, model and key; a fallback must really go to the
//! fallback, with its model and its key, and the caller's key must never
//! reach another provider.

use super::api::{Endpoint, Url};
use super::body::{quote, Object};
use super::WireError;
use crate::types::ApiFamily;
use std::fmt;

/// How to reach one upstream, from the policy catalog (`base_url`, `api`,
/// `model` / `request_model`, `api_key_env`, `api_version`, the
/// `assistant_prefill` capability). A field left `None` keeps what the
/// request already has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    /// The upstream's name in the catalog (for error messages).
    pub upstream: String,
    /// Where its API lives (`https://api.openai.com/v1`); the endpoint tail
    /// of the request's path is appended.
    pub base_url: Option<String>,
    /// Its wire family; `None`: the request's own.
    pub api: Option<ApiFamily>,
    /// The `model` to send (the deployment name on Azure).
    pub model: Option<String>,
    /// The NAME of the environment variable holding its key.
    pub api_key_env: Option<String>,
    /// Azure OpenAI: the `api-version` query parameter.
    pub api_version: Option<String>,
    /// It accepts an assistant message last (continuations may prefill).
    pub prefill: bool,
}

impl Reach {
    /// How to reach catalog upstream `name` (`u`: its entry; none: the
    /// request goes as the SDK built it).
    pub fn of(name: &str, u: Option<&crate::policy::Upstream>) -> Reach {
        let Some(u) = u else {
            return Reach {
                upstream: name.to_string(),
                base_url: None,
                api: None,
                model: None,
                api_key_env: None,
                api_version: None,
                prefill: false,
            };
        };
        Reach {
            upstream: name.to_string(),
            base_url: u.base_url.clone(),
            api: u.api,
            model: u.wire_model().map(str::to_string),
            api_key_env: u.api_key_env.clone(),
            api_version: u.api_version.clone(),
            prefill: u.has("assistant_prefill"),
        }
    }

    /// Whether [`rewrite`] changes anything: without a base URL, model, key
    /// or family of its own the request goes as the SDK built it.
    pub fn rewrites(&self) -> bool {
        self.base_url.is_some() || self.model.is_some() || self.api_key_env.is_some() || self.api.is_some()
    }
}

/// A request as an SDK built it (or as [`rewrite`] made it).
#[derive(Clone, PartialEq, Eq)]
pub struct WireRequest {
    /// `POST`, `GET`, ...
    pub method: String,
    /// The absolute URL.
    pub url: String,
    /// Headers in order, names as given.
    pub headers: Vec<(String, String)>,
    /// The body bytes.
    pub body: Vec<u8>,
}

/// Headers that carry a credential: removed whenever the origin changes, and
/// replaced by the upstream's own key when it names one.
const CREDENTIALS: &[&str] = &["authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie"];

/// Headers that belong to the original origin: an account id, the host, or a
/// length the rewritten body no longer has.
const ORIGIN_BOUND: &[&str] = &["openai-organization", "openai-project", "host"];

impl fmt::Debug for WireRequest {
    /// Credentials are shown redacted, so a logged request leaks no key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), if is_one_of(k, CREDENTIALS) { "<redacted>" } else { v }))
            .collect();
        f.debug_struct("WireRequest")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &headers)
            .field("body", &String::from_utf8_lossy(&self.body))
            .finish()
    }
}

fn is_one_of(name: &str, list: &[&str]) -> bool {
    list.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// The request for `reach`:
///
/// - URL: `base_url` + the endpoint tail of the original path (`/chat/completions`,
///   `/responses`, `/completions`, `/embeddings`, `/messages` and what follows),
///   query kept. Azure OpenAI: `{base}/openai/deployments/{model}{tail}?api-version=`
///   (`/openai/responses` for the Responses API), or the v1 API
///   `{base}/openai/v1{tail}` without an `api_version`. No `base_url`: the
///   caller's URL is kept (Azure: its origin).
/// - Body: a JSON body's `model` set to `reach.model` (inserted when absent,
///   except on an Azure deployment URL), every other member kept in order.
/// - Headers: the family's auth header from the variable `api_key_env` names,
///   read through `env` (OpenAI `Authorization: Bearer`, Anthropic
///   `x-api-key`, Azure `api-key`), replacing every other credential header.
///   When the origin (scheme, host, port) changes, the caller's credentials,
///   account headers and `Host` are dropped, key or not. A `Content-Length`
///   follows the new body.
///
/// ```
/// use retrywise::wire::{rewrite, Reach, WireRequest};
/// use retrywise::ApiFamily;
///
/// let req = WireRequest {
///     method: "POST".into(),
///     url: "https://api.openai.com/v1/chat/completions".into(),
///     headers: vec![("Authorization".into(), "Bearer sk-caller".into())],
///     body: br#"{"model":"gpt-4o","stream":true}"#.to_vec(),
/// };
/// let reach = Reach {
///     upstream: "backup".into(),
///     base_url: Some("https://api.deepseek.com/v1".into()),
///     model: Some("deepseek-chat".into()),
///     api_key_env: Some("DEEPSEEK_API_KEY".into()),
///     ..Reach::default()
/// };
/// let env = |name: &str| (name == "DEEPSEEK_API_KEY").then(|| "sk-backup".to_string());
/// let out = rewrite(&req, &reach, &env).unwrap();
/// assert_eq!(out.url, "https://api.deepseek.com/v1/chat/completions");
/// assert_eq!(out.headers, [("authorization".to_string(), "Bearer sk-backup".to_string())]);
/// assert_eq!(out.body, br#"{"model":"deepseek-chat","stream":true}"#);
/// ```
pub fn rewrite(
    req: &WireRequest,
    reach: &Reach,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<WireRequest, WireError> {
    let url = Url::parse(&req.url).ok_or_else(|| WireError::InvalidUrl {
        url: req.url.split(['?', '#']).next().unwrap_or_default().to_owned(),
    })?;
    let from = ApiFamily::of_request(&req.url, &req.headers);
    let family = reach.api.unwrap_or(from);
    let endpoint = Endpoint::find(url.path);
    let (new_url, deployment) = target_url(&url, endpoint, reach, from, family, &req.body)?;

    let mut body = req.body.clone();
    if let Some(model) = &reach.model {
        match Object::parse(&req.body) {
            Ok(mut o) if !deployment || o.get("model").is_some() => {
                o.set("model", quote(model));
                body = o.to_vec();
            }
            Ok(_) => {}
            Err(e) if !deployment => return Err(e),
            Err(_) => {}
        }
    }

    let moved = Url::parse(&new_url).map(|u| u.origin()) != Some(url.origin());
    let key = match &reach.api_key_env {
        Some(var) => Some(env(var).filter(|k| !k.is_empty()).ok_or_else(|| WireError::EnvUnset {
            var: var.clone(),
            upstream: reach.upstream.clone(),
        })?),
        None => None,
    };
    let resized = body.len() != req.body.len();
    let mut headers: Vec<(String, String)> = req
        .headers
        .iter()
        .filter(|(k, _)| {
            let credential = is_one_of(k, CREDENTIALS);
            !(credential && (moved || key.is_some()) || moved && is_one_of(k, ORIGIN_BOUND))
        })
        .map(|(k, v)| {
            let v = if resized && k.eq_ignore_ascii_case("content-length") {
                body.len().to_string()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect();
    if let Some(key) = key {
        let (name, value) = family.auth_header(&key);
        headers.push((name.to_owned(), value));
    }
    Ok(WireRequest {
        method: req.method.clone(),
        url: new_url,
        headers,
        body,
    })
}

/// The new URL, and whether it names an Azure deployment (the model is in the path).
fn target_url(
    url: &Url<'_>,
    endpoint: Option<(usize, Endpoint)>,
    reach: &Reach,
    from: ApiFamily,
    family: ApiFamily,
    body: &[u8],
) -> Result<(String, bool), WireError> {
    let query = url.query.map(|q| format!("?{q}")).unwrap_or_default();
    let tail = |e: Option<(usize, Endpoint)>| {
        e.map(|(at, _)| &url.path[at..])
            .ok_or_else(|| WireError::UnknownEndpoint {
                path: url.path.to_owned(),
            })
    };
    if family != ApiFamily::AzureOpenAi {
        return match &reach.base_url {
            None => Ok((url.base() + url.path + &query, false)),
            Some(base) => Ok((
                format!("{}{}{}", base.trim_end_matches('/'), tail(endpoint)?, query),
                false,
            )),
        };
    }
    let tail = tail(endpoint)?;
    let base = reach.base_url.clone().unwrap_or_else(|| url.base());
    let base = base.trim_end_matches('/');
    let Some(version) = &reach.api_version else {
        // The v1 API: the model goes in the body, no api-version.
        let base = base.strip_suffix("/openai/v1").unwrap_or(base);
        let base = base.strip_suffix("/openai").unwrap_or(base);
        return Ok((format!("{base}/openai/v1{tail}{query}"), false));
    };
    let base = base.strip_suffix("/openai").unwrap_or(base);
    let query = with_param(url.query, "api-version", version);
    if endpoint.is_some_and(|(_, e)| e == Endpoint::Responses) {
        return Ok((format!("{base}/openai{tail}{query}"), false));
    }
    let deployment = reach
        .model
        .clone()
        .or_else(|| {
            (from == ApiFamily::AzureOpenAi)
                .then(|| azure_deployment(url.path))
                .flatten()
        })
        .or_else(|| body_model(body))
        .ok_or_else(|| WireError::NoDeployment {
            upstream: reach.upstream.clone(),
        })?;
    Ok((format!("{base}/openai/deployments/{deployment}{tail}{query}"), true))
}

/// The deployment named in an Azure path (`/openai/deployments/{name}/...`).
fn azure_deployment(path: &str) -> Option<String> {
    let (_, rest) = path.split_once("/openai/deployments/")?;
    let name = rest.split('/').next()?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// The `model` of a JSON body, when it is a string.
fn body_model(body: &[u8]) -> Option<String> {
    let o = Object::parse(body).ok()?;
    serde_json::from_str::<String>(o.get("model")?).ok()
}

/// `query` with `name=value` set (replacing any value it had), as `?...`.
fn with_param(query: Option<&str>, name: &str, value: &str) -> String {
    let mut parts: Vec<String> = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty() && p.split('=').next() != Some(name))
        .map(str::to_owned)
        .collect();
    parts.push(format!("{name}={value}"));
    format!("?{}", parts.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(url: &str, headers: &[(&str, &str)], body: &str) -> WireRequest {
        WireRequest {
            method: "POST".into(),
            url: url.into(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn env(name: &str) -> Option<String> {
        match name {
            "OPENAI_API_KEY" => Some("sk-openai".into()),
            "ANTHROPIC_API_KEY" => Some("sk-ant".into()),
            "AZURE_KEY" => Some("az".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn names(r: &WireRequest) -> Vec<String> {
        r.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect()
    }

    const SDK_HEADERS: &[(&str, &str)] = &[
        ("Host", "api.openai.com"),
        ("Authorization", "Bearer sk-caller"),
        ("OpenAI-Organization", "org-1"),
        ("Content-Type", "application/json"),
        ("Content-Length", "36"),
        ("x-stainless-retry-count", "0"),
        ("retrywise-attempt", "2"),
    ];
    const BODY: &str = r#"{"model":"gpt-4o","stream":true}  "#;

    #[test]
    fn a_fallback_elsewhere_gets_its_url_model_and_key_and_never_the_callers() {
        let r = req("https://api.openai.com/v1/chat/completions?x=1", SDK_HEADERS, BODY);
        let reach = Reach {
            upstream: "claude".into(),
            base_url: Some("https://api.anthropic.com/v1/".into()),
            api: Some(ApiFamily::Anthropic),
            model: Some("claude-sonnet-4-5".into()),
            api_key_env: Some("ANTHROPIC_API_KEY".into()),
            ..Reach::default()
        };
        let out = rewrite(&r, &reach, &env).unwrap();
        assert_eq!(out.url, "https://api.anthropic.com/v1/chat/completions?x=1");
        assert_eq!(out.body, br#"{"model":"claude-sonnet-4-5","stream":true}"#);
        assert_eq!(
            names(&out),
            [
                "Content-Type: application/json",
                "Content-Length: 43",
                "x-stainless-retry-count: 0",
                "retrywise-attempt: 2",
                "x-api-key: sk-ant",
            ]
        );
        // No key of its own: the other origin still never sees the caller's.
        let out = rewrite(
            &r,
            &Reach {
                api_key_env: None,
                ..reach
            },
            &env,
        )
        .unwrap();
        assert!(names(&out)
            .iter()
            .all(|h| !h.contains("sk-caller") && !h.contains("org-1")));
        assert!(!format!("{out:?}").contains("sk-"), "Debug redacts keys");
    }

    #[test]
    fn the_same_origin_keeps_headers_unless_a_key_is_named() {
        let r = req("http://127.0.0.1:9/v1/chat/completions", SDK_HEADERS, BODY);
        let reach = Reach {
            upstream: "backup".into(),
            base_url: Some("http://127.0.0.1:9/v1".into()),
            model: Some("fb-ok".into()),
            ..Reach::default()
        };
        let out = rewrite(&r, &reach, &env).unwrap();
        assert_eq!(out.url, "http://127.0.0.1:9/v1/chat/completions");
        assert!(names(&out).contains(&"Authorization: Bearer sk-caller".to_string()));
        assert!(names(&out).contains(&"Host: api.openai.com".to_string()));
        let keyed = Reach {
            api_key_env: Some("OPENAI_API_KEY".into()),
            ..reach
        };
        let out = rewrite(&r, &keyed, &env).unwrap();
        let hs = names(&out);
        assert_eq!(
            hs.iter()
                .filter(|h| h.to_lowercase().starts_with("authorization"))
                .count(),
            1
        );
        assert_eq!(hs.last().unwrap(), "authorization: Bearer sk-openai");
    }

    #[test]
    fn endpoint_tails_and_queries_move_to_the_new_base() {
        let reach = |base: &str| Reach {
            base_url: Some(base.into()),
            ..Reach::default()
        };
        for (url, base, want) in [
            (
                "http://h/s/fb-x/v1/chat/completions",
                "http://g/v1",
                "http://g/v1/chat/completions",
            ),
            (
                "https://a/v1/responses?stream=true",
                "https://b/api",
                "https://b/api/responses?stream=true",
            ),
            (
                "https://a/v1/messages/count_tokens",
                "https://b/v1",
                "https://b/v1/messages/count_tokens",
            ),
            ("https://a/v1/embeddings#f", "https://b", "https://b/embeddings"),
            ("https://a/v1/completions", "https://b/v1", "https://b/v1/completions"),
        ] {
            let out = rewrite(&req(url, &[], "{}"), &reach(base), &env).unwrap();
            assert_eq!(out.url, want, "{url}");
            assert_eq!(out.body, b"{}", "no model: the body is untouched");
        }
        let err = rewrite(&req("https://a/v1/models", &[], ""), &reach("https://b"), &env).unwrap_err();
        assert_eq!(err.code(), "unknown_endpoint");
        assert!(err.to_string().contains("/v1/models"));
        // Without a base URL the path stays as it is, whatever it is.
        let out = rewrite(&req("https://a/v1/models?q", &[], ""), &Reach::default(), &env).unwrap();
        assert_eq!(out.url, "https://a/v1/models?q");
    }

    #[test]
    fn azure_deployments_versions_and_the_v1_api() {
        let r = req(
            "https://api.openai.com/v1/chat/completions?api-version=old&x=1",
            &[("authorization", "Bearer sk")],
            BODY,
        );
        let azure = Reach {
            upstream: "az".into(),
            base_url: Some("https://res.openai.azure.com/openai/".into()),
            api: Some(ApiFamily::AzureOpenAi),
            model: Some("gpt4o-prod".into()),
            api_key_env: Some("AZURE_KEY".into()),
            api_version: Some("2024-10-21".into()),
            prefill: false,
        };
        let out = rewrite(&r, &azure, &env).unwrap();
        assert_eq!(
            out.url,
            "https://res.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions?x=1&api-version=2024-10-21"
        );
        assert_eq!(names(&out), ["api-key: az"]);
        assert_eq!(out.body, br#"{"model":"gpt4o-prod","stream":true}"#);
        let responses = req("https://api.openai.com/v1/responses", &[], r#"{"input":"hi"}"#);
        let out = rewrite(&responses, &azure, &env).unwrap();
        assert_eq!(
            out.url,
            "https://res.openai.azure.com/openai/responses?api-version=2024-10-21"
        );
        assert_eq!(out.body, br#"{"input":"hi","model":"gpt4o-prod"}"#);
        // Deployment URL bodies need no model; a non-JSON body is left alone there.
        let out = rewrite(&req("https://x/v1/embeddings", &[], "raw"), &azure, &env).unwrap();
        assert_eq!(out.body, b"raw");
        let v1 = Reach {
            api_version: None,
            ..azure.clone()
        };
        let out = rewrite(&r, &v1, &env).unwrap();
        assert_eq!(
            out.url,
            "https://res.openai.azure.com/openai/v1/chat/completions?api-version=old&x=1"
        );
        // An Azure request moved to another deployment keeps its origin without a base URL.
        let az = req(
            "https://res.openai.azure.com/openai/deployments/a/chat/completions?api-version=1",
            &[],
            "{}",
        );
        let other = Reach {
            upstream: "b".into(),
            model: Some("b".into()),
            api_version: Some("2".into()),
            ..Reach::default()
        };
        let out = rewrite(&az, &other, &env).unwrap();
        assert_eq!(
            out.url,
            "https://res.openai.azure.com/openai/deployments/b/chat/completions?api-version=2"
        );
        assert_eq!(out.body, b"{}");
        let out = rewrite(
            &az,
            &Reach {
                model: None,
                ..other.clone()
            },
            &env,
        )
        .unwrap();
        assert!(out.url.contains("/deployments/a/"), "{}", out.url);
        let none = Reach {
            api: Some(ApiFamily::AzureOpenAi),
            api_version: Some("2".into()),
            upstream: "az".into(),
            ..Reach::default()
        };
        let err = rewrite(&req("https://a/v1/chat/completions", &[], "{}"), &none, &env).unwrap_err();
        assert_eq!(err, WireError::NoDeployment { upstream: "az".into() });
    }

    #[test]
    fn errors_name_what_to_fix() {
        let r = req("https://a/v1/chat/completions", &[], BODY);
        for var in ["MISSING", "EMPTY"] {
            let reach = Reach {
                upstream: "p".into(),
                api_key_env: Some(var.into()),
                ..Reach::default()
            };
            let err = rewrite(&r, &reach, &env).unwrap_err();
            assert_eq!(err.code(), "env_unset");
            assert!(err.to_string().contains(var) && err.to_string().contains("\"p\""));
        }
        let model = Reach {
            model: Some("m".into()),
            ..Reach::default()
        };
        let form = req("https://a/v1/chat/completions", &[], "model=x");
        assert_eq!(rewrite(&form, &model, &env).unwrap_err().code(), "body_not_json");
        let err = rewrite(&req("a/b?key=SECRET", &[], ""), &Reach::default(), &env).unwrap_err();
        assert_eq!(err, WireError::InvalidUrl { url: "a/b".into() });
        assert!(!Reach::default().rewrites() && model.rewrites());
    }
}

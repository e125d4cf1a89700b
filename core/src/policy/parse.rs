//! Reading a policy document: JSON, YAML or TOML (or a JSON value from a
//! binding), with errors that name the field path; and its JSON Schema.

use super::{Format, Policy, PolicyError, PolicyErrors};
use std::fmt;

impl Policy {
    /// Parses a policy in the given format and validates it.
    pub fn parse(text: &str, format: Format) -> Result<Policy, PolicyErrors> {
        let policy: Policy = match format {
            Format::Json => {
                let de = &mut serde_json::Deserializer::from_str(text);
                serde_path_to_error_json(de)?
            }
            Format::Yaml => serde_norway::from_str(text).map_err(|e| one_error(yaml_path(&e), e))?,
            Format::Toml => toml::from_str(text).map_err(|e| {
                PolicyErrors(vec![PolicyError {
                    path: String::new(),
                    message: e.to_string().trim().to_string(),
                }])
            })?,
        };
        policy.validate()?;
        Ok(policy)
    }

    /// Parses a policy, guessing the format: `{` starts JSON, a `key = value`
    /// or `[table]` line means TOML, anything else is YAML. An empty document is the default policy.
    pub fn from_str_any(text: &str) -> Result<Policy, PolicyErrors> {
        let t = text.trim_start();
        if t.is_empty() {
            return Ok(Policy::default());
        }
        Policy::parse(text, guess_format(t))
    }

    /// Reads and parses a file; the extension (`.json`, `.yaml`/`.yml`, `.toml`) picks the format.
    pub fn from_file(path: &std::path::Path) -> Result<Policy, PolicyErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            PolicyErrors(vec![PolicyError {
                path: String::new(),
                message: format!("cannot read {}: {e}", path.display()),
            }])
        })?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        match ext.as_str() {
            "json" => Policy::parse(&text, Format::Json),
            "yaml" | "yml" => Policy::parse(&text, Format::Yaml),
            "toml" => Policy::parse(&text, Format::Toml),
            _ => Policy::from_str_any(&text),
        }
    }

    /// Builds a policy from a JSON value (bindings pass dicts / objects this way).
    pub fn from_json_value(value: serde_json::Value) -> Result<Policy, PolicyErrors> {
        let policy: Policy = serde_json::from_value(value.clone())
            .map_err(|e| one_error(locate_json_error(&value, &e.to_string()), e))?;
        policy.validate()?;
        Ok(policy)
    }

    /// The JSON Schema of the policy document.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(Policy)).unwrap_or(serde_json::Value::Null)
    }
}

fn guess_format(t: &str) -> Format {
    if t.starts_with('{') {
        return Format::Json;
    }
    for line in t.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if l.starts_with('[') && l.ends_with(']') && !l.contains(':') {
            return Format::Toml;
        }
        if let (Some(eq), colon) = (l.find('='), l.find(':')) {
            if colon.is_none_or(|c| eq < c) {
                return Format::Toml;
            }
        }
        return Format::Yaml;
    }
    Format::Yaml
}

fn one_error(path: String, e: impl fmt::Display) -> PolicyErrors {
    PolicyErrors(vec![PolicyError {
        path,
        message: e.to_string(),
    }])
}

fn yaml_path(e: &serde_norway::Error) -> String {
    // serde_norway reports "path.to.field: message at line..."; the path is
    // already in the message, so keep the message whole.
    let _ = e;
    String::new()
}

/// JSON deserialization that tracks the field path, so `{"breaker": {"failure_rat": 1}}`
/// reports `breaker` as the path of the unknown field.
fn serde_path_to_error_json<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
) -> Result<Policy, PolicyErrors> {
    let value: serde_json::Value =
        serde::Deserialize::deserialize(&mut *de).map_err(|e| one_error(String::new(), e))?;
    let policy = serde_json::from_value::<Policy>(value.clone())
        .map_err(|e| one_error(locate_json_error(&value, &e.to_string()), e))?;
    Ok(policy)
}

/// Best-effort field path for a serde error on a JSON value: finds the
/// unknown or bad field named in the message.
fn locate_json_error(value: &serde_json::Value, message: &str) -> String {
    let field = message.split('`').nth(1).map(str::to_string).unwrap_or_default();
    if field.is_empty() {
        return String::new();
    }
    fn walk(v: &serde_json::Value, field: &str, prefix: &str) -> Option<String> {
        if let serde_json::Value::Object(map) = v {
            for (k, child) in map {
                let here = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if k == field {
                    return Some(here);
                }
                if let Some(found) = walk(child, field, &here) {
                    return Some(found);
                }
            }
        }
        None
    }
    walk(value, &field, "").unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use crate::policy::*;

    #[test]
    fn loads_json_yaml_and_toml() {
        let j = Policy::from_str_any(r#"{"version":"v7","max_attempts":5}"#).unwrap();
        let y = Policy::from_str_any("version: v7\nmax_attempts: 5\n").unwrap();
        let t = Policy::from_str_any("version = \"v7\"\nmax_attempts = 5\n").unwrap();
        assert_eq!(j, y);
        assert_eq!(y, t);
        assert_eq!(j.max_attempts, 5);
        assert_eq!(Policy::from_str_any("").unwrap(), Policy::default());
        let t2 = Policy::from_str_any("[breaker]\nmin_calls = 5\n").unwrap();
        assert_eq!(t2.breaker.min_calls, 5);
    }

    #[test]
    fn json_values_keep_field_paths() {
        let err = Policy::from_json_value(serde_json::json!({"breaker": {"failure_rat": 0.5}})).unwrap_err();
        assert_eq!(err.first().path, "breaker.failure_rat");
        assert_eq!(
            OnFailure::from_code(OnFailure::ManualReview.code()),
            Some(OnFailure::ManualReview)
        );
    }

    #[test]
    fn unknown_fields_are_errors_with_paths() {
        let err = Policy::from_str_any(r#"{"breaker":{"failure_rat":0.5}}"#).unwrap_err();
        assert!(err.to_string().contains("failure_rat"), "{err}");
        let err = Policy::from_str_any("retries: 3\n").unwrap_err();
        assert!(err.to_string().contains("retries"), "{err}");
        let err = Policy::from_str_any("max_attempt = 3\n").unwrap_err();
        assert!(err.to_string().contains("max_attempt"), "{err}");
    }

    #[test]
    fn schema_mentions_every_section() {
        let s = Policy::json_schema().to_string();
        for f in [
            "max_attempts",
            "retry_after",
            "breaker",
            "budget",
            "routes",
            "upstreams",
        ] {
            assert!(s.contains(f), "{f}");
        }
    }

    /// Test hooks exist only with the `test-hooks` feature: without it a
    /// policy that sets one is refused, and the schema does not mention them.
    #[test]
    fn test_hooks_only_with_their_feature() {
        let s = Policy::json_schema().to_string();
        let doc = "testing: {panic_on_vendor_code: boom}";
        if cfg!(feature = "test-hooks") {
            assert!(s.contains("panic_on_vendor_code"));
            assert!(Policy::from_str_any(doc).is_ok());
        } else {
            assert!(!s.contains("panic_on_vendor_code") && !s.contains("\"testing\""), "{s}");
            let err = Policy::from_str_any(doc).unwrap_err();
            assert!(err.to_string().contains("testing"), "{err}");
        }
    }
}

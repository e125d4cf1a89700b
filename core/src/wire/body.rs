//! JSON request bodies edited member by member: the members a rewrite does not
//! touch keep their bytes and their order (an SDK's body, a provider's
//! fields retrywise does not know, a tool's JSON schema), so the upstream
//! receives what the caller built with only the model or the conversation changed.

use super::WireError;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// A JSON object's members in order, each value as its JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Object<'a> {
    members: Vec<(String, Cow<'a, str>)>,
}

/// Members of an object, borrowed from the body.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'a> Object<'a> {
    /// Reads a body that must be a JSON object.
    pub(crate) fn parse(body: &'a [u8]) -> Result<Object<'a>, WireError> {
        let Members(members) = serde_json::from_slice::<Members<'a>>(body)
            .map_err(|e| WireError::BodyNotJson { detail: e.to_string() })?;
        Ok(Object {
            members: members.into_iter().map(|(k, v)| (k, Cow::Borrowed(v.get()))).collect(),
        })
    }

    /// The JSON text of member `key` (the last one, as JSON parsers read duplicates).
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }

    /// Sets member `key` to the JSON text `value`: in place (every duplicate
    /// too), or appended when absent.
    pub(crate) fn set(&mut self, key: &str, value: String) {
        let mut found = false;
        for (k, v) in &mut self.members {
            if k == key {
                *v = Cow::Owned(value.clone());
                found = true;
            }
        }
        if !found {
            self.members.push((key.to_owned(), Cow::Owned(value)));
        }
    }

    /// The object as compact JSON, members in their order.
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut out = String::with_capacity(self.members.iter().map(|(k, v)| k.len() + v.len() + 4).sum());
        out.push('{');
        for (i, (k, v)) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&quote(k));
            out.push(':');
            out.push_str(v);
        }
        out.push('}');
        out.into_bytes()
    }
}

/// The items of a JSON array, each as its JSON text.
pub(crate) fn array_items(json: &str) -> Result<Vec<&str>, WireError> {
    let items: Vec<&RawValue> =
        serde_json::from_str(json).map_err(|e| WireError::BodyNotJson { detail: e.to_string() })?;
    Ok(items.into_iter().map(RawValue::get).collect())
}

/// A JSON array of items given as JSON texts.
pub(crate) fn array_of<'s>(items: impl IntoIterator<Item = &'s str>) -> String {
    let mut out = String::from("[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item);
    }
    out.push(']');
    out
}

/// A string as a JSON string literal.
pub(crate) fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_keep_their_bytes_and_order() {
        let body = br#"{ "stream" : true, "model":"gpt-4o", "tools":[{"b":1, "a":2}], "z":"\u00e9" }"#;
        let mut o = Object::parse(body).unwrap();
        assert_eq!(o.get("model"), Some(r#""gpt-4o""#));
        o.set("model", quote("fb-ok"));
        o.set("extra", "1".into());
        assert_eq!(
            String::from_utf8(o.to_vec()).unwrap(),
            r#"{"stream":true,"model":"fb-ok","tools":[{"b":1, "a":2}],"z":"\u00e9","extra":1}"#
        );
    }

    #[test]
    fn only_objects_are_bodies() {
        for bad in [&b"[1]"[..], b"\"x\"", b"{\"a\":", b"", b"model=x", b"{\"a\":1} {}"] {
            assert!(
                matches!(Object::parse(bad), Err(WireError::BodyNotJson { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A duplicated key is set everywhere; the last one is what parsers read.
        let mut o = Object::parse(br#"{"model":"a","model":"b"}"#).unwrap();
        assert_eq!(o.get("model"), Some(r#""b""#));
        o.set("model", quote("c"));
        assert_eq!(o.to_vec(), br#"{"model":"c","model":"c"}"#);
    }

    #[test]
    fn arrays_split_and_join() {
        let items = array_items(r#"[ {"role":"user"} , "x", [1,2] ]"#).unwrap();
        assert_eq!(items, [r#"{"role":"user"}"#, r#""x""#, "[1,2]"]);
        assert_eq!(
            array_of(items.iter().copied().chain(["3"])),
            r#"[{"role":"user"},"x",[1,2],3]"#
        );
        assert!(array_items("{}").is_err());
    }
}

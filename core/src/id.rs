//! Logical request ids. An id this engine makes is the engine's random
//! 32-bit prefix and the call's sequence number, printed as 23 lower-case
//! hex digits; an id inherited from an upstream owner is kept as given.
//!
//! Most calls never print their id (no event is kept, no header is built),
//! so the text is made only when first read, and then kept.

use smol_str::SmolStr;
use std::fmt;
use std::sync::OnceLock;

/// The id as stored: numbers for an id made here, text for an inherited one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallId {
    /// Made by this engine.
    Local { prefix: u32, seq: u64 },
    /// Inherited from an upstream owner.
    Remote(SmolStr),
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl CallId {
    /// The id's text.
    pub(crate) fn text(&self) -> SmolStr {
        self.with_str(|s| SmolStr::new(s))
    }

    /// Hands the id's text to `f`; an id made here is printed on the stack.
    #[inline]
    pub(crate) fn with_str<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            CallId::Remote(s) => f(s),
            CallId::Local { prefix, seq } => {
                let mut buf = [0u8; 23];
                let p = *prefix as u64;
                for (i, b) in buf[..8].iter_mut().enumerate() {
                    *b = HEX[((p >> (4 * (7 - i))) & 15) as usize];
                }
                for (i, b) in buf[8..].iter_mut().enumerate() {
                    *b = HEX[((seq >> (4 * (14 - i))) & 15) as usize];
                }
                f(std::str::from_utf8(&buf).unwrap_or("0"))
            }
        }
    }
}

/// A logical request id: reads as `&str` (it derefs to one), printed on first use.
#[derive(Clone)]
pub struct RequestId {
    id: CallId,
    text: OnceLock<SmolStr>,
}

impl RequestId {
    pub(crate) fn local(prefix: u32, seq: u64) -> Self {
        RequestId {
            id: CallId::Local {
                prefix,
                seq: seq & ((1 << 60) - 1),
            },
            text: OnceLock::new(),
        }
    }

    pub(crate) fn remote(text: &str) -> Self {
        let s = SmolStr::new(text);
        RequestId {
            text: OnceLock::from(s.clone()),
            id: CallId::Remote(s),
        }
    }

    pub(crate) fn raw(&self) -> &CallId {
        &self.id
    }

    /// The id's text (printed on first use, then kept).
    pub fn as_str(&self) -> &str {
        self.text.get_or_init(|| self.id.text())
    }

    /// Hands the id's text to `f` without keeping it: cheaper than
    /// [`RequestId::as_str`] for an id printed once (into a header, say).
    ///
    /// ```
    /// # use retrywise::{CallSpec, Engine, Policy};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut call = engine.begin(CallSpec::new("openai/gpt-4o"));
    /// let id = call.next_attempt().unwrap().request_id;
    /// assert_eq!(id.with_str(str::len), 23);
    /// assert_eq!(id.with_str(str::to_string), id.as_str());
    /// ```
    #[inline]
    pub fn with_str<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self.text.get() {
            Some(t) => f(t),
            None => self.id.with_str(f),
        }
    }
}

impl std::ops::Deref for RequestId {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for RequestId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for RequestId {
    fn eq(&self, other: &Self) -> bool {
        match (&self.id, &other.id) {
            (CallId::Local { .. }, CallId::Local { .. }) => self.id == other.id,
            _ => self.as_str() == other.as_str(),
        }
    }
}

impl Eq for RequestId {}

impl PartialEq<str> for RequestId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for RequestId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ids_print_23_hex_digits_once() {
        let id = RequestId::local(0xdead_beef, 42);
        assert_eq!(id.as_str(), "deadbeef00000000000002a");
        assert_eq!(id.len(), 23);
        assert_eq!(id.clone(), id);
        assert_ne!(RequestId::local(1, 1), RequestId::local(1, 2));
        let remote = RequestId::remote("upstream-id-7");
        assert_eq!(&*remote, "upstream-id-7");
        assert_eq!(remote, RequestId::remote("upstream-id-7"));
        assert_eq!(format!("{remote}"), "upstream-id-7");
    }
}

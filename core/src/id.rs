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

/// The 8 lower-case hex digits of `x`, most significant first, computed
/// in one register (no per-digit table lookups).
#[inline(always)]
fn hex8(x: u32) -> [u8; 8] {
    // Spread the 8 nibbles into the 8 bytes of a word, nibble k in byte k.
    let mut v = x as u64;
    v = (v | v << 16) & 0x0000_ffff_0000_ffff;
    v = (v | v << 8) & 0x00ff_00ff_00ff_00ff;
    v = (v | v << 4) & 0x0f0f_0f0f_0f0f_0f0f;
    // Per byte: '0' + d, and 39 more ('a' - '0' - 10) when d > 9; no carries.
    let above9 = (v + 0x0606_0606_0606_0606) >> 4 & 0x0101_0101_0101_0101;
    (v + 0x3030_3030_3030_3030 + above9 * 39).swap_bytes().to_le_bytes()
}

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
                // Prefix (8 digits), then the 60-bit sequence number (15 digits).
                let mut buf = [0u8; 23];
                buf[..8].copy_from_slice(&hex8(*prefix));
                buf[8..15].copy_from_slice(&hex8((seq >> 32) as u32)[1..]);
                buf[15..].copy_from_slice(&hex8(*seq as u32));
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

    /// The same id, for an attempt: an id made here is copied as its
    /// numbers (its text is printed again if read), which is cheaper than
    /// cloning the text kept with it.
    #[inline]
    pub(crate) fn for_attempt(&self) -> RequestId {
        match &self.id {
            CallId::Local { prefix, seq } => RequestId {
                id: CallId::Local {
                    prefix: *prefix,
                    seq: *seq,
                },
                text: OnceLock::new(),
            },
            CallId::Remote(_) => self.clone(),
        }
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
    fn hex_digits_match_the_formatter() {
        let mut x = 0x9e37_79b9u32;
        let samples = (0..10_000).map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            x
        });
        for x in [0u32, 1, 9, 10, 15, 16, 0xdead_beef, 0x0123_4567, 0x89ab_cdef, u32::MAX]
            .into_iter()
            .chain(samples)
        {
            assert_eq!(std::str::from_utf8(&hex8(x)).unwrap(), format!("{x:08x}"));
        }
        for (prefix, seq) in [(0, 0), (u32::MAX, (1 << 60) - 1), (0x1234_5678, 0x0fed_cba9_8765_4321)] {
            let id = RequestId::local(prefix, seq);
            assert_eq!(id.as_str(), format!("{prefix:08x}{:015x}", seq & ((1 << 60) - 1)));
        }
    }

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

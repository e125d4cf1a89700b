//! Logical request ids. An id this engine makes is the engine's random
//! 32-bit prefix and the call's sequence number, printed as 23 lower-case
//! hex digits; an id inherited from an upstream owner is kept as given.
//!
//! Most calls never print their id (no event is kept, no header is built),
//! so the text is made only when read.

use smol_str::SmolStr;
use std::fmt;

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

/// A logical request id, as an attempt carries it: 24 bytes, printed when
/// read ([`RequestId::with_str`], `Display`, [`RequestId::to_smol_str`]).
/// An id made here is kept as its numbers, so handing one to every
/// attempt copies two words and prints nothing.
#[derive(Clone)]
pub struct RequestId {
    id: CallId,
}

impl RequestId {
    #[inline(always)]
    pub(crate) fn local(prefix: u32, seq: u64) -> Self {
        RequestId {
            id: CallId::Local {
                prefix,
                seq: seq & ((1 << 60) - 1),
            },
        }
    }

    pub(crate) fn remote(text: &str) -> Self {
        RequestId {
            id: CallId::Remote(SmolStr::new(text)),
        }
    }

    pub(crate) fn raw(&self) -> &CallId {
        &self.id
    }

    /// Hands the id's text to `f`, printed on the stack (no allocation).
    ///
    /// ```
    /// # use retrywise::{CallSpec, Engine, Policy};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut call = engine.begin(CallSpec::new("openai/gpt-4o"));
    /// let id = call.next_attempt().unwrap().request_id;
    /// assert_eq!(id.with_str(str::len), 23);
    /// assert_eq!(id.with_str(str::to_string), call.id());
    /// assert_eq!(id, call.id());
    /// ```
    #[inline]
    pub fn with_str<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        self.id.with_str(f)
    }

    /// The id's text as a [`SmolStr`] (inline: an id made here is 23 bytes).
    pub fn to_smol_str(&self) -> SmolStr {
        self.id.text()
    }

    /// An id made by an engine as its two numbers (prefix, sequence number);
    /// `None` for one inherited from an upstream owner. A binding that keeps
    /// many finished calls keeps these and prints the id only when it is
    /// asked for ([`RequestId::from_parts`]).
    ///
    /// ```
    /// # use retrywise::{CallSpec, Engine, Policy, RequestId};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let call = engine.begin(CallSpec::new("openai/gpt-4o"));
    /// let (prefix, seq) = call.request_id().parts().unwrap();
    /// assert_eq!(RequestId::from_parts(prefix, seq), call.id());
    /// ```
    #[inline]
    pub fn parts(&self) -> Option<(u32, u64)> {
        match self.id {
            CallId::Local { prefix, seq } => Some((prefix, seq)),
            CallId::Remote(_) => None,
        }
    }

    /// The id an engine made from `prefix` and `seq` ([`RequestId::parts`]);
    /// only the low 60 bits of `seq` are kept, as when the engine made it.
    pub fn from_parts(prefix: u32, seq: u64) -> Self {
        RequestId::local(prefix, seq)
    }
}

impl PartialEq for RequestId {
    fn eq(&self, other: &Self) -> bool {
        match (&self.id, &other.id) {
            (CallId::Local { .. }, CallId::Local { .. }) => self.id == other.id,
            _ => self.with_str(|a| other.with_str(|b| a == b)),
        }
    }
}

impl Eq for RequestId {}

impl PartialEq<str> for RequestId {
    fn eq(&self, other: &str) -> bool {
        self.with_str(|s| s == other)
    }
}

impl PartialEq<&str> for RequestId {
    fn eq(&self, other: &&str) -> bool {
        self.with_str(|s| s == *other)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_str(|s| f.write_str(s))
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_str(|s| fmt::Debug::fmt(s, f))
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
            assert_eq!(id.to_string(), format!("{prefix:08x}{:015x}", seq & ((1 << 60) - 1)));
        }
    }

    #[test]
    fn local_ids_print_23_hex_digits_and_compare_by_text() {
        let id = RequestId::local(0xdead_beef, 42);
        assert_eq!(id.to_smol_str(), "deadbeef00000000000002a");
        assert_eq!(id.with_str(str::len), 23);
        assert_eq!(id.parts(), Some((0xdead_beef, 42)));
        assert_eq!(RequestId::from_parts(0xdead_beef, 42), id);
        assert_eq!(RequestId::from_parts(1, u64::MAX).parts(), Some((1, (1 << 60) - 1)));
        assert_eq!(RequestId::remote("upstream-id-7").parts(), None);
        assert_eq!(id.clone(), id);
        assert_ne!(RequestId::local(1, 1), RequestId::local(1, 2));
        let remote = RequestId::remote("upstream-id-7");
        assert_eq!(remote, "upstream-id-7");
        assert_eq!(format!("{remote:?}"), "\"upstream-id-7\"");
        assert_eq!(remote, RequestId::remote("upstream-id-7"));
        assert_eq!(format!("{remote}"), "upstream-id-7");
        // An inherited id equals a local one with the same text.
        assert_eq!(RequestId::remote("deadbeef00000000000002a"), id);
        assert_ne!(remote, id);
    }
}

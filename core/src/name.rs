//! Names a caller hands a [`crate::CallSpec`] (route, tenant, task,
//! priority), turned into the [`SmolStr`] the engine keeps.
//!
//! Every call builds at least one such name, so the conversion is on the
//! hot path. `SmolStr::from(&str)` goes out of line and copies through
//! `memcpy` with a variable length; a short name (the usual `provider/model`
//! is 13 to 23 bytes) is copied here with stores of a length fixed per
//! branch instead.

use smol_str::SmolStr;
use std::borrow::Cow;
use std::sync::Arc;

/// A value [`crate::CallSpec`] takes as a name: `&str`, `String`,
/// [`SmolStr`] (and references to them), `Box<str>`, `Arc<str>`, `Cow<str>`.
///
/// ```
/// use retrywise::{CallSpec, IntoName};
/// let owned = String::from("openai/gpt-4o");
/// assert_eq!(CallSpec::new("openai/gpt-4o").route, CallSpec::new(&owned).route);
/// assert_eq!("a-name-longer-than-23-bytes".into_name(), "a-name-longer-than-23-bytes");
/// ```
pub trait IntoName {
    /// The name as the engine keeps it.
    fn into_name(self) -> SmolStr;
}

/// `s` as a [`SmolStr`]: up to [`SmolStr`]'s inline capacity (23 bytes), by
/// fixed-length copies chosen by a jump on the length; longer, shared on the heap.
#[inline(always)]
fn short(s: &str) -> SmolStr {
    macro_rules! by_len {
        ($($n:literal)*) => {
            match s.len() {
                // Each arm copies a constant number of bytes: a few stores, no call.
                $($n => SmolStr::new_inline(&s[..$n]),)*
                _ => SmolStr::new(s),
            }
        };
    }
    by_len!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23)
}

impl IntoName for &str {
    #[inline(always)]
    fn into_name(self) -> SmolStr {
        short(self)
    }
}

impl IntoName for &&str {
    #[inline(always)]
    fn into_name(self) -> SmolStr {
        short(self)
    }
}

impl IntoName for &String {
    #[inline(always)]
    fn into_name(self) -> SmolStr {
        short(self)
    }
}

impl IntoName for String {
    #[inline]
    fn into_name(self) -> SmolStr {
        short(&self)
    }
}

impl IntoName for SmolStr {
    #[inline(always)]
    fn into_name(self) -> SmolStr {
        self
    }
}

impl IntoName for &SmolStr {
    #[inline(always)]
    fn into_name(self) -> SmolStr {
        self.clone()
    }
}

impl IntoName for Box<str> {
    fn into_name(self) -> SmolStr {
        short(&self)
    }
}

impl IntoName for Arc<str> {
    fn into_name(self) -> SmolStr {
        SmolStr::from(self)
    }
}

impl IntoName for Cow<'_, str> {
    fn into_name(self) -> SmolStr {
        short(&self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_keeps_the_text() {
        let text: String = ('a'..='z').chain('A'..='Z').collect();
        for n in 0..=text.len() {
            let s = &text[..n];
            let name = s.into_name();
            assert_eq!(name, s);
            // Inline up to 23 bytes, as `SmolStr::new` would keep it.
            assert_eq!(name.is_heap_allocated(), SmolStr::new(s).is_heap_allocated(), "{n}");
        }
        // Multi-byte text keeps its characters at every length.
        for n in 0..12 {
            let s: String = "é".repeat(n);
            assert_eq!(s.as_str().into_name(), s.as_str());
            assert_eq!(Cow::Borrowed(s.as_str()).into_name(), s.as_str());
        }
        assert_eq!(Arc::<str>::from("x").into_name(), "x");
        assert_eq!(Box::<str>::from("y").into_name(), "y");
    }
}

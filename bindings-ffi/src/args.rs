//! Reading C arguments: strings, arrays and headers, with the NULL and UTF-8
//! rules of the header (`RW_ERR_NULL`, `RW_ERR_INVALID_ARG`).

use crate::types::{rw_header, rw_result, rw_str};
use std::borrow::Cow;

/// Header pairs read from C, borrowed where they were valid UTF-8.
pub(crate) type HeaderPairs<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// Bytes of a string argument. `ptr == NULL && len == 0` is `None`;
/// `ptr == NULL && len > 0` is `RW_ERR_NULL`.
///
/// # Safety
/// A non-NULL `s.ptr` must point to `s.len` readable bytes that stay valid
/// and unmodified for `'a`.
pub(crate) unsafe fn bytes<'a>(s: rw_str) -> Result<Option<&'a [u8]>, rw_result> {
    if s.ptr.is_null() {
        return if s.len == 0 {
            Ok(None)
        } else {
            Err(rw_result::RwErrNull)
        };
    }
    // SAFETY: non-NULL, and the caller guarantees `len` readable bytes for 'a.
    Ok(Some(unsafe { std::slice::from_raw_parts(s.ptr.cast::<u8>(), s.len) }))
}

/// A UTF-8 string argument (`None` when absent); non-UTF-8 is `RW_ERR_INVALID_ARG`.
///
/// # Safety
/// As for [`bytes`].
pub(crate) unsafe fn opt_str<'a>(s: rw_str) -> Result<Option<&'a str>, rw_result> {
    // SAFETY: forwarded from the caller.
    match unsafe { bytes(s) }? {
        None => Ok(None),
        // Route names, tenants and keys are short and ASCII: check that
        // word-at-a-time instead of running the full UTF-8 validator.
        // SAFETY: ASCII bytes are valid UTF-8.
        Some(b) if b.is_ascii() => Ok(Some(unsafe { std::str::from_utf8_unchecked(b) })),
        Some(b) => std::str::from_utf8(b).map(Some).map_err(|_| rw_result::RwErrInvalidArg),
    }
}

/// Like [`opt_str`], absent being the empty string.
///
/// # Safety
/// As for [`bytes`].
pub(crate) unsafe fn req_str<'a>(s: rw_str) -> Result<&'a str, rw_result> {
    // SAFETY: forwarded from the caller.
    Ok(unsafe { opt_str(s) }?.unwrap_or(""))
}

/// An array argument; `ptr == NULL` is an empty array when `len == 0`,
/// `RW_ERR_NULL` otherwise.
///
/// # Safety
/// A non-NULL `ptr` must point to `len` initialized values of `T`, valid for `'a`.
pub(crate) unsafe fn slice<'a, T>(ptr: *const T, len: usize) -> Result<&'a [T], rw_result> {
    if ptr.is_null() {
        return if len == 0 { Ok(&[]) } else { Err(rw_result::RwErrNull) };
    }
    // SAFETY: non-NULL, and the caller guarantees `len` initialized elements for 'a.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Header pairs, read lossily (a header with invalid bytes is still read,
/// with U+FFFD in their place).
///
/// # Safety
/// As for [`slice`], and every string inside as for [`bytes`].
pub(crate) unsafe fn headers<'a>(ptr: *const rw_header, len: usize) -> Result<HeaderPairs<'a>, rw_result> {
    // SAFETY: forwarded from the caller.
    let hs = unsafe { slice(ptr, len) }?;
    let mut out = Vec::with_capacity(hs.len());
    for h in hs {
        // SAFETY: forwarded from the caller (every header string is valid for 'a).
        let name = unsafe { bytes(h.name) }?.unwrap_or(b"");
        // SAFETY: as above.
        let value = unsafe { bytes(h.value) }?.unwrap_or(b"");
        out.push((String::from_utf8_lossy(name), String::from_utf8_lossy(value)));
    }
    Ok(out)
}

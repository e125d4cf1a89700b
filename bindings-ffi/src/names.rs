//! Static names: `rw_reason_name`, `rw_action_name`, `rw_class_name`,
//! `rw_wait_source_name`, `rw_continuation_name`, `rw_api_family_name`, `rw_hedge_action_name`, `rw_result_name` and `rw_version`. Vocabulary names
//! come from the core's `NAMES` tables, so every language prints the same
//! snake_case strings.

use crate::panic::ffi_boundary;
use crate::types::rw_result;
use retrywise_core::{Action, ApiFamily, Continuation, ErrorClass, Reason, WaitSource};
use std::ffi::CString;
use std::os::raw::c_char;
use std::sync::OnceLock;

fn table(names: &'static [&'static str]) -> Vec<CString> {
    names.iter().map(|n| crate::error::cstring(n)).collect()
}

fn lookup(cell: &'static OnceLock<Vec<CString>>, names: &'static [&'static str], code: i32) -> *const c_char {
    let t = cell.get_or_init(|| table(names));
    usize::try_from(code)
        .ok()
        .and_then(|i| t.get(i))
        .map_or(std::ptr::null(), |s| s.as_ptr())
}

/// Stable snake_case name of an `rw_reason` code (`"budget_exhausted"`).
/// Static: never free it. NULL for an unknown code.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn rw_reason_name(code: i32) -> *const c_char {
    static T: OnceLock<Vec<CString>> = OnceLock::new();
    ffi_boundary! { lookup(&T, Reason::NAMES, code) }
}

/// Stable snake_case name of an `rw_action` code (`"retry"`). Static; NULL
/// for an unknown code.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn rw_action_name(code: i32) -> *const c_char {
    static T: OnceLock<Vec<CString>> = OnceLock::new();
    ffi_boundary! { lookup(&T, Action::NAMES, code) }
}

/// Stable snake_case name of an `rw_error_class` code (`"rate_limit"`);
/// `"none"` for `RW_ERROR_CLASS_NONE`. Static; NULL for an unknown code.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn rw_class_name(code: i32) -> *const c_char {
    static T: OnceLock<Vec<CString>> = OnceLock::new();
    ffi_boundary! {
        if code == -1 {
            return c"none".as_ptr();
        }
        lookup(&T, ErrorClass::NAMES, code)
    }
}

/// Stable snake_case name of an `rw_wait_source` code (`"retry_after"`).
/// Static; NULL for an unknown code.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn rw_wait_source_name(code: i32) -> *const c_char {
    static T: OnceLock<Vec<CString>> = OnceLock::new();
    ffi_boundary! { lookup(&T, WaitSource::NAMES, code) }
}

/// Stable snake_case name of an `rw_continuation` code (`"prefill"`,
/// `"instruction"`). Static; NULL for `RW_CONTINUATION_NONE` and unknown codes.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn rw_continuation_name(code: i32) -> *const c_char {
    static T: OnceLock<Vec<CString>> = OnceLock::new();
    ffi_boundary! { lookup(&T, Continuation::NAMES, code) }
}

/// Stable name of an `rw_api_family` code as a policy spells it
/// (`"openai"`, `"anthropic"`, `"azure_openai"`). Static; NULL for
/// `RW_API_FAMILY_NONE` and unknown codes.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn rw_api_family_name(code: i32) -> *const c_char {
    static T: OnceLock<Vec<CString>> = OnceLock::new();
    ffi_boundary! { lookup(&T, ApiFamily::NAMES, code) }
}

/// Stable snake_case name of an `rw_hedge_action` code (`"start"`, `"after"`,
/// `"no"`). Static; NULL for an unknown code.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn rw_hedge_action_name(code: i32) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 3] = [c"start", c"after", c"no"];
    const _: () = assert!(NAMES.len() == crate::types::rw_hedge_action::No as usize + 1);
    ffi_boundary! {
        usize::try_from(code).ok().and_then(|i| NAMES.get(i)).map_or(std::ptr::null(), |s| s.as_ptr())
    }
}

/// The C name of an `rw_result` code (`"RW_ERR_NULL"`), for log messages.
/// Static; NULL for an unknown code.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn rw_result_name(code: i32) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 8] = [
        c"RW_OK",
        c"RW_STOPPED",
        c"RW_ERR_NULL",
        c"RW_ERR_PANIC",
        c"RW_ERR_POLICY",
        c"RW_ERR_INVALID_ARG",
        c"RW_ERR_INBOUND",
        c"RW_ERR_INVALID_STATE",
    ];
    const _: () = assert!(NAMES.len() == rw_result::RwErrInvalidState as usize + 1);
    ffi_boundary! {
        usize::try_from(code).ok().and_then(|i| NAMES.get(i)).map_or(std::ptr::null(), |s| s.as_ptr())
    }
}

/// The library version (`"0.1.0"`), the same as the core crate's. Static.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn rw_version() -> *const c_char {
    static V: OnceLock<CString> = OnceLock::new();
    ffi_boundary! { V.get_or_init(|| crate::error::cstring(retrywise_core::version())).as_ptr() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn s(p: *const c_char) -> &'static str {
        assert!(!p.is_null());
        // SAFETY: non-NULL static C string from this module.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn names_match_core() {
        for r in Reason::ALL {
            assert_eq!(s(rw_reason_name(r.code() as i32)), r.as_str());
        }
        assert!(rw_reason_name(Reason::ALL.len() as i32).is_null());
        assert!(rw_reason_name(-1).is_null());
        assert_eq!(s(rw_class_name(-1)), "none");
        assert_eq!(s(rw_class_name(0)), "rate_limit");
        assert_eq!(s(rw_action_name(1)), "retry");
        assert_eq!(s(rw_wait_source_name(1)), "retry_after");
        assert_eq!(s(rw_result_name(2)), "RW_ERR_NULL");
        assert_eq!(s(rw_hedge_action_name(0)), "start");
        assert_eq!(s(rw_hedge_action_name(2)), "no");
        assert!(rw_hedge_action_name(3).is_null());
        assert_eq!(s(rw_version()), retrywise_core::VERSION);
    }
}

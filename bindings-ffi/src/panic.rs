//! The panic boundary every exported function runs inside, and the value each
//! return type yields when a panic is caught.
//!
//! Functions returning `rw_result` give `RW_ERR_PANIC`; functions returning
//! pointers give NULL; sizes give 0; counts whose "none" is -1 give -1;
//! flags false; string views an empty one.

use crate::types::{rw_result, rw_str};
use crate::vocab::{rw_api_family, rw_error_kind, rw_phase};
use std::os::raw::c_char;

/// The value a function returns after catching a panic.
pub(crate) trait OnPanic {
    fn on_panic() -> Self;
}

impl OnPanic for rw_result {
    fn on_panic() -> Self {
        rw_result::RwErrPanic
    }
}

impl OnPanic for rw_api_family {
    fn on_panic() -> Self {
        rw_api_family::None
    }
}

/// Counts whose "none" is -1 (`rw_request_input_tokens`).
impl OnPanic for i64 {
    fn on_panic() -> Self {
        -1
    }
}

impl OnPanic for rw_phase {
    fn on_panic() -> Self {
        rw_phase::None
    }
}

impl OnPanic for rw_error_kind {
    fn on_panic() -> Self {
        rw_error_kind::None
    }
}

impl OnPanic for () {
    fn on_panic() -> Self {}
}

impl OnPanic for bool {
    fn on_panic() -> Self {
        false
    }
}

impl OnPanic for rw_str {
    fn on_panic() -> Self {
        rw_str::NONE
    }
}

impl OnPanic for usize {
    fn on_panic() -> Self {
        0
    }
}

impl<T> OnPanic for *const T {
    fn on_panic() -> Self {
        std::ptr::null()
    }
}

impl<T> OnPanic for *mut T {
    fn on_panic() -> Self {
        std::ptr::null_mut()
    }
}

/// Static empty C string, returned by getters given NULL.
pub(crate) const EMPTY: *const c_char = c"".as_ptr();

/// Runs the body inside `catch_unwind`; a panic becomes the return type's
/// [`OnPanic`] value and never unwinds into C. `return` inside the body
/// returns from the function (the body is a closure returning the function's
/// type).
macro_rules! ffi_boundary {
    ($($body:tt)*) => {
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| { $($body)* })) {
            Ok(ret) => ret,
            Err(_) => $crate::panic::OnPanic::on_panic(),
        }
    };
}

/// Unwraps a `Result<T, rw_result>` inside a boundary body, returning the error.
macro_rules! try_arg {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return e,
        }
    };
}

pub(crate) use {ffi_boundary, try_arg};

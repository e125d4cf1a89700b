//! Node binding of the retrywise core: type translation only.
//!
//! This is the *lean native API* (`native.js` / `native.d.ts`). The idiomatic
//! JS API (`index.js`, modules in `lib/`) wraps it. Every decision is made by the `retrywise`
//! crate; this binding converts types, keeps a few values for lazy getters and
//! turns panics into JS errors.
//!
//! Crossing cost: a call through a napi-rs method costs ~70 ns more than the
//! N-API crossing itself (~13 ns): unwrapping `this` is a private-property
//! lookup inside a `TryCatch`, every argument is type-checked and converted by
//! its own N-API call, the result is one more. So the steps of a governed call
//! also exist as **fast entry points** ([`fast`]): raw N-API functions with no
//! arguments and no return value, bound to one engine through their callback
//! data, that read their inputs from and write their results to a
//! `Float64Array` the JS layer handed to the engine once (the *scratch*
//! buffer, layout below). Strings never cross on the hot path: routes and
//! tenants are interned once (`intern`) and passed by number, upstream names
//! come back as indices into a per-engine table the JS side caches.
//!
//! The scratch layout (which slot holds what after each step) is defined once,
//! in [`scratch`], and exported by name through `vocab()`.
//!
//! Calls are kept in a slab inside the engine and named by numeric handles
//! (see [`NativeEngine`]); a call is freed when it finishes (see
//! [`finished`]), when JS releases it, or when its wrapper is
//! garbage-collected. Every entry point runs inside a panic boundary.

#![deny(clippy::all)]

mod clock;
mod continuation;
mod convert;
mod entry;
mod errors;
mod fast;
mod finished;
pub mod fleet;
mod names;
mod scratch;
mod state;
mod stream;
pub mod wire;

// The napi-rs surface, declared after the modules above and in this order on
// purpose: napi-derive writes a type into `native.d.ts` under its JS name only
// once that type's own macro has expanded (`wire::Request` is `WireRequest`),
// and lists a class's methods in the order they expand (the constructor first).
mod engine;
// After `engine`: the engine's methods on one call.
mod calls;
mod functions;

pub use engine::NativeEngine;
pub use functions::{
    check_policy, continuation_carrier, derive_idempotency_key, json_media_type, now_ms, params_digest, policy_schema,
    request_id_text, timer_error, vendor_code_from_body, vocab,
};

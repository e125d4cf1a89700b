//! Provider rate limits as state: read every rate-limit header, pace before
//! the 429, adapt concurrency.
//!
//! retrywise sees every response of every call in the process, so it can know
//! the provider's remaining allowance and keep calls from spending what is
//! not there.
//!
//! - [`Reading`] ([`headers`] and the value grammars in [`values`]): one
//!   response's evidence — OpenAI, Azure OpenAI, Anthropic and IETF
//!   `RateLimit` headers, Retry-After, and Gemini's body evidence given by the
//!   caller — in one model of [`Window`]s per [`Kind`]. Malformed values are
//!   ignored and named, never a panic.
//!
//! Time is injected: a wall clock only for RFC 3339 and HTTP-date instants.

pub mod headers;
mod ietf;
mod reading;
pub mod values;

pub use reading::{Kind, Reading, Window};

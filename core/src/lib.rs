//! retrywise core (work in progress).

/// Crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The crate version as a string.
pub fn version() -> &'static str {
    VERSION
}

//! State every call of an engine shares: cells by scope key
//! (`registry.rs`, keyed by `scope.rs`), one upstream's cells resolved
//! once (`upstream.rs`), its learned first-token limit (`first_token.rs`), one policy version compiled with its upstreams'
//! state (`version.rs`), and the rest an engine shares (`shared.rs`);
//! provider rate limits (`ratelimit/`) and what a fleet of processes
//! shares through a store (`fleet/`).

pub(crate) mod first_token;
pub mod fleet;
pub mod ratelimit;
pub(crate) mod registry;
pub(crate) mod scope;
pub(crate) mod shared;
pub(crate) mod upstream;
pub(crate) mod version;

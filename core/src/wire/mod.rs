//! Wire helpers for the drop-in transports: pure functions over the bytes an
//! SDK sends and receives, so no binding writes its own request rewriting or
//! SSE handling.
//!
//! - [`sse`]: the incremental SSE event reader every stream reader shares.

pub mod sse;

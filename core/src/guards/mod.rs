//! Guards: shared state per scope that admits or refuses traffic — the
//! circuit breaker (`breaker/`), the retry budget (`budget.rs`), adaptive
//! throttling (`throttle.rs`) and concurrency gates (`gate.rs`). Every
//! call of an engine reaches the same cells through the engine's
//! registries (`state/`).

pub(crate) mod breaker;
pub(crate) mod budget;
pub(crate) mod gate;
pub(crate) mod throttle;
